#!/usr/bin/env python3
"""Benchmark of the service (`vgpu-license-agent run`) against the real journald.

Latency: from a gridd line reaching the journal (sent to journald's syslog socket as
nvidia-gridd) to status.json and the metrics textfile showing it, for N lines, each beside a
plain `journalctl --follow` reader of the same line (the baseline: what `journalctl -f | grep`
sees), and as a ratio to it. What the service costs idle, beside the shell loop, is
bench/footprint.py's.

Usage: python3 bench/service.py [--binary PATH] [--lines 50]
(without --binary: builds and measures the binary the packages ship, target/dist/). About 2 minutes
with the defaults. Needs root: the agent believes only gridd lines that journald says root's
nvidia-gridd process sent (_UID=0, _COMM=nvidia-gridd), so the lines are sent by a helper
process of root's named nvidia-gridd. The journal is the run's own: a systemd-journald started
in a namespace of its own (`journalctl --namespace`), stopped and its files removed at the end.
What else logs on this machine, or runs (the tests' own journald and simulated gridd), is
neither in it nor changed by it. Every benchmark of bench/ takes its journal from here.
"""
import argparse, atexit, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SMI = os.path.join(ROOT, "tests/fixtures/samples/smi-jp-dls-guide-2.txt")


class Journal:
    """A systemd-journald of this run's own, in the namespace NS; stopped, and its files
    removed, at the end."""

    def __init__(self):
        self.ns = f"vlabench{os.getpid()}"
        binary = next((b for b in ["/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald"]
                       if os.path.exists(b)), None)
        if binary is None:
            sys.exit("bench: systemd-journald is not installed (apt-get install systemd)")
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
        self.stream = None
        self.proc = subprocess.Popen([binary, self.ns], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env)
        atexit.register(self.stop)
        self.dev_log = f"/run/systemd/journal.{self.ns}/dev-log"
        if not wait_for(lambda: os.path.exists(self.dev_log), 10, 0.05):
            sys.exit(f"bench: the journald of namespace {self.ns} made no {self.dev_log}")
        # A journald of a namespace stops when it has been idle for a while (no stream
        # connected); this one stays for the run: a stream is connected, and says nothing.
        self.stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.stream.connect(f"/run/systemd/journal.{self.ns}/stdout")
        self.stream.sendall(b"vla-bench\n\n6\n0\n0\n0\n0\n")

    def stop(self):
        if self.stream is not None:
            self.stream.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        mid = open("/etc/machine-id").read().strip()
        for d in [f"/run/systemd/journal.{self.ns}", f"/var/log/journal/{mid}.{self.ns}",
                  f"/run/log/journal/{mid}.{self.ns}"]:
            shutil.rmtree(d, ignore_errors=True)

    def argv(self, *args):
        """journalctl ARGS, reading this namespace."""
        return [shutil.which("journalctl") or "journalctl", f"--namespace={self.ns}", *args]

    def wrapper(self, root):
        """A journalctl that reads this namespace, as a script: ROOT/journalctl."""
        path = f"{root}/journalctl"
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\nexec {" ".join(self.argv())} "$@"\n')
        os.chmod(path, 0o755)
        return path


_journal = None


def journal():
    """The run's journal, started on first use."""
    global _journal
    if _journal is None:
        _journal = Journal()
    return _journal


def setup(root, poll_licensed):
    # poll_licensed: the licensed pace in seconds, or None for the agent's default.
    # The package's layout under ROOT: the token and gridd.conf in etc/nvidia (the agent
    # watches those two directories), status.json in run/, the metrics textfile elsewhere.
    nv = f"{root}/etc/nvidia"
    for d in [f"{nv}/ClientConfigToken", f"{root}/state", f"{root}/prom", f"{root}/run"]:
        os.makedirs(d)
    # A guest holding a license until 2099 (the sample's layout, a later expiry).
    smi = open(SMI).read().replace("2022-5-27 0:8:28 GMT", "2099-5-27 0:8:28 GMT")
    open(f"{root}/smi.txt", "w").write(smi)
    # Each call of nvidia-smi is counted (a builtin's append: no process of its own).
    for name, body in [("nvidia-smi", f"#!/bin/sh\necho x >> {root}/smi-calls\ncat {root}/smi.txt\n"),
                       ("systemctl", "#!/bin/sh\necho active\n"),
                       ("restart", f"#!/bin/sh\necho x >> {root}/restarts\n")]:
        with open(f"{root}/{name}", "w") as f:
            f.write(body)
        os.chmod(f"{root}/{name}", 0o755)
    tok = open(os.path.join(ROOT, "tests/fixtures/example.tok"), "rb").read()
    with open(f"{nv}/ClientConfigToken/client_configuration_token.tok", "wb") as f:
        f.write(tok)
    os.chmod(f"{nv}/ClientConfigToken/client_configuration_token.tok", 0o744)
    open(f"{nv}/gridd.conf", "w").write("FeatureType=1\n")
    # The guest's PCI bus: one NVIDIA 3D controller (a vGPU), its driver bound.
    dev = f"{root}/sys/bus/pci/devices/0000:02:01.0"
    os.makedirs(dev)
    os.makedirs(f"{root}/sys/bus/pci/drivers/nvidia")
    open(f"{dev}/vendor", "w").write("0x10de\n")
    open(f"{dev}/class", "w").write("0x030200\n")
    os.symlink(f"{root}/sys/bus/pci/drivers/nvidia", f"{dev}/driver")
    open(f"{root}/config.toml", "w").write(f"""
[paths]
token_dir = "{nv}/ClientConfigToken"
gridd_conf = "{nv}/gridd.conf"
state_dir = "{root}/state"
status_file = "{root}/run/status.json"
metrics_textfile = "{root}/prom/vgpu_license_agent.prom"
pci_devices = "{root}/sys/bus/pci/devices"
[commands]
journalctl = "{journal().wrapper(root)}"
nvidia_smi = "{root}/nvidia-smi"
systemctl = "{root}/systemctl"
restart_gridd = ["{root}/restart"]
{'' if poll_licensed is None else f'''[service]
poll_licensed_seconds = {poll_licensed}
'''}""")



def cpu_of(pid):
    """utime+stime of the process and its reaped children, in seconds."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return sum(int(x) for x in f[11:15]) / tck


def rss_of(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_for(pred, timeout=10.0, step=0.0005):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def status_has(path, marker):
    try:
        return marker in open(path).read()
    except OSError:
        return False


# The sender of gridd's lines: journald takes _COMM from /proc/PID/comm of the process that
# sent a datagram, so a process of its own renames itself nvidia-gridd (prctl PR_SET_NAME)
# before it sends anything, and stays alive (journald reads the name when the line arrives).
# It sends each line it reads from its standard input, as gridd does, with its own pid.
GRIDD_SENDER = r"""
import ctypes, os, socket, sys
PR_SET_NAME = 15
if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, b"nvidia-gridd", 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_NAME): errno %d" % ctypes.get_errno())
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
head = b"<30>nvidia-gridd[%d]: " % os.getpid()
for line in iter(sys.stdin.buffer.readline, b""):
    s.sendto(head + line.rstrip(b"\n"), os.environ["VLA_DEV_LOG"])
"""
_sender = None


def send_gridd(msg):
    """Logs MSG as nvidia-gridd; it reaches journald's socket within microseconds."""
    global _sender
    if _sender is None:
        _sender = subprocess.Popen([sys.executable, "-c", GRIDD_SENDER], stdin=subprocess.PIPE,
                                   env=dict(os.environ, VLA_DEV_LOG=journal().dev_log))
        atexit.register(stop_sender)
        # It renames itself before it reads a line; a rename that failed is said here, not
        # found out as a benchmark that waits for lines the agent ignores.
        assert wait_for(lambda: open(f"/proc/{_sender.pid}/comm").read().strip() == "nvidia-gridd", 5), \
            "the gridd line sender did not rename itself"
    _sender.stdin.write(msg.replace("\n", " ").encode() + b"\n")
    _sender.stdin.flush()


def stop_sender():
    _sender.stdin.close()
    _sender.wait()


def latency(binary, n):
    """Per gridd line, in the same moment: when a plain `journalctl --follow` reader of the
    journal printed it (the baseline: what `journalctl -f | grep` sees), and when the agent's
    status.json (a license renewed) or metrics file (a failure counted) showed it. Returns
    two lists of (reader_ms, agent_ms) pairs: status.json's, the metrics file's."""
    root = tempfile.mkdtemp(prefix="vla-bench-")
    setup(root, 300)
    agent = subprocess.Popen([binary, "--config", f"{root}/config.toml", "run"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jc = None
    try:
        assert wait_for(lambda: status_has(f"{root}/run/status.json", '"licensed"'), 15), "no report"
        seen = {}
        jc = subprocess.Popen(journal().argv("--follow", "--lines=0", "-o", "cat",
                                            "SYSLOG_IDENTIFIER=nvidia-gridd"), stdout=subprocess.PIPE, text=True)
        def reader():
            for line in jc.stdout:
                seen.setdefault(line.rstrip("\n"), time.monotonic())
        threading.Thread(target=reader, daemon=True).start()
        time.sleep(1)
        status, metrics = [], []
        for i in range(n):
            marker = f"bench-{os.getpid()}-{i}"
            msg = f"License renewed successfully. (Info: {marker}, NVIDIA Virtual Compute Server; Expiry: 2099-5-27 0:8:28 GMT)"
            t0 = time.monotonic()
            send_gridd(msg)
            assert wait_for(lambda: status_has(f"{root}/run/status.json", marker)), marker
            t1 = time.monotonic()
            if wait_for(lambda: msg in seen, 2):
                status.append(((seen[msg] - t0) * 1000, (t1 - t0) * 1000))
            time.sleep(0.05)
        # Metrics show a failure as soon as it happens: a counter by reason.
        for i in range(min(n, 20)):
            before = open(f"{root}/prom/vgpu_license_agent.prom").read()
            msg = f"Failed to acquire license from bench-{os.getpid()}-{i} (Info: NVIDIA Virtual Compute Server - Error: Clock windback has been detected)"
            t0 = time.monotonic()
            send_gridd(msg)
            assert wait_for(lambda: open(f"{root}/prom/vgpu_license_agent.prom").read() != before)
            t1 = time.monotonic()
            if wait_for(lambda: msg in seen, 2):
                metrics.append(((seen[msg] - t0) * 1000, (t1 - t0) * 1000))
            send_gridd(f"License renewed successfully. (Info: ok-{i}, NVIDIA Virtual Compute Server; Expiry: 2099-5-27 0:8:28 GMT)")
            time.sleep(0.1)
        return status, metrics
    finally:
        if jc:
            jc.terminate()
            jc.wait()
        agent.terminate(); agent.wait()
        shutil.rmtree(root, ignore_errors=True)


def journal_floor(n):
    """What any journal reader sees, with no agent: when `journalctl --follow` shows a line
    (journald wakes readers on a timer), and when the line is already in the journal file
    (found by running `journalctl -n 1` in a loop)."""
    seen = {}
    jc = subprocess.Popen(journal().argv("--follow", "--lines=0", "-o", "cat",
                                        "SYSLOG_IDENTIFIER=nvidia-gridd"), stdout=subprocess.PIPE, text=True)
    def reader():
        for line in jc.stdout:
            seen.setdefault(line.strip(), time.monotonic())
    threading.Thread(target=reader, daemon=True).start()
    time.sleep(1)
    follow, polled = [], []
    try:
        for i in range(n):
            marker = f"floor-{os.getpid()}-{i}"
            t0 = time.monotonic()
            send_gridd(marker)
            end = time.monotonic() + 10
            while time.monotonic() < end:
                out = subprocess.run(journal().argv("-n", "1", "-o", "cat", "SYSLOG_IDENTIFIER=nvidia-gridd"),
                                     capture_output=True, text=True).stdout
                if marker in out:
                    polled.append((time.monotonic() - t0) * 1000)
                    break
            if wait_for(lambda: marker in seen, 2):
                follow.append((seen[marker] - t0) * 1000)
            time.sleep(0.1 + (i % 5) * 0.05)
    finally:
        jc.terminate()
        jc.wait()
    return follow, polled


class CpuGroup:
    """CPU time of a process and everything it starts, to the microsecond, from a cgroup of
    its own (v2 `cpu.stat`, or v1 `cpuacct.usage`); without one, the process tree's clock
    ticks (10 ms: use a longer --seconds)."""

    def __init__(self):
        self.path, self.read = None, None
        name = f"vla-bench-{os.getpid()}-{time.monotonic_ns()}"
        for base, reader in [("/sys/fs/cgroup", self._v2), ("/sys/fs/cgroup/cpuacct", self._v1)]:
            try:
                if base == "/sys/fs/cgroup" and not os.path.exists(f"{base}/cgroup.controllers"):
                    continue
                os.mkdir(f"{base}/{name}")
                self.path, self.read = f"{base}/{name}", reader
                return
            except OSError:
                continue

    def _v2(self):
        for line in open(f"{self.path}/cpu.stat"):
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6

    def _v1(self):
        return int(open(f"{self.path}/cpuacct.usage").read()) / 1e9

    def enter(self):
        """preexec_fn: the child joins the group before it executes."""
        if self.path:
            with open(f"{self.path}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def cpu(self, pid):
        return self.read() if self.path else cpu_tree(pid)

    def close(self):
        if self.path:
            for _ in range(50):
                try:
                    os.rmdir(self.path)
                    return
                except OSError:
                    time.sleep(0.1)


def cpu_tree(pid):
    """CPU of a process tree: each live member (with its reaped children)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_of(p)
            kids = open(f"/proc/{p}/task/{p}/children").read().split()
        except OSError:
            continue
        todo.extend(int(k) for k in kids)
    return total


def quantiles(v):
    return (f"median {statistics.median(v):6.1f} ms, p90 {sorted(v)[max(0, int(len(v) * 0.9) - 1)]:6.1f} ms, "
            f"max {max(v):6.1f} ms (n={len(v)})")


def paired(name, pairs):
    """A delay of the agent's beside the plain reader's for the same lines, and per line:
    their ratio, and their difference (the agent's own part)."""
    assert pairs, f"{name}: the plain journalctl --follow reader saw none of the lines"
    reader = [r for r, _ in pairs]
    agent = [g for _, g in pairs]
    print(f"{name}: {quantiles(agent)}")
    print(f"    the same lines, a plain journalctl --follow reader (baseline): {quantiles(reader)}")
    print(f"    per line, agent / reader: median {statistics.median(g / max(r, 1e-3) for r, g in pairs):.3f}x; "
          f"agent - reader (the agent's own part): {quantiles([g - r for r, g in pairs])}")


def built(binary):
    """BINARY, or the binary the packages ship (packaging/build-release.sh's), built first."""
    if binary is not None:
        return binary
    subprocess.run(["bash", "packaging/build-release.sh"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={k: v for k, v in os.environ.items() if k != "CARGO_TARGET_DIR"})
    return os.path.join(ROOT, "target/dist/vgpu-license-agent")


def machine(binary):
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:"))
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    journald = subprocess.run(["journalctl", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return f"{os.cpu_count()} cores, {mem / 1048576:.0f} GiB; {version}; {journald}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", help="the agent to measure (default: the binary the packages ship, target/dist/, built first)")
    ap.add_argument("--lines", type=int, default=50)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/service.py: run it as root: the agent believes only root's gridd lines")
    # A stop by signal still takes down what the run started (atexit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a.binary = built(a.binary)
    journal()
    print(f"machine: {machine(a.binary)}")
    st, me = latency(a.binary, a.lines)
    paired("gridd line -> status.json", st)
    paired("gridd failure -> metrics file", me)
    follow, polled = journal_floor(min(a.lines, 30))
    print(f"no agent: line -> in the journal file (journalctl -n 1 in a loop): {quantiles(polled)}")
    print(f"no agent: line -> a journalctl --follow reader:                  {quantiles(follow)}")


if __name__ == "__main__":
    main()
