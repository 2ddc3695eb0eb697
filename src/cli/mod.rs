//! The command line: every command of the contract, as clap definitions, and each command's
//! `run(args)`: what it reads from its arguments and what it prints. The work itself is done by
//! domain functions that take plain requests (`install::install`, `diagnose::diagnose`, ...).
//!
//! This module is part of the library so that the man page and the shell completions
//! (see `xtask/src/gen_docs.rs`) are generated from the very same definitions.

pub mod analyze;
pub mod config;
pub mod diagnose;
pub mod install;
pub mod manual;
pub mod prepare;
pub mod status;
pub mod token;

use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use clap::{Args, Parser, Subcommand};

/// Keeps an NVIDIA vGPU guest licensed: installs the client configuration token and
/// gridd.conf, watches nvidia-gridd and nvidia-smi, restarts gridd when a restart can help,
/// and explains what it cannot fix.
#[derive(Debug, Parser)]
#[command(name = "vgpu-license-agent", version, about, long_about = None)]
#[command(
    after_help = "Exit codes of status, analyze and diagnose: 0 licensed, 1 warning \
(acquiring, in grace, expiring soon), 2 critical (restricted, failing, not installed), 3 unknown (the check could not run)."
)]
pub struct Cli {
    /// Agent config file (drop-ins are read from `<dir of FILE>/config.d/*.toml`).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "VGPU_LICENSE_AGENT_CONFIG",
        default_value = DEFAULT_CONFIG
    )]
    pub config: PathBuf,

    /// How the config's path was named, where it was (`--config` or the environment): a
    /// file named on purpose must exist, where the default's absence means the defaults.
    #[arg(skip)]
    pub config_named_by: Option<&'static str>,

    #[command(subcommand)]
    pub command: Command,
}

/// The config's default path.
pub const DEFAULT_CONFIG: &str = "/etc/vgpu-license-agent/config.toml";

impl Cli {
    /// Parses the command line, and whether the config's path was named rather than the
    /// default.
    pub fn try_parse_named() -> Result<Cli, clap::Error> {
        use clap::parser::ValueSource;
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().try_get_matches()?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        cli.config_named_by = match matches.value_source("config") {
            Some(ValueSource::CommandLine) => Some("--config"),
            Some(ValueSource::EnvVariable) => Some("VGPU_LICENSE_AGENT_CONFIG"),
            _ => None,
        };
        Ok(cli)
    }

    /// A config named on purpose that is not there is an error (a mistyped path would
    /// otherwise pass for the defaults), unless drop-ins beside it make a config of their
    /// own; the default path's absence means the defaults.
    /// `analyze` reads no config; `prepare-image --root DIR` reads it below DIR.
    pub fn named_config_exists(&self) -> anyhow::Result<()> {
        let Some(by) = self.config_named_by else {
            return Ok(());
        };
        let path = match &self.command {
            Command::Analyze(_) => return Ok(()),
            Command::PrepareImage(PrepareImageArgs {
                root: Some(root), ..
            }) => root.join(self.config.strip_prefix("/").unwrap_or(&self.config)),
            _ => self.config.clone(),
        };
        // A directory of drop-ins alone is a config the loader takes as it is (the defaults
        // under them): checking a drop-in on its own is done that way.
        let dropins_only = !crate::config::config_files(&path).0.is_empty();
        if matches!(path.try_exists(), Ok(false)) && !dropins_only {
            let instead = if by == "--config" {
                "leave --config out"
            } else {
                "unset VGPU_LICENSE_AGENT_CONFIG"
            };
            anyhow::bail!(
                "the config file {} named by {by} does not exist: name an existing file, or {instead} to read {DEFAULT_CONFIG} (whose absence means the defaults)",
                crate::model::text::show_path(&path)
            );
        }
        Ok(())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Install a client configuration token and gridd.conf, then restart nvidia-gridd if
    /// something changed.
    Install(InstallArgs),
    /// Run the long-running service (systemd Type=notify).
    Run(RunArgs),
    /// Show the current license state (from the live report, else observed now).
    Status(StatusArgs),
    /// Explain saved nvidia-smi output and/or nvidia-gridd logs, offline.
    Analyze(AnalyzeArgs),
    /// Run live checks (driver, token, gridd.conf, gridd, DLS reachability, clock skew).
    Diagnose(JsonArg),
    /// Work with client configuration tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Check or show the agent's config (config.toml and its config.d drop-ins).
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Ready a golden image: remove the token and the agent's state so clones start clean.
    #[command(
        after_long_help = "Example, the last step of a golden image's build, as docs/install.md gives it (a clone then makes a machine-id of its own, registers as a DLS client of its own, and finds no copy of the builder's token):\n\n  truncate -s 0 /etc/machine-id && rm -f /var/lib/dbus/machine-id\n  vgpu-license-agent prepare-image --purge-client-state --cloud-init --journal\n\nOn a mounted image, from the build host: vgpu-license-agent prepare-image --root /mnt/image --purge-client-state --cloud-init --journal. Exit 1 names each file that still holds a token."
    )]
    PrepareImage(PrepareImageArgs),
    /// At boot, before nvidia-gridd: compare this guest's identity (DMI product UUID,
    /// machine-id) with the last boot's; on a clone or a restored snapshot, move gridd's
    /// client state aside so that it registers as a client of its own.
    CheckIdentity(CheckIdentityArgs),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the config and every drop-in as the service does at start and at reload;
    /// exit 1 with the error on any.
    Check {
        /// Once the config is good, tell the running service (this PID, `$MAINPID` in the
        /// unit's `ExecReload=`) to reload it (SIGHUP); a bad config signals nothing.
        #[arg(long, value_name = "PID")]
        reload: Option<i32>,
    },
    /// Print the merged config as TOML, each key with the file it comes from; secrets
    /// redacted.
    Show,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Log to standard error instead of the journal (the default when it is a terminal).
    #[arg(long)]
    pub log_stderr: bool,
}

#[derive(Debug, Args)]
pub struct CheckIdentityArgs {
    /// Read the identity below this directory instead of / (for tests).
    #[arg(long, value_name = "DIR", default_value = "/", hide = true)]
    pub root: PathBuf,
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print the report as JSON (schema vgpu-license-agent/report/v1).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// Saved `nvidia-smi -q` output (text or `-q -x` XML, whole or an excerpt: `<gpu>`
    /// elements pasted without their enclosing `<nvidia_smi_log>` too), or a vGPU host's
    /// `nvidia-smi vgpu -q` (the host's view of every VM's vGPU); `-` for stdin.
    #[arg(long, value_name = "FILE")]
    pub smi: Option<PathBuf>,
    /// nvidia-gridd's log: `journalctl -o json` lines, journalctl or syslog text, or a pasted
    /// `systemctl status nvidia-gridd`; on a vGPU host, the vGPU manager's (`nvidia-vgpu-mgr`)
    /// the same ways; `-` for stdin.
    #[arg(long, value_name = "FILE")]
    pub journal: Option<PathBuf>,
    /// An application's own log (a training job's, a notebook's, `kubectl logs`): its CUDA
    /// errors, of which `device doesn't have valid Grid license` (CUDA error 102) names the
    /// license as the cause; other CUDA errors (out of memory, invalid device ordinal) never
    /// do. A --journal file without gridd's lines is read this way too. `-` for stdin.
    #[arg(long, value_name = "FILE")]
    pub app_log: Option<PathBuf>,
    /// A client configuration token to take the DLS nodes from.
    #[arg(long, value_name = "FILE")]
    pub token: Option<PathBuf>,
    /// Print the report as JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Print the report as Prometheus metrics (the service's textfile format).
    #[arg(long, conflicts_with = "json")]
    pub metrics: bool,
    /// Keep at most this many of the latest events in the report (1 to 100000).
    #[arg(long, value_name = "N", default_value_t = crate::model::state::MAX_EVENTS, value_parser = clap::value_parser!(u32).range(1..=100_000).map(|n| n as usize))]
    pub max_events: usize,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Wait up to SECONDS (at most 86400, a day) for a license; return as soon as licensed.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub wait: Option<u64>,
    /// With --wait: exit 0 once licensed (an expiring lease too), 1 when the wait ends
    /// without a license, instead of the monitoring codes.
    #[arg(long, requires = "wait")]
    pub require_licensed: bool,
    /// node-problem-detector's custom-plugin form: one line, exit 0 when the license is held
    /// (or nothing needs one), 1 when it is not, 2 when the agent cannot tell.
    #[arg(long, conflicts_with_all = ["json", "wait"])]
    pub npd: bool,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Show what a token says: DLS nodes and ports, iat/nbf/exp, instance and scope
    /// references. Never prints the signature or key material.
    Inspect(TokenInspectArgs),
}

#[derive(Debug, Args)]
pub struct TokenInspectArgs {
    /// Token file (`-` for stdin); default: the installed token.
    pub file: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[group(id = "source", required = true, multiple = false)]
pub struct TokenSource {
    /// Read the token from FILE (`-` for standard input).
    #[arg(long, value_name = "FILE", group = "source")]
    pub token_file: Option<PathBuf>,
    /// The token's bytes, base64-encoded (as cloud-init `encoding: b64` carries it).
    #[arg(long, value_name = "STRING", group = "source")]
    pub token_base64: Option<String>,
    /// Download the token over HTTPS. A URL with a password or a signed query given here is
    /// moved at once out of the command line, into the environment, which other users cannot
    /// read; given in the environment from the start (VGPU_LICENSE_AGENT_TOKEN_URL), it is
    /// never on a command line, the caller's (sudo, a shell's history) included.
    #[arg(
        long,
        value_name = "URL",
        group = "source",
        env = TOKEN_URL_ENV,
        hide_env_values = true
    )]
    pub token_url: Option<String>,
}

impl TokenSource {
    /// The one source given (clap holds them to one).
    pub fn given(&self) -> anyhow::Result<crate::install::source::Given<'_>> {
        use crate::install::source::Given;
        if let Some(path) = &self.token_file {
            Ok(Given::File(path))
        } else if let Some(text) = &self.token_base64 {
            Ok(Given::Base64(text))
        } else if let Some(url) = &self.token_url {
            Ok(Given::Url(url))
        } else {
            anyhow::bail!("no token given: use --token-file, --token-base64 or --token-url")
        }
    }
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub source: TokenSource,
    /// PEM file of a private CA for `--token-url`.
    #[arg(long, value_name = "FILE", requires = "token_url")]
    pub ca_file: Option<PathBuf>,
    /// Time limit of each download attempt of `--token-url`, in seconds (default: the
    /// config's commands.timeout_seconds, 30).
    #[arg(long, value_name = "SECONDS", requires = "token_url", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: Option<u64>,
    /// How many times to retry a failed download of `--token-url`, with backoff (1 s, 2 s, 4 s,
    /// then 8 s between attempts).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=20))]
    pub retries: u32,
    /// FeatureType to set in gridd.conf (default from the config: 1, NVIDIA vGPU).
    #[arg(long, value_name = "N")]
    pub feature_type: Option<u8>,
    /// Install a token that decodes but is expired or not yet valid (with a warning).
    #[arg(long)]
    pub force: bool,
    /// Do not restart nvidia-gridd after a change.
    #[arg(long)]
    pub no_restart: bool,
    /// Say what would change, change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct PrepareImageArgs {
    /// Also remove nvidia-gridd's client state (/var/lib/nvidia/GridLicensing,
    /// /var/lib/nvidia/vGPULicensing).
    #[arg(long)]
    pub purge_client_state: bool,
    /// Also do what `cloud-init clean --logs` does: remove /var/lib/cloud (but its seed) and
    /// cloud-init's logs, where the user-data that carried the token is kept.
    #[arg(long)]
    pub cloud_init: bool,
    /// Also clean the journal: `journalctl --rotate` and `--vacuum-time=1s` (with --root:
    /// remove the image's journal files).
    #[arg(long)]
    pub journal: bool,
    /// Act on the image mounted at DIR: the config is read below DIR, every configured path
    /// is taken below DIR, and nothing of this machine (services, journal) is touched.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Say what would be stopped, removed and still found, change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Whether a permission was denied somewhere in the error's causes (EACCES, EPERM), or its
/// text says so.
pub fn denied(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
            || c.to_string().contains("Permission denied")
            || c.to_string().contains("Operation not permitted")
    })
}

/// An error's line as a user who is not root reads it: a denied permission is what running
/// as root fixes, and the line says so once (no "make it writable" for a system directory).
pub fn with_root_hint(line: String, denied: bool, root: bool) -> String {
    if root || !denied || line.contains("as root") {
        return line;
    }
    format!("{line}; run as root (sudo)")
}

/// The environment variable `--token-url` is also read from (which other users cannot read).
pub const TOKEN_URL_ENV: &str = "VGPU_LICENSE_AGENT_TOKEN_URL";

/// Where `args` give `--token-url` a URL that holds a secret (a user, a password or a query):
/// its index, how many arguments it takes (1 for `--token-url=URL`, 2 for `--token-url
/// URL`), and the URL. `None` for one without a secret, and after `--`.
pub fn token_url_in(args: &[std::ffi::OsString]) -> Option<(usize, usize, String)> {
    let secret = |url: &str| {
        url::Url::parse(url.trim()).is_ok_and(|u| {
            !u.username().is_empty() || u.password().is_some() || u.query().is_some()
        })
    };
    for (i, arg) in args.iter().enumerate().skip(1) {
        let Some(arg) = arg.to_str() else {
            continue;
        };
        if arg == "--" {
            return None;
        }
        if arg == "--token-url" {
            let url = args.get(i + 1)?.to_str()?;
            return secret(url).then(|| (i, 2, url.to_string()));
        }
        if let Some(url) = arg.strip_prefix("--token-url=") {
            return secret(url).then(|| (i, 1, url.to_string()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_permission_says_run_as_root_once_and_only_to_others_than_root() {
        let e = anyhow::Error::new(std::io::Error::from_raw_os_error(13))
            .context("cannot write /var/lib/vgpu-license-agent/identity.json");
        assert!(denied(&e));
        let line = "cannot write x: Permission denied (os error 13)".to_string();
        assert_eq!(
            with_root_hint(line.clone(), true, false),
            format!("{line}; run as root (sudo)")
        );
        assert_eq!(with_root_hint(line.clone(), true, true), line);
        assert_eq!(with_root_hint(line.clone(), false, false), line);
        let said =
            "install writes /etc (paths.token_dir), which this user may not: run as root (sudo)";
        assert_eq!(with_root_hint(said.into(), true, false), said);
        assert!(!denied(&anyhow::anyhow!("no such file")));
    }

    #[test]
    fn analyze_keeps_as_many_events_as_the_live_report_unless_told() {
        let events = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Analyze(a)) => a.max_events,
            other => panic!("{other:?}"),
        };
        let base = ["vgpu-license-agent", "analyze"];
        assert_eq!(events(&base), crate::model::state::MAX_EVENTS);
        assert_eq!(events(&[&base[..], &["--max-events", "7"]].concat()), 7);
    }
}
