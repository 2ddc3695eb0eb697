//! The agent's config: `config.toml`, then `config.d/*.toml` drop-ins in name order, each
//! parsed into all-optional fragments, merged (later wins, key by key), then validated into one
//! typed [`Settings`]. A missing main file means defaults.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default location of the main config file.
pub const DEFAULT_CONFIG: &str = "/etc/vgpu-license-agent/config.toml";

/// The validated settings every command works from.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub paths: Paths,
    pub commands: Commands,
    pub gridd: Gridd,
    pub service: Service,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Paths {
    pub token_dir: PathBuf,
    pub token_file: String,
    pub gridd_conf: PathBuf,
    pub state_dir: PathBuf,
    pub status_file: PathBuf,
    pub metrics_textfile: PathBuf,
    /// nvidia-gridd's client state directories (`prepare-image --purge-client-state` empties
    /// them).
    pub gridd_client_state: Vec<PathBuf>,
}

impl Paths {
    /// Full path of the installed token.
    pub fn token_path(&self) -> PathBuf {
        self.token_dir.join(&self.token_file)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Commands {
    pub nvidia_smi: String,
    pub journalctl: String,
    pub restart_gridd: Vec<String>,
    /// Time limit for every command the agent runs.
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gridd {
    pub feature_type: u8,
}

/// Thresholds of the long-running service.
#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    /// A lease expiring sooner than this is a warning.
    pub expiry_warning: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            paths: Paths {
                token_dir: "/etc/nvidia/ClientConfigToken".into(),
                token_file: "client_configuration_token.tok".into(),
                gridd_conf: "/etc/nvidia/gridd.conf".into(),
                state_dir: "/var/lib/vgpu-license-agent".into(),
                status_file: "/run/vgpu-license-agent/status.json".into(),
                metrics_textfile: "/var/lib/prometheus/node-exporter/vgpu_license_agent.prom"
                    .into(),
                gridd_client_state: vec![
                    "/var/lib/nvidia/GridLicensing".into(),
                    "/var/lib/nvidia/vGPULicensing".into(),
                ],
            },
            commands: Commands {
                nvidia_smi: "nvidia-smi".into(),
                journalctl: "journalctl".into(),
                restart_gridd: vec![
                    "systemctl".into(),
                    "restart".into(),
                    "nvidia-gridd.service".into(),
                ],
                timeout: Duration::from_secs(30),
            },
            gridd: Gridd { feature_type: 1 },
            service: Service {
                expiry_warning: Duration::from_secs(12 * 3600),
            },
        }
    }
}

/// A config error: which file, and what is wrong in it (one line).
#[derive(Debug)]
pub struct ConfigError {
    pub file: PathBuf,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config {}: {}", self.file.display(), self.message)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fragment {
    #[serde(default)]
    paths: PathsFragment,
    #[serde(default)]
    commands: CommandsFragment,
    #[serde(default)]
    gridd: GriddFragment,
    #[serde(default)]
    service: ServiceFragment,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathsFragment {
    token_dir: Option<PathBuf>,
    token_file: Option<String>,
    gridd_conf: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    status_file: Option<PathBuf>,
    metrics_textfile: Option<PathBuf>,
    gridd_client_state: Option<Vec<PathBuf>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandsFragment {
    nvidia_smi: Option<String>,
    journalctl: Option<String>,
    restart_gridd: Option<Vec<String>>,
    timeout_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GriddFragment {
    feature_type: Option<u8>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceFragment {
    expiry_warning_hours: Option<u64>,
}

macro_rules! merge {
    ($dst:expr, $src:expr, $($field:ident),+) => {
        $( if let Some(v) = $src.$field { $dst.$field = v.into(); } )+
    };
}

impl Settings {
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
            let mut more: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            more.sort();
            files.extend(more);
        }
        let mut settings = Settings::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| ConfigError {
                file: file.clone(),
                message: format!("cannot read: {e}"),
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

    /// Merges one TOML fragment over these settings, or on error (one line: where and what)
    /// leaves them as they were.
    pub fn apply_toml(&mut self, text: &str) -> Result<(), String> {
        let mut next = self.clone();
        next.merge_toml(text)?;
        *self = next;
        Ok(())
    }

    fn merge_toml(&mut self, text: &str) -> Result<(), String> {
        let frag: Fragment = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| format!("line {}: ", text[..s.start].matches('\n').count() + 1))
                .unwrap_or_default();
            format!("{line}{}", e.message().replace('\n', " "))
        })?;
        let p = frag.paths;
        merge!(
            self.paths,
            p,
            token_dir,
            token_file,
            gridd_conf,
            state_dir,
            status_file,
            metrics_textfile,
            gridd_client_state
        );
        let c = frag.commands;
        merge!(self.commands, c, nvidia_smi, journalctl, restart_gridd);
        if let Some(t) = c.timeout_seconds {
            self.commands.timeout = Duration::from_secs(t);
        }
        merge!(self.gridd, frag.gridd, feature_type);
        if let Some(h) = frag.service.expiry_warning_hours {
            self.service.expiry_warning = Duration::from_secs(h * 3600);
        }
        self.validate()
    }

    fn validate(&self) -> Result<(), String> {
        if !matches!(self.gridd.feature_type, 0 | 1 | 2 | 4) {
            return Err(format!(
                "gridd.feature_type = {}: expected 0 (unlicensed), 1 (NVIDIA vGPU), 2 (RTX Virtual Workstation) or 4 (Virtual Compute Server)",
                self.gridd.feature_type
            ));
        }
        if self.commands.restart_gridd.is_empty() || self.commands.restart_gridd[0].is_empty() {
            return Err(
                "commands.restart_gridd: expected a command and its arguments, e.g. [\"systemctl\", \"restart\", \"nvidia-gridd.service\"]"
                    .into(),
            );
        }
        if self.commands.timeout.is_zero() {
            return Err("commands.timeout_seconds: expected at least 1".into());
        }
        let f = &self.paths.token_file;
        if f.is_empty() || f.contains('/') || f == "." || f == ".." {
            return Err(format!(
                "paths.token_file = {f:?}: expected a file name without '/'"
            ));
        }
        for (key, p) in [
            ("paths.token_dir", &self.paths.token_dir),
            ("paths.gridd_conf", &self.paths.gridd_conf),
            ("paths.state_dir", &self.paths.state_dir),
            ("paths.status_file", &self.paths.status_file),
            ("paths.metrics_textfile", &self.paths.metrics_textfile),
        ] {
            if !p.is_absolute() {
                return Err(format!(
                    "{key} = {:?}: expected an absolute path",
                    p.display()
                ));
            }
        }
        for p in &self.paths.gridd_client_state {
            if !p.is_absolute() || p.parent().is_none() {
                return Err(format!(
                    "paths.gridd_client_state: {:?}: expected absolute paths of directories below /",
                    p.display()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_fragments_win_key_by_key() {
        let mut s = Settings::default();
        s.apply_toml("[paths]\ntoken_dir = \"/a\"\n[gridd]\nfeature_type = 4\n")
            .unwrap();
        s.apply_toml("[paths]\ngridd_conf = \"/b.conf\"\n").unwrap();
        assert_eq!(s.paths.token_dir, PathBuf::from("/a"));
        assert_eq!(s.paths.gridd_conf, PathBuf::from("/b.conf"));
        assert_eq!(s.gridd.feature_type, 4);
        assert_eq!(s.commands.nvidia_smi, "nvidia-smi");
    }

    #[test]
    fn errors_name_the_key_and_what_is_expected() {
        let mut s = Settings::default();
        let e = s.apply_toml("[paths]\ntoken_dri = \"/a\"\n").unwrap_err();
        assert!(e.contains("token_dri") && e.contains("line 2"), "{e}");
        let e = s.apply_toml("[gridd]\nfeature_type = 3\n").unwrap_err();
        assert!(
            e.contains("gridd.feature_type") && e.contains("expected"),
            "{e}"
        );
        let e = s
            .apply_toml("[gridd]\nfeature_type = \"one\"\n")
            .unwrap_err();
        assert!(e.contains("line 2") && !e.contains('\n'), "{e}");
        let e = s.apply_toml("[paths]\nstate_dir = \"rel\"\n").unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let mut s = Settings::default();
        let e = s
            .apply_toml("[paths]\ngridd_client_state = [\"/\"]\n")
            .unwrap_err();
        assert!(e.contains("gridd_client_state"), "{e}");
        s.apply_toml("[paths]\ngridd_client_state = [\"/x/GridLicensing\"]\n")
            .unwrap();
        assert_eq!(
            s.paths.gridd_client_state,
            vec![PathBuf::from("/x/GridLicensing")]
        );
    }
}
