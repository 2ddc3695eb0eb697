//! The DNS and TCP steps, and the proxy's `CONNECT` tunnel where gridd.conf names a proxy.

use super::*;

/// Why a proxy gave no tunnel.
pub(super) enum Tunnel {
    /// It answered with this status (code, `HTTP 403 Forbidden`).
    Refused(u16, String),
    /// It did not answer HTTP.
    Broken(String),
}

/// Asks the proxy on `sock` for a tunnel to `host:port` (HTTP `CONNECT`), by `deadline`.
/// Reads the proxy's head byte by byte, so nothing after it (the DLS's own bytes) is taken.
pub(super) fn tunnel(
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
    let head = connect_head(sock, request.as_bytes(), deadline)?;
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

/// Sends the CONNECT request and reads the head of the proxy's answer, a byte at a time:
/// what follows it is the tunnel's.
fn connect_head(
    sock: &mut TcpStream,
    request: &[u8],
    deadline: Instant,
) -> Result<Vec<u8>, Tunnel> {
    let left = || deadline.saturating_duration_since(Instant::now());
    let timeout = left();
    let broken = |e: io::Error| Tunnel::Broken(io_text(&e, timeout));
    sock.set_write_timeout(Some(left().max(Duration::from_millis(1))))
        .map_err(broken)?;
    sock.write_all(request).map_err(broken)?;
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
    Ok(head)
}

/// Resolves `host`, giving up after `timeout` (the lookup thread is left to finish alone).
pub(super) fn resolve(host: &str, port: u16, timeout: Duration) -> Result<Vec<SocketAddr>, String> {
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
pub(super) fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream, String> {
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
