//! Sources turned into observations: `nvidia-smi` output and gridd's log.

pub mod catalogue;
pub mod entry;
pub mod journal;
pub mod lines;
pub mod pci;
pub mod smi;
pub mod stamp;
