//! The simulated `nvidia-gridd`: a long-lived process named `nvidia-gridd` that logs the real
//! daemon's message texts to journald (syslog socket) and reacts to the token directory and
//! to the DLS named in the token as the real one does. Every line it logs is one of
//! `gridd_lines.rs`, each with its source (a sample, or why no sample shows it).
//!
//! - no readable token: `Unable to fetch the client configuration token file`, keeps running
//!   and looks again every `retry_seconds` (when `pickup_new_token`);
//! - a file in the token directory that is not a token signed by the DLS (a broken or edited
//!   token, a stray gridd.conf), judged by the simulator's own reading of the format and a
//!   real RS256 check (`jws.rs`): the decode failure lines, `Failed to setup cloud License
//!   Manager: 3`, `Shutdown (PID)`, exit 1;
//! - a token: the licensing client's walk over HTTPS to the token's DLS node (`POST
//!   /auth/v1/origin`, `/auth/v1/code`, `/auth/v1/token` on its auth port, `POST
//!   /leasing/v1/lessor` on its lease port), each answer required to be a 2xx: the first
//!   answer's `Date` against the guest clock (skew: clock windback), no answer (a network
//!   failure: the full or the bare failure line, `network_failure`), an HTTP error status (a
//!   proxy's 502, say); else a lease of `lease_seconds`, renewed (`PUT
//!   /leasing/v1/lease/<ref>`) after `renew_fraction` of it;
//! - gridd.conf's `ProxyServerAddress` and `ProxyServerPort` (read at start): every request
//!   goes through that HTTP proxy (`CONNECT host:port`, then TLS inside the tunnel); a proxy
//!   that refuses is a network failure. Without them gridd connects to the token's host
//!   itself; the simulated machine uses no DNS (`https::resolve`), so a token naming
//!   NVIDIA's Cloud License Service is a network failure there, never a real connection;
//! - a driver of the 470 branch or older: the legacy licensing path. No token, no NLS:
//!   gridd.conf's `ServerAddress` and `ServerPort` (default 7070) name the license server,
//!   which is only a TCP listener here (a connection is a license, without an expiry); when it
//!   does not answer, the legacy failure line, and another try every `retry_seconds`;
//! - a passthrough GPU: `Licensing not supported for GPUs in the system`;
//! - a GPU the platform licenses (`platform_licensed`): never leases;
//! - SIGTERM: returns the license (`DELETE /leasing/v1/lease/<ref>`), `Shutdown (PID)`,
//!   exit 0.
//!
//! The license goes to `state.json` in the sim dir, which the simulated nvidia-smi reads.
//!
//!     sim-nvidia-gridd [--sim-dir DIR]

#[path = "https.rs"]
mod https;
#[path = "jws.rs"]
mod jws;
#[path = "gridd_lines.rs"]
mod lines;
#[path = "shared.rs"]
mod shared;

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use chrono::{DateTime, Utc};
use jws::Node as DlsNode;
use lines::Line;
use nix::sys::signal::{SigSet, Signal};
use shared::{ERR, GpuState, INFO, NetworkFailure, SimConfig, Syslog, WARNING};

struct Gridd {
    dir: PathBuf,
    cfg: SimConfig,
    log: Syslog,
    pid: u32,
    stop: Receiver<()>,
    /// A stop [`Gridd::stopping`] took from `stop`, not yet acted on.
    stop_seen: std::cell::Cell<bool>,
    edition: String,
    /// The node that granted the license held, and the lease's ref.
    held: Option<(DlsNode, String)>,
    /// A license from the legacy server is held.
    legacy_held: bool,
    /// gridd.conf's proxy (host, port), as read at start.
    proxy: Option<(String, u16)>,
}

/// What the token directory holds, as gridd sees it.
enum TokenDir {
    /// Nothing gridd can read.
    Nothing,
    /// A file that is not a token signed by the DLS (gridd fails to decode it and exits).
    Undecodable,
    Token(Vec<DlsNode>),
}

/// Why talking to the DLS failed.
enum DlsError {
    /// No TCP connection, no TLS, no HTTP answer.
    Network,
    /// The DLS's clock is this many seconds from ours.
    #[allow(dead_code)]
    Skew(i64),
    /// An answer that is not a 2xx (a proxy's 502, say).
    #[allow(dead_code)]
    Http(u16),
    /// Asked to stop in the middle: nothing to log.
    Stopping,
}

/// The lease ref in `POST /leasing/v1/lessor`'s answer.
fn lease_ref(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v["lease_result_list"][0]["lease"]["ref"]
        .as_str()
        .map(String::from)
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
        stop_seen: std::cell::Cell::new(false),
        edition,
        held: None,
        legacy_held: false,
        proxy: None,
    };
    let code = g.run();
    g.shutdown(code);
}

impl Gridd {
    /// Waits, or returns `true` as soon as the daemon is asked to stop.
    fn wait(&self, d: Duration) -> bool {
        self.stop_seen.get() || !matches!(self.stop.recv_timeout(d), Err(RecvTimeoutError::Timeout))
    }

    /// Whether a stop is pending, without taking it from the next [`Gridd::wait`].
    fn stopping(&self) -> bool {
        if !self.stop_seen.get() && self.stop.try_recv().is_ok() {
            self.stop_seen.set(true);
        }
        self.stop_seen.get()
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

    /// Logs one of gridd's lines (the only way it logs).
    fn say(&self, severity: u8, line: &Line, args: &[&str]) {
        self.log.log(severity, &line.format(args));
    }

    fn save(&self, s: &GpuState) {
        if let Err(e) = s.save(&self.dir) {
            eprintln!("sim-nvidia-gridd: cannot write the GPU state: {e}");
        }
    }

    /// The main loop; returns the exit code.
    fn run(&mut self) -> i32 {
        let pid = self.pid.to_string();
        // The pid file is what sim-systemctl answers by: written before the first line, as
        // systemd has the unit active before its process logs anything.
        let _ = shared::write_atomic(
            &self.dir.join(shared::PID_FILE),
            format!("{}\n", self.pid).as_bytes(),
        );
        self.say(INFO, &lines::STARTED, &[&pid]);
        if !self.dir.join(shared::STATE_FILE).exists() {
            self.save(&self.state());
        }
        if (1..=470).contains(&self.cfg.driver_major()) {
            return self.run_legacy();
        }
        self.read_gridd_conf();
        self.proxy = self.proxy_keys();
        if self.cfg.passthrough {
            self.say(ERR, &lines::LICENSING_UNSUPPORTED, &[]);
            while !self.wait(Duration::from_secs(3600)) {}
            return 0;
        }
        if self.cfg.platform_licensed {
            // What gridd logs where the platform licenses the GPU, no sample shows: nothing
            // more here; nvidia-smi says `Licensed (Expiry: N/A)`.
            while !self.wait(Duration::from_secs(3600)) {}
            return 0;
        }
        if self.cfg.driver_major() < 550 {
            self.say(INFO, &lines::PACKAGE_0, &[]);
        }
        self.say(INFO, &lines::IGNORE_SERVICE_PROVIDER, &[]);
        self.say(INFO, &lines::NLS_INITIALIZED, &[]);

        loop {
            let nodes = match self.read_token_dir() {
                TokenDir::Undecodable => {
                    self.say(ERR, &lines::DECODE_SIGNATURE, &[]);
                    self.say(
                        ERR,
                        &lines::READ_TOKEN_CONFIG,
                        &[lines::TOKEN_CONFIG_ERROR_TEXT],
                    );
                    self.say(ERR, &lines::SETUP_LICENSE_MANAGER, &[]);
                    return 1;
                }
                TokenDir::Nothing => {
                    loop {
                        self.say(ERR, &lines::TOKEN_MISSING, &[]);
                        if self.wait(self.retry()) {
                            return 0;
                        }
                        if self.cfg.pickup_new_token {
                            break;
                        }
                    }
                    continue;
                }
                TokenDir::Token(nodes) => nodes,
            };
            if self.acquire(&nodes) {
                if self.hold(&nodes) {
                    return 0;
                }
                // The lease ran out: no license any more.
                self.say(WARNING, &lines::NOT_FOUND_NOTICE, &[]);
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

    /// gridd.conf's value of `key` (quotes taken off), where set and not empty.
    fn conf_value(&self, key: &str) -> Option<String> {
        let text = std::fs::read_to_string(&self.cfg.gridd_conf).ok()?;
        text.lines().rev().find_map(|l| {
            let l = l.trim();
            let (k, v) = l.split_once('=').filter(|_| !l.starts_with('#'))?;
            let v = v.trim().trim_matches('"').trim();
            (k.trim() == key && !v.is_empty()).then(|| v.to_string())
        })
    }

    /// The proxy gridd.conf names: `ProxyServerAddress` and `ProxyServerPort`.
    fn proxy_keys(&self) -> Option<(String, u16)> {
        let host = self.conf_value("ProxyServerAddress")?;
        let port = self.conf_value("ProxyServerPort")?.parse().ok()?;
        Some((host, port))
    }

    /// The legacy licensing path: `Started`, the service provider line, then the license
    /// server of gridd.conf (`ServerAddress`, `ServerPort`, 7070 by default) until it answers;
    /// the license has no expiry and is held until gridd stops. Returns the exit code.
    fn run_legacy(&mut self) -> i32 {
        self.say(INFO, &lines::LEGACY_SERVICE_PROVIDER_DETECTION, &[]);
        let port = self
            .conf_value("ServerPort")
            .and_then(|p| p.parse().ok())
            .unwrap_or(7070u16);
        let Some(host) = self.conf_value("ServerAddress") else {
            // What a legacy gridd logs without a server is not known: nothing.
            while !self.wait(Duration::from_secs(3600)) {}
            return 0;
        };
        loop {
            let reached = https::resolve(&host, port).and_then(|a| {
                std::net::TcpStream::connect_timeout(&a, self.timeout()).map_err(|e| e.to_string())
            });
            match reached {
                Ok(_) => {
                    let mut s = self.state();
                    s.licensed = true;
                    s.expiry = None;
                    s.edition = Some(self.edition.clone());
                    s.server = Some(host.clone());
                    self.save(&s);
                    self.legacy_held = true;
                    let url = if host.contains(':') {
                        format!("http://[{host}]:{port}/request")
                    } else {
                        format!("http://{host}:{port}/request")
                    };
                    self.say(INFO, &lines::LEGACY_ACQUIRED, &[&url]);
                    self.say(INFO, &lines::LEGACY_LICENSED_FOR, &[]);
                    while !self.wait(Duration::from_secs(3600)) {}
                    return 0;
                }
                Err(e) => {
                    if self.cfg.echo {
                        eprintln!("sim-nvidia-gridd: legacy server {host}:{port}: {e}");
                    }
                    self.say(ERR, &lines::LEGACY_ACQUIRE_FAILED, &[]);
                }
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
                // The path the real daemon opens, wherever the simulated machine keeps the
                // file it stands for.
                for _ in 0..6 {
                    self.say(ERR, &lines::NO_GRIDD_CONF, &["/etc/nvidia/gridd.conf"]);
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
                    self.say(INFO, &lines::SERVER_ADDRESS_NOT_SET, &[]);
                }
            }
        }
    }

    /// Reads the token directory: every regular file but dot files (an installer's temporary
    /// files). A file gridd's user cannot read is as good as none: domain.md has the token
    /// 0744 because gridd need not run as the file's owner, so a file without the read bit
    /// for others (0600) is one gridd may not read.
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
            match jws::verify(&bytes) {
                Ok(t) => {
                    token.get_or_insert(t.nodes);
                }
                Err(why) => {
                    if self.cfg.echo {
                        eprintln!("sim-nvidia-gridd: {}: {why:?}", path.display());
                    }
                    return TokenDir::Undecodable;
                }
            }
        }
        token.map_or(TokenDir::Nothing, TokenDir::Token)
    }

    fn failure_line(&self, node: &DlsNode, e: &DlsError) -> String {
        let full = |error: &str| lines::ACQUIRE_FAILED.format(&[&node.host, &self.edition, error]);
        match e {
            DlsError::Network => match self.cfg.network_failure {
                NetworkFailure::Full => full(lines::ERROR_NETWORK),
                NetworkFailure::Bare => lines::ACQUIRE_FAILED_BARE.format(&[&node.host]),
            },
            DlsError::Skew(_) => full(lines::ERROR_WINDBACK),
            DlsError::Http(_) => full(lines::ERROR_HTTP),
            DlsError::Stopping => String::new(),
        }
    }

    /// One acquisition round over the token's nodes; `true` when a license is held.
    fn acquire(&mut self, nodes: &[DlsNode]) -> bool {
        for node in nodes {
            self.say(INFO, &lines::ACQUIRING, &[&node.host, &self.edition]);
            match self.lease(node) {
                Ok(r) => {
                    let expiry = self.grant(node, r);
                    self.say(
                        INFO,
                        &lines::ACQUIRED,
                        &[&node.host, &self.edition, &shared::gmt(expiry)],
                    );
                    return true;
                }
                Err(DlsError::Stopping) => return false,
                Err(e) => self.log.log(ERR, &self.failure_line(node, &e)),
            }
        }
        false
    }

    /// Records a lease from `node` in the GPU state; returns its expiry.
    fn grant(&mut self, node: &DlsNode, lease: String) -> DateTime<Utc> {
        let expiry = Utc::now() + chrono::Duration::seconds(self.cfg.lease_seconds as i64);
        let mut s = self.state();
        s.licensed = true;
        s.expiry = Some(expiry.timestamp());
        s.edition = Some(self.edition.clone());
        s.server = Some(node.host.clone());
        self.save(&s);
        self.held = Some((node.clone(), lease));
        expiry
    }

    /// Holds the license, renewing it; returns `true` when asked to stop, `false` when the
    /// lease ran out.
    fn hold(&mut self, nodes: &[DlsNode]) -> bool {
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
            let (node, r) = self
                .held
                .clone()
                .unwrap_or_else(|| (nodes[0].clone(), String::new()));
            let path = format!("/leasing/v1/lease/{r}");
            match self.call(&node, node.lease_port, "PUT", &path, "{}") {
                Ok(_) => {
                    let expiry = self.grant(&node, r);
                    self.say(
                        INFO,
                        &lines::RENEWED,
                        &[&node.host, &self.edition, &shared::gmt(expiry)],
                    );
                    renew_in = Duration::from_secs_f64((lease * self.cfg.renew_fraction).max(0.05));
                }
                Err(DlsError::Stopping) => return true,
                Err(e) => {
                    self.log.log(ERR, &self.failure_line(&node, &e));
                    renew_in = self.retry();
                }
            }
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.network_timeout_ms)
    }

    /// One request to `node`: a 2xx whose `Date` is within the skew tolerance of our clock,
    /// or why not. Returns the answer's body.
    fn call(
        &self,
        node: &DlsNode,
        port: u16,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<Vec<u8>, DlsError> {
        // Asked to stop meanwhile: no more requests.
        if self.stopping() {
            return Err(DlsError::Stopping);
        }
        let via = self.proxy.as_ref().map(|(h, p)| (h.as_str(), *p));
        let answer = https::request_via(via, &node.host, port, method, path, body, self.timeout())
            .map_err(|e| {
                if self.cfg.echo {
                    eprintln!("sim-nvidia-gridd: {}:{port}: {e}", node.host);
                }
                DlsError::Network
            })?;
        if !answer.success() {
            if self.cfg.echo {
                eprintln!("sim-nvidia-gridd: {method} {path}: HTTP {}", answer.status);
            }
            return Err(DlsError::Http(answer.status));
        }
        if let Some(date) = answer.date {
            let skew = Utc::now().timestamp() - date.timestamp();
            if skew.abs() > self.cfg.skew_tolerance_seconds {
                if self.cfg.echo {
                    eprintln!("sim-nvidia-gridd: guest clock minus the DLS's: {skew} s");
                }
                return Err(DlsError::Skew(skew));
            }
        }
        Ok(answer.body)
    }

    /// The licensing client's walk (the paths of
    /// `samples/dls-server-log-fastapi-dls-linux-client.txt`): register, authorize, then
    /// lease. Returns the lease's ref.
    fn lease(&self, node: &DlsNode) -> Result<String, DlsError> {
        let origin = r#"{"candidate_origin_ref":"00000000-0000-0000-0000-00000000a001","environment":{"hostname":"sim","guest_driver_version":"sim"}}"#;
        self.call(node, node.auth_port, "POST", "/auth/v1/origin", origin)?;
        self.call(
            node,
            node.auth_port,
            "POST",
            "/auth/v1/code",
            r#"{"code_challenge":"sim","origin_ref":"00000000-0000-0000-0000-00000000a001"}"#,
        )?;
        self.call(
            node,
            node.auth_port,
            "POST",
            "/auth/v1/token",
            r#"{"auth_code":"simulated","code_verifier":"sim"}"#,
        )?;
        let body = self.call(
            node,
            node.lease_port,
            "POST",
            "/leasing/v1/lessor",
            r#"{"scope_ref_list":["20000000-0000-0000-0000-000000000001"]}"#,
        )?;
        lease_ref(&body).ok_or(DlsError::Http(200))
    }

    fn shutdown(&mut self, code: i32) -> ! {
        if self.legacy_held && self.cfg.return_on_shutdown {
            // The legacy server's license goes with gridd (no line: no sample shows one).
            let mut s = self.state();
            s.licensed = false;
            s.unlicensed_since = Utc::now().timestamp();
            self.save(&s);
        }
        if self.cfg.return_on_shutdown
            && let Some((node, r)) = self.held.take()
        {
            let mut s = self.state();
            s.licensed = false;
            s.unlicensed_since = Utc::now().timestamp();
            self.save(&s);
            // Briefly: a stop must not wait for a DLS that does not answer.
            let returned = https::request_via(
                self.proxy.as_ref().map(|(h, p)| (h.as_str(), *p)),
                &node.host,
                node.lease_port,
                "DELETE",
                &format!("/leasing/v1/lease/{r}"),
                "",
                self.timeout().min(Duration::from_secs(1)),
            );
            if returned.is_ok_and(|a| a.success()) {
                self.say(INFO, &lines::RETURNED, &[&node.host]);
            } else {
                self.say(ERR, &lines::RETURN_FAILED, &[&node.host]);
            }
        }
        let pid = self.pid.to_string();
        self.say(INFO, &lines::SHUTDOWN, &[&pid]);
        let pid_file = self.dir.join(shared::PID_FILE);
        if std::fs::read_to_string(&pid_file).is_ok_and(|s| s.trim() == self.pid.to_string()) {
            let _ = std::fs::remove_file(&pid_file);
        }
        // Let journald read /proc/PID/comm for the last lines before the process is gone.
        std::thread::sleep(Duration::from_millis(self.cfg.exit_linger_ms));
        std::process::exit(code);
    }
}
