//! What `vgpu-license-agent` decides, with no I/O: the token and its dates, times and text,
//! the user-data decoder. The agent ([`vgpu_license_agent`](../vgpu_license_agent)) reads and
//! changes the machine and asks this crate what it means.

// Its tests read fixtures (see clippy.toml); the model itself reads nothing.
#![cfg_attr(test, allow(clippy::disallowed_methods, clippy::disallowed_types))]

pub mod gridd_conf;
pub mod observe;
pub mod policy;
pub mod report;
pub mod shutdown;
pub mod text;
pub mod time;
pub mod token;
pub mod userdata;
