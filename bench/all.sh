#!/usr/bin/env bash
# Every benchmark, one after the other, on the release build (as root: the service's
# benchmark needs it), each printing its figures beside its baselines of the same run:
#
#   sudo bash bench/all.sh      (about 26 minutes on 2 cores)
#
# The output is kept in target/bench/all-<UTC time>.txt too; docs/benchmarks.md's tables are
# the run copied to bench/all.txt. Exit status: non-zero when any benchmark failed (every one runs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH="$HOME/.cargo/bin:$PATH"
mkdir -p target/bench
log=target/bench/all-$(date -u +%Y%m%dT%H%M%SZ).txt
failed=0
{
  echo "bench/all.sh at $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "machine: $(nproc) cores, $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for b in "python3 bench/journal.py" "python3 bench/footprint.py" "python3 bench/exe_pages.py" "python3 bench/service.py" "python3 bench/node_condition.py" "python3 bench/wakeups.py"; do
    printf '\n######## %s ########\n' "$b"
    start=$SECONDS
    $b || { echo "FAILED: $b"; failed=1; }
    echo "($b: $((SECONDS - start)) s)"
  done
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  exit $failed
} 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
echo "kept: $log"
exit "$rc"
