#!/usr/bin/env bash
# Benchmark: `analyze --journal` on a large `journalctl -o json` export, side by side with
# `grep -c nvidia-gridd` on the same file: throughput (MB/s) and peak RSS.
#
# Usage: bench/journal.sh [SIZE_MB]   (default 1024; the file is kept in target/bench/)
set -euo pipefail
cd "$(dirname "$0")/.."
size_mb=${1:-1024}
file=target/bench/journal-${size_mb}M.json

cargo build --release --quiet --bin vgpu-license-agent --example gen-journal
mkdir -p target/bench
if [ ! -s "$file" ]; then
  echo "generating $file ..."
  target/release/examples/gen-journal "$size_mb" 3 > "$file"
fi
bytes=$(stat -c %s "$file")
gridd_lines=$(grep -c nvidia-gridd "$file")
echo "input: $file, $((bytes >> 20)) MiB, $(wc -l < "$file") lines, $gridd_lines with nvidia-gridd"

# measure NAME CMD...: best wall time of 3 warm runs, and that run's peak RSS.
measure() {
  local name=$1; shift
  local best="" rss=""
  for _ in 1 2 3; do
    local out
    # To a file, not /dev/null: GNU grep stops at the first match when it sees /dev/null.
    out=$( { /usr/bin/time -f '%e %M' "$@" > target/bench/out; } 2>&1 | tail -n 1)
    local t=${out% *} m=${out#* }
    if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then best=$t; rss=$m; fi
  done
  awk -v n="$name" -v t="$best" -v m="$rss" -v b="$bytes" \
    'BEGIN{printf "%-32s %7.2f s  %8.0f MB/s  peak RSS %6.1f MiB\n", n, t, b/1e6/(t>0?t:0.001), m/1024}'
}

cat "$file" > /dev/null   # warm the page cache
measure "grep -c nvidia-gridd" grep -c nvidia-gridd "$file"
measure "analyze --journal --json" target/release/vgpu-license-agent analyze --journal "$file" --json
measure "analyze --journal (summary)" target/release/vgpu-license-agent analyze --journal "$file"
