#!/usr/bin/env python3
"""What the service costs a guest, beside the shell loop it replaces, side by side in one run.

The two, started at the same moment on the same machine, each a whole process tree:
  agent:      `vgpu-license-agent run` (bench/service.py's guest: nvidia-smi from a saved
              output of a licensed vGPU, the default intervals), with its journal follower;
  shell loop: `while sleep 60; do nvidia-smi -q | grep 'License Status'; done` beside
              `journalctl -f SYSLOG_IDENTIFIER=nvidia-gridd | grep -i license`.
Both read a journal of their own: a systemd-journald started for the run in a namespace of its
own (`journalctl --namespace`, through one wrapper script that both call, as they call the
same fake nvidia-smi), quiet but for gridd's lines of a guest's boot (a published
log: tests/fixtures/samples/gridd-log-fastapi-dls-1.txt) and the bursts at the end, so that
what else logs on this machine costs neither of them. Each tree runs in a cgroup of its own (cgroup v2), under a child subreaper outside it. `perf
stat -a -G` counts, second by second, the context switches (wakeups: voluntary and
involuntary, every thread of every process that ran in the cgroup, the ones that ended
included) and the CPU time of each cgroup. At the end each subreaper reaps the whole tree and
prints the rusage of every reaped child: the same totals, counted another way.

The agent runs at its default pace: licensed and quiet it wakes for its heartbeat (every 2
minutes) and reads nvidia-smi once an hour (poll_licensed_seconds), so a cycle of its is an
hour. The steady window, from minute 2, holds whole heartbeats, and whole hours where MINUTES
is 62 or more; each window's row says how many readings of nvidia-smi it holds (the fake
nvidia-smi counts its calls), and the calls an hour stand beside the shell loop's 60.

Printed: wakeups and CPU over the first 4 and the first 10 minutes and per minute from minute 2
on (steady state), each as the agent's figure, the shell loop's, and their ratio, with the
minimum, median and maximum over the runs (or the minutes); the agent's memory idle and after
bursts of gridd lines, beside nvidia-gridd's own (the `Memory: 4.4M` of gridd's unit in a
published `systemctl status`, tests/fixtures/samples/gridd-log-fnos-1.txt); and the goals.

Usage: sudo python3 bench/footprint.py [--binary PATH] [--minutes 10] [--runs 3]
(--minutes 62: the steady window holds a whole hour, the agent's reading included)
(runs start 30 s apart and overlap; about MINUTES + 2 minutes). Needs root, perf
(apt-get install linux-perf) and cgroup v2 (/sys/fs/cgroup or /sys/fs/cgroup/unified).
"""
import argparse, atexit, importlib.util, json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
spec = importlib.util.spec_from_file_location("service_bench", os.path.join(HERE, "service.py"))
svc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(svc)

# nvidia-gridd's own memory: `Memory: 4.4M` in the published `systemctl status nvidia-gridd`.
GRIDD_MIB = 4.4 * 1000 * 1000 / 1048576
STAGGER = 30
# The agent's cycles: its heartbeat, and its licensed pace (the default poll_licensed_seconds).
HEARTBEAT_S = 120
READING_S = 3600


def steady_end(minutes):
    """The steady window's end (s): from minute 2, whole heartbeats, and whole hours when
    the run holds one."""
    span = minutes * 60 - 120
    cycle = READING_S if span >= READING_S else HEARTBEAT_S
    return 120 + span // cycle * cycle


def calls_in(samples, t_start, a, b):
    """nvidia-smi calls from A to B seconds after T_START, of (perf's time, count so far)."""
    def at(x):
        n = 0
        for t, c in samples:
            if t - t_start <= x:
                n = c
        return n
    return at(b) - at(a)

# The child subreaper: starts the tree in CGROUP, reaps every process of it that ends (its own
# children and the orphans handed to it), and at SIGTERM stops the tree and prints the rusage of
# everything it reaped.
RUNNER = r"""
import ctypes, json, os, resource, signal, sys
cgroup, argv = sys.argv[1], sys.argv[2:]
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    os.close(r)
    os.write(w, b"x")
    os.execvp(argv[0], argv)
os.close(w)
os.read(r, 1)
print(pid, flush=True)
def stop(*_):
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
signal.signal(signal.SIGTERM, stop)
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
    except InterruptedError:
        continue
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wakeups": u.ru_nvcsw + u.ru_nivcsw, "cpu": u.ru_utime + u.ru_stime,
                  "maxrss_mib": u.ru_maxrss / 1024}), flush=True)
"""


def cgroup_base():
    for base in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]:
        if os.path.exists(f"{base}/cgroup.procs") and os.path.exists(f"{base}/cgroup.subtree_control"):
            return base
    sys.exit("bench/footprint.py: no cgroup v2 hierarchy (/sys/fs/cgroup or /sys/fs/cgroup/unified)")


class Tree:
    """A process tree in a cgroup of its own, under the subreaper."""

    def __init__(self, name, base):
        self.name = name
        self.cg_name = f"vla-footprint-{os.getpid()}-{name}"
        self.cgroup = f"{base}/{self.cg_name}"
        os.mkdir(self.cgroup)
        self.runner = None
        self.totals = None

    def start(self, argv, env):
        self.runner = subprocess.Popen([sys.executable, "-c", RUNNER, self.cgroup, *argv],
                                       stdout=subprocess.PIPE, text=True, env=env,
                                       stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        self.pid = int(self.runner.stdout.readline())

    def stop(self):
        if self.runner is not None:
            if self.runner.poll() is None:
                self.runner.send_signal(signal.SIGTERM)
            out = self.runner.communicate(timeout=30)[0].strip()
            self.totals = json.loads(out.splitlines()[-1]) if out else None
            self.runner = None
        for _ in range(50 if os.path.exists(self.cgroup) else 0):
            try:
                os.rmdir(self.cgroup)
                break
            except OSError:
                time.sleep(0.1)


def shell_loop_argv(root):
    # journalctl through the same wrapper as the agent's (it names the run's journal
    # namespace), as nvidia-smi is the same fake for both.
    script = f"""
{root}/journalctl -f -n 0 SYSLOG_IDENTIFIER=nvidia-gridd | grep --line-buffered -i license > {root}/seen &
while true; do {root}/nvidia-smi -q | grep -i 'License Status' > {root}/smi-seen; sleep 60; done
"""
    return ["bash", "-c", script]


class Perf:
    """perf stat's per-second context switches and task clock of each cgroup."""

    def __init__(self, cgroups, path):
        events = []
        for cg in cgroups:
            events += ["-e", "context-switches", "-G", cg, "-e", "task-clock", "-G", cg]
        self.path = path
        self.err = open(path + ".err", "w+")
        self.proc = subprocess.Popen(["perf", "stat", "-a", "-x", ";", "-I", "1000", "-o", path, *events],
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        self.t0 = time.monotonic()
        # perf counts from its first interval on: the trees start once it has printed one (a
        # start it missed would read as a start that cost nothing).
        deadline = time.monotonic() + 30
        while not self.counting() and time.monotonic() < deadline and self.proc.poll() is None:
            time.sleep(0.1)
        if self.proc.poll() is not None or not self.counting():
            self.err.seek(0)
            sys.exit(f"bench/footprint.py: perf stat is not counting: {self.err.read().strip()}")

    def counting(self):
        try:
            return any(";" in line and not line.startswith("#") for line in open(self.path))
        except FileNotFoundError:
            return False

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)

    def series(self):
        """{cgroup: [(perf's time s, switches, cpu s)]}, one entry a second."""
        out = {}
        for line in open(self.path):
            f = line.strip().split(";")
            if len(f) < 4 or line.startswith("#"):
                continue
            t, value, event = float(f[0]), f[1], f[3]
            cg = f[4] if len(f) > 4 else ""
            # The cgroup is the field after the event name (perf -x prints it there with -G).
            for x in f[4:]:
                if x.startswith("vla-footprint-"):
                    cg = x
            try:
                v = float(value)
            except ValueError:
                v = 0.0
            rows = out.setdefault(cg, {})
            row = rows.setdefault(t, [0.0, 0.0])
            if event.startswith("context-switches"):
                row[0] += v
            elif event.startswith("task-clock"):
                row[1] += v / 1000
        return {cg: [(t, *rows[t]) for t in sorted(rows)] for cg, rows in out.items()}


def window(series, t_start, a, b):
    """Switches and CPU seconds of the seconds from A to B after T_START (perf's clock)."""
    w = c = 0.0
    for t, sw, cpu in series:
        if a < t - t_start <= b:
            w += sw
            c += cpu
    return w, c


def mmm(values, fmt="{:.2f}"):
    v = sorted(values)
    return f"{fmt.format(statistics.median(v))} (min {fmt.format(v[0])}, max {fmt.format(v[-1])})"


def memory(pid):
    """VmRSS, VmHWM (MiB) and the sum of private bytes of a live process."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k = line.split(":")[0]
        if k in ("VmRSS", "VmHWM", "Threads"):
            out[k] = int(line.split()[1]) / 1024 if k != "Threads" else int(line.split()[1])
    for line in open(f"/proc/{pid}/smaps_rollup"):
        k = line.split(":")[0]
        if k in ("Pss", "Private_Dirty", "Anonymous"):
            out[k] = int(line.split()[1]) / 1024
    return out


def agent_pid(tree):
    """The agent: the process the subreaper started (it execs the agent)."""
    return tree.pid


def burst(n):
    for i in range(n):
        svc.send_gridd(f"License renewed successfully. (Info: burst-{os.getpid()}-{i}, NVIDIA Virtual Compute Server; Expiry: 2099-5-27 0:8:28 GMT)")


def run_status(root):
    """status.json where the package keeps it: under /run, a tmpfs (the metrics textfile stays
    on disk, as node-exporter's directory is). Returns the directory, removed at the end."""
    d = tempfile.mkdtemp(prefix="vla-fp-status-", dir="/run")
    conf = open(f"{root}/config.toml").read()
    conf = conf.replace(f'status_file = "{root}/run/status.json"', f'status_file = "{d}/status.json"', 1)
    open(f"{root}/config.toml", "w").write(conf)
    return d


def boot_lines():
    """gridd's lines of a guest's boot: the published log's messages."""
    path = os.path.join(ROOT, "tests/fixtures/samples/gridd-log-fastapi-dls-1.txt")
    for line in open(path):
        if "nvidia-gridd[" in line and "]: " in line:
            msg = line.split("]: ", 1)[1].rstrip("\n")
            yield msg.replace("2022-12-21 16:53:33", "2099-12-21 16:53:33")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", help="the agent (default: the binary the packages ship, target/dist/, built first)")
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/footprint.py: run it as root (cgroups, perf -a, root's gridd lines)")
    if shutil.which("perf") is None:
        sys.exit("bench/footprint.py: needs perf (apt-get install linux-perf)")
    if a.minutes < 4:
        sys.exit("bench/footprint.py: --minutes must be 4 or more")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a.binary = svc.built(a.binary)
    base = cgroup_base()
    for msg in boot_lines():
        svc.send_gridd(msg)
    print(f"machine: {svc.machine(a.binary)}; load average {open('/proc/loadavg').read().split()[0]}")
    print(f"{a.runs} runs of {a.minutes} min, {STAGGER} s apart; each run: the agent and the shell loop started together")
    roots, runs = [], []
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    for i in range(a.runs):
        for who in ("agent", "loop"):
            root = tempfile.mkdtemp(prefix=f"vla-fp-{who}-")
            svc.setup(root, None)
            roots.append(root)
            if who == "agent":
                roots.append(run_status(root))
    atexit.register(lambda: [shutil.rmtree(r, ignore_errors=True) for r in roots])
    trees = []
    atexit.register(lambda: [t.stop() for t in trees])
    for i in range(a.runs):
        trees += [Tree(f"agent{i}", base), Tree(f"loop{i}", base)]
    perf = Perf([t.cg_name for t in trees], os.path.join(roots[0], "perf.csv"))
    try:
        for i in range(a.runs):
            ra, rl = roots[3 * i], roots[3 * i + 2]
            agent, loop = trees[2 * i], trees[2 * i + 1]
            agent.start([a.binary, "--config", f"{ra}/config.toml", "run"], env)
            loop.start(shell_loop_argv(rl), env)
            runs.append((agent, loop, time.monotonic() - perf.t0))
            if i + 1 < a.runs:
                time.sleep(STAGGER)
        calls = {r: [] for r in roots}

        def count_calls():
            now = time.monotonic() - perf.t0
            for r in calls:
                calls[r].append((now, svc_calls(r)))

        end = runs[0][2] + a.minutes * 60
        while time.monotonic() - perf.t0 < end + 2:
            count_calls()
            time.sleep(1)
        mem_idle = [memory(agent_pid(r[0])) for r in runs]
        # Bursts of gridd lines after the windows: the peak RSS must not grow with their size.
        last_end = runs[-1][2] + a.minutes * 60
        while time.monotonic() - perf.t0 < last_end + 2:
            count_calls()
            time.sleep(1)
        mem_burst = {}
        for n in (100, 1000):
            burst(n)
            time.sleep(3)
            mem_burst[n] = [memory(agent_pid(r[0])) for r in runs]
    finally:
        for t in trees:
            t.stop()
        perf.stop()
    series = perf.series()
    smi = [(calls[roots[3 * i]], calls[roots[3 * i + 2]]) for i in range(a.runs)]
    report(a, runs, series, mem_idle, mem_burst, smi)


def svc_calls(root):
    """How many times the tree's nvidia-smi has run so far."""
    try:
        return len(open(f"{root}/smi-calls").read().splitlines())
    except FileNotFoundError:
        return 0


def report(a, runs, series, mem_idle, mem_burst, smi):
    m = a.minutes
    end = steady_end(m)
    rows = []  # (label, agent values, loop values)

    def per_run(a_, b_, scale=1.0):
        ag, lo = [], []
        for agent, loop, t in runs:
            ag.append([x * scale for x in window(series[agent.cg_name], t, a_, b_)])
            lo.append([x * scale for x in window(series[loop.cg_name], t, a_, b_)])
        return ag, lo

    first4 = per_run(0, 240)
    first = per_run(0, m * 60)
    steady = per_run(120, end, 60 / (end - 120))
    # Per minute, the steady window's minutes, every run: the spread of the steady state.
    minutes = [per_run(60 * k, 60 * (k + 1)) for k in range(2, end // 60)]
    s_label = f"minutes 2 to {end // 60}"

    def readings(a_, b_):
        ag = [calls_in(c[0], t, a_, b_) for c, (_, _, t) in zip(smi, runs)]
        lo = [calls_in(c[1], t, a_, b_) for c, (_, _, t) in zip(smi, runs)]
        return f"agent {mmm(ag, '{:.0f}')}, shell loop {mmm(lo, '{:.0f}')}"

    print()
    print("readings of nvidia-smi each window holds (every run):")
    print(f"  first 4 min: {readings(0, 240)}")
    if m != 4:
        print(f"  first {m} min: {readings(0, m * 60)}")
    print(f"  the steady window, {s_label} ({(end - 120) // HEARTBEAT_S} heartbeats): {readings(120, end)}")
    span_h = (end - 120) / 3600
    ag_h = [calls_in(c[0], t, 120, end) / span_h for c, (_, _, t) in zip(smi, runs)]
    lo_h = [calls_in(c[1], t, 120, end) / span_h for c, (_, _, t) in zip(smi, runs)]
    whole = "" if end - 120 >= READING_S else (
        f" (the window is shorter than the agent's hour between readings: its pace, licensed and quiet, "
        f"is 1 an hour; --minutes 62 measures it)")
    print(f"nvidia-smi calls an hour, the steady window: agent {mmm(ag_h, '{:.1f}')}, "
          f"shell loop {mmm(lo_h, '{:.1f}')}{whole}")
    print()
    print("| measure | agent | shell loop | agent / shell loop | goal |")
    print("|---|---|---|---|---|")

    def line(label, ag, lo, idx, fmt, goal):
        r = [x[idx] / max(y[idx], 1e-9) for x, y in zip(ag, lo)]
        print(f"| {label} | {mmm([x[idx] for x in ag], fmt)} | {mmm([y[idx] for y in lo], fmt)} | {mmm(r)} | {goal} |")
        return statistics.median(r)

    goals = []
    goals.append(("wakeups, first 4 min <= 1x", line("wakeups, first 4 min", *first4, 0, "{:.0f}", "<= 1x") <= 1))
    if m != 4:  # with --minutes 4 the row above is this one
        line(f"wakeups, first {m} min", *first, 0, "{:.0f}", "")
    goals.append(("wakeups, steady <= 0.25x", line(f"wakeups a minute, {s_label}", *steady, 0, "{:.1f}", "<= 0.25x") <= 0.25))
    goals.append(("CPU, first 4 min <= 1x", line("CPU s, first 4 min", *first4, 1, "{:.3f}", "<= 1x") <= 1))
    if m != 4:
        line(f"CPU s, first {m} min", *first, 1, "{:.3f}", "")
    goals.append(("CPU, steady <= 0.25x", line(f"CPU s an hour, {s_label}", *[[[c[0], c[1] * 60] for c in x] for x in steady], 1, "{:.3f}", "<= 0.25x") <= 0.25))
    ag_min = [x[0] for mm in minutes for x in mm[0]]
    lo_min = [y[0] for mm in minutes for y in mm[1]]
    print(f"| wakeups in each minute of {s_label} (every run) | {mmm(ag_min, '{:.0f}')} | {mmm(lo_min, '{:.0f}')} | | |")
    # The same totals from the subreapers' rusage (whole runs, shutdown included).
    for agent, loop, _ in runs:
        for t in (agent, loop):
            cg = series[t.cg_name]
            print(f"(cross-check, {t.name}: perf {sum(x[1] for x in cg):.0f} wakeups, {sum(x[2] for x in cg):.3f} s CPU; "
                  f"rusage of every reaped process {t.totals['wakeups'] if t.totals else '?'} wakeups, "
                  f"{t.totals['cpu'] if t.totals else float('nan'):.3f} s CPU)")
    print()
    print(f"agent memory (MiB), each run; nvidia-gridd's own: {GRIDD_MIB:.1f} MiB (`Memory: 4.4M`)")
    print("| when | RSS | peak RSS (VmHWM) | PSS | anonymous | threads | peak RSS / nvidia-gridd's |")
    print("|---|---|---|---|---|---|---|")
    for label, mems in [(f"idle, after {m} min", mem_idle)] + [(f"after a burst of {n} gridd lines", mem_burst[n]) for n in mem_burst]:
        print(f"| {label} | {mmm([x['VmRSS'] for x in mems], '{:.1f}')} | {mmm([x['VmHWM'] for x in mems], '{:.1f}')} | "
              f"{mmm([x['Pss'] for x in mems], '{:.1f}')} | {mmm([x['Anonymous'] for x in mems], '{:.1f}')} | "
              f"{mmm([x['Threads'] for x in mems], '{:.0f}')} | {mmm([x['VmHWM'] / GRIDD_MIB for x in mems])} |")
    hwm = [x["VmHWM"] for x in mem_burst[1000]]
    goals.append(("peak RSS <= nvidia-gridd's", statistics.median(hwm) <= GRIDD_MIB))
    grow = [b["VmHWM"] - s["VmHWM"] for s, b in zip(mem_burst[100], mem_burst[1000])]
    goals.append(("peak RSS does not grow from a 100- to a 1000-line burst (within 0.1 MiB)", max(grow) <= 0.1))
    print()
    for g, ok in goals:
        print(f"goal: {g}: {'met' if ok else 'NOT MET'}")


if __name__ == "__main__":
    main()
