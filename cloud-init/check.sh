#!/bin/sh
# Validates every user-data file in this directory with the real cloud-init schema
# (Debian's cloud-init package: apt-get install -y --no-install-recommends cloud-init), and
# checks what the agent relies on: the token's path, encoding and quoted mode, and that each
# agent config drop-in is accepted by the agent itself: VGPU_LICENSE_AGENT_BIN, else the one
# built in the cargo target directory (CARGO_TARGET_DIR or target/), built there when missing.
# Exits 1 when any check fails, 77 when the drop-ins could not be loaded (no binary and no
# cargo to build one: said loudly, never a pass; with VGPU_TESTS_NO_SKIP=1 a failure), else 0.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
if ! command -v cloud-init >/dev/null 2>&1; then
    echo "check.sh: cloud-init is not installed (apt-get install -y --no-install-recommends cloud-init)" >&2
    exit 2
fi
target=${CARGO_TARGET_DIR:-$repo/target}
bin=${VGPU_LICENSE_AGENT_BIN:-}
if [ -z "$bin" ]; then
    for b in "$target/debug/vgpu-license-agent" "$target/release/vgpu-license-agent"; do
        if [ -x "$b" ]; then bin=$b; break; fi
    done
fi
if [ -z "$bin" ] && command -v cargo >/dev/null 2>&1; then
    echo "building the agent to load the config drop-ins with (cargo build)"
    (cd "$repo" && cargo build --quiet --bin vgpu-license-agent) || {
        echo "FAIL: cargo build --bin vgpu-license-agent" >&2
        exit 1
    }
    bin=$target/debug/vgpu-license-agent
fi
if [ -n "$bin" ] && [ ! -x "$bin" ]; then
    echo "FAIL: $bin is not an executable" >&2
    exit 1
fi
failed=0
skipped=0
count=0
for f in "$here"/*.yaml; do
    count=$((count + 1))
    name=$(basename "$f")
    if out=$(cloud-init schema --config-file "$f" 2>&1); then
        echo "ok: $name: cloud-init schema: $out"
    else
        echo "FAIL: $name: cloud-init schema: $out" >&2
        failed=1
        continue
    fi
    if ! head -n 1 "$f" | grep -qx '#cloud-config'; then
        echo "FAIL: $name: the first line must be #cloud-config" >&2
        failed=1
    fi
    # The agent's own expectations, and each config drop-in through the agent's loader.
    # Exit 77: nothing failed, but a drop-in could not be loaded (no binary).
    rc=0
    python3 - "$f" "$bin" <<'PY' || rc=$?
import os, subprocess, sys, tempfile
import yaml

path, binary = sys.argv[1], sys.argv[2]
doc = yaml.safe_load(open(path))
ok = True
skipped = False
for wf in doc.get("write_files", []):
    p = wf["path"]
    if p.endswith(".tok"):
        want = {"path": "/etc/nvidia/ClientConfigToken/client_configuration_token.tok",
                "encoding": "b64", "permissions": "0744"}
        for k, v in want.items():
            if wf.get(k) != v:
                print(f"FAIL: {path}: token {k} is {wf.get(k)!r}, expected {v!r}", file=sys.stderr)
                ok = False
    if not isinstance(wf.get("permissions", ""), str):
        print(f"FAIL: {path}: {p}: permissions must be a quoted string", file=sys.stderr)
        ok = False
    if p.startswith("/etc/vgpu-license-agent/config.d/") and p.endswith(".toml"):
        if not binary:
            print(f"{path}: {p}: not loaded: no vgpu-license-agent to load it with, and no cargo to build one",
                  file=sys.stderr)
            skipped = True
            continue
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "config.d"))
            with open(os.path.join(d, "config.d", os.path.basename(p)), "w") as fh:
                fh.write(wf["content"])
            r = subprocess.run([binary, "--config", os.path.join(d, "config.toml"),
                                "prepare-image", "--dry-run"], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL: {path}: {p} is refused by the agent: {r.stderr.strip()}", file=sys.stderr)
                ok = False
            else:
                print(f"ok: {p}: accepted by the agent's config loader")
sys.exit(1 if not ok else 77 if skipped else 0)
PY
    case $rc in
        0) ;;
        77) skipped=1 ;;
        *) failed=1 ;;
    esac
done
if [ "$count" -eq 0 ]; then
    echo "FAIL: no user-data file found in $here" >&2
    exit 1
fi
[ "$failed" -eq 0 ] || exit 1
if [ "$skipped" -eq 1 ]; then
    if [ "${VGPU_TESTS_NO_SKIP:-0}" = 1 ]; then
        echo "FAIL: config drop-ins not loaded by the agent (VGPU_TESTS_NO_SKIP=1: a skip is a failure)" >&2
        exit 1
    fi
    echo "!!!!!!!! SKIPPED: config drop-ins not loaded by the agent: not a full pass !!!!!!!!" >&2
    exit 77
fi
