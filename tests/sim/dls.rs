//! A fake DLS: an HTTPS server on a loopback port, with a self-signed certificate (rcgen) and
//! a behaviour that can be changed while it runs:
//!
//! - `Up`: TLS, then the leasing API's paths (below) answered `200 OK`, any other path `404`,
//!   each answer with a `Date` header `skew` seconds off the real clock;
//! - `Refusing`: nothing listens on the port (connection refused);
//! - `Blackhole`: connections are accepted and never answered (timeouts);
//! - `BadTls`: plain text instead of TLS, then the connection is closed;
//! - `BadGateway`: a proxy in front of a DLS that is down: TLS, then `502 Bad Gateway` to
//!   every request.
//!
//! The paths a licensing client uses, from the real fastapi-dls server log of a Linux guest
//! (`tests/fixtures/samples/dls-server-log-fastapi-dls-linux-client.txt`): `POST
//! /auth/v1/origin`, `/auth/v1/code`, `/auth/v1/token`, `GET /leasing/v1/lessor/leases`, `POST
//! /leasing/v1/lessor`. Renewing and returning a lease no sample shows: `PUT` and `DELETE
//! /leasing/v1/lease/<ref>` and `DELETE /leasing/v1/lessor/leases` are those of fastapi-dls's
//! `app/main.py`, the source `samples/token-payload-1.json` cites. Bodies are only as much as
//! the simulated gridd reads (a lease's `ref`): the DLS's checks (the client's auth code, the
//! lease's owner) are not simulated. Used in-process by the tests and by the `sim-dls`
//! program in the boot test's guest.

#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use chrono::Utc;

#[path = "jws.rs"]
pub mod jws;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Up,
    Refusing,
    Blackhole,
    BadTls,
    BadGateway,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "up" => Ok(Mode::Up),
            "refusing" | "down" => Ok(Mode::Refusing),
            "blackhole" => Ok(Mode::Blackhole),
            "bad_tls" | "bad-tls" => Ok(Mode::BadTls),
            "bad_gateway" | "bad-gateway" | "502" => Ok(Mode::BadGateway),
            _ => Err(format!(
                "unknown DLS mode {s:?} (up, refusing, blackhole, bad_tls, bad_gateway)"
            )),
        }
    }
}

struct Inner {
    mode: Mutex<Mode>,
    skew: AtomicI64,
    stop: AtomicBool,
    /// `METHOD PATH STATUS` of every request answered.
    requests: Mutex<Vec<String>>,
    /// Leases granted and not returned (their refs).
    leases: Mutex<Vec<String>>,
    next_lease: std::sync::atomic::AtomicU64,
    tls: Arc<rustls::ServerConfig>,
}

pub struct FakeDls {
    addr: SocketAddr,
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

/// A TLS server config with a fresh self-signed certificate for `localhost`, `127.0.0.1` and
/// `::1`.
pub fn tls_config() -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let ck = rcgen::generate_simple_self_signed(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ])
    .expect("a self-signed certificate");
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![ck.cert.der().clone()], key)
    .expect("the certificate and its key");
    Arc::new(config)
}

impl FakeDls {
    /// Starts one on a free loopback port, `Up`, no skew.
    pub fn start() -> FakeDls {
        FakeDls::bind("127.0.0.1:0".parse().unwrap()).expect("a loopback port")
    }

    pub fn bind(addr: SocketAddr) -> io::Result<FakeDls> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            mode: Mutex::new(Mode::Up),
            skew: AtomicI64::new(0),
            stop: AtomicBool::new(false),
            requests: Mutex::new(Vec::new()),
            leases: Mutex::new(Vec::new()),
            next_lease: std::sync::atomic::AtomicU64::new(1),
            tls: tls_config(),
        });
        let i = inner.clone();
        let thread = std::thread::spawn(move || accept_loop(listener, addr, i));
        Ok(FakeDls {
            addr,
            inner,
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.inner.mode.lock().unwrap() = mode;
        // Let the accept loop apply it (close or reopen the port) before returning.
        std::thread::sleep(Duration::from_millis(60));
    }

    pub fn mode(&self) -> Mode {
        *self.inner.mode.lock().unwrap()
    }

    /// The DLS's clock is `secs` ahead of the real one (negative: behind).
    pub fn set_skew(&self, secs: i64) {
        self.inner.skew.store(secs, Ordering::SeqCst);
    }

    /// `METHOD PATH STATUS` of the requests answered so far.
    pub fn requests(&self) -> Vec<String> {
        self.inner.requests.lock().unwrap().clone()
    }

    /// Refs of the leases granted and not returned.
    pub fn leases(&self) -> Vec<String> {
        self.inner.leases.lock().unwrap().clone()
    }
}

impl Drop for FakeDls {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, addr: SocketAddr, inner: Arc<Inner>) {
    let _ = listener.set_nonblocking(true);
    let mut listener = Some(listener);
    let mut held: Vec<TcpStream> = Vec::new();
    while !inner.stop.load(Ordering::SeqCst) {
        let mode = *inner.mode.lock().unwrap();
        if mode != Mode::Blackhole {
            held.clear();
        }
        if mode == Mode::Refusing {
            listener = None;
        } else if listener.is_none() {
            listener = TcpListener::bind(addr).ok();
            if let Some(l) = &listener {
                let _ = l.set_nonblocking(true);
            }
        }
        let Some(l) = &listener else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        match l.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                // The mode now, not as this turn of the loop began: a connection made after
                // `set_mode` returned is served in the new mode, however late this thread
                // ran (under load, the old one reset it).
                let mode = *inner.mode.lock().unwrap();
                match mode {
                    Mode::Up | Mode::BadGateway => {
                        let i = inner.clone();
                        std::thread::spawn(move || {
                            let _ = serve(stream, &i, mode);
                        });
                    }
                    Mode::BadTls => {
                        std::thread::spawn(move || bad_tls(stream));
                    }
                    Mode::Blackhole => held.push(stream),
                    Mode::Refusing => {}
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn bad_tls(mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 1024];
    let _ = stream.read(&mut buf);
    let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\nnot TLS\n");
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// The answer to `method path` (status, reason, JSON body): the leasing API's paths only.
fn route(inner: &Inner, method: &str, path: &str) -> (u16, &'static str, String) {
    let path = path.split('?').next().unwrap_or_default();
    let ok = |body: serde_json::Value| (200, "OK", body.to_string());
    let lease_ref = path
        .strip_prefix("/leasing/v1/lease/")
        .filter(|r| !r.is_empty());
    let known = matches!(
        path,
        "/auth/v1/origin"
            | "/auth/v1/code"
            | "/auth/v1/token"
            | "/leasing/v1/lessor"
            | "/leasing/v1/lessor/leases"
    ) || lease_ref.is_some();
    match (method, path) {
        ("POST", "/auth/v1/origin") => ok(serde_json::json!({
            "origin_ref": "00000000-0000-0000-0000-00000000a001",
            "registration_pending": false,
        })),
        ("POST", "/auth/v1/code") => ok(serde_json::json!({
            "auth_code": "simulated", "sync_timestamp": Utc::now().to_rfc3339(),
        })),
        ("POST", "/auth/v1/token") => ok(serde_json::json!({
            "auth_token": "simulated", "expires": Utc::now().to_rfc3339(),
        })),
        ("GET", "/leasing/v1/lessor/leases") => ok(serde_json::json!({
            "active_lease_list": *inner.leases.lock().unwrap(),
        })),
        ("POST", "/leasing/v1/lessor") => {
            let n = inner.next_lease.fetch_add(1, Ordering::SeqCst);
            let r = format!("00000000-0000-0000-0000-{n:012}");
            inner.leases.lock().unwrap().push(r.clone());
            ok(serde_json::json!({"lease_result_list": [{"lease": {"ref": r}}]}))
        }
        ("DELETE", "/leasing/v1/lessor/leases") => {
            let released = std::mem::take(&mut *inner.leases.lock().unwrap());
            ok(serde_json::json!({"released_lease_list": released}))
        }
        ("PUT" | "DELETE", _) if lease_ref.is_some() => {
            let r = lease_ref.unwrap_or_default();
            let mut leases = inner.leases.lock().unwrap();
            match leases.iter().position(|l| l == r) {
                None => (404, "Not Found", r#"{"detail":"lease not found"}"#.into()),
                Some(i) => {
                    if method == "DELETE" {
                        leases.remove(i);
                    }
                    ok(serde_json::json!({"lease_ref": r}))
                }
            }
        }
        _ if known => (
            405,
            "Method Not Allowed",
            r#"{"detail":"Method Not Allowed"}"#.into(),
        ),
        _ => (404, "Not Found", r#"{"detail":"Not Found"}"#.into()),
    }
}

fn serve(stream: TcpStream, inner: &Inner, mode: Mode) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let conn = rustls::ServerConnection::new(inner.tls.clone()).map_err(io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, stream);
    // The request head, then its body (unread bytes at close would reset the connection
    // before the answer is read).
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tls.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        data.extend_from_slice(&buf[..n]);
        if data.len() > 64 * 1024 {
            return Ok(());
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut have = data.len() - head_end;
    while have < length.min(1 << 20) {
        let n = tls.read(&mut buf)?;
        if n == 0 {
            break;
        }
        have += n;
    }
    let request_line = head.lines().next().unwrap_or_default();
    let mut parts = request_line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let (status, why, body, server, ctype) = if mode == Mode::BadGateway {
        (
            502,
            "Bad Gateway",
            "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n".to_string(),
            "nginx",
            "text/html",
        )
    } else {
        let (status, why, body) = route(inner, method, path);
        (status, why, body, "sim-dls", "application/json")
    };
    inner
        .requests
        .lock()
        .unwrap()
        .push(format!("{method} {path} {status}"));
    let date = Utc::now() + chrono::Duration::seconds(inner.skew.load(Ordering::SeqCst));
    write!(
        tls,
        "HTTP/1.1 {status} {why}\r\nDate: {}\r\nServer: {server}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        date.format("%a, %d %b %Y %H:%M:%S GMT"),
        body.len()
    )?;
    tls.flush()?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    let _ = tls.sock.shutdown(std::net::Shutdown::Write);
    // Drain until the client closes, so that the close is clean.
    let _ = tls.sock.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = tls.sock.read(&mut buf);
    Ok(())
}

/// A client configuration token with the structure of a real one, signed by this DLS (the
/// test key of `tests/fixtures/sim/`), naming one DLS node `host` whose auth and lease ports
/// are `port`.
pub fn token_for(host: &str, port: u16, jti: &str) -> Vec<u8> {
    jws::sign(&token_payload(host, port, jti))
}

/// The payload of [`token_for`]'s token (`samples/token-payload-1.json`'s structure).
pub fn token_payload(host: &str, port: u16, jti: &str) -> serde_json::Value {
    serde_json::json!({
        "iss": "NLS Service Instance", "aud": "NLS Licensed Client",
        "iat": 1_700_000_000, "nbf": 1_700_000_000, "exp": 2_078_691_200, "jti": jti,
        "protocol_version": "2.0", "update_mode": "ABSOLUTE",
        "scope_ref_list": ["20000000-0000-0000-0000-000000000001"],
        "fulfillment_class_ref_list": [],
        "service_instance_configuration": {
            "nls_service_instance_ref": "10000000-0000-0000-0000-000000000001",
            "svc_port_set_list": [{"idx": 0, "d_name": "DLS", "svc_port_map": [
                {"service": "auth", "port": port}, {"service": "lease", "port": port}]}],
            "node_url_list": [{"idx": 0, "url": host, "url_qr": host, "svc_port_set_idx": 0}]
        },
        "service_instance_public_key_configuration": {
            "service_instance_public_key_pem": jws::PUBLIC_KEY_PEM,
            "key_retention_mode": "LATEST_ONLY"
        }
    })
}
