#!/usr/bin/env python3
"""Writes the Kubernetes manifests of deploy/kubernetes/ from their sources:

  packaging/vgpu-license-agent.rules.yml       -> cozystack/vmrule.yaml,
                                                  prometheus-operator/prometheusrule.yaml
  deploy/kubernetes/dashboard/*.json           -> grafana/grafanadashboard.yaml
  SCRAPE (below)                               -> cozystack/vmpodscrape.yaml,
                                                  prometheus-operator/podmonitor.yaml

so that the alert rules, the dashboard and the scrape settings each have one source, the file
a person edits. Run it after editing one of them; `--check` (the tests run it) exits 1 and
shows the difference when a committed manifest is not what its source makes.

Only VMs that opt in are scraped: their virt-launcher pods carry the label
vgpu-license-agent/scrape=true (set in the VirtualMachine's spec.template.metadata.labels;
KubeVirt copies it to the pod). `--scrape-label KEY=VALUE` makes the manifests select another
label; with `--output DIR` they are written there rather than over the committed ones.

usage: python3 deploy/kubernetes/generate.py [--check] [--scrape-label KEY=VALUE] [--output DIR]

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


def rules_groups():
    with open(RULES, encoding="utf-8") as f:
        rules = yaml.safe_load(f)
    return rules["groups"]


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


OUTPUTS = {
    "cozystack/vmpodscrape.yaml": vmpodscrape,
    "cozystack/vmrule.yaml": vmrule,
    "prometheus-operator/podmonitor.yaml": podmonitor,
    "prometheus-operator/prometheusrule.yaml": prometheusrule,
    "grafana/grafanadashboard.yaml": grafanadashboard,
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


def main(argv):
    ap = argparse.ArgumentParser(prog="generate.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 and show the difference where a manifest is not what its source makes")
    ap.add_argument("--scrape-label", type=parse_label, default=SCRAPE_LABEL, metavar="KEY=VALUE",
                    help="the pod label that opts a VM in (default %s=%s)" % SCRAPE_LABEL)
    ap.add_argument("--output", metavar="DIR", default=HERE,
                    help="where to write the manifests (default: deploy/kubernetes/)")
    args = ap.parse_args(argv)
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
