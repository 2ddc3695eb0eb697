#!/usr/bin/env bash
# Benchmark: `analyze --journal` on a large `journalctl -o json` export, beside two baselines
# run on the same file in the same run: `cat` (reading the file, the floor) and
# `grep -c nvidia-gridd` (what people run instead). For each: the best wall time of 3 warm
# runs, that run's peak RSS, and the time as a ratio to each baseline's. Then `analyze` on an
# eighth of the input: 8 times the input should take about 8 times as long (the test suite
# counts the parsers' work instead of timing it, see tests/properties.rs).
#
# Usage: bash bench/journal.sh [SIZE_MB]   (default 1000, at most 1023: analyze reads at most
#        1 GiB of a saved journal; the generated files are kept in target/bench/)
set -euo pipefail
cd "$(dirname "$0")/.."
size_mb=${1:-1000}
case $size_mb in
'' | *[!0-9]*)
  echo "bench/journal.sh: SIZE_MB must be a whole number of MB (got '$size_mb')" >&2
  exit 2
  ;;
esac
if [ "$size_mb" -lt 8 ] || [ "$size_mb" -gt 1023 ]; then
  echo "bench/journal.sh: SIZE_MB must be between 8 and 1023 (analyze reads at most 1 GiB; got $size_mb)" >&2
  exit 2
fi
agent=target/release/vgpu-license-agent

cargo build --release --quiet --bin vgpu-license-agent --example gen-journal
mkdir -p target/bench
# generate MB: the export of MB MiB (3 % nvidia-gridd lines of every kind), made once.
generate() {
  local f=target/bench/journal-${1}M.json
  if [ ! -s "$f" ]; then
    echo "generating $f ..." >&2
    target/release/examples/gen-journal "$1" 3 >"$f.tmp"
    mv "$f.tmp" "$f"
  fi
  echo "$f"
}
file=$(generate "$size_mb")
eighth=$(generate $((size_mb / 8)))
bytes=$(stat -c %s "$file")
echo "input: $file, $((bytes >> 20)) MiB, $(wc -l <"$file") lines, $(grep -c nvidia-gridd "$file") with nvidia-gridd"
echo "machine: $(nproc) cores, $(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); $(target/release/vgpu-license-agent --version 2>/dev/null || echo "$agent")"

# run CMD...: runs CMD with its output to target/bench/out (a file, not /dev/null: GNU grep
# stops at the first match when it sees /dev/null) and prints "WALL_S RSS_KIB EXIT". The peak
# RSS is GNU time's (a process that starts CMD carries its own size into CMD's peak: a small
# one must start it); without /usr/bin/time, "-".
run() {
  local rc=0 t0 t1
  if [ -x /usr/bin/time ]; then
    # The wall time to the microsecond (GNU time's is to 10 ms).
    t0=$EPOCHREALTIME
    /usr/bin/time -o target/bench/time -f '%M' "$@" >target/bench/out 2>target/bench/err || rc=$?
    t1=$EPOCHREALTIME
    # The last line: after "Command exited with non-zero status N", when it did.
    echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }') $(tail -n 1 target/bench/time) $rc"
  else
    python3 - "$@" <<'PY'
import os, subprocess, sys, time
with open("target/bench/out", "wb") as out:
    t = time.monotonic()
    rc = subprocess.call(sys.argv[1:], stdout=out)
    print(f"{time.monotonic() - t:.4f} - {rc}")
PY
  fi
}
[ -x /usr/bin/time ] || echo "(no /usr/bin/time: no peak RSS; apt-get install time)"

# measure NAME CMD...: the best wall time of 3 warm runs in BEST (s), its peak RSS in RSS
# (KiB). CMD may exit 0 to 3: grep -c exits 1 when it counts nothing, analyze 0 to 3 by the
# state it found (the generated journal ends in a warning: 1). Anything else stops the run.
BEST=
RSS=
measure() {
  local name=$1 t m rc
  shift
  BEST=
  RSS=
  for _ in 1 2 3; do
    read -r t m rc < <(run "$@")
    if [ "$rc" -lt 0 ] || [ "$rc" -gt 3 ]; then
      echo "bench/journal.sh: $name: $* exited $rc" >&2
      tail -n 5 target/bench/err >&2
      exit 1
    fi
    if [ -z "$BEST" ] || awk -v t="$t" -v b="$BEST" 'BEGIN { exit !(t < b) }'; then
      BEST=$t
      RSS=$m
    fi
  done
}
# show NAME T RSS: one line of figures, with the ratios to the baselines' times.
show() {
  awk -v n="$1" -v t="$2" -v m="$3" -v b="$bytes" -v c="$T_CAT" -v g="$T_GREP" 'BEGIN {
    printf "%-32s %7.3f s  %6.0f MB/s  peak RSS %s  %5.2fx cat  %5.2fx grep -c\n",
      n, t, b / 1e6 / (t > 0 ? t : 0.001), (m == "-" ? "     -    " : sprintf("%6.1f MiB", m / 1024)),
      t / (c > 0 ? c : 0.001), t / (g > 0 ? g : 0.001)
  }'
}

cat "$file" "$eighth" >/dev/null # the page cache warm for both
measure cat cat "$file"
T_CAT=$BEST R_CAT=$RSS
measure "grep -c nvidia-gridd" grep -c nvidia-gridd "$file"
T_GREP=$BEST R_GREP=$RSS
echo "times: the best of 3 runs; the ratios: to the baselines' times in this run"
show "cat (baseline)" "$T_CAT" "$R_CAT"
show "grep -c nvidia-gridd (baseline)" "$T_GREP" "$R_GREP"
measure "analyze --journal --json" "$agent" analyze --journal "$file" --json
show "analyze --journal --json" "$BEST" "$RSS"
measure "analyze --journal" "$agent" analyze --journal "$file"
show "analyze --journal (summary)" "$BEST" "$RSS"
T_FULL=$BEST
measure "analyze --journal, an eighth" "$agent" analyze --journal "$eighth"
awk -v s="$BEST" -v f="$T_FULL" -v sm=$((size_mb / 8)) -v fm="$size_mb" 'BEGIN {
  printf "analyze --journal on %d MiB: %.3f s, on %d MiB: %.3f s: %.1fx the time for %.1fx the input\n",
    sm, s, fm, f, f / (s > 0 ? s : 0.001), fm / sm
}'
