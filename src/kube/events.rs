//! Kubernetes Events on KubeVirt's VirtualMachineInstances, from a vGPU host: at each change
//! of a VM's vGPU license the host's agent creates one Event on the VMI that runs the VM
//! (`Warning` `VgpuRestricted` / `VgpuUnlicensed`, `Normal` `VgpuLicensed`, source component
//! `vgpu-license-agent`), so that a tenant sees it in `kubectl describe vmi` and the platform
//! team in its event pipeline.
//!
//! Which VMI: virt-launcher names the libvirt domain `NAMESPACE_NAME` (the model's `host`
//! reads it), and the VM UUID the vGPU manager shows is the VMI's
//! `spec.domain.firmware.uuid`: the VMI is read first, and an Event goes to it only where the
//! two agree (a VMI made again under the same name is another VM). What the agent needs: get
//! on `virtualmachineinstances.kubevirt.io`, create on `events`, nothing more
//! (deploy/kubernetes/host/).

use anyhow::{Context, anyhow, bail};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{Api, MAX_ANSWER, MAX_ERROR, Session};
use crate::model::text::escape;

/// The component Events name as their source.
pub const COMPONENT: &str = "vgpu-license-agent";

pub use crate::model::host::VmEvent;

/// How many Events may wait for the API: a host's changes are few; past this (the API down
/// for long while VMs come and go), the newest are dropped, and said.
const QUEUE: usize = 64;

/// Where the service sends the Events it decides; they are created one after the other.
pub fn spawn_sender(api: Api, stop: tokio::sync::watch::Receiver<bool>) -> Sender {
    let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
    tokio::spawn(send_all(api, rx, stop));
    Sender(tx)
}

/// The service's end of the Events' queue.
pub struct Sender(tokio::sync::mpsc::Sender<VmEvent>);

impl Sender {
    /// Queues `e` (dropped, and said, when the queue is full).
    pub fn send(&self, e: VmEvent) {
        if self.0.try_send(e).is_err() {
            tracing::warn!(
                "an Event on a VMI was dropped: {QUEUE} wait for the API already (is it reachable?)"
            );
        }
    }
}

/// Creates each queued Event until `stop`; a failure is a warning once per streak, never a
/// retry (the next change of the VM makes the next Event).
async fn send_all(
    api: Api,
    mut rx: tokio::sync::mpsc::Receiver<VmEvent>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut session = Session::default();
    let mut failing = false;
    loop {
        let e = tokio::select! {
            e = rx.recv() => match e { Some(e) => e, None => return },
            _ = stop.changed() => return,
        };
        match post(&api, &mut session, &e, Utc::now()).await {
            Ok(()) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("Events on VMIs are created again");
                }
            }
            Err(err) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!("an Event on a VMI was not created: {err:#}");
                }
            }
        }
    }
}

/// The VMI as the API has it: its uid and resourceVersion, for the Event's involvedObject.
struct Vmi {
    uid: String,
    resource_version: Option<String>,
}

/// Creates the Event `e` on its VMI, dated `now`; an error is one line: what was refused and
/// what to do.
pub async fn post(
    api: &Api,
    session: &mut Session,
    e: &VmEvent,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let client = session.client(api)?;
    let vmi = get_vmi(api, &client, e).await?;
    let at = crate::model::time::rfc3339(now);
    let body = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": format!("{}.", e.vmi), "namespace": e.namespace},
        "involvedObject": {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "name": e.vmi,
            "namespace": e.namespace,
            "uid": vmi.uid,
            "resourceVersion": vmi.resource_version,
        },
        "reason": e.reason,
        "message": e.message,
        "type": if e.warning { "Warning" } else { "Normal" },
        "source": {"component": COMPONENT, "host": api.node},
        "reportingComponent": COMPONENT,
        "reportingInstance": api.node,
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    });
    let url = api.path_url(&["api", "v1", "namespaces", &e.namespace, "events"])?;
    let what = format!("POST event on vmi {}/{}", e.namespace, e.vmi);
    let request = api
        .authed(client.post(url))?
        .header("Content-Type", "application/json")
        .body(body.to_string());
    answered(&what, request).await?;
    Ok(())
}

/// Sends `request`: the answer where it is a success, else one line naming `what`, the HTTP
/// status, the API's message and the fix.
async fn answered(
    what: &str,
    request: reqwest::RequestBuilder,
) -> anyhow::Result<reqwest::Response> {
    let mut resp = request
        .send()
        .await
        .map_err(|err| anyhow!("{what}: {}", crate::http::chain(err)))?;
    let code = resp.status();
    if !code.is_success() {
        bail!("{what}: HTTP {code}{}", refused(&mut resp, code).await);
    }
    Ok(resp)
}

/// The VMI `e` names, confirmed by its firmware UUID.
async fn get_vmi(api: &Api, client: &reqwest::Client, e: &VmEvent) -> anyhow::Result<Vmi> {
    let url = api.path_url(&[
        "apis",
        "kubevirt.io",
        "v1",
        "namespaces",
        &e.namespace,
        "virtualmachineinstances",
        &e.vmi,
    ])?;
    let what = format!("GET vmi {}/{}", e.namespace, e.vmi);
    let mut resp = answered(&what, api.authed(client.get(url))?).await?;
    let bytes = crate::http::body_capped(&mut resp, MAX_ANSWER)
        .await
        .map_err(|err| anyhow!("{what}: {}", super::answer_error(err, "a VMI")))?;
    let v: Value = serde_json::from_slice(&bytes).with_context(|| format!("{what}: not a VMI"))?;
    let firmware = v["spec"]["domain"]["firmware"]["uuid"].as_str();
    if let (Some(theirs), Some(ours)) = (firmware, e.vm_uuid.as_deref())
        && !theirs.eq_ignore_ascii_case(ours)
    {
        bail!(
            "{what}: its firmware UUID {} is not the VM's {} that the vGPU manager shows: another VM under that name, no Event",
            escape(theirs),
            escape(ours)
        );
    }
    let uid = v["metadata"]["uid"]
        .as_str()
        .filter(|u| !u.is_empty())
        .with_context(|| format!("{what}: the VMI has no uid"))?;
    Ok(Vmi {
        uid: uid.to_string(),
        resource_version: v["metadata"]["resourceVersion"].as_str().map(String::from),
    })
}

/// An error answer in a line: the API's message, and the RBAC the agent needs on a 403.
async fn refused(resp: &mut reqwest::Response, code: reqwest::StatusCode) -> String {
    let message = crate::http::body_capped(resp, MAX_ERROR)
        .await
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| v["message"].as_str().map(String::from))
        .map(|m| format!(": {}", escape(&m)))
        .unwrap_or_default();
    let fix = match code.as_u16() {
        403 => {
            " (the host agent needs get on virtualmachineinstances.kubevirt.io and create on events: see deploy/kubernetes/host/)"
        }
        404 => " (no such VMI: the VM is gone, or its name is not virt-launcher's NAMESPACE_NAME)",
        _ => "",
    };
    format!("{message}{fix}")
}
