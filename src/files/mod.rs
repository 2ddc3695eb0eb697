//! Files and directories, as root must touch them: every read capped and never blocking
//! ([`input`]), the agent's own directories held open and worked relative to their
//! descriptor ([`dir`]), atomic replaces and the install lock ([`fsutil`]), the outputs
//! never written through another user's link ([`outdir`]), and the state directory's names
//! ([`layout`]).

pub mod dir;
pub mod fsutil;
pub mod input;
pub mod layout;
pub mod outdir;
