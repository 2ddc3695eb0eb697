//! Probing a DLS node from the network, the way gridd would reach it: DNS, TCP connect, TLS
//! handshake, then one plain `GET /` over HTTPS for the `Date` header (to measure the guest's
//! clock skew) and to prove the path works. Never the licensing protocol: that is gridd's.
//!
//! Every step has its own time limit. The TLS handshake accepts any certificate and reports
//! it: from driver 18 on gridd checks the DLS's certificate against NVIDIA's own roots, so the
//! OS trust store says nothing about what gridd will do.
//!
//! Where gridd.conf names a proxy (`ProxyServerAddress`, as guests of NVIDIA's Cloud License
//! Service behind a corporate proxy have), the probe goes through it as gridd does: an HTTP
//! `CONNECT` tunnel, then TLS to the license service inside it.
//!
//! Blocking std I/O on purpose: the service calls it from `spawn_blocking`, `diagnose` calls
//! it directly.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme};
use serde::{Deserialize, Serialize};

use crate::model::gridd_conf::Proxy;
use crate::model::report::{Finding, Reason};
use crate::model::time::rfc3339;
use crate::model::token::Token;

mod http;
mod net;
mod tls;
pub(crate) use tls::common_name;

use http::{get_head, parse_head, parse_http_date};
use net::{Tunnel, connect, resolve, tunnel};
pub use tls::cert_info;
use tls::{Recorder, flush, handshake, read_some, tls_config};

/// At most this much of the HTTP response head is read.
const MAX_HEAD: usize = 64 * 1024;

/// The steps of a probe, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepName {
    Dns,
    Tcp,
    Tls,
    Https,
}

impl StepName {
    pub const ALL: [StepName; 4] = [StepName::Dns, StepName::Tcp, StepName::Tls, StepName::Https];

    pub fn as_str(self) -> &'static str {
        match self {
            StepName::Dns => "dns",
            StepName::Tcp => "tcp",
            StepName::Tls => "tls",
            StepName::Https => "https",
        }
    }
}

impl fmt::Display for StepName {
    /// What the step does, for messages: "TCP connect".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepName::Dns => "DNS lookup",
            StepName::Tcp => "TCP connect",
            StepName::Tls => "TLS handshake",
            StepName::Https => "HTTPS request",
        })
    }
}

/// One step of a probe. `detail` says what was found when `ok`, and the cause (one line)
/// when not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub name: StepName,
    pub ok: bool,
    pub detail: String,
    pub elapsed_ms: u64,
}

/// The DLS's certificate as it presented it (the leaf), not judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CertInfo {
    pub subject: String,
    pub issuer: String,
    /// RFC 3339.
    pub not_before: String,
    /// RFC 3339.
    pub not_after: String,
    /// Certificates the server sent, the leaf included.
    pub chain_length: usize,
}

impl CertInfo {
    /// Whether `now` lies within the certificate's validity.
    pub fn valid_at(&self, now: DateTime<Utc>) -> bool {
        let parse = |s: &str| DateTime::parse_from_rfc3339(s).ok().map(|t| t.to_utc());
        match (parse(&self.not_before), parse(&self.not_after)) {
            (Some(a), Some(b)) => a <= now && now <= b,
            _ => true,
        }
    }
}

/// What probing one DLS node (host and port) found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeProbe {
    pub host: String,
    pub port: u16,
    /// The steps that ran, in order; a probe stops at the first that fails.
    pub steps: Vec<Step>,
    /// The address the TCP connection was made to.
    pub address: Option<String>,
    /// The negotiated TLS version, e.g. `TLSv1_3`.
    pub tls_version: Option<String>,
    pub certificate: Option<CertInfo>,
    /// The HTTP status of `GET /` (any status proves the path works).
    pub http_status: Option<u16>,
    /// The DLS's `Date` header, RFC 3339.
    pub dls_date: Option<String>,
    /// Guest clock minus the DLS's clock, in seconds (positive: the guest is ahead).
    pub clock_skew_seconds: Option<f64>,
    /// The proxy the probe went through (gridd.conf's, as gridd does), `host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// The probe could not go all the way for a reason that says nothing about the DLS (the
    /// proxy wants gridd's credentials, which only gridd can use): not a finding.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inconclusive: bool,
}

impl NodeProbe {
    fn new(host: &str, port: u16) -> NodeProbe {
        NodeProbe {
            host: host.to_string(),
            port,
            steps: Vec::new(),
            address: None,
            tls_version: None,
            certificate: None,
            http_status: None,
            dls_date: None,
            clock_skew_seconds: None,
            proxy: None,
            inconclusive: false,
        }
    }

    /// Whether the node answered HTTPS (every step passed).
    pub fn reachable(&self) -> bool {
        self.step(StepName::Https).is_some_and(|s| s.ok)
    }

    /// The step that failed, if one did.
    pub fn failed_step(&self) -> Option<&Step> {
        self.steps.iter().find(|s| !s.ok)
    }

    pub fn step(&self, name: StepName) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// `host:port`, with brackets around an IPv6 address.
    pub fn endpoint(&self) -> String {
        endpoint(&self.host, self.port)
    }

    /// One line: `DLS dls.example:443: TCP connect failed: connection refused`, or `None`
    /// when the node answered.
    pub fn failure_line(&self) -> Option<String> {
        let via = match &self.proxy {
            Some(p) => format!(" through proxy {p}"),
            None => String::new(),
        };
        self.failed_step().map(|s| {
            format!(
                "DLS {}{via}: {} failed: {}",
                self.endpoint(),
                s.name,
                s.detail
            )
        })
    }
}

/// `host:port` for a message or a request line. A host that is no host name (control
/// characters from a token) never gets past the DNS step, and is shown escaped.
fn endpoint(host: &str, port: u16) -> String {
    let host = crate::model::text::escape(host);
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Letters, digits, `.`, `-` and `_` (a name), or an IP address (IPv6 with its zone).
pub fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && (host.parse::<IpAddr>().is_ok()
            || host.split_once('%').is_some_and(|(ip, zone)| {
                ip.parse::<std::net::Ipv6Addr>().is_ok()
                    && zone.chars().all(|c| c.is_ascii_alphanumeric())
            })
            || host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
}

/// The host part of a token's node URL: tolerates a scheme, a path and IPv6 brackets.
fn bare_host(host: &str) -> &str {
    let h = host.trim();
    let h = h
        .strip_prefix("https://")
        .or_else(|| h.strip_prefix("http://"))
        .unwrap_or(h);
    let h = h.split('/').next().unwrap_or(h);
    h.strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h)
}

/// The (host, port) pairs worth probing for a token: each node's lease port and, where it
/// differs, its auth port; no pair twice.
pub fn targets(token: &Token) -> Vec<(String, u16)> {
    let mut out: Vec<(String, u16)> = Vec::new();
    for n in &token.nodes {
        for port in [n.lease_port, n.auth_port] {
            let t = (n.host.clone(), port);
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    out
}

/// At most this many (host, port) targets are probed: an HA DLS has two nodes (four targets
/// where the auth port differs); a token that lists thousands must not make thousands of
/// connections from every guest.
pub const MAX_PROBED: usize = 8;

/// At most this many probes run at once.
const PARALLEL: usize = 4;

/// How many of `targets` [`probe_all`] leaves out.
pub fn not_probed(targets: &[(String, u16)]) -> usize {
    targets.len().saturating_sub(MAX_PROBED)
}

/// Probes the first [`MAX_PROBED`] targets, [`PARALLEL`] at a time (HA DLS nodes in
/// parallel), results in the targets' order; through `via` when gridd.conf names a proxy.
pub fn probe_all(
    targets: &[(String, u16)],
    via: Option<&Proxy>,
    timeout: Duration,
) -> Vec<NodeProbe> {
    let targets = &targets[..targets.len().min(MAX_PROBED)];
    targets
        .chunks(PARALLEL)
        .flat_map(|chunk| probe_parallel(chunk, via, timeout))
        .collect()
}

fn probe_parallel(
    targets: &[(String, u16)],
    via: Option<&Proxy>,
    timeout: Duration,
) -> Vec<NodeProbe> {
    std::thread::scope(|s| {
        let handles: Vec<_> = targets
            .iter()
            .map(|(h, p)| s.spawn(move || probe_node_via(h, *p, via, timeout)))
            .collect();
        handles
            .into_iter()
            .zip(targets)
            .map(|(h, (host, port))| {
                h.join().unwrap_or_else(|_| {
                    let mut p = NodeProbe::new(host, *port);
                    p.steps.push(Step {
                        name: StepName::Dns,
                        ok: false,
                        detail: "the probe failed unexpectedly".into(),
                        elapsed_ms: 0,
                    });
                    p
                })
            })
            .collect()
    })
}

/// Why an I/O step stopped.
enum Stop {
    TimedOut,
    Closed,
    Io(io::Error),
    Tls(rustls::Error),
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// An I/O error as a short lower-case cause, without `(os error N)`.
fn io_text(e: &io::Error, timeout: Duration) -> String {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::TimedOut | K::WouldBlock => format!("no answer within {}", secs(timeout)),
        K::ConnectionReset => "connection reset by the server".into(),
        K::ConnectionAborted => "connection aborted".into(),
        K::UnexpectedEof => "the server closed the connection".into(),
        K::HostUnreachable => "host unreachable (no route)".into(),
        K::NetworkUnreachable => "network unreachable".into(),
        K::BrokenPipe => "the server closed the connection".into(),
        _ => {
            let t = e.to_string();
            let t = match t.find(" (os error") {
                Some(i) => t[..i].to_string(),
                None => t,
            };
            let mut c = t.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => t,
            }
        }
    }
}

impl Stop {
    fn text(&self, timeout: Duration) -> String {
        match self {
            Stop::TimedOut => format!("no answer within {}", secs(timeout)),
            Stop::Closed => "the server closed the connection".into(),
            Stop::Io(e) => io_text(e, timeout),
            Stop::Tls(e @ rustls::Error::InvalidMessage(_)) => {
                format!("{e} (is this port serving TLS?)")
            }
            Stop::Tls(e) => e.to_string(),
        }
    }
}

impl From<io::Error> for Stop {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Stop::TimedOut,
            io::ErrorKind::UnexpectedEof => Stop::Closed,
            _ => Stop::Io(e),
        }
    }
}

fn ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Probes one DLS node: DNS, TCP, TLS, HTTPS, each within `timeout`; stops at the first step
/// that fails.
pub fn probe_node(host: &str, port: u16, timeout: Duration) -> NodeProbe {
    probe_node_via(host, port, None, timeout)
}

/// [`probe_node`], through `via` when given: the DNS step then looks up the proxy, and the
/// TCP step connects to it and asks it for a tunnel to the DLS (`CONNECT`), as gridd does with
/// gridd.conf's `ProxyServerAddress`; TLS and HTTPS then go through the tunnel.
pub fn probe_node_via(host: &str, port: u16, via: Option<&Proxy>, timeout: Duration) -> NodeProbe {
    let host = bare_host(host);
    let mut p = NodeProbe::new(host, port);
    p.proxy = via.map(Proxy::to_string);
    // A name from a token (or gridd.conf) goes into request lines: one that is no host name
    // (a line break, a space) fails here, before anything is sent.
    let t = Instant::now();
    if let Err(why) = host_names(host, via) {
        p.push(StepName::Dns, t, Err(why));
        return p;
    }
    let t = Instant::now();
    let (dns, addrs) = dns_step(host, port, via, timeout);
    if !p.push(StepName::Dns, t, dns) {
        return p;
    }
    let t = Instant::now();
    let Some(mut sock) = tcp_step(&mut p, &addrs, host, port, via, timeout, t) else {
        return p;
    };
    let t = Instant::now();
    let Some(mut conn) = tls_step(&mut p, &mut sock, host, timeout, t) else {
        return p;
    };
    let t = Instant::now();
    let https = https_step(&mut p, &mut conn, &mut sock, host, port, timeout, t);
    p.push(StepName::Https, t, https);
    conn.send_close_notify();
    let _ = flush(&mut conn, &mut sock);
    p
}

impl NodeProbe {
    /// Records a step that began at `started`; whether it passed.
    fn push(&mut self, name: StepName, started: Instant, r: Result<String, String>) -> bool {
        let ok = r.is_ok();
        self.steps.push(Step {
            name,
            ok,
            detail: r.unwrap_or_else(|e| e),
            elapsed_ms: ms(started),
        });
        ok
    }
}

/// The DLS's and the proxy's names, checked to be host names or IP addresses.
fn host_names(host: &str, via: Option<&Proxy>) -> Result<(), String> {
    for name in std::iter::once(host).chain(via.map(|v| v.host.as_str())) {
        if !is_host_name(name) {
            return Err(format!(
                "{} is not a host name or an IP address",
                crate::model::text::escape(name)
            ));
        }
    }
    Ok(())
}

/// DNS (of the proxy, when there is one: the proxy resolves the DLS's name): the step's
/// outcome and the addresses found.
fn dns_step(
    host: &str,
    port: u16,
    via: Option<&Proxy>,
    timeout: Duration,
) -> (Result<String, String>, Vec<SocketAddr>) {
    let (first, first_port, whose) = match via {
        Some(v) => (v.host.as_str(), v.port, "proxy "),
        None => (host, port, ""),
    };
    let addrs = resolve(first, first_port, timeout);
    let dns = match &addrs {
        Ok(a) if first.parse::<IpAddr>().is_ok() => {
            Ok(format!("{whose}{} is an IP address", a[0].ip()))
        }
        Ok(a) => {
            let mut ips: Vec<String> = a.iter().map(|s| s.ip().to_string()).collect();
            ips.dedup();
            Ok(format!("{whose}{first} resolves to {}", ips.join(", ")))
        }
        Err(e) if via.is_some() => Err(format!("{whose}{first}: {e}")),
        Err(e) => Err(e.clone()),
    };
    (dns, addrs.unwrap_or_default())
}

/// TCP to the DLS (or to the proxy, and a tunnel through it): the connection, or `None`
/// when the step failed (recorded in `p`).
fn tcp_step(
    p: &mut NodeProbe,
    addrs: &[SocketAddr],
    host: &str,
    port: u16,
    via: Option<&Proxy>,
    timeout: Duration,
    t: Instant,
) -> Option<TcpStream> {
    let mut sock = match connect(addrs, timeout) {
        Ok(s) => s,
        Err(e) => {
            p.push(StepName::Tcp, t, Err(e));
            return None;
        }
    };
    let peer = sock.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    p.address = Some(peer.clone());
    let _ = sock.set_nodelay(true);
    let tcp = match via {
        None => Ok(format!("connected to {peer}")),
        Some(v) => match tunnel(&mut sock, host, port, t + timeout) {
            Ok(status) => Ok(format!(
                "connected to proxy {v} ({peer}), which opened a tunnel to {} ({status})",
                endpoint(host, port)
            )),
            Err(Tunnel::Refused(code, status)) if code == 407 && v.user.is_some() => {
                p.inconclusive = true;
                Err(format!(
                    "proxy {v} asks for credentials ({status}); gridd has them (ProxyUserName, ProxyCredentialsFilePath) but they are encrypted for gridd alone, so this check cannot go further"
                ))
            }
            Err(Tunnel::Refused(407, status)) => Err(format!(
                "proxy {v} asks for credentials ({status}) and gridd.conf gives none: set ProxyUserName and ProxyCredentialsFilePath"
            )),
            Err(Tunnel::Refused(_, status)) => Err(format!(
                "proxy {v} refused a tunnel to {} ({status})",
                endpoint(host, port)
            )),
            Err(Tunnel::Broken(e)) => Err(format!("proxy {v}: {e}")),
        },
    };
    p.push(StepName::Tcp, t, tcp).then_some(sock)
}

/// The TLS handshake, the certificate and version recorded in `p`: the connection, or
/// `None` when the step failed.
fn tls_step(
    p: &mut NodeProbe,
    sock: &mut TcpStream,
    host: &str,
    timeout: Duration,
    t: Instant,
) -> Option<ClientConnection> {
    let deadline = t + timeout;
    let provider = rustls::crypto::ring::default_provider();
    let recorder = Arc::new(Recorder {
        schemes: provider
            .signature_verification_algorithms
            .supported_schemes(),
        chain: Mutex::new(Vec::new()),
    });
    let mut conn = match tls_connection(host, recorder.clone()) {
        Ok(c) => c,
        Err(e) => {
            p.push(StepName::Tls, t, Err(e));
            return None;
        }
    };
    let _ = sock.set_write_timeout(Some(timeout));
    let shaken = handshake(&mut conn, sock, deadline);
    let chain = recorder.chain.lock().map(|c| c.clone()).unwrap_or_default();
    let cert = (!chain.is_empty()).then(|| cert_info(&chain));
    if let Some(Ok(c)) = &cert {
        p.certificate = Some(c.clone());
    }
    match shaken {
        Err(e) => {
            p.push(StepName::Tls, t, Err(e.text(timeout)));
            None
        }
        Ok(()) => {
            let agreed = agreed(p, &conn, cert);
            p.push(StepName::Tls, t, Ok(agreed));
            Some(conn)
        }
    }
}

/// A client connection to `host`, its certificates shown to `recorder`.
fn tls_connection(host: &str, recorder: Arc<Recorder>) -> Result<ClientConnection, String> {
    let cfg = tls_config(recorder).map_err(|e| e.to_string())?;
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| format!("{host:?} is not a valid server name"))?;
    ClientConnection::new(cfg, name).map_err(|e| e.to_string())
}

/// What a handshake agreed: the protocol version (kept in the probe), the cipher suite, the
/// certificate.
fn agreed(
    p: &mut NodeProbe,
    conn: &ClientConnection,
    cert: Option<Result<CertInfo, String>>,
) -> String {
    let version = conn
        .protocol_version()
        .map(|v| format!("{v:?}"))
        .unwrap_or_else(|| "TLS".into());
    p.tls_version = Some(version.clone());
    let cipher = conn
        .negotiated_cipher_suite()
        .map(|s| format!(" {:?}", s.suite()))
        .unwrap_or_default();
    let about = match cert {
        Some(Ok(c)) => format!(
            "certificate {} issued by {}, valid {} to {}",
            c.subject, c.issuer, c.not_before, c.not_after
        ),
        Some(Err(e)) => e,
        None => "no certificate".into(),
    };
    format!("{version}{cipher}, {about}")
}

/// The HTTPS request, and the DLS's clock from its Date header (recorded in `p`).
fn https_step(
    p: &mut NodeProbe,
    conn: &mut ClientConnection,
    sock: &mut TcpStream,
    host: &str,
    port: u16,
    timeout: Duration,
    t: Instant,
) -> Result<String, String> {
    let deadline = t + timeout;
    let sent_utc = Utc::now();
    let head = get_head(conn, sock, host, port, deadline);
    let rtt = t.elapsed();
    let head = match head {
        Err(Stop::Closed) => {
            return Err("the server closed the connection without answering".into());
        }
        Err(e) => return Err(e.text(timeout)),
        Ok(head) => head,
    };
    let (code, reason, date) = parse_head(&head)?;
    p.http_status = Some(code);
    let status = format!("HTTP {code} {reason}").trim_end().to_string();
    match date.as_deref().map(|d| (d, parse_http_date(d))) {
        // A gateway's own answer (a reverse proxy or load balancer in front of the
        // DLS that cannot reach it): the path ends there, and its Date is its own.
        _ if matches!(code, 502..=504) => Err(format!(
            "{status}: a proxy or load balancer in front of the DLS answered, not the DLS (it cannot reach the DLS behind it)"
        )),
        None => Ok(format!(
            "{status}, no Date header: the clock cannot be compared"
        )),
        Some((d, None)) => Ok(format!(
            "{status}, Date {d:?} does not parse: the clock cannot be compared"
        )),
        Some((_, Some(dls))) => {
            p.dls_date = Some(rfc3339(dls));
            p.clock_skew_seconds = Some(skew(sent_utc, rtt, dls));
            Ok(format!(
                "{status}, Date {} (round trip {} ms)",
                rfc3339(dls),
                rtt.as_millis()
            ))
        }
    }
}

/// The guest's clock at the middle of the round trip against the DLS's, whose Date is
/// truncated to the second (so half a second later on average): seconds, to the millisecond.
fn skew(sent_utc: DateTime<Utc>, rtt: Duration, dls: DateTime<Utc>) -> f64 {
    let half = chrono::Duration::from_std(rtt / 2).unwrap_or_default();
    let guest = sent_utc + half;
    let skew = (guest - dls).as_seconds_f64() - 0.5;
    (skew * 1000.0).round() / 1000.0
}

/// The measured clock skew worth reporting: the largest in size among the nodes that gave
/// one (signed, guest minus DLS).
pub fn clock_skew(probes: &[NodeProbe]) -> Option<f64> {
    probes
        .iter()
        .filter_map(|p| p.clock_skew_seconds)
        .max_by(|a, b| a.abs().total_cmp(&b.abs()))
}

/// `312 s ahead of` / `4.2 s behind`.
pub fn skew_words(skew: f64) -> String {
    let size = skew.abs();
    let n = if size >= 10.0 {
        format!("{size:.0}")
    } else {
        format!("{size:.1}")
    };
    format!("{n} s {}", if skew >= 0.0 { "ahead of" } else { "behind" })
}

/// The failure the probes show, for the report's `failure`: `dls_unreachable` (with the
/// failing step of every node) when no node answered HTTPS, else `clock_skew` when the guest
/// clock is off a DLS node's by more than `clock_skew_max`; `None` when all is well (or there
/// was nothing to probe).
pub fn verdict(probes: &[NodeProbe], clock_skew_max: Duration) -> Option<Finding> {
    if probes.is_empty() {
        return None;
    }
    if !probes.iter().any(NodeProbe::reachable) {
        if probes.iter().any(|p| p.inconclusive) {
            // One that could not be checked may well be reachable, for gridd.
            return None;
        }
        let lines: Vec<String> = probes.iter().filter_map(NodeProbe::failure_line).collect();
        return Some((Reason::DlsUnreachable, lines.join("; ")));
    }
    let max = clock_skew_max.as_secs_f64();
    let worst = probes
        .iter()
        .filter_map(|p| p.clock_skew_seconds.map(|s| (p, s)))
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))?;
    (worst.1.abs() > max).then(|| {
        (
            Reason::ClockSkew,
            format!(
                "guest clock is {} DLS {} (more than the {} allowed)",
                skew_words(worst.1),
                worst.0.host,
                secs(clock_skew_max)
            ),
        )
    })
}

#[cfg(test)]
mod tests;
