//! A Kubernetes API server as far as a node agent meets it, written from the API reference
//! (core/v1 Node, "Patch status of the specified Node"): HTTPS with its own CA (the
//! service-account directory's `ca.crt`), every request authenticated by a bearer token
//! (401 without the right one), `GET /api/v1/nodes/{name}` and `PATCH
//! /api/v1/nodes/{name}/status` with the patch types the API accepts for a built-in kind:
//! `application/strategic-merge-patch+json` (a list of conditions merges by its patch merge
//! key, `type`: the entries named are replaced field by field, the others stay) and
//! `application/merge-patch+json` (RFC 7386: a list is replaced whole). An unknown node is
//! 404, another content type 415, and errors have the API's `Status` body. `PATCH
//! /api/v1/nodes/{name}` (the Node itself: `spec.taints`, a list without a merge key, so
//! replaced whole by either patch type) honours a `metadata.resourceVersion` in the patch as
//! the API does: 409 Conflict when the Node changed since (every write moves it). It can
//! also forbid (403, as RBAC without the patch verb), forbid the Node's own patch alone (a
//! role with `patch nodes/status` and not `patch nodes`: the taint), fail every status patch
//! with a 5xx, be down (the port refuses) or slow; and misbehave as a hostile server in the
//! API's place would: redirect every request elsewhere, or answer with a body that never
//! ends.
//!
//! Who asks: the service account's bearer token, with the RBAC the test grants it, or a
//! client certificate the API's CA signed (as a kubeconfig carries one); one for
//! `system:node:NAME` (the kubelet's) is held to the Node authorizer: its own Node and its
//! status, nothing else. A certificate the test withdraws (an old one, after a rotation) is
//! 401. Secrets: `GET /api/v1/namespaces/{ns}/secrets/{name}`, 403 unless the test granted
//! get on that one name (a Role with `resourceNames`), 404 where granted and absent.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiMode {
    Up,
    /// Every request is 403 Forbidden.
    Forbidden,
    /// The port refuses connections, and a connection made before is closed at its next
    /// request, unanswered.
    Down,
    /// Every answer comes after this long.
    Slow(Duration),
    /// Every PATCH of `nodes/{name}` (the taint) is 403; the status subresource is allowed.
    ForbidTaint,
    /// Every PATCH of the status subresource gets this code (a 500, say); GETs answer.
    FailStatus(u16),
    /// Every request is answered `307` to the same path on `http://127.0.0.1:PORT`.
    RedirectTo(u16),
    /// Every request is answered 200 with a chunked body that never ends.
    Endless,
}

struct Inner {
    mode: Mutex<ApiMode>,
    token: String,
    nodes: Mutex<BTreeMap<String, Value>>,
    /// `METHOD PATH STATUS CONTENT-TYPE` of every request answered.
    requests: Mutex<Vec<String>>,
    /// The body of every PATCH of a status subresource, answered or refused.
    status_patches: Mutex<Vec<Value>>,
    stop: AtomicBool,
    tls: Arc<rustls::ServerConfig>,
    /// The users of the client certificates the CA signed and the test has not withdrawn,
    /// by the certificate's DER.
    client_certs: Mutex<BTreeMap<Vec<u8>, String>>,
    /// Secrets by `namespace/name`, and the names the service account may get.
    secrets: Mutex<BTreeMap<String, Value>>,
    secret_grants: Mutex<Vec<String>>,
    /// KubeVirt's VirtualMachineInstances by `namespace/name`.
    vmis: Mutex<BTreeMap<String, Value>>,
    /// The Events created, as the API stored them.
    events: Mutex<Vec<Value>>,
    /// The host agent's ClusterRole is applied: get on VirtualMachineInstances, create on
    /// Events, nothing more.
    host_grant: AtomicBool,
}

pub struct FakeApi {
    addr: SocketAddr,
    inner: Arc<Inner>,
    issuer: Issuer,
    /// The CA's certificate, PEM: what a pod's `ca.crt` holds.
    pub ca_pem: String,
    thread: Option<JoinHandle<()>>,
}

/// A CA and a server certificate it signed for 127.0.0.1 and localhost.
pub fn certificates() -> (String, Arc<rustls::ServerConfig>) {
    let (pem, config, _) = certificates_with_issuer();
    (pem, config)
}

type Issuer = rcgen::Issuer<'static, rcgen::KeyPair>;

/// [`certificates`], the server asking for a client certificate (optional) that its CA
/// signed, and the CA to sign them with.
fn certificates_with_issuer() -> (String, Arc<rustls::ServerConfig>, Issuer) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kubernetes");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![cert.der().clone(), ca_cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (ca_cert.pem(), Arc::new(config), issuer)
}

impl FakeApi {
    /// An API on a free loopback port that accepts `token`, holding `nodes` (Node objects).
    pub fn start(token: &str, nodes: Vec<Value>) -> FakeApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (ca_pem, tls, issuer) = certificates_with_issuer();
        let inner = Arc::new(Inner {
            mode: Mutex::new(ApiMode::Up),
            token: token.to_string(),
            nodes: Mutex::new(
                nodes
                    .into_iter()
                    .map(|n| (n["metadata"]["name"].as_str().unwrap().to_string(), n))
                    .collect(),
            ),
            requests: Mutex::new(Vec::new()),
            status_patches: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            tls,
            client_certs: Mutex::new(BTreeMap::new()),
            secrets: Mutex::new(BTreeMap::new()),
            secret_grants: Mutex::new(Vec::new()),
            vmis: Mutex::new(BTreeMap::new()),
            events: Mutex::new(Vec::new()),
            host_grant: AtomicBool::new(false),
        });
        let i = inner.clone();
        let thread = std::thread::spawn(move || accept_loop(listener, addr, i));
        FakeApi {
            addr,
            inner,
            issuer,
            ca_pem,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn set_mode(&self, mode: ApiMode) {
        *self.inner.mode.lock().unwrap() = mode;
        std::thread::sleep(Duration::from_millis(60));
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.inner.nodes.lock().unwrap().get(name).cloned()
    }

    /// A condition of a node, by type.
    pub fn condition(&self, node: &str, kind: &str) -> Option<Value> {
        self.node(node)?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == kind)
            .cloned()
    }

    /// Another writer (node-problem-detector, the kubelet) sets a condition of its own.
    pub fn set_condition(&self, node: &str, condition: Value) {
        let mut nodes = self.inner.nodes.lock().unwrap();
        let n = nodes.get_mut(node).unwrap();
        merge_conditions(n, std::slice::from_ref(&condition));
    }

    /// Another writer (an operator, a cluster autoscaler) changes the Node's taints.
    pub fn set_taints(&self, node: &str, taints: Value) {
        let mut nodes = self.inner.nodes.lock().unwrap();
        let n = nodes.get_mut(node).unwrap();
        n["spec"]["taints"] = taints;
        bump(n);
    }

    pub fn taints(&self, node: &str) -> Vec<Value> {
        self.node(node)
            .and_then(|n| n["spec"]["taints"].as_array().cloned())
            .unwrap_or_default()
    }

    /// The body of every PATCH of a Node's status, in order, those refused included.
    pub fn status_patches(&self) -> Vec<Value> {
        self.inner.status_patches.lock().unwrap().clone()
    }

    pub fn requests(&self) -> Vec<String> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// A client certificate for `user` (its CN; `system:node:NAME` for a kubelet's) signed by
    /// the API's CA, as the kubelet's rotation writes it: one PEM file, the certificate then
    /// its EC private key (`EC PRIVATE KEY`, SEC 1). Returns the certificate's PEM and that
    /// file's text.
    pub fn client_certificate(&self, user: &str) -> (String, String) {
        use rcgen::{CertificateParams, DnType, KeyPair, PKCS_ECDSA_P256_SHA256};
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, user);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        self.inner
            .client_certs
            .lock()
            .unwrap()
            .insert(cert.der().to_vec(), user.to_string());
        let sec1 = sec1_of(&key);
        (cert.pem(), format!("{}{sec1}", cert.pem()))
    }

    /// Withdraws a certificate [`FakeApi::client_certificate`] made: it is 401 from now on.
    pub fn withdraw_certificate(&self, cert_pem: &str) {
        let der = pem_der(cert_pem);
        self.inner.client_certs.lock().unwrap().remove(&der);
    }

    /// Sets a Secret's `data` (values given as they are, base64'd here).
    pub fn set_secret(&self, namespace: &str, name: &str, data: &[(&str, &[u8])]) {
        use base64::Engine;
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(v)),
                )
            })
            .collect();
        self.inner.secrets.lock().unwrap().insert(
            format!("{namespace}/{name}"),
            json!({"kind": "Secret", "apiVersion": "v1", "type": "Opaque",
                   "metadata": {"name": name, "namespace": namespace}, "data": data}),
        );
    }

    /// Grants the service account get on the one Secret `namespace/name` (a Role with
    /// `resourceNames`, bound to it).
    /// A VirtualMachineInstance as KubeVirt makes it: its uid, and the firmware UUID that
    /// virt-launcher gives the libvirt domain (the VM UUID the vGPU manager shows).
    pub fn set_vmi(&self, namespace: &str, name: &str, firmware_uuid: &str) {
        let uid = format!("{:08x}-0000-4000-8000-{:012x}", name.len(), namespace.len());
        self.inner.vmis.lock().unwrap().insert(
            format!("{namespace}/{name}"),
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                   "metadata": {"name": name, "namespace": namespace, "uid": uid,
                                "resourceVersion": "7"},
                   "spec": {"domain": {"firmware": {"uuid": firmware_uuid}}},
                   "status": {"phase": "Running"}}),
        );
    }

    /// The uid of a VirtualMachineInstance [`FakeApi::set_vmi`] made.
    pub fn vmi_uid(&self, namespace: &str, name: &str) -> Option<String> {
        let vmis = self.inner.vmis.lock().unwrap();
        let v = vmis.get(&format!("{namespace}/{name}"))?;
        v["metadata"]["uid"].as_str().map(String::from)
    }

    /// The host agent's ClusterRole applied: get VirtualMachineInstances, create Events.
    pub fn grant_host(&self) {
        self.inner.host_grant.store(true, Ordering::SeqCst);
    }

    /// The Events created so far.
    pub fn events(&self) -> Vec<Value> {
        self.inner.events.lock().unwrap().clone()
    }

    pub fn grant_secret(&self, namespace: &str, name: &str) {
        self.inner
            .secret_grants
            .lock()
            .unwrap()
            .push(format!("{namespace}/{name}"));
    }
}

/// A P-256 key as SEC 1 PEM (`EC PRIVATE KEY`), the form the kubelet writes: the PKCS#8
/// document rcgen gives holds it as its private key's octet string.
fn sec1_of(key: &rcgen::KeyPair) -> String {
    use base64::Engine;
    let pkcs8 = key.serialize_der();
    // PKCS#8 of an EC key: ... OCTET STRING { ECPrivateKey (a SEQUENCE) }: the SEQUENCE that
    // starts with version 1 (`30 len 02 01 01`) is the SEC 1 document.
    let start = pkcs8
        .windows(5)
        .position(|w| w[0] == 0x30 && w[2..5] == [0x02, 0x01, 0x01])
        .unwrap();
    let len = pkcs8[start + 1] as usize;
    let sec1 = &pkcs8[start..start + 2 + len];
    let b64 = base64::engine::general_purpose::STANDARD.encode(sec1);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----\n",
        lines.join("\n")
    )
}

/// The DER of a PEM certificate.
fn pem_der(pem: &str) -> Vec<u8> {
    use base64::Engine;
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A Node object as the API returns it, with these conditions.
pub fn node_object(name: &str, conditions: Vec<Value>) -> Value {
    json!({
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "resourceVersion": "1",
                     "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"conditions": conditions},
    })
}

fn accept_loop(listener: TcpListener, addr: SocketAddr, inner: Arc<Inner>) {
    let _ = listener.set_nonblocking(true);
    let mut listener = Some(listener);
    while !inner.stop.load(Ordering::SeqCst) {
        let mode = *inner.mode.lock().unwrap();
        if mode == ApiMode::Down {
            listener = None;
        } else if listener.is_none() {
            listener = TcpListener::bind(addr).ok();
            if let Some(l) = &listener {
                let _ = l.set_nonblocking(true);
            }
        }
        let Some(l) = &listener else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        match l.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let i = inner.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &i);
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// `GET /apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}`, with the
/// host's ClusterRole.
fn get_vmi(inner: &Inner, method: &str, rest: &str) -> (u16, Value) {
    let parts: Vec<&str> = rest.split('/').collect();
    let (["namespaces", namespace, "virtualmachineinstances", name], "GET") = (&parts[..], method)
    else {
        return status(403, "Forbidden", &format!("cannot {method} {rest}"));
    };
    if !inner.host_grant.load(Ordering::SeqCst) {
        return status(
            403,
            "Forbidden",
            &format!(
                "virtualmachineinstances.kubevirt.io \"{name}\" is forbidden: User \"system:serviceaccount:vgpu:agent\" cannot get resource \"virtualmachineinstances\" in API group \"kubevirt.io\" in the namespace \"{namespace}\""
            ),
        );
    }
    match inner
        .vmis
        .lock()
        .unwrap()
        .get(&format!("{namespace}/{name}"))
    {
        Some(v) => (200, v.clone()),
        None => status(
            404,
            "NotFound",
            &format!("virtualmachineinstances.kubevirt.io \"{name}\" not found"),
        ),
    }
}

/// `POST /api/v1/namespaces/{namespace}/events`, with the host's ClusterRole: the Event is
/// checked as the API validates one (core/v1: a name or generateName, the namespace of the
/// path, an involvedObject with its kind, apiVersion, name, namespace and uid, a reason, a
/// type Normal or Warning, a message), stored and echoed.
fn create_event(inner: &Inner, namespace: &str, body: &[u8]) -> (u16, Value) {
    if !inner.host_grant.load(Ordering::SeqCst) {
        return status(
            403,
            "Forbidden",
            &format!(
                "events is forbidden: User \"system:serviceaccount:vgpu:agent\" cannot create resource \"events\" in API group \"\" in the namespace \"{namespace}\""
            ),
        );
    }
    let Ok(mut e) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "the body is not JSON");
    };
    let text = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
    let o = &e["involvedObject"];
    let problems: Vec<&str> = [
        (
            e["kind"] == "Event" && e["apiVersion"] == "v1",
            "kind/apiVersion",
        ),
        (
            text(&e["metadata"]["name"]) || text(&e["metadata"]["generateName"]),
            "metadata.name",
        ),
        (
            e["metadata"]["namespace"].is_null() || e["metadata"]["namespace"] == namespace,
            "metadata.namespace",
        ),
        (
            o["kind"] == "VirtualMachineInstance" && o["apiVersion"] == "kubevirt.io/v1",
            "involvedObject.kind",
        ),
        (
            text(&o["name"]) && text(&o["uid"]),
            "involvedObject.name/uid",
        ),
        (o["namespace"] == namespace, "involvedObject.namespace"),
        (text(&e["reason"]), "reason"),
        (e["type"] == "Normal" || e["type"] == "Warning", "type"),
        (text(&e["message"]), "message"),
        (text(&e["source"]["component"]), "source.component"),
    ]
    .into_iter()
    .filter(|(ok, _)| !ok)
    .map(|(_, what)| what)
    .collect();
    if !problems.is_empty() {
        return status(
            422,
            "Invalid",
            &format!("Event is invalid: {}", problems.join(", ")),
        );
    }
    let mut events = inner.events.lock().unwrap();
    if e["metadata"]["name"].is_null() {
        let prefix = e["metadata"]["generateName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        e["metadata"]["name"] = Value::String(format!("{prefix}{:05}", events.len()));
    }
    e["metadata"]["namespace"] = Value::String(namespace.to_string());
    events.push(e.clone());
    (201, e)
}

/// `GET {namespace}/secrets/{name}`, for a service account with get on that one name.
fn get_secret(inner: &Inner, method: &str, rest: &str) -> (u16, Value) {
    let parts: Vec<&str> = rest.split('/').collect();
    let [namespace, "secrets", name] = parts[..] else {
        return status(
            403,
            "Forbidden",
            &format!("User \"system:serviceaccount:vgpu:agent\" cannot access {rest}"),
        );
    };
    let key = format!("{namespace}/{name}");
    if method != "GET" || !inner.secret_grants.lock().unwrap().contains(&key) {
        return status(
            403,
            "Forbidden",
            &format!(
                "secrets \"{name}\" is forbidden: User \"system:serviceaccount:vgpu:agent\" cannot {} resource \"secrets\" in API group \"\" in the namespace \"{namespace}\"",
                method.to_lowercase()
            ),
        );
    }
    match inner.secrets.lock().unwrap().get(&key) {
        Some(secret) => (200, secret.clone()),
        None => status(404, "NotFound", &format!("secrets \"{name}\" not found")),
    }
}

/// The API's error body.
fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

/// Every write moves the Node's `resourceVersion`.
fn bump(node: &mut Value) {
    let v: u64 = node["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    node["metadata"]["resourceVersion"] = Value::String((v + 1).to_string());
}

/// Strategic merge of a conditions list: by `type`, field by field.
fn merge_conditions(node: &mut Value, patch: &[Value]) {
    let list = node["status"]["conditions"]
        .as_array_mut()
        .expect("a node's conditions");
    for p in patch {
        match list.iter_mut().find(|c| c["type"] == p["type"]) {
            Some(c) => {
                for (k, v) in p.as_object().unwrap() {
                    c[k] = v.clone();
                }
            }
            None => list.push(p.clone()),
        }
    }
}

/// Who sent a request: the client certificate's user where one was shown (`Err` where the
/// CA signed it but it was withdrawn, or never signed), else the bearer token's.
type Shown = Result<Option<String>, ()>;

fn route(
    inner: &Inner,
    method: &str,
    path: &str,
    head: &str,
    body: &[u8],
    shown: Shown,
) -> (u16, Value) {
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let cert_user = match shown {
        Err(()) => return status(401, "Unauthorized", "Unauthorized"),
        Ok(user) => user,
    };
    if cert_user.is_none()
        && header("authorization").as_deref() != Some(&format!("Bearer {}", inner.token))
    {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let rest_path = path.split('?').next().unwrap_or_default();
    // The Node authorizer: a node's own Node and its status, nothing else.
    if let Some(node) = cert_user
        .as_deref()
        .and_then(|u| u.strip_prefix("system:node:"))
    {
        let own = format!("/api/v1/nodes/{node}");
        if rest_path != own && rest_path != format!("{own}/status") {
            return status(
                403,
                "Forbidden",
                &format!(
                    "User \"system:node:{node}\" cannot access {rest_path}: node '{node}' cannot access objects of another node, nor secrets no pod of it uses"
                ),
            );
        }
    }
    if let Some(vmi) = rest_path.strip_prefix("/apis/kubevirt.io/v1/") {
        return get_vmi(inner, method, vmi);
    }
    if let Some(namespace) = rest_path
        .strip_prefix("/api/v1/namespaces/")
        .and_then(|r| r.strip_suffix("/events"))
        .filter(|ns| !ns.contains('/'))
        && method == "POST"
    {
        return create_event(inner, namespace, body);
    }
    if let Some(secret) = rest_path.strip_prefix("/api/v1/namespaces/") {
        return get_secret(inner, method, secret);
    }
    let mode = *inner.mode.lock().unwrap();
    let taint_patch = method == "PATCH" && !rest_path.ends_with("/status");
    if method == "PATCH" && !taint_patch {
        let sent = serde_json::from_slice(body).unwrap_or(Value::Null);
        inner.status_patches.lock().unwrap().push(sent);
    }
    if mode == ApiMode::ForbidTaint && taint_patch {
        return status(
            403,
            "Forbidden",
            "nodes \"x\" is forbidden: User \"system:serviceaccount:vgpu:agent\" cannot patch resource \"nodes\" in API group \"\" at the cluster scope",
        );
    }
    if let ApiMode::FailStatus(code) = mode
        && method == "PATCH"
        && !taint_patch
    {
        return status(
            code,
            "InternalError",
            "Internal error occurred: etcdserver: request timed out",
        );
    }
    if mode == ApiMode::Forbidden {
        return status(
            403,
            "Forbidden",
            "nodes \"x\" is forbidden: User \"system:serviceaccount:vgpu:agent\" cannot patch resource \"nodes/status\" in API group \"\" at the cluster scope",
        );
    }
    let rest = path.split('?').next().unwrap_or_default();
    let Some(rest) = rest.strip_prefix("/api/v1/nodes/") else {
        return status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
    };
    let (name, sub) = rest.split_once('/').unwrap_or((rest, ""));
    let mut nodes = inner.nodes.lock().unwrap();
    let Some(node) = nodes.get_mut(name) else {
        return status(404, "NotFound", &format!("nodes \"{name}\" not found"));
    };
    match (method, sub) {
        ("GET", "") | ("GET", "status") => (200, node.clone()),
        ("PATCH", "") => {
            let Ok(patch) = serde_json::from_slice::<Value>(body) else {
                return status(400, "BadRequest", "the body is not JSON");
            };
            let kind = header("content-type").unwrap_or_default();
            if !matches!(
                kind.split(';').next().unwrap_or_default().trim(),
                "application/merge-patch+json" | "application/strategic-merge-patch+json"
            ) {
                return status(415, "UnsupportedMediaType", "unsupported media type");
            }
            if let Some(rv) = patch["metadata"]["resourceVersion"].as_str()
                && node["metadata"]["resourceVersion"].as_str() != Some(rv)
            {
                return status(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on nodes \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                    ),
                );
            }
            if let Some(t) = patch["spec"].get("taints") {
                node["spec"]["taints"] = t.clone();
            }
            bump(node);
            (200, node.clone())
        }
        ("PATCH", "status") => {
            let Ok(patch) = serde_json::from_slice::<Value>(body) else {
                return status(400, "BadRequest", "the body is not JSON");
            };
            let kind = header("content-type").unwrap_or_default();
            let conditions = patch["status"]["conditions"].as_array().cloned();
            match kind.split(';').next().unwrap_or_default().trim() {
                "application/strategic-merge-patch+json" => {
                    if let Some(c) = conditions {
                        merge_conditions(node, &c);
                    }
                }
                "application/merge-patch+json" => {
                    if let Some(c) = conditions {
                        node["status"]["conditions"] = Value::Array(c);
                    }
                }
                other => {
                    return status(
                        415,
                        "UnsupportedMediaType",
                        &format!(
                            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {other}"
                        ),
                    );
                }
            }
            bump(node);
            (200, node.clone())
        }
        _ => status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method",
        ),
    }
}

fn serve(stream: TcpStream, inner: &Inner) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let conn = rustls::ServerConnection::new(inner.tls.clone()).map_err(io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, stream);
    loop {
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = tls.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            data.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&data[..head_end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        while data.len() - head_end < length {
            let n = tls.read(&mut buf)?;
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
        }
        let body = &data[head_end..];
        let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or_default().to_string(),
            parts.next().unwrap_or_default().to_string(),
        );
        let mode = *inner.mode.lock().unwrap();
        // A server gone away answers nothing on the connections it had either.
        if mode == ApiMode::Down {
            return Ok(());
        }
        if let ApiMode::Slow(d) = mode {
            std::thread::sleep(d);
        }
        if let ApiMode::RedirectTo(port) = mode {
            inner
                .requests
                .lock()
                .unwrap()
                .push(format!("{method} {path} 307"));
            write!(
                tls,
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:{port}{path}\r\nContent-Length: 0\r\n\r\n"
            )?;
            tls.flush()?;
            continue;
        }
        if mode == ApiMode::Endless {
            inner
                .requests
                .lock()
                .unwrap()
                .push(format!("{method} {path} 200 endless"));
            write!(
                tls,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            )?;
            let chunk = format!("10000\r\n{}\r\n", "[".repeat(0x10000));
            // Until the client goes away (or 4 GiB, far past any cap).
            for _ in 0..(1 << 16) {
                if inner.stop.load(Ordering::SeqCst) {
                    break;
                }
                tls.write_all(chunk.as_bytes())?;
            }
            return Ok(());
        }
        let shown = match tls.conn.peer_certificates().and_then(|c| c.first()) {
            None => Ok(None),
            Some(c) => inner
                .client_certs
                .lock()
                .unwrap()
                .get(c.as_ref())
                .cloned()
                .map(Some)
                .ok_or(()),
        };
        let (code, answer) = route(inner, &method, &path, &head, body, shown);
        let ctype = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-type")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default();
        inner
            .requests
            .lock()
            .unwrap()
            .push(format!("{method} {path} {code} {ctype}"));
        let text = answer.to_string();
        write!(
            tls,
            "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        )?;
        tls.flush()?;
    }
}
