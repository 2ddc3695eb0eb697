#!/usr/bin/env python3
"""Wakeups of the running service, thread by thread, in the states a guest lives in for
long: licensed and quiet, licensed with a warning (a failure line in this boot's journal, a
token expiring soon), and unlicensed with a failure. Each state's guest is bench/service.py's
(nvidia-smi from a saved output, systemctl answering `active`), measured for SECONDS after
45 s of settling: voluntary and involuntary context switches of every thread of the agent
and of its journal follower, per minute, at the agent's default pace. The window holds whole
heartbeats (SECONDS a multiple of the 2-minute heartbeat), and says how many readings of
nvidia-smi it holds (licensed and quiet, one an hour: most windows hold none).

Usage: python3 bench/wakeups.py [--binary PATH] [--seconds 120]
(without --binary: builds and measures the binary the packages ship, target/dist/). As root.
"""
import argparse, importlib.util, os, shutil, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
spec = importlib.util.spec_from_file_location("service_bench", os.path.join(HERE, "service.py"))
svc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(svc)

LICENSED = "Licensed (Expiry: 2099-5-27 0:8:28 GMT)"


def switches(pid):
    """(thread name -> context switches) of a process and its children."""
    out = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            status = open(f"/proc/{pid}/task/{t}/status").read().splitlines()
            name = open(f"/proc/{pid}/task/{t}/comm").read().strip()
        except OSError:
            continue
        n = sum(int(l.split()[1]) for l in status if l.split(":")[0] in
                ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        out[f"{pid}/{t} {name}"] = n
    kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    for k in kids:
        out.update(switches(int(k)))
    return out


def smi_calls(root):
    """How many times the guest's nvidia-smi has run (bench/service.py's counts them)."""
    try:
        return len(open(f"{root}/smi-calls").read().splitlines())
    except FileNotFoundError:
        return 0


def measure(binary, seconds, smi_status):
    root = tempfile.mkdtemp(prefix="vla-wake-")
    svc.setup(root, None)
    smi = f"{root}/smi.txt"
    text = open(smi).read().replace(LICENSED, smi_status)
    open(smi, "w").write(text)
    agent = subprocess.Popen([binary, "--config", f"{root}/config.toml", "run"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(45)
        a = switches(agent.pid)
        calls_a = smi_calls(root)
        time.sleep(seconds)
        b = switches(agent.pid)
        readings = smi_calls(root) - calls_a
        per = {k: (b[k] - a.get(k, 0)) * 60 / seconds for k in b}
        state = subprocess.run([binary, "--config", f"{root}/config.toml", "status"],
                               capture_output=True, text=True).stdout.splitlines()[:1]
        return per, state, readings
    finally:
        agent.terminate()
        agent.wait()
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary")
    ap.add_argument("--seconds", type=int, default=120)
    a = ap.parse_args()
    if a.seconds % 120:
        sys.exit("bench/wakeups.py: --seconds must be whole heartbeats (a multiple of 120)")
    if os.geteuid() != 0:
        sys.exit("bench/wakeups.py: run it as root")
    a.binary = svc.built(a.binary)
    svc.journal()
    print(f"machine: {svc.machine(a.binary)}")
    for label, status in [("license held", LICENSED), ("no license", "Unlicensed (Unrestricted)")]:
        per, state, readings = measure(a.binary, a.seconds, status)
        total = sum(per.values())
        print(f"{label} ({'; '.join(state)}): {total:.0f} wakeups a minute, all threads; "
              f"{readings} readings of nvidia-smi in the {a.seconds} s window")
        for k in sorted(per, key=lambda k: -per[k]):
            if per[k]:
                print(f"    {per[k]:6.1f}  {k.split(' ', 1)[1]}")


if __name__ == "__main__":
    main()
