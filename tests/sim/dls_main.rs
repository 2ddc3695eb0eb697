//! The fake DLS as a program (for the boot test's guest, where it runs as a unit):
//!
//!     sim-dls [--listen ADDR] [--mode up|refusing|blackhole|bad_tls] [--skew SECONDS]
//!             [--control FILE]
//!     sim-dls [--token-id ID] --write-token HOST:PORT FILE
//!
//! `--write-token` writes a client configuration token (mode 0600) naming that DLS node, and
//! exits (a token is never printed); `--token-id` before it gives the token's id (`jti`), so
//! that a rotation's new token differs from the old (default `boot-test`).
//!
//! `--control FILE` is read every 200 ms while it runs: JSON `{"mode": "up", "skew_seconds": 0}`
//! (both optional), so the behaviour can change from outside. Default address
//! 127.0.0.1:443. Runs until killed.

#[path = "dls.rs"]
mod dls;

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

fn main() {
    let mut listen = "127.0.0.1:443".to_string();
    let mut mode = dls::Mode::Up;
    let mut skew = 0i64;
    let mut control: Option<PathBuf> = None;
    let mut token_id = "boot-test".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next().unwrap_or_else(|| {
                eprintln!("sim-dls: {a} needs a value");
                std::process::exit(2)
            })
        };
        match a.as_str() {
            "--listen" => listen = value(),
            "--mode" => {
                mode = dls::Mode::from_str(&value()).unwrap_or_else(|e| {
                    eprintln!("sim-dls: {e}");
                    std::process::exit(2)
                })
            }
            "--skew" => skew = value().parse().unwrap_or(0),
            "--control" => control = Some(value().into()),
            "--token-id" => token_id = value(),
            "--write-token" => {
                let node = value();
                let file = value();
                let (host, port) = node
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
                    .unwrap_or_else(|| {
                        eprintln!("sim-dls: --write-token HOST:PORT FILE");
                        std::process::exit(2)
                    });
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let written = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&file)
                    .and_then(|mut f| f.write_all(&dls::token_for(&host, port, &token_id)));
                if let Err(e) = written {
                    eprintln!("sim-dls: {file}: {e}");
                    std::process::exit(1);
                }
                return;
            }
            _ => {
                eprintln!(
                    "usage: sim-dls [--listen ADDR] [--mode MODE] [--skew SECONDS] [--control FILE] | [--token-id ID] --write-token HOST:PORT FILE"
                );
                std::process::exit(2);
            }
        }
    }
    let addr = listen.parse().unwrap_or_else(|e| {
        eprintln!("sim-dls: --listen {listen}: {e}");
        std::process::exit(2)
    });
    let server = dls::FakeDls::bind(addr).unwrap_or_else(|e| {
        eprintln!("sim-dls: cannot listen on {listen}: {e}");
        std::process::exit(1)
    });
    server.set_mode(mode);
    server.set_skew(skew);
    eprintln!("sim-dls: listening on {}", server.addr());
    loop {
        if let Some(c) = &control
            && let Ok(bytes) = std::fs::read(c)
            && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
        {
            if let Some(m) = v.get("mode").and_then(|m| m.as_str())
                && let Ok(m) = dls::Mode::from_str(m)
                && m != server.mode()
            {
                eprintln!("sim-dls: mode {m:?}");
                server.set_mode(m);
            }
            if let Some(s) = v.get("skew_seconds").and_then(|s| s.as_i64()) {
                server.set_skew(s);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
