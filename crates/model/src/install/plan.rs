//! An install's (or an adoption's) plan, made of values the agent read first: what is in
//! place ([`Current`]), what is asked ([`Ask`]), what the agent remembers of earlier installs
//! ([`InstallState`]), the time (this run's name in `replaced/`) and the vGPUs nvidia-smi
//! shows. [`Plan::make`] reads nothing and writes nothing: it says which changes to make, in
//! which order, how gridd.conf is left, and why gridd must be restarted ([`crate::restart`]
//! decides that). The agent takes the lock, reads, applies the plan and restarts gridd.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Aside, Change, InstallState, Outcome, Restart};
use crate::config::Settings;
use crate::gridd_conf::{self, Edit, GriddConf};
use crate::observe::smi::SmiGpu;

/// Mode of the installed token (NVIDIA's guidance: gridd need not own it).
pub const TOKEN_MODE: u32 = 0o744;
/// Mode of the token directory.
pub const TOKEN_DIR_MODE: u32 = 0o755;
/// Mode of a gridd.conf the agent creates (an existing one keeps its mode and owner).
pub const GRIDD_CONF_MODE: u32 = 0o644;
const NEW_GRIDD_CONF_HEADER: &str = "# gridd.conf, created by vgpu-license-agent install.\n\
# FeatureType=1: NVIDIA vGPU (the driver picks the edition from the vGPU profile).\n";

/// What is in place now, as the agent read it.
#[derive(Debug, Clone, Default)]
pub struct Current {
    /// The token directory's mode, `None` where there is none.
    pub dir_mode: Option<u32>,
    /// The installed token, whatever its name.
    pub token: Option<Previous>,
    pub strays: Vec<Stray>,
    /// Temporary files of an interrupted install.
    pub temps: Vec<PathBuf>,
    pub conf: Option<ConfNow>,
}

/// gridd.conf as it is: its bytes, mode and owner (uid, gid).
#[derive(Debug, Clone)]
pub struct ConfNow {
    pub bytes: Vec<u8>,
    pub mode: u32,
    pub owner: (u32, u32),
}

/// The token in place before this install: where it is, its bytes as read (and their
/// SHA-256, hex), its mode and inode (a chmod goes to the file that was read, never to
/// whatever the path names later).
#[derive(Debug, Clone)]
pub struct Previous {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub sha256: String,
    pub mode: u32,
    pub ino: u64,
}

/// Another file in the token directory, as the plan needs it: where it is, and what the
/// agent found it to be.
#[derive(Debug, Clone)]
pub struct Stray {
    pub path: PathBuf,
    pub name: OsString,
    /// For a file named or shaped like a token: why it is not the token.
    pub verdict: Option<String>,
    /// A token valid now whose bytes differ from the installed token's.
    pub other_token: bool,
    /// The SHA-256 of its bytes (hex), when it decodes as a token.
    pub sha256: Option<String>,
}

/// What to do with gridd.conf's FeatureType.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureType {
    /// Set it to this value (`install`, or a value set in the agent's config).
    Set(u8),
    /// Keep the one gridd.conf has when it can serve this guest; else write this one (the
    /// service's adopt with the default config: an operator's `install --feature-type 4` on a
    /// passthrough guest stays, the driver template's `FeatureType=0` does not).
    Default(u8),
}

/// What `install` or the service's adoption asks of the plan.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    /// The token's bytes, installed unchanged.
    pub bytes: &'a [u8],
    pub feature_type: FeatureType,
    pub dry_run: bool,
    /// Restart gridd after a change (`false`: `--no-restart`, or the service's budget or
    /// backoff says wait).
    pub restart: bool,
    /// gridd already holds a license: a token it found on its own needs no restart.
    pub licensed: bool,
    /// A restart not made (`restart` false) stays owed: the service's adoption while its
    /// restart budget or backoff says wait. `install --no-restart` owes none.
    pub owe_restart: bool,
    /// One line about the token (never its content).
    pub summary: String,
    pub warnings: Vec<String>,
}

/// What a plan is made from besides the request and what is in place: read or taken before
/// it, so that making it reads nothing.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// What the agent remembers of earlier installs.
    pub state: InstallState,
    /// The SHA-256 (hex) of the token's bytes.
    pub sha256: String,
    /// `<state_dir>/replaced/`, where files are moved aside.
    pub replaced_root: PathBuf,
    /// This run's name in `replaced/` (its time).
    pub stamp: String,
    /// The vGPUs nvidia-smi shows, where the FeatureType to set needs them ([`needs_gpus`]).
    pub gpus: Vec<SmiGpu>,
}

/// gridd.conf as this install leaves it: FeatureType set, nothing else changed.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfPlan {
    pub bytes: Vec<u8>,
    pub created: bool,
    pub edits: Vec<Edit>,
    pub mode: u32,
    /// The owner an existing gridd.conf keeps.
    pub owner: Option<(u32, u32)>,
}

/// An install's plan, a value made without I/O ([`Plan::make`]): the outcome it has (or in a
/// dry run would have), the token and gridd.conf as it leaves them, where it moves files
/// aside, and what the agent remembers of earlier installs. The agent carries it out.
#[derive(Debug, Clone)]
pub struct Plan {
    pub outcome: Outcome,
    /// The token's bytes, installed unchanged.
    pub token: Vec<u8>,
    pub conf: ConfPlan,
    /// `<state_dir>/replaced/`, and this run's directory in it.
    pub replaced_root: PathBuf,
    pub stamp: String,
    pub state: InstallState,
    /// The SHA-256 of the token's bytes.
    pub sha: String,
    /// As asked ([`Ask::restart`], [`Ask::owe_restart`]).
    pub restart: bool,
    pub owe_restart: bool,
}

impl Plan {
    pub fn make(ask: Ask<'_>, cur: &Current, settings: &Settings, inputs: Inputs) -> Plan {
        let mut warnings = ask.warnings;
        let ft = feature_type_to_set(ask.feature_type, cur, &inputs.gpus, &mut warnings);
        let conf = gridd_conf_with(cur, ft, &settings.paths.token_dir, &mut warnings);
        let planned_dir = inputs.replaced_root.join(&inputs.stamp);
        let (changes, kept_name) =
            plan_changes(cur, ask.bytes, &conf, &inputs.state, settings, &planned_dir);
        let touches: Vec<_> = changes.iter().map(Change::touch).collect();
        let reason =
            crate::restart::for_install(&touches, &inputs.state, &inputs.sha256, ask.licensed);
        let outcome = Outcome {
            dry_run: ask.dry_run,
            token_summary: ask.summary,
            changes,
            warnings,
            restart: Restart::NotNeeded,
            restart_reason: reason,
            restart_command: settings.commands.restart_gridd.join(" "),
            kept_name,
        };
        Plan {
            outcome,
            token: ask.bytes.to_vec(),
            conf,
            replaced_root: inputs.replaced_root,
            stamp: inputs.stamp,
            state: inputs.state,
            sha: inputs.sha256,
            restart: ask.restart,
            owe_restart: ask.owe_restart,
        }
    }

    /// A dry run's outcome: the restart the plan would make.
    pub fn dry_run(mut self) -> Outcome {
        self.outcome.restart =
            crate::restart::in_dry_run(self.outcome.restart_reason.as_deref(), self.restart);
        self.outcome
    }

    /// Whether settling the plan ([`Plan::settled`]) asks whether gridd's unit is missing:
    /// only where a restart is due and may be made now.
    pub fn asks_unit(&self) -> bool {
        self.outcome.restart_reason.is_some() && self.restart
    }

    /// The outcome once the changes `made` are in place, and what to remember where it
    /// changes: the token gridd is owed a restart for, and whether that restart is owed
    /// ([`crate::restart::after_install`]). `unit_missing`: systemd has no gridd unit for the
    /// restart command to restart (asked only where [`Plan::asks_unit`]).
    pub fn settled(
        self,
        made: Vec<Change>,
        unit_missing: bool,
        unit: &str,
    ) -> (Outcome, Option<InstallState>) {
        let Plan {
            mut outcome,
            mut state,
            sha,
            restart,
            owe_restart,
            ..
        } = self;
        outcome.changes = made;
        if outcome.restart_reason.is_none() {
            return (outcome, None);
        }
        let (restart, owed) =
            crate::restart::after_install(restart, owe_restart, unit_missing, unit);
        state.token_sha256 = Some(sha);
        state.restart_pending = owed;
        outcome.restart = restart;
        (outcome, Some(state))
    }
}

/// The FeatureType gridd.conf has now, as written there.
fn present_feature_type(cur: &Current) -> Option<String> {
    cur.conf
        .as_ref()
        .and_then(|c| GriddConf::parse(&c.bytes).get("FeatureType"))
        .map(|e| e.value)
}

/// Whether choosing the FeatureType needs the vGPUs nvidia-smi shows: only about a value
/// other than 1, so that the usual install and adoption run no nvidia-smi.
pub fn needs_gpus(requested: FeatureType, cur: &Current) -> bool {
    match requested {
        FeatureType::Set(ft) => ft != 1,
        FeatureType::Default(ft) => {
            // A value other than 0 and 1 is judged against them; else the one written is.
            let present = present_feature_type(cur).and_then(|v| v.parse::<u8>().ok());
            present.is_some_and(|v| v > 1) || (present != Some(1) && ft != 1)
        }
    }
}

/// The FeatureType to set, judged against the vGPUs `gpus` (those nvidia-smi shows, where
/// [`needs_gpus`]).
fn feature_type_to_set(
    requested: FeatureType,
    cur: &Current,
    gpus: &[SmiGpu],
    warnings: &mut Vec<String>,
) -> u8 {
    let present = present_feature_type(cur);
    let ft = match requested {
        FeatureType::Set(ft) => ft,
        // A value that can serve this guest stays (2 or 4 on passthrough); none, 0 (the
        // driver's template: unlicensed) or one that does not fit the vGPU profile does not.
        FeatureType::Default(ft) => match present.as_deref().map(str::parse::<u8>) {
            Some(Ok(1)) => 1,
            Some(Ok(v)) if v != 0 && gridd_conf::feature_type_advice(v, gpus).is_none() => v,
            _ => ft,
        },
    };
    if ft != 1
        && let Some(w) = gridd_conf::feature_type_advice(ft, gpus)
    {
        warnings.push(w);
    }
    ft
}

/// gridd.conf with FeatureType `ft`: the one in place edited (its mode and owner kept, its
/// warnings said), or a new one.
fn gridd_conf_with(
    cur: &Current,
    ft: u8,
    token_dir: &Path,
    warnings: &mut Vec<String>,
) -> ConfPlan {
    let ft = ft.to_string();
    match &cur.conf {
        Some(now) => {
            let mut conf = GriddConf::parse(&now.bytes);
            let edits = conf.set("FeatureType", &ft);
            warnings.extend(conf.warnings(token_dir));
            ConfPlan {
                bytes: conf.to_bytes(),
                created: false,
                edits,
                mode: now.mode,
                owner: Some(now.owner),
            }
        }
        None => {
            let mut conf = GriddConf::parse(NEW_GRIDD_CONF_HEADER.as_bytes());
            let edits = conf.set("FeatureType", &ft);
            ConfPlan {
                bytes: conf.to_bytes(),
                created: true,
                edits,
                mode: GRIDD_CONF_MODE,
                owner: None,
            }
        }
    }
}

/// What this install changes, in order, strays going to `planned_dir`; and the other name
/// the same token keeps in place, if it has one.
fn plan_changes(
    cur: &Current,
    bytes: &[u8],
    conf: &ConfPlan,
    state: &InstallState,
    settings: &Settings,
    planned_dir: &Path,
) -> (Vec<Change>, Option<PathBuf>) {
    let paths = &settings.paths;
    let mut changes: Vec<Change> = dir_change(cur.dir_mode, &paths.token_dir)
        .into_iter()
        .collect();
    for t in &cur.temps {
        changes.push(Change::RemoveTemp { path: t.clone() });
    }
    let installed_sha = cur.token.as_ref().map(|t| t.sha256.as_str());
    for s in &cur.strays {
        changes.push(Change::MoveStray {
            from: s.path.clone(),
            to: planned_dir.join(&s.name),
            why: aside(s, state, &paths.token_file, installed_sha),
        });
    }
    let kept_name = token_changes(cur, bytes, settings, planned_dir, &mut changes);
    if cur.conf.as_ref().is_none_or(|now| now.bytes != conf.bytes) {
        changes.push(Change::WriteGriddConf {
            path: paths.gridd_conf.clone(),
            created: conf.created,
            mode: conf.mode,
            edits: conf.edits.clone(),
        });
    }
    (changes, kept_name)
}

/// The token directory created, or its mode set, where it needs it.
fn dir_change(mode: Option<u32>, token_dir: &Path) -> Option<Change> {
    match mode {
        None => Some(Change::CreateDir {
            path: token_dir.to_path_buf(),
            mode: TOKEN_DIR_MODE,
        }),
        Some(m) if m != TOKEN_DIR_MODE => Some(Change::ChmodDir {
            path: token_dir.to_path_buf(),
            from: m,
            to: TOKEN_DIR_MODE,
        }),
        Some(_) => None,
    }
}

/// The token written (the one it replaces kept aside), or the one in place kept, its mode
/// set; the other name the same token keeps in place, if it has one.
fn token_changes(
    cur: &Current,
    bytes: &[u8],
    settings: &Settings,
    planned_dir: &Path,
    changes: &mut Vec<Change>,
) -> Option<PathBuf> {
    let paths = &settings.paths;
    let target = paths.token_path();
    let write_token = cur.token.as_ref().is_none_or(|p| p.bytes != bytes);
    if write_token {
        match &cur.token {
            Some(prev) if prev.path == target => changes.push(Change::SavePrevious {
                from: target.clone(),
                to: planned_dir.join(&paths.token_file),
            }),
            Some(prev) => changes.push(Change::MoveStray {
                from: prev.path.clone(),
                to: planned_dir.join(prev.path.file_name().unwrap_or_default()),
                why: Aside::Previous,
            }),
            None => {}
        }
        changes.push(Change::WriteToken {
            path: target,
            bytes: bytes.len(),
            mode: TOKEN_MODE,
        });
        return None;
    }
    // The same token already in place under another name (the DLS's download name, a site's
    // own) stays as it is: gridd reads any file there, and a config tool that writes that name
    // again must find it unchanged, not see a second copy appear.
    let prev = cur.token.as_ref()?;
    if prev.mode != TOKEN_MODE {
        changes.push(Change::ChmodToken {
            path: prev.path.clone(),
            from: prev.mode,
            to: TOKEN_MODE,
        });
    }
    (prev.path != target).then(|| prev.path.clone())
}

/// Why a stray is moved aside: the token that was in place (the one the agent last restarted
/// gridd for, or under the standard name), a file meant as a token that is refused, or a
/// plain stray.
fn aside(s: &Stray, state: &InstallState, token_file: &str, installed: Option<&str>) -> Aside {
    let Some(sha) = s.sha256.as_deref() else {
        return s
            .verdict
            .clone()
            .map_or(Aside::Stray, |why| Aside::Refused { why, valid: false });
    };
    if Some(sha) == installed {
        // A second copy of the token: gridd reads the same either way.
        return Aside::Stray;
    }
    let previous = match state.token_sha256.as_deref() {
        Some(restarted_for) => sha == restarted_for,
        None => s.name == token_file,
    };
    match &s.verdict {
        _ if previous => Aside::Previous,
        Some(why) => Aside::Refused {
            why: why.clone(),
            valid: s.other_token,
        },
        None => Aside::Stray,
    }
}

/// How many installs' worth of moved-aside files `replaced/` keeps: the oldest go first.
pub const REPLACED_KEPT: usize = 20;

/// Which of `dirs` (the directories in `replaced/`, by name) go: the oldest `<stamp>` ones
/// beyond [`REPLACED_KEPT`], only names of the stamp's form (anything else there is left
/// alone).
pub fn replaced_to_prune(dirs: &[String], this_run: &str) -> Vec<String> {
    let is_stamp = |n: &str| {
        let base = n.split('-').next().unwrap_or(n);
        base.len() == 16 && base.as_bytes()[8] == b'T' && base.ends_with('Z')
    };
    // What this run just moved aside stays, whatever the clock says of the others (a clock
    // set back makes this run's stamp the oldest).
    let ours =
        |n: &str| n == this_run || n.strip_prefix(this_run).is_some_and(|r| r.starts_with('-'));
    let (kept, mut stamps): (Vec<&String>, Vec<&String>) =
        dirs.iter().filter(|n| is_stamp(n)).partition(|n| ours(n));
    // Stamps sort by time; `<stamp>-2` after `<stamp>`.
    stamps.sort();
    let excess = (stamps.len() + kept.len()).saturating_sub(REPLACED_KEPT);
    stamps[..excess.min(stamps.len())]
        .iter()
        .map(|n| n.to_string())
        .collect()
}

#[cfg(test)]
mod tests;
