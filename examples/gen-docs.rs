//! Generates the man pages (section 8) and the shell completions (bash, zsh, fish) from the
//! very clap definitions the binary parses (`vgpu_license_agent::cli::Cli`).
//!
//! Usage: `cargo run --example gen-docs -- OUT_DIR` writes
//! - `OUT_DIR/man/vgpu-license-agent.8` and one page per command
//!   (`vgpu-license-agent-install.8`, ..., `vgpu-license-agent-token-inspect.8`),
//! - `OUT_DIR/completions/vgpu-license-agent.bash`, `_vgpu-license-agent` (zsh),
//!   `vgpu-license-agent.fish`.
//!
//! The pages' date comes from `SOURCE_DATE_EPOCH` (set by `packaging/build-release.sh` from the
//! Debian changelog) so that builds are reproducible; without it the date is left empty.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::Man;
use vgpu_license_agent::cli::Cli;

const NAME: &str = "vgpu-license-agent";
const SECTION: &str = "8";
const MANUAL: &str = "System Administration";

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        bail!("usage: gen-docs OUT_DIR");
    };
    let out = PathBuf::from(out);
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
            render_main_page(&man, &see_also, &mut roff)?;
        } else {
            man.render(&mut roff)?;
            write!(roff, ".SH \"SEE ALSO\"\n\\fB{}\\fR(8)\n", roff_escape(NAME))?;
        }
        let path = man_dir.join(format!("{name}.{SECTION}"));
        std::fs::write(&path, roff).with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }

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

/// The main page: clap's sections, then FILES, EXIT STATUS, EXAMPLES and SEE ALSO in place of
/// the raw after-help text.
fn render_main_page(man: &Man, see_also: &[String], w: &mut Vec<u8>) -> Result<()> {
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    w.write_all(DESCRIPTION_MORE.as_bytes())?;
    man.render_options_section(w)?;
    man.render_subcommands_section(w)?;
    w.write_all(FILES.as_bytes())?;
    w.write_all(EXIT_STATUS.as_bytes())?;
    w.write_all(EXAMPLES.as_bytes())?;
    w.write_all(b".SH \"SEE ALSO\"\n")?;
    let mut refs: Vec<String> = see_also
        .iter()
        .map(|n| format!("\\fB{}\\fR(8)", roff_escape(n)))
        .collect();
    refs.extend(
        [
            ("systemctl", "1"),
            ("journalctl", "1"),
            ("systemd.exec", "5"),
            ("nvidia-smi", "1"),
        ]
        .map(|(n, s)| format!("\\fB{}\\fR({s})", roff_escape(n))),
    );
    writeln!(w, "{}", refs.join(",\n"))?;
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
unknown: not enough to tell, or the input could not be read.
.PP
\fBinstall\fR exits 0 on success; on any failure it exits non\-zero with a one\-line reason on
standard error, having changed nothing. The other commands exit 0 on success and 1 on an
error.
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
Ready a golden image before sealing it:
.PP
.RS 4
.EX
vgpu\-license\-agent prepare\-image \-\-purge\-client\-state
.EE
.RE
"#;
