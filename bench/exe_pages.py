#!/usr/bin/env python3
"""How much of the agent's RSS its executable's pages are, and how much of them a reading needs.

The service (bench/service.py's guest: a licensed vGPU's saved nvidia-smi output, a journal of
the run's own, as every benchmark here has) runs with nvidia-smi read every 30 s. Printed, for each
run: the executable's pages resident (from /proc/PID/pagemap) and the VmRSS once it has started;
then right after those pages are dropped from outside (process_madvise(2) MADV_PAGEOUT on each
of the executable's read-only mappings, which also takes them out of the page cache); then after
the readings that follow have faulted back what they use. The last figure is what a reading
touches, in the kernel's fault-around windows (64 KiB, or a whole large folio): with the
service's functions linked together (packaging/hot-functions.txt), about the size of that code.
Beside them: nvidia-gridd's own memory (`Memory: 4.4M`).

Usage: sudo python3 bench/exe_pages.py [--binary PATH] [--runs 3] [--after 75]
(about 2 minutes a run). Needs root (process_madvise on another process) and Linux 5.10.
"""
import argparse, ctypes, os, shutil, statistics, struct, subprocess, sys, tempfile, time
import importlib.util

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("footprint", os.path.join(HERE, "footprint.py"))
fp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp)
svc = fp.svc

SYS_PIDFD_OPEN, SYS_PROCESS_MADVISE, MADV_PAGEOUT = 434, 440, 21
POLL = 30
SETTLE = 40


class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def exe_maps(pid, exe):
    for line in open(f"/proc/{pid}/maps"):
        f = line.split()
        if len(f) >= 6 and f[5] == exe:
            a, b = (int(x, 16) for x in f[0].split("-"))
            yield a, b, f[1]


def resident(pid, exe):
    """(the executable's resident pages in MiB, VmRSS in MiB)."""
    n = 0
    with open(f"/proc/{pid}/pagemap", "rb") as pm:
        for a, b, _ in exe_maps(pid, exe):
            pm.seek(a // 4096 * 8)
            data = pm.read((b - a) // 4096 * 8)
            n += sum(1 for (e,) in struct.iter_unpack("<Q", data) if e >> 63)
    rss = int(open(f"/proc/{pid}/status").read().split("VmRSS:")[1].split()[0])
    return n * 4096 / 1048576, rss / 1024


def page_out(pid, exe):
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        sys.exit(f"bench/exe_pages.py: pidfd_open: {os.strerror(ctypes.get_errno())}")
    ranges = [(a, b) for a, b, perm in exe_maps(pid, exe) if "w" not in perm]
    iov = (Iovec * len(ranges))(*[Iovec(a, b - a) for a, b in ranges])
    r = libc.syscall(SYS_PROCESS_MADVISE, pidfd, iov, len(ranges), MADV_PAGEOUT, 0)
    os.close(pidfd)
    if r < 0:
        sys.exit(f"bench/exe_pages.py: process_madvise: {os.strerror(ctypes.get_errno())}")


def one_run(binary, after):
    root = tempfile.mkdtemp(prefix="vla-exe-")
    svc.setup(root, POLL)
    status_dir = fp.run_status(root)
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    p = subprocess.Popen([binary, "--config", f"{root}/config.toml", "run"], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    exe = os.path.realpath(binary)
    try:
        time.sleep(SETTLE)
        started = resident(p.pid, exe)
        page_out(p.pid, exe)
        time.sleep(0.5)
        dropped = resident(p.pid, exe)
        time.sleep(after)
        steady = resident(p.pid, exe)
        return started, dropped, steady
    finally:
        p.terminate()
        p.wait(10)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(status_dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", help="the agent (default: the binary the packages ship, target/dist/, built first)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--after", type=int, default=75, help="seconds of readings after the drop")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/exe_pages.py: run it as root (process_madvise on the agent)")
    built = os.path.abspath(svc.built(a.binary))
    # A copy of its own: MADV_PAGEOUT leaves the pages another process maps (a service or a
    # `status` run from the same file meanwhile), which would hide the floor.
    private = tempfile.mkdtemp(prefix="vla-exe-bin-")
    binary = os.path.join(private, "vgpu-license-agent")
    shutil.copy2(built, binary)
    for msg in fp.boot_lines():
        svc.send_gridd(msg)
    print(f"machine: {svc.machine(binary)}; executable {os.path.getsize(binary) / 1048576:.1f} MiB")
    try:
        runs = [one_run(binary, a.after) for _ in range(a.runs)]
    finally:
        shutil.rmtree(private, ignore_errors=True)
    print(f"\n{a.runs} runs; nvidia-smi read every {POLL} s; nvidia-gridd's own memory {fp.GRIDD_MIB:.1f} MiB")
    print("| when | executable's pages resident (MiB) | VmRSS (MiB) | VmRSS / nvidia-gridd's |")
    print("|---|---|---|---|")
    for i, label in enumerate([f"{SETTLE} s after the start", "its pages dropped",
                               f"{a.after} s of readings later"]):
        pages = [r[i][0] for r in runs]
        rss = [r[i][1] for r in runs]
        print(f"| {label} | {fp.mmm(pages, '{:.2f}')} | {fp.mmm(rss, '{:.2f}')} | "
              f"{fp.mmm([x / fp.GRIDD_MIB for x in rss])} |")
    floor = statistics.median(r[2][1] for r in runs)
    print(f"\nthe floor a drop of the executable's pages leaves: VmRSS {floor:.2f} MiB, "
          f"{floor / fp.GRIDD_MIB:.2f}x nvidia-gridd's")


if __name__ == "__main__":
    main()
