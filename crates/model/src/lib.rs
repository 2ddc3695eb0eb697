//! What `vgpu-license-agent` decides, with no I/O. The agent reads and changes the machine;
//! this crate says what it means and what to do:
//! - the sources read as values: nvidia-smi's and gridd's words ([`observe`]), the token
//!   ([`token`]), gridd.conf ([`gridd_conf`]), the user-data a guest boots with
//!   ([`userdata`]), the settings ([`config`]);
//! - one observation ([`assemble`], made of the values of [`observations`]) and its judgement
//!   ([`state`]): the [`report`], by the rules of [`policy`];
//! - what to do about it: every restart of gridd ([`restart`]), a token's installation
//!   ([`install`]: the plan), the node's mode ([`node`]), its Kubernetes condition
//!   ([`node::condition`]) and when to write it ([`node::writer`]), the shared retry
//!   schedule ([`backoff`]), a
//!   cloned guest ([`identity`]), the last shutdown ([`shutdown`]);
//! - a vGPU host's view of every VM's vGPU ([`host`]): the same flow, seen from the
//!   hypervisor;
//! - the service's judgement over time ([`service`]): events and the time in, effects out;
//! - times and text as operators read them ([`time`], [`text`]).
//!
//! The modules are layers, each importing only those below it (`tests/layering.rs` has the
//! order, from [`text`] and [`time`] at the bottom to [`service`] at the top).

// Its tests read fixtures (see clippy.toml); the model itself reads nothing.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_types))]

pub mod assemble;
pub mod backoff;
pub mod config;
pub mod gridd_conf;
pub mod host;
pub mod identity;
pub mod install;
pub mod node;
pub mod observations;
pub mod observe;
pub mod policy;
pub mod report;
pub mod restart;
pub mod service;
pub mod shutdown;
pub mod state;
pub mod text;
pub mod time;
pub mod token;
pub mod userdata;
