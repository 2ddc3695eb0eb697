//! `analyze`: saved outputs through the same parsers and state machine that the service
//! feeds live.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cli::AnalyzeArgs;
use crate::files::input::{self, Links, ReadError};
use crate::model::assemble::{Source, TokenProblem, observe};
use crate::model::config::Settings;
use crate::model::observe::app_log::{self, AppLog};
use crate::model::observe::{journal, smi, vgpu_mgr};
use crate::model::report::Report;
use crate::model::report::{human, metrics};
use crate::model::state::{LogFold, evaluate};
use crate::model::token::Token;
use anyhow::Context;
use std::process::ExitCode;

/// An input that could not be read or understood (exit code 3, unknown).
#[derive(Debug)]
pub struct InputError(pub String);

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InputError {}

/// nvidia-smi output of many GPUs is a few hundred KB; this bounds a wrong file.
const MAX_SMI_BYTES: usize = 64 << 20;

/// How long standard input may take to deliver a whole saved output.
const STDIN_DEADLINE: Duration = Duration::from_secs(300);

/// A saved journal larger than this is not one gridd's log can fill (it logs a few lines an
/// hour); the cap keeps `analyze --journal -` on an endless stream from running forever.
const MAX_JOURNAL_BYTES: usize = 1 << 30;

/// The whole of a saved output: a regular file or standard input, at most `cap` bytes.
fn read_all(path: &Path, cap: usize, what: &str) -> Result<Vec<u8>, InputError> {
    input::read_named(path, cap, STDIN_DEADLINE).map_err(|e| match e {
        ReadError::TooLarge(_) => InputError(format!(
            "{}: {e}, not {what}; give the saved output itself",
            input::named(path)
        )),
        e => InputError(format!("cannot read {}: {e}", input::named(path))),
    })
}

fn read_smi(path: &Path) -> Result<smi::SmiSnapshot, InputError> {
    let bytes = read_all(path, MAX_SMI_BYTES, "nvidia-smi output")?;
    smi::parse(&bytes).map_err(|e| InputError(format!("{}: {e}", input::named(path))))
}

/// Reads a saved log for gridd's lines: standard input as a stream, a file in sections (see
/// [`crate::observe::journal_file::scan_file`]). Standard input is read once, so its bytes go to `host` (the vGPU
/// manager's lines) as they pass; a file is read for those only where it held none of
/// gridd's (see [`scan_host_file`]).
fn scan_journal(
    path: &Path,
    sink: impl FnMut(journal::GriddEvent),
    host: &mut vgpu_mgr::Scan,
) -> Result<journal::ScanStats, InputError> {
    let cannot =
        |e: &dyn std::fmt::Display| InputError(format!("cannot read {}: {e}", input::named(path)));
    let stats = if input::is_stdin(path) {
        let reader =
            input::open_stream(path, MAX_JOURNAL_BYTES, STDIN_DEADLINE).map_err(|e| cannot(&e))?;
        journal::scan(
            Tee {
                inner: reader,
                host,
            },
            sink,
        )
    } else {
        let file = input::open_regular(path, Links::Follow).map_err(|e| cannot(&e))?;
        let len = file.metadata().map_err(|e| cannot(&e))?.len();
        if len > MAX_JOURNAL_BYTES as u64 {
            return Err(cannot(&ReadError::TooLarge(MAX_JOURNAL_BYTES)));
        }
        crate::observe::journal_file::scan_file(&file, len, sink)
    };
    stats.map_err(|e| cannot(&input::describe(&e)))
}

/// A reader that hands what it reads to the vGPU manager's scan too.
struct Tee<'a, R> {
    inner: R,
    host: &'a mut vgpu_mgr::Scan,
}

impl<R: std::io::Read> std::io::Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.host.feed(&buf[..n]);
        Ok(n)
    }
}

/// A saved log file read for the vGPU manager's lines (a host's journal).
fn scan_host_file(path: &Path, host: &mut vgpu_mgr::Scan) -> Result<(), InputError> {
    let cannot =
        |e: &dyn std::fmt::Display| InputError(format!("cannot read {}: {e}", input::named(path)));
    let mut reader =
        input::open_stream(path, MAX_JOURNAL_BYTES, STDIN_DEADLINE).map_err(|e| cannot(&e))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match std::io::Read::read(&mut reader, &mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => host.feed(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(cannot(&input::describe(&e))),
        }
    }
}

/// Builds the report from saved outputs.
pub fn analyze(args: &AnalyzeArgs) -> Result<Report, InputError> {
    check_inputs(args)?;
    let mut saved = Saved::default();
    if let Some(path) = &args.smi {
        add_smi(path, &mut saved)?;
    }
    if let Some(path) = &args.journal {
        add_journal(path, args.max_events, &mut saved)?;
    }
    saved.app_log = app_log_of(args, &saved)?;
    if let Some(path) = &args.token {
        let bytes = read_all(
            path,
            crate::model::token::MAX_TOKEN_BYTES,
            "a client configuration token",
        )?;
        let token = Token::decode(&bytes)
            .map_err(|e| InputError(format!("{}: {e}", crate::model::text::show_path(path))))?;
        saved.token = Some(Ok(token));
    }
    Ok(evaluate(observe(&Settings::default(), &saved)))
}

/// What the saved outputs hold: the answers of a source of observations, taken as they were
/// (no present moment judges them).
#[derive(Default)]
struct Saved {
    smi: Option<smi::SmiSnapshot>,
    log: Option<(LogFold, journal::ScanStats)>,
    token: Option<Result<Token, TokenProblem>>,
    app_log: Option<(PathBuf, AppLog)>,
    /// A host's vGPU manager log, where the journal held its lines.
    host_log: Option<vgpu_mgr::HostLog>,
    /// What the outputs are or lack.
    notes: Vec<String>,
}

impl Source for Saved {
    /// nvidia-smi's time, else the time of gridd's last line (exact where it has a zone).
    fn at(&self) -> Option<(DateTime<Utc>, bool)> {
        if let Some(at) = self.smi.as_ref().and_then(|s| s.timestamp) {
            return Some((at.and_utc(), false));
        }
        let last = self.log.as_ref()?.1.last_stamp?;
        match last.utc() {
            Some(at) => Some((at, true)),
            None => last.naive_as_utc().map(|at| (at, false)),
        }
    }

    fn smi(&self) -> Option<smi::SmiSnapshot> {
        self.smi.clone()
    }

    fn log(&self) -> Option<&LogFold> {
        self.log.as_ref().map(|(fold, _)| fold)
    }

    fn log_stats(&self) -> Option<&journal::ScanStats> {
        self.log.as_ref().map(|(_, stats)| stats)
    }

    fn token(&self) -> Option<&Result<Token, TokenProblem>> {
        self.token.as_ref()
    }

    fn app_log(&self) -> Option<(PathBuf, AppLog)> {
        self.app_log.clone()
    }

    fn input_notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn host_log(&self) -> Option<vgpu_mgr::HostLog> {
        self.host_log.clone()
    }
}

/// Something to analyze, and standard input read for one of them at most.
fn check_inputs(args: &AnalyzeArgs) -> Result<(), InputError> {
    let inputs = [&args.smi, &args.journal, &args.app_log];
    if inputs.iter().all(|i| i.is_none()) {
        return Err(InputError(
            "nothing to analyze: give --smi FILE (saved `nvidia-smi -q`), --journal FILE (gridd's log) and/or --app-log FILE (an application's log with its CUDA errors); `-` reads standard input".into(),
        ));
    }
    let stdin = inputs
        .iter()
        .filter(|i| i.as_deref().is_some_and(input::is_stdin))
        .count();
    if stdin > 1 {
        return Err(InputError(
            "only one of --smi, --journal and --app-log can read standard input: save the others to files"
                .into(),
        ));
    }
    Ok(())
}

/// An application's log is read whole up to this; its CUDA errors come early.
const MAX_APP_LOG_BYTES: usize = 256 << 20;

/// The application's log to read and its CUDA errors: `--app-log`, or else a `--journal`
/// file that held no gridd line (people give the job's log where gridd's is asked for) and
/// holds CUDA errors. Standard input, once read as a journal, is not read again.
fn app_log_of(args: &AnalyzeArgs, saved: &Saved) -> Result<Option<(PathBuf, AppLog)>, InputError> {
    if let Some(path) = &args.app_log {
        let bytes = read_all(path, MAX_APP_LOG_BYTES, "an application's log")?;
        return Ok(Some((path.clone(), app_log::scan(&bytes))));
    }
    let no_gridd = saved
        .log
        .as_ref()
        .is_some_and(|(fold, _)| fold.total() == 0);
    let Some(path) = args
        .journal
        .as_ref()
        .filter(|p| no_gridd && !input::is_stdin(p))
    else {
        return Ok(None);
    };
    let bytes = read_all(path, MAX_APP_LOG_BYTES, "an application's log")?;
    let found = app_log::scan(&bytes);
    Ok(found.any().then(|| (path.clone(), found)))
}

/// A saved `nvidia-smi -q`: the snapshot and its time, and notes on what it lacks.
fn add_smi(path: &Path, saved: &mut Saved) -> Result<(), InputError> {
    let snap = read_smi(path)?;
    if snap.gpus.is_empty() && snap.driver_error.is_none() && !snap.whole && !snap.host_view {
        saved.notes.push(format!(
            "{}: no nvidia-smi -q output found (no `GPU ...` section, no `License Status` line)",
            crate::model::text::show_path(path)
        ));
    }
    saved.notes.extend(smi_notes(&snap));
    saved.smi = Some(snap);
    Ok(())
}

/// gridd's saved log: its events, folded, and how it was read; notes on a log without
/// gridd's lines or without times. A host's journal holds the vGPU manager's lines instead:
/// they are its answer.
fn add_journal(path: &Path, max_events: usize, saved: &mut Saved) -> Result<(), InputError> {
    let mut fold = LogFold::new(max_events);
    let mut host = vgpu_mgr::Scan::new();
    let stats = scan_journal(path, |e| fold.push(e), &mut host)?;
    if fold.total() == 0 && !input::is_stdin(path) {
        scan_host_file(path, &mut host)?;
    }
    let host = host.finish();
    let notes = &mut saved.notes;
    if fold.total() == 0 && !host.any() {
        notes.push(format!(
            "{}: no nvidia-gridd lines found",
            crate::model::text::show_path(path)
        ));
    }
    if fold.total() > 0 && stats.last_stamp.is_none() {
        notes.push(format!(
            "{}: gridd's lines carry no time (`journalctl -o cat`?), so no event has a time and a lease cannot be judged against the clock: save the log with `journalctl -u nvidia-gridd -o json` (or `-o short-iso`)",
            crate::model::text::show_path(path)
        ));
    }
    if host.any() {
        saved.host_log = Some(host);
    }
    saved.log = Some((fold, stats));
    Ok(())
}

/// What a saved nvidia-smi output is, where it is not a guest's whole `nvidia-smi -q`: an
/// excerpt of a vGPU guest that stops before the license section. (The host's `nvidia-smi
/// vgpu -q` is the host's report, whose notes say what it is.)
pub fn smi_notes(snap: &smi::SmiSnapshot) -> Vec<String> {
    let mut notes = Vec::new();
    if snap.host_view {
        return notes;
    }
    let no_status = snap.gpus.iter().all(|g| g.license_status.is_none());
    let vgpu = snap
        .gpus
        .iter()
        .find_map(|g| g.profile.as_deref().filter(|p| smi::is_vgpu_profile(p)));
    if let Some(profile) = vgpu.filter(|_| no_status) {
        notes.push(format!(
            "the license section is not in this output: the vGPU profile {} needs a license, and whether it holds one is shown under `vGPU Software Licensed Product` near the end of `nvidia-smi -q`; give the whole output",
            crate::model::text::escape(profile)
        ));
    }
    notes
}

/// The `analyze` command.
pub fn run(args: &AnalyzeArgs) -> anyhow::Result<ExitCode> {
    let report = analyze(args)?;
    if args.metrics {
        let counters = metrics::Counters::from_events(&report);
        print!("{}", metrics::render(&report, &counters));
    } else if args.json {
        let mut out = serde_json::to_string_pretty(&report).context("serializing the report")?;
        out.push('\n');
        print!("{}", crate::model::text::json_for_terminal(&out));
    } else {
        print!(
            "{}",
            crate::model::text::for_terminal(&human::render(&report))
        );
    }
    Ok(ExitCode::from(report.exit_code))
}
