#!/usr/bin/env python3
"""`analyze --journal` on a large `journalctl -o json` export, beside the two baselines run on
the same file in the same rounds: `cat FILE > /dev/null` (reading the file: the floor) and
`grep -c` of a fixed string (`grep -c 'License acquired successfully' FILE`, what people run
instead; its output goes to a file: GNU grep stops at the first match when it writes to
/dev/null).

The export is 2 % nvidia-gridd entries of every kind (`cargo xtask gen-journal`:
xtask/src/gen_journal.rs), made once and kept in target/bench/. Each round runs every command
once, one after the other (interleaved, so that the machine's moods fall on all of them), the
page cache warm. Printed: each command's wall time, min/median/max over the rounds, its peak
RSS, and per round its speed as a ratio to each baseline's in the same round (min/median/max);
then the same on an eighth of the input (linear in size?) and the goals.

Usage: python3 bench/journal.py [--size-mb 1000] [--rounds 7]
(at most 1023 MiB: analyze reads at most 1 GiB of a saved journal)
"""
import argparse, os, shutil, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BENCH = os.path.join(ROOT, "target/bench")
AGENT = os.path.join(ROOT, "target/dist/vgpu-license-agent")
NEEDLE = "License acquired successfully"


def generate(size_mb):
    path = os.path.join(BENCH, f"journal-{size_mb}M-2pct.json")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        print(f"generating {path} ...", file=sys.stderr, flush=True)
        with open(path + ".tmp", "wb") as f:
            subprocess.run([os.path.join(ROOT, "target/release/xtask"), "gen-journal", str(size_mb), "2"],
                           stdout=f, check=True)
        os.rename(path + ".tmp", path)
    return path


TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None


def run(argv, out):
    """Wall seconds and peak RSS (MiB; NaN without GNU time) of ARGV, its standard output to
    OUT. The peak is GNU time's: a process carries its own size into the peak of what it
    starts, so a small one starts ARGV, not this Python."""
    rss_file = os.path.join(BENCH, "rss")
    wrapped = [TIME, "-f", "%M", "-o", rss_file, *argv] if TIME else argv
    with open(out, "wb") as f:
        t0 = time.perf_counter()
        code = subprocess.call(wrapped, stdout=f, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
    # grep -c exits 1 when it counts nothing, analyze 0 to 3 by the state it found.
    if not 0 <= code <= 3:
        sys.exit(f"bench/journal.py: {' '.join(argv)} exited {code}")
    # The last line: after "Command exited with non-zero status N", when it did.
    rss = int(open(rss_file).read().split()[-1]) / 1024 if TIME else float("nan")
    return wall, rss


def mmm(v, fmt="{:.3f}"):
    v = sorted(v)
    return f"{fmt.format(statistics.median(v))} ({fmt.format(v[0])} to {fmt.format(v[-1])})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    if not 8 <= a.size_mb <= 1023:
        sys.exit("bench/journal.py: --size-mb must be between 8 and 1023 (analyze reads at most 1 GiB)")
    cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    # Both into ROOT/target, where the paths above look.
    env = {k: v for k, v in os.environ.items() if k != "CARGO_TARGET_DIR"}
    subprocess.run([cargo, "build", "--release", "--quiet", "--package", "xtask"], cwd=ROOT, check=True, env=env)
    # The binary the packages ship.
    subprocess.run(["bash", "packaging/build-release.sh"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
    os.makedirs(BENCH, exist_ok=True)
    full, eighth = generate(a.size_mb), generate(a.size_mb // 8)
    size = os.path.getsize(full)
    lines = int(subprocess.run(["wc", "-l", full], capture_output=True, text=True).stdout.split()[0])
    gridd = int(subprocess.run(["grep", "-c", "nvidia-gridd", full], capture_output=True, text=True).stdout)
    version = subprocess.run([AGENT, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"input: {full}, {size >> 20} MiB, {lines} lines, {gridd} ({100 * gridd / lines:.1f} %) naming nvidia-gridd")
    print(f"machine: {os.cpu_count()} cores; {version}; load average {open('/proc/loadavg').read().split()[0]}")
    out = os.path.join(BENCH, "out")
    commands = {
        "cat FILE > /dev/null": lambda f: (["cat", f], "/dev/null"),
        f"grep -c '{NEEDLE}' FILE": lambda f: (["grep", "-c", NEEDLE, f], out),
        "analyze --journal FILE": lambda f: ([AGENT, "analyze", "--journal", f], out),
        "analyze --journal FILE --json": lambda f: ([AGENT, "analyze", "--journal", f, "--json"], out),
    }
    if TIME is None:
        print("(no /usr/bin/time: no peak RSS; apt-get install time)")
    for f in (full, eighth):
        subprocess.run(["cat", f], stdout=subprocess.DEVNULL)  # the page cache warm
    times = {(name, f): [] for name in commands for f in (full, eighth)}
    rss = {(name, f): 0.0 for name in commands for f in (full, eighth)}
    for _ in range(a.rounds):
        for f in (full, eighth):
            for name, make in commands.items():
                argv, dest = make(f)
                t, m = run(argv, dest)
                times[(name, f)].append(t)
                rss[(name, f)] = max(rss[(name, f)], m)
    cat, grep = "cat FILE > /dev/null", f"grep -c '{NEEDLE}' FILE"
    print(f"\n{a.rounds} rounds, interleaved; the median (min to max) of each; speed = the baseline's time / this one's, per round")
    print("| on the 1000 MiB export | time, s | MB/s | peak RSS | speed vs cat | speed vs grep -c |")
    print("|---|---|---|---|---|---|")
    for name in commands:
        t = times[(name, full)]
        vs_cat = [c / x for c, x in zip(times[(cat, full)], t)]
        vs_grep = [g / x for g, x in zip(times[(grep, full)], t)]
        print(f"| `{name}` | {mmm(t)} | {size / 1e6 / statistics.median(t):.0f} | {rss[(name, full)]:.1f} MiB | "
              f"{mmm(vs_cat, '{:.2f}')}x | {mmm(vs_grep, '{:.2f}')}x |")
    ta, te = times[("analyze --journal FILE", full)], times[("analyze --journal FILE", eighth)]
    grow = statistics.median(ta) / statistics.median(te)
    print(f"\nanalyze --journal on {os.path.getsize(eighth) >> 20} MiB: {mmm(te)} s, peak RSS {rss[('analyze --journal FILE', eighth)]:.1f} MiB; "
          f"on {size >> 20} MiB: {statistics.median(ta):.3f} s, peak RSS {rss[('analyze --journal FILE', full)]:.1f} MiB: "
          f"{grow:.1f}x the time for {size / os.path.getsize(eighth):.1f}x the input")
    speed_cat = statistics.median(c / x for c, x in zip(times[(cat, full)], ta))
    speed_grep = statistics.median(g / x for g, x in zip(times[(grep, full)], ta))
    flat = rss[("analyze --journal FILE", full)] <= rss[("analyze --journal FILE", eighth)] + 1
    for goal, ok in [(f"speed >= 0.7x cat's (median {speed_cat:.2f}x)", speed_cat >= 0.7),
                     (f"speed >= 2x grep -c's (median {speed_grep:.2f}x)", speed_grep >= 2),
                     ("peak RSS flat: the whole input within 1 MiB of the eighth's", flat)]:
        print(f"goal: {goal}: {'met' if ok else 'NOT MET'}")
    if a.size_mb < 1000:
        print(f"(the goals are set for the 1000 MiB export: on {a.size_mb} MiB, starting each "
              "process weighs more than reading the file)")


if __name__ == "__main__":
    main()
