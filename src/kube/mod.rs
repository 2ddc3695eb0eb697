//! The Kubernetes API, as far as the agent needs it: the `VgpuLicensed` condition on its own
//! Node, written through the `nodes/status` subresource with a strategic merge patch (merged
//! by the condition's type, so that every other condition stays as it is, as
//! node-problem-detector writes its own) by [`writer`]; and, where the config names it, the
//! GPU Operator's licensing Secret, read and nothing else ([`secret`]).
//!
//! Where: in a pod, the in-cluster API (`KUBERNETES_SERVICE_HOST`/`_PORT`) with the service
//! account's token and CA; on a host, the kubeconfig `kubernetes.kubeconfig` names
//! ([`kubeconfig`]: YAML or JSON, a bearer token or a client certificate, the kubelet's own
//! among them). Nothing is written anywhere else.
//!
//! What it trusts: a kubeconfig, and the files it names, only where root could have written
//! them (owned by root or the agent's user, writable by nobody else: the config's rule), since
//! it says where root's credentials go; a node name only where it is an RFC 1123 subdomain;
//! no redirect from the API (an API server never sends one: the credentials go to the
//! server named and nowhere else); an answer of at most [`MAX_ANSWER`] bytes. The writer runs
//! apart from the rest of the service: an API that is down, slow or answers 403 is a warning
//! in the journal and the counter `vgpu_license_node_condition_errors_total`, retried with
//! backoff, never a stall of anything else.

pub mod events;
mod kubeconfig;
pub mod secret;
mod writer;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use reqwest::{Client, RequestBuilder, Url};
use serde_json::{Value, json};

use crate::files::input::{self, Links};
use crate::model::config::{Settings, Switch};
use crate::model::node::condition::TYPE;
use crate::model::text::show_path;

pub use writer::write_condition;

const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_FILE: usize = 1 << 20;
/// The most the agent reads of an answer of the API: a Node is a few KiB (its images list
/// included, tens of KiB at most); an endless or huge body is cut here and refused.
pub const MAX_ANSWER: usize = 1 << 20;
/// The most it reads of an error answer (a `Status`: its message).
const MAX_ERROR: usize = 64 << 10;
/// What another owner of a kubeconfig, or of a file it names, could do.
const KUBECONFIG_RISK: &str =
    "could send root's credentials (any file root can read) to a server of theirs";

/// How the API is reached.
#[derive(Clone)]
pub struct Api {
    base: Url,
    ca_pem: Vec<u8>,
    token: Option<Bearer>,
    cert: Option<ClientCert>,
    /// The Node the condition is written to.
    pub node: String,
    /// `lastHeartbeatTime` is refreshed at least this often.
    heartbeat: Duration,
    /// Whether the opt-in taint is kept (`kubernetes.taint_unlicensed`).
    taint: bool,
}

#[derive(Clone)]
enum Bearer {
    /// Read again at each request: a pod's projected token is rotated under it.
    File(PathBuf),
    /// A kubeconfig's `tokenFile`: read again at each request, and held to the kubeconfig's
    /// ownership rule each time.
    KubeconfigFile(PathBuf),
    Literal(String),
}

/// PEM text a kubeconfig gives inline, or a file of it (read again at each connection, held
/// to the kubeconfig's ownership rule each time).
#[derive(Clone)]
enum Pem {
    Data(Vec<u8>),
    File(PathBuf),
}

impl Pem {
    /// Its bytes; `what` names it in the error.
    fn read(&self, what: &str) -> anyhow::Result<Vec<u8>> {
        match self {
            Pem::Data(d) => Ok(d.clone()),
            Pem::File(p) => owned_file(p, what).map_err(|e| file_error(p, what, &e)),
        }
    }
}

/// A client certificate and its key: the kubelet's rotate on disk, so they are read again
/// before each write, and a new pair makes a new client.
#[derive(Clone)]
struct ClientCert {
    cert: Pem,
    key: Pem,
}

impl ClientCert {
    /// The key and the certificate as one PEM text, as read now.
    fn pem(&self) -> anyhow::Result<Vec<u8>> {
        let mut pem = self.key.read("its client-key")?;
        pem.push(b'\n');
        pem.extend(self.cert.read("its client-certificate")?);
        Ok(pem)
    }

    /// Where the pair comes from, for an error: its files, or the kubeconfig's own data.
    fn shown(&self) -> String {
        let one = |p: &Pem, key: &str| match p {
            Pem::Data(_) => format!("{key}-data"),
            Pem::File(f) => format!("{key} {}", show_path(f)),
        };
        match (&self.cert, &self.key) {
            (Pem::File(c), Pem::File(k)) if c == k => {
                format!("client-certificate and client-key {}", show_path(c))
            }
            (c, k) => format!("{}, {}", one(c, "client-certificate"), one(k, "client-key")),
        }
    }

    /// Checks the pair as the TLS client will use it (a certificate it can show, and the key
    /// that is its own); returns the certificate's common name.
    fn check(&self) -> anyhow::Result<Option<String>> {
        check_pair(&self.pem()?).map_err(|why| anyhow!("{why} ({})", self.shown()))
    }
}

fn identity_of(pem: &[u8]) -> anyhow::Result<reqwest::Identity> {
    reqwest::Identity::from_pem(pem).map_err(|_| {
        anyhow!("the client certificate and key are not a PEM certificate and its private key")
    })
}

/// What a TLS client needs of a client certificate and its key, as rustls checks them when
/// the client is made, said in words (rustls would say "invalid peer certificate" of a v1
/// certificate, as if the server's were at fault): an X.509 v3 certificate, and the private
/// key whose public key is the certificate's. Returns the certificate's common name (a
/// kubelet's is `system:node:NAME`).
fn check_pair(pem: &[u8]) -> Result<Option<String>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use x509_cert::certificate::{CertificateInner, Raw, Version};
    use x509_cert::der::Decode;
    let not_pem = "the client certificate and key are not a PEM certificate and its private key";
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|_| not_pem.to_string())?;
    let leaf = certs.first().ok_or_else(|| not_pem.to_string())?;
    let cert = CertificateInner::<Raw>::from_der(leaf.as_ref())
        .map_err(|e| format!("the client certificate does not parse: {e}"))?;
    let tbs = cert.tbs_certificate();
    if tbs.version() != Version::V3 {
        return Err(format!(
            "the client certificate is X.509 {:?}, which TLS refuses to show (rustls, and the API's own checks): make it again as a v3 certificate (openssl x509 -req ... -extfile with extendedKeyUsage = clientAuth)",
            tbs.version()
        ));
    }
    let cn = crate::probe::common_name(tbs.subject());
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|_| not_pem.to_string())?;
    let provider = rustls::crypto::ring::default_provider();
    match rustls::sign::CertifiedKey::from_der(certs, key, &provider) {
        Ok(_) => Ok(cn),
        Err(rustls::Error::InconsistentKeys(_)) => Err(
            "the client-key is not the client-certificate's key (their public keys differ): name the key the certificate was made with"
                .to_string(),
        ),
        Err(e) => Err(format!(
            "the client certificate and key cannot be used for TLS: {e}"
        )),
    }
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        write!(f, "Api({} node {})", self.base, self.node)
    }
}

/// Where to write the condition: `Ok(None)` where there is nothing to write to (not in a
/// pod, no kubeconfig, or `node_condition = "off"`); an error where the config asks for it
/// and it cannot be set up.
pub fn target(settings: &Settings) -> anyhow::Result<Option<Api>> {
    let k = &settings.kubernetes;
    if k.node_condition == Switch::Off {
        return Ok(None);
    }
    let found = match &k.kubeconfig {
        Some(path) => kubeconfig::read(path)?,
        None => match in_cluster(k)? {
            Some(found) => found,
            None => return Ok(None),
        },
    };
    let node = k.node_name
        .clone()
        .or_else(crate::node::node_name)
        .context("no node name: set kubernetes.node_name, or NODE_NAME from the pod's downward API (spec.nodeName)")?;
    if let Some(why) = crate::model::node::condition::node_name_problem(&node) {
        bail!(
            "the node name {:?} {why}; set kubernetes.node_name, or NODE_NAME from the pod's downward API (spec.nodeName)",
            crate::model::text::escape(&node)
        );
    }
    Ok(Some(Api {
        base: found.base,
        ca_pem: found.ca_pem,
        token: found.token,
        cert: found.cert,
        node,
        heartbeat: k.heartbeat,
        taint: k.taint_unlicensed,
    }))
}

/// The in-cluster API, its CA and the service account's token, where the agent runs in a
/// pod with a service account; `None` elsewhere (an error where `node_condition = "on"`).
fn in_cluster(k: &crate::model::config::Kubernetes) -> anyhow::Result<Option<kubeconfig::Found>> {
    let sa = &k.service_account_dir;
    let host = std::env::var("KUBERNETES_SERVICE_HOST").ok();
    let in_pod = host.is_some() && sa.join("token").exists();
    if !in_pod {
        if k.node_condition == Switch::On {
            bail!(
                "kubernetes.node_condition = \"on\", but the agent is not in a pod with a service account ({} and KUBERNETES_SERVICE_HOST) and no kubernetes.kubeconfig is set: name one, or run it as the DaemonSet",
                show_path(sa)
            );
        }
        return Ok(None);
    }
    let host = host.unwrap_or_default();
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
    // An IPv6 address in a URL is bracketed.
    let shown_host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let base = Url::parse(&format!("https://{shown_host}:{port}/"))
        .map_err(|e| anyhow!("KUBERNETES_SERVICE_HOST/PORT make no URL: {e}"))?;
    let ca_pem = input::read_file(&sa.join("ca.crt"), MAX_FILE, Links::Follow)
        .map_err(|e| anyhow!("cannot read {}: {e}", show_path(&sa.join("ca.crt"))))?;
    Ok(Some(kubeconfig::Found {
        base,
        ca_pem,
        token: Some(Bearer::File(sa.join("token"))),
        cert: None,
    }))
}

/// A file a kubeconfig names that could not be used, the file first: `PATH (what): why`, or
/// `PATH: why` where the why names it already (its owner, its mode).
fn file_error(path: &Path, what: &str, why: &str) -> anyhow::Error {
    if why.starts_with(what) {
        anyhow!("{}: {why}", show_path(path))
    } else {
        anyhow!("{} ({what}): {why}", show_path(path))
    }
}

/// A kubeconfig, or a file it names, read where root could have written it alone
/// ([`crate::config::owned_safely`]); `what` names it in the error.
fn owned_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    crate::config::read_owned_safely(path, MAX_FILE, what, KUBECONFIG_RISK)
}

/// The HTTPS client to the API, and the client certificate it was made with: made again
/// where the certificate on disk changed (the kubelet rotates its own in place).
#[derive(Default)]
pub struct Session {
    held: Option<(Client, Option<Vec<u8>>)>,
}

impl Session {
    /// The client for the next requests.
    fn client(&mut self, api: &Api) -> anyhow::Result<Client> {
        let pem = api.cert.as_ref().map(ClientCert::pem).transpose()?;
        if let Some((client, with)) = &self.held
            && *with == pem
        {
            return Ok(client.clone());
        }
        let client = api.client(pem.as_deref())?;
        self.held = Some((client.clone(), pem));
        Ok(client)
    }
}

/// Checks what the service would use to write the Node condition, as it would set it up:
/// `config check`'s question. Beyond the service's own start, it makes the HTTPS client
/// (what the service makes before its first write) and refuses a node name that a kubelet's
/// certificate is not for (the API's Node authorizer would refuse every write).
pub fn check(settings: &Settings) -> anyhow::Result<()> {
    let Some(api) = target(settings)? else {
        if let Some(why) = unreadable_secret(settings) {
            bail!("{why}");
        }
        return Ok(());
    };
    let pem = api.cert.as_ref().map(ClientCert::pem).transpose()?;
    api.client(pem.as_deref())?;
    if let Some(cert_node) = api.cert_node()
        && cert_node != api.node
    {
        bail!(
            "the node name {:?} (kubernetes.node_name, else NODE_NAME or the host name) is not the client certificate's node, {:?} (CN system:node:{}), and the API lets a node's certificate write its own Node only: set kubernetes.node_name = {:?}, or name node {:?}'s own kubeconfig ({})",
            crate::model::text::escape(&api.node),
            crate::model::text::escape(&cert_node),
            crate::model::text::escape(&cert_node),
            crate::model::text::escape(&cert_node),
            crate::model::text::escape(&api.node),
            api.cert.as_ref().map(ClientCert::shown).unwrap_or_default()
        );
    }
    Ok(())
}

/// Why the licensing Secret the config names cannot be read: there is no API to read it from.
pub fn unreadable_secret(settings: &Settings) -> Option<String> {
    let name = settings.kubernetes.licensing_secret.as_ref()?;
    Some(format!(
        "kubernetes.licensing_secret = \"{name}\" is set, but the agent has no Kubernetes API to read it from: run it in a pod with a service account, or name kubernetes.kubeconfig, and leave kubernetes.node_condition on"
    ))
}

impl Api {
    /// A client that trusts the API's CA alone, and shows the client certificate `pem`
    /// (key and certificate) where there is one.
    fn client(&self, pem: Option<&[u8]>) -> anyhow::Result<Client> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = reqwest::Certificate::from_pem_bundle(&self.ca_pem)
            .map_err(|_| anyhow!("the API's CA is not a PEM certificate bundle"))?;
        let mut builder = Client::builder();
        if let Some(pem) = pem {
            builder = builder.identity(identity_of(pem)?);
        }
        builder
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .user_agent(concat!("vgpu-license-agent/", env!("CARGO_PKG_VERSION")))
            .tls_certs_only(certs)
            // An API server never redirects: the bearer token goes to it and nowhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| anyhow!("cannot set up HTTPS to the API: {}", crate::http::chain(e)))
    }

    /// `request` with the bearer token, where the agent has one (a client certificate goes
    /// with the connection).
    fn authed(&self, request: RequestBuilder) -> anyhow::Result<RequestBuilder> {
        Ok(match &self.token {
            Some(b) => request.bearer_auth(Self::bearer(b)?),
            None => request,
        })
    }

    fn bearer(token: &Bearer) -> anyhow::Result<String> {
        match token {
            Bearer::Literal(t) => Ok(t.clone()),
            Bearer::File(p) => input::read_file(p, MAX_FILE, Links::Follow)
                .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                .map_err(|e| {
                    anyhow!(
                        "cannot read the service account's token {}: {e}",
                        show_path(p)
                    )
                }),
            Bearer::KubeconfigFile(p) => owned_file(p, "the kubeconfig's tokenFile")
                .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                .map_err(|e| file_error(p, "the kubeconfig's tokenFile", &e)),
        }
    }

    /// The API's URL with these path segments (each escaped as one segment).
    fn path_url(&self, segments: &[&str]) -> anyhow::Result<Url> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|_| anyhow!("the API's URL cannot take a path"))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    fn url(&self, status: bool) -> anyhow::Result<Url> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|_| anyhow!("the API's URL cannot take a path"))?
            .pop_if_empty()
            .extend(["api", "v1", "nodes", &self.node]);
        if status {
            url.path_segments_mut()
                .map_err(|_| anyhow!("the API's URL cannot take a path"))?
                .push("status");
        }
        Ok(url)
    }

    /// The Node as the API has it now.
    async fn get_node(&self, client: &Client) -> anyhow::Result<Value> {
        let mut resp = self
            .authed(client.get(self.url(false)?))?
            .send()
            .await
            .map_err(|e| anyhow!("GET node {}: {}", self.node, crate::http::chain(e)))?;
        let code = resp.status();
        if !code.is_success() {
            let fix = match code.as_u16() {
                401 => self.fix_401(),
                403 => self.fix_403("get on nodes: see deploy/kubernetes/"),
                _ => not_followed(code).to_string(),
            };
            bail!("GET node {}: HTTP {code}{fix}", self.node);
        }
        let bytes = crate::http::body_capped(&mut resp, MAX_ANSWER)
            .await
            .map_err(|e| anyhow!("GET node {}: {}", self.node, answer_error(e, "a Node")))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| anyhow!("GET node {}: not a Node: {e}", self.node))
    }

    /// The condition as the Node has it now: its status and last transition.
    async fn current(&self, client: &Client) -> anyhow::Result<Option<(String, String)>> {
        let node = self.get_node(client).await?;
        Ok(node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == TYPE))
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["lastTransitionTime"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            }))
    }

    /// Puts the agent's taint on the Node, or takes it off (`want`), every other taint left
    /// as it is: a merge patch of `spec.taints` made from the Node just read, sent with its
    /// `resourceVersion`, so that a taint another writer added meanwhile is never lost (the
    /// API answers 409, and the next try reads again). Returns whether it changed anything.
    async fn sync_taint(&self, client: &Client, want: bool) -> anyhow::Result<bool> {
        let node = self.get_node(client).await?;
        let current = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let Some(taints) = crate::model::node::condition::taints(&current, want) else {
            return Ok(false);
        };
        let body = json!({
            "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
            "spec": {"taints": taints},
        });
        self.send_patch(
            client,
            false,
            "application/merge-patch+json",
            &body,
            &self.fix_403("patch on nodes for kubernetes.taint_unlicensed: see deploy/kubernetes/daemonset-taint/"),
        )
        .await?;
        Ok(true)
    }

    async fn patch(&self, client: &Client, body: &Value) -> anyhow::Result<()> {
        self.send_patch(
            client,
            true,
            "application/strategic-merge-patch+json",
            body,
            &self.fix_403("patch on nodes/status: see deploy/kubernetes/"),
        )
        .await
    }

    /// The node a kubelet's client certificate is for (CN `system:node:NAME`), where the
    /// agent shows one.
    fn cert_node(&self) -> Option<String> {
        let cn = self.cert.as_ref()?.check().ok()??;
        cn.strip_prefix("system:node:").map(String::from)
    }

    /// What a 403 asks for, naming the credential the API refused: a node's certificate for
    /// another node, or the permission `needs` for the agent's user.
    fn fix_403(&self, needs: &str) -> String {
        match (&self.cert, self.cert_node()) {
            (Some(cert), Some(n)) if n != self.node => format!(
                " (the client certificate, {}, is node {:?}'s, and the API lets a node's certificate write its own Node only: set kubernetes.node_name = {:?}, or use node {:?}'s own kubeconfig)",
                cert.shown(),
                crate::model::text::escape(&n),
                crate::model::text::escape(&n),
                crate::model::text::escape(&self.node)
            ),
            (Some(cert), _) => format!(
                " (the user of the client certificate, {}, needs {needs})",
                cert.shown()
            ),
            (None, _) => format!(" (the service account needs {needs})"),
        }
    }

    /// What a 401 means: the API knows the credential no more (expired, withdrawn), named.
    fn fix_401(&self) -> String {
        let token = match &self.token {
            Some(Bearer::File(p)) => format!("the service account's token {}", show_path(p)),
            Some(Bearer::KubeconfigFile(p)) => {
                format!("the kubeconfig's tokenFile {}", show_path(p))
            }
            Some(Bearer::Literal(_)) => "the kubeconfig's token".to_string(),
            None => String::new(),
        };
        let cert = self.cert.as_ref().map(|c| {
            format!(
                "the client certificate, {} (its dates: openssl x509 -noout -subject -dates -in FILE; a withdrawn one needs the kubelet's rotation or a new one)",
                c.shown()
            )
        });
        let named: Vec<String> = [Some(token).filter(|t| !t.is_empty()), cert]
            .into_iter()
            .flatten()
            .collect();
        format!(
            " (the API did not accept the credential: check {})",
            named.join(", and ")
        )
    }

    /// PATCHes the Node (`status`: its status subresource) with `body` of `content_type`;
    /// an error answer is one line: the code, the API's message, and `fix_403` where RBAC
    /// refused it.
    async fn send_patch(
        &self,
        client: &Client,
        status: bool,
        content_type: &str,
        body: &Value,
        fix_403: &str,
    ) -> anyhow::Result<()> {
        let what = format!(
            "PATCH node {}{}",
            self.node,
            if status { "/status" } else { "" }
        );
        let mut resp = self
            .authed(client.patch(self.url(status)?))?
            .header("Content-Type", content_type)
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| anyhow!("{what}: {}", crate::http::chain(e)))?;
        let code = resp.status();
        if code.is_success() {
            return Ok(());
        }
        let why = crate::http::body_capped(&mut resp, MAX_ERROR)
            .await
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["message"].as_str().map(String::from))
            .map(|m| format!(": {}", crate::model::text::escape(&m)))
            .unwrap_or_default();
        let fix_401 = self.fix_401();
        let fix = match code.as_u16() {
            401 => fix_401.as_str(),
            403 => fix_403,
            // Written with the resourceVersion read just before: the next try reads again.
            409 => " (the Node changed meanwhile: tried again)",
            _ => not_followed(code),
        };
        bail!("{what}: HTTP {code}{why}{fix}")
    }
}

/// What a redirect from the API gets: not followed, and said.
fn not_followed(code: reqwest::StatusCode) -> &'static str {
    if code.is_redirection() {
        " (a redirect: the agent follows none from the API server, whose answers come from its own address; check the server's URL)"
    } else {
        ""
    }
}

/// An answer's body that could not be read whole; `what` is the object asked for (`a
/// Node`, `a Secret`).
fn answer_error(e: crate::http::BodyError, what: &str) -> String {
    match e {
        crate::http::BodyError::TooLarge => format!(
            "the answer is larger than {} bytes, far more than {what}: refused",
            MAX_ANSWER
        ),
        crate::http::BodyError::Broken(e) => crate::http::chain(e),
    }
}
