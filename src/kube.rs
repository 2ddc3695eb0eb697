//! The Kubernetes API, as far as the agent needs it: the `VgpuLicensed` condition on its own
//! Node, written through the `nodes/status` subresource with a strategic merge patch (merged
//! by the condition's type, so that every other condition stays as it is, as
//! node-problem-detector writes its own).
//!
//! Where: in a pod, the in-cluster API (`KUBERNETES_SERVICE_HOST`/`_PORT`) with the service
//! account's token and CA; on a host, the kubeconfig `kubernetes.kubeconfig` names (its JSON
//! form, a bearer token). Nothing is written anywhere else.
//!
//! What it trusts: a kubeconfig, and the files it names, only where root could have written
//! them (owned by root or the agent's user, writable by nobody else: the config's rule), since
//! it says where root's credentials go; a node name only where it is an RFC 1123 subdomain;
//! no redirect from the API (an API server never sends one: the bearer token goes to the
//! server named and nowhere else); an answer of at most [`MAX_ANSWER`] bytes. The writer runs apart from the
//! rest of the service: an API that is down, slow or answers 403 is a warning in the journal
//! and the counter `vgpu_license_node_condition_errors_total`, retried with backoff, never a
//! stall of anything else.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use chrono::{DateTime, Utc};
use reqwest::{Client, Url};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::config::{Settings, Switch};
use crate::input::{self, Links};
use crate::node_condition::{Condition, Outcome, TYPE};
use crate::text::show_path;

/// The longest wait between two tries after failures.
const BACKOFF_MAX: Duration = Duration::from_secs(300);
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
    token: Bearer,
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

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
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
    let (base, ca_pem, token) = match &k.kubeconfig {
        Some(path) => from_kubeconfig(path)?,
        None => match in_cluster(k)? {
            Some(found) => found,
            None => return Ok(None),
        },
    };
    let node = k.node_name
        .clone()
        .or_else(crate::node::node_name)
        .context("no node name: set kubernetes.node_name, or NODE_NAME from the pod's downward API (spec.nodeName)")?;
    if let Some(why) = crate::node_condition::node_name_problem(&node) {
        bail!(
            "the node name {:?} {why}; set kubernetes.node_name, or NODE_NAME from the pod's downward API (spec.nodeName)",
            crate::text::escape(&node)
        );
    }
    Ok(Some(Api {
        base,
        ca_pem,
        token,
        node,
        heartbeat: k.heartbeat,
        taint: k.taint_unlicensed,
    }))
}

/// The in-cluster API, its CA and the service account's token, where the agent runs in a
/// pod with a service account; `None` elsewhere (an error where `node_condition = "on"`).
fn in_cluster(k: &crate::config::Kubernetes) -> anyhow::Result<Option<(Url, Vec<u8>, Bearer)>> {
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
    Ok(Some((base, ca_pem, Bearer::File(sa.join("token")))))
}

/// A kubeconfig's current context: its server, CA and bearer token. Its JSON form only (a
/// YAML parser would double the agent's size for one file).
fn from_kubeconfig(path: &Path) -> anyhow::Result<(Url, Vec<u8>, Bearer)> {
    let shown = show_path(path);
    let bytes =
        owned_file(path, "the file").map_err(|e| anyhow!("kubernetes.kubeconfig {shown}: {e}"))?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| {
        anyhow!(
            "kubernetes.kubeconfig {shown} is not a kubeconfig in JSON form; write that form with `kubectl config view --raw --minify --flatten -o json > {shown}`"
        )
    })?;
    let named = |list: &str, name: &str| {
        v[list]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == name))
            .cloned()
    };
    let current = v["current-context"].as_str().unwrap_or_default();
    let context = named("contexts", current).with_context(|| {
        format!("kubernetes.kubeconfig {shown}: no context named by current-context ({current:?})")
    })?;
    let cluster_name = context["context"]["cluster"].as_str().unwrap_or_default();
    let user_name = context["context"]["user"].as_str().unwrap_or_default();
    let cluster = named("clusters", cluster_name)
        .with_context(|| format!("kubernetes.kubeconfig {shown}: no cluster {cluster_name:?}"))?;
    let user = named("users", user_name)
        .with_context(|| format!("kubernetes.kubeconfig {shown}: no user {user_name:?}"))?;
    let server = cluster["cluster"]["server"].as_str().unwrap_or_default();
    let base = Url::parse(server)
        .ok()
        .filter(|u| u.scheme() == "https")
        .with_context(|| {
            format!("kubernetes.kubeconfig {shown}: the cluster's server is not an https URL")
        })?;
    let ca_pem = kubeconfig_ca(&cluster["cluster"], &shown)?;
    let token = kubeconfig_token(&user["user"], &shown)?;
    Ok((base, ca_pem, token))
}

/// A kubeconfig, or a file it names, read where root could have written it alone
/// ([`crate::config::owned_safely`]); `what` names it in the error.
fn owned_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    crate::config::read_owned_safely(path, MAX_FILE, what, KUBECONFIG_RISK)
}

/// Checks what the service would use to write the Node condition, as it would set it up:
/// `config check`'s question.
pub fn check(settings: &Settings) -> anyhow::Result<()> {
    target(settings).map(|_| ())
}

/// The cluster's certificate authority, as a kubeconfig gives it: its data, or its file.
fn kubeconfig_ca(cluster: &Value, shown: &str) -> anyhow::Result<Vec<u8>> {
    Ok(
        match (
            cluster["certificate-authority-data"].as_str(),
            cluster["certificate-authority"].as_str(),
        ) {
            (Some(data), _) => base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|_| {
                    anyhow!(
                        "kubernetes.kubeconfig {shown}: certificate-authority-data is not base64"
                    )
                })?,
            (None, Some(file)) => owned_file(Path::new(file), "its certificate-authority")
                .map_err(|e| {
                    anyhow!(
                        "kubernetes.kubeconfig {shown}: {e} ({})",
                        show_path(Path::new(file))
                    )
                })?,
            (None, None) => bail!(
                "kubernetes.kubeconfig {shown}: the cluster names no certificate authority (certificate-authority-data)"
            ),
        },
    )
}

/// The user's bearer token, as a kubeconfig gives it: the token, or its file.
fn kubeconfig_token(user: &Value, shown: &str) -> anyhow::Result<Bearer> {
    Ok(match (user["token"].as_str(), user["tokenFile"].as_str()) {
        (Some(t), _) if !t.is_empty() => Bearer::Literal(t.to_string()),
        (_, Some(f)) => {
            let path = PathBuf::from(f);
            // Checked now, so that `config check` and the start say it, and at each read.
            owned_file(&path, "its tokenFile").map_err(|e| {
                anyhow!("kubernetes.kubeconfig {shown}: {e} ({})", show_path(&path))
            })?;
            Bearer::KubeconfigFile(path)
        }
        _ => bail!(
            "kubernetes.kubeconfig {shown}: the user has no bearer token (token or tokenFile); client certificates and exec plugins are not read: give it a service account's token"
        ),
    })
}

impl Api {
    fn client(&self) -> anyhow::Result<Client> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = reqwest::Certificate::from_pem_bundle(&self.ca_pem)
            .map_err(|_| anyhow!("the API's CA is not a PEM certificate bundle"))?;
        Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .user_agent(concat!("vgpu-license-agent/", env!("CARGO_PKG_VERSION")))
            .tls_certs_only(certs)
            // An API server never redirects: the bearer token goes to it and nowhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| anyhow!("cannot set up HTTPS to the API: {}", crate::http::chain(e)))
    }

    fn bearer(&self) -> anyhow::Result<String> {
        match &self.token {
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
                .map_err(|e| anyhow!("{e} ({})", show_path(p))),
        }
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
        let mut resp = client
            .get(self.url(false)?)
            .bearer_auth(self.bearer()?)
            .send()
            .await
            .map_err(|e| anyhow!("GET node {}: {}", self.node, crate::http::chain(e)))?;
        let code = resp.status();
        if !code.is_success() {
            bail!("GET node {}: HTTP {code}{}", self.node, not_followed(code));
        }
        let bytes = crate::http::body_capped(&mut resp, MAX_ANSWER)
            .await
            .map_err(|e| anyhow!("GET node {}: {}", self.node, answer_error(e)))?;
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
        let Some(taints) = crate::node_condition::taints(&current, want) else {
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
            " (with kubernetes.taint_unlicensed the service account needs patch on nodes: see deploy/kubernetes/daemonset-taint/)",
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
            " (the service account needs patch on nodes/status: see deploy/kubernetes/)",
        )
        .await
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
        let mut resp = client
            .patch(self.url(status)?)
            .bearer_auth(self.bearer()?)
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
            .map(|m| format!(": {}", crate::text::escape(&m)))
            .unwrap_or_default();
        let fix = match code.as_u16() {
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

/// An answer's body that could not be read whole.
fn answer_error(e: crate::http::BodyError) -> String {
    match e {
        crate::http::BodyError::TooLarge => format!(
            "the answer is larger than {} bytes, far more than a Node: refused",
            MAX_ANSWER
        ),
        crate::http::BodyError::Broken(e) => crate::http::chain(e),
    }
}

/// How long the node has been up (`/proc/uptime`); zero when it cannot be read.
fn uptime() -> Duration {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map_or(Duration::ZERO, Duration::from_secs_f64)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    crate::time::rfc3339(t)
}

/// The patch that sets the condition, merged by its type.
fn body(c: &Condition, transition: &str, heartbeat: &str) -> Value {
    json!({"status": {"conditions": [{
        "type": TYPE,
        "status": c.status,
        "reason": c.reason,
        "message": c.message,
        "lastTransitionTime": transition,
        "lastHeartbeatTime": heartbeat,
    }]}})
}

/// Writes the condition `rx` holds whenever it changes and at least every heartbeat
/// (`kubernetes.heartbeat_seconds`),
/// until `stop`; each outcome is told to `tell`. After a failure it tries again with backoff
/// (5 s, doubling, at most 5 min).
pub async fn write_condition(
    api: Api,
    mut rx: watch::Receiver<Option<Condition>>,
    tell: impl Fn(Outcome),
    mut stop: watch::Receiver<bool>,
) {
    let client = match api.client() {
        Ok(c) => c,
        Err(e) => {
            tell(Outcome {
                condition: Some(Err(format!("{e:#}"))),
                taint: None,
            });
            return;
        }
    };
    let mut node = NodeWriter {
        api,
        client,
        written: None,
        since: None,
        known: None,
        tainted: None,
        backoff: Duration::from_secs(5),
        retry_at: None,
    };
    loop {
        let wait = node.next_write();
        let changed = tokio::select! {
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
                true
            }
            _ = tokio::time::sleep_until(wait) => false,
            _ = stop.changed() => return,
        };
        let Some(cond) = rx.borrow_and_update().clone() else {
            continue;
        };
        node.note(&cond);
        if changed && node.holds(&cond) {
            continue;
        }
        let outcome = node.write(&cond).await;
        node.settle(&outcome);
        tell(outcome);
    }
}

/// The status the Node should show, and since when (`lastTransitionTime`, RFC 3339).
struct Since {
    status: &'static str,
    at: String,
}

/// The writer's view of its Node: what it wrote, what the Node had, and when to try again.
struct NodeWriter {
    api: Api,
    client: Client,
    /// The condition last written, when, and its `lastTransitionTime`: what the Node shows.
    written: Option<(Condition, tokio::time::Instant, String)>,
    /// The status to show and since when: taken when the status changes, kept across
    /// failed tries, so that `lastTransitionTime` is the change's time, not a retry's.
    since: Option<Since>,
    /// What the Node has: its condition's status and last transition (read once, then kept).
    known: Option<Option<(String, String)>>,
    /// Whether the Node carries the taint, as the agent last made it (`None`: not known).
    tainted: Option<bool>,
    backoff: Duration,
    retry_at: Option<tokio::time::Instant>,
}

impl NodeWriter {
    /// When to write next without a change: the retry after a failure, else the heartbeat.
    fn next_write(&self) -> tokio::time::Instant {
        match self.retry_at {
            Some(t) => t,
            None => tokio::time::Instant::now() + self.api.heartbeat,
        }
    }

    /// Whether the Node holds this condition already, with no retry owed.
    fn holds(&self, cond: &Condition) -> bool {
        let same = self.written.as_ref().is_some_and(|(w, _, _)| w == cond);
        same && self.retry_at.is_none()
    }

    /// A condition to show: its status's time is taken now where the status changed.
    fn note(&mut self, cond: &Condition) {
        if self.since.as_ref().is_none_or(|s| s.status != cond.status) {
            self.since = Some(Since {
                status: cond.status,
                at: rfc3339(Utc::now()),
            });
        }
    }

    /// The condition's `lastTransitionTime`: the time the Node shows where it shows this
    /// status already (what this writer wrote last, else what the Node had when first read:
    /// a change that never reached it, or an agent restarted), else when the status changed.
    fn transition(&mut self, cond: &Condition) -> String {
        self.note(cond);
        let shown = match &self.written {
            Some((w, _, at)) => Some((w.status, at.as_str())),
            None => self
                .known
                .as_ref()
                .and_then(|k| k.as_ref())
                .map(|(s, at)| (s.as_str(), at.as_str())),
        };
        match shown {
            Some((status, at)) if status == cond.status && !at.is_empty() => at.to_string(),
            _ => self
                .since
                .as_ref()
                .map_or_else(String::new, |s| s.at.clone()),
        }
    }

    /// Writes the condition (unless the Node holds it and no heartbeat is due) and the
    /// taint (where it is kept and owed).
    async fn write(&mut self, cond: &Condition) -> Outcome {
        let fresh = self
            .written
            .as_ref()
            .is_some_and(|(w, at, _)| w == cond && at.elapsed() < self.api.heartbeat);
        let condition = if fresh {
            None
        } else {
            let result = self.write_condition(cond).await;
            Some(
                result
                    .map(|transition| {
                        self.written =
                            Some((cond.clone(), tokio::time::Instant::now(), transition));
                    })
                    .map_err(|e| format!("{e:#}")),
            )
        };
        let taint = if matches!(condition, Some(Err(_))) {
            None
        } else {
            self.keep_taint(cond).await
        };
        Outcome { condition, taint }
    }

    /// Patches the condition: its `lastTransitionTime`.
    async fn write_condition(&mut self, cond: &Condition) -> anyhow::Result<String> {
        if self.known.is_none() {
            self.known = Some(self.api.current(&self.client).await?);
        }
        let transition = self.transition(cond);
        let now = rfc3339(Utc::now());
        self.api
            .patch(&self.client, &body(cond, &transition, &now))
            .await?;
        Ok(transition)
    }

    /// The taint, only when what it should be changed: a taint taken off by hand stays off
    /// until the license changes again. `None` where nothing was owed.
    async fn keep_taint(&mut self, cond: &Condition) -> Option<(bool, Result<(), String>)> {
        let want = self.api.taint && crate::node_condition::wants_taint(cond, uptime());
        if !self.api.taint || self.tainted == Some(want) {
            return None;
        }
        let result = match self.api.sync_taint(&self.client, want).await {
            Ok(changed) => {
                if changed {
                    tracing::info!(
                        "{} the taint {}:{} {} node {}",
                        if want { "put" } else { "took" },
                        crate::node_condition::TAINT_KEY,
                        crate::node_condition::TAINT_EFFECT,
                        if want { "on" } else { "off" },
                        crate::text::escape(&self.api.node)
                    );
                }
                self.tainted = Some(want);
                Ok(())
            }
            Err(e) => Err(format!("{e:#}")),
        };
        Some((want, result))
    }

    /// What a write leaves: a try again after the backoff where a part of it failed.
    fn settle(&mut self, outcome: &Outcome) {
        if outcome.failed() {
            self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
            self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        } else {
            self.backoff = Duration::from_secs(5);
            self.retry_at = None;
        }
    }
}
