//! Every integration test of the project, in one test binary: one link of the crate, and
//! every test free to run at the same time as any other (the end-to-end scenarios too: each
//! simulated machine's agent reads its own gridd's lines of the journal, see
//! `common/sim.rs`). `.cargo/config.toml` sets how many run at once; most of them wait on
//! a simulated machine, not on a core.
//!
//! One module per subject; run one with a filter, e.g. `cargo test --test suite service::`
//! or `cargo test --test suite sim_selfcheck::`.

mod common;

mod app_logs;
mod config_cli;
mod diagnose;
mod docs;
mod fleet;
mod gpu_operator;
mod gridd_unit;
mod host;
mod hostile;
mod identity;
mod install;
mod kube;
mod kube_credentials;
mod last_shutdown;
mod layout;
mod licensing_secret;
mod metrics_server;
mod misbehaving_commands;
mod one_answer;
mod packaging;
mod prepare_image;
mod properties;
mod rotation;
mod samples;
mod service;
mod service_faults;
mod sim_selfcheck;
mod token_inspect;
mod token_source;
mod trust;
mod vgpus;
