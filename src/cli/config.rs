//! `config check` and `config show`: the config as the service reads it. `check` loads it
//! exactly as the service does at start and at reload (`config::load`, then the outputs on
//! disk), so that `ExecReload=` can run it before the signal and a bad reload fails in
//! `systemctl reload`; `show` prints the merged result, each key with its file of origin.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::anyhow;

use crate::cli::ConfigCommand;
use crate::config::config_files;
use crate::model::config::Settings;
use crate::model::text::show_path;

/// `config check` / `config show`.
pub fn run(command: &ConfigCommand, main: &Path) -> anyhow::Result<ExitCode> {
    let (read, ignored) = config_files(main);
    for path in &ignored {
        eprintln!(
            "vgpu-license-agent: warning: {} ignored: only *.toml drop-ins are read",
            show_path(path)
        );
    }
    let settings = load(main)?;
    match command {
        ConfigCommand::Check { reload } => {
            if let Some(pid) = *reload {
                // Only the agent's own service is ever signalled, the process that holds its
                // lock (not a `status --wait`, named the same): a wrong pid is an error.
                let service = crate::service::instance::running_pid(&settings);
                if pid <= 1 || service != Some(pid as u32) {
                    return Err(anyhow!(
                        "config is good, but pid {pid} is not the running vgpu-license-agent: nothing was signalled; give --reload the service's pid ($MAINPID in its unit)"
                    ));
                }
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGHUP,
                )
                .map_err(|e| anyhow!("config is good, but the service (pid {pid}) could not be told to reload: {e}"))?;
            }
            let files: Vec<String> = read.iter().map(|p| show_path(p)).collect();
            if files.is_empty() {
                println!(
                    "config OK: no config file ({} is missing): the defaults",
                    show_path(main)
                );
            } else if !read.iter().any(|p| p == main) {
                println!(
                    "config OK: {} (there is no {}: the defaults under the drop-ins)",
                    files.join(", "),
                    show_path(main)
                );
            } else {
                println!("config OK: {}", files.join(", "));
            }
        }
        ConfigCommand::Show => print!("{}", show(main, &read)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The config as the service takes it: every file parsed and validated, and the outputs
/// checked against what is on disk.
pub fn load(main: &Path) -> anyhow::Result<Settings> {
    let settings = crate::config::load(main)?;
    crate::config::check_outputs_on_disk(&settings)
        .map_err(|message| anyhow!("config {}: {}", show_path(main), message))?;
    // What the Node writer would use: a kubeconfig and the files it names, the node's name.
    crate::kube::check(&settings).map_err(|e| anyhow!("config {}: {e:#}", show_path(main)))?;
    Ok(settings)
}

/// The packaged default config: every key, commented out with its default (`#key = value`),
/// or shown as an example where it is unset by default (`# e.g. key = value`).
/// tests/packaging.rs holds it to the real defaults.
const DEFAULTS: &str = include_str!("../../packaging/config.toml");

/// One key of the merged config.
struct Entry {
    key: String,
    /// `None`: unset (no default, set in no file).
    value: Option<toml::Value>,
    /// The file that set it, `None` for the default.
    origin: Option<PathBuf>,
}

/// The sections and keys of the default config, in its order, with their defaults.
fn defaults() -> Vec<(String, Vec<Entry>)> {
    let mut sections: Vec<(String, Vec<Entry>)> = Vec::new();
    for line in DEFAULTS.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.push((name.to_string(), Vec::new()));
            continue;
        }
        let Some((_, entries)) = sections.last_mut() else {
            continue;
        };
        let (unset, kv) = match line.strip_prefix("# e.g. ") {
            Some(rest) => (true, rest),
            None => match line.strip_prefix('#') {
                Some(rest) if rest.starts_with(|c: char| c.is_ascii_lowercase()) => (false, rest),
                _ => continue,
            },
        };
        let Some((key, value)) = kv.split_once(" = ") else {
            continue;
        };
        let value = if unset {
            None
        } else {
            format!("v = {value}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
        };
        entries.push(Entry {
            key: key.trim().to_string(),
            value,
            origin: None,
        });
    }
    sections
}

/// The default config with each file's keys laid over it, in the order the files are read
/// (later wins, key by key, as in `config::load`).
fn merged(files: &[PathBuf]) -> Vec<(String, Vec<Entry>)> {
    let mut sections = defaults();
    for file in files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let Ok(table) = text.parse::<toml::Table>() else {
            continue;
        };
        for (section, keys) in table {
            let Some(keys) = keys.as_table() else {
                continue;
            };
            let at = match sections.iter().position(|(name, _)| *name == section) {
                Some(i) => i,
                None => {
                    sections.push((section.clone(), Vec::new()));
                    sections.len() - 1
                }
            };
            let entries = &mut sections[at].1;
            for (key, value) in keys {
                let entry = match entries.iter().position(|e| e.key == *key) {
                    Some(i) => &mut entries[i],
                    None => {
                        entries.push(Entry {
                            key: key.clone(),
                            value: None,
                            origin: None,
                        });
                        entries.last_mut().expect("just pushed")
                    }
                };
                entry.value = Some(value.clone());
                entry.origin = Some(file.clone());
            }
        }
    }
    sections
}

/// A value as it may be shown: a webhook URL without its user, password and query, which
/// often are its credential.
fn shown(section: &str, key: &str, value: &toml::Value) -> (String, &'static str) {
    if (section, key) == ("service", "webhook_url") {
        let url = value.as_str().unwrap_or("");
        let text = match reqwest::Url::parse(url.trim()) {
            Ok(url) => crate::http::redact(&url),
            Err(_) => "(not a URL; not shown)".into(),
        };
        let note = "; user, password and query not shown";
        return (toml::Value::String(text).to_string(), note);
    }
    (value.to_string(), "")
}

/// The merged config as TOML: every key with its value (a key that is unset shown commented
/// out) and, in a comment, the file it comes from or "default". Called once the config
/// loaded: every file parses.
fn show(main: &Path, files: &[PathBuf]) -> String {
    let mut out = format!(
        "# The config of vgpu-license-agent as the service reads it: {} and its drop-ins.\n",
        show_path(main)
    );
    if files.is_empty() {
        out.push_str("# No config file exists: every value is the default.\n");
    } else {
        out.push_str("# Read, in this order (a later file wins key by key):\n");
        for f in files {
            out.push_str(&format!("#   {}\n", show_path(f)));
        }
    }
    for (section, entries) in merged(files) {
        out.push_str(&format!("\n[{section}]\n"));
        for e in entries {
            let origin = e
                .origin
                .as_deref()
                .map_or_else(|| "default".to_string(), show_path);
            match &e.value {
                Some(value) => {
                    let (text, note) = shown(&section, &e.key, value);
                    out.push_str(&format!("{} = {text}  # {origin}{note}\n", e.key));
                }
                None => out.push_str(&format!("# {} is unset\n", e.key)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("config.d")).unwrap();
        for (name, text) in files {
            std::fs::write(d.path().join(name), text).unwrap();
        }
        let main = d.path().join("config.toml");
        (d, main)
    }

    #[test]
    fn shown_config_reads_back_as_the_same_settings() {
        let (_d, main) = dir_with(&[
            ("config.toml", "[paths]\ntoken_source = \"/run/t\"\n"),
            (
                "config.d/50-a.toml",
                "[service]\nmetrics_listen = \":9841\"\npoll_licensed_seconds = 60\n",
            ),
        ]);
        let loaded = crate::config::load(&main).unwrap();
        let text = show(&main, &config_files(&main).0);
        let mut back = Settings::default();
        back.apply_toml(&text).unwrap();
        // feature_type shown is feature_type set: the one field a round trip changes.
        back.gridd.feature_type_configured = loaded.gridd.feature_type_configured;
        assert_eq!(back, loaded, "{text}");
        assert!(
            text.contains("poll_licensed_seconds = 60  # ")
                && text.contains("50-a.toml\n")
                && text.contains("poll_unlicensed_seconds = 15  # default\n"),
            "{text}"
        );
    }

    #[test]
    fn webhook_credentials_never_show() {
        let (_d, main) = dir_with(&[(
            "config.d/50-hook.toml",
            "[service]\nwebhook_url = \"https://user:hunter2@hooks.example.com/vgpu?token=s3cret\"\n",
        )]);
        let text = show(&main, &config_files(&main).0);
        assert!(
            !text.contains("hunter2") && !text.contains("s3cret"),
            "{text}"
        );
        assert!(
            text.contains("webhook_url = \"https://hooks.example.com/vgpu?...\""),
            "{text}"
        );
    }
}
