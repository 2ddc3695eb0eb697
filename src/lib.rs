//! `vgpu-license-agent`: keeps an NVIDIA vGPU guest licensed.
//!
//! One flow: sources (token, gridd.conf, nvidia-smi, gridd's journal) become observations
//! ([`observe`]), one pure state machine ([`model::state`]) turns them into a
//! [`model::report::Report`], and every command is a way through that flow. What decides is
//! the model crate ([`model`]); this crate acts: it reads and changes the machine.

// What decides: the model crate, as `crate::model`.
pub use vgpu_license_model as model;

pub mod cli;
pub mod config;
pub mod files;
pub mod gridd;
pub mod http;
pub mod identity;
pub mod image;
pub mod install;
pub mod kube;
pub mod node;
pub mod observe;
pub mod probe;
pub mod service;
pub mod token;
