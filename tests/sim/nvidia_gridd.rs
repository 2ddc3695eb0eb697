//! The simulated `nvidia-gridd`: a long-lived process named `nvidia-gridd` that logs the real
//! daemon's message texts to journald (syslog socket) and reacts to the token directory and
//! to the DLS named in the token as the real one does:
//!
//! - no readable token: `Unable to fetch the client configuration token file`, keeps running
//!   and looks again every `retry_seconds` (when `pickup_new_token`);
//! - a file in the token directory that does not decode (a bad token, a stray gridd.conf):
//!   the decode failure lines, `Failed to setup cloud License Manager: 3`, `Shutdown (PID)`,
//!   exit 1;
//! - a token: a real TLS connection to the token's DLS node (lease port), whose HTTP `Date`
//!   is compared with the guest clock: skew -> clock windback failure; no connection or no
//!   TLS -> the bare `Failed to acquire license from <host>`; else a lease of
//!   `lease_seconds`, renewed after `renew_fraction` of it;
//! - a passthrough GPU: `Licensing not supported for GPUs in the system`;
//! - SIGTERM: returns the license, `Shutdown (PID)`, exit 0.
//!
//! The license goes to `state.json` in the sim dir, which the simulated nvidia-smi reads.
//!
//!     sim-nvidia-gridd [--sim-dir DIR]

#[path = "https.rs"]
mod https;
#[path = "shared.rs"]
mod shared;

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use chrono::{DateTime, Utc};
use nix::sys::signal::{SigSet, Signal};
use shared::{ERR, GpuState, INFO, SimConfig, Syslog, WARNING};
use vgpu_license_agent::token::{DlsNode, Token};

struct Gridd {
    dir: PathBuf,
    cfg: SimConfig,
    log: Syslog,
    pid: u32,
    stop: Receiver<()>,
    edition: String,
    /// The node that granted the license held.
    held: Option<DlsNode>,
}

/// What the token directory holds, as gridd sees it.
enum TokenDir {
    /// Nothing gridd can read.
    Nothing,
    /// A file that is not a token (gridd fails to decode it and exits).
    Undecodable,
    Token(Box<Token>),
}

/// Why talking to the DLS failed.
enum DlsError {
    /// No TCP connection, no TLS, no HTTP answer.
    Network,
    /// The DLS's clock is this many seconds from ours.
    #[allow(dead_code)]
    Skew(i64),
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // The real daemon's process name: journald records it as _COMM.
    let _ = nix::sys::prctl::set_name(c"nvidia-gridd");
    let dir = shared::sim_dir(&mut args);
    if !args.is_empty() {
        eprintln!("usage: sim-nvidia-gridd [--sim-dir DIR]");
        std::process::exit(2);
    }
    let _ = std::fs::create_dir_all(&dir);
    let cfg = SimConfig::load(&dir);

    // SIGTERM/SIGINT end the daemon; SIGHUP is ignored. Blocked here so that every thread
    // inherits the mask, and taken by one thread with sigwait.
    let mut mask = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        mask.add(s);
    }
    let _ = mask.thread_block();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        loop {
            match mask.wait() {
                Ok(Signal::SIGHUP) => continue,
                Ok(_) => {
                    let _ = tx.send(());
                    return;
                }
                Err(_) => continue,
            }
        }
    });

    // Not part of the real daemon: a simulated machine that is gone (its directory removed
    // by the test that made it) takes its gridd with it, silently, so that a gridd restarted
    // in the very moment a test ended cannot log into the next test's journal.
    let orphan_dir = dir.clone();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            if !orphan_dir.exists() {
                std::process::exit(0);
            }
        }
    });

    let log = Syslog::new("nvidia-gridd", cfg.echo, Some(dir.join(shared::GRIDD_LOG)));
    let edition = cfg.edition();
    let mut g = Gridd {
        pid: std::process::id(),
        dir,
        cfg,
        log,
        stop: rx,
        edition,
        held: None,
    };
    let code = g.run();
    g.shutdown(code);
}

impl Gridd {
    /// Waits, or returns `true` as soon as the daemon is asked to stop.
    fn wait(&self, d: Duration) -> bool {
        !matches!(self.stop.recv_timeout(d), Err(RecvTimeoutError::Timeout))
    }

    fn retry(&self) -> Duration {
        Duration::from_secs_f64(self.cfg.retry_seconds.max(0.05))
    }

    fn state(&self) -> GpuState {
        GpuState::load(&self.dir).unwrap_or(GpuState {
            unlicensed_since: Utc::now().timestamp(),
            ..GpuState::default()
        })
    }

    fn save(&self, s: &GpuState) {
        if let Err(e) = s.save(&self.dir) {
            eprintln!("sim-nvidia-gridd: cannot write the GPU state: {e}");
        }
    }

    /// The main loop; returns the exit code.
    fn run(&mut self) -> i32 {
        // The pid file first: under systemd the unit is activating (or active) before the
        // daemon can log anything, so `is-active` never says "inactive" after `Started`.
        let _ = shared::write_atomic(
            &self.dir.join(shared::PID_FILE),
            format!("{}\n", self.pid).as_bytes(),
        );
        self.log.log(INFO, &format!("Started ({})", self.pid));
        if !self.dir.join(shared::STATE_FILE).exists() {
            self.save(&self.state());
        }
        self.read_gridd_conf();
        if self.cfg.passthrough {
            self.log
                .log(ERR, "Licensing not supported for GPUs in the system");
            while !self.wait(Duration::from_secs(3600)) {}
            return 0;
        }
        self.log.log(INFO, "vGPU Software package (0)");
        self.log
            .log(INFO, "Ignore service provider and node-locked licensing");
        self.log.log(INFO, "NLS initialized");

        loop {
            let token = match self.read_token_dir() {
                TokenDir::Undecodable => {
                    self.log
                        .log(ERR, "Failed to decode signature from token received");
                    self.log.log(
                        ERR,
                        "Failed to read configurations from client configuration token (Error: Invalid client configuration token)",
                    );
                    self.log
                        .log(ERR, "Failed to setup cloud License Manager: 3");
                    return 1;
                }
                TokenDir::Nothing => {
                    loop {
                        self.log
                            .log(ERR, "Unable to fetch the client configuration token file");
                        if self.wait(self.retry()) {
                            return 0;
                        }
                        if self.cfg.pickup_new_token {
                            break;
                        }
                    }
                    continue;
                }
                TokenDir::Token(t) => t,
            };
            if self.acquire(&token) {
                if self.hold(&token) {
                    return 0;
                }
                // The lease ran out: no license any more.
                self.log.log(
                    WARNING,
                    "Valid GRID license not found. GPU features and performance will be restricted. To enable full functionality please configure licensing details.",
                );
            } else if !self.cfg.acquire_retry {
                // Like a gridd started before the network: waits for a restart.
                while !self.wait(Duration::from_secs(3600)) {}
                return 0;
            }
            if self.wait(self.retry()) {
                return 0;
            }
        }
    }

    /// What gridd logs about its config file.
    fn read_gridd_conf(&self) {
        match std::fs::read_to_string(&self.cfg.gridd_conf) {
            Err(_) => {
                for _ in 0..6 {
                    self.log.log(
                        ERR,
                        &format!(
                            "Failed to open file {} (No such file or directory)",
                            self.cfg.gridd_conf.display()
                        ),
                    );
                }
            }
            Ok(text) => {
                let set = |key: &str| {
                    text.lines().any(|l| {
                        let l = l.trim();
                        !l.starts_with('#')
                            && l.split_once('=')
                                .is_some_and(|(k, v)| k.trim() == key && !v.trim().is_empty())
                    })
                };
                if !set("ServerAddress") {
                    self.log
                        .log(INFO, "Configuration parameter ( ServerAddress  ) not set");
                }
            }
        }
    }

    /// Reads the token directory: every regular file but dot files (an installer's temporary
    /// files). A file gridd's user cannot read (no read bit for others: gridd need not run as
    /// the file's owner) is as good as none.
    fn read_token_dir(&self) -> TokenDir {
        use std::os::unix::fs::PermissionsExt;
        let Ok(rd) = std::fs::read_dir(&self.cfg.token_dir) else {
            return TokenDir::Nothing;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = rd
            .filter_map(|e| e.ok())
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let md = std::fs::metadata(e.path()).ok()?;
                (md.is_file() && md.permissions().mode() & 0o004 != 0)
                    .then(|| (md.modified().unwrap_or(std::time::UNIX_EPOCH), e.path()))
            })
            .collect();
        // The newest token wins; any file that does not decode makes gridd fail.
        files.sort();
        let mut token = None;
        for (_, path) in files.iter().rev() {
            let Ok(bytes) = std::fs::read(path) else {
                continue;
            };
            match Token::decode(&bytes) {
                Ok(t) => {
                    token.get_or_insert(t);
                }
                Err(_) => return TokenDir::Undecodable,
            }
        }
        token.map_or(TokenDir::Nothing, |t| TokenDir::Token(Box::new(t)))
    }

    fn failure_line(&self, node: &DlsNode, e: &DlsError) -> String {
        match e {
            DlsError::Network => format!("Failed to acquire license from {}", node.host),
            DlsError::Skew(_) => format!(
                "Failed to acquire license from {} (Info: {} - Error: Clock windback has been detected)",
                node.host, self.edition
            ),
        }
    }

    /// One acquisition round over the token's nodes; `true` when a license is held.
    fn acquire(&mut self, token: &Token) -> bool {
        for node in &token.nodes {
            self.log.log(
                INFO,
                &format!("Acquiring license. (Info: {}; {})", node.host, self.edition),
            );
            match self.contact(node) {
                Ok(()) => {
                    let expiry = self.grant(node);
                    self.log.log(
                        INFO,
                        &format!(
                            "License acquired successfully. (Info: {}, {}; Expiry: {})",
                            node.host,
                            self.edition,
                            shared::gmt(expiry)
                        ),
                    );
                    return true;
                }
                Err(e) => self.log.log(ERR, &self.failure_line(node, &e)),
            }
        }
        false
    }

    /// Records a lease from `node` in the GPU state; returns its expiry.
    fn grant(&mut self, node: &DlsNode) -> DateTime<Utc> {
        let expiry = Utc::now() + chrono::Duration::seconds(self.cfg.lease_seconds as i64);
        let mut s = self.state();
        s.licensed = true;
        s.expiry = Some(expiry.timestamp());
        s.edition = Some(self.edition.clone());
        s.server = Some(node.host.clone());
        self.save(&s);
        self.held = Some(node.clone());
        expiry
    }

    /// Holds the license, renewing it; returns `true` when asked to stop, `false` when the
    /// lease ran out.
    fn hold(&mut self, token: &Token) -> bool {
        let lease = self.cfg.lease_seconds as f64;
        let mut renew_in = Duration::from_secs_f64((lease * self.cfg.renew_fraction).max(0.05));
        loop {
            let expiry = self.state().expiry.unwrap_or(0);
            let left = expiry - Utc::now().timestamp();
            if left <= 0 {
                let mut s = self.state();
                s.licensed = false;
                s.unlicensed_since = expiry;
                self.save(&s);
                self.held = None;
                return false;
            }
            let wait = renew_in.min(Duration::from_secs(left as u64));
            if self.wait(wait) {
                return true;
            }
            if Utc::now().timestamp() >= expiry {
                continue;
            }
            let node = self.held.clone().unwrap_or_else(|| token.nodes[0].clone());
            match self.contact(&node) {
                Ok(()) => {
                    let expiry = self.grant(&node);
                    self.log.log(
                        INFO,
                        &format!(
                            "License renewed successfully. (Info: {}, {}; Expiry: {})",
                            node.host,
                            self.edition,
                            shared::gmt(expiry)
                        ),
                    );
                    renew_in = Duration::from_secs_f64((lease * self.cfg.renew_fraction).max(0.05));
                }
                Err(e) => {
                    self.log.log(ERR, &self.failure_line(&node, &e));
                    renew_in = self.retry();
                }
            }
        }
    }

    /// One HTTPS exchange with the node's lease port: the DLS's `Date` against our clock.
    fn contact(&self, node: &DlsNode) -> Result<(), DlsError> {
        let date = https::https_date(
            &node.host,
            node.lease_port,
            Duration::from_millis(self.cfg.network_timeout_ms),
        )
        .map_err(|e| {
            if self.cfg.echo {
                eprintln!("sim-nvidia-gridd: {}:{}: {e}", node.host, node.lease_port);
            }
            DlsError::Network
        })?;
        let skew = Utc::now().timestamp() - date.timestamp();
        if skew.abs() > self.cfg.skew_tolerance_seconds {
            if self.cfg.echo {
                eprintln!("sim-nvidia-gridd: guest clock minus the DLS's: {skew} s");
            }
            return Err(DlsError::Skew(skew));
        }
        Ok(())
    }

    fn shutdown(&mut self, code: i32) -> ! {
        if self.cfg.return_on_shutdown
            && let Some(node) = self.held.take()
        {
            let mut s = self.state();
            s.licensed = false;
            s.unlicensed_since = Utc::now().timestamp();
            self.save(&s);
            self.log.log(
                INFO,
                &format!("License returned successfully. (Info: {})", node.host),
            );
        }
        self.log.log(INFO, &format!("Shutdown ({})", self.pid));
        let pid_file = self.dir.join(shared::PID_FILE);
        if std::fs::read_to_string(&pid_file).is_ok_and(|s| s.trim() == self.pid.to_string()) {
            let _ = std::fs::remove_file(&pid_file);
        }
        // Let journald read /proc/PID/comm for the last lines before the process is gone.
        std::thread::sleep(Duration::from_millis(self.cfg.exit_linger_ms));
        std::process::exit(code);
    }
}
