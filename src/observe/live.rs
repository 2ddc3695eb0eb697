//! Observing the guest now: nvidia-smi, gridd's journal of this boot, the token, gridd's
//! unit. Used by `status` (when no service runs), `diagnose` and the service itself, so that
//! all of them see the same things the same way.

use std::path::PathBuf;

use chrono::{DateTime, Utc};

use crate::gridd::command;
use crate::model::config::{ServiceRole, Settings};
use crate::model::observe::journal::{self, ScanStats};
use crate::model::observe::smi::{self, SmiSnapshot};
use crate::model::report::{Reason, Report};
use crate::model::state::{LogFold, Observations};
use crate::model::token::{MAX_TOKEN_BYTES, Token, TokenError};
use crate::node::journal_boot::this_boot_arg;

/// Runs `nvidia-smi -q` with the configured time limit, once the PCI bus shows an NVIDIA
/// device: with none (a VM of the image without a vGPU) there is nothing to ask.
pub fn read_smi(settings: &Settings) -> SmiRead {
    let bus = crate::observe::pci::read(&settings.paths.pci_devices);
    if bus.as_ref().is_some_and(|b| b.gpus.is_empty()) {
        return SmiRead::Snapshot(SmiSnapshot {
            no_device: true,
            ..SmiSnapshot::default()
        });
    }
    let read = read_smi_only(settings);
    // nvidia-smi failing on a device the bus shows: say which device, and its driver.
    match (read, bus) {
        (SmiRead::Failed(why), Some(bus)) => {
            SmiRead::Failed(format!("{why} (NVIDIA device {})", bus.describe()))
        }
        (read, _) => read,
    }
}

fn read_smi_only(settings: &Settings) -> SmiRead {
    let read = run_smi(settings, &["-q"]);
    let SmiRead::Snapshot(snap) = read else {
        return read;
    };
    if !reads_host(settings, &snap) {
        return SmiRead::Snapshot(snap);
    }
    // A vGPU host: its VMs' vGPUs, each with the license its guest driver reports.
    match run_smi(settings, &["vgpu", "-q"]) {
        SmiRead::Snapshot(vgpus) if vgpus.host_view => {
            SmiRead::Snapshot(host_snapshot(snap, vgpus))
        }
        // No `Active vGPUs` line: whatever it printed is no list of the host's vGPUs.
        SmiRead::Snapshot(_) => SmiRead::Failed(format!(
            "{} vgpu -q: its output lists no GPU's active vGPUs",
            settings.commands.nvidia_smi
        )),
        failed => failed,
    }
}

/// Whether the reading is a host's, whose VMs `nvidia-smi vgpu -q` lists: `service.role`
/// says so, or, in `auto`, `nvidia-smi -q` shows `Virtualization Mode : Host VGPU` for a GPU
/// (the vGPU manager's driver).
pub fn reads_host(settings: &Settings, snap: &SmiSnapshot) -> bool {
    match settings.service.role {
        ServiceRole::Host => true,
        ServiceRole::Guest => false,
        ServiceRole::Auto => snap.gpus.iter().any(|g| {
            g.virtualization_mode
                .as_deref()
                .is_some_and(|m| m.trim().eq_ignore_ascii_case("Host VGPU"))
        }),
    }
}

/// The host's reading: `nvidia-smi -q`'s driver and time, `vgpu -q`'s VMs. The host's
/// physical GPUs are no GPU of a guest's: none is listed as one.
fn host_snapshot(q: SmiSnapshot, vgpus: SmiSnapshot) -> SmiSnapshot {
    SmiSnapshot {
        gpus: Vec::new(),
        host_vgpus: vgpus.host_vgpus,
        host_view: true,
        ..q
    }
}

/// Runs nvidia-smi with `args` (`-q`, `vgpu -q`) within the configured time limit.
fn run_smi(settings: &Settings, args: &[&str]) -> SmiRead {
    // On a GPU Operator node, inside the driver container's root, where nvidia-smi finds
    // its libraries (the operator's maintainers' own advice): the file checked, by its path
    // inside the root, never a name PATH could find elsewhere.
    let mut argv = match &settings.commands.smi_root {
        Some(root) => match crate::node::checked_smi(root, &settings.commands.nvidia_smi) {
            Ok(smi) => vec![
                "chroot".to_string(),
                root.display().to_string(),
                smi.display().to_string(),
            ],
            Err(why) => return SmiRead::Failed(why),
        },
        None => vec![settings.commands.nvidia_smi.clone()],
    };
    argv.extend(args.iter().map(|a| a.to_string()));
    // `nvidia-smi vgpu -q` where it is not `-q`: the reason says which.
    let smi = match args {
        ["-q"] => settings.commands.nvidia_smi.clone(),
        _ => format!("{} {}", settings.commands.nvidia_smi, args.join(" ")),
    };
    match command::run(&argv, settings.commands.timeout) {
        Err(e @ command::RunError::TimedOut(_)) => SmiRead::TimedOut(format!(
            "{smi}: {e} (commands.timeout_seconds); the driver may be hung: check `dmesg` for NVRM errors"
        )),
        Err(e) if e.is_own_limit() => SmiRead::Unstarted(format!(
            "the agent could not start {smi}: {e} (the agent's own limits: its unit's TasksMax= or LimitNOFILE=, or the guest's memory)"
        )),
        Err(e) => SmiRead::Failed(format!("{smi}: {e}")),
        Ok(out) => {
            let parsed = smi::parse(&out.stdout).unwrap_or_default();
            let listed = !parsed.gpus.is_empty() || parsed.host_view;
            if !out.status.success() && !listed {
                let why = out
                    .last_line()
                    .unwrap_or_else(|| format!("exited with {}", out.status));
                return SmiRead::Failed(format!("{smi}: {why}"));
            }
            SmiRead::Snapshot(parsed)
        }
    }
}

/// The `journalctl` arguments that select nvidia-gridd's entries of this boot.
pub fn journal_args(settings: &Settings, follow: bool) -> Vec<String> {
    journal_args_of(settings, follow, &this_boot_arg(settings))
}

fn journal_args_of(settings: &Settings, follow: bool, boot: &str) -> Vec<String> {
    let mut argv = vec![
        settings.commands.journalctl.clone(),
        boot.to_string(),
        "--output=json".into(),
        "--no-pager".into(),
    ];
    if follow {
        // This boot's entries, then what comes next: the fold is rebuilt from them whenever
        // the follower (re)starts, so nothing is lost or seen twice.
        argv.push("--follow".into());
        argv.push("--lines=all".into());
    }
    // Only root's entries: `SYSLOG_IDENTIFIER` is the sender's to choose, `_UID` is journald's.
    // Different fields AND, `+` ORs groups, so each group names `_UID=0` again. The parser
    // checks each entry once more (journal::Trust::Journal): root's other programs pass here.
    argv.extend(
        [
            "_UID=0",
            "_COMM=nvidia-gridd",
            "+",
            "_UID=0",
            "_SYSTEMD_UNIT=nvidia-gridd.service",
            "+",
            "_UID=0",
            "SYSLOG_IDENTIFIER=nvidia-gridd",
        ]
        .map(String::from),
    );
    // And systemd's own lines about gridd's unit (started, stopped, failed, its process
    // killed): `_PID=1` is journald's, so no other process can forge them.
    argv.extend([
        "+".into(),
        "_PID=1".into(),
        format!("UNIT={}", settings.gridd.unit),
    ]);
    argv
}

/// The `journalctl` arguments that follow the vGPU manager's new entries on a host
/// (`nvidia-vgpu-mgr`, one process per VM's vGPU): each is a sign that a VM changed.
pub fn vgpu_mgr_journal_args(settings: &Settings) -> Vec<String> {
    let ident = crate::model::observe::vgpu_mgr::IDENT;
    let mut argv = vec![
        settings.commands.journalctl.clone(),
        this_boot_arg(settings),
        "--output=json".into(),
        "--no-pager".into(),
        "--follow".into(),
        "--lines=0".into(),
    ];
    // Root's entries only, as for gridd's (see `journal_args_of`).
    for (i, field) in ["_COMM", "_SYSTEMD_UNIT", "SYSLOG_IDENTIFIER"]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            argv.push("+".into());
        }
        let value = match field {
            "_SYSTEMD_UNIT" => format!("{ident}.service"),
            _ => ident.to_string(),
        };
        argv.push("_UID=0".into());
        argv.push(format!("{field}={value}"));
    }
    argv
}

/// Reads gridd's journal of this boot into a fold.
pub fn read_journal(
    settings: &Settings,
    max_events: usize,
) -> Result<(LogFold, ScanStats), String> {
    let argv = journal_args(settings, false);
    // A guest failing for days has more than the cap: its newest entries say why.
    let (out, older_dropped) = command::run_keeping_tail(&argv, settings.commands.timeout)
        .map_err(|e| format!("{}: {e}", settings.commands.journalctl))?;
    if !out.status.success() && out.stdout.is_empty() {
        return Err(format!(
            "{}: {}",
            settings.commands.journalctl,
            out.last_line().unwrap_or_else(|| out.status.to_string())
        ));
    }
    let mut fold = LogFold::new(max_events);
    let mut stats =
        journal::scan_journal(&out.stdout[..], |e| fold.push(e)).map_err(|e| e.to_string())?;
    stats.older_dropped = older_dropped;
    Ok((fold, stats))
}

/// What gridd did with its lease as the previous boot ended, from that boot's journal (which
/// a persistent journal keeps). `None` when there is no previous boot in the journal, or gridd
/// held no lease at its end. The caller asks first whether that boot was the image builder's.
pub fn previous_boot_shutdown(settings: &Settings) -> Option<crate::model::shutdown::LastShutdown> {
    let argv = journal_args_of(settings, false, "--boot=-1");
    let out = command::run(&argv, settings.commands.timeout).ok()?;
    // gridd logs a few lines an hour; the last ones of the boot are what matters.
    const KEEP: usize = 1000;
    let mut events = std::collections::VecDeque::new();
    journal::scan_journal(&out.stdout[..], |e| {
        if events.len() == KEEP {
            events.pop_front();
        }
        events.push_back(e);
    })
    .ok()?;
    crate::model::shutdown::judge(events.make_contiguous())
}

/// The token directory as gridd sees it.
#[derive(Debug)]
pub struct TokenState {
    /// The installed token's path: the file gridd reads as the token, whatever its name
    /// ([`crate::token::dir`]); the standard path when there is none.
    pub path: PathBuf,
    /// The token, or why there is none usable. A token that decodes is `Ok` whatever its
    /// dates: its validity is judged at each observation ([`token_at`]).
    pub token: Result<Token, TokenProblem>,
    /// The file's mode, when it exists.
    pub mode: Option<u32>,
    /// The file's owner, when it exists.
    pub uid: Option<u32>,
    /// The directory as scanned (`None` when it cannot be read at all).
    pub listing: Option<crate::token::dir::Listing>,
}

impl TokenState {
    /// The directory's files held open for writing, and their last change.
    pub fn held_since(&self) -> Vec<(String, DateTime<Utc>)> {
        self.listing
            .as_ref()
            .map(crate::token::dir::Listing::held_since)
            .unwrap_or_default()
    }

    /// Other files in the token directory (gridd may read them and fail).
    pub fn strays(&self) -> &[crate::token::dir::Stray] {
        self.listing.as_ref().map_or(&[], |l| l.strays.as_slice())
    }
}

/// Looks at the installed token and its directory. `now` only breaks ties between several
/// tokens (one valid now is the token); the token's own validity is judged later, at each
/// observation.
pub fn token_state(settings: &Settings, now: DateTime<Utc>) -> TokenState {
    let p = &settings.paths;
    let listing = crate::token::dir::scan(&p.token_dir, &p.token_file, &p.gridd_conf, now);
    let listing = match listing {
        Ok(l) => l,
        Err(e) => {
            return TokenState {
                path: p.token_path(),
                token: Err(TokenProblem::Unreadable(format!(
                    "the token directory {} {e}",
                    crate::model::text::show_path(&p.token_dir)
                ))),
                mode: None,
                uid: None,
                listing: None,
            };
        }
    };
    let (path, token, mode, uid) = match &listing.token {
        None => (p.token_path(), Err(TokenProblem::Missing), None, None),
        Some(i) => {
            let token = match &i.content {
                crate::token::dir::Content::Token(t) => Ok(t.clone()),
                crate::token::dir::Content::Invalid(TokenError::TooLarge(_)) => Err(
                    TokenProblem::Invalid(TokenError::TooLarge(MAX_TOKEN_BYTES + 1)),
                ),
                crate::token::dir::Content::Invalid(e) => Err(TokenProblem::Invalid(e.clone())),
                crate::token::dir::Content::Unreadable(e) => {
                    Err(TokenProblem::Unreadable(e.clone()))
                }
            };
            (i.path.clone(), token, Some(i.mode), Some(i.uid))
        }
    };
    TokenState {
        path,
        token,
        mode,
        uid,
        listing: Some(listing),
    }
}

use crate::model::assemble::{self, SmiRead, Source, TokenProblem};
use crate::model::observe::unit::UnitState;

/// The license server gridd.conf names (`ServerAddress`, non-empty), if any: what tells a
/// guest of the legacy licensing path where no token and no log says otherwise. An absent or
/// unreadable gridd.conf names none.
pub fn legacy_server(settings: &Settings) -> Option<String> {
    read_gridd_conf(settings)?
        .get("ServerAddress")
        .map(|e| e.value.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// gridd.conf as it is now; `None` when it is absent or unreadable (gridd runs without one).
fn read_gridd_conf(settings: &Settings) -> Option<crate::model::gridd_conf::GriddConf> {
    let bytes = crate::files::input::read_file(
        &settings.paths.gridd_conf,
        crate::model::gridd_conf::MAX_GRIDD_CONF_BYTES,
        crate::files::input::Links::Refuse,
    )
    .ok()?;
    Some(crate::model::gridd_conf::GriddConf::parse(&bytes))
}

/// The proxy gridd.conf names for gridd's way to its license service (`None`: none, or no
/// gridd.conf); an error when it names one that gridd cannot use.
pub fn gridd_proxy(settings: &Settings) -> Result<Option<crate::model::gridd_conf::Proxy>, String> {
    read_gridd_conf(settings).map_or(Ok(None), |c| c.proxy())
}

/// One look at the token directory and gridd.conf: the installed token, the files held open
/// for writing, and the legacy license server gridd.conf names.
pub fn token_read(settings: &Settings, now: DateTime<Utc>) -> assemble::TokenRead {
    let tokens = token_state(settings, now);
    assemble::TokenRead {
        held_writers: tokens.held_since(),
        token: tokens.token,
        legacy_server: legacy_server(settings),
    }
}

/// What a one-shot look at the machine saw (`status`, `diagnose`): the answers of a source of
/// observations. The DLS probe and the service's report are `diagnose`'s to add.
pub struct Look {
    pub now: DateTime<Utc>,
    pub smi: SmiSnapshot,
    /// gridd's journal of this boot (nothing when it could not be read).
    pub fold: Option<LogFold>,
    /// Why gridd's journal was not read whole, or at all.
    pub journal_note: Option<String>,
    pub token: Result<Token, TokenProblem>,
    /// The token directory's files held open for writing, and their last change.
    pub held: Vec<(String, DateTime<Utc>)>,
    pub unit: Option<UnitState>,
    pub legacy_server: Option<String>,
    pub node: crate::model::state::NodeSeen,
    /// The DLS probe's finding (`diagnose`).
    pub probe: Option<crate::model::report::Finding>,
    /// The running service's report: what only the service remembers (a file it refused, a
    /// token source it refused, a Secret ahead of gridd's token), as `status` shows it.
    pub served: Option<Report>,
}

/// Looks at everything observable now (no DLS probe here).
pub fn look(settings: &Settings, now: DateTime<Utc>, max_events: usize) -> Look {
    let smi = read_smi(settings).into_snapshot();
    let read = read_journal(settings, max_events);
    let journal_note = match &read {
        Err(e) => Some(format!("gridd's journal could not be read: {e}")),
        Ok((_, stats)) if stats.older_dropped => Some(format!(
            "gridd's journal of this boot is longer than {} MiB: only its newest entries were read",
            command::MAX_OUTPUT >> 20
        )),
        Ok(_) => None,
    };
    let tokens = token_read(settings, now);
    Look {
        now,
        smi,
        fold: read.ok().map(|(fold, _)| fold),
        journal_note,
        held: tokens.held_writers,
        token: tokens.token,
        unit: crate::gridd::unit_state(settings),
        legacy_server: tokens.legacy_server,
        node: crate::node::detect(settings).seen(),
        probe: None,
        served: None,
    }
}

/// Everything observable now, as observations (`status`).
pub fn observe(settings: &Settings, now: DateTime<Utc>, max_events: usize) -> Observations {
    assemble::observe(settings, &look(settings, now, max_events))
}

impl Look {
    /// What the service's report says of a failure only it sees.
    fn served(&self, reason: Reason) -> Option<String> {
        crate::model::state::served_finding(self.served.as_ref()?, reason)
    }
}

impl Source for Look {
    fn now(&self) -> Option<DateTime<Utc>> {
        Some(self.now)
    }

    fn held_writers(&self) -> Vec<(String, DateTime<Utc>)> {
        self.held.clone()
    }

    fn smi(&self) -> Option<SmiSnapshot> {
        Some(self.smi.clone())
    }

    fn log(&self) -> Option<&LogFold> {
        self.fold.as_ref()
    }

    fn token(&self) -> Option<&Result<Token, TokenProblem>> {
        Some(&self.token)
    }

    fn unit(&self) -> Option<&UnitState> {
        self.unit.as_ref()
    }

    fn probe(&self) -> Option<crate::model::report::Finding> {
        self.probe.clone()
    }

    fn legacy_server(&self) -> Option<String> {
        self.legacy_server.clone()
    }

    fn source_rejected(&self) -> Option<String> {
        self.served(Reason::TokenSourceRejected)
    }

    fn token_rejected(&self) -> Option<String> {
        self.served(Reason::TokenRejected)
    }

    fn token_stale(&self) -> Option<String> {
        self.served(Reason::TokenStale)
    }

    fn own_notes(&self) -> Vec<String> {
        self.journal_note.iter().cloned().collect()
    }

    fn node(&self) -> Option<crate::model::state::NodeSeen> {
        Some(self.node.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(mode: &str) -> SmiSnapshot {
        smi::parse_text(&format!(
            "GPU 00000000:41:00.0\n    GPU Virtualization Mode\n        Virtualization Mode : {mode}\n        Host VGPU Mode : SR-IOV\n"
        ))
    }

    #[test]
    fn a_host_is_where_a_gpu_shows_host_vgpu_or_where_the_role_says() {
        let mut s = Settings::default();
        assert!(reads_host(&s, &q("Host VGPU")));
        assert!(!reads_host(&s, &q("VGPU")));
        assert!(!reads_host(&s, &q("Pass-Through")));
        s.service.role = ServiceRole::Guest;
        assert!(!reads_host(&s, &q("Host VGPU")));
        s.service.role = ServiceRole::Host;
        assert!(reads_host(&s, &q("None")));
    }

    #[test]
    fn the_vgpu_managers_journal_is_followed_from_now_root_s_entries_only() {
        let argv = vgpu_mgr_journal_args(&Settings::default());
        let matches: Vec<&str> = argv
            .iter()
            .map(String::as_str)
            .skip_while(|a| a.starts_with('-') || *a == "journalctl")
            .collect();
        assert_eq!(
            matches,
            [
                "_UID=0",
                "_COMM=nvidia-vgpu-mgr",
                "+",
                "_UID=0",
                "_SYSTEMD_UNIT=nvidia-vgpu-mgr.service",
                "+",
                "_UID=0",
                "SYSLOG_IDENTIFIER=nvidia-vgpu-mgr"
            ]
        );
        assert!(argv.iter().any(|a| a == "--follow"));
        assert!(argv.iter().any(|a| a == "--lines=0"));
    }
}
