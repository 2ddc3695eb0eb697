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

use crate::gridd_conf::Proxy;
use crate::report::{Finding, Reason};
use crate::time::rfc3339;
use crate::token::Token;

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

fn endpoint(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
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

/// Accepts any certificate, keeping the chain the server sent. Handshake signatures are not
/// checked either: a key type this build cannot check must not read as "DLS unreachable"
/// when gridd, with its own library, gets through. Nothing secret is ever sent.
#[derive(Debug)]
struct Recorder {
    schemes: Vec<SignatureScheme>,
    chain: Mutex<Vec<CertificateDer<'static>>>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Ok(mut chain) = self.chain.lock() {
            *chain = std::iter::once(end_entity)
                .chain(intermediates)
                .map(|c| c.clone().into_owned())
                .collect();
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}

/// A distinguished name as RFC 4514 writes it (`CN=dls.example,O=Example,C=US`), with the
/// common attribute names and dotted OIDs for the others. Written here rather than with
/// x509-cert's `Display`, which links a database of every OID known (a quarter of a MiB).
fn name_text(name: &x509_cert::name::Name) -> String {
    use x509_cert::der::Tag;
    let mut rdns = Vec::new();
    for rdn in name.iter_rdn() {
        let atvs: Vec<String> = rdn
            .iter()
            .map(|atv| {
                let oid = atv.oid.to_string();
                let key = match oid.as_str() {
                    "2.5.4.3" => "CN",
                    "2.5.4.5" => "serialNumber",
                    "2.5.4.6" => "C",
                    "2.5.4.7" => "L",
                    "2.5.4.8" => "ST",
                    "2.5.4.10" => "O",
                    "2.5.4.11" => "OU",
                    "1.2.840.113549.1.9.1" => "emailAddress",
                    "0.9.2342.19200300.100.1.25" => "DC",
                    _ => oid.as_str(),
                };
                let bytes = atv.value.value();
                let value = match x509_cert::der::Tagged::tag(&atv.value) {
                    Tag::BmpString => {
                        let units: Vec<u16> = bytes
                            .chunks_exact(2)
                            .map(|c| u16::from_be_bytes([c[0], c[1]]))
                            .collect();
                        String::from_utf16_lossy(&units)
                    }
                    Tag::Utf8String
                    | Tag::PrintableString
                    | Tag::Ia5String
                    | Tag::TeletexString
                    | Tag::VisibleString => String::from_utf8_lossy(bytes).into_owned(),
                    _ => bytes.iter().fold("#".to_string(), |mut h, b| {
                        use fmt::Write as _;
                        let _ = write!(h, "{b:02x}");
                        h
                    }),
                };
                let mut escaped = String::with_capacity(value.len());
                for c in value.chars() {
                    match c {
                        ',' | '+' | '"' | '\\' | '<' | '>' | ';' => {
                            escaped.push('\\');
                            escaped.push(c);
                        }
                        c if c.is_control() => escaped.push('?'),
                        c => escaped.push(c),
                    }
                }
                format!("{key}={escaped}")
            })
            .collect();
        rdns.push(atvs.join("+"));
    }
    rdns.reverse();
    rdns.join(",")
}

/// The leaf certificate's names and validity. `Err` with a one-line reason when it does not
/// parse.
pub fn cert_info(chain: &[CertificateDer<'_>]) -> Result<CertInfo, String> {
    use x509_cert::certificate::{CertificateInner, Raw};
    use x509_cert::der::Decode;
    let leaf = chain.first().ok_or("the server sent no certificate")?;
    let cert = CertificateInner::<Raw>::from_der(leaf.as_ref())
        .map_err(|e| format!("its certificate does not parse: {e}"))?;
    let tbs = cert.tbs_certificate();
    let time = |t: x509_cert::time::Time| {
        let secs = i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX);
        DateTime::from_timestamp(secs, 0)
            .map(rfc3339)
            .unwrap_or_else(|| format!("{secs} s after 1970"))
    };
    Ok(CertInfo {
        subject: name_text(tbs.subject()),
        issuer: name_text(tbs.issuer()),
        not_before: time(tbs.validity().not_before),
        not_after: time(tbs.validity().not_after),
        chain_length: chain.len(),
    })
}

/// Reads one batch of TLS records, within the deadline. `Ok(0)` at the end of the stream.
fn read_some(
    conn: &mut ClientConnection,
    sock: &mut TcpStream,
    deadline: Instant,
) -> Result<usize, Stop> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Stop::TimedOut);
    }
    sock.set_read_timeout(Some(left))?;
    let n = conn.read_tls(sock)?;
    if let Err(e) = conn.process_new_packets() {
        // Tell the server why (an alert), as a TLS client should.
        let _ = conn.write_tls(sock);
        return Err(Stop::Tls(e));
    }
    Ok(n)
}

fn flush(conn: &mut ClientConnection, sock: &mut TcpStream) -> Result<(), Stop> {
    while conn.wants_write() {
        conn.write_tls(sock)?;
    }
    Ok(())
}

fn handshake(
    conn: &mut ClientConnection,
    sock: &mut TcpStream,
    deadline: Instant,
) -> Result<(), Stop> {
    loop {
        flush(conn, sock)?;
        if !conn.is_handshaking() {
            return Ok(());
        }
        if read_some(conn, sock, deadline)? == 0 {
            return Err(Stop::Closed);
        }
    }
}

/// Sends `GET /` and reads the response head (status line and headers).
fn get_head(
    conn: &mut ClientConnection,
    sock: &mut TcpStream,
    host: &str,
    port: u16,
    deadline: Instant,
) -> Result<Vec<u8>, Stop> {
    let host_header = if port == 443 {
        endpoint(host, port)
            .rsplit_once(':')
            .map(|(h, _)| h.to_string())
            .unwrap_or_default()
    } else {
        endpoint(host, port)
    };
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: vgpu-license-agent/{}\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    );
    conn.writer().write_all(request.as_bytes())?;
    flush(conn, sock)?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let mut eof = false;
        loop {
            match conn.reader().read(&mut buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => head.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // Closed without close_notify: what was read still counts.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    eof = true;
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if find(&head, b"\r\n\r\n").is_some() || head.len() >= MAX_HEAD {
            return Ok(head);
        }
        if eof {
            return if head.is_empty() {
                Err(Stop::Closed)
            } else {
                Ok(head)
            };
        }
        // At the end of the stream the reader says so above, on the next round.
        read_some(conn, sock, deadline)?;
        flush(conn, sock)?;
    }
}

/// Why a proxy gave no tunnel.
enum Tunnel {
    /// It answered with this status (code, `HTTP 403 Forbidden`).
    Refused(u16, String),
    /// It did not answer HTTP.
    Broken(String),
}

/// Asks the proxy on `sock` for a tunnel to `host:port` (HTTP `CONNECT`), by `deadline`.
/// Reads the proxy's head byte by byte, so nothing after it (the DLS's own bytes) is taken.
fn tunnel(
    sock: &mut TcpStream,
    host: &str,
    port: u16,
    deadline: Instant,
) -> Result<String, Tunnel> {
    let target = endpoint(host, port);
    let request = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nUser-Agent: vgpu-license-agent/{}\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    );
    let left = || deadline.saturating_duration_since(Instant::now());
    let timeout = left();
    let broken = |e: io::Error| Tunnel::Broken(io_text(&e, timeout));
    sock.set_write_timeout(Some(left().max(Duration::from_millis(1))))
        .map_err(broken)?;
    sock.write_all(request.as_bytes()).map_err(broken)?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD {
            return Err(Tunnel::Broken("its answer's head is too long".into()));
        }
        let left = left();
        if left.is_zero() {
            return Err(Tunnel::Broken(format!(
                "no answer within {}",
                secs(timeout)
            )));
        }
        sock.set_read_timeout(Some(left)).map_err(broken)?;
        match sock.read(&mut byte) {
            Ok(0) if head.is_empty() => {
                return Err(Tunnel::Broken(
                    "it closed the connection without answering".into(),
                ));
            }
            Ok(0) => break,
            Ok(_) => head.push(byte[0]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(broken(e)),
        }
    }
    let (code, reason, _) = parse_head(&head).map_err(Tunnel::Broken)?;
    let reason: String = reason
        .chars()
        .take(60)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let status = format!("HTTP {code} {reason}").trim_end().to_string();
    if (200..300).contains(&code) {
        Ok(status)
    } else {
        Err(Tunnel::Refused(code, status))
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status code and the `Date` header of a response head.
fn parse_head(head: &[u8]) -> Result<(u16, String, Option<String>), String> {
    let end = find(head, b"\r\n\r\n").unwrap_or(head.len());
    let text = String::from_utf8_lossy(&head[..end]);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (proto, code) = (parts.next().unwrap_or_default(), parts.next());
    let code = code.and_then(|c| c.parse::<u16>().ok());
    let (true, Some(code)) = (proto.starts_with("HTTP/"), code) else {
        let shown: String = status_line
            .chars()
            .take(60)
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        return Err(format!("not an HTTP response: {shown:?}"));
    };
    let reason = parts.next().unwrap_or_default().trim().to_string();
    let date = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("date")
            .then(|| v.trim().to_string())
    });
    Ok((code, reason, date))
}

/// Parses an HTTP date (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`).
fn parse_http_date(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc2822(s).ok().map(|t| t.to_utc())
}

fn ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Resolves `host`, giving up after `timeout` (the lookup thread is left to finish alone).
fn resolve(host: &str, port: u16, timeout: Duration) -> Result<Vec<SocketAddr>, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let (tx, rx) = mpsc::channel();
    let name = host.to_string();
    std::thread::Builder::new()
        .name("dns-probe".into())
        .spawn(move || {
            let r = (name.as_str(), port)
                .to_socket_addrs()
                .map(|a| a.collect::<Vec<_>>());
            let _ = tx.send(r);
        })
        .map_err(|e| format!("cannot start the lookup: {e}"))?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(addrs)) if addrs.is_empty() => Err("the name has no address".into()),
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(e)) => {
            let t = io_text(&e, timeout);
            Err(t
                .strip_prefix("failed to lookup address information: ")
                .unwrap_or(&t)
                .to_string())
        }
        Err(_) => Err(format!("no answer within {}", secs(timeout))),
    }
}

/// Connects to the first address that answers, each try within what is left of `timeout`.
fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    let mut errors = Vec::new();
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            errors.push(format!("{a}: no time left"));
            break;
        }
        match TcpStream::connect_timeout(a, left) {
            Ok(s) => return Ok(s),
            Err(e) => errors.push(format!("{a}: {}", io_text(&e, timeout))),
        }
    }
    if addrs.len() == 1 {
        // One address: the cause alone reads better.
        let e = errors.pop().unwrap_or_default();
        return Err(e.split_once(": ").map(|(_, c)| c.to_string()).unwrap_or(e));
    }
    Err(errors.join("; "))
}

fn tls_config(recorder: Arc<Recorder>) -> Result<Arc<ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(recorder)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
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
    let push = |p: &mut NodeProbe, name, started: Instant, r: Result<String, String>| {
        let ok = r.is_ok();
        p.steps.push(Step {
            name,
            ok,
            detail: r.unwrap_or_else(|e| e),
            elapsed_ms: ms(started),
        });
        ok
    };

    // DNS (of the proxy, when there is one: the proxy resolves the DLS's name)
    let t = Instant::now();
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
    if !push(&mut p, StepName::Dns, t, dns) {
        return p;
    }
    let addrs = addrs.unwrap_or_default();

    // TCP
    let t = Instant::now();
    let mut sock = match connect(&addrs, timeout) {
        Ok(s) => s,
        Err(e) => {
            push(&mut p, StepName::Tcp, t, Err(e));
            return p;
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
    if !push(&mut p, StepName::Tcp, t, tcp) {
        return p;
    }

    // TLS
    let t = Instant::now();
    let deadline = t + timeout;
    let provider = rustls::crypto::ring::default_provider();
    let recorder = Arc::new(Recorder {
        schemes: provider
            .signature_verification_algorithms
            .supported_schemes(),
        chain: Mutex::new(Vec::new()),
    });
    let setup = tls_config(recorder.clone())
        .map_err(|e| e.to_string())
        .and_then(|cfg| {
            let name = ServerName::try_from(host.to_string())
                .map_err(|_| format!("{host:?} is not a valid server name"))?;
            ClientConnection::new(cfg, name).map_err(|e| e.to_string())
        });
    let mut conn = match setup {
        Ok(c) => c,
        Err(e) => {
            push(&mut p, StepName::Tls, t, Err(e));
            return p;
        }
    };
    let _ = sock.set_write_timeout(Some(timeout));
    let shaken = handshake(&mut conn, &mut sock, deadline);
    let chain = recorder.chain.lock().map(|c| c.clone()).unwrap_or_default();
    let cert = (!chain.is_empty()).then(|| cert_info(&chain));
    if let Some(Ok(c)) = &cert {
        p.certificate = Some(c.clone());
    }
    match shaken {
        Err(e) => {
            push(&mut p, StepName::Tls, t, Err(e.text(timeout)));
            return p;
        }
        Ok(()) => {
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
            push(
                &mut p,
                StepName::Tls,
                t,
                Ok(format!("{version}{cipher}, {about}")),
            );
        }
    }

    // HTTPS
    let t = Instant::now();
    let deadline = t + timeout;
    let sent_utc = Utc::now();
    let head = get_head(&mut conn, &mut sock, host, port, deadline);
    let rtt = t.elapsed();
    let https = match head {
        Err(Stop::Closed) => Err("the server closed the connection without answering".into()),
        Err(e) => Err(e.text(timeout)),
        Ok(head) => match parse_head(&head) {
            Err(e) => Err(e),
            Ok((code, reason, date)) => {
                p.http_status = Some(code);
                let status = format!("HTTP {code} {reason}").trim_end().to_string();
                match date.as_deref().map(|d| (d, parse_http_date(d))) {
                    None => Ok(format!(
                        "{status}, no Date header: the clock cannot be compared"
                    )),
                    Some((d, None)) => Ok(format!(
                        "{status}, Date {d:?} does not parse: the clock cannot be compared"
                    )),
                    Some((_, Some(dls))) => {
                        p.dls_date = Some(rfc3339(dls));
                        // The guest's clock at the middle of the round trip against the DLS's,
                        // whose Date is truncated to the second (so half a second later on
                        // average).
                        let half = chrono::Duration::from_std(rtt / 2).unwrap_or_default();
                        let guest = sent_utc + half;
                        let skew = (guest - dls).as_seconds_f64() - 0.5;
                        let skew = (skew * 1000.0).round() / 1000.0;
                        p.clock_skew_seconds = Some(skew);
                        Ok(format!(
                            "{status}, Date {} (round trip {} ms)",
                            rfc3339(dls),
                            rtt.as_millis()
                        ))
                    }
                }
            }
        },
    };
    push(&mut p, StepName::Https, t, https);
    conn.send_close_notify();
    let _ = flush(&mut conn, &mut sock);
    p
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
