//! The metrics over HTTP (`metrics_socket`, `metrics_listen`): hyper's HTTP/1 server, one
//! request per connection, answered and closed, as Prometheus, vmagent and `curl` expect of
//! an exporter.
//!
//! `GET /metrics` (or `HEAD`) answers the current metrics in the Prometheus text format, or
//! as OpenMetrics 1.0 when the `Accept` header prefers `application/openmetrics-text` (as
//! Prometheus's own scraper does). Any other path is 404, any other method 405; a request
//! hyper cannot parse is 400. Nothing on the pod network can hold the agent's memory, its
//! tasks or its descriptors:
//! - the request head is read up to [`MAX_REQUEST_BYTES`] (431 past it) and within
//!   [`READ_DEADLINE`] (then the connection is closed), and the answer must be taken within
//!   [`WRITE_DEADLINE`];
//! - at most [`MAX_CONNECTIONS`] connections are open at once (fewer under a low descriptor
//!   limit: a quarter of it, the rest stays for nvidia-smi, journalctl and status.json); a new
//!   one past the cap closes the oldest that has not sent its request yet, so that a scraper
//!   still gets in while idle connections pile up, or is closed at once when every open one is
//!   being answered;
//! - an accept that fails (no descriptor left: EMFILE, ENFILE) is logged once, and the
//!   listener tries again shortly after, until it accepts again, which is logged too.
//!
//! What to answer is decided by [`respond`], a pure function of the method, path and `Accept`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, ALLOW, CONNECTION, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};
use tracing::{error, info, warn};

use crate::http::Listen;
use crate::model::report::metrics::{
    OPENMETRICS_CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE, openmetrics,
};

/// The request head (request line and headers) may be this long; a scraper's is a few
/// hundred bytes. (hyper reads no less than 8 KiB at a time, which this is.)
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// The whole request head must arrive within this (Prometheus's default scrape timeout is
/// 10 s; its request is sent at once).
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// The answer must be taken within this, or the connection is dropped.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// Connections open at once, over both listeners, at most.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a listener waits before it accepts again after an accept failed.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// An accept failure within this of the last one logged is not logged again.
const ACCEPT_QUIET: Duration = Duration::from_secs(60);

/// The path the metrics are served at.
pub const METRICS_PATH: &str = "/metrics";

/// The format of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The classic Prometheus text format, 0.0.4.
    Prometheus,
    /// OpenMetrics text, 1.0.0.
    OpenMetrics,
}

/// The `q` of a media range's parameters (1 when absent, 0 when unreadable: RFC 9110 12.4.2
/// allows at most three decimals).
fn quality(params: &[(String, String)]) -> f32 {
    match params.iter().find(|(k, _)| k == "q") {
        None => 1.0,
        Some((_, v)) => v
            .parse::<f32>()
            .ok()
            .filter(|q| (0.0..=1.0).contains(q))
            .unwrap_or(0.0),
    }
}

/// The format an `Accept` header's value prefers: OpenMetrics only when it is acceptable
/// (a version this agent writes: 1.0.0, or 0.0.1, its draft, which the same parsers read)
/// and ranks strictly above the text format; `*/*`, no header or nothing acceptable is the
/// text format, which every scraper reads.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Prometheus;
    };
    // Per format: (how specific the best range was, its q). A specific range outranks a
    // wildcard whatever their q (RFC 9110 12.5.1).
    let mut om: (u8, f32) = (0, 0.0);
    let mut text: (u8, f32) = (0, 0.0);
    let better = |cur: &mut (u8, f32), spec: u8, q: f32| {
        if spec > cur.0 || (spec == cur.0 && q > cur.1) {
            *cur = (spec, q);
        }
    };
    for range in accept.split(',') {
        let (media, version, q) = media_range(range);
        match media.as_str() {
            "application/openmetrics-text" => {
                if matches!(version.as_deref(), None | Some("1.0.0") | Some("0.0.1")) {
                    better(&mut om, 3, q);
                }
            }
            "text/plain" => {
                if matches!(version.as_deref(), None | Some("0.0.4")) {
                    better(&mut text, 3, q);
                }
            }
            "application/*" => better(&mut om, 2, q),
            "text/*" => better(&mut text, 2, q),
            "*/*" => {
                better(&mut om, 1, q);
                better(&mut text, 1, q);
            }
            _ => {}
        }
    }
    if om.1 > 0.0 && om.1 > text.1 {
        Format::OpenMetrics
    } else {
        Format::Prometheus
    }
}

/// One range of an `Accept` header: its media type (lower case), its `version` parameter,
/// and its q.
fn media_range(range: &str) -> (String, Option<String>, f32) {
    let mut parts = range.split(';');
    let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let params: Vec<(String, String)> = parts
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((
                k.trim().to_ascii_lowercase(),
                v.trim().trim_matches('"').to_string(),
            ))
        })
        .collect();
    let version = params
        .iter()
        .find(|(k, _)| k == "version")
        .map(|(_, v)| v.clone());
    (media, version, quality(&params))
}

/// An answer, before hyper writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: &'static str,
    /// `Allow: GET, HEAD` (with a 405).
    pub allow: bool,
    pub body: String,
}

fn refusal(status: StatusCode) -> Answer {
    Answer {
        status,
        content_type: "text/plain; charset=utf-8",
        allow: status == StatusCode::METHOD_NOT_ALLOWED,
        body: format!("{status}\n"),
    }
}

/// The answer to `method` on `path` (the request target's path, without its query) with
/// `accept` (the request's `Accept` fields as one list), serving `metrics`, the text
/// [`crate::model::report::metrics::render`] wrote. A `HEAD`'s body is counted but not sent (hyper).
pub fn respond(method: &Method, path: &str, accept: Option<&str>, metrics: &str) -> Answer {
    if method != Method::GET && method != Method::HEAD {
        return refusal(StatusCode::METHOD_NOT_ALLOWED);
    }
    if path != METRICS_PATH {
        return refusal(StatusCode::NOT_FOUND);
    }
    let (content_type, body) = match negotiate(accept) {
        Format::Prometheus => (PROMETHEUS_CONTENT_TYPE, metrics.to_string()),
        Format::OpenMetrics => (OPENMETRICS_CONTENT_TYPE, openmetrics(metrics)),
    };
    Answer {
        status: StatusCode::OK,
        content_type,
        allow: false,
        body,
    }
}

/// Several `Accept` fields are one list (RFC 9110 5.3); a field that is not text is left out.
fn accept_of(req: &Request<Incoming>) -> Option<String> {
    let values: Vec<&str> = req
        .headers()
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::trim)
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

fn response(answer: Answer) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(answer.body)));
    *resp.status_mut() = answer.status;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(answer.content_type));
    h.insert(CONNECTION, HeaderValue::from_static("close"));
    if answer.allow {
        h.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    resp
}

/// Serves one connection: one request head, bounded in size and in time, its answer, and
/// the connection closed; `asked` is set once the request head has arrived whole.
async fn serve_connection<S>(
    io: S,
    metrics: watch::Receiver<String>,
    asked: Arc<AtomicBool>,
    read_deadline: Duration,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        asked.store(true, Ordering::Relaxed);
        let answer = respond(
            req.method(),
            req.uri().path(),
            accept_of(&req).as_deref(),
            &metrics.borrow(),
        );
        std::future::ready(Ok::<_, Infallible>(response(answer)))
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(read_deadline)
        .max_buf_size(MAX_REQUEST_BYTES)
        .max_header_size(MAX_REQUEST_BYTES)
        .keep_alive(false)
        // A client that closes its sending side once it asked still gets its answer.
        .half_close(true)
        .serve_connection(TokioIo::new(io), service);
    // Whatever the client does, the connection ends by then (an error has no one to go to).
    let _ = tokio::time::timeout(read_deadline + WRITE_DEADLINE, conn).await;
}

/// Serves one connection as the listeners do: one request head, bounded in size and in time,
/// its answer with `metrics`, and the connection closed.
pub async fn answer<S>(io: S, metrics: &str)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (_tx, rx) = watch::channel(metrics.to_string());
    serve_connection(io, rx, Arc::default(), READ_DEADLINE).await;
}

/// The open connections of both listeners, oldest first.
struct Slots {
    cap: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next: u64,
    conns: BTreeMap<u64, (AbortHandle, Arc<AtomicBool>)>,
}

/// Frees a connection's slot when its task ends, however it ends.
struct Slot {
    slots: Arc<Slots>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.slots.open.lock() {
            open.conns.remove(&self.id);
        }
    }
}

impl Slots {
    fn new(cap: usize) -> Arc<Slots> {
        Arc::new(Slots {
            cap,
            open: Mutex::default(),
        })
    }

    /// Starts `serve` for a new connection when there is room, or room can be made by closing
    /// the oldest connection still waiting for its request; when every open connection is
    /// being answered, `serve` is not called (the new connection, dropped, is closed).
    fn admit(
        self: &Arc<Self>,
        serve: impl FnOnce(Arc<AtomicBool>, Slot) -> JoinHandle<()>,
    ) -> Admitted {
        let Ok(mut open) = self.open.lock() else {
            return Admitted::Refused;
        };
        let mut admitted = Admitted::Room;
        if open.conns.len() >= self.cap {
            let idle = open
                .conns
                .iter()
                .find(|(_, (_, asked))| !asked.load(Ordering::Relaxed))
                .map(|(id, _)| *id);
            let Some(idle) = idle else {
                return Admitted::Refused;
            };
            if let Some((task, _)) = open.conns.remove(&idle) {
                task.abort();
            }
            admitted = Admitted::Evicted;
        }
        let id = open.next;
        open.next += 1;
        let asked = Arc::new(AtomicBool::new(false));
        let slot = Slot {
            slots: self.clone(),
            id,
        };
        // Under the lock: the task's slot is removed only after it was put in.
        let task = serve(asked.clone(), slot);
        open.conns.insert(id, (task.abort_handle(), asked));
        admitted
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.lock().unwrap().conns.len()
    }
}

/// A quarter of the descriptor limit, and at most [`MAX_CONNECTIONS`].
fn connection_cap() -> usize {
    use nix::sys::resource::{Resource, getrlimit};
    let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
    usize::try_from(soft / 4)
        .unwrap_or(MAX_CONNECTIONS)
        .clamp(1, MAX_CONNECTIONS)
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// How [`Slots::admit`] dealt with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admitted {
    /// Started: there was room.
    Room,
    /// Started, after closing the oldest connection still waiting for its request.
    Evicted,
    /// Closed: every open connection is being answered.
    Refused,
}

/// Accepts connections until the task is dropped: an accept that fails never ends it. A
/// failure is logged when it starts, and the recovery when it ends; failures that come back
/// within [`ACCEPT_QUIET`] of the last one logged are not logged again.
async fn accept_loop(
    listener: Listener,
    name: String,
    metrics: watch::Receiver<String>,
    slots: Arc<Slots>,
) {
    let mut failing = Failing::default();
    loop {
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().await.map(|(c, _)| {
                let _ = c.set_nodelay(true);
                Conn::Tcp(c)
            }),
            Listener::Unix(l) => l.accept().await.map(|(c, _)| Conn::Unix(c)),
        };
        let conn = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                failing.failed(&name, &e, slots.cap);
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        failing.recovered(&name);
        let m = metrics.clone();
        let evicted = slots.admit(|asked, slot| {
            tokio::spawn(async move {
                let _slot = slot;
                match conn {
                    Conn::Tcp(c) => serve_connection(c, m, asked, READ_DEADLINE).await,
                    Conn::Unix(c) => serve_connection(c, m, asked, READ_DEADLINE).await,
                }
            })
        });
        // A closed connection's descriptor is released when its task is dropped: let that
        // happen before the next accept.
        if evicted != Admitted::Room {
            tokio::task::yield_now().await;
        }
    }
}

/// A listener's failing accepts, as the journal hears of them.
#[derive(Default)]
struct Failing {
    /// Whether the last accept failed, and whether that failure was logged.
    now: Option<bool>,
    logged_at: Option<tokio::time::Instant>,
}

impl Failing {
    /// A failure is logged when it starts, unless the last one logged was within
    /// [`ACCEPT_QUIET`].
    fn failed(&mut self, name: &str, e: &std::io::Error, cap: usize) {
        if self.now.is_some() {
            return;
        }
        let quiet = self.logged_at.is_some_and(|t| t.elapsed() < ACCEPT_QUIET);
        if !quiet {
            self.logged_at = Some(tokio::time::Instant::now());
            warn!(
                "metrics listener {name}: cannot accept a connection: {e}; trying again every {} ms (the agent's other work keeps its descriptors: scrapers get at most {cap} connections)",
                ACCEPT_PAUSE.as_millis(),
            );
        }
        self.now = Some(!quiet);
    }

    /// The recovery is logged where the failure was.
    fn recovered(&mut self, name: &str) {
        if self.now.take() == Some(true) {
            info!("metrics listener {name}: accepting connections again");
        }
    }
}

/// Binds `metrics_socket`: a socket left at `path` (by an earlier run) is replaced, anything
/// else there is left alone and refused.
fn bind_socket(path: &Path) -> Result<UnixListener, String> {
    use std::os::unix::fs::FileTypeExt;
    let shown = crate::model::text::show_path(path);
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| {
                format!("service.metrics_socket = {shown}: cannot remove the old socket: {e}")
            })?;
        }
        Ok(_) => {
            return Err(format!(
                "service.metrics_socket = {shown} exists and is not a socket: it is left as it is and the metrics are not served there; remove it, or set metrics_socket to another path"
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("service.metrics_socket = {shown}: {e}")),
    }
    UnixListener::bind(path)
        .map_err(|e| format!("service.metrics_socket = {shown}: cannot listen there: {e}"))
}

/// Binds `metrics_listen`: `:PORT` is every address, IPv6 and IPv4 (IPv4 alone where the
/// guest has no IPv6), as node_exporter's `:9100` is.
fn bind_tcp(listen: Listen) -> io::Result<TcpListener> {
    match listen {
        Listen::At(addr) => tcp_listener(addr, false),
        Listen::Any(port) => {
            match tcp_listener(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)), true) {
                // No IPv6 on this guest (ipv6.disable=1): every IPv4 address.
                Err(e) if e.raw_os_error() == Some(nix::libc::EAFNOSUPPORT) => {
                    tcp_listener(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)), false)
                }
                bound => bound,
            }
        }
    }
}

/// A listening socket on `addr` (IPv4 too when `dual_stack`), with room in the kernel's
/// queue for a burst of connections.
fn tcp_listener(addr: SocketAddr, dual_stack: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if dual_stack {
        s.set_only_v6(false)?;
    }
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    TcpListener::from_std(s.into())
}

/// Serves `GET /metrics` on the Unix socket `socket` and the TCP address `listen` (each
/// optional), the current metrics always being `metrics`'s; the listeners end with their
/// tasks.
pub async fn serve(
    socket: Option<&Path>,
    listen: Option<&str>,
    metrics: watch::Receiver<String>,
) -> Vec<JoinHandle<()>> {
    let slots = Slots::new(connection_cap());
    let mut tasks = Vec::new();
    if let Some(path) = socket {
        match bind_socket(path) {
            Ok(l) => tasks.push(tokio::spawn(accept_loop(
                Listener::Unix(l),
                crate::model::text::show_path(path),
                metrics.clone(),
                slots.clone(),
            ))),
            Err(e) => error!("{e}"),
        }
    }
    if let Some(addr) = listen {
        let shown = crate::model::text::escape(addr).to_string();
        match crate::http::listen_address(addr) {
            None => error!(
                "service.metrics_listen = {shown}: expected an address and port, e.g. \"127.0.0.1:9841\", or \":9841\" for every address"
            ),
            Some(to) => match bind_tcp(to) {
                Ok(l) => tasks.push(tokio::spawn(accept_loop(
                    Listener::Tcp(l),
                    shown,
                    metrics.clone(),
                    slots.clone(),
                ))),
                Err(e) => warn!("cannot listen on {shown}: {e}"),
            },
        }
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const METRICS: &str = "# HELP vgpu_license_failures_total Failures.\n# TYPE vgpu_license_failures_total counter\nvgpu_license_failures_total{reason=\"other\"} 0\n";

    /// Status line, headers (lowercased names), body.
    fn parse(answer: &[u8]) -> (String, Vec<(String, String)>, String) {
        let text = String::from_utf8(answer.to_vec()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().to_string();
        let headers = lines
            .map(|l| {
                let (k, v) = l.split_once(": ").unwrap();
                (k.to_ascii_lowercase(), v.to_string())
            })
            .collect();
        (status, headers, body.to_string())
    }

    fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
        h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// `request` sent whole (and the sending side closed after it when `close_after`), and
    /// what came back until the server closed the connection.
    async fn exchange_within(request: Vec<u8>, close_after: bool, deadline: Duration) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let (_, rx) = watch::channel(METRICS.to_string());
        let asked = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(serve_connection(server, rx, asked, deadline));
        client.write_all(&request).await.unwrap();
        if close_after {
            client.shutdown().await.unwrap();
        }
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        task.await.unwrap();
        out
    }

    async fn exchange(request: &[u8]) -> Vec<u8> {
        exchange_within(request.to_vec(), false, READ_DEADLINE).await
    }

    #[tokio::test]
    async fn get_metrics_answers_the_text_format_by_default() {
        for req in [
            "GET /metrics HTTP/1.0\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: 10.0.0.7:9841\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n",
            "GET /metrics?x=1 HTTP/1.1\nHost: a\n\n",
            "GET http://10.0.0.7:9841/metrics HTTP/1.1\r\nHost: 10.0.0.7:9841\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nAccept: application/json\r\n\r\n",
        ] {
            let (status, h, body) = parse(&exchange(req.as_bytes()).await);
            let version = if req.contains("HTTP/1.0") {
                "1.0"
            } else {
                "1.1"
            };
            assert_eq!(status, format!("HTTP/{version} 200 OK"), "{req:?}");
            assert_eq!(
                header(&h, "content-type"),
                Some("text/plain; version=0.0.4; charset=utf-8")
            );
            assert_eq!(
                header(&h, "content-length"),
                Some(&*METRICS.len().to_string())
            );
            assert_eq!(header(&h, "connection"), Some("close"));
            assert_eq!(body, METRICS);
        }
    }

    #[tokio::test]
    async fn openmetrics_when_the_scraper_prefers_it() {
        // Prometheus 2.x's scrape request.
        let prometheus = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9841\r\nUser-Agent: Prometheus/2.42.0\r\nAccept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\nAccept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n";
        let (status, h, body) = parse(&exchange(prometheus.as_bytes()).await);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(
            header(&h, "content-type"),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert!(
            body.contains("# TYPE vgpu_license_failures counter\n"),
            "{body}"
        );
        assert_eq!(header(&h, "content-length"), Some(&*body.len().to_string()));
    }

    #[test]
    fn negotiation_follows_quality_and_specificity() {
        use Format::*;
        let cases: [(Option<&str>, Format); 12] = [
            (None, Prometheus),
            (Some(""), Prometheus),
            (Some("*/*"), Prometheus),
            (Some("application/openmetrics-text"), OpenMetrics),
            (
                Some("Application/OpenMetrics-Text; Version=1.0.0"),
                OpenMetrics,
            ),
            (
                Some("application/openmetrics-text;version=0.0.1"),
                OpenMetrics,
            ),
            // A version this agent does not write is not acceptable.
            (
                Some("application/openmetrics-text;version=2.0.0"),
                Prometheus,
            ),
            (
                Some("text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5"),
                Prometheus,
            ),
            (
                Some("text/plain;q=0.4, application/openmetrics-text;q=0.6"),
                OpenMetrics,
            ),
            (Some("application/openmetrics-text;q=0"), Prometheus),
            (Some("application/*, text/plain;q=0.9"), OpenMetrics),
            // vmagent's request.
            (Some("text/plain;version=0.0.4;q=1,*/*;q=0.1"), Prometheus),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(accept), want, "{accept:?}");
        }
    }

    #[tokio::test]
    async fn several_accept_fields_are_one_list() {
        let req = "GET /metrics HTTP/1.1\r\naccept: text/plain;q=0.2\r\nACCEPT: application/openmetrics-text\r\n\r\n";
        let (_, h, _) = parse(&exchange(req.as_bytes()).await);
        assert!(
            header(&h, "content-type")
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
    }

    #[tokio::test]
    async fn head_answers_the_headers_only() {
        let (status, h, body) = parse(&exchange(b"HEAD /metrics HTTP/1.1\r\n\r\n").await);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(
            header(&h, "content-length"),
            Some(&*METRICS.len().to_string())
        );
        assert_eq!(body, "");
    }

    #[tokio::test]
    async fn other_paths_methods_and_garbage_are_refused() {
        let cases: [(&[u8], &str); 9] = [
            (b"GET / HTTP/1.1\r\n\r\n", "404 Not Found"),
            (b"GET /metrics/ HTTP/1.1\r\n\r\n", "404 Not Found"),
            (b"GET /status.json HTTP/1.0\r\n\r\n", "404 Not Found"),
            (
                b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
                "405 Method Not Allowed",
            ),
            (b"DELETE / HTTP/1.1\r\n\r\n", "405 Method Not Allowed"),
            (b"GET /metrics\r\n\r\n", "400 Bad Request"),
            (b"GET /metrics HTTP/2.0\r\n\r\n", "400 Bad Request"),
            (b"GET  /metrics HTTP/1.1\r\n\r\n", "400 Bad Request"),
            (
                b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
                "400 Bad Request",
            ),
        ];
        for (req, want) in cases {
            let out = exchange(req).await;
            let (status, h, body) = parse(&out);
            assert!(
                status.ends_with(want),
                "{:?}: {status}",
                String::from_utf8_lossy(req)
            );
            assert!(!body.contains("vgpu_license"), "{body}");
            if want.starts_with("405") {
                assert_eq!(header(&h, "allow"), Some("GET, HEAD"));
            }
        }
    }

    #[tokio::test]
    async fn a_request_in_pieces_is_answered_once_whole() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let (_, rx) = watch::channel(METRICS.to_string());
        let asked = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(serve_connection(server, rx, asked.clone(), READ_DEADLINE));
        for piece in [
            &b"GET /met"[..],
            b"rics HTTP/1.1\r\nHo",
            b"st: x\r\n",
            b"\r\n",
        ] {
            assert!(
                !asked.load(Ordering::Relaxed),
                "asked before the head ended"
            );
            client.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        task.await.unwrap();
        assert!(asked.load(Ordering::Relaxed));
        let (status, _, body) = parse(&out);
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert_eq!(body, METRICS);
    }

    #[tokio::test]
    async fn an_oversized_request_gets_431() {
        let mut req = b"GET /metrics HTTP/1.1\r\n".to_vec();
        while req.len() <= MAX_REQUEST_BYTES + 100 {
            req.extend_from_slice(
                b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        req.extend_from_slice(b"\r\n");
        let (status, _, _) = parse(&exchange(&req).await);
        assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
        // Never ending, no empty line: the cap, not the deadline, ends it.
        let endless = [
            &b"GET /metrics HTTP/1.1\r\nX: "[..],
            &[b'a'; MAX_REQUEST_BYTES * 2],
        ]
        .concat();
        let (status, _, _) = parse(&exchange(&endless).await);
        assert_eq!(status, "HTTP/1.1 431 Request Header Fields Too Large");
    }

    #[tokio::test]
    async fn a_request_that_never_ends_is_closed_at_the_deadline() {
        let deadline = Duration::from_millis(200);
        let started = tokio::time::Instant::now();
        let out = exchange_within(b"GET /metrics HTTP/1.1\r\n".to_vec(), false, deadline).await;
        assert!(started.elapsed() >= deadline);
        assert!(!String::from_utf8_lossy(&out).contains("200 OK"), "{out:?}");
    }

    #[tokio::test]
    async fn a_client_gone_before_its_request_ended_gets_nothing() {
        let out = exchange_within(b"GET /metr".to_vec(), true, READ_DEADLINE).await;
        assert!(out.is_empty(), "{out:?}");
    }

    /// `nc -N`, say: the request, then the sending side closed; the answer still comes.
    #[tokio::test]
    async fn a_client_that_closed_its_side_after_asking_gets_the_answer() {
        let out = exchange_within(
            b"GET /metrics HTTP/1.0\r\n\r\n".to_vec(),
            true,
            READ_DEADLINE,
        )
        .await;
        let (status, _, body) = parse(&out);
        assert_eq!(status, "HTTP/1.0 200 OK");
        assert_eq!(body, METRICS);
    }

    /// Past the cap, the oldest connection that has not asked yet makes room; when every
    /// open one has asked, the new one is refused.
    #[tokio::test]
    async fn past_the_cap_the_oldest_idle_connection_makes_room() {
        let slots = Slots::new(3);
        let pending = |slot: Slot| {
            tokio::spawn(async move {
                let _slot = slot;
                std::future::pending::<()>().await
            })
        };
        let mut flags = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let admitted = slots.admit(|asked, slot| {
                flags.push(asked);
                let t = pending(slot);
                tasks.push(t.abort_handle());
                t
            });
            assert_eq!(admitted, Admitted::Room);
        }
        assert_eq!(slots.len(), 3);
        // The first has asked: the second, the oldest idle one, is closed for the fourth.
        flags[0].store(true, Ordering::Relaxed);
        let mut fourth = None;
        let admitted = slots.admit(|asked, slot| {
            fourth = Some(asked);
            pending(slot)
        });
        assert_eq!(admitted, Admitted::Evicted);
        assert_eq!(slots.len(), 3);
        tokio::task::yield_now().await;
        assert!(tasks[1].is_finished());
        assert!(!tasks[0].is_finished() && !tasks[2].is_finished());
        // All asked: no room, and the new one is not started.
        flags[2].store(true, Ordering::Relaxed);
        fourth.unwrap().store(true, Ordering::Relaxed);
        let mut started = false;
        let admitted = slots.admit(|_, slot| {
            started = true;
            pending(slot)
        });
        assert_eq!(admitted, Admitted::Refused);
        assert!(!started);
        // A connection that ends frees its slot.
        tasks[2].abort();
        tokio::task::yield_now().await;
        assert_eq!(slots.len(), 2);
    }

    #[test]
    fn the_cap_is_well_under_the_descriptor_limit() {
        let cap = connection_cap();
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert!((1..=MAX_CONNECTIONS).contains(&cap), "{cap}");
        assert!(cap as u64 <= soft.max(4) / 4, "{cap} of {soft}");
    }

    #[tokio::test]
    async fn only_a_socket_is_replaced_at_the_socket_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.sock");
        drop(bind_socket(&path).unwrap());
        // The socket of an earlier run: replaced.
        assert!(bind_socket(&path).is_ok());
        // An operator's file: kept, and refused by name.
        let file = dir.path().join("notes.txt");
        std::fs::write(&file, b"keep me").unwrap();
        let e = bind_socket(&file).unwrap_err();
        assert!(
            e.contains("service.metrics_socket") && e.contains("not a socket"),
            "{e}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    }

    #[tokio::test]
    async fn a_port_alone_listens_on_every_address() {
        let l = bind_tcp(Listen::Any(0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            loop {
                let _ = l.accept().await;
            }
        });
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        if std::net::TcpListener::bind("[::1]:0").is_ok() {
            tokio::net::TcpStream::connect(("::1", port)).await.unwrap();
        }
        task.abort();
    }
}
