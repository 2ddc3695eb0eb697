//! What an install or an adoption changes, as values: each change to the files (made, or
//! planned in a dry run), why a file is moved aside, whether gridd was restarted, the whole
//! outcome and its lines, and why a token was refused or not adopted; the token asked for,
//! judged ([`ask`]), and the plan that decides the changes ([`plan`]). No I/O: the service's core and `install` share them.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::gridd_conf::Edit;
use crate::time::rfc3339;
use crate::token::{TokenError, Untimely};

use crate::restart::Touch;
pub use crate::restart::{InstallState, Restart};

pub mod ask;
pub mod plan;
pub use plan::{
    Ask, ConfNow, ConfPlan, Current, FeatureType, GRIDD_CONF_MODE, Inputs, Plan, Previous, Stray,
    TOKEN_DIR_MODE, TOKEN_MODE,
};

/// One change to the files, made or (in a dry run) planned.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    CreateDir {
        path: PathBuf,
        mode: u32,
    },
    ChmodDir {
        path: PathBuf,
        from: u32,
        to: u32,
    },
    /// A temporary file left by an interrupted install.
    RemoveTemp {
        path: PathBuf,
    },
    /// Any other file in the token directory, moved aside.
    MoveStray {
        from: PathBuf,
        to: PathBuf,
        why: Aside,
    },
    /// The token being replaced, kept aside.
    SavePrevious {
        from: PathBuf,
        to: PathBuf,
    },
    WriteToken {
        path: PathBuf,
        bytes: usize,
        mode: u32,
    },
    ChmodToken {
        path: PathBuf,
        from: u32,
        to: u32,
    },
    WriteGriddConf {
        path: PathBuf,
        created: bool,
        mode: u32,
        edits: Vec<Edit>,
    },
}

/// Why a file is moved out of the token directory.
#[derive(Debug, Clone, PartialEq)]
pub enum Aside {
    /// It is no token and not named as one (a README, a misplaced gridd.conf, a link).
    Stray,
    /// The token in place until now: a newer valid token replaces it (a rotation).
    Previous,
    /// A file named or shaped like a token that is refused: why, in the words used for a
    /// token alone in the directory. `valid`: a valid token that lost to a newer one.
    Refused { why: String, valid: bool },
}

impl Change {
    /// What this change does to what gridd reads ([`crate::restart::for_change`] says whether
    /// that needs a restart).
    pub fn touch(&self) -> Touch {
        let name = |from: &Path| {
            crate::text::escape(&from.file_name().unwrap_or_default().to_string_lossy()).to_string()
        };
        match self {
            Change::WriteToken { .. } => Touch::Token,
            Change::ChmodToken { .. } => Touch::TokenMode,
            Change::WriteGriddConf { .. } => Touch::GriddConf,
            Change::MoveStray {
                why: Aside::Previous,
                from,
                ..
            } => Touch::Replaced(name(from)),
            Change::MoveStray {
                why: Aside::Refused { valid: true, .. },
                from,
                ..
            } => Touch::ValidTokenMoved(name(from)),
            Change::MoveStray { .. } => Touch::Stray,
            _ => Touch::Nothing,
        }
    }

    /// One line, in the past tense (`done`) or as a plan.
    pub fn describe(&self, done: bool) -> String {
        let v = |past: &str, plan: &str| tense(done, past, plan);
        match self {
            Change::CreateDir { path, mode } => format!(
                "{} directory {} (mode {mode:04o})",
                v("created", "create"),
                crate::text::show_path(path)
            ),
            Change::ChmodDir { path, from, to } => format!(
                "{} directory {} mode {from:04o} -> {to:04o}",
                v("changed", "change"),
                crate::text::show_path(path)
            ),
            Change::RemoveTemp { path } => format!(
                "{} {} (left by an interrupted install)",
                v("removed", "remove"),
                crate::text::show_path(path)
            ),
            Change::MoveStray { from, to, why } => why.describe(from, to, done),
            Change::SavePrevious { from, to } => format!(
                "{} the previous token {} to {}",
                v("saved", "save"),
                crate::text::show_path(from),
                crate::text::show_path(to)
            ),
            Change::WriteToken { path, bytes, mode } => format!(
                "{} token {} ({bytes} bytes, mode {mode:04o})",
                v("installed", "install"),
                crate::text::show_path(path)
            ),
            Change::ChmodToken { path, from, to } => format!(
                "{} token {} mode {from:04o} -> {to:04o}",
                v("changed", "change"),
                crate::text::show_path(path)
            ),
            Change::WriteGriddConf {
                path,
                created,
                mode,
                edits,
            } => gridd_conf_line(path, *created, *mode, edits, done),
        }
    }
}

/// The line of gridd.conf written, in the past tense (`done`) or as a plan.
fn gridd_conf_line(path: &Path, created: bool, mode: u32, edits: &[Edit], done: bool) -> String {
    let edits: Vec<String> = edits.iter().map(Edit::to_string).collect();
    let what = if created {
        tense(done, "created", "create")
    } else {
        tense(done, "edited", "edit")
    };
    format!(
        "{what} {} (mode {mode:04o}): {}",
        crate::text::show_path(path),
        edits.join("; ")
    )
}

impl Aside {
    /// The line of a file moved from `from` to `to`, in the past tense (`done`) or as a plan.
    fn describe(&self, from: &Path, to: &Path, done: bool) -> String {
        let (from, to) = (crate::text::show_path(from), crate::text::show_path(to));
        let moved = tense(done, "moved", "move");
        match self {
            Aside::Stray => {
                format!("{moved} {from} to {to} (only the token may be in the token directory)")
            }
            Aside::Previous => format!(
                "{moved} the previous token {from} to {to}: a newer token replaces it (to go back: vgpu-license-agent install --token-file {to})"
            ),
            Aside::Refused { why, valid: true } => format!(
                "{moved} {from} to {to}: {why}; to choose it instead: vgpu-license-agent install --token-file {to}"
            ),
            Aside::Refused { why, valid: false } => format!("{moved} {from} to {to}: {why}"),
        }
    }
}

/// A verb in the past tense (`done`), or as a plan ("would ...").
fn tense(done: bool, past: &str, plan: &str) -> String {
    if done {
        past.to_string()
    } else {
        format!("would {plan}")
    }
}

/// What an install or an adopt did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub dry_run: bool,
    /// One line about the token: size, DLS nodes, validity. Never its content.
    pub token_summary: String,
    pub changes: Vec<Change>,
    pub warnings: Vec<String>,
    pub restart: Restart,
    /// Why a restart was due (`None` when none was).
    pub restart_reason: Option<String>,
    /// The restart command, as shown.
    pub restart_command: String,
    /// The installed token, when it is in place under a name other than `paths.token_file`
    /// (it keeps that name: gridd reads any file in the token directory).
    pub kept_name: Option<PathBuf>,
}

impl Outcome {
    /// Whether any file was (or would be) changed.
    pub fn changed(&self) -> bool {
        !self.changes.is_empty()
    }

    /// The lines `install` prints on standard output.
    pub fn lines(&self) -> Vec<String> {
        let done = !self.dry_run;
        let mut out = vec![self.token_summary.clone()];
        if let Some(p) = &self.kept_name {
            out.push(format!(
                "the token is {}: it keeps that name (nvidia-gridd reads any file in its directory)",
                crate::text::show_path(p)
            ));
        }
        out.extend(self.changes.iter().map(|c| c.describe(done)));
        let reason = self.restart_reason.as_deref().unwrap_or("");
        match &self.restart {
            Restart::NotNeeded if !self.changed() => out.push(if self.dry_run {
                "nothing would change: the token and gridd.conf are installed as asked".into()
            } else {
                "nothing to change: the token and gridd.conf are installed as asked; nvidia-gridd not restarted".into()
            }),
            Restart::NotNeeded => out.push("nvidia-gridd not restarted: nothing it reads changed".into()),
            Restart::Skipped => out.push(format!(
                "nvidia-gridd not restarted (--no-restart), though {reason}: restart it yourself ({})",
                self.restart_command
            )),
            Restart::Deferred => out.push(format!(
                "nvidia-gridd not restarted yet, though {reason}: the restart budget or backoff says wait; it is made once they allow"
            )),
            Restart::WouldRestart => out.push(format!(
                "would restart nvidia-gridd ({}): {reason}",
                self.restart_command
            )),
            Restart::Done => out.push(restarted_line(&self.restart_command, reason)),
            Restart::Due => out.push(format!(
                "nvidia-gridd to be restarted ({}): {reason}",
                self.restart_command
            )),
            Restart::NoUnit(unit) => out.push(format!(
                "nvidia-gridd not restarted: there is no {unit} to restart (systemd has no such unit); install the NVIDIA vGPU (GRID) guest driver, which brings it: its nvidia-gridd reads this token when it starts"
            )),
            Restart::Failed(_) => {}
        }
        out
    }
}

/// The line of a restart of gridd that was made: the command, and why.
pub fn restarted_line(command: &str, why: &str) -> String {
    format!("restarted nvidia-gridd ({command}): {why}")
}

/// A token that must not be installed: it does not decode, or is not valid now.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenRejected {
    Invalid(TokenError),
    /// Not valid at `now`, the moment install judged it at.
    Untimely {
        why: Untimely,
        now: DateTime<Utc>,
    },
    /// `paths.token_source` gives no token (gone, empty, unreadable): the whole message.
    Source(String),
}

impl std::fmt::Display for TokenRejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenRejected::Invalid(e) => write!(f, "{e}"),
            TokenRejected::Untimely {
                why: Untimely::Expired(exp),
                ..
            } => write!(
                f,
                "the token expired at {}; generate a new client configuration token on the DLS (install --force installs it anyway)",
                rfc3339(*exp)
            ),
            TokenRejected::Untimely {
                why: Untimely::NotYetValid(not_before),
                now,
            } => write!(
                f,
                "the token is not valid before {} and this guest's clock says {}; fix the clock (chrony/NTP, timezone) or wait (install --force installs it anyway)",
                rfc3339(*not_before),
                rfc3339(*now)
            ),
            TokenRejected::Source(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for TokenRejected {}

/// How long a file in the token directory must have been still before the service judges
/// it: longer than a copy's writes are apart.
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a token was not adopted; in each case nothing was changed.
#[derive(Debug)]
pub enum AdoptError {
    /// A file in the token directory changed a moment ago and may still be being written:
    /// looked at again after this long.
    Settling(std::time::Duration),
    /// There is no token in the token directory.
    NoToken(PathBuf),
    /// The token at the path changed while it was being adopted (an `install` ran
    /// meanwhile): what is there now is adopted next, as it stands.
    Superseded,
    /// The token in the token directory does not decode or is not valid now.
    Rejected(TokenRejected),
    /// The platform's token source holds a token the agent refused (the whole line): nothing
    /// was installed from it, and the installed token, if any, stays.
    SourceRejected(String),
    /// The token directory or the token in it is refused as it stands (a FIFO at the token
    /// path, a subdirectory, an unreadable token): nothing was changed, one line.
    Refused(String),
    /// Anything else (the directory, the lock, a write): the error and its causes, one line.
    Other(String),
}

impl std::fmt::Display for AdoptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdoptError::Settling(wait) => write!(
                f,
                "a file in the token directory is still being written; looked at again in {:.1} s",
                wait.as_secs_f64()
            ),
            AdoptError::NoToken(dir) => write!(
                f,
                "no client configuration token in {}; install one with vgpu-license-agent install",
                crate::text::show_path(dir)
            ),
            AdoptError::Superseded => f.write_str(
                "the token was replaced while it was being adopted; nothing was changed",
            ),
            AdoptError::Rejected(r) => write!(f, "{r}"),
            AdoptError::SourceRejected(why) | AdoptError::Refused(why) | AdoptError::Other(why) => {
                f.write_str(why)
            }
        }
    }
}

impl std::error::Error for AdoptError {}

impl From<anyhow::Error> for AdoptError {
    fn from(e: anyhow::Error) -> Self {
        AdoptError::Other(format!("{e:#}"))
    }
}
