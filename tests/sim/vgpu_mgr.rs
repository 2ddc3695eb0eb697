//! The simulated vGPU manager of a host: one change of one VM's vGPU, as the host sees it.
//! It sets the VM's state in the sim dir's `vms.json` (what the simulated `nvidia-smi vgpu
//! -q` prints) and logs to journald what the real `nvidia-vgpu-mgr` logs at that change, as
//! the samples show it (host-vgpu-mgr-log-*.txt): the vGPU's start, the guest driver's
//! information, `vGPU license state: ...`. The real manager is one process per VM's vGPU;
//! here a process per change sends the lines, named as the real one, so that journald
//! records `_COMM=nvidia-vgpu-mgr`. No sample shows what the manager logs as a VM stops: a
//! VM stopped is only taken off the list.
//!
//!     sim-nvidia-vgpu-mgr [--sim-dir DIR] VGPU_ID booting|unlicensed|licensed|restricted|stopped [VM_NAME VM_UUID]
//!
//! A VM not on the list yet needs its name and UUID.

#[path = "shared.rs"]
mod shared;

use std::time::Duration;

use shared::{INFO, SimConfig, SimVm, Syslog, VmPhase};

/// The guest driver a VM loads (smi-host-vgpu-q-two-vms.txt).
const GUEST_DRIVER: &str = "580.105.08";

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let _ = nix::sys::prctl::set_name(c"nvidia-vgpu-mgr");
    let dir = shared::sim_dir(&mut args);
    let cfg = SimConfig::load(&dir);
    let usage = || -> ! {
        eprintln!(
            "usage: sim-nvidia-vgpu-mgr [--sim-dir DIR] VGPU_ID booting|unlicensed|licensed|restricted|stopped [VM_NAME VM_UUID]"
        );
        std::process::exit(2);
    };
    let (id, phase) = match (args.first(), args.get(1)) {
        (Some(id), Some(p)) => (id.clone(), p.as_str()),
        _ => usage(),
    };
    let phase = match phase {
        "booting" => Some(VmPhase::Booting),
        "unlicensed" => Some(VmPhase::Unlicensed),
        "licensed" => Some(VmPhase::Licensed),
        "restricted" => Some(VmPhase::Restricted),
        "stopped" => None,
        _ => usage(),
    };
    let mut vms = SimVm::load_all(&dir);
    let at = vms.iter().position(|v| v.vgpu_id == id);
    let before = at.map(|i| vms[i].phase);
    let Some(phase) = phase else {
        if let Some(i) = at {
            vms.remove(i);
        }
        save(&dir, &vms);
        return;
    };
    let i = match at {
        Some(i) => i,
        None => {
            let (Some(name), Some(uuid)) = (args.get(2), args.get(3)) else {
                usage()
            };
            vms.push(SimVm {
                vgpu_id: id.clone(),
                vm_uuid: uuid.clone(),
                vm_name: name.clone(),
                vgpu_uuid: format!("094593d6-85a0-11f1-802e-{:012x}", vms.len() + 1),
                profile: cfg.profile.clone(),
                phase: VmPhase::Booting,
                guest_driver: GUEST_DRIVER.into(),
                expiry: None,
            });
            vms.len() - 1
        }
    };
    vms[i].phase = phase;
    vms[i].expiry = (phase == VmPhase::Licensed)
        .then(|| chrono::Utc::now().timestamp() + cfg.lease_seconds as i64);
    // The list first: whoever reads nvidia-smi after a line sees what the line says.
    save(&dir, &vms);
    let log = Syslog::new("nvidia-vgpu-mgr", cfg.echo, None);
    let say = |m: &str| log.log(INFO, &format!("notice: vmiop_log: {m}"));
    if before.is_none() {
        // A guest gets its vGPU (host-vgpu-mgr-log-ubuntu-server-docs.txt).
        say("(0x0): gpu-pci-id : 0x4100");
        say("(0x0): vgpu_type : Quadro");
        say("######## vGPU Manager Information: ########");
        say(&format!("Driver Version: {}", cfg.driver_version));
        say("display_init inst: 0 successful");
    }
    if matches!(before, None | Some(VmPhase::Booting)) && phase != VmPhase::Booting {
        // Its guest driver loads (host-vgpu-mgr-log-vgpu_unlock-rs-37.txt).
        say("######## Guest NVIDIA Driver Information: ########");
        say(&format!("Driver Version: {GUEST_DRIVER}"));
    }
    let state = match phase {
        VmPhase::Booting => None,
        VmPhase::Unlicensed => Some("Unlicensed (Unrestricted)"),
        VmPhase::Licensed => Some("Licensed"),
        VmPhase::Restricted => Some("Unlicensed (Restricted)"),
    };
    if let Some(state) = state.filter(|_| before != Some(phase)) {
        say(&format!("(0x0): vGPU license state: {state}"));
    }
    // Let journald read /proc/PID/comm for the lines before the process is gone.
    std::thread::sleep(Duration::from_millis(cfg.exit_linger_ms));
}

fn save(dir: &std::path::Path, vms: &[SimVm]) {
    if let Err(e) = SimVm::save_all(dir, vms) {
        eprintln!(
            "sim-nvidia-vgpu-mgr: cannot write {}: {e}",
            shared::VMS_FILE
        );
        std::process::exit(1);
    }
}
