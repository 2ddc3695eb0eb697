//! The metrics listener (`metrics_listen`, `metrics_socket`) of the real agent, run against
//! the simulator (`tests/common/sim.rs`) under the descriptor limit of its systemd unit, with
//! thousands of connections that never ask and hundreds that never read their answer: the
//! scrapes still answer, the rest of the agent (nvidia-smi, the journal follower, status.json)
//! keeps working, descriptors and memory stay bounded, and when descriptors do run out, the
//! listener comes back by itself. And the URL and address rules the agent's config is judged
//! by at load.
//!
//!     cargo test --test metrics_server
//!
//! Every wait polls with a generous deadline; nothing is timed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::common::sim::{Agent, Machine, Setup, has_event, wait_for, write_gridd_conf};
use vgpu_license_model::config::Settings;

/// Deadline of anything the agent must do.
const T: Duration = Duration::from_secs(60);

const UNIT: &str = include_str!("../packaging/vgpu-license-agent.service");

/// The connections scrapers may hold open at most, both listeners together (the agent's cap
/// under the unit's limit).
const CAP: usize = 64;

/// `LimitNOFILE=` of the packaged unit.
fn unit_nofile() -> u64 {
    UNIT.lines()
        .find_map(|l| l.strip_prefix("LimitNOFILE="))
        .expect("the unit sets LimitNOFILE=")
        .trim()
        .parse()
        .expect("LimitNOFILE= is a number")
}

/// `pid`'s descriptor limit: (soft, hard).
fn nofile(pid: u32) -> (u64, u64) {
    let mut old = nix::libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reads the limit into `old`, sets nothing.
    let r = unsafe {
        nix::libc::prlimit(
            pid as i32,
            nix::libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &mut old,
        )
    };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    (old.rlim_cur, old.rlim_max)
}

/// Sets `pid`'s descriptor limit, as systemd's `LimitNOFILE=` would have.
fn set_nofile(pid: u32, soft: u64, hard: u64) {
    let new = nix::libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `new` is a valid rlimit; the old one is not asked for.
    let r = unsafe {
        nix::libc::prlimit(
            pid as i32,
            nix::libc::RLIMIT_NOFILE,
            &new,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// The descriptors `pid` holds open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// `pid`'s resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Lets this test process hold the many client connections of the load.
fn raise_own_nofile(need: u64) {
    let (soft, hard) = nofile(std::process::id());
    assert!(
        hard >= need,
        "this test opens {need} connections, and the hard descriptor limit is {hard}: raise it (ulimit -Hn {need})"
    );
    if soft < need {
        set_nofile(std::process::id(), hard, hard);
    }
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of a 200 to `GET /metrics` over `conn`; `None` on any failure.
fn scrape_over(mut conn: impl Read + Write) -> Option<String> {
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nUser-Agent: test\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200 ").then(|| body.to_string())
}

fn scrape_tcp(addr: SocketAddr) -> Option<String> {
    let conn = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    scrape_over(conn)
}

fn scrape_unix(path: &Path) -> Option<String> {
    let conn = UnixStream::connect(path).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    scrape_over(conn)
}

/// Scrapes over TCP until the metrics say licensed.
fn wait_scrape(what: &str, addr: SocketAddr, a: &Agent) -> String {
    wait_for(
        what,
        T,
        || scrape_tcp(addr).filter(|b| b.contains("vgpu_license_licensed 1\n")),
        || a.context(),
    )
}

/// The machine licensed, the agent serving its metrics on a loopback port and a socket,
/// settled on a licensed gridd.
fn licensed_with_listener() -> (Machine, Agent, SocketAddr, std::path::PathBuf) {
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let m = Machine::new(Setup::default());
    // In the machine's temporary root.
    let socket = m.path("metrics.sock");
    let config = m.config_text();
    m.write_config(&format!(
        "{config}metrics_listen = \"{addr}\"\nmetrics_socket = \"{}\"\n",
        socket.display()
    ));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    crate::service::settle(&m, &a);
    (m, a, addr, socket)
}

/// The agent's log so far: its journal entries and its standard error.
fn agent_log(a: &Agent) -> String {
    format!("{}\n{}", a.journal_lines().join("\n"), a.logs())
}

/// 2,000 connections that never send a request and 200 that never read the answer, at the
/// unit's descriptor limit: the scrapes over TCP and over the socket still answer, nvidia-smi
/// still runs (a change of the GPU's profile reaches status.json), the journal is still
/// followed (a crashed gridd is noticed and restarted), the agent's descriptors and memory
/// stay bounded; once the load is gone, the listener answers as before.
#[test]
fn the_listener_under_thousands_of_idle_connections_starves_nothing() {
    let (m, a, addr, socket) = licensed_with_listener();
    let limit = unit_nofile();
    set_nofile(a.pid(), limit, limit);
    let v = a.wait_state("licensed", T);
    let old_gridd = m.gridd_pid().expect("a gridd runs");
    wait_for(
        "the gridd's start in the events",
        T,
        || {
            a.status()
                .filter(|v| has_event(v, &format!("Started ({old_gridd})")))
        },
        || a.context(),
    );
    assert_eq!(v["gpus"][0]["profile"], "NVIDIA L40S-24Q");
    wait_scrape("a first scrape", addr, &a);
    let base_fds = open_fds(a.pid());
    let base_rss = rss_kib(a.pid());
    assert!(base_fds > 0 && base_rss > 0);

    const IDLE: usize = 2000;
    const NO_READ: usize = 200;
    raise_own_nofile((IDLE + NO_READ + 256) as u64);
    let mut held: Vec<TcpStream> = Vec::with_capacity(IDLE + NO_READ);
    let (mut max_fds, mut max_rss) = (base_fds, base_rss);
    let sample = |max_fds: &mut usize, max_rss: &mut u64| {
        *max_fds = (*max_fds).max(open_fds(a.pid()));
        *max_rss = (*max_rss).max(rss_kib(a.pid()));
    };
    for i in 0..IDLE + NO_READ {
        let conn = TcpStream::connect_timeout(&addr, T)
            .unwrap_or_else(|e| panic!("connection {i}: {e}\n{}", a.context()));
        if i >= IDLE {
            // Asks, and never reads the answer.
            let _ = (&conn).write_all(b"GET /metrics HTTP/1.1\r\nHost: agent\r\n\r\n");
        }
        held.push(conn);
        if i % 50 == 0 {
            sample(&mut max_fds, &mut max_rss);
        }
    }

    // With every connection still held: scrapes answer, over TCP and over the socket.
    let body = wait_scrape("a scrape among the idle connections", addr, &a);
    assert!(
        body.contains("vgpu_license_state{state=\"licensed\"} 1\n"),
        "{body}"
    );
    let body = wait_for(
        "a scrape over the socket among the idle connections",
        T,
        || scrape_unix(&socket).filter(|b| b.contains("vgpu_license_licensed 1\n")),
        || a.context(),
    );
    assert_eq!(body, a.metrics(), "socket and textfile differ");
    sample(&mut max_fds, &mut max_rss);

    // nvidia-smi still starts: what it reports reaches status.json.
    m.update_sim(|s| s.profile = "NVIDIA L40S-12Q".into());
    a.wait_status("the new profile from nvidia-smi", T, |v| {
        v["gpus"][0]["profile"] == "NVIDIA L40S-12Q"
    });
    sample(&mut max_fds, &mut max_rss);
    // The journal is still followed and gridd still restarted.
    let crashed = m.crash_gridd();
    let new = wait_for(
        "a new gridd after the crash",
        T,
        || m.gridd_pid().filter(|p| *p != crashed),
        || a.context(),
    );
    a.wait_status("the new gridd's start in the events", T, |v| {
        has_event(v, &format!("Started ({new})")) && v["state"] == "licensed"
    });
    sample(&mut max_fds, &mut max_rss);

    // Bounded: the connections the cap allows over what the agent holds
    // anyway (a scrape, nvidia-smi's pipes and a restart in flight included), and well under
    // the limit; memory of the same order as before the load.
    assert!(
        max_fds <= base_fds + CAP + 16,
        "the agent held {max_fds} descriptors under the load, {base_fds} before it"
    );
    assert!(max_fds < (limit / 2) as usize, "{max_fds} of {limit}");
    assert!(
        max_rss <= base_rss + 16 * 1024,
        "resident memory {max_rss} KiB under the load, {base_rss} KiB before it"
    );

    eprintln!(
        "under the load: at most {max_fds} descriptors ({base_fds} before), {max_rss} KiB resident ({base_rss} KiB before)"
    );

    // The load gone, the listener answers as before, and holds no more than before.
    drop(held);
    wait_scrape("a scrape after the load", addr, &a);
    wait_for(
        "the agent's descriptors back to what it held before the load",
        T,
        || (open_fds(a.pid()) <= base_fds + 8).then_some(()),
        || format!("{} descriptors\n{}", open_fds(a.pid()), a.context()),
    );
    assert!(
        !agent_log(&a).contains("cannot accept"),
        "the cap kept descriptors free: no accept failed\n{}",
        a.context()
    );
}

/// When descriptors run out all the same (a limit just above what the agent holds), a failed
/// accept ends nothing: it is logged once, and the listener accepts again by itself once the
/// idle connections are closed, which is logged too.
#[test]
fn the_listener_comes_back_by_itself_when_descriptors_ran_out() {
    let (_m, a, addr, socket) = licensed_with_listener();
    a.wait_state("licensed", T);
    wait_scrape("a first scrape", addr, &a);
    let (soft, hard) = nofile(a.pid());
    // A few descriptors to spare, fewer than the connections below.
    let tight = open_fds(a.pid()) as u64 + 4;
    set_nofile(a.pid(), tight, hard);

    let mut held = Vec::new();
    for i in 0..32 {
        held.push(
            TcpStream::connect_timeout(&addr, T)
                .unwrap_or_else(|e| panic!("connection {i}: {e}\n{}", a.context())),
        );
    }
    wait_for(
        "the failed accept in the agent's log",
        T,
        || {
            agent_log(&a)
                .contains("cannot accept a connection")
                .then_some(())
        },
        || a.context(),
    );
    // The idle connections close; the limit stays as tight.
    drop(held);
    let body = wait_scrape("a scrape once the idle connections closed", addr, &a);
    assert!(body.contains("vgpu_license_licensed 1\n"), "{body}");
    assert!(
        scrape_unix(&socket).is_some(),
        "the socket answers too\n{}",
        a.context()
    );
    let log = wait_for(
        "the recovery in the agent's log",
        T,
        || {
            let log = agent_log(&a);
            log.contains("accepting connections again").then_some(log)
        },
        || a.context(),
    );
    assert_eq!(
        log.matches("cannot accept a connection").count(),
        1,
        "logged once\n{log}"
    );
    assert_eq!(
        log.matches("accepting connections again").count(),
        1,
        "{log}"
    );
    set_nofile(a.pid(), soft, hard);
}

/// An operator's file where the socket is to be is left as it is, and the refusal names
/// the key.
#[test]
fn a_file_at_the_socket_path_is_kept_and_refused() {
    let m = Machine::new(Setup::default());
    let socket = m.path("metrics.sock");
    std::fs::write(&socket, b"an operator's notes\n").unwrap();
    let config = m.config_text();
    m.write_config(&format!(
        "{config}metrics_socket = \"{}\"\n",
        socket.display()
    ));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    wait_for(
        "the refusal in the agent's log",
        T,
        || {
            let log = agent_log(&a);
            (log.contains("service.metrics_socket") && log.contains("is not a socket"))
                .then_some(())
        },
        || a.context(),
    );
    assert_eq!(std::fs::read(&socket).unwrap(), b"an operator's notes\n");
}

/// `:PORT` is every address, as node_exporter's `:9100`: the agent answers on the loopback
/// through it.
#[test]
fn a_port_alone_serves_on_every_address() {
    let m = Machine::new(Setup::default());
    let port = free_port();
    let config = m.config_text();
    m.write_config(&format!("{config}metrics_listen = \":{port}\"\n"));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_state("licensed", T);
    wait_scrape("a scrape on 127.0.0.1", ([127, 0, 0, 1], port).into(), &a);
}

/// The webhook's URL is judged at load by its parsed host, as `--token-url` is: https, or
/// plain http only to the loopback.
#[test]
fn the_webhook_url_is_judged_by_its_parsed_host_at_load() {
    let load = |url: &str| {
        let mut s = Settings::default();
        s.apply_toml(&format!("[service]\nwebhook_url = \"{url}\"\n"))
    };
    for url in [
        "http://localhost@webhook.example.com/",
        "http://127.0.0.1.webhook.example.com/",
        "http://localhost.example.com/",
    ] {
        let e = load(url).unwrap_err();
        assert!(
            e.contains("service.webhook_url") && e.contains("https://"),
            "{url}: {e}"
        );
        assert!(!e.contains("example"), "the URL is not shown: {e}");
    }
    for url in [
        "http://127.0.0.1:9/",
        "http://localhost:8080/hook",
        "https://webhook.example.com/",
    ] {
        load(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    }
}

#[test]
fn metrics_listen_takes_a_port_alone() {
    let load = |v: &str| {
        let mut s = Settings::default();
        s.apply_toml(&format!("[service]\nmetrics_listen = \"{v}\"\n"))
    };
    for ok in [":9841", "0.0.0.0:9841", "[::]:9841", "127.0.0.1:9841"] {
        load(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in ["9841", ":", "localhost:9841", ":99999"] {
        let e = load(bad).unwrap_err();
        assert!(e.contains("service.metrics_listen"), "{bad}: {e}");
    }
}
