//! The metrics over HTTP (`metrics_socket`, `metrics_listen`): one request per connection,
//! answered and closed, as Prometheus, vmagent and `curl` expect of an exporter.
//!
//! `GET /metrics` (or `HEAD`) answers the current metrics in the Prometheus text format, or
//! as OpenMetrics 1.0 when the `Accept` header prefers `application/openmetrics-text` (as
//! Prometheus's own scraper does). Any other path is 404, any other method 405. The request
//! head is read up to [`MAX_REQUEST_BYTES`] and within [`READ_DEADLINE`]: a client that sends
//! more, or too slowly, gets 431 or 408 and the connection is closed, so that nothing on the
//! pod network can hold the agent's memory or its tasks.
//!
//! What to answer is decided by [`respond`], a pure function of the bytes received; [`answer`]
//! only moves bytes.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::metrics::{OPENMETRICS_CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE, openmetrics};

/// The request head (request line and headers) may be this long; a scraper's is a few
/// hundred bytes.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// The whole request head must arrive within this (Prometheus's default scrape timeout is
/// 10 s; its request is sent at once).
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// The answer must be taken within this, or the connection is dropped.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// The path the metrics are served at.
pub const METRICS_PATH: &str = "/metrics";

/// The length of the request head in `buf` (through the empty line that ends it), once it
/// has arrived. Bare `\n` line ends are accepted, as most servers do.
pub fn head_len(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(p) = buf[i..].iter().position(|&b| b == b'\n') {
        let end = i + p + 1;
        let rest = &buf[end..];
        if rest.starts_with(b"\r\n") {
            return Some(end + 2);
        }
        if rest.starts_with(b"\n") {
            return Some(end + 1);
        }
        i = end;
    }
    None
}

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
            .map(|(_, v)| v.as_str());
        let q = quality(&params);
        match media.as_str() {
            "application/openmetrics-text" => {
                if matches!(version, None | Some("1.0.0") | Some("0.0.1")) {
                    better(&mut om, 3, q);
                }
            }
            "text/plain" => {
                if matches!(version, None | Some("0.0.4")) {
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

/// A whole answer: status line, headers, body. HTTP/1.0 with `Connection: close`: one
/// request per connection, nothing kept open.
fn response(
    status: &str,
    content_type: &str,
    extra: &str,
    body: &[u8],
    head_only: bool,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

fn error(status: &str, extra: &str, head_only: bool) -> Vec<u8> {
    let body = format!("{status}\n");
    response(
        status,
        "text/plain; charset=utf-8",
        extra,
        body.as_bytes(),
        head_only,
    )
}

/// The answer to a request that did not arrive whole within [`READ_DEADLINE`].
pub fn timed_out() -> Vec<u8> {
    error("408 Request Timeout", "", false)
}

/// The answer to a request head longer than [`MAX_REQUEST_BYTES`].
pub fn too_large() -> Vec<u8> {
    error("431 Request Header Fields Too Large", "", false)
}

/// The answer to `request` (a whole request head, as [`head_len`] measures it; a body, which
/// no method served here has, is ignored) with `metrics`, the text [`super::metrics::render`]
/// wrote.
pub fn respond(request: &[u8], metrics: &str) -> Vec<u8> {
    let bad = || error("400 Bad Request", "", false);
    let Ok(head) = std::str::from_utf8(request) else {
        return bad();
    };
    let mut lines = head.lines();
    let Some(request_line) = lines.next() else {
        return bad();
    };
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad();
    };
    if !matches!(version, "HTTP/1.0" | "HTTP/1.1") || method.is_empty() {
        return bad();
    }
    let mut accept: Option<String> = None;
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return bad();
        };
        if name.trim().eq_ignore_ascii_case("accept") {
            // Several Accept fields are one list (RFC 9110 5.3).
            let value = value.trim();
            accept = Some(match accept {
                Some(a) => format!("{a}, {value}"),
                None => value.to_string(),
            });
        }
    }
    let head_only = method == "HEAD";
    // An absolute-form target (`GET http://host/metrics`) is accepted too, as servers must.
    let path = target
        .strip_prefix("http://")
        .map_or(target, |rest| rest.find('/').map_or("/", |i| &rest[i..]));
    let path = path.split(['?', '#']).next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return error("405 Method Not Allowed", "Allow: GET, HEAD\r\n", head_only);
    }
    if path != METRICS_PATH {
        return error("404 Not Found", "", head_only);
    }
    match negotiate(accept.as_deref()) {
        Format::Prometheus => response(
            "200 OK",
            PROMETHEUS_CONTENT_TYPE,
            "",
            metrics.as_bytes(),
            head_only,
        ),
        Format::OpenMetrics => response(
            "200 OK",
            OPENMETRICS_CONTENT_TYPE,
            "",
            openmetrics(metrics).as_bytes(),
            head_only,
        ),
    }
}

/// Serves one connection: reads the request head (bounded in size and time), writes
/// [`respond`]'s answer, closes.
pub async fn answer<S: AsyncRead + AsyncWrite + Unpin>(conn: S, metrics: &str) {
    answer_within(conn, metrics, READ_DEADLINE).await;
}

async fn answer_within<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    metrics: &str,
    read_deadline: Duration,
) {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(n) = head_len(&buf) {
                return Ok(n);
            }
            if buf.len() > MAX_REQUEST_BYTES {
                return Err(too_large());
            }
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return Err(Vec::new()),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let answer = match tokio::time::timeout(read_deadline, read).await {
        Ok(Ok(n)) if n <= MAX_REQUEST_BYTES => respond(&buf[..n], metrics),
        Ok(Ok(_)) => too_large(),
        // The client went away: nobody to answer.
        Ok(Err(a)) if a.is_empty() => return,
        Ok(Err(a)) => a,
        Err(_) => timed_out(),
    };
    let _ = tokio::time::timeout(WRITE_DEADLINE, async {
        conn.write_all(&answer).await?;
        conn.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn get_metrics_answers_the_text_format_by_default() {
        for req in [
            "GET /metrics HTTP/1.0\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: 10.0.0.7:9841\r\nUser-Agent: curl/8\r\nAccept: */*\r\n\r\n",
            "GET /metrics?x=1 HTTP/1.1\nHost: a\n\n",
            "GET http://10.0.0.7:9841/metrics HTTP/1.1\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nAccept: application/json\r\n\r\n",
        ] {
            let (status, h, body) = parse(&respond(req.as_bytes(), METRICS));
            assert_eq!(status, "HTTP/1.0 200 OK", "{req:?}");
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

    #[test]
    fn openmetrics_when_the_scraper_prefers_it() {
        // Prometheus 2.x's scrape request.
        let prometheus = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9841\r\nUser-Agent: Prometheus/2.42.0\r\nAccept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\nAccept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n";
        let (status, h, body) = parse(&respond(prometheus.as_bytes(), METRICS));
        assert_eq!(status, "HTTP/1.0 200 OK");
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

    #[test]
    fn several_accept_fields_are_one_list() {
        let req = "GET /metrics HTTP/1.1\r\naccept: text/plain;q=0.2\r\nACCEPT: application/openmetrics-text\r\n\r\n";
        let (_, h, _) = parse(&respond(req.as_bytes(), METRICS));
        assert!(
            header(&h, "content-type")
                .unwrap()
                .starts_with("application/openmetrics-text")
        );
    }

    #[test]
    fn head_answers_the_headers_only() {
        let answer = respond(b"HEAD /metrics HTTP/1.1\r\n\r\n", METRICS);
        let (status, h, body) = parse(&answer);
        assert_eq!(status, "HTTP/1.0 200 OK");
        assert_eq!(
            header(&h, "content-length"),
            Some(&*METRICS.len().to_string())
        );
        assert_eq!(body, "");
    }

    #[test]
    fn other_paths_methods_and_garbage_are_refused() {
        let cases: [(&[u8], &str); 10] = [
            (b"GET / HTTP/1.1\r\n\r\n", "HTTP/1.0 404 Not Found"),
            (b"GET /metrics/ HTTP/1.1\r\n\r\n", "HTTP/1.0 404 Not Found"),
            (
                b"GET /status.json HTTP/1.0\r\n\r\n",
                "HTTP/1.0 404 Not Found",
            ),
            (
                b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
                "HTTP/1.0 405 Method Not Allowed",
            ),
            (
                b"DELETE / HTTP/1.1\r\n\r\n",
                "HTTP/1.0 405 Method Not Allowed",
            ),
            (b"GET /metrics\r\n\r\n", "HTTP/1.0 400 Bad Request"),
            (b"GET /metrics HTTP/2.0\r\n\r\n", "HTTP/1.0 400 Bad Request"),
            (
                b"GET  /metrics HTTP/1.1\r\n\r\n",
                "HTTP/1.0 400 Bad Request",
            ),
            (
                b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
                "HTTP/1.0 400 Bad Request",
            ),
            (
                b"GET /metrics HTTP/1.1\r\nX: \xff\r\n\r\n",
                "HTTP/1.0 400 Bad Request",
            ),
        ];
        for (req, want) in cases {
            let (status, h, body) = parse(&respond(req, METRICS));
            assert_eq!(status, want, "{:?}", String::from_utf8_lossy(req));
            assert!(!body.contains("vgpu_license"), "{body}");
            if want.contains("405") {
                assert_eq!(header(&h, "allow"), Some("GET, HEAD"));
            }
        }
    }

    #[test]
    fn head_len_finds_the_empty_line() {
        assert_eq!(head_len(b""), None);
        assert_eq!(head_len(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None);
        assert_eq!(head_len(b"GET / HTTP/1.0\r\n\r\n"), Some(18));
        assert_eq!(head_len(b"GET / HTTP/1.0\n\nbody"), Some(16));
        assert_eq!(head_len(b"GET / HTTP/1.0\r\nA: b\r\n\r\nbody"), Some(24));
    }

    async fn exchange(request: Vec<u8>, close_after: bool) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let task = tokio::spawn(async move { answer(server, METRICS).await });
        client.write_all(&request).await.unwrap();
        if close_after {
            client.shutdown().await.unwrap();
        }
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        task.await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_request_in_pieces_is_answered_once_whole() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let task = tokio::spawn(async move { answer(server, METRICS).await });
        for piece in [
            &b"GET /met"[..],
            b"rics HTTP/1.1\r\nHo",
            b"st: x\r\n",
            b"\r\n",
        ] {
            client.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        task.await.unwrap();
        let (status, _, body) = parse(&out);
        assert_eq!(status, "HTTP/1.0 200 OK");
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
        let (status, _, _) = parse(&exchange(req, false).await);
        assert_eq!(status, "HTTP/1.0 431 Request Header Fields Too Large");
        // Never ending, no empty line: the cap, not the deadline, ends it.
        let endless = vec![b'a'; MAX_REQUEST_BYTES * 2];
        let (status, _, _) = parse(&exchange(endless, false).await);
        assert_eq!(status, "HTTP/1.0 431 Request Header Fields Too Large");
    }

    #[tokio::test]
    async fn a_request_that_never_ends_gets_408_at_the_deadline() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let deadline = Duration::from_millis(200);
        let task = tokio::spawn(async move { answer_within(server, METRICS, deadline).await });
        let started = std::time::Instant::now();
        client
            .write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        assert!(started.elapsed() >= deadline);
        task.await.unwrap();
        let (status, _, _) = parse(&out);
        assert_eq!(status, "HTTP/1.0 408 Request Timeout");
    }

    #[tokio::test]
    async fn a_client_gone_before_its_request_ended_gets_nothing() {
        assert!(exchange(b"GET /metr".to_vec(), true).await.is_empty());
    }
}
