//! The client side of a DLS exchange as the simulated gridd does it: TCP (straight to the
//! DLS, or to an HTTP proxy that opens a `CONNECT` tunnel to it), TLS (any certificate: the
//! real gridd checks the DLS's against NVIDIA's own roots, not the OS's), then one HTTP
//! request (a connection each): its status, `Date` and body. Names other than /etc/hosts' are
//! never resolved (see [`resolve`]).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Accepts any certificate: the simulated DLS's is self-signed (the real gridd checks it
/// against NVIDIA's own roots, not the OS's).
#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// An HTTP answer: its status, its `Date` and its body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub date: Option<DateTime<Utc>>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// One request over TLS (a connection of its own, `Connection: close`). `Err` where no HTTP
/// answer came: no connection, no TLS, nothing readable.
pub fn request(
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<Answer, String> {
    request_via(None, host, port, method, path, body, timeout)
}

/// The address of `host`: an IP address, or a name the machine's `/etc/hosts` gives (the
/// boot test's guests name their DLS there, and `localhost` is there). Never DNS: a name only
/// DNS knows (NVIDIA's real `api.cls.licensing.nvidia.com`) fails as a network failure, so no
/// test can reach a real license service.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    hosts
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default())
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let ip = words.next()?.parse::<IpAddr>().ok()?;
            words
                .any(|w| w.eq_ignore_ascii_case(host))
                .then_some(SocketAddr::new(ip, port))
        })
        .next()
        .or_else(|| {
            host.eq_ignore_ascii_case("localhost")
                .then(|| SocketAddr::from(([127, 0, 0, 1], port)))
        })
        .ok_or_else(|| {
            format!("resolve: {host}: not in /etc/hosts (the simulated machine uses no DNS)")
        })
}

/// Asks the proxy on `tcp` for a tunnel to `host:port` (HTTP `CONNECT`), as gridd does with
/// gridd.conf's `ProxyServerAddress`; `Err` with the proxy's status line where it refuses.
fn tunnel(tcp: &mut TcpStream, host: &str, port: u16) -> Result<(), String> {
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    write!(tcp, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")
        .map_err(|e| format!("proxy: {e}"))?;
    // Byte by byte: what follows the head is the DLS's.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tcp.read(&mut byte) {
            Ok(0) => return Err("proxy: closed without an answer".into()),
            Ok(_) => head.push(byte[0]),
            Err(e) => return Err(format!("proxy: {e}")),
        }
        if head.len() > 8192 {
            return Err("proxy: answer head too long".into());
        }
    }
    let text = String::from_utf8_lossy(&head);
    let status_line = text.lines().next().unwrap_or_default();
    let ok = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .is_some_and(|c| (200..300).contains(&c));
    if ok {
        Ok(())
    } else {
        Err(format!("proxy: {status_line}"))
    }
}

/// [`request`], through the HTTP proxy `via` (host, port) when given: `CONNECT` to it, then
/// TLS to `host` inside the tunnel.
pub fn request_via(
    via: Option<(&str, u16)>,
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<Answer, String> {
    let addr = match via {
        Some((ph, pp)) => resolve(ph, pp)?,
        None => resolve(host, port)?,
    };
    let mut tcp =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(timeout)).ok();
    tcp.set_write_timeout(Some(timeout)).ok();
    if via.is_some() {
        tunnel(&mut tcp, host, port)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("tls: {e}"))?;
    tls.flush().map_err(|e| format!("tls: {e}"))?;
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tls.read(&mut buf).map_err(|e| format!("tls: {e}"))?;
        if n == 0 {
            return Err("closed before an HTTP answer".into());
        }
        data.extend_from_slice(&buf[..n]);
        if data.len() > 64 * 1024 {
            return Err("HTTP header too long".into());
        }
    };
    let text = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let mut lines = text.lines();
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not HTTP: {status_line:?}"))?;
    let header = |name: &str| {
        text.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let date = header("date").and_then(|d| {
        DateTime::parse_from_rfc2822(&d)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    });
    let length: usize = header("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0)
        .min(1 << 20);
    let mut body = data[head_end..].to_vec();
    while body.len() < length {
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    body.truncate(length);
    Ok(Answer { status, date, body })
}

/// `POST /auth/v1/origin` over TLS (the first step of the real client), returning the
/// answer's `Date` (of any status).
pub fn https_date(host: &str, port: u16, timeout: Duration) -> Result<DateTime<Utc>, String> {
    let body = r#"{"candidate_origin_ref":"00000000-0000-0000-0000-000000000000","environment":{"hostname":"sim"}}"#;
    request(host, port, "POST", "/auth/v1/origin", body, timeout)?
        .date
        .ok_or_else(|| "no Date header".to_string())
}
