//! Sources turned into observations: `nvidia-smi` output, gridd's log and an application's.

pub mod app_log;
pub mod catalogue;
pub mod entry;
pub mod journal;
pub mod lines;
pub mod smi;
pub mod stamp;
