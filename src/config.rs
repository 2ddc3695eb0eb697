//! The agent's config files: `config.toml`, then `config.d/*.toml` drop-ins in name order,
//! each read only where root alone can change it, then merged and validated by the model
//! ([`vgpu_license_model::config`], where the settings' types are). A missing main file
//! means defaults.

use std::path::{Path, PathBuf};

use crate::model::config::{ConfigError, MAX_CONFIG_BYTES, Settings, shown_value};

/// Loads `main` (missing = defaults) and `<dir of main>/config.d/*.toml` in name order.
pub fn load(main: &Path) -> Result<Settings, ConfigError> {
    let mut files = Vec::new();
    match main.try_exists() {
        Ok(true) => files.push(main.to_path_buf()),
        Ok(false) => {}
        Err(e) => {
            return Err(ConfigError {
                file: main.into(),
                message: format!("cannot check the file: {e}"),
            });
        }
    }
    let dropins = main.parent().unwrap_or(Path::new(".")).join("config.d");
    if let Ok(rd) = std::fs::read_dir(&dropins) {
        // A drop-in directory others may write to is someone else's config.
        trusted_dir(&dropins).map_err(|message| ConfigError {
            file: dropins.clone(),
            message,
        })?;
        let mut more: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        more.sort();
        files.extend(more);
    }
    let mut settings = Settings::default();
    for file in files {
        // Root's files, maybe links (a drop-in linked from elsewhere), but never a FIFO or
        // a huge file: the service must not hang or fill memory at a reload.
        let text = read_trusted(&file).map_err(|message| ConfigError {
            file: file.clone(),
            message,
        })?;
        settings.apply_toml(&text).map_err(|message| ConfigError {
            file: file.clone(),
            message,
        })?;
    }
    settings.validate().map_err(|message| ConfigError {
        file: main.into(),
        message,
    })?;
    Ok(settings)
}

/// Checks that the agent's outputs can be written without destroying what is not the
/// agent's: an existing status file or metrics textfile must hold what the agent writes
/// there, and an existing metrics socket path must be a socket (it is replaced at start).
/// The service runs it at start and at reload, `config check` too.
pub fn check_outputs_on_disk(settings: &Settings) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let p = &settings.paths;
    for (key, path, mark) in [
        (
            "paths.status_file",
            &p.status_file,
            crate::model::report::SCHEMA.as_bytes(),
        ),
        (
            "paths.metrics_textfile",
            &p.metrics_textfile,
            b"vgpu_license_".as_slice(),
        ),
    ] {
        match std::fs::symlink_metadata(path) {
            Err(_) => {}
            Ok(m) if m.is_file() => {
                let head = crate::files::input::read_file(
                    path,
                    1 << 20,
                    crate::files::input::Links::Refuse,
                )
                .unwrap_or_default();
                if !head.is_empty() && memchr::memmem::find(&head, mark).is_none() {
                    return Err(format!(
                        "{key} = {}: that file exists and is not the agent's (it does not hold what the agent writes there); the agent would overwrite it: choose another path or move the file away",
                        shown_value(&path.to_string_lossy())
                    ));
                }
            }
            Ok(_) => {
                return Err(format!(
                    "{key} = {}: that path exists and is not a regular file; choose another path",
                    shown_value(&path.to_string_lossy())
                ));
            }
        }
    }
    if let Some(sock) = &settings.service.metrics_socket
        && let Ok(m) = std::fs::symlink_metadata(sock)
        && !m.file_type().is_socket()
    {
        return Err(format!(
            "service.metrics_socket = {}: that path exists and is not a socket; the agent replaces only a socket there: choose another path or move the file away",
            shown_value(&sock.to_string_lossy())
        ));
    }
    Ok(())
}

/// Whether a file or directory of the config may be trusted by root: owned by root (or by the
/// user running the agent) and writable by nobody else. The config names the programs root
/// runs (`commands.*`): another user who can change it can make root run anything.
fn trusted(meta: &std::fs::Metadata, what: &str) -> Result<(), String> {
    owned_safely(
        meta,
        what,
        "could make root run any program through commands.*",
    )
}

/// The ownership rule of every file root takes orders or credentials from (the config and
/// its drop-ins, a kubeconfig and the files it names): owned by root or by the user running
/// the agent, and writable by nobody else. `risk` says what another owner could do, after
/// "who": the error names the owner and the fix.
pub fn owned_safely(meta: &std::fs::Metadata, what: &str, risk: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let mode = meta.mode() & 0o7777;
    if meta.uid() != 0 && meta.uid() != me {
        return Err(format!(
            "{what} is owned by uid {}, who {risk}; the agent refuses it: make it root's (chown root:root)",
            meta.uid()
        ));
    }
    if mode & 0o022 != 0 {
        return Err(format!(
            "{what} is writable by other users (mode {mode:04o}), who {risk}; the agent refuses it: chmod go-w it"
        ));
    }
    Ok(())
}

/// A file root takes credentials or orders from, read through one descriptor checked by
/// [`owned_safely`] first (a link is followed: its target is what is checked), at most `cap`
/// bytes.
pub fn read_owned_safely(
    file: &Path,
    cap: usize,
    what: &str,
    risk: &str,
) -> Result<Vec<u8>, String> {
    use crate::files::input::{Links, open_regular, read_capped};
    // A link is its owner's word on which file is read: judged by its owner too, so that a
    // link of another user's into root's files cannot pick one.
    if let Ok(link) = file.symlink_metadata()
        && link.file_type().is_symlink()
    {
        use std::os::unix::fs::MetadataExt;
        let me = nix::unistd::geteuid().as_raw();
        if link.uid() != 0 && link.uid() != me {
            return Err(format!(
                "{what} is a link owned by uid {}, who {risk}; the agent refuses it: make the link root's (chown -h root:root)",
                link.uid()
            ));
        }
    }
    let f = open_regular(file, Links::Follow).map_err(|e| format!("cannot read it: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("cannot read it: {e}"))?;
    owned_safely(&meta, what, risk)?;
    read_capped(f, cap).map_err(|e| format!("cannot read it: {e}"))
}

fn trusted_dir(dir: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("cannot check the directory: {e}"))?;
    trusted(&meta, "the drop-in directory")
}

/// A config file's text, read through one descriptor that is checked first (a link is
/// followed: a drop-in linked from elsewhere is fine where its target is root's alone).
fn read_trusted(file: &Path) -> Result<String, String> {
    use crate::files::input::{Links, open_regular, read_capped};
    let f = open_regular(file, Links::Follow).map_err(|e| format!("cannot read: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("cannot read: {e}"))?;
    trusted(&meta, "the file")?;
    let bytes = read_capped(f, MAX_CONFIG_BYTES).map_err(|e| format!("cannot read: {e}"))?;
    String::from_utf8(bytes).map_err(|_| "cannot read: is not UTF-8 text".to_string())
}

/// The files [`load`] reads for `main`, in its order (`main` where it exists, then the
/// `config.d/*.toml` drop-ins by name), and the entries of `config.d/` it leaves out (any
/// other name): what `config check` warns of and `config show` names as origins.
pub fn config_files(main: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut read: Vec<PathBuf> = Vec::new();
    if main.try_exists().unwrap_or(false) {
        read.push(main.to_path_buf());
    }
    let dropins = main.parent().unwrap_or(Path::new(".")).join("config.d");
    let (mut more, mut ignored): (Vec<PathBuf>, Vec<PathBuf>) = std::fs::read_dir(&dropins)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .partition(|p| p.extension().is_some_and(|x| x == "toml"));
    more.sort();
    ignored.sort();
    read.extend(more);
    (read, ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_file_that_is_not_the_agents_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let mut s = Settings::default();
        s.paths.status_file = d.path().join("status.json");
        s.paths.metrics_textfile = d.path().join("m.prom");
        check_outputs_on_disk(&s).unwrap();
        std::fs::write(&s.paths.status_file, "operator's notes\n").unwrap();
        let e = check_outputs_on_disk(&s).unwrap_err();
        assert!(
            e.contains("paths.status_file") && e.contains("not the agent's"),
            "{e}"
        );
        std::fs::write(
            &s.paths.status_file,
            format!("{{\"schema\": \"{}\"}}", crate::model::report::SCHEMA),
        )
        .unwrap();
        check_outputs_on_disk(&s).unwrap();
        s.service.metrics_socket = Some(d.path().join("notes.txt"));
        std::fs::write(d.path().join("notes.txt"), "keep").unwrap();
        let e = check_outputs_on_disk(&s).unwrap_err();
        assert!(
            e.contains("service.metrics_socket") && e.contains("not a socket"),
            "{e}"
        );
    }
}
