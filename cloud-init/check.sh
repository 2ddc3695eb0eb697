#!/bin/sh
# Validates every user-data file in this directory with the real cloud-init schema
# (Debian's cloud-init package: apt-get install -y --no-install-recommends cloud-init), and
# checks what the agent relies on: the token's path, encoding and quoted mode, and that each
# agent config drop-in is accepted by the agent itself: VGPU_LICENSE_AGENT_BIN, else the one
# built in the cargo target directory (CARGO_TARGET_DIR or target/), built there when missing.
# Then, each file filled with a real-size token (tests/fixtures/example.tok; never printed):
# the placeholder is there once, the filled file is valid and carries the token's bytes, its
# size fits KubeVirt's inline userData (2,048 bytes) wherever it is documented as inline
# (docs/kubevirt.md's table, the file's "# KubeVirt:" line), and, combined after an
# operator's own part with `cloud-init devel make-mime`, cloud-init's own merging keeps both
# parts' lists (merge_how).
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
                                "config", "check"], capture_output=True, text=True)
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

# cloud-init's own python, for its merging code.
ci_python=$(head -n 1 "$(command -v cloud-init)" | sed -n 's|^#! *\([^ ]*\).*|\1|p')
[ -x "${ci_python:-}" ] || ci_python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! "$ci_python" - "$here" "$repo" "$work" <<'PY'; then
import base64, os, re, subprocess, sys, tempfile
import yaml

here, repo, work = sys.argv[1:4]
PLACEHOLDER = "REPLACE_WITH_BASE64_OF_YOUR_TOKEN"
LIMIT = 2048  # KubeVirt's inline userData, bytes
MERGE_HOW = [{"name": "list", "settings": ["append"]},
             {"name": "dict", "settings": ["no_replace", "recurse_list"]}]
token = open(os.path.join(repo, "tests/fixtures/example.tok"), "rb").read()
b64 = base64.b64encode(token).decode()
ok = True


def fail(msg):
    global ok
    print("FAIL: " + msg, file=sys.stderr)
    ok = False


def documented(doc_text):
    """{file name: (size as documented, inline?)} from the table of docs/kubevirt.md."""
    rows = {}
    for line in doc_text.splitlines():
        m = re.match(r"\|\s*`cloud-init/([^`]+)`\s*\|\s*([0-9,]+)[^|]*\|\s*([^|]*)\|\s*$", line)
        if m:
            rows[m.group(1)] = (int(m.group(2).replace(",", "")),
                                m.group(3).strip().lower().startswith("inline"))
    return rows


def size_errors(name, text, filled_size, rows):
    """What is wrong with how a file's size is documented (empty: nothing)."""
    errs = []
    header = [l for l in text.splitlines() if l.startswith("# KubeVirt:")]
    if len(header) != 1:
        errs.append("%s: wants one '# KubeVirt:' line saying how KubeVirt takes it" % name)
    elif "fits inline" in header[0] and filled_size > LIMIT:
        errs.append("%s: says it fits inline userData, but filled it is %d bytes (KubeVirt's "
                    "limit is %d): say it goes from a Secret" % (name, filled_size, LIMIT))
    if name not in rows:
        errs.append("%s: not in docs/kubevirt.md's table of user-data files" % name)
    else:
        size, inline = rows[name]
        if inline and filled_size > LIMIT:
            errs.append("docs/kubevirt.md: %s is documented as inline userData, but filled it "
                        "is %d bytes (KubeVirt's limit is %d): document a Secret (cloudInitNoCloud.secretRef)"
                        % (name, filled_size, LIMIT))
        if size != filled_size:
            errs.append("docs/kubevirt.md: %s is %d bytes filled, the table says %d"
                        % (name, filled_size, size))
    return errs


def merged(parts):
    """cloud-init's own merge of these cloud-config files, in order (make-mime, then its
    user-data processing and cloud-config part handler)."""
    from cloudinit import handlers, helpers, user_data
    from cloudinit.handlers.cloud_config import CloudConfigPartHandler
    args = ["cloud-init", "devel", "make-mime"]
    for p in parts:
        args += ["-a", p + ":cloud-config"]
    mime = subprocess.run(args, capture_output=True, check=True).stdout
    d = tempfile.mkdtemp(dir=work)
    paths = helpers.Paths({"cloud_dir": d, "run_dir": d})
    msg = user_data.UserDataProcessor(paths).process(mime)
    h = CloudConfigPartHandler(paths)
    h.handle_part(None, handlers.CONTENT_START, None, None, None, None)
    for part in msg.walk():
        if part.get_content_maintype() == "multipart":
            continue
        h.handle_part(None, part.get_content_type(), part.get_filename() or "?",
                      part.get_payload(decode=True).decode(), None, dict(part.items()))
    return h.cloud_buf or {}


def keys(cfg):
    """What a merge must keep of a part: its files, commands and mounts."""
    return ([w["path"] for w in cfg.get("write_files", [])],
            [repr(c) for c in cfg.get("runcmd", [])],
            [repr(m) for m in cfg.get("mounts", [])])


OPERATOR = """#cloud-config
write_files:
  - path: /etc/operator/motd
    content: "the operator's own file\\n"
runcmd:
  - [touch, /run/operator-ran]
mounts:
  - [tmpfs, /srv/scratch, tmpfs, "size=64m", "0", "0"]
"""
operator = os.path.join(work, "operator.yaml")
open(operator, "w").write(OPERATOR)
op_keys = keys(yaml.safe_load(OPERATOR))

doc = open(os.path.join(repo, "docs/kubevirt.md"), encoding="utf-8").read()
rows = documented(doc)
for name in sorted(os.listdir(here)):
    if not name.endswith(".yaml"):
        continue
    text = open(os.path.join(here, name), encoding="utf-8").read()
    n = text.count(PLACEHOLDER)
    if n > 1:
        fail("%s: the placeholder appears %d times: a sed of it would paste the token into "
             "more than the one place it belongs" % (name, n))
    filled_text = text.replace(PLACEHOLDER, b64)
    filled = os.path.join(work, name)
    fd = os.open(filled, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(filled_text)
    size = len(filled_text.encode())
    r = subprocess.run(["cloud-init", "schema", "--config-file", filled], capture_output=True, text=True)
    if r.returncode != 0:
        fail("%s, filled with a token: cloud-init schema refuses it (exit %d)" % (name, r.returncode))
    cfg = yaml.safe_load(filled_text)
    if n == 1:
        found = any(w.get("encoding") == "b64" and base64.b64decode(w["content"]) == token
                    for w in cfg.get("write_files", [])) or \
            any(b64 in repr(c) for c in cfg.get("runcmd", []))
        if not found:
            fail("%s: filled, it does not carry the token's bytes where they belong" % name)
    for e in size_errors(name, text, size, rows):
        fail(e)
    if cfg.get("merge_how") != MERGE_HOW:
        fail("%s: merge_how must be %r, so that it combines with other parts" % (name, MERGE_HOW))
    # After the operator's part: both parts' files, commands and mounts are kept.
    ours = keys(cfg)
    both = keys(merged([operator, filled]))
    for i, what in enumerate(["write_files", "runcmd", "mounts"]):
        lost = [k for k in op_keys[i] + ours[i] if k not in both[i]]
        if lost:
            fail("%s after the operator's part: cloud-init's merge drops %s entries (%d)"
                 % (name, what, len(lost)))
    if ok:
        print("ok: %s: %d bytes filled (%s), placeholder %s, merged after another part with "
              "nothing lost" % (name, size, "fits inline userData" if size <= LIMIT
                                else "over KubeVirt's inline limit: a Secret",
                              "once" if n == 1 else "absent (no token in it)"))

# The checks above can fail: without merge_how cloud-init's default merge drops the
# operator's write_files, and a file over the limit documented as inline is refused.
plain = os.path.join(work, "no-merge-how.yaml")
open(plain, "w").write("#cloud-config\nwrite_files:\n  - path: /etc/x\n    content: x\n")
if "/etc/operator/motd" in keys(merged([operator, plain]))[0]:
    fail("self-test: without merge_how cloud-init kept the operator's write_files: "
         "the merge check above proves nothing")
if not size_errors("big.yaml", "# KubeVirt: fits inline userData\n", LIMIT + 1,
                   {"big.yaml": (LIMIT + 1, True)}):
    fail("self-test: a file over %d bytes documented as inline passed the size check" % LIMIT)
sys.exit(0 if ok else 1)
PY
    failed=1
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
