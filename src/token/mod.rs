//! The client configuration token: the model's reading of it ([`vgpu_license_model::token`],
//! re-exported here), which file of the token directory is the token ([`dir`]), and
//! `token inspect` ([`inspect`]).

pub mod dir;
