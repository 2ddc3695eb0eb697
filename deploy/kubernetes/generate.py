#!/usr/bin/env python3
"""Writes the Kubernetes manifests of deploy/kubernetes/ from their sources:

  packaging/vgpu-license-agent.rules.yml       -> cozystack/vmrule.yaml,
                                                  prometheus-operator/prometheusrule.yaml
  deploy/kubernetes/dashboard/*.json           -> grafana/grafanadashboard.yaml
  SCRAPE (below)                               -> cozystack/vmpodscrape.yaml,
                                                  prometheus-operator/podmonitor.yaml
  the DaemonSet, RBAC, readiness rule (below)  -> daemonset/, daemonset-taint/,
                                                  licensing-secret/, node-readiness/
  host/config.toml, the host's DaemonSet        -> host/

so that the alert rules, the dashboard and the scrape settings each have one source, the file
a person edits. Run it after editing one of them; `--check` (the tests run it) exits 1 and
shows the difference when a committed manifest is not what its source makes.

Only VMs that opt in are scraped: their virt-launcher pods carry the label
vgpu-license-agent/scrape=true (set in the VirtualMachine's spec.template.metadata.labels;
KubeVirt copies it to the pod). `--scrape-label KEY=VALUE` makes the manifests select another
label; with `--output DIR` they are written there rather than over the committed ones.

`--runbook-base URL` points every alert's runbook_url, and the dashboard's link, at the fleet
guide where you publish it.

usage: python3 deploy/kubernetes/generate.py [--check] [--scrape-label KEY=VALUE]
                                             [--runbook-base URL] [--output DIR]

Needs PyYAML (Debian: python3-yaml).
"""
import argparse
import difflib
import json
import os
import re
import sys
import textwrap

try:
    import yaml
except ImportError:  # pragma: no cover
    sys.stderr.write("generate.py: needs PyYAML (apt-get install python3-yaml, or pip install PyYAML)\n")
    sys.exit(2)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RULES = os.path.join(ROOT, "packaging", "vgpu-license-agent.rules.yml")
DASHBOARD = os.path.join(HERE, "dashboard", "vgpu-license-fleet.json")

NAME = "vgpu-license-agent"
LABELS = {"app.kubernetes.io/name": NAME}
# The agent's metrics_listen port in the guests (docs/fleet.md).
PORT = 9841

# The label that puts a VM in the scrape (docs/fleet.md): a VM without it is never a target.
SCRAPE_LABEL = ("vgpu-license-agent/scrape", "true")
# The job label of every series and of `up`, whatever job name the operator gives the scrape
# pool (podMonitor/NS/NAME/0, podScrape/NS/NAME/0): the agent-down alert selects it.
JOB = NAME


def meta_label(key):
    """The pod label `key` as Kubernetes service discovery names it."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def scrape_relabel(label):
    """How a virt-launcher pod becomes one target: the guest's agent at the pod's IP (the VM
    owns it on Cozystack's and KubeVirt's bridge/masquerade pod network), labelled with the VM's
    name. Prometheus's pod discovery makes a target per declared container port, and one
    without a port for each container that declares none: only the `compute` container's
    (where the VM runs) is kept, and only its port-free target or the one for the agent's
    port, so that other declared ports do not scrape the same guest twice. The opt-in label is
    kept here too, beside the selector, so that an edited selector cannot make every VM a
    target."""
    key, value = label
    return [
        {"action": "keep", "sourceLabels": [meta_label(key)], "regex": re.escape(value)},
        {"action": "keep", "sourceLabels": ["__meta_kubernetes_pod_container_name"], "regex": "compute"},
        {"action": "keep", "sourceLabels": ["__meta_kubernetes_pod_container_port_number"],
         "regex": "|%d" % PORT},
        # A VirtualMachine's pod (a bare VirtualMachineInstance has no VM name to show).
        {"action": "keep", "sourceLabels": ["__meta_kubernetes_pod_label_vm_kubevirt_io_name"],
         "regex": ".+"},
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_ip"], "regex": "([0-9.]+)",
         "targetLabel": "__address__", "replacement": "$1:%d" % PORT},
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_ip"], "regex": "(.*:.*)",
         "targetLabel": "__address__", "replacement": "[$1]:%d" % PORT},
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_label_vm_kubevirt_io_name"],
         "targetLabel": "vm"},
        # instance names the VM, not the pod's address, which changes with each start or
        # migration: alerts and dashboards follow the VM.
        {"action": "replace",
         "sourceLabels": ["__meta_kubernetes_namespace", "__meta_kubernetes_pod_label_vm_kubevirt_io_name"],
         "separator": "/", "targetLabel": "instance"},
        {"action": "replace", "targetLabel": "job", "replacement": JOB},
    ]


def scrape_selector(label):
    key, value = label
    return {"matchLabels": {"kubevirt.io": "virt-launcher", key: value}}


SCRAPE_INTERVAL = "30s"
SCRAPE_TIMEOUT = "10s"


class Dumper(yaml.SafeDumper):
    """Block scalars for multi-line strings (expressions, the dashboard), keys in order."""


def _str(dumper, data):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


Dumper.add_representer(str, _str)


def dump(header, doc):
    body = yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False,
                     width=10**6, allow_unicode=True)
    lines = ["# " + l if l else "#" for l in header.strip("\n").split("\n")]
    return "\n".join(lines) + "\n" + body


def generated(source, more=""):
    return ("Generated by deploy/kubernetes/generate.py from %s:\nedit that and run it again."
            % source) + ("\n" + more if more else "")


def metadata(name):
    return {"name": name, "labels": dict(LABELS)}


# Where each alert's runbook_url points, before its `#ALERT`: the rules file's own (the fleet
# guide as the package installs it), or --runbook-base.
RUNBOOK_BASE = None


def rules_groups():
    with open(RULES, encoding="utf-8") as f:
        rules = yaml.safe_load(f)
    groups = rules["groups"]
    if RUNBOOK_BASE:
        for rule in (r for g in groups for r in g["rules"]):
            url = rule.get("annotations", {}).get("runbook_url")
            if url:
                rule["annotations"]["runbook_url"] = RUNBOOK_BASE + "#" + url.partition("#")[2]
    return groups


def runbook_base():
    """The guide every runbook_url names (one for all: the rules file says so)."""
    bases = {r["annotations"]["runbook_url"].partition("#")[0]
             for g in rules_groups() for r in g["rules"] if "runbook_url" in r.get("annotations", {})}
    if len(bases) != 1:
        sys.exit("generate.py: the alerts' runbook_url name %d guides, not one: %s"
                 % (len(bases), ", ".join(sorted(bases))))
    return bases.pop()


def vmrule(_label):
    return dump(generated("packaging/vgpu-license-agent.rules.yml",
                          "The alert rules for Cozystack's vmalert (docs/fleet.md)."), {
        "apiVersion": "operator.victoriametrics.com/v1beta1",
        "kind": "VMRule",
        "metadata": metadata(NAME),
        "spec": {"groups": rules_groups()},
    })


def prometheusrule(_label):
    return dump(generated("packaging/vgpu-license-agent.rules.yml",
                          "The alert rules for the Prometheus Operator (docs/fleet.md). A\n"
                          "kube-prometheus-stack Prometheus selects rules by its release's label:\n"
                          "add it (e.g. `release: kube-prometheus-stack`) where yours does."), {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": metadata(NAME),
        "spec": {"groups": rules_groups()},
    })


def scrape_note(label, where):
    return textwrap.fill(
        'Scrapes vgpu-license-agent (metrics_listen = "0.0.0.0:%d") in the KubeVirt VMs whose '
        "virt-launcher pod carries the label %s=%s (set it in the VM's "
        "spec.template.metadata.labels), %s. Series get job=%s, `vm` (the VM's name) and "
        "`instance` (namespace/vm). See docs/fleet.md." % (PORT, label[0], label[1], where, JOB),
        width=92, break_on_hyphens=False)


def vmpodscrape(label):
    return dump(generated("scrape_* in deploy/kubernetes/generate.py", scrape_note(
        label, "in this VMPodScrape's own namespace: apply it in each namespace whose VMs a "
               "tenant's monitoring collects")), {
        "apiVersion": "operator.victoriametrics.com/v1beta1",
        "kind": "VMPodScrape",
        "metadata": metadata(NAME),
        "spec": {
            "selector": scrape_selector(label),
            "podMetricsEndpoints": [{
                "path": "/metrics",
                "interval": SCRAPE_INTERVAL,
                "scrapeTimeout": SCRAPE_TIMEOUT,
                "relabelConfigs": scrape_relabel(label),
            }],
        },
    })


def podmonitor(label):
    return dump(generated("scrape_* in deploy/kubernetes/generate.py", scrape_note(
        label, "in every namespace") +
        "\nA kube-prometheus-stack Prometheus selects PodMonitors by its release's\n"
        "label: add it (e.g. `release: kube-prometheus-stack`) where yours does."), {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata(NAME),
        "spec": {
            "selector": scrape_selector(label),
            "namespaceSelector": {"any": True},
            "podMetricsEndpoints": [{
                "path": "/metrics",
                "interval": SCRAPE_INTERVAL,
                "scrapeTimeout": SCRAPE_TIMEOUT,
                "relabelings": scrape_relabel(label),
            }],
        },
    })


def grafanadashboard(_label):
    with open(DASHBOARD, encoding="utf-8") as f:
        dashboard = json.load(f)
    # A browser opens the runbooks where they are on a web server: the dashboard links them
    # there, never to a path on the guests' disks.
    base = runbook_base()
    if base.startswith(("https://", "http://")):
        dashboard["links"] = [{"title": "Runbooks", "type": "link", "url": base + "#alerts",
                               "targetBlank": True, "icon": "doc"}]
    return dump(generated("deploy/kubernetes/dashboard/vgpu-license-fleet.json",
                          "For the grafana-operator; Cozystack's Grafana carries the label\n"
                          "`dashboards: grafana`. The dashboard asks for its Prometheus-type data\n"
                          "source (VictoriaMetrics is one) in a variable."), {
        "apiVersion": "grafana.integreatly.org/v1beta1",
        "kind": "GrafanaDashboard",
        "metadata": metadata("vgpu-license-fleet"),
        "spec": {
            "instanceSelector": {"matchLabels": {"dashboards": "grafana"}},
            "allowCrossNamespaceImport": True,
            "folder": "vGPU",
            "resyncPeriod": "10m",
            "json": json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n",
        },
    })


# ---- The agent as a DaemonSet on GPU nodes (a cluster whose workers' image is not yours).

AGENT_NAMESPACE = "vgpu-license-agent"
AGENT_CONFIG = os.path.join(HERE, "daemonset", "config.toml")
# The GPU Operator labels every node with an NVIDIA GPU (its feature discovery).
GPU_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
# The taint the Node Readiness Controller keeps on a vGPU node until the agent's condition
# says licensed (node-readiness/); the controller takes only keys with this prefix.
READINESS_TAINT = "readiness.k8s.io/vgpu-licensed"
# What the agent measures (bench/): a few MiB idle; nvidia-smi and journalctl, its children,
# count against the pod's limit too.
AGENT_RESOURCES = {
    "requests": {"cpu": "5m", "memory": "32Mi"},
    "limits": {"cpu": "200m", "memory": "128Mi"},
}


def cargo_version():
    with open(os.path.join(ROOT, "Cargo.toml"), encoding="utf-8") as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


def agent_image():
    return "localhost/%s:%s" % (NAME, cargo_version())


def agent_meta(name, namespaced=True):
    m = metadata(name)
    if namespaced:
        m["namespace"] = AGENT_NAMESPACE
    return m


DAEMONSET_NOTE = ("The agent as a DaemonSet on GPU nodes: `kubectl apply -f deploy/kubernetes/daemonset/`\n"
                  "(the files in order). See docs/kubernetes.md.")


def ds_namespace(_label):
    return dump(generated("deploy/kubernetes/generate.py", DAEMONSET_NOTE), {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": metadata(AGENT_NAMESPACE),
    })


def service_account(name, note):
    return dump(generated("deploy/kubernetes/generate.py", note), {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": agent_meta(name),
    })


def cluster_role_binding(name, note):
    """The ClusterRole `name` bound to the service account `name` of the agent's namespace."""
    return dump(generated("deploy/kubernetes/generate.py", note), {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": metadata(name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": AGENT_NAMESPACE}],
    })


def ds_serviceaccount(_label):
    return service_account(NAME, DAEMONSET_NOTE)


def ds_clusterrole(_label):
    return dump(generated("deploy/kubernetes/generate.py", DAEMONSET_NOTE +
                          "\nThe least the agent needs: its own Node read (the condition's last\n"
                          "transition is kept) and nodes/status patched (the condition)."), {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": metadata(NAME),
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        ],
    })


def ds_clusterrolebinding(_label):
    return cluster_role_binding(NAME, DAEMONSET_NOTE)


def ds_configmap(_label):
    with open(AGENT_CONFIG, encoding="utf-8") as f:
        config = f.read()
    return dump(generated("deploy/kubernetes/daemonset/config.toml", DAEMONSET_NOTE), {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": agent_meta(NAME),
        "data": {"config.toml": config},
    })


# What the agent's container is granted, and why each (tests/gpu_operator.rs runs the image
# under podman with exactly this securityContext, read from the generated manifest). What the
# agent does in the pod: it runs `chroot /run/nvidia/driver nvidia-smi -q` (the driver
# container's own binary and libraries), reads gridd's lines in the node's journal with the
# journalctl it carries, reads the token and gridd.conf under the driver root, writes its
# report to its emptyDirs, serves metrics on 9841 and patches its Node through the API.
AGENT_SECURITY_CONTEXT = {
    # Root, for two reasons: a capability added to a container is effective only for uid 0
    # (Kubernetes sets no ambient capabilities), and the node's journal files are root's, mode
    # 0640, group systemd-journal (whose gid differs between distributions). Being their owner,
    # root reads them, and the driver root's token (root's, 0644 or the 0744 NVIDIA's guide
    # asks for), with no DAC_READ_SEARCH or DAC_OVERRIDE: checked with every capability
    # dropped; only a file root's own mode bits refuse (0000), which neither journald nor the
    # driver container writes, would need one.
    "runAsUser": 0,
    "runAsGroup": 0,
    "allowPrivilegeEscalation": False,
    "capabilities": {
        "drop": ["ALL"],
        # chroot(2) into the driver root: without it nvidia-smi is never run ("chroot: cannot
        # change root directory to '/run/nvidia/driver': Operation not permitted", and the
        # report says driver_unavailable). Nothing else: the journal, the token, the emptyDirs
        # and port 9841 (above 1024) need none.
        "add": ["SYS_CHROOT"],
    },
    # The runtime's default profile allows chroot(2) to a process with CAP_SYS_CHROOT (moby's,
    # containerd's and podman's profiles alike); the agent, journalctl and chroot need no
    # other system call it refuses.
    "seccompProfile": {"type": "RuntimeDefault"},
    # The agent writes only to its emptyDirs (/run/vgpu-license-agent, /var/lib/...). The
    # NVIDIA runtime's hooks write into the root (the injected libraries' ld.so.cache); runc
    # runs them before it makes the root read-only. Where a hook fails all the same with
    # "read-only file system" (reported with some runtimes and toolkit versions) and the pod
    # does not start, set this to false.
    "readOnlyRootFilesystem": True,
}
# The GPU's device nodes. nvidia-smi, run in the driver root, opens /dev/nvidiactl and
# /dev/nvidia0... there (the driver container's /dev, shared with its root), and an
# unprivileged container's device cgroup refuses every device that is not its own, whatever
# the path ("Failed to initialize NVML"). Kubernetes has no field for device access; the
# GPU Operator's way is the NVIDIA runtime (its RuntimeClass `nvidia`, which the operator
# makes and sets on its own pods): NVIDIA_VISIBLE_DEVICES=all has it add every GPU's device
# nodes and allow them in the container's device cgroup, without a GPU of the device plugin's
# (which would take a GPU from the node's workloads). The operator's own pods get theirs so
# (its toolkit validator and device plugin set NVIDIA_VISIBLE_DEVICES=all, though they
# run privileged for other work), and NVIDIA's own device plugin manifest
# (k8s-device-plugin, deployments/static) runs that way unprivileged, every capability
# dropped. `utility` (nvidia-smi, NVML) is the least the runtime injects.
# Where the operator's own pods run without a runtimeClassName (CRI-O with its hook, the NRI
# plugin, nvidia made the default runtime), drop the line; where the toolkit is set to ignore
# NVIDIA_VISIBLE_DEVICES in unprivileged containers
# (accept-nvidia-visible-devices-envvar-when-unprivileged = false), nvidia-smi fails with
# NVML's error and the report says so: such a node needs `privileged: true` for the agent.
GPU_RUNTIME_CLASS = "nvidia"
GPU_ENV = [("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "utility")]

DAEMONSET_ACCESS = """\
Not privileged. What the pod is granted, and why (docs/kubernetes.md; generate.py has
the evidence for each):
- root, with every capability dropped but SYS_CHROOT: the agent runs the driver
  container's own nvidia-smi by `chroot /run/nvidia/driver`, and an added capability
  works only for uid 0. The node's journal files (root's, 0640) and the driver root's
  token (root's) are read as their owner: no DAC_READ_SEARCH or DAC_OVERRIDE.
- allowPrivilegeEscalation: false; seccomp RuntimeDefault (it allows chroot to a process
  with CAP_SYS_CHROOT); a read-only root (the agent writes only to its emptyDirs).
- runtimeClassName: nvidia with NVIDIA_VISIBLE_DEVICES=all: the NVIDIA runtime lets the
  container open the GPU's device nodes, which an unprivileged container's device cgroup
  refuses otherwise, as the GPU Operator's own pods get theirs, and takes no GPU from the
  device plugin. Where the operator's pods run without a runtimeClassName (CRI-O with its
  hook, the NRI plugin), remove that line. Where the toolkit ignores
  NVIDIA_VISIBLE_DEVICES in unprivileged containers
  (accept-nvidia-visible-devices-envvar-when-unprivileged = false), nvidia-smi cannot open
  the GPU (the report says so) and the agent needs `privileged: true` there. Where an NVIDIA
  runtime hook fails with "read-only file system" and the pod does not start, set
  readOnlyRootFilesystem: false.
- no hostPID: on a GPU Operator node gridd is known by its lines in the node's journal,
  never looked for among the node's processes.
- the node's journal and /run/nvidia, read-only.
It holds no NVML handle between readings, so the operator's driver upgrades are never
blocked by it."""


def host_path(name, path, kind, mount, read_only=True, propagation=None):
    volume = {"name": name, "hostPath": {"path": path, "type": kind}}
    m = {"name": name, "mountPath": mount, "readOnly": read_only}
    if propagation:
        m["mountPropagation"] = propagation
    return volume, m


def ds_daemonset(_label):
    mounts = [
        # gridd's lines: the node's journal, persistent or volatile, and the machine ID that
        # names its directory.
        host_path("journal", "/var/log/journal", "DirectoryOrCreate", "/var/log/journal"),
        host_path("journal-run", "/run/log/journal", "DirectoryOrCreate", "/run/log/journal"),
        host_path("machine-id", "/etc/machine-id", "File", "/etc/machine-id"),
        # The driver container's root, mounted there by the operator while its pod runs:
        # HostToContainer, so that a driver pod made again is seen without a restart.
        host_path("nvidia", "/run/nvidia", "DirectoryOrCreate", "/run/nvidia",
                  propagation="HostToContainer"),
    ]
    volumes = [v for v, _ in mounts] + [
        {"name": "config", "configMap": {"name": NAME}},
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "state", "emptyDir": {"sizeLimit": "1Mi"}},
    ]
    volume_mounts = [m for _, m in mounts] + [
        {"name": "config", "mountPath": "/etc/vgpu-license-agent", "readOnly": True},
        {"name": "run", "mountPath": "/run/vgpu-license-agent"},
        {"name": "state", "mountPath": "/var/lib/vgpu-license-agent"},
    ]
    labels = {"app.kubernetes.io/name": NAME}
    return dump(generated("deploy/kubernetes/generate.py", DAEMONSET_NOTE +
                          "\nThe image: `make image` builds it (packaging/build-image.sh); push it to\n"
                          "your registry and set `image:` below to it.\n" + DAEMONSET_ACCESS), {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": agent_meta(NAME),
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "serviceAccountName": NAME,
                    "nodeSelector": dict(GPU_NODE_SELECTOR),
                    # Not KubeVirt's GPU hosts (the operator's sandbox workloads, labelled
                    # so): their vGPU manager is host/'s DaemonSet's.
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{
                            "key": "nvidia.com/gpu.workload.config", "operator": "NotIn",
                            "values": ["vm-vgpu", "vm-passthrough"]}]}]}}},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                        {"key": "vgpu-license-agent/unlicensed", "operator": "Exists",
                         "effect": "NoSchedule"},
                        # The agent writes the condition that takes this taint off: it must
                        # start on a node that carries it (node-readiness/).
                        {"key": READINESS_TAINT, "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    # The GPU's device nodes, for nvidia-smi (DAEMONSET_ACCESS).
                    "runtimeClassName": GPU_RUNTIME_CLASS,
                    "priorityClassName": "system-node-critical",
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{
                        "name": "agent",
                        "image": agent_image(),
                        "imagePullPolicy": "IfNotPresent",
                        "args": ["--config", "/etc/vgpu-license-agent/config.toml",
                                 "run", "--log-stderr"],
                        "env": [{"name": "NODE_NAME",
                                 "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
                               + [{"name": k, "value": v} for k, v in GPU_ENV],
                        "ports": [{"name": "metrics", "containerPort": PORT, "protocol": "TCP"}],
                        "resources": AGENT_RESOURCES,
                        "securityContext": AGENT_SECURITY_CONTEXT,
                        "volumeMounts": volume_mounts,
                    }],
                    "volumes": volumes,
                },
            },
        },
    })


HOST = NAME + "-host"
HOST_CONFIG = os.path.join(HERE, "host", "config.toml")
# KubeVirt's vGPU hosts: the GPU Operator labels them by the workload they run
# (sandboxWorkloads; vm-vgpu is the vGPU manager's).
HOST_NODE_SELECTOR = {"nvidia.com/gpu.workload.config": "vm-vgpu"}
HOST_NOTE = ("The agent on KubeVirt's vGPU hosts (the GPU Operator's vm-vgpu nodes): every VM's vGPU\n"
             "license, from the vGPU manager, in its report and metrics, and as Events on the VMIs.\n"
             "`kubectl apply -f deploy/kubernetes/daemonset/00-namespace.yaml -f deploy/kubernetes/host/`.\n"
             "See docs/host.md.")


def host_serviceaccount(_label):
    return service_account(HOST, HOST_NOTE)


def host_clusterrole(_label):
    return dump(generated("deploy/kubernetes/generate.py", HOST_NOTE +
                          "\nThe least the host's agent needs: a VMI read (its uid, and its firmware UUID that\n"
                          "confirms the VM), an Event created on it. Nothing of the Node."), {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": metadata(HOST),
        "rules": [
            {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachineinstances"],
             "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        ],
    })


def host_clusterrolebinding(_label):
    return cluster_role_binding(HOST, HOST_NOTE)


def host_configmap(_label):
    with open(HOST_CONFIG, encoding="utf-8") as f:
        config = f.read()
    return dump(generated("deploy/kubernetes/host/config.toml", HOST_NOTE), {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": agent_meta(HOST),
        "data": {"config.toml": config},
    })


def host_daemonset(label):
    """The guest nodes' DaemonSet, for the vm-vgpu hosts: the same image, access and
    volumes (the vGPU manager's container shares its root at /run/nvidia/driver as the
    driver container does), its own service account, config and nodes."""
    ds = yaml.safe_load(ds_daemonset(label))
    ds["metadata"] = agent_meta(HOST)
    labels = {"app.kubernetes.io/name": HOST}
    spec = ds["spec"]
    spec["selector"] = {"matchLabels": labels}
    pod = spec["template"]
    pod["metadata"]["labels"] = dict(labels)
    pod["spec"]["serviceAccountName"] = HOST
    pod["spec"]["nodeSelector"] = dict(HOST_NODE_SELECTOR)
    del pod["spec"]["affinity"]
    pod["spec"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    for v in pod["spec"]["volumes"]:
        if v["name"] == "config":
            v["configMap"]["name"] = HOST
    return dump(generated("deploy/kubernetes/generate.py", HOST_NOTE +
                          "\nThe image: the guest nodes' (`make image`). Access as the guest nodes' DaemonSet\n"
                          "(daemonset/40-daemonset.yaml says why for each): not privileged, SYS_CHROOT\n"
                          "only, the node's journal and /run/nvidia read-only. Where the nvidia\n"
                          "RuntimeClass does not run on vm-vgpu nodes (the operator deploys no container\n"
                          "toolkit there), nvidia-smi cannot open the GPU, the report says so, and the\n"
                          "agent needs `privileged: true` (or the nodes' .deb or .rpm, docs/host.md)."), ds)


TAINT_NOTE = ("Only for kubernetes.taint_unlicensed = true (set it in daemonset/30-configmap.yaml):\n"
              "the agent then also patches its Node's spec.taints (its own taint only).\n"
              "`kubectl apply -f deploy/kubernetes/daemonset-taint/` after daemonset/.")
TAINT_GRANT = ("What it grants is more than the agent uses: `patch` on every Node of the cluster, any\n"
               "field (labels, taints, spec.unschedulable), to whoever holds this service account's\n"
               "token. No narrower RBAC rule exists: resourceNames can only name fixed Nodes, never\n"
               "\"the Node this pod runs on\" (one service account serves every pod of the\n"
               "DaemonSet), and the Node authorizer and NodeRestriction, which keep a kubelet to its\n"
               "own Node, apply only to kubelets' credentials (system:node:NAME). Grant it only if\n"
               "you want the taint, and where the Node Readiness Controller is installed use\n"
               "node-readiness/ instead, which needs none of it. See docs/kubernetes.md.")


def taint_clusterrole(_label):
    return dump(generated("deploy/kubernetes/generate.py", TAINT_NOTE + "\n" + TAINT_GRANT), {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": metadata(NAME + "-taint"),
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
    })


def taint_clusterrolebinding(_label):
    return dump(generated("deploy/kubernetes/generate.py", TAINT_NOTE), {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": metadata(NAME + "-taint"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": NAME + "-taint"},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": AGENT_NAMESPACE}],
    })


# ---- Gating the node through the Node Readiness Controller (kubernetes-sigs/node-readiness-controller).

# The agent's Node condition (crates/model/src/node/condition.rs; tests/kube.rs keeps the two
# the same).
CONDITION = "VgpuLicensed"
# GPU Feature Discovery's label (the GPU Operator runs it) for a node whose GPU is a vGPU: the
# nodes that need a license. Every one of them also carries nvidia.com/gpu.present, so the
# agent's DaemonSet runs on each node the rule gates.
VGPU_NODE_SELECTOR = {"nvidia.com/vgpu.present": "true"}
READINESS_NOTE = """\
Keeps new pods off a vGPU node while its vGPU holds no license, without granting the agent
`patch` on Nodes: the agent writes its condition VgpuLicensed through nodes/status (what
daemonset/ grants), and the Node Readiness Controller (installed on its own:
kubernetes-sigs/node-readiness-controller) puts the taint on and takes it off. See
docs/kubernetes.md.
`kubectl apply -f deploy/kubernetes/node-readiness/` after daemonset/.

- enforcementMode continuous, not bootstrap-only: a license can be lost after boot (a token
  expired, the DLS away past the lease, a driver pod made again from a bad Secret); the taint
  comes back with the loss and goes with the license. bootstrap-only would take it off once
  and never gate the node again.
- No defaultStatus: a node without the condition (the agent not running yet, or not at all)
  counts as Unknown and stays tainted, as a license gate should.
- nodeSelector nvidia.com/vgpu.present=true (GPU Feature Discovery's label): only vGPU nodes
  need a license. A passthrough or bare-metal GPU node gets no VgpuLicensed condition and,
  selected, would stay tainted for good.
- NoSchedule: pods already running stay; only new pods without a toleration are kept off.
  The agent's DaemonSet tolerates the taint. The GPU Operator's own pods must too (its
  ClusterPolicy's daemonsets.tolerations, and NFD's worker): a driver pod made again on a
  tainted node, the fix for a new token, would otherwise never start, and the node never be
  licensed."""


def readiness_rule(_label):
    return dump(generated("deploy/kubernetes/generate.py", READINESS_NOTE), {
        "apiVersion": "readiness.node.x-k8s.io/v1alpha1",
        "kind": "NodeReadinessRule",
        "metadata": metadata("vgpu-licensed"),
        "spec": {
            "conditions": [{"type": CONDITION, "requiredStatus": "True"}],
            "taint": {"key": READINESS_TAINT, "effect": "NoSchedule"},
            "enforcementMode": "continuous",
            "nodeSelector": {"matchLabels": dict(VGPU_NODE_SELECTOR)},
        },
    })


OPERATOR_NAMESPACE = "gpu-operator"
LICENSING_SECRET = "licensing-config"
SECRET_NOTE = ("Only for kubernetes.licensing_secret (set it in daemonset/30-configmap.yaml, e.g.\n"
               "licensing_secret = \"%s/%s\"): the agent then reads that one Secret at each\n"
               "heartbeat and says token_stale when it holds another token than the driver pod's\n"
               "gridd runs with. Put your Secret's name (driver.licensingConfig.secretName) and the\n"
               "operator's namespace here and in the config.\n"
               "`kubectl apply -f deploy/kubernetes/licensing-secret/` after daemonset/." % (OPERATOR_NAMESPACE, LICENSING_SECRET))
SECRET_GRANT = ("What it grants: get on that one Secret by its name (resourceNames), in the\n"
                "operator's namespace; no list or watch, which resourceNames cannot narrow, and no\n"
                "other Secret. The Secret holds the token and gridd.conf, which the agent compares\n"
                "and never shows. See docs/kubernetes.md.")


def secret_role(_label):
    return dump(generated("deploy/kubernetes/generate.py", SECRET_NOTE + "\n" + SECRET_GRANT), {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": NAME + "-licensing-secret", "namespace": OPERATOR_NAMESPACE,
                     "labels": LABELS},
        "rules": [{"apiGroups": [""], "resources": ["secrets"],
                   "resourceNames": [LICENSING_SECRET], "verbs": ["get"]}],
    })


def secret_rolebinding(_label):
    return dump(generated("deploy/kubernetes/generate.py", SECRET_NOTE), {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": NAME + "-licensing-secret", "namespace": OPERATOR_NAMESPACE,
                     "labels": LABELS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": NAME + "-licensing-secret"},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": AGENT_NAMESPACE}],
    })


def agent_scrape_note(where):
    return ("Scrapes the agent's DaemonSet pods (deploy/kubernetes/daemonset/) %s:\n"
            "series get job=%s and `node` (the Node's name)." % (where, JOB))


AGENT_RELABEL = [
    {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
     "targetLabel": "node"},
    {"action": "replace", "targetLabel": "job", "replacement": JOB},
]


def agent_vmpodscrape(_label):
    return dump(generated("deploy/kubernetes/generate.py",
                          agent_scrape_note("in the namespace %s" % AGENT_NAMESPACE)), {
        "apiVersion": "operator.victoriametrics.com/v1beta1",
        "kind": "VMPodScrape",
        "metadata": agent_meta(NAME + "-daemonset"),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "podMetricsEndpoints": [{
                "port": "metrics",
                "path": "/metrics",
                "interval": SCRAPE_INTERVAL,
                "scrapeTimeout": SCRAPE_TIMEOUT,
                "relabelConfigs": AGENT_RELABEL,
            }],
        },
    })


def agent_podmonitor(_label):
    return dump(generated("deploy/kubernetes/generate.py",
                          agent_scrape_note("in the namespace %s" % AGENT_NAMESPACE) +
                          "\nA kube-prometheus-stack Prometheus selects PodMonitors by its release's\n"
                          "label: add it (e.g. `release: kube-prometheus-stack`) where yours does."), {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": agent_meta(NAME + "-daemonset"),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
            "podMetricsEndpoints": [{
                "port": "metrics",
                "path": "/metrics",
                "interval": SCRAPE_INTERVAL,
                "scrapeTimeout": SCRAPE_TIMEOUT,
                "relabelings": AGENT_RELABEL,
            }],
        },
    })


OUTPUTS = {
    "cozystack/vmpodscrape.yaml": vmpodscrape,
    "cozystack/vmrule.yaml": vmrule,
    "prometheus-operator/podmonitor.yaml": podmonitor,
    "prometheus-operator/prometheusrule.yaml": prometheusrule,
    "grafana/grafanadashboard.yaml": grafanadashboard,
    "daemonset/00-namespace.yaml": ds_namespace,
    "daemonset/10-serviceaccount.yaml": ds_serviceaccount,
    "daemonset/20-clusterrole.yaml": ds_clusterrole,
    "daemonset/21-clusterrolebinding.yaml": ds_clusterrolebinding,
    "daemonset/30-configmap.yaml": ds_configmap,
    "daemonset/40-daemonset.yaml": ds_daemonset,
    "daemonset-taint/clusterrole.yaml": taint_clusterrole,
    "daemonset-taint/clusterrolebinding.yaml": taint_clusterrolebinding,
    "node-readiness/nodereadinessrule.yaml": readiness_rule,
    "host/10-serviceaccount.yaml": host_serviceaccount,
    "host/20-clusterrole.yaml": host_clusterrole,
    "host/21-clusterrolebinding.yaml": host_clusterrolebinding,
    "host/30-configmap.yaml": host_configmap,
    "host/40-daemonset.yaml": host_daemonset,
    "licensing-secret/role.yaml": secret_role,
    "licensing-secret/rolebinding.yaml": secret_rolebinding,
    "cozystack/agent-vmpodscrape.yaml": agent_vmpodscrape,
    "prometheus-operator/agent-podmonitor.yaml": agent_podmonitor,
}


LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def parse_label(text):
    key, sep, value = text.partition("=")
    if not sep or not LABEL_KEY.match(key) or len(key.partition("/")[0]) > 253 \
            or not value or not LABEL_VALUE.match(value):
        raise argparse.ArgumentTypeError(
            "--scrape-label wants KEY=VALUE, a Kubernetes label (e.g. "
            "vgpu-license-agent/scrape=true): %r is none" % text)
    return key, value


def parse_url(text):
    if not re.match(r"^https?://[^/\s#]+(/[^\s#]*)?$", text):
        raise argparse.ArgumentTypeError(
            "--runbook-base wants the http(s) URL where docs/fleet.md is published, without a "
            "#fragment (e.g. https://wiki.example.com/vgpu/fleet.md): %r is none" % text)
    return text


def main(argv):
    ap = argparse.ArgumentParser(prog="generate.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 and show the difference where a manifest is not what its source makes")
    ap.add_argument("--scrape-label", type=parse_label, default=SCRAPE_LABEL, metavar="KEY=VALUE",
                    help="the pod label that opts a VM in (default %s=%s)" % SCRAPE_LABEL)
    ap.add_argument("--output", metavar="DIR", default=HERE,
                    help="where to write the manifests (default: deploy/kubernetes/)")
    ap.add_argument("--runbook-base", type=parse_url, metavar="URL",
                    help="where you publish docs/fleet.md (https://...): every alert's runbook_url "
                         "becomes URL#ALERT and the dashboard links URL#alerts (default: the "
                         "rules file's, the guide as the package installs it, which the dashboard "
                         "does not link)")
    args = ap.parse_args(argv)
    global RUNBOOK_BASE
    RUNBOOK_BASE = args.runbook_base
    out = os.path.abspath(args.output)
    stale = 0
    for rel, make in OUTPUTS.items():
        path = os.path.join(out, rel)
        want = make(args.scrape_label)
        try:
            with open(path, encoding="utf-8") as f:
                have = f.read()
        except FileNotFoundError:
            have = None
        if have == want:
            continue
        if args.check:
            stale += 1
            print("%s is not what generate.py makes of its source:" % os.path.relpath(path, ROOT))
            sys.stdout.writelines(difflib.unified_diff(
                (have or "").splitlines(True), want.splitlines(True),
                "committed/" + rel, "generated/" + rel))
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(want)
            print("wrote %s" % os.path.relpath(path))
    if stale:
        print("run: python3 deploy/kubernetes/generate.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
