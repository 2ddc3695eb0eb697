//! `vgpu-license-agent`: keeps an NVIDIA vGPU guest licensed.
//!
//! One flow: sources (token, gridd.conf, nvidia-smi, gridd's journal) become observations
//! ([`observe`]), one pure state machine ([`state`]) turns them into a [`report::Report`], and
//! every command is a way through that flow.

// What decides lives in the model crate; its modules keep their names here.
pub use vgpu_license_model::{
    assemble, backoff, gridd_conf, guest_identity, node_condition, node_mode, node_writer, plan,
    policy, remedy, report, shutdown, state, text, time, token, userdata,
};

pub mod analyze;
pub mod cli;
pub mod command;
pub mod config;
pub mod diagnose;
pub mod dir;
pub mod fsutil;
pub mod gridd;
pub mod http;
pub mod identity;
pub mod image_prepared;
pub mod input;
pub mod install;
pub mod journal_boot;
pub mod kube;
pub mod layout;
pub mod live;
pub mod node;
pub mod observe;
pub mod outdir;
pub mod prepare;
pub mod probe;
pub mod service;
pub mod status;
pub mod token_dir;
pub mod token_inspect;
