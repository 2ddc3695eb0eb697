//! Everything observed, as values: what `assemble` makes of the sources' answers, and what
//! `state` (a guest's) and `host` (a host's) judge; `state` re-exports them. gridd's log is
//! here folded, event by event ([`LogFold`]); its judgement is `state`'s.

use std::collections::VecDeque;
use std::path::PathBuf;

use chrono::{DateTime, Utc};

use crate::identity::CloneDetected;
use crate::observe::app_log::AppLog;
use crate::observe::journal::{GriddEvent, ScanStats};
use crate::observe::meaning::{EventKind, Reason};
use crate::observe::smi::SmiSnapshot;
use crate::observe::unit::UnitState;
use crate::report::{Finding, LastShutdown, ServiceFacts};
use crate::token::Token;

/// What gridd's log says, folded event by event with bounded memory.
#[derive(Debug, Clone)]
pub struct LogFold {
    pub(crate) max_events: usize,
    pub(crate) events: VecDeque<GriddEvent>,
    pub(crate) omitted: u64,
    pub(crate) total: u64,
    /// The acquire/renew whose license is still held (no return or shutdown since).
    pub(crate) holding: Option<GriddEvent>,
    /// The latest failure that no later success cleared.
    pub(crate) failure: Option<GriddEvent>,
    pub(crate) unsupported: bool,
    pub(crate) legacy: bool,
    /// Lines that say something about the license (see [`LogFold::says_anything`]).
    pub(crate) license_lines: u64,
    /// gridd said the platform licenses the GPU (cloud GPU instances).
    pub(crate) cloud_provider: bool,
    /// A line only the token-based (DLS/CLS) licensing path logs was seen.
    pub(crate) nls: bool,
    /// The server the latest token-path line named.
    pub(crate) nls_server: Option<String>,
}

impl LogFold {
    pub fn new(max_events: usize) -> Self {
        LogFold {
            max_events,
            events: VecDeque::new(),
            omitted: 0,
            total: 0,
            holding: None,
            failure: None,
            unsupported: false,
            legacy: false,
            license_lines: 0,
            cloud_provider: false,
            nls: false,
            nls_server: None,
        }
    }

    /// Whether a line says something about the license: an acquisition or its attempt, a
    /// renewal, a return, a failure, gridd's notice that it holds none. Start-up, config and
    /// housekeeping lines do not: a log of only those proves nothing.
    fn says_anything(e: &GriddEvent) -> bool {
        use EventKind as K;
        e.what.reason.is_some()
            || matches!(
                e.what.kind,
                K::Acquiring
                    | K::Acquired
                    | K::Renewed
                    | K::Returned
                    | K::AcquireFailed
                    | K::ReturnFailed
                    | K::TokenError
                    | K::UnlicensedNotice
                    | K::Mismatch
                    | K::Unsupported
            )
    }

    pub fn push(&mut self, e: GriddEvent) {
        self.total += 1;
        self.note_path(&e);
        self.follow_lease(&e);
        self.keep_failure(&e);
        self.keep_event(e);
    }

    /// What the line says of the licensing path: legacy, the platform's, the token path and
    /// its server; and whether it says anything about the license.
    fn note_path(&mut self, e: &GriddEvent) {
        use EventKind as K;
        self.legacy |= e.what.legacy;
        self.cloud_provider |= e.what.cloud_provider;
        if Self::says_anything(e) {
            self.license_lines += 1;
        }
        // `NLS initialized`, token errors and the `(Info: server; ...)` lines exist only on
        // the token path; the legacy path names its server in a `Server URL`.
        if matches!(e.what.kind, K::Initialized | K::TokenError)
            || (!e.what.legacy && e.what.server.is_some())
        {
            self.nls = true;
        }
        if !e.what.legacy
            && let Some(server) = &e.what.server
        {
            self.nls_server = Some(server.clone());
        }
    }

    /// The lease held, as the line changes it.
    fn follow_lease(&mut self, e: &GriddEvent) {
        use EventKind as K;
        match e.what.kind {
            K::Acquired | K::Renewed => {
                self.failure = None;
                self.unsupported = false;
                self.holding = Some(e.clone());
            }
            K::Returned | K::Shutdown => self.holding = None,
            // A gridd that starts has said nothing yet: the failures of the one before it
            // (before an install, a rotation or a restart that fixed them) are history, kept
            // in the events, not the state of the one now running.
            K::Started => self.failure = None,
            // The legacy path's leases carry no expiry to judge them by; its failed
            // acquisition or renewal is gridd's word that the license is gone.
            K::AcquireFailed if e.what.legacy => self.holding = None,
            K::Unsupported => self.unsupported = true,
            _ => {}
        }
    }

    /// The line's failure, where it is the most telling one.
    fn keep_failure(&mut self, e: &GriddEvent) {
        if let Some(new) = e.what.reason {
            // The most telling failure: a generic line after a specific one from the same
            // gridd process (its housekeeping as it gives up, a bare retry) does not hide it.
            let keep = self.failure.as_ref().is_some_and(|old| {
                old.pid == e.pid
                    && old
                        .what
                        .reason
                        .is_some_and(|r| !crate::policy::replaces(r, new))
            });
            if !keep {
                self.failure = Some(e.clone());
            }
        }
    }

    /// The event among the latest `max_events`, the oldest counted out.
    fn keep_event(&mut self, e: GriddEvent) {
        if self.max_events == 0 {
            self.omitted += 1;
            return;
        }
        if self.events.len() == self.max_events {
            self.events.pop_front();
            self.omitted += 1;
        }
        self.events.push_back(e);
    }

    /// Number of events seen.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The text of the failure gridd's log holds now, if any.
    pub fn failure_message(&self) -> Option<&str> {
        self.failure.as_ref().map(|f| f.message.as_str())
    }

    /// The reason of the failure gridd's log holds now, if any.
    pub fn failure_reason(&self) -> Option<Reason> {
        self.failure
            .as_ref()
            .map(|f| f.what.reason.unwrap_or(Reason::Other))
    }
}

/// Everything observed, as values.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    pub smi: Option<SmiSnapshot>,
    pub log: Option<(LogFold, ScanStats)>,
    pub token: Option<Token>,
    /// A failure found by the agent itself (token checks, gridd unit), which outranks what
    /// the log says.
    pub own_failure: Option<Finding>,
    /// gridd's unit as systemd last answered (`None`: not asked, or systemd could not say).
    pub gridd_unit: Option<UnitState>,
    /// What the agent's DLS probe found: it names the cause where gridd's failure is vague
    /// ([`crate::policy::probe_refines`]). With a license held it is a warning (a skewed
    /// clock, a closed port: the next renewal fails).
    pub probe_failure: Option<Finding>,
    /// The license server gridd.conf names (`ServerAddress`), when one is set: the legacy
    /// licensing path, unless a token or the log shows the token path.
    pub legacy_server: Option<String>,
    /// The moment of observation: now for live commands, the time of the saved output for
    /// `analyze` (`None` when the output does not say).
    pub at: Option<DateTime<Utc>>,
    /// Whether `at` is exact; saved outputs often give a local time without its zone, then
    /// `at` is that time read as UTC, good for hours but not for the report.
    pub at_is_exact: bool,
    /// A lease expiring sooner than this after `at` is a warning.
    pub expiry_warning: chrono::Duration,
    /// The service's finding that the lease's expiry has stopped moving: since when it
    /// counts as stalled, and what to say.
    pub renewal_stalled: Option<(DateTime<Utc>, String)>,
    /// The service's memory: when it saw the lease nvidia-smi shows now come (a new
    /// acquisition, or a renewal that moved the expiry). A failure gridd logged before it is
    /// over, though gridd's line saying so may not have arrived yet (nvidia-smi shows a new
    /// lease at once; gridd's lines reach the journal's readers a moment later).
    pub lease_since: Option<DateTime<Utc>>,
    /// The token source holds a token the agent refused: why. Critical without an installed
    /// token (it is why there is none), a warning while the installed one holds.
    pub source_rejected: Option<String>,
    /// A file dropped beside the installed token was refused and moved aside, recently: which
    /// and why. A warning while nothing worse is found.
    pub token_rejected: Option<String>,
    /// On a GPU Operator node, the licensing Secret holds another token than gridd's: why. A
    /// warning while nothing worse is found.
    pub token_stale: Option<String>,
    /// What the service has to say about the token for a while (a rotation it made): notes.
    pub token_notes: Vec<String>,
    /// Files of the token directory held open for writing past the bound: their names and
    /// for how long (seconds). Said in the notes; they hold nothing else up.
    pub held_writers: Vec<(String, u64)>,
    /// The agent's own trouble in observing (a journal not read whole, a command it could
    /// not start): said in the report's notes, never a verdict on the license.
    pub own_notes: Vec<String>,
    /// Where the agent found the driver: set for live observations, `None` for `analyze`.
    pub node: Option<NodeSeen>,
    /// An application's log and its CUDA errors (`analyze` only): CUDA error 102 means the
    /// vGPU held no license when the application asked for it.
    pub app_log: Option<(PathBuf, AppLog)>,
    /// What saved outputs are or lack (`analyze`: a host's view, an excerpt, a log without
    /// gridd's lines): said after everything else.
    pub input_notes: Vec<String>,
    /// A saved log's gridd lines carry a time of day: where none of its events gets a date,
    /// their year is missing, and the report says so.
    pub saved_log_timed: bool,
    /// The vGPU manager's log on a host (`analyze --journal` of a host's journal): each VM's
    /// license state as the host logged it.
    pub host_log: Option<crate::observe::vgpu_mgr::HostLog>,
    /// The service process that writes the report.
    pub agent_pid: Option<u32>,
    /// What gridd did with its lease as the previous boot ended (the service).
    pub last_shutdown: Option<LastShutdown>,
    /// A clone found at this boot (the service): the agent's own event, before gridd's.
    pub clone_detected: Option<CloneDetected>,
    /// Since when the agent's own findings hold, where the service remembers: the report's
    /// failure is dated so, rather than by the observation's time.
    pub since: Since,
    /// What only the service measured or keeps ([`crate::assemble::Source::service`]).
    pub service: Option<ServiceFacts>,
}

/// Since when the agent's own findings hold (the service's memory).
#[derive(Debug, Clone, Default)]
pub struct Since {
    /// The file refused beside the token (a `token_rejected` failure).
    pub token_rejected: Option<DateTime<Utc>>,
    /// The token source's token refused (a `token_source_rejected` failure).
    pub source_rejected: Option<DateTime<Utc>>,
    /// The agent's own finding (token, unit, probe), and since when it holds.
    pub own: Option<(Finding, DateTime<Utc>)>,
    /// A finding of what the agent sees rather than of gridd's lines (no driver answers, the
    /// licensing Secret holds another token), and when the service first reported it: dated
    /// so, not by each reading that still shows it.
    pub seen: Option<(Finding, DateTime<Utc>)>,
}

/// The node as the agent found it (the agent's `node` detects it): the mode, and on a GPU
/// Operator node where its driver root is, whether the operator says its driver is ready,
/// and the node's name for the `kubectl` commands of the advice.
#[derive(Debug, Clone, Default)]
pub struct NodeSeen {
    pub observe: bool,
    pub driver_root: Option<String>,
    pub driver_ready: bool,
    /// The driver pod is going or not ready yet (the operator's readiness marker is absent
    /// beside its other markers): no verdict on its token, nor on the Secret, meanwhile.
    pub pod_going: bool,
    pub node_name: Option<String>,
    /// `service.mode = "manage"` on a GPU Operator node: refused, observed instead.
    pub manage_refused: bool,
}
