//! The HTTPS step: one `GET /` over the TLS connection and the response head it reads (the
//! status and the `Date` that measures the clock skew).

use super::*;

/// Sends `GET /` and reads the response head (status line and headers).
pub(super) fn get_head(
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
        let eof = take_plaintext(conn, &mut head, &mut buf)?;
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

/// Appends to `head` what the connection has decrypted so far; whether the stream ended.
fn take_plaintext(
    conn: &mut ClientConnection,
    head: &mut Vec<u8>,
    buf: &mut [u8],
) -> io::Result<bool> {
    loop {
        match conn.reader().read(buf) {
            Ok(0) => return Ok(true),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            // Closed without close_notify: what was read still counts.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(true),
            Err(e) => return Err(e),
        }
    }
}

pub(super) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The status code and the `Date` header of a response head.
pub(super) fn parse_head(head: &[u8]) -> Result<(u16, String, Option<String>), String> {
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
pub(super) fn parse_http_date(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc2822(s).ok().map(|t| t.to_utc())
}
