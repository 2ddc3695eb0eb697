//! Sources turned into observations: the model's parsers ([`vgpu_license_model::observe`]),
//! and the PCI bus read here.

pub mod journal_file;
pub mod live;
pub mod pci;
