//! A forward proxy for the simulated machine, as a corporate proxy in front of NVIDIA's Cloud
//! License Service is to a guest: HTTP `CONNECT` only, to the targets it is given (each
//! tunnelled to a local address: the fake DLS), and a `403 Forbidden` to anything else or
//! while it is set to refuse. It records every request it was asked (`CONNECT target STATUS`),
//! so that a test can tell that gridd and the agent went through it, and where they asked to
//! go. Nothing it tunnels leaves the loopback.

#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Inner {
    /// `host:port` a client may ask for, and the local address that stands for it.
    routes: Vec<(String, SocketAddr)>,
    refusing: AtomicBool,
    stop: AtomicBool,
    requests: Mutex<Vec<String>>,
}

pub struct ConnectProxy {
    addr: SocketAddr,
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConnectProxy {
    /// Starts one on a free loopback port that tunnels each `(target, to)` of `routes`:
    /// `CONNECT target` opens a tunnel to `to`.
    pub fn start(routes: &[(&str, SocketAddr)]) -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let inner = Arc::new(Inner {
            routes: routes.iter().map(|(t, a)| (t.to_string(), *a)).collect(),
            refusing: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            requests: Mutex::new(Vec::new()),
        });
        let i = inner.clone();
        let thread = std::thread::spawn(move || accept_loop(listener, i));
        ConnectProxy {
            addr,
            inner,
            thread: Some(thread),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Refuses every `CONNECT` with `403 Forbidden` (its access rules), or lets them through.
    pub fn set_refusing(&self, refusing: bool) {
        self.inner.refusing.store(refusing, Ordering::SeqCst);
    }

    /// `METHOD TARGET STATUS` of the requests answered so far.
    pub fn requests(&self) -> Vec<String> {
        self.inner.requests.lock().unwrap().clone()
    }
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, inner: Arc<Inner>) {
    let _ = listener.set_nonblocking(true);
    while !inner.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let i = inner.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &i);
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The request head, byte by byte (nothing after it is taken: the client's TLS follows).
fn read_head(stream: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || stream.read(&mut byte)? == 0 {
            return Err(io::Error::other("no whole request head"));
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn serve(mut client: TcpStream, inner: &Inner) -> io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(5)))?;
    client.set_write_timeout(Some(Duration::from_secs(5)))?;
    let head = read_head(&mut client)?;
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    );
    let route = inner
        .routes
        .iter()
        .find(|(t, _)| *t == target)
        .map(|(_, a)| *a);
    let upstream = match route {
        _ if method != "CONNECT" => Err((405, "Method Not Allowed")),
        _ if inner.refusing.load(Ordering::SeqCst) => Err((403, "Forbidden")),
        None => Err((403, "Forbidden")),
        Some(a) => {
            TcpStream::connect_timeout(&a, Duration::from_secs(3)).map_err(|_| (502, "Bad Gateway"))
        }
    };
    let status = match &upstream {
        Ok(_) => 200,
        Err((code, _)) => *code,
    };
    inner
        .requests
        .lock()
        .unwrap()
        .push(format!("{method} {target} {status}"));
    let upstream = match upstream {
        Ok(u) => u,
        Err((code, why)) => {
            write!(
                client,
                "HTTP/1.1 {code} {why}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )?;
            client.flush()?;
            let _ = client.shutdown(Shutdown::Write);
            return Ok(());
        }
    };
    client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    // Both ways until either side is done.
    let (mut c2, mut u2) = (client.try_clone()?, upstream.try_clone()?);
    let (mut c1, mut u1) = (client, upstream);
    let up = std::thread::spawn(move || {
        let _ = io::copy(&mut c2, &mut u2);
        let _ = u2.shutdown(Shutdown::Write);
    });
    let _ = io::copy(&mut u1, &mut c1);
    let _ = c1.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}
