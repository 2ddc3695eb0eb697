#!/usr/bin/env python3
"""Benchmark of the agent as the DaemonSet runs it: with the Node condition writer on (in a
simulated pod, against an API server of this script's on loopback, HTTPS with its own CA and
a bearer token) and off, in the same run, one after the other, each for SECONDS: peak RSS
and CPU (the agent and its children, from a cgroup of its own), and the requests the writer
made. The anchor for a node agent's cost is dcgm-exporter's published footprint: 135 to
512 MiB of memory.

Usage: python3 bench/node_condition.py [--binary PATH] [--seconds 60] [--heartbeat 5]
(without --binary: builds and measures the binary the packages ship, target/dist/). The heartbeat is
shortened from its default of 240 s so that the writer works throughout the run. As root.
"""
import argparse, http.server, importlib.util, json, os, shutil, ssl, subprocess, sys, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
spec = importlib.util.spec_from_file_location("service_bench", os.path.join(HERE, "service.py"))
svc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(svc)

NODE = "gpu-worker-1"
TOKEN = "bench-service-account-token"
DCGM_EXPORTER_MIB = (135, 512)


def certificates(d):
    """A CA and a server certificate it signed for 127.0.0.1 (openssl)."""
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-subj", "/CN=bench-ca", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", f"{d}/server.key", "-out", f"{d}/server.csr")
    with open(f"{d}/ext", "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    run("openssl", "x509", "-req", "-in", f"{d}/server.csr", "-CA", f"{d}/ca.crt",
        "-CAkey", f"{d}/ca.key", "-CAcreateserial", "-days", "1", "-extfile", f"{d}/ext",
        "-out", f"{d}/server.crt")


class Api(http.server.BaseHTTPRequestHandler):
    """GET /api/v1/nodes/NODE and PATCH .../status (strategic merge by `type`), bearer token
    checked, as the API reference describes them."""
    node = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "resourceVersion": "1"},
            "spec": {}, "status": {"conditions": []}}
    requests = []
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorized(self):
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.answer(401, {"kind": "Status", "code": 401})
            return False
        return True

    def do_GET(self):
        Api.requests.append(("GET", self.path))
        if self.authorized():
            self.answer(200, Api.node)

    def do_PATCH(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        Api.requests.append(("PATCH", self.path))
        if not self.authorized():
            return
        conditions = Api.node["status"]["conditions"]
        for c in body.get("status", {}).get("conditions", []):
            old = next((x for x in conditions if x["type"] == c["type"]), None)
            if old is None:
                conditions.append(c)
            else:
                old.update(c)
        self.answer(200, Api.node)


def serve(d):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(f"{d}/server.crt", f"{d}/server.key")
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_agent(binary, seconds, heartbeat, api_port, certs):
    """(peak RSS MiB, CPU s) of the agent over SECONDS, in a pod of the API's cluster when
    API_PORT is given."""
    root = tempfile.mkdtemp(prefix="vla-bench-")
    svc.setup(root, 300)
    env = dict(os.environ)
    if api_port:
        sa = f"{root}/serviceaccount"
        os.makedirs(sa)
        with open(f"{sa}/token", "w") as f:
            f.write(TOKEN)
        shutil.copy(f"{certs}/ca.crt", f"{sa}/ca.crt")
        with open(f"{root}/config.toml", "a") as f:
            f.write(f'[kubernetes]\nnode_condition = "on"\nservice_account_dir = "{sa}"\n'
                    f"heartbeat_seconds = {heartbeat}\n")
        env.update(KUBERNETES_SERVICE_HOST="127.0.0.1", KUBERNETES_SERVICE_PORT=str(api_port),
                   NODE_NAME=NODE)
    group = svc.CpuGroup()
    agent = subprocess.Popen([binary, "--config", f"{root}/config.toml", "run"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=group.enter)
    try:
        assert svc.wait_for(lambda: svc.status_has(f"{root}/run/status.json", '"licensed"'), 15)
        c0 = group.cpu(agent.pid)
        time.sleep(seconds)
        return svc.rss_of(agent.pid), group.cpu(agent.pid) - c0
    finally:
        agent.terminate()
        agent.wait()
        group.close()
        shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--heartbeat", type=int, default=5)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/node_condition.py: run it as root (a cgroup of its own for the CPU)")
    a.binary = svc.built(a.binary)
    svc.journal()
    certs = tempfile.mkdtemp(prefix="vla-bench-ca-")
    try:
        certificates(certs)
        server = serve(certs)
        port = server.server_address[1]
        print(f"machine: {svc.machine(a.binary)}")
        rss_off, cpu_off = run_agent(a.binary, a.seconds, a.heartbeat, None, certs)
        rss_on, cpu_on = run_agent(a.binary, a.seconds, a.heartbeat, port, certs)
        server.shutdown()
        patches = sum(1 for m, p in Api.requests if m == "PATCH")
        condition = next((c for c in Api.node["status"]["conditions"] if c["type"] == "VgpuLicensed"), None)
        assert condition and condition["status"] == "True", f"the condition was not written: {Api.node}"
        lo, hi = DCGM_EXPORTER_MIB
        print(f"agent, license held, {a.seconds} s, Node condition writer off: peak RSS {rss_off:5.1f} MiB, CPU {cpu_off:.3f} s")
        print(f"agent, license held, {a.seconds} s, Node condition writer on (heartbeat {a.heartbeat} s, "
              f"{patches} PATCHes): peak RSS {rss_on:5.1f} MiB, CPU {cpu_on:.3f} s")
        print(f"writer on / off, same run: RSS {rss_on / rss_off:.2f}x, CPU {cpu_on / max(cpu_off, 1e-6):.2f}x")
        print(f"against dcgm-exporter's published {lo} to {hi} MiB: {rss_on / lo:.3f}x to {rss_on / hi:.3f}x")
    finally:
        shutil.rmtree(certs, ignore_errors=True)


if __name__ == "__main__":
    main()
