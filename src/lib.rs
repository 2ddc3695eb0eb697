//! `vgpu-license-agent`: keeps an NVIDIA vGPU guest licensed.
//!
//! One flow: sources (token, gridd.conf, nvidia-smi, gridd's journal) become observations
//! ([`observe`]), one pure state machine ([`state`]) turns them into a [`report::Report`], and
//! every command is a way through that flow.

pub mod analyze;
pub mod assemble;
pub mod backoff;
pub mod cli;
pub mod command;
pub mod config;
pub mod diagnose;
pub mod dir;
pub mod fsutil;
pub mod gridd;
pub mod gridd_conf;
pub mod guest_identity;
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
pub mod node_condition;
pub mod node_mode;
pub mod node_writer;
pub mod observe;
pub mod outdir;
pub mod plan;
pub mod policy;
pub mod prepare;
pub mod probe;
pub mod remedy;
pub mod report;
pub mod service;
pub mod shutdown;
pub mod state;
pub mod status;
pub mod text;
pub mod time;
pub mod token;
pub mod token_dir;
pub mod token_inspect;
pub mod userdata;
