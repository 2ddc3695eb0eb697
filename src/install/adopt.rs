//! The service's adoption of a token it did not install: one that cloud-init's `write_files`
//! (or a person) dropped into the token directory, or one from `[paths] token_source`. Through
//! the same core as `install`, so the same validation, atomic writes and strays handling.

use super::*;

/// Adopts a token that cloud-init (`write_files`) or an operator put into the token directory,
/// under any name ([`crate::token::dir`]; it keeps its name): validates it, sets its mode to 0744 (directory 0755), moves the other files of the
/// token directory aside, sets FeatureType from the config, and restarts nvidia-gridd when
/// any of that changed or the agent has not restarted gridd since this token appeared.
///
/// Errors: no token at the path, a bad or expired token, a token replaced meanwhile, or an
/// I/O error ([`AdoptError`]); in each case nothing was changed.
///
/// `licensed`: gridd holds a license now; then a token it already found on its own (no file
/// changed) does not cost it its lease through a restart.
pub fn adopt_dropped_token(
    settings: &Settings,
    licensed: bool,
    may_restart: bool,
) -> Result<Outcome, AdoptError> {
    // The token is whatever file gridd would read as one, under any name.
    let listing = super::read_token_dir(settings)?;
    adopt_listing(settings, listing, licensed, may_restart)
}

/// [`adopt_dropped_token`] of the directory as `listing` shows it.
fn adopt_listing(
    settings: &Settings,
    listing: crate::token::dir::Listing,
    licensed: bool,
    may_restart: bool,
) -> Result<Outcome, AdoptError> {
    if let Some(why) = &listing.refusal {
        return Err(AdoptError::Refused(format!(
            "{why}; {}",
            super::nothing_changed()
        )));
    }
    let Some(found) = listing.token else {
        return Err(AdoptError::NoToken(settings.paths.token_dir.clone()));
    };
    match found.content {
        crate::token::dir::Content::Token(_) => {}
        crate::token::dir::Content::Invalid(e) => {
            return Err(AdoptError::Rejected(TokenRejected::Invalid(e)));
        }
        crate::token::dir::Content::Unreadable(why) => {
            return Err(AdoptError::Refused(format!(
                "cannot read the token {}: {why}",
                show_path(&found.path)
            )));
        }
    }
    let how = Adoption {
        licensed,
        may_restart,
        in_place: true,
    };
    adopt_bytes(settings, &found.bytes, how)
}

/// The service's adoption of a token's bytes (from the token directory or the source):
/// validated, then installed with the config's FeatureType. A restart the changes need is
/// [`Restart::Due`](crate::model::install::Restart::Due) where `may_restart` (the service's core makes
/// it), else deferred: owed until the budget allows.
pub(super) fn adopt_bytes(
    settings: &Settings,
    bytes: &[u8],
    how: Adoption,
) -> Result<Outcome, AdoptError> {
    let (token, _) = validate(bytes, Utc::now(), false).map_err(AdoptError::Rejected)?;
    let ask = Ask {
        bytes,
        feature_type: if settings.gridd.feature_type_configured {
            FeatureType::Set(settings.gridd.feature_type)
        } else {
            FeatureType::Default(settings.gridd.feature_type)
        },
        dry_run: false,
        // Token changes spend the same restart budget and backoff as every other restart
        // of gridd: while they say wait, the restart is owed.
        restart: how.may_restart,
        licensed: how.licensed,
        owe_restart: true,
        summary: summary(bytes, &token),
        warnings: warnings(bytes, &token, Utc::now(), None),
    };
    let core = InstallRequest {
        ask,
        in_place: how.in_place,
    };
    Ok(run_core(core, settings)?)
}

/// How the service adopts: whether gridd holds a license, whether its remedy allows a
/// restart now, and whether the bytes were read from the token path itself.
#[derive(Debug, Clone, Copy)]
pub struct Adoption {
    /// gridd already holds a license: a token it found on its own needs no restart.
    pub licensed: bool,
    /// The restart budget and backoff allow a restart now; else one the changes need is
    /// owed.
    pub may_restart: bool,
    /// The bytes were read from the token path before the lock: adopted only if they are
    /// still what is there.
    pub in_place: bool,
}

/// The service's adoption: from `paths.token_source` when one is set and holds a token other
/// than the installed one, else a token dropped into the token directory
/// ([`adopt_dropped_token`]).
pub fn adopt(
    settings: &Settings,
    licensed: bool,
    may_restart: bool,
) -> Result<Outcome, AdoptError> {
    if let Some(source) = &settings.paths.token_source
        && let Some(adopted) = adopt_from_source(settings, source, may_restart)
    {
        return adopted;
    }
    // The token is whatever file gridd would read as one, under any name. A file written a
    // moment ago may be half written (`cp` creates, then writes): it is looked at again once
    // it is still, never judged (or moved aside) mid-write.
    let listing = super::read_token_dir(settings)?;
    if let Some(wait) = listing.settling(Utc::now(), SETTLE) {
        return Err(AdoptError::Settling(wait));
    }
    adopt_listing(settings, listing, licensed, may_restart)
}

/// The token source's token, installed where it is not the installed one already (`None`:
/// it is, and the token directory is looked at as without a source).
fn adopt_from_source(
    settings: &Settings,
    source: &Path,
    may_restart: bool,
) -> Option<Result<Outcome, AdoptError>> {
    let installed = scan_token_dir(settings)
        .ok()
        .and_then(|l| l.token)
        .map(|t| t.bytes);
    // What stays while the source gives nothing: the installed token, or none.
    let stays = if installed.is_some() {
        "the installed token stays"
    } else {
        "no token is installed until it gives one"
    };
    let refused = |r| source_refusal(r, source, stays);
    let bytes = match read_source(source, &settings.paths.token_file) {
        Ok(bytes) => bytes,
        Err(r) => return Some(Err(refused(r))),
    };
    if installed.as_deref() == Some(bytes.as_slice()) {
        return None;
    }
    // A bad token is refused here, before anything changes: the installed one stays.
    // A new token: gridd must be restarted for it, license held or not.
    let how = Adoption {
        licensed: false,
        may_restart,
        in_place: false,
    };
    Some(adopt_bytes(settings, &bytes, how).map_err(|e| match e {
        AdoptError::Rejected(r) => refused(r),
        e => e,
    }))
}

/// Why the token source's token was not installed, and what stays meanwhile.
fn source_refusal(r: TokenRejected, source: &Path, stays: &str) -> AdoptError {
    match r {
        TokenRejected::Source(why) => AdoptError::SourceRejected(format!("{why}; {stays}")),
        // A Secret cannot take `install --force`: the fix is a current token in it.
        TokenRejected::Untimely { why, .. } => AdoptError::SourceRejected(format!(
            "the token in the token source {} (paths.token_source) was not installed: {}; put a current client configuration token from the DLS into the source (the Secret); {stays}",
            show_path(source),
            match why {
                crate::model::token::Untimely::Expired(t) =>
                    format!("it expired at {}", rfc3339(t)),
                crate::model::token::Untimely::NotYetValid(t) => format!(
                    "it is not valid before {} (is this guest's clock right?)",
                    rfc3339(t)
                ),
            }
        )),
        r => AdoptError::SourceRejected(format!(
            "the token in the token source {} (paths.token_source) was not installed: {r}; {stays}",
            show_path(source)
        )),
    }
}

/// Whether `paths.token_source` holds a token that would be installed (`Ok` also when none
/// is set); the refusal's one line otherwise. For `diagnose`: the same checks as the service's.
pub fn check_source(settings: &Settings) -> Option<Result<String, String>> {
    let source = settings.paths.token_source.as_ref()?;
    let checked = read_source(source, &settings.paths.token_file)
        .map_err(|e| e.to_string())
        .and_then(|bytes| {
            validate(&bytes, Utc::now(), false)
                .map(|(t, _)| summary(&bytes, &t))
                .map_err(|e| e.to_string())
        });
    Some(checked)
}

/// The token's bytes from `paths.token_source`: the file itself, or in a directory the file
/// named like the installed token, else the only `*.tok` there, else the only file there
/// (a Secret's key named `token`, say: what it holds is judged as any token is). Links are
/// followed (a Kubernetes Secret volume is made of them); what they lead to must be a
/// regular file.
fn read_source(source: &Path, token_file: &str) -> Result<Vec<u8>, TokenRejected> {
    let shown = show_path(source);
    let gone = |e: &dyn std::fmt::Display| source_gone(&shown, e);
    let file = match fs::metadata(source) {
        Ok(m) if m.is_dir() => {
            let named = source.join(token_file);
            if named.exists() {
                named
            } else {
                file_in(source, token_file, &shown)?
            }
        }
        Ok(_) => source.to_path_buf(),
        Err(e) => return Err(gone(&e)),
    };
    input::read_file(&file, crate::model::token::MAX_TOKEN_BYTES, Links::Follow).map_err(
        |e| match e {
            ReadError::TooLarge(_) => TokenRejected::Invalid(TokenError::TooLarge(
                crate::model::token::MAX_TOKEN_BYTES + 1,
            )),
            e => gone(&e),
        },
    )
}

/// The token source (shown as `shown`) gives no token: why.
fn source_gone(shown: &str, e: &dyn std::fmt::Display) -> TokenRejected {
    TokenRejected::Source(format!(
        "the token source {shown} (paths.token_source) cannot be read: {e}"
    ))
}

/// The token's file in a source directory without one named `token_file`: its only `*.tok`,
/// or else its only file.
fn file_in(source: &Path, token_file: &str, shown: &str) -> Result<PathBuf, TokenRejected> {
    let gone = |e: &dyn std::fmt::Display| source_gone(shown, e);
    // A Secret volume's own entries (`..data`, `..2026_12_03...`) are dot files.
    let files: Vec<(String, PathBuf)> = fsutil::list_dir(source)
        .map_err(|e| gone(&e))?
        .into_iter()
        .map(|(n, p)| (n.to_string_lossy().into_owned(), p))
        .filter(|(n, _)| !n.starts_with('.'))
        .collect();
    let toks: Vec<PathBuf> = files
        .iter()
        .filter(|(n, _)| n.ends_with(".tok"))
        .map(|(_, p)| p.clone())
        .collect();
    match (toks.as_slice(), files.as_slice()) {
        ([one], _) | ([], [(_, one)]) => Ok(one.clone()),
        ([], []) if !is_mount_point(source) => Err(gone(&format!(
            "it is an empty directory of the file system above it, {}: the share that brings the token (a KubeVirt virtiofs Secret) did not mount here; see `findmnt` and `systemctl --failed` for its mount unit (the Secret itself may be fine)",
            crate::model::policy::SHARE_NOT_MOUNTED
        ))),
        ([], []) => Err(gone(&"it holds no file")),
        ([], _) => Err(gone(&format!(
            "it holds {} files, none named {token_file} or *.tok",
            files.len()
        ))),
        _ => Err(gone(&format!(
            "it holds {} *.tok files and none named {token_file}",
            toks.len()
        ))),
    }
}

impl From<CoreError> for AdoptError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::Superseded => AdoptError::Superseded,
            CoreError::Failed(e) => e.into(),
        }
    }
}

/// Whether `dir` is a mount point: on another file system than its parent.
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    match (fs::metadata(dir), fs::metadata(parent)) {
        (Ok(d), Ok(p)) => d.dev() != p.dev() || d.ino() == p.ino(),
        _ => true,
    }
}
