#!/usr/bin/env python3
"""Writes packaging/hot-functions.txt: the functions the service runs, laid out together.

The kernel maps an executable's code in windows (64 KiB of fault-around, or a whole large
folio of the page cache) around each page that a process touches. Laid out as the compiler
leaves it, the code that the service runs is spread over 3 MiB of the executable, and nearly
all of it ends up resident. packaging/build-release.sh links the functions named in
packaging/hot-functions.txt first, into a section of their own (.text.hot), so that the
service's code is a contiguous 1 MiB and the rest of the executable (the other commands) is
never read in (docs/benchmarks.md: bench/exe_pages.py).

This script makes that list. It builds the portable binary with its symbols
(target/hot-functions/), runs it as the service under valgrind's callgrind in
bench/service.py's guest (a licensed vGPU's saved nvidia-smi output, a journal of its own with
gridd's lines of a guest's boot, nvidia-smi read every 10 s, then a burst of 100 of gridd's
lines) as systemd runs it (a notify socket, the unit's watchdog), for 150 s: long enough for
what comes later in a service's life than its start (the token directory's first look at 30 s,
the heap's release after a minute, the heartbeat at 2 minutes), whose code would otherwise be
read from the disk then. It writes every function that ran, by its symbol without the hash that the compiler
version and the build's flags decide, so that the list stays good across builds. Functions
added since the list was made run from the rest of the code; build-release.sh refuses a list
that lays out less than half of the code it did when it was made (then run this again).

Usage: sudo python3 packaging/hot-functions.py   (about 7 minutes; needs root, valgrind and
what packaging/build-release.sh needs)
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import importlib.util

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, "packaging/hot-functions.txt")
TARGET_DIR = os.path.join(ROOT, "target/hot-functions")
spec = importlib.util.spec_from_file_location("footprint", os.path.join(ROOT, "bench/footprint.py"))
fp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp)
svc = fp.svc

# Rust's legacy symbols end in a hash of the crate and the instance (17h<16 hex digits>E);
# v0 symbols name each crate with a hash (Cs<base 62>_). Both change with the compiler.
LEGACY_HASH = re.compile(r"17h[0-9a-f]{16}E$")
V0_CRATE = re.compile(r"Cs[0-9A-Za-z]+_")


def build():
    """The portable binary as build-release.sh makes it, with its symbols."""
    script = f"""
        set -euo pipefail
        . packaging/portable.sh
        portable_toolchain {TARGET_DIR}
        env "$(portable_rustflags)" CARGO_TARGET_DIR={TARGET_DIR} CARGO_PROFILE_RELEASE_STRIP=false \\
            cargo zigbuild --release --locked --bin vgpu-license-agent --target "$PORTABLE_ZIG_TARGET"
        echo "{TARGET_DIR}/$PORTABLE_TARGET/release/vgpu-license-agent"
    """
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


LIFE = 150


def drain(sock):
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass


def run_service(binary, profile, tmp):
    """The service's life under callgrind: its start, readings, a burst of gridd's lines,
    the heartbeat with the watchdog's ping."""
    # gridd's lines go to the run's own journald (bench/service.py's), which the service reads.
    svc.journal()
    for msg in fp.boot_lines():
        svc.send_gridd(msg)
    root = tempfile.mkdtemp(prefix="vla-hot-")
    svc.setup(root, 10)
    status_dir = fp.run_status(root)
    status = os.path.join(status_dir, "status.json")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(os.path.join(tmp, "notify"))
    # Read as systemd reads it: a full queue (net.unix.max_dgram_qlen, 10 here) would block
    # the service's next message.
    threading.Thread(target=drain, args=(notify,), daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    # The unit's WatchdogSec=4min.
    env.update(NOTIFY_SOCKET=os.path.join(tmp, "notify"), WATCHDOG_USEC="240000000")
    started = time.monotonic()
    p = subprocess.Popen(["valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={profile}",
                          binary, "--config", f"{root}/config.toml", "run"],
                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not svc.wait_for(lambda: svc.status_has(status, '"state": "licensed"'), 180, 0.2):
            sys.exit("packaging/hot-functions.py: the service did not report the license within 180 s")
        time.sleep(25)
        fp.burst(100)
        if not svc.wait_for(lambda: svc.status_has(status, "burst-"), 60, 0.2):
            sys.exit("packaging/hot-functions.py: the service did not report the burst within 60 s")
        time.sleep(max(15, LIFE - (time.monotonic() - started)))
    finally:
        notify.close()
        p.send_signal(signal.SIGTERM)
        p.wait(120)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(status_dir, ignore_errors=True)


def functions_run(profile):
    """The symbols of the functions that ran, from callgrind's output (names compressed)."""
    names, ran = {}, set()
    for line in open(profile, errors="replace"):
        m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if not m:
            continue
        kind, ident, name = m.groups()
        if name:
            names[ident] = re.sub(r"'\d+$", "", name)  # callgrind's mark of a recursion
        if kind == "fn" and ident in names:
            ran.add(names[ident])
    return ran


def sizes(binary):
    out = subprocess.run(["nm", "-S", "--defined-only", binary], check=True, capture_output=True, text=True).stdout
    return {f[3]: int(f[1], 16) for f in (l.split() for l in out.splitlines()) if len(f) == 4 and f[2] in "tTwW"}


def main():
    if os.geteuid() != 0:
        sys.exit("packaging/hot-functions.py: run it as root (the service's guest is bench/service.py's)")
    if not shutil.which("valgrind"):
        sys.exit("packaging/hot-functions.py: valgrind not found (apt-get install valgrind)")
    binary = build()
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "callgrind.out")
        run_service(binary, profile, tmp)
        ran = functions_run(profile)
    known = sizes(binary)
    # Only functions with a section of their own can be placed (the C library's and the
    # assembly's share their file's .text, which comes whole after the Rust code anyway);
    # a name that a glob would read otherwise is left out.
    ran = {n for n in ran if n in known and re.fullmatch(r"[A-Za-z0-9_.$]+", n)}
    patterns = sorted({V0_CRATE.sub("Cs*_", LEGACY_HASH.sub("17h*E", n)) for n in ran})
    hot = sum(known[n] for n in ran)
    with open(LIST, "w") as f:
        f.write("# The functions that the service runs, linked together first (.text.hot) by\n"
                "# packaging/build-release.sh. Made by packaging/hot-functions.py: do not edit.\n"
                f"# hot bytes when made: {hot}\n")
        f.writelines(p + "\n" for p in patterns)
    print(f"{LIST}: {len(patterns)} functions, {hot / 1024:.0f} KiB of {sum(known.values()) / 1024:.0f} KiB of code")


if __name__ == "__main__":
    main()
