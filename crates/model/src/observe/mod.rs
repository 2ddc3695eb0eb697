//! Sources turned into observations: `nvidia-smi` output, gridd's log and an application's;
//! on a host, the vGPU manager's log.

pub mod app_log;
pub mod catalogue;
pub mod entry;
pub mod journal;
pub mod lines;
pub mod meaning;
pub mod smi;
pub mod stamp;
pub mod unit;
pub mod vgpu_mgr;
