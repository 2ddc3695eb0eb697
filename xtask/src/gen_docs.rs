//! Generates the man pages and the shell completions (bash, zsh, fish) from the very clap
//! definitions the binary parses (`vgpu_license_agent::cli::Cli`), and the config file's page
//! from the packaged default config.
//!
//! `cargo xtask gen-docs OUT_DIR` writes
//! - `OUT_DIR/man/vgpu-license-agent.8` and one page per command
//!   (`vgpu-license-agent-install.8`, ..., `vgpu-license-agent-token-inspect.8`), the
//!   service's page `vgpu-license-agent-run.8` written out for people (what it watches,
//!   signals, watchdog, files, metrics, exit status),
//! - `OUT_DIR/man/vgpu-license-agent.toml.5`, made from `packaging/config.toml`'s comments
//!   ([`vgpu_license_agent::cli::manual::config_page`]),
//! - `OUT_DIR/completions/vgpu-license-agent.bash`, `_vgpu-license-agent` (zsh),
//!   `vgpu-license-agent.fish`.
//!
//! The pages' date comes from `SOURCE_DATE_EPOCH` (set by `packaging/build-release.sh` from the
//! Debian changelog) so that builds are reproducible; without it the date is left empty.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::Man;
use vgpu_license_agent::cli::Cli;

const NAME: &str = "vgpu-license-agent";
const SECTION: &str = "8";
const MANUAL: &str = "System Administration";

/// Writes the pages and completions under `out`, printing each file's path.
pub fn run(out: &Path) -> Result<()> {
    let man_dir = out.join("man");
    let completions_dir = out.join("completions");
    for dir in [&man_dir, &completions_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }

    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let date = source_date()?;
    let source = format!("{NAME} {}", cmd.get_version().unwrap_or_default());

    let mut pages = Vec::new();
    collect_pages(&cmd, &mut pages);
    let see_also: Vec<String> = pages.iter().map(page_name).filter(|n| n != NAME).collect();
    for page in &pages {
        let name = page_name(page);
        let man = Man::new(page.clone())
            .title(name.to_uppercase())
            .section(SECTION)
            .date(&date)
            .source(&source)
            .manual(MANUAL);
        let mut roff = Vec::new();
        if name == NAME {
            render_main_page(&man, page, &see_also, &mut roff)?;
        } else {
            render_command_page(&man, page, &name, &mut roff)?;
        }
        let path = man_dir.join(format!("{name}.{SECTION}"));
        std::fs::write(&path, roff).with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    let page = vgpu_license_agent::cli::manual::config_page(
        include_str!("../../packaging/config.toml"),
        &date,
        &source,
    );
    let path = man_dir.join(format!("{NAME}.toml.5"));
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    println!("{}", path.display());

    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd, NAME, &completions_dir)
            .with_context(|| format!("writing {shell} completions"))?;
        println!("{}", path.display());
    }
    Ok(())
}

/// The command and every visible subcommand, depth first.
fn collect_pages(cmd: &clap::Command, pages: &mut Vec<clap::Command>) {
    pages.push(cmd.clone());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.has_subcommands() {
            collect_pages(sub, pages);
        } else {
            pages.push(sub.clone());
        }
    }
}

/// `vgpu-license-agent`, `vgpu-license-agent-install`, `vgpu-license-agent-token-inspect`.
fn page_name(cmd: &clap::Command) -> String {
    cmd.get_display_name().unwrap_or(cmd.get_name()).to_string()
}

/// `SOURCE_DATE_EPOCH` as YYYY-MM-DD (UTC), or "" when unset.
fn source_date() -> Result<String> {
    let Some(epoch) = std::env::var_os("SOURCE_DATE_EPOCH") else {
        return Ok(String::new());
    };
    let secs: i64 = epoch
        .to_str()
        .and_then(|s| s.parse().ok())
        .context("SOURCE_DATE_EPOCH: expected seconds since 1970")?;
    let at =
        chrono::DateTime::from_timestamp(secs, 0).context("SOURCE_DATE_EPOCH: out of range")?;
    Ok(at.format("%Y-%m-%d").to_string())
}

/// SYNOPSIS with each option's argument (`--token-file FILE`), a required group as
/// `<a|b|c>`, and the subcommands of a command that has some.
fn render_synopsis(cmd: &clap::Command, w: &mut Vec<u8>) -> Result<()> {
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name());
    let arg_text = |a: &clap::Arg| -> String {
        let mut text = match (a.get_long(), a.get_short()) {
            (Some(l), _) => format!("\\fB\\-\\-{}\\fR", roff_escape(l)),
            (None, Some(c)) => format!("\\fB\\-{c}\\fR"),
            (None, None) => String::new(),
        };
        if a.get_action().takes_values() {
            let values: Vec<String> = a
                .get_value_names()
                .map(|v| v.iter().map(|n| n.to_string()).collect())
                .unwrap_or_else(|| vec![a.get_id().to_string().to_uppercase()]);
            for v in values {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(&format!("\\fI{}\\fR", roff_escape(&v)));
            }
        }
        text
    };
    let grouped: Vec<&clap::Id> = cmd
        .get_groups()
        .filter(|g| g.is_required_set())
        .flat_map(|g| g.get_args())
        .collect();
    let mut parts = vec![format!("\\fB{}\\fR", roff_escape(name))];
    for a in cmd.get_arguments() {
        if a.is_hide_set() || grouped.contains(&a.get_id()) {
            continue;
        }
        let text = arg_text(a);
        parts.push(if a.is_required_set() {
            text
        } else {
            format!("[{text}]")
        });
    }
    for g in cmd.get_groups().filter(|g| g.is_required_set()) {
        let mut ids: Vec<&clap::Id> = Vec::new();
        for id in g.get_args() {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let alternatives: Vec<String> = ids
            .into_iter()
            .filter_map(|id| cmd.get_arguments().find(|a| a.get_id() == id))
            .map(arg_text)
            .collect();
        parts.push(format!("<{}>", alternatives.join("|")));
    }
    if cmd.has_subcommands() {
        parts.push("\\fICOMMAND\\fR".into());
    }
    writeln!(w, ".SH SYNOPSIS\n{}", parts.join(" "))?;
    Ok(())
}

/// A command's page: clap's sections with a SYNOPSIS that keeps the arguments, then what the
/// command's own text adds (the service's page: everything an operator looks up).
fn render_command_page(man: &Man, cmd: &clap::Command, name: &str, w: &mut Vec<u8>) -> Result<()> {
    man.render_title(w)?;
    man.render_name_section(w)?;
    render_synopsis(cmd, w)?;
    man.render_description_section(w)?;
    let command = name.strip_prefix(&format!("{NAME}-")).unwrap_or(name);
    match command {
        "run" => w.write_all(RUN_DESCRIPTION.as_bytes())?,
        "config" | "config-check" | "config-show" => w.write_all(CONFIG_DESCRIPTION.as_bytes())?,
        _ => {}
    }
    man.render_options_section(w)?;
    if cmd.has_subcommands() {
        man.render_subcommands_section(w)?;
    }
    let (extra, see_also): (&str, &[&str]) = match command {
        "run" => (
            RUN_MORE,
            &[
                "vgpu-license-agent(8)",
                "vgpu-license-agent.toml(5)",
                "systemctl(1)",
                "journalctl(1)",
                "systemd.service(5)",
                "nvidia-smi(1)",
            ],
        ),
        "install" => (
            INSTALL_EXIT_STATUS,
            &[
                "vgpu-license-agent(8)",
                "vgpu-license-agent-token-inspect(8)",
            ],
        ),
        "status" | "analyze" | "diagnose" => (
            CHECK_EXIT_STATUS,
            &["vgpu-license-agent(8)", "vgpu-license-agent-run(8)"],
        ),
        "config" | "config-check" | "config-show" => (
            CONFIG_MORE,
            &["vgpu-license-agent(8)", "vgpu-license-agent.toml(5)"],
        ),
        _ => (OTHER_EXIT_STATUS, &["vgpu-license-agent(8)"]),
    };
    w.write_all(extra.as_bytes())?;
    see_also_section(see_also, w)?;
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// SEE ALSO from `name(section)` references.
fn see_also_section(refs: &[&str], w: &mut Vec<u8>) -> Result<()> {
    let refs: Vec<String> = refs
        .iter()
        .map(|r| {
            let (name, section) = r.split_once('(').unwrap_or((r, "8)"));
            format!("\\fB{}\\fR({section}", roff_escape(name))
        })
        .collect();
    writeln!(w, ".SH \"SEE ALSO\"\n{}", refs.join(",\n"))?;
    Ok(())
}

/// The main page: clap's sections, then FILES, EXIT STATUS, EXAMPLES and SEE ALSO in place of
/// the raw after-help text.
fn render_main_page(
    man: &Man,
    cmd: &clap::Command,
    see_also: &[String],
    w: &mut Vec<u8>,
) -> Result<()> {
    man.render_title(w)?;
    man.render_name_section(w)?;
    render_synopsis(cmd, w)?;
    man.render_description_section(w)?;
    w.write_all(DESCRIPTION_MORE.as_bytes())?;
    man.render_options_section(w)?;
    man.render_subcommands_section(w)?;
    w.write_all(FILES.as_bytes())?;
    w.write_all(EXIT_STATUS.as_bytes())?;
    w.write_all(EXAMPLES.as_bytes())?;
    let mut refs: Vec<String> = see_also.iter().map(|n| format!("{n}(8)")).collect();
    refs.push(format!("{NAME}.toml(5)"));
    refs.extend(
        [
            "systemctl(1)",
            "journalctl(1)",
            "systemd.exec(5)",
            "nvidia-smi(1)",
        ]
        .map(String::from),
    );
    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
    see_also_section(&refs, w)?;
    man.render_version_section(w)?;
    Ok(())
}

/// Escapes text for a roff text line: backslashes and hyphens (as in option names).
fn roff_escape(s: &str) -> String {
    s.replace('\\', "\\e").replace('-', "\\-")
}

const DESCRIPTION_MORE: &str = r#".PP
As a service (\fBvgpu\-license\-agent run\fR, started by \fBvgpu\-license\-agent.service\fR)
it watches \fBnvidia\-smi\fR and the journal of \fBnvidia\-gridd\fR, probes the Delegated
License Service (DLS) named in the client configuration token, restarts \fBnvidia\-gridd\fR
when a restart can help, and reports the license state in
\fI/run/vgpu\-license\-agent/status.json\fR, as Prometheus metrics, and in the journal with
message IDs that \fBjournalctl \-x\fR explains.
"#;

const FILES: &str = r#".SH FILES
.TP
\fI/etc/vgpu\-license\-agent/config.toml\fR
The agent's configuration (TOML). Every key is listed there, commented out, with its
default. A missing file means defaults.
.TP
\fI/etc/vgpu\-license\-agent/config.d/*.toml\fR
Drop\-ins, read after \fIconfig.toml\fR in name order; a later key wins.
.TP
\fI/etc/nvidia/ClientConfigToken/client_configuration_token.tok\fR
The client configuration token (mode 0744, directory 0755), installed by
\fBvgpu\-license\-agent install\fR.
.TP
\fI/etc/nvidia/gridd.conf\fR
The configuration of \fBnvidia\-gridd\fR; the agent sets \fBFeatureType\fR and keeps every
other line.
.TP
\fI/run/vgpu\-license\-agent/status.json\fR
The live report of the running service (JSON, schema vgpu\-license\-agent/report/v1).
.TP
\fI/var/lib/vgpu\-license\-agent/\fR
The agent's state.
.TP
\fI/var/lib/prometheus/node\-exporter/vgpu_license_agent.prom\fR
Metrics for the textfile collector of the Prometheus node exporter, written where that
directory exists.
.TP
\fI/usr/share/vgpu\-license\-agent/vgpu\-license\-agent.rules.yml\fR
Prometheus alert rules for fleets of guests.
.TP
\fI/usr/lib/systemd/system/vgpu\-licensed.target\fR
Reached once the guest holds a license: order units that need the GPU at full speed after
it (see \fBvgpu\-license\-agent\-run\fR(8)).
.TP
\fI/usr/share/doc/vgpu\-license\-agent/\fR
The guides (install, KubeVirt, Kubernetes nodes, fleet, how it works, security, and more),
the Grafana dashboard and cloud\-init examples.
"#;

const EXIT_STATUS: &str = r#".SH "EXIT STATUS"
\fBstatus\fR, \fBanalyze\fR and \fBdiagnose\fR follow the monitoring\-plugin convention:
.TP
.B 0
licensed; all checks pass.
.TP
.B 1
warning: acquiring a license, in the grace period, or the lease expires soon.
.TP
.B 2
critical: restricted, failing, or not installed.
.TP
.B 3
unknown: not enough to tell, the input could not be read, or the command line is wrong.
.PP
\fBinstall\fR exits 0 on success and 1 on a failure, with a one\-line reason on standard
error. A failure before its first change leaves everything as it was; when the token and
gridd.conf are installed but restarting \fBnvidia\-gridd\fR fails, it exits 1 and says that
they are installed (run it again: it retries the restart).
.PP
The other commands exit 0 on success and 1 on an error. A wrong command line (an unknown
option, a missing argument) exits 2, but for \fBstatus\fR, \fBanalyze\fR and \fBdiagnose\fR,
which exit 3 (unknown) for a monitoring system.
"#;

/// More of the service's page, after clap's one line: what `run` is.
const RUN_DESCRIPTION: &str = r#".PP
\fBvgpu\-license\-agent run\fR is the service, started by \fIvgpu\-license\-agent.service\fR
(\fBType=notify\fR). It keeps an NVIDIA vGPU guest licensed and says, where an operator
looks, why it is not.
.SS "What it watches"
It follows the journal of \fBnvidia\-gridd\fR (acquired, renewed, returned, failures and
their reasons) with \fBjournalctl \-\-follow\fR, and reads \fBnvidia\-smi \-q\fR every
\fBpoll_unlicensed_seconds\fR (15) while no license is held, every \fBpoll_licensed_seconds\fR
(300) while one is, every minute in the last hour of a lease, and right after each event of
gridd. It watches the token directory and gridd.conf for changes: a token dropped there is
adopted (mode 0744, the one token gridd reads; other files are moved aside), and a token in
\fBpaths.token_source\fR (a mounted Kubernetes Secret, say) is installed from there when it
changes. It probes each Delegated License Service (DLS) node of the token (DNS, TCP, TLS,
HTTPS) and measures the guest clock against the DLS's.
.SS "When it restarts nvidia\-gridd"
Only for what a retry can clear: still unlicensed \fBrestart_grace_seconds\fR (120) after
gridd started, with the DLS unreachable or no reason given. Never for what a restart cannot
fix: a token invalid or expired, no license of the edition left, an unsupported GPU, a
clock off the DLS's. Restarts back off (\fBrestart_backoff_seconds\fR, 60, doubling up to
\fBrestart_backoff_max_seconds\fR, 1800) and are at most \fBrestart_budget_per_hour\fR (4)
in any hour. A token it installs restarts gridd once.
.SS Logging
Under systemd it logs to the journal, with message IDs that \fBjournalctl \-x\fR explains;
started from a terminal, or with \fB\-\-log\-stderr\fR, to standard error.
"#;

const RUN_MORE: &str = r#".SH SIGNALS
.TP
.B SIGHUP
Reload: read the config and its drop\-ins again (\fBsystemctl reload vgpu\-license\-agent\fR).
A config that does not load is refused and logged, and the running one kept. The unit's
\fBExecReload=\fR runs \fBvgpu\-license\-agent config check\fR first, so that
\fBsystemctl reload\fR itself fails on a bad config (its error is in \fBsystemctl status\fR).
.TP
.BR SIGTERM ", " SIGINT
Stop: the service tells systemd it is stopping, ends its \fBjournalctl\fR and exits 0.
\fI/run/vgpu\-license\-agent\fR, with \fIstatus.json\fR, goes with the unit's run directory,
so that no stale report is read.
.SH WATCHDOG
Under \fBWatchdogSec=\fR (60 s in the unit) the main loop sends \fBWATCHDOG=1\fR at least
twice per period; a hung agent is killed and restarted by systemd (\fBRestart=on\-failure\fR).
Its status line (\fBsystemctl status\fR) says the license state.
.SH FILES
.TP
\fI/etc/vgpu\-license\-agent/config.toml\fR, \fI/etc/vgpu\-license\-agent/config.d/*.toml\fR
The config, see \fBvgpu\-license\-agent.toml\fR(5).
.TP
\fI/etc/nvidia/ClientConfigToken/\fR
The token directory: the client configuration token gridd reads, kept as the one
\fI*.tok\fR file there.
.TP
\fI/etc/nvidia/gridd.conf\fR
gridd's config: the service keeps \fBFeatureType\fR where \fBgridd.feature_type\fR is set.
.TP
\fI/run/vgpu\-license\-agent/status.json\fR
The live report (JSON, schema vgpu\-license\-agent/report/v1), read by
\fBvgpu\-license\-agent status\fR.
.TP
\fI/var/lib/vgpu\-license\-agent/\fR
The agent's state: the restarts made, the last shutdown's lease return, the identity of the
guest.
.TP
\fI/var/lib/prometheus/node\-exporter/vgpu_license_agent.prom\fR
The metrics for node_exporter's textfile collector, written where that directory exists.
.SH METRICS
The Prometheus metrics (in the textfile, and over HTTP where configured), among them
\fBvgpu_license_licensed\fR (1 when a license is held), \fBvgpu_license_state{state}\fR,
\fBvgpu_license_expiry_timestamp_seconds\fR, \fBvgpu_license_failures_total{reason}\fR,
\fBvgpu_license_gridd_restarts_total\fR, \fBvgpu_license_dls_clock_skew_seconds\fR,
\fBvgpu_license_token_expiry_timestamp_seconds\fR and
\fBvgpu_license_gpu_licensed{bus_id,profile}\fR. Alert rules for them are in
\fI/usr/share/vgpu\-license\-agent/vgpu\-license\-agent.rules.yml\fR.
.SH LISTENER
Off by default. \fBservice.metrics_socket\fR serves \fBGET /metrics\fR on a Unix socket;
\fBservice.metrics_listen\fR (\fIADDRESS\fR:\fIPORT\fR, or :\fIPORT\fR for every address) on
TCP, for a cluster's monitoring to scrape the guest on its pod\-network address (open the
guest's firewall to the monitoring only). The answer is the Prometheus text format, or
OpenMetrics when the scraper asks for it; one request per connection, bounded in size, time
and number of connections. \fBservice.webhook_url\fR POSTs the JSON report on every state
change (HTTPS, certificate verified).
.SH "WAITING FOR THE LICENSE"
\fIvgpu\-licensed.target\fR is reached once the guest holds a license, through
\fIvgpu\-license\-agent\-wait\-licensed.service\fR, which runs
\fBvgpu\-license\-agent status \-\-wait\fR \fI$VGPU_LICENSE_WAIT_SECONDS\fR (600)
\fB\-\-require\-licensed\fR. A unit that needs the GPU at full speed says
\fBWants=vgpu\-licensed.target\fR and \fBAfter=vgpu\-licensed.target\fR. Nothing else waits:
boot is never held by it, and a unit that wants it starts anyway when the wait ends without a
license. Once reached, the target stays, even when the license is lost later: react to that
with the alert rules or a timer running \fBvgpu\-license\-agent status\fR.
.SH "EXIT STATUS"
.TP
.B 0
Stopped by SIGTERM or SIGINT.
.TP
.B 1
It could not start (a config that does not load, an output path that is not the agent's),
or it cannot read gridd's journal (not root, no systemd\-journal group); the error is logged.
.TP
.B 2
A wrong command line.
.SH EXAMPLES
Watch what the service does:
.PP
.RS 4
.EX
systemctl status vgpu\-license\-agent
journalctl \-u vgpu\-license\-agent \-x \-f
.EE
.RE
.PP
Change the config and apply it without a restart:
.PP
.RS 4
.EX
systemctl edit \-\-drop\-in=local vgpu\-license\-agent   # sandbox changes only
vgpu\-license\-agent config check && systemctl reload vgpu\-license\-agent
.EE
.RE
.PP
Run it by hand, logging to the terminal, with another config:
.PP
.RS 4
.EX
vgpu\-license\-agent \-\-config ./config.toml run
.EE
.RE
.PP
Start a job only once the guest is licensed:
.PP
.RS 4
.EX
# /etc/systemd/system/trainer.service.d/licensed.conf
[Unit]
Wants=vgpu\-licensed.target
After=vgpu\-licensed.target
.EE
.RE
"#;

const INSTALL_EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
.B 0
Installed, or nothing to change (a second identical run changes nothing and restarts
nothing).
.TP
.B 1
It failed, with a one\-line reason on standard error. A failure before the first change
leaves everything as it was (what was begun is undone). When the token and gridd.conf are
installed but restarting \fBnvidia\-gridd\fR fails, it exits 1 and says that they are
installed: restart gridd, or run install again (it retries the restart).
.TP
.B 2
A wrong command line.
"#;

const CHECK_EXIT_STATUS: &str = r#".SH "EXIT STATUS"
The monitoring\-plugin convention:
.TP
.B 0
licensed; all checks pass.
.TP
.B 1
warning: acquiring a license, in the grace period, or the lease expires soon.
.TP
.B 2
critical: restricted, failing, or not installed.
.TP
.B 3
unknown: not enough to tell, the input could not be read, or a wrong command line.
.PP
\fBstatus \-\-wait\fR \fISECONDS\fR \fB\-\-require\-licensed\fR exits 0 once licensed (or
when the GPU needs no license) and 1 when the time is up.
"#;

const CONFIG_DESCRIPTION: &str = r#".PP
\fBconfig check\fR loads \fI/etc/vgpu\-license\-agent/config.toml\fR (or \fB\-\-config\fR
\fIFILE\fR) and every drop\-in in \fIconfig.d/\fR exactly as the service does at start and at
reload, and checks the output paths against what is on disk. It warns of files in
\fIconfig.d/\fR that are not read (only \fI*.toml\fR are). The unit's \fBExecReload=\fR runs
it before it signals the service.
.PP
\fBconfig show\fR prints the merged config as TOML, each key with the file it comes from
("default" for none); a webhook URL is shown without its user, password and query.
"#;

const CONFIG_MORE: &str = r#".SH "EXIT STATUS"
.TP
.B 0
The config is valid.
.TP
.B 1
It is not: the one\-line error names the file, the key and what is expected.
.TP
.B 2
A wrong command line.
.SH EXAMPLES
.RS 4
.EX
vgpu\-license\-agent config check && systemctl reload vgpu\-license\-agent
vgpu\-license\-agent config show
.EE
.RE
"#;

const OTHER_EXIT_STATUS: &str = r#".SH "EXIT STATUS"
0 on success, 1 on an error (with a one\-line reason on standard error), 2 for a wrong
command line.
"#;

const EXAMPLES: &str = r#".SH EXAMPLES
Install a token, set FeatureType=1 and restart nvidia\-gridd if anything changed:
.PP
.RS 4
.EX
vgpu\-license\-agent install \-\-token\-file client_configuration_token.tok
.EE
.RE
.PP
The same with the token on standard input, showing what would change:
.PP
.RS 4
.EX
vgpu\-license\-agent install \-\-token\-file \- \-\-dry\-run < token.tok
.EE
.RE
.PP
Wait up to a minute for a license, for scripts:
.PP
.RS 4
.EX
vgpu\-license\-agent status \-\-wait 60
.EE
.RE
.PP
Explain a guest's saved logs offline:
.PP
.RS 4
.EX
journalctl \-u nvidia\-gridd \-o json > gridd.json
nvidia\-smi \-q > smi.txt
vgpu\-license\-agent analyze \-\-journal gridd.json \-\-smi smi.txt
.EE
.RE
.PP
Check everything on a live guest and say how to fix what is wrong:
.PP
.RS 4
.EX
vgpu\-license\-agent diagnose
.EE
.RE
.PP
Ready a golden image before sealing it (the token, the agent's state, gridd's client state,
cloud\-init's copy of the user\-data that carried the token, and the journal):
.PP
.RS 4
.EX
vgpu\-license\-agent prepare\-image \-\-purge\-client\-state \-\-cloud\-init \-\-journal
.EE
.RE
"#;
