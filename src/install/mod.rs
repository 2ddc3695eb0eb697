//! `install`: validated, atomic, idempotent install of the token and gridd.conf.
//!
//! The order that keeps "an error changes nothing" true and a whole token in the directory at
//! every instant: validate the token, take the lock, read what is installed (and what the
//! plan needs besides: what the agent remembers, the time, the vGPUs), have the model plan
//! every change and the restart (`model::install::plan`), write the new files next to their
//! targets (synced, not yet renamed), keep a copy of the token being replaced, rename the new
//! token into place, then move strays (the previous token under another name among them)
//! aside; each step undone on a later error ([`apply`]). Only then is nvidia-gridd restarted,
//! with a time limit, where the model's `restart` says so.
//!
//! The service reuses the same core through [`adopt_dropped_token`] for a token that
//! cloud-init's `write_files` put in place itself.

mod adopt;
mod apply;
pub mod fetch;
pub mod source;

pub(crate) use crate::model::install::ask::nothing_changed;
pub use crate::model::install::ask::{check_feature_type, validate};
use crate::model::install::ask::{summary, warnings};
use crate::model::install::{
    AdoptError, Ask, Change, ConfPlan, Current, FeatureType, Inputs, InstallState, Outcome, Plan,
    Previous, Restart, SETTLE, TokenRejected,
};
pub use crate::model::install::{GRIDD_CONF_MODE, TOKEN_DIR_MODE, TOKEN_MODE};
pub use adopt::{adopt, adopt_dropped_token, check_source};
use apply::apply;

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::anyhow;
use chrono::{DateTime, Utc};

use crate::files::fsutil::{self, LockError};
use crate::files::input::{self, Links, ReadError};
use crate::files::layout::{LOCK_FILE, REPLACED_DIR, STAMP_FORMAT, STATE_FILE};
use crate::gridd::restart_gridd;
use crate::model::config::Settings;
use crate::model::text::show_path;
use crate::model::time::rfc3339;
use crate::model::token::TokenError;
use crate::token::dir::sha256_hex;

/// Mode of `<state_dir>/replaced/`: it holds old tokens, which are secrets.
const REPLACED_MODE: u32 = 0o700;

/// What to install.
#[derive(Debug, Clone)]
pub struct Request {
    /// The token's bytes, installed unchanged.
    pub token: Vec<u8>,
    pub feature_type: u8,
    /// Install a token that decodes but is expired or not yet valid.
    pub force: bool,
    pub dry_run: bool,
    /// Restart nvidia-gridd after a change (`false` for `--no-restart`).
    pub restart: bool,
}

/// What the agent remembers of earlier installs ([`InstallState`]): none where nothing was
/// recorded, or what was cannot be read.
fn load_state(state_dir: &Path) -> InstallState {
    input::read_file(&state_dir.join(STATE_FILE), 1 << 20, Links::Refuse)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Records `state`, stamped with the time.
fn store_state(state: &mut InstallState, state_dir: &Path) -> io::Result<()> {
    state.updated_at = Some(rfc3339(Utc::now()));
    let json = serde_json::to_vec_pretty(state).map_err(io::Error::other)?;
    fsutil::write_atomic(&state_dir.join(STATE_FILE), &json, 0o600)
}

/// The vGPUs nvidia-smi shows now (empty when it does not answer).
fn smi_gpus(settings: &Settings) -> Vec<crate::model::observe::smi::SmiGpu> {
    let argv = vec![settings.commands.nvidia_smi.clone(), "-q".to_string()];
    match crate::gridd::command::run(&argv, settings.commands.timeout) {
        Ok(out) if out.status.success() => crate::model::observe::smi::parse(&out.stdout)
            .map(|s| s.gpus)
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn io_err(what: String, e: io::Error, fix: &str) -> anyhow::Error {
    anyhow!("{what}: {e}; {fix}; {}", nothing_changed())
}

pub use crate::model::gridd_conf::MAX_GRIDD_CONF_BYTES;

/// A file the agent manages, read without following a link and without blocking, at most
/// `cap` bytes.
fn read_no_follow(path: &Path, cap: usize) -> io::Result<Vec<u8>> {
    input::read_file(path, cap, Links::Refuse).map_err(|e| match e {
        ReadError::Io(e) => e,
        other => io::Error::other(other.to_string()),
    })
}

fn refuse_symlink(path: &Path, what: &str) -> anyhow::Error {
    let to = fs::read_link(path)
        .map(|t| format!(" (pointing to {})", crate::model::text::show_path(&t)))
        .unwrap_or_default();
    anyhow!(
        "{what} {} is a symlink{to}; the agent never writes through a symlink: remove it (rm {}) and run install again; {}",
        crate::model::text::show_path(path),
        crate::model::text::show_path(path),
        nothing_changed()
    )
}

fn read_current(settings: &Settings) -> anyhow::Result<Current> {
    let dir = &settings.paths.token_dir;
    check_state_dir(settings)?;
    let listing = scan_token_dir(settings)?;
    let me = nix::unistd::geteuid().as_raw();
    if let Some(uid) = listing.uid {
        refuse_owner(
            "the token directory",
            dir,
            uid,
            me,
            "replace the token gridd reads",
        )?;
    }
    let mut strays = listing.strays;
    let mut temps = listing.temps;
    let token = match listing.token {
        None => None,
        Some(t) => previous_token(t, me, &mut strays)?,
    };
    temps.extend(gridd_conf_temps(settings));
    Ok(Current {
        dir_mode: listing.mode,
        token,
        strays: strays.into_iter().map(plan_stray).collect(),
        temps,
        conf: read_gridd_conf(&settings.paths.gridd_conf)?,
    })
}

/// A stray as the plan sees it.
fn plan_stray(s: crate::token::dir::Stray) -> crate::model::install::Stray {
    crate::model::install::Stray {
        path: s.path,
        name: s.name,
        verdict: s.verdict,
        other_token: s.other_token,
        sha256: s.sha256,
    }
}

/// Refused: `what` at `path` is owned by a user other than root and this one, who could
/// `harm` it.
fn refuse_owner(what: &str, path: &Path, uid: u32, me: u32, harm: &str) -> anyhow::Result<()> {
    if uid == 0 || uid == me {
        return Ok(());
    }
    Err(anyhow!(
        "{what} {} is owned by uid {uid}, who could {harm}: make it root's (chown root:root {}) and run install again; {}",
        show_path(path),
        show_path(path),
        nothing_changed()
    ))
}

/// The installed token as the one this install replaces, once it can be read and no other
/// user can rewrite it. One too large to be a token, or empty, is a stray instead: moved
/// aside whole, never copied.
fn previous_token(
    t: crate::token::dir::Installed,
    me: u32,
    strays: &mut Vec<crate::token::dir::Stray>,
) -> anyhow::Result<Option<Previous>> {
    if let crate::token::dir::Content::Unreadable(why) = &t.content {
        return Err(anyhow!(
            "cannot read the installed token {}: {why}; check its permissions; {}",
            show_path(&t.path),
            nothing_changed()
        ));
    }
    refuse_owner("the token", &t.path, t.uid, me, "rewrite it")?;
    if t.bytes.is_empty() && !matches!(t.content, crate::token::dir::Content::Token(_)) {
        let meta = fs::symlink_metadata(&t.path).ok();
        let verdict = match &t.content {
            crate::token::dir::Content::Invalid(e) => Some(e.to_string()),
            _ => None,
        };
        strays.push(crate::token::dir::Stray {
            verdict,
            ..crate::token::dir::Stray::plain(
                t.path,
                t.name,
                crate::token::dir::StrayKind::NotAToken,
                meta.as_ref(),
            )
        });
        return Ok(None);
    }
    Ok(Some(Previous {
        sha256: sha256_hex(&t.bytes),
        path: t.path,
        bytes: t.bytes,
        mode: t.mode,
        ino: t.ino,
    }))
}

/// Temporary files of an interrupted write of gridd.conf, beside it (those in the token
/// directory are the listing's).
fn gridd_conf_temps(settings: &Settings) -> Vec<PathBuf> {
    let conf_path = &settings.paths.gridd_conf;
    let mut temps = Vec::new();
    if let Some(name) = conf_path.file_name() {
        let prefix = fsutil::temp_prefix(&name.to_string_lossy());
        let conf_dir = conf_path.parent().unwrap_or(Path::new("/"));
        if conf_dir != settings.paths.token_dir.as_path() {
            for (n, p) in fsutil::list_dir(conf_dir).unwrap_or_default() {
                if n.to_string_lossy().starts_with(&prefix) {
                    temps.push(p);
                }
            }
        }
    }
    temps
}

/// gridd.conf's bytes and metadata, `None` where there is none; refused where it is a
/// symlink, not a regular file, or larger than any gridd.conf.
fn read_gridd_conf(conf_path: &Path) -> anyhow::Result<Option<crate::model::install::ConfNow>> {
    let cannot_read = |e: io::Error, fix: &str| {
        io_err(
            format!("cannot read {}", crate::model::text::show_path(conf_path)),
            e,
            fix,
        )
    };
    match fs::symlink_metadata(conf_path) {
        Ok(m) if m.file_type().is_symlink() => Err(refuse_symlink(conf_path, "gridd.conf")),
        Ok(m) if !m.is_file() => Err(anyhow!(
            "{} is not a regular file; move it away and run install again; {}",
            crate::model::text::show_path(conf_path),
            nothing_changed()
        )),
        Ok(m) if m.len() > MAX_GRIDD_CONF_BYTES as u64 => Err(anyhow!(
            "{} is {} bytes, larger than 1 MiB, which no gridd.conf is (the driver's template is about 2 KB); move it away (gridd works without a gridd.conf) and run install again; {}",
            crate::model::text::show_path(conf_path),
            m.len(),
            nothing_changed()
        )),
        Ok(m) => {
            let bytes = read_no_follow(conf_path, MAX_GRIDD_CONF_BYTES)
                .map_err(|e| cannot_read(e, "check its permissions"))?;
            Ok(Some(crate::model::install::ConfNow {
                bytes,
                mode: fsutil::mode_of(&m),
                owner: (m.uid(), m.gid()),
            }))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(cannot_read(e, "check its directory")),
    }
}

/// What `install` and the service's adoption ask of their shared core ([`run_core`]): plan,
/// then (unless a dry run) apply and restart. (The service's own core is
/// `service::core::Core`.)
struct InstallRequest<'a> {
    ask: Ask<'a>,
    /// `ask.bytes` were read from the token path itself, before the lock: they are adopted
    /// only if they are still what is there once the lock is held.
    in_place: bool,
}

/// How long install (and prepare-image, and the service's adoption) wait for the state
/// directory's lock: long enough for another install's restart of gridd to run out of time.
pub(crate) fn lock_wait(settings: &Settings) -> Duration {
    settings.commands.timeout * 2 + Duration::from_secs(30)
}

pub use crate::files::layout::{check_state_dir, expected_in_state_dir};

/// The token directory as [`crate::token::dir`] sees it, refused (with nothing changed) when it
/// is not a token directory.
pub fn scan_token_dir(settings: &Settings) -> anyhow::Result<crate::token::dir::Listing> {
    let listing = read_token_dir(settings)?;
    if let Some(why) = &listing.refusal {
        return Err(anyhow!("{why}; {}", nothing_changed()));
    }
    Ok(listing)
}

/// The token directory as it stands, with its refusal (if any) in the listing: an error only
/// where it cannot be read.
pub(super) fn read_token_dir(settings: &Settings) -> anyhow::Result<crate::token::dir::Listing> {
    let p = &settings.paths;
    let listing = crate::token::dir::scan(&p.token_dir, &p.token_file, &p.gridd_conf, Utc::now())
        .map_err(|e| {
        anyhow!(
            "the token directory {} (paths.token_dir) {e}; {}",
            show_path(&p.token_dir),
            nothing_changed()
        )
    })?;
    Ok(listing)
}

/// The token directory's entries (the token, strays, our temporary files), once it is known
/// to be a token directory.
pub fn token_dir_entries(settings: &Settings) -> anyhow::Result<Vec<(OsString, PathBuf)>> {
    let l = scan_token_dir(settings)?;
    let mut out: Vec<(OsString, PathBuf)> = l
        .token
        .into_iter()
        .map(|t| (t.name, t.path))
        .chain(l.strays.into_iter().map(|s| (s.name, s.path)))
        .chain(
            l.temps
                .into_iter()
                .map(|p| (p.file_name().unwrap_or_default().to_os_string(), p)),
        )
        .collect();
    out.sort();
    Ok(out)
}

fn take_lock(settings: &Settings) -> anyhow::Result<fsutil::Lock> {
    let state_dir = &settings.paths.state_dir;
    check_state_dir(settings)?;
    fsutil::create_dir_mode(state_dir, 0o755).map_err(|e| {
        io_err(
            format!(
                "cannot create the agent's state directory {}",
                crate::model::text::show_path(state_dir)
            ),
            e,
            "make it writable (or set paths.state_dir in the agent's config)",
        )
    })?;
    let path = state_dir.join(LOCK_FILE);
    let wait = lock_wait(settings);
    fsutil::lock(&path, wait).map_err(|e| match e {
        LockError::Busy => anyhow!(
            "another install (or the service) has held the lock {} for {}s; wait for it to finish and run install again; {}",
            crate::model::text::show_path(&path),
            wait.as_secs(),
            nothing_changed()
        ),
        LockError::Io(e) => io_err(
            format!("cannot take the lock {}", crate::model::text::show_path(&path)),
            e,
            "check the state directory",
        ),
    })
}

/// Why the shared core installed nothing.
#[derive(Debug)]
enum CoreError {
    /// `in_place`: another install replaced the token between the read and the lock.
    Superseded,
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for CoreError {
    fn from(e: anyhow::Error) -> Self {
        CoreError::Failed(e)
    }
}

fn run_core(core: InstallRequest<'_>, settings: &Settings) -> Result<Outcome, CoreError> {
    // Both directories are checked before the lock is taken: taking it creates the state
    // directory, and a refused install changes nothing.
    token_dir_entries(settings)?;
    check_state_dir(settings)?;
    let _lock = if core.ask.dry_run {
        None
    } else {
        Some(take_lock(settings)?)
    };
    let cur = read_current(settings)?;
    if core.in_place && cur.token.as_ref().map(|p| p.bytes.as_slice()) != Some(core.ask.bytes) {
        // Another install replaced (or removed) the token between the read and the lock:
        // writing the bytes read before would put the old token back over the new one.
        return Err(CoreError::Superseded);
    }
    let inputs = read_inputs(&core.ask, &cur, settings);
    let plan = Plan::make(core.ask, &cur, settings, inputs);
    if plan.outcome.dry_run {
        return Ok(plan.dry_run());
    }
    let made = apply(&plan, cur.token.as_ref(), settings)?;
    prune_replaced(&plan.replaced_root, &plan.stamp);
    // Whether systemd has gridd's unit is asked only of a restart the plan would make now.
    let unit_missing = plan.asks_unit() && crate::gridd::restart_unit_missing(settings);
    let (mut outcome, state) = plan.settled(made, unit_missing, &settings.gridd.unit);
    if let Some(mut state) = state {
        save_state(&mut state, settings, &mut outcome);
    }
    Ok(outcome)
}

/// What a plan is made from besides the request and what is in place, read or taken before
/// it: what the agent remembers, the token's SHA-256, the time (this run's name in
/// `replaced/`), and the vGPUs nvidia-smi shows where the FeatureType to set needs them.
fn read_inputs(ask: &Ask<'_>, cur: &Current, settings: &Settings) -> Inputs {
    let needs_gpus = crate::model::install::plan::needs_gpus(ask.feature_type, cur);
    Inputs {
        state: load_state(&settings.paths.state_dir),
        sha256: sha256_hex(ask.bytes),
        replaced_root: settings.paths.state_dir.join(REPLACED_DIR),
        stamp: Utc::now().format(STAMP_FORMAT).to_string(),
        gpus: if needs_gpus {
            smi_gpus(settings)
        } else {
            Vec::new()
        },
    }
}

/// Makes the restart a plan left due (`install`; the service makes its own through its
/// core): once it succeeds, none is owed any more.
pub fn make_restart(settings: &Settings, outcome: &mut Outcome) {
    if outcome.restart != Restart::Due {
        return;
    }
    let target = restart_target(settings);
    outcome.restart = match restart_gridd(settings) {
        Ok(()) => {
            if let Err(e) = restart_made(settings, target.as_deref()) {
                outcome.warnings.push(e);
            }
            Restart::Done
        }
        Err(e) => Restart::Failed(e),
    };
}

/// The token a restart of gridd beginning now is made for (its SHA-256): the one the last
/// adoption put in place. Taken before the restart, given to [`restart_made`] after it.
pub fn restart_target(settings: &Settings) -> Option<String> {
    load_state(&settings.paths.state_dir).token_sha256
}

/// A restart of gridd made for the token `target` ([`restart_target`]) succeeded: none is
/// owed for it any more (recorded under the install lock). A token adopted while it ran is
/// still owed its own: gridd may have started before it was in place. An error says what
/// could not be recorded.
pub fn restart_made(settings: &Settings, target: Option<&str>) -> Result<(), String> {
    let _lock = take_lock(settings).map_err(|e| format!("{e:#}"))?;
    let mut state = load_state(&settings.paths.state_dir);
    if !crate::model::restart::pays_owed(&state, target) {
        return Ok(());
    }
    state.restart_pending = false;
    store_state(&mut state, &settings.paths.state_dir).map_err(|e| {
        format!(
            "cannot record the restart in {}: {e}; the next adoption may restart nvidia-gridd once more",
            crate::model::text::show_path(&settings.paths.state_dir)
        )
    })
}

pub use crate::model::install::plan::REPLACED_KEPT;

/// Removes the directories of `replaced/` that the model says go
/// ([`replaced_to_prune`](crate::model::install::plan::replaced_to_prune)).
fn prune_replaced(root: &Path, this_run: &str) {
    let Ok(entries) = fsutil::list_dir(root) else {
        return;
    };
    let dirs: Vec<String> = entries
        .into_iter()
        .filter(|(_, p)| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .filter_map(|(n, _)| n.into_string().ok())
        .collect();
    for name in crate::model::install::plan::replaced_to_prune(&dirs, this_run) {
        let _ = fs::remove_dir_all(root.join(name));
    }
}

fn save_state(state: &mut InstallState, settings: &Settings, outcome: &mut Outcome) {
    if let Err(e) = store_state(state, &settings.paths.state_dir) {
        outcome.warnings.push(format!(
            "cannot record the install in {}: {e}; the next run may restart nvidia-gridd once more",
            crate::model::text::show_path(&settings.paths.state_dir)
        ));
    }
}

fn plan_entry(plan: &[Change], f: impl Fn(&Change) -> bool) -> Change {
    plan.iter().find(|c| f(c)).cloned().expect("in the plan")
}

/// Installs a token and gridd.conf (the library form of `install`, for callers that have the
/// token's bytes). A bad token is a [`TokenRejected`] error (see `downcast_ref`); every error
/// leaves the token and gridd.conf as they were.
pub fn install(req: &Request, settings: &Settings) -> anyhow::Result<Outcome> {
    refuse_where_observing(settings)?;
    install_at(req, settings, Utc::now())
}

/// `install` changes nothing where the agent only observes: on a GPU Operator node gridd
/// never reads the node's `/etc/nvidia`, and the operator's Secret is the place.
fn refuse_where_observing(settings: &Settings) -> anyhow::Result<()> {
    let node = crate::node::detect(settings);
    if node.mode == crate::model::node::Mode::Manage {
        return Ok(());
    }
    Err(match &node.driver_root {
        Some(root) => anyhow!(
            "this is a GPU Operator node: nvidia-gridd runs in the operator's driver container (root {}) and never reads a token installed here; {}; {}",
            show_path(root),
            crate::model::policy::operator_fix(node.node_name.as_deref()),
            nothing_changed()
        ),
        None => anyhow!(
            "service.mode = \"observe\" in the agent's config: it installs nothing here; set service.mode to \"auto\" or \"manage\" to install with it; {}",
            nothing_changed()
        ),
    })
}

/// [`install`] with the time the token's validity is checked against.
pub fn install_at(
    req: &Request,
    settings: &Settings,
    now: DateTime<Utc>,
) -> anyhow::Result<Outcome> {
    check_feature_type(req.feature_type)?;
    let (token, warning) = validate(&req.token, now, req.force)?;
    let ask = Ask {
        bytes: &req.token,
        feature_type: FeatureType::Set(req.feature_type),
        dry_run: req.dry_run,
        restart: req.restart,
        licensed: false,
        owe_restart: false,
        summary: summary(&req.token, &token),
        warnings: warnings(&req.token, &token, now, warning),
    };
    let mut outcome = run_core(
        InstallRequest {
            ask,
            in_place: false,
        },
        settings,
    )
    .map_err(|e| match e {
        CoreError::Failed(e) => e,
        // Not in place: an install writes its own bytes over whatever is there.
        CoreError::Superseded => anyhow!("the token was replaced during the install"),
    })?;
    make_restart(settings, &mut outcome);
    Ok(outcome)
}

#[cfg(test)]
mod tests;
