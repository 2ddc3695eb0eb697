//! Sources turned into observations: the model's parsers ([`vgpu_license_model::observe`]),
//! and the PCI bus read here.

pub use vgpu_license_model::observe::*;

pub mod journal_file;
pub mod pci;
