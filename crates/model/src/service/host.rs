//! The service on a vGPU host: its report is its VMs' vGPUs ([`crate::host`]), each with
//! the state the service saw it in and since when, one journal line at each VM's change of
//! state, and the host's rule: the agent changes nothing there (no gridd to restart, no
//! token to adopt, no lease to probe a DLS for).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::info;

use super::{Core, Effect, Now};
use crate::config::ServiceRole;
use crate::report::{Report, Vm, VmState};

/// How soon after a line of the vGPU manager nvidia-smi is read: its other lines of the
/// same change (a VM's start logs a dozen) come within it, and one reading shows them all.
const AFTER_VGPU_MGR_LINE: Duration = Duration::from_millis(500);

/// The most vGPUs remembered: far above what one host runs (a GPU holds at most a few
/// dozen), so that no output, however long, makes the memory grow without end.
const MAX_VGPUS: usize = 4096;

/// A vGPU, as the service tells it from the others: its VM's UUID and its vGPU ID (a VM
/// may hold several vGPUs; the same ID on another VM is another vGPU).
type Key = (String, String);

/// Each vGPU of the latest host reading: the state it is in, since when, and its VM's name
/// for the journal.
#[derive(Debug, Default)]
pub(super) struct VmMemory {
    seen: HashMap<Key, Seen>,
}

#[derive(Debug, Clone)]
struct Seen {
    state: VmState,
    since: DateTime<Utc>,
    name: String,
    vgpu_id: String,
}

fn key(v: &Vm) -> Key {
    (
        v.vm_uuid.clone().unwrap_or_default(),
        v.vgpu_id.clone().unwrap_or_default(),
    )
}

impl VmMemory {
    /// A host's report: since when each vGPU is in its state, and a journal line for each
    /// change since the last report. A report without `vms` (nvidia-smi failed) leaves the
    /// memory as it is: a VM is gone when a reading no longer lists it, not when none came.
    /// The Events for KubeVirt's VMs are what comes back.
    pub(super) fn remember(&mut self, report: &mut Report, now: DateTime<Utc>) -> Vec<Effect> {
        let Some(vms) = report.vms.as_mut() else {
            return Vec::new();
        };
        let at = report.observed_at.unwrap_or(now);
        let before: HashMap<Key, VmState> = self
            .seen
            .iter()
            .map(|(k, s)| (k.clone(), s.state))
            .collect();
        let changes = self.update(vms, at);
        // An Event on each KubeVirt VM's VMI at a change of its license.
        let events = vms
            .iter()
            .filter_map(|v| {
                crate::host::vm_event(v, before.get(&key(v)).copied())
                    .map(|e| Effect::VmEvent(Box::new(e)))
            })
            .collect();
        for (name, vgpu_id, before, after) in changes {
            info!(
                vgpu_license_vm = crate::text::escape(&name).as_ref(),
                vgpu_license_vgpu_id = crate::text::escape(&vgpu_id).as_ref(),
                vgpu_license_vm_state = after.map_or("gone", VmState::as_str),
                vgpu_license_vm_previous_state = before.map_or("none", VmState::as_str),
                "{}",
                vm_change_line(&name, &vgpu_id, before, after)
            );
        }
        events
    }

    /// The host's reading in `vms`, seen at `at`: each vGPU's `since` filled from what was
    /// seen before (a vGPU new, or in a new state, is so since `at`), and the changes, for
    /// the journal: `(name, vGPU ID, previous state, state)`, `None` for a vGPU new or gone.
    fn update(
        &mut self,
        vms: &mut [Vm],
        at: DateTime<Utc>,
    ) -> Vec<(String, String, Option<VmState>, Option<VmState>)> {
        let mut changes = Vec::new();
        let mut now = HashMap::with_capacity(vms.len().min(MAX_VGPUS));
        for v in vms.iter_mut() {
            let k = key(v);
            let before = self.seen.remove(&k);
            let since = match &before {
                Some(b) if b.state == v.state => b.since,
                _ => at,
            };
            v.since = Some(since);
            let seen = Seen {
                state: v.state,
                since,
                name: v.name(),
                vgpu_id: v.vgpu_id.clone().unwrap_or_else(|| "with no ID".into()),
            };
            if before.as_ref().is_none_or(|b| b.state != v.state) {
                changes.push((
                    seen.name.clone(),
                    seen.vgpu_id.clone(),
                    before.map(|b| b.state),
                    Some(v.state),
                ));
            }
            if now.len() < MAX_VGPUS {
                now.insert(k, seen);
            }
        }
        // Those left are gone: their VM stopped, or its vGPU was taken away.
        let mut gone: Vec<Seen> = self.seen.drain().map(|(_, s)| s).collect();
        gone.sort_by(|a, b| (&a.name, &a.vgpu_id).cmp(&(&b.name, &b.vgpu_id)));
        changes.extend(
            gone.into_iter()
                .map(|s| (s.name, s.vgpu_id, Some(s.state), None)),
        );
        self.seen = now;
        changes
    }
}

/// One VM's change of state, as the journal says it: `VM tenant-b/vm-b (vGPU 3251637566):
/// unlicensed -> restricted`; a vGPU first seen `(new)`, one gone `gone (was licensed)`.
/// Only this VM's states, escaped.
pub fn vm_change_line(
    name: &str,
    vgpu_id: &str,
    before: Option<VmState>,
    after: Option<VmState>,
) -> String {
    let what = match (before, after) {
        (Some(b), Some(a)) => format!("{} -> {}", b.as_str(), a.as_str()),
        (None, Some(a)) => format!("{} (new)", a.as_str()),
        (Some(b), None) => format!("gone (was {})", b.as_str()),
        (None, None) => "gone".to_string(),
    };
    format!(
        "VM {} (vGPU {}): {what}",
        crate::text::escape(name),
        crate::text::escape(vgpu_id)
    )
}

impl Core {
    /// Whether the service works as a vGPU host's: `service.role = "host"`, or, in `auto`,
    /// the latest answer of nvidia-smi was a host's (`Virtualization Mode : Host VGPU`).
    pub fn is_host(&self) -> bool {
        match self.settings.service.role {
            ServiceRole::Host => true,
            ServiceRole::Guest => false,
            ServiceRole::Auto => self.seen.smi.as_ref().is_some_and(|s| s.host_view),
        }
    }

    /// The vGPU manager logged a line (a VM's vGPU started or stopped, its guest's license
    /// changed): nvidia-smi is read soon, to see which VM and how.
    pub(super) fn on_vgpu_mgr(&mut self, now: Now) {
        if self.is_host() {
            self.readings.soon(now.mono + AFTER_VGPU_MGR_LINE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(uuid: &str, id: &str, name: &str, state: VmState) -> Vm {
        Vm {
            vm_name: Some(name.into()),
            vm_uuid: Some(uuid.into()),
            vgpu_uuid: None,
            vgpu_id: Some(id.into()),
            profile: None,
            gpu: None,
            guest_driver: Some("580.105.08".into()),
            license_status: None,
            state,
            expiry: None,
            since: None,
            kubevirt: crate::host::kubevirt_of(name),
        }
    }

    #[test]
    fn each_vgpu_keeps_the_time_its_state_was_first_seen() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap();
        let mut m = VmMemory::default();
        let mut vms = vec![
            vm("a", "1", "tenant-a_vm-a", VmState::Unlicensed),
            vm("b", "2", "tenant-b_vm-b", VmState::Unlicensed),
        ];
        let changes = m.update(&mut vms, t(0));
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].2, None);
        assert!(vms.iter().all(|v| v.since == Some(t(0))));
        // One VM licensed: its since moves, the other's stays.
        vms[0].state = VmState::Licensed;
        let changes = m.update(&mut vms, t(60));
        assert_eq!(
            changes,
            [(
                "tenant-a/vm-a".to_string(),
                "1".to_string(),
                Some(VmState::Unlicensed),
                Some(VmState::Licensed)
            )]
        );
        assert_eq!((vms[0].since, vms[1].since), (Some(t(60)), Some(t(0))));
        // The same vGPU ID on another VM is another vGPU; a VM no longer listed is gone.
        let mut vms = vec![
            vms[0].clone(),
            vm("c", "2", "instance-00000005", VmState::Restricted),
        ];
        vms[0].since = None;
        let changes = m.update(&mut vms, t(120));
        assert_eq!(vms[0].since, Some(t(60)));
        assert_eq!(vms[1].since, Some(t(120)));
        assert_eq!(
            changes
                .iter()
                .map(|(n, id, b, a)| vm_change_line(n, id, *b, *a))
                .collect::<Vec<_>>(),
            [
                "VM instance-00000005 (vGPU 2): restricted (new)",
                "VM tenant-b/vm-b (vGPU 2): gone (was unlicensed)"
            ]
        );
    }

    #[test]
    fn a_vm_name_is_escaped_in_its_line() {
        let line = vm_change_line(
            "evil\u{1b}[2J\nVM other (vGPU 9): licensed",
            "3",
            Some(VmState::Unlicensed),
            Some(VmState::Restricted),
        );
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line}");
        assert!(
            line.ends_with("(vGPU 3): unlicensed -> restricted"),
            "{line}"
        );
    }
}
