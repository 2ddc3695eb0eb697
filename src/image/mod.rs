//! `prepare-image`: ready a golden image so that clones start clean and no copy of the token
//! stays in it.
//!
//! It stops the agent and nvidia-gridd when they run (what they write after the cleaning would
//! be sealed into the image), removes the token, the agent's state (old tokens kept aside,
//! install records, live report, metrics) and a token source that is a file, with
//! `--purge-client-state` nvidia-gridd's client state, with `--cloud-init` what
//! `cloud-init clean --logs` removes, with `--journal` the journal's archived files. Then it
//! searches every place a token reaches on a guest (cloud-init's instance data, seed and logs,
//! the journal, the agent's config drop-ins, ...) for the token's bytes, raw and in the base64
//! forms cloud-init stores, also inside what cloud-init decodes (MIME parts, gzip, base64
//! documents: a second run, with no installed token left to compare with, still finds any
//! token there), and names each file that still holds them: the command then fails,
//! so that an image pipeline stops instead of shipping a token. Last, it records that the image
//! was prepared (beside the state directory), so that a clone's first boot does not report the
//! builder's last shutdown as its own.
//!
//! With `--root DIR` it acts on a mounted image tree instead: the config is read below DIR,
//! every configured path is taken below DIR (and refused when a symlink on the way could lead
//! out of it), and nothing on the builder itself (its services, its journal) is touched.

pub mod prepared;

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::anyhow;
use base64::Engine;
use chrono::Utc;

use crate::files::fsutil;
use crate::files::input::{self, Links};
use crate::model::config::Settings;
use crate::model::text::show_path;

/// The agent's own unit.
pub const AGENT_UNIT: &str = "vgpu-license-agent.service";

/// What `prepare-image` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub purge_client_state: bool,
    pub dry_run: bool,
    /// Do what `cloud-init clean --logs` does.
    pub cloud_init: bool,
    /// Rotate and vacuum the journal (below `root`: remove its files).
    pub journal: bool,
    /// A mounted image tree to act on, instead of this machine.
    pub root: Option<PathBuf>,
}

/// What `prepare-image` did (or, in a dry run, would do) and what it left.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prepared {
    pub dry_run: bool,
    /// Units stopped (or to be stopped).
    pub stopped: Vec<String>,
    /// Removed (or to be removed), in order.
    pub removed: Vec<PathBuf>,
    /// Commands run (or to be run) on the journal.
    pub ran: Vec<String>,
    /// gridd's client state directories that hold something, with their entries, left in
    /// place (without `--purge-client-state`).
    pub client_state_left: Vec<(PathBuf, usize)>,
    /// The agent's config drop-ins, kept: they are the image's intended config.
    pub kept_dropins: Vec<PathBuf>,
    /// Journal files kept (without `--journal`).
    pub journal_kept: usize,
    /// Files that still hold (or, in a dry run, would still hold) the token's bytes.
    pub holding: Vec<PathBuf>,
    /// Files that could not be searched whole (unreadable, or decoding past the cap), and
    /// why: whether they hold the token is not known.
    pub unsearched: Vec<(PathBuf, String)>,
    /// How many tokens were searched for (0: none was found to search for).
    pub tokens_known: usize,
    /// The record that the image was prepared.
    pub marker: Option<PathBuf>,
    /// The image's /etc/machine-id still holds an ID (clones would share it).
    pub machine_id_set: bool,
}

impl Prepared {
    /// The lines printed on standard output.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        self.done_lines(&mut out);
        self.kept_lines(&mut out);
        if let Some(m) = &self.marker {
            out.push(format!(
                "{} {}: a clone's first boot does not report this machine's last shutdown as its own",
                self.tense("recorded", "would record"),
                show_path(m)
            ));
        }
        self.sealing_lines(&mut out);
        out
    }

    /// `past`, or in a dry run `plan`.
    fn tense(&self, past: &'static str, plan: &'static str) -> &'static str {
        if self.dry_run { plan } else { past }
    }

    /// The units stopped, the files removed, the journal's commands run.
    fn done_lines(&self, out: &mut Vec<String>) {
        let (stop, remove, run) = (
            self.tense("stopped", "would stop"),
            self.tense("removed", "would remove"),
            self.tense("ran", "would run"),
        );
        for u in &self.stopped {
            out.push(format!(
                "{stop} {u}: what it writes after the cleaning would be sealed into the image"
            ));
        }
        out.extend(
            self.removed
                .iter()
                .map(|p| format!("{remove} {}", show_path(p))),
        );
        if self.removed.is_empty() {
            out.push("no token and no agent state to remove".into());
        }
        out.extend(self.ran.iter().map(|c| format!("{run} {c}")));
    }

    /// What was left in place: gridd's client state, the config's drop-ins, the journal.
    fn kept_lines(&self, out: &mut Vec<String>) {
        for (dir, n) in &self.client_state_left {
            out.push(format!(
                "left in place: nvidia-gridd's client state {} ({n} entries); clones must not share it: run again with --purge-client-state",
                show_path(dir)
            ));
        }
        for d in &self.kept_dropins {
            out.push(format!(
                "kept {}: the image's config (it holds no token)",
                show_path(d)
            ));
        }
        if self.journal_kept > 0 {
            out.push(format!(
                "kept the journal ({} files): it holds this machine's boots, gridd's lines about its lease among them; --journal removes them",
                self.journal_kept
            ));
        }
    }

    /// What stands between this machine and a sealed image: files that still hold a token,
    /// the machine ID.
    fn sealing_lines(&self, out: &mut Vec<String>) {
        if self.tokens_known == 0 {
            out.push(
                "no token found on this machine to search for; searched for any client configuration token's payload".into(),
            );
        }
        for h in &self.holding {
            out.push(format!(
                "still holds the token: {}{}",
                show_path(h),
                advice_for(h)
            ));
        }
        for (p, why) in &self.unsearched {
            out.push(format!(
                "not searched whole, may hold the token: {}: {why}{}",
                show_path(p),
                advice_for(p)
            ));
        }
        if self.machine_id_set {
            out.push(
                "before sealing the image: reset /etc/machine-id with your sealing tool (virt-sysprep --operations machine-id, or truncate -s 0 /etc/machine-id)".into(),
            );
        }
    }
}

fn advice_for(p: &Path) -> &'static str {
    let s = p.to_string_lossy();
    if s.contains("/var/lib/cloud/seed") {
        " (cloud-init's seed: remove it, or build the image from a seed without the token)"
    } else if s.contains("/var/lib/cloud") || s.contains("/var/log/cloud-init") {
        " (cloud-init's: --cloud-init removes it)"
    } else if s.contains("/var/log/journal") {
        " (the journal: --journal removes it)"
    } else {
        " (remove it, or take the token out of it)"
    }
}

pub use crate::image::prepared::{ImagePrepared, marker_path, previous_boot_is_the_builders};

/// A path of the config, taken below `root`.
fn under(root: &Path, p: &Path) -> PathBuf {
    let rel: PathBuf = p
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    root.join(rel)
}

/// Refuses a path below `root` that is reached through a symlink (which could lead out of the
/// image, onto the builder).
fn no_link_on_the_way(root: &Path, p: &Path) -> anyhow::Result<()> {
    let Ok(rel) = p.strip_prefix(root) else {
        return Ok(());
    };
    let mut at = root.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    for c in parts.iter().take(parts.len().saturating_sub(1)) {
        at.push(c);
        if fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(anyhow!(
                "{} is reached through a symlink ({}) that may lead out of the image; prepare-image --root never follows one: mount the image so that the path is real, or run prepare-image inside it; nothing was changed",
                show_path(p),
                show_path(&at)
            ));
        }
    }
    Ok(())
}

/// The settings for `--root DIR`: the config read below DIR (`config` taken below it), every
/// path of it taken below DIR.
pub fn settings_under(root: &Path, config: &Path) -> anyhow::Result<Settings> {
    check_root(root)?;
    let mut s = crate::config::load(&under(root, config))?;
    paths_under(root, &mut s.paths)?;
    Ok(s)
}

/// `--root DIR` is a directory, and not the running system: its journal is live, not files
/// to remove.
fn check_root(root: &Path) -> anyhow::Result<()> {
    if !root.is_dir() {
        return Err(anyhow!(
            "--root {}: not a directory; give the directory the image is mounted on",
            show_path(root)
        ));
    }
    let same = |a: &Path, b: &Path| {
        use std::os::unix::fs::MetadataExt;
        matches!((std::fs::metadata(a), std::fs::metadata(b)), (Ok(x), Ok(y)) if (x.dev(), x.ino()) == (y.dev(), y.ino()))
    };
    if same(root, Path::new("/")) {
        return Err(anyhow!(
            "--root {} is the running system, not a mounted image: run prepare-image without --root to prepare this machine; nothing was changed",
            show_path(root)
        ));
    }
    Ok(())
}

/// Every path of the config taken below `root`, none reached through a symlink.
fn paths_under(root: &Path, p: &mut crate::model::config::Paths) -> anyhow::Result<()> {
    for path in [
        &mut p.token_dir,
        &mut p.gridd_conf,
        &mut p.state_dir,
        &mut p.status_file,
        &mut p.metrics_textfile,
    ] {
        *path = under(root, path);
    }
    for d in &mut p.gridd_client_state {
        *d = under(root, d);
    }
    if let Some(t) = &mut p.token_source {
        *t = under(root, t);
    }
    let all: Vec<PathBuf> = [
        &p.token_dir,
        &p.gridd_conf,
        &p.state_dir,
        &p.status_file,
        &p.metrics_textfile,
    ]
    .into_iter()
    .chain(p.gridd_client_state.iter())
    .chain(p.token_source.iter())
    .cloned()
    .collect();
    for path in &all {
        no_link_on_the_way(root, path)?;
    }
    Ok(())
}

/// Where the system's files are: `/`, or the image's root.
fn sys(req: &Request, rel: &str) -> PathBuf {
    req.root.as_deref().unwrap_or(Path::new("/")).join(rel)
}

fn entries(dir: &Path) -> io::Result<Vec<PathBuf>> {
    Ok(fsutil::list_dir(dir)?.into_iter().map(|(_, p)| p).collect())
}

/// Whether a unit is running, by `systemctl is-active`. A machine without systemd, or
/// without the unit (a builder with no NVIDIA driver yet), has nothing to stop.
fn is_active(settings: &Settings, unit: &str) -> bool {
    let argv = [settings.commands.systemctl.as_str(), "is-active", unit].map(String::from);
    crate::gridd::command::run(&argv, settings.commands.timeout).is_ok_and(|o| {
        matches!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "active" | "activating" | "reloading" | "deactivating"
        )
    })
}

fn stop(settings: &Settings, unit: &str) -> anyhow::Result<()> {
    let argv = [settings.commands.systemctl.as_str(), "stop", unit].map(String::from);
    let out = crate::gridd::command::run(&argv, settings.commands.timeout)
        .map_err(|e| anyhow!("cannot stop {unit}: {}: {e}", settings.commands.systemctl))?;
    if !out.status.success() {
        return Err(anyhow!(
            "cannot stop {unit}: {}; stop it yourself and run prepare-image again; nothing was removed",
            out.last_line().unwrap_or_else(|| out.status.to_string())
        ));
    }
    Ok(())
}

/// The token's bytes as they may be stored: raw, base64 (cloud-init's `encoding: b64`), and
/// inside the base64 of a whole document that holds either (a MIME part, a base64 user-data),
/// at each of the three offsets a base64 encoding can start at. Each form is searched for by
/// pieces of 24 characters taken from its end (the signature, unique to this token), enough
/// of them that a form wrapped at 76 characters a line (or at 48 or more) still shows one
/// whole.
fn needles_of(token: &[u8]) -> Vec<Vec<u8>> {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let raw = token.trim_ascii().to_vec();
    let mut forms = vec![raw.clone()];
    for s in [raw.clone(), b64.encode(&raw).into_bytes()] {
        for skip in 0..3 {
            if s.len() > skip {
                forms.push(b64.encode(&s[skip..]).into_bytes());
            }
        }
    }
    const PIECE: usize = 24;
    const SPAN: usize = 8 * PIECE;
    let mut out = Vec::new();
    for f in forms {
        // The last quantum of a base64 form depends on what follows it in a document.
        let end = f.len().saturating_sub(4);
        let start = end.saturating_sub(SPAN);
        let mut at = start;
        while at + PIECE <= end {
            out.push(f[at..at + PIECE].to_vec());
            at += PIECE;
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Any client configuration token, without knowing its bytes: the name of the payload's
/// `service_instance_configuration`, base64url-encoded as in the token (at each offset), and
/// the base64 of that (a token or a document holding it, base64-encoded).
fn any_token_needles() -> Vec<Vec<u8>> {
    let url = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let b64 = &base64::engine::general_purpose::STANDARD;
    let key = br#""service_instance_configuration""#;
    let mut out = Vec::new();
    for skip in 0..3 {
        let piece = &key[skip..skip + (key.len() - skip) / 3 * 3];
        let enc = url.encode(piece).into_bytes();
        for s2 in 0..3 {
            let piece2 = &enc[s2..s2 + (enc.len() - s2) / 3 * 3];
            out.push(b64.encode(piece2).into_bytes());
        }
        out.push(enc);
    }
    out
}

/// A document up to this size is also searched in the forms cloud-init decodes (user-data is
/// far smaller: cloud providers cap it at 16 to 64 KiB).
const DECODED_MAX: u64 = 4 << 20;

/// Whether the file holds any of `needles`, read in blocks (a journal file can be large), or,
/// a document of [`DECODED_MAX`] or less, holds one in a form cloud-init decodes (a MIME
/// part, gzip, base64: [`crate::model::userdata`]).
fn holds(path: &Path, needles: &[memchr::memmem::Finder<'_>]) -> io::Result<bool> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    let found = |hay: &[u8]| needles.iter().any(|n| n.find(hay).is_some());
    if f.metadata()?.len() <= DECODED_MAX && !is_journal(path) {
        let mut whole = Vec::new();
        f.take(DECODED_MAX).read_to_end(&mut whole)?;
        if found(&whole) {
            return Ok(true);
        }
        let forms = crate::model::userdata::decoded_forms(&whole).map_err(io::Error::other)?;
        return Ok(forms.iter().any(|form| found(form)));
    }
    let keep = needles.iter().map(|n| n.needle().len()).max().unwrap_or(0);
    let mut buf = vec![0u8; 1 << 20];
    let mut have = 0;
    loop {
        let n = f.read(&mut buf[have..])?;
        if n == 0 {
            return Ok(false);
        }
        have += n;
        if found(&buf[..have]) {
            return Ok(true);
        }
        let tail = have.min(keep);
        buf.copy_within(have - tail..have, 0);
        have = tail;
    }
}

/// The files of `places` that hold a needle, and those that could not be searched whole,
/// with why: a file the run cannot vouch for is never called clean.
fn search(
    places: Vec<PathBuf>,
    finders: &[memchr::memmem::Finder<'_>],
) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
    let mut holding = Vec::new();
    let mut unsearched = Vec::new();
    for f in places {
        match holds(&f, finders) {
            Ok(true) => holding.push(f),
            Ok(false) => {}
            // Gone since it was listed: nothing left there to hold a token.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                let why = e.to_string();
                unsearched.push((f, why));
            }
        }
    }
    (holding, unsearched)
}

/// The regular files below `p` (or `p` itself), symlinks not followed.
fn walk(p: &Path, out: &mut Vec<PathBuf>) {
    let Ok(m) = fs::symlink_metadata(p) else {
        return;
    };
    if m.is_file() {
        out.push(p.to_path_buf());
    } else if m.is_dir()
        && let Ok(list) = fsutil::list_dir(p)
    {
        for (_, e) in list {
            walk(&e, out);
        }
    }
}

/// Entries of `dir` whose name starts with `prefix` (and ends with `suffix`).
fn matching(dir: &Path, prefix: &str, suffix: &str) -> Vec<PathBuf> {
    fsutil::list_dir(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|(n, _)| {
            let n = n.to_string_lossy();
            n.starts_with(prefix) && n.ends_with(suffix)
        })
        .map(|(_, p)| p)
        .collect()
}

/// The journal's files: `<var/log/journal>/<machine-id>/*.journal` (and `*.journal~`).
fn journal_files(req: &Request) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (_, d) in fsutil::list_dir(&sys(req, "var/log/journal")).unwrap_or_default() {
        if fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir()) {
            out.extend(matching(&d, "", ".journal").into_iter().chain(matching(
                &d,
                "",
                ".journal~",
            )));
        }
    }
    out.sort();
    out
}

/// What `cloud-init clean --logs` removes: all of `/var/lib/cloud` but its seed, and its logs.
fn cloud_init_plan(req: &Request) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fsutil::list_dir(&sys(req, "var/lib/cloud"))
        .unwrap_or_default()
        .into_iter()
        .filter(|(n, _)| n != "seed")
        .map(|(_, p)| p)
        .collect();
    out.extend(matching(&sys(req, "var/log"), "cloud-init", ".log"));
    out
}

/// The tokens on this machine (the token directory, the ones kept aside, the token source),
/// to search for.
fn known_tokens(settings: &Settings, token_entries: &[PathBuf]) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = token_entries.to_vec();
    walk(
        &settings
            .paths
            .state_dir
            .join(crate::files::layout::REPLACED_DIR),
        &mut files,
    );
    if let Some(src) = &settings.paths.token_source {
        walk(src, &mut files);
    }
    let mut out: Vec<Vec<u8>> = files
        .iter()
        .filter_map(|f| input::read_file(f, 1 << 20, Links::Refuse).ok())
        .map(|b| b.trim_ascii().to_vec())
        .filter(|b| b.len() >= 64 && b.iter().filter(|&&c| c == b'.').count() >= 2)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Everything prepare-image would remove, checked first: a directory that is a symlink or
/// holds what is not the agent's (or gridd's) stops the whole command, with nothing removed.
struct Plan {
    token_entries: Vec<PathBuf>,
    remove: Vec<PathBuf>,
    client_state_left: Vec<(PathBuf, usize)>,
}

fn plan(settings: &Settings, req: &Request) -> anyhow::Result<Plan> {
    let paths = &settings.paths;
    let token_entries: Vec<PathBuf> = crate::install::token_dir_entries(settings)?
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    let mut remove = token_entries.clone();
    crate::files::layout::check_state_dir(settings)?;
    remove.extend(entries(&paths.state_dir).map_err(|e| {
        anyhow!(
            "cannot read {}: {e}; check it and run prepare-image again",
            show_path(&paths.state_dir)
        )
    })?);
    remove.extend(agent_outputs(paths)?);
    // A token source that is a file in the image is a copy of the token; a directory (a
    // mount point) is only searched.
    if let Some(src) = &paths.token_source
        && fs::symlink_metadata(src).is_ok_and(|m| m.is_file())
    {
        remove.push(src.clone());
    }
    let left = client_state(paths, req.purge_client_state, &mut remove)?;
    if req.cloud_init {
        remove.extend(cloud_init_plan(req));
    }
    if req.journal && req.root.is_some() {
        remove.extend(journal_files(req));
    }
    // The lock file is no state: it is removed last and silently, held until the end.
    let lock_path = paths.state_dir.join(crate::files::layout::LOCK_FILE);
    remove.retain(|p| *p != lock_path);
    // In an image, cloud-init's and the journal's places too must be the image's own.
    if let Some(root) = &req.root {
        for p in &remove {
            no_link_on_the_way(root, p)?;
        }
    }
    Ok(Plan {
        token_entries,
        remove,
        client_state_left: left,
    })
}

/// The agent's status file and metrics textfile, where they are files (or links).
fn agent_outputs(paths: &crate::model::config::Paths) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for (key, f) in [
        ("paths.status_file", &paths.status_file),
        ("paths.metrics_textfile", &paths.metrics_textfile),
    ] {
        match f.symlink_metadata() {
            Ok(m) if m.is_file() || m.file_type().is_symlink() => out.push(f.clone()),
            Ok(_) => {
                return Err(anyhow!(
                    "{} ({key}) is not a file; the agent removes only its own files: check the config; nothing was removed",
                    show_path(f)
                ));
            }
            Err(_) => {}
        }
    }
    Ok(out)
}

/// gridd's client state: its entries go to `remove` with `purge`; otherwise the directories
/// that hold something are left, with their number of entries.
fn client_state(
    paths: &crate::model::config::Paths,
    purge: bool,
    remove: &mut Vec<PathBuf>,
) -> anyhow::Result<Vec<(PathBuf, usize)>> {
    let mut left = Vec::new();
    for dir in &paths.gridd_client_state {
        let inside: Vec<PathBuf> =
            crate::identity::client_state_entries(dir, "nothing was removed")?
                .into_iter()
                .map(|(_, p)| p)
                .collect();
        if inside.is_empty() {
            continue;
        }
        if purge {
            remove.extend(inside);
        } else {
            left.push((dir.clone(), inside.len()));
        }
    }
    Ok(left)
}

/// The files searched for the token's bytes once the cleaning is done.
fn search_places(settings: &Settings, req: &Request, config: &Path) -> Vec<PathBuf> {
    let p = &settings.paths;
    let mut places = vec![
        p.token_dir.clone(),
        p.state_dir.clone(),
        p.status_file.clone(),
        p.metrics_textfile.clone(),
        sys(req, "var/lib/cloud"),
    ];
    places.extend(p.token_source.iter().cloned());
    places.extend(matching(&sys(req, "var/log"), "cloud-init", ".log"));
    places.extend(journal_files(req));
    if let Some(dir) = config.parent() {
        places.push(dir.to_path_buf());
    }
    let mut files = Vec::new();
    for place in places {
        walk(&place, &mut files);
    }
    files.sort();
    files.dedup();
    files
}

/// Readies the image. `config` is the agent's config file (already below the root for
/// `--root`), for its drop-ins.
pub fn prepare(settings: &Settings, req: &Request, config: &Path) -> anyhow::Result<Prepared> {
    let first = plan(settings, req)?;
    let tokens = known_tokens(settings, &first.token_entries);
    let mut needles: Vec<Vec<u8>> = tokens.iter().flat_map(|t| needles_of(t)).collect();
    needles.extend(any_token_needles());
    let finders: Vec<memchr::memmem::Finder<'_>> =
        needles.iter().map(memchr::memmem::Finder::new).collect();
    let dropins: Vec<PathBuf> = config
        .parent()
        .map(|d| matching(&d.join("config.d"), "", ".toml"))
        .unwrap_or_default();
    let mut done = Prepared {
        dry_run: req.dry_run,
        client_state_left: first.client_state_left.clone(),
        kept_dropins: dropins,
        tokens_known: tokens.len(),
        machine_id_set: machine_id_set(req),
        ..Prepared::default()
    };
    // Services: never the builder's when acting on an image.
    if req.root.is_none() {
        done.stopped = stop_services(settings, req.dry_run)?;
    }
    let journal_cmds = journal_commands(settings, req);
    if req.dry_run {
        return Ok(dry_run(
            done,
            first,
            journal_cmds,
            settings,
            req,
            config,
            &finders,
        ));
    }
    let _lock = clean(settings, req, &journal_cmds, &mut done)?;
    (done.holding, done.unsearched) = search(search_places(settings, req, config), &finders);
    done.marker = record_prepared(settings, req)?;
    Ok(done)
}

/// The cleaning, under install's lock, which it returns to be held until the end (no install
/// or adopt runs meanwhile): what the plan removes, planned again (the services may have
/// written more before they stopped), then the journal's commands.
fn clean(
    settings: &Settings,
    req: &Request,
    journal_cmds: &[Vec<String>],
    done: &mut Prepared,
) -> anyhow::Result<Option<fsutil::Lock>> {
    let lock_path = settings
        .paths
        .state_dir
        .join(crate::files::layout::LOCK_FILE);
    let lock = prepare_lock(settings, &lock_path)?;
    done.removed = remove_all(plan(settings, req)?.remove)?;
    let _ = fs::remove_file(&lock_path);
    done.ran = run_journal_commands(settings, journal_cmds)?;
    if !req.journal {
        done.journal_kept = journal_files(req).len();
    }
    Ok(lock)
}

/// Whether the image's /etc/machine-id holds an ID. Empty (or missing) is how a sealed image
/// has it: systemd makes a new one at boot.
fn machine_id_set(req: &Request) -> bool {
    std::fs::read(match &req.root {
        Some(r) => under(r, Path::new("/etc/machine-id")),
        None => PathBuf::from("/etc/machine-id"),
    })
    .is_ok_and(|b| !b.trim_ascii().is_empty() && b.trim_ascii() != b"uninitialized")
}

/// The agent and gridd stopped where they run (what they write after the cleaning would be
/// sealed into the image); in a dry run, named only.
fn stop_services(settings: &Settings, dry_run: bool) -> anyhow::Result<Vec<String>> {
    let mut stopped = Vec::new();
    for unit in [AGENT_UNIT, settings.gridd.unit.as_str()] {
        if is_active(settings, unit) {
            if !dry_run {
                stop(settings, unit)?;
            }
            stopped.push(unit.to_string());
        }
    }
    Ok(stopped)
}

/// With `--journal` on the running system: `journalctl --rotate`, then `--vacuum-time=1s`.
fn journal_commands(settings: &Settings, req: &Request) -> Vec<Vec<String>> {
    if req.journal && req.root.is_none() {
        ["--rotate", "--vacuum-time=1s"]
            .iter()
            .map(|a| vec![settings.commands.journalctl.clone(), a.to_string()])
            .collect()
    } else {
        Vec::new()
    }
}

/// What a run would do, and what would still hold a token after it: nothing is changed.
fn dry_run(
    mut done: Prepared,
    first: Plan,
    journal_cmds: Vec<Vec<String>>,
    settings: &Settings,
    req: &Request,
    config: &Path,
    finders: &[memchr::memmem::Finder<'_>],
) -> Prepared {
    let going: std::collections::BTreeSet<&PathBuf> = first.remove.iter().collect();
    let mut gone = Vec::new();
    for p in &first.remove {
        walk(p, &mut gone);
    }
    let places = search_places(settings, req, config)
        .into_iter()
        .filter(|f| !going.contains(f) && !gone.contains(f))
        .filter(|f| !(req.journal && is_journal(f)))
        .collect();
    (done.holding, done.unsearched) = search(places, finders);
    done.removed = first.remove;
    done.ran = journal_cmds.iter().map(|c| c.join(" ")).collect();
    done.journal_kept = if req.journal {
        0
    } else {
        journal_files(req).len()
    };
    done.marker = Some(marker_path(&settings.paths.state_dir));
    done
}

/// install's lock, where the state directory exists.
fn prepare_lock(settings: &Settings, lock_path: &Path) -> anyhow::Result<Option<fsutil::Lock>> {
    let state_dir = &settings.paths.state_dir;
    if !state_dir.is_dir() {
        return Ok(None);
    }
    let wait = crate::install::lock_wait(settings);
    fsutil::lock(lock_path, wait)
        .map(Some)
        .map_err(|e| match e {
            fsutil::LockError::Busy => anyhow!(
                "cannot take the lock in {}: an install is running; wait for it and run prepare-image again",
                show_path(state_dir)
            ),
            fsutil::LockError::Io(e) => anyhow!(
                "cannot open the lock {}: {e}; prepare-image must be able to write the state directory (run it as root, on a writable image); nothing was removed",
                show_path(lock_path)
            ),
        })
}

/// Removes each path (a tree), in order; returns those removed.
fn remove_all(paths: Vec<PathBuf>) -> anyhow::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for p in paths {
        match fsutil::remove_tree(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(anyhow!(
                    "cannot remove {}: {e}; remove it yourself and run prepare-image again (removed so far: {})",
                    show_path(&p),
                    removed.len()
                ));
            }
        }
        removed.push(p);
    }
    Ok(removed)
}

/// Runs the journal's commands; returns them as run.
fn run_journal_commands(settings: &Settings, cmds: &[Vec<String>]) -> anyhow::Result<Vec<String>> {
    let mut ran = Vec::new();
    for argv in cmds {
        let out = crate::gridd::command::run(argv, settings.commands.timeout)
            .map_err(|e| anyhow!("cannot run {}: {e}", argv.join(" ")))?;
        if !out.status.success() {
            return Err(anyhow!(
                "{} failed: {}; clean the journal yourself and run prepare-image again",
                argv.join(" "),
                out.last_line().unwrap_or_else(|| out.status.to_string())
            ));
        }
        ran.push(argv.join(" "));
    }
    Ok(ran)
}

/// The record that this image was prepared, for the clone's first boot (where the state
/// directory's parent exists).
fn record_prepared(settings: &Settings, req: &Request) -> anyhow::Result<Option<PathBuf>> {
    let marker = ImagePrepared {
        at: crate::model::time::rfc3339(Utc::now()),
        boot_id: if req.root.is_none() {
            crate::identity::boot_id()
        } else {
            None
        },
    };
    let path = marker_path(&settings.paths.state_dir);
    if !path.parent().is_some_and(Path::is_dir) {
        return Ok(None);
    }
    fsutil::write_atomic(&path, &serde_json::to_vec_pretty(&marker)?, 0o644).map_err(|e| {
        anyhow!(
            "cannot write {}: {e}; make it writable and run prepare-image again",
            show_path(&path)
        )
    })?;
    Ok(Some(path))
}

fn is_journal(p: &Path) -> bool {
    p.to_string_lossy().contains("/var/log/journal/")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;

    fn finds(needles: &[Vec<u8>], hay: &[u8]) -> bool {
        needles
            .iter()
            .any(|n| memchr::memmem::find(hay, n).is_some())
    }

    fn token() -> Vec<u8> {
        token_signed((0..=255u8).collect())
    }

    fn token_signed(sig: Vec<u8>) -> Vec<u8> {
        let u = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let payload = br#"{"jti":"t1","service_instance_configuration":{"node_url_list":[{"url":"dls.example"}]},"exp":2078691200}"#;
        format!(
            "{}.{}.{}",
            u.encode(br#"{"alg":"RS256","typ":"JWT"}"#),
            u.encode(payload),
            u.encode(sig)
        )
        .into_bytes()
    }

    #[test]
    fn the_token_is_found_raw_in_base64_and_inside_a_base64_document_wrapped_or_not() {
        let b64 = &base64::engine::general_purpose::STANDARD;
        let t = token();
        let n = needles_of(&t);
        assert!(finds(&n, &[b"content: ".as_slice(), &t].concat()));
        assert!(finds(&n, b64.encode(&t).as_bytes()));
        for prefix in ["", "a", "ab", "#cloud-config\nwrite_files:\n- content: "] {
            let doc = [prefix.as_bytes(), &t, b"\n"].concat();
            let whole = b64.encode(&doc);
            assert!(finds(&n, whole.as_bytes()), "prefix {prefix:?}");
            // Wrapped as base64(1) and MIME do.
            let wrapped: Vec<u8> = whole
                .as_bytes()
                .chunks(76)
                .flat_map(|c| [c, b"\n"].concat())
                .collect();
            assert!(finds(&n, &wrapped), "wrapped, prefix {prefix:?}");
            let inner = [prefix.as_bytes(), b64.encode(&t).as_bytes()].concat();
            assert!(
                finds(&n, b64.encode(&inner).as_bytes()),
                "b64 in b64 {prefix:?}"
            );
        }
        // Another token is not this one.
        let other = token_signed((0..=255u8).rev().collect());
        assert!(!finds(&n, &other));
        assert!(!finds(&n, b64.encode(&other).as_bytes()));
        assert!(!finds(&n, b"nothing here"));
    }

    #[test]
    fn any_token_is_found_by_its_payload_even_unknown() {
        let b64 = &base64::engine::general_purpose::STANDARD;
        let n = any_token_needles();
        let t = token();
        assert!(finds(&n, &t));
        assert!(finds(&n, b64.encode(&t).as_bytes()));
        for prefix in ["", "x", "xy"] {
            let doc = [prefix.as_bytes(), &t].concat();
            assert!(finds(&n, b64.encode(&doc).as_bytes()), "{prefix:?}");
        }
        assert!(!finds(
            &n,
            b"service_instance_configuration is documented here"
        ));
    }

    #[test]
    fn the_marker_covers_the_builders_boot_and_none_after() {
        let m = ImagePrepared {
            at: "2026-12-01T10:00:00Z".into(),
            boot_id: Some("0a1b2c3d-0000-0000-0000-000000000001".into()),
        };
        assert!(m.covers(Some("0a1b2c3d000000000000000000000001"), None));
        assert!(!m.covers(Some("ffff2c3d000000000000000000000001"), None));
        // Another of the builder's boots, one that ended before the image was prepared.
        let t = |s: &str| Some(DateTime::parse_from_rfc3339(s).unwrap().to_utc());
        assert!(m.covers(
            Some("ffff2c3d000000000000000000000001"),
            t("2026-12-01T09:00:00Z")
        ));
        // The clone's own boot, after it.
        assert!(!m.covers(
            Some("ffff2c3d000000000000000000000001"),
            t("2026-12-01T11:00:00Z")
        ));
        let img = ImagePrepared {
            at: "2026-12-01T10:00:00Z".into(),
            boot_id: None,
        };
        let t = |s: &str| Some(DateTime::parse_from_rfc3339(s).unwrap().to_utc());
        assert!(img.covers(Some("x"), t("2026-12-01T09:59:00Z")));
        assert!(!img.covers(Some("x"), t("2026-12-01T10:01:00Z")));
        assert!(!img.covers(None, None));
    }

    #[test]
    fn a_path_is_taken_below_the_root() {
        assert_eq!(
            under(Path::new("/mnt/img"), Path::new("/var/lib/x")),
            PathBuf::from("/mnt/img/var/lib/x")
        );
        assert_eq!(
            under(Path::new("/mnt/img"), Path::new("/../../etc")),
            PathBuf::from("/mnt/img/etc")
        );
        assert_eq!(
            marker_path(Path::new("/var/lib/vgpu-license-agent")),
            PathBuf::from("/var/lib/vgpu-license-agent.image-prepared.json")
        );
    }
}
