//! End-to-end scenarios of `vgpu-license-agent run`: the real agent, the real journald and
//! journalctl, against the simulator of `tests/sim/` (a GPU with its nvidia-smi, an
//! nvidia-gridd that logs the real daemon's lines and talks TLS to a fake DLS on a loopback
//! port, a restart command that counts restarts). Faults done to the machine under the agent
//! are in `tests/service_faults.rs`.
//!
//! Every scenario is named `scenario_*`, so that they run on their own with
//!
//!     cargo test --test service scenario_
//!
//! (the simulator's programs are built on first use, with `cargo build -p vgpu-sim`).
//! They run one at a time (a file lock; see `tests/common/sim.rs`), as root where journald
//! must be started. Every check polls `status.json` (whole, valid JSON, valid against the
//! report's schema on every read) with a deadline; the few fixed waits are windows in which
//! something must NOT happen (no restart storm).

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::sim::{
    self, Agent, Machine, Mode, NetworkFailure, Setup, SmiMode, gridd_lines, has_event, reason,
    setup, wait_for, write_gridd_conf,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use vgpu_license_model::report::message_ids;

/// Deadline of a change the agent must make or report.
pub(crate) const T: Duration = Duration::from_secs(30);

/// Runs the restart command as the agent would (counted).
fn restart_gridd_by_hand(m: &Machine) -> i32 {
    let out = Command::new(sim::program("sim-restart-gridd"))
        .arg("--sim-dir")
        .arg(&m.sim)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// What the agent logged (its journal entries and its standard error), as text.
pub(crate) fn agent_says(m: &Machine, a: &Agent) -> String {
    let mut s: String = m
        .agent_journal(a.pid())
        .iter()
        .map(|e| sim::message(e) + "\n")
        .collect();
    s += &a.logs();
    s
}

/// The machine licensed, with the agent watching: the start of most scenarios. Returns
/// once the agent has settled: licensed, it has seen the gridd that runs, and every restart it
/// made (it may restart gridd once at its start, for a token it has not restarted it for) is
/// done and counted.
pub(crate) fn licensed(s: Setup) -> (Machine, Agent) {
    licensed_on(Machine::new(s))
}

/// As [`licensed`], with a restart grace longer than any acquisition on a loaded machine:
/// every restart of the agent's own is then for what the scenario does (a token, gridd not
/// running), never for a new gridd slow to get its lease.
pub(crate) fn licensed_patient() -> (Machine, Agent) {
    let m = Machine::new(Setup::default());
    m.set_config("restart_grace_seconds", "60");
    licensed_on(m)
}

fn licensed_on(m: Machine) -> (Machine, Agent) {
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    settle(&m, &a);
    (m, a)
}

pub(crate) fn settle(m: &Machine, a: &Agent) {
    wait_for(
        "the agent to settle on a licensed gridd",
        T,
        || {
            let pid = m.gridd_pid()?;
            let v = a.status()?;
            // Licensed as read after this gridd acquired its license: the state the report
            // kept from the gridd before a restart is not it.
            (v["state"] == "licensed"
                && !m.restarting()
                && sim::has_event_after(
                    &v,
                    &format!("Started ({pid})"),
                    "License acquired successfully",
                )
                && a.metric("vgpu_license_gridd_restarts_total") == Some(m.restarts() as f64))
            .then_some(())
        },
        || a.context(),
    );
}

/// Waits until a reading has marked the metrics textfile written now (a later mtime) while
/// it stayed the same file with the same bytes: unchanged metrics are not written again, and
/// a staleness alert on node-exporter's `node_textfile_mtime_seconds` still sees the agent
/// alive. Bytes that changed meanwhile (a late event) start the wait again.
fn textfile_marked_fresh_without_a_rewrite(m: &Machine, a: &Agent) {
    use std::os::unix::fs::MetadataExt;
    let look = || {
        let meta = std::fs::metadata(m.metrics_path()).ok()?;
        let bytes = std::fs::read(m.metrics_path()).ok()?;
        Some((meta.ino(), bytes, (meta.mtime(), meta.mtime_nsec())))
    };
    let mut first = look();
    wait_for(
        "a reading to mark the unchanged metrics textfile written now, without a rewrite",
        T,
        || {
            let now = look()?;
            match &first {
                Some((ino, bytes, at)) if (ino, bytes) == (&now.0, &now.1) => {
                    (now.2 > *at).then_some(())
                }
                _ => {
                    first = Some(now);
                    None
                }
            }
        },
        || a.context(),
    );
}

#[test]
fn scenario_happy_path() {
    let (m, a) = licensed(Setup::default());
    let v = a.wait_status("the acquisition in the events", T, |v| {
        has_event(v, "License acquired successfully")
    });
    assert_eq!(v["state"], "licensed");
    assert!(v["failure"].is_null(), "{v:#}");
    assert_eq!(v["license"]["edition"], "NVIDIA RTX Virtual Workstation");
    let expiry = v["license"]["expiry"].as_str().expect("an expiry");
    let expiry = chrono::DateTime::parse_from_rfc3339(expiry).unwrap();
    let lease = (expiry.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
    assert!((86000..=86400).contains(&lease), "{lease}");
    assert_eq!(v["gpus"][0]["profile"], "NVIDIA L40S-24Q");
    assert_eq!(v["gpus"][0]["virtualization_mode"], "VGPU");
    assert_eq!(
        v["dls"],
        serde_json::json!([{"host": "127.0.0.1", "port": m.dls.port()}])
    );

    // The metrics of the contract, from the same report.
    wait_for(
        "the metrics to say licensed",
        T,
        || (a.metric("vgpu_license_licensed") == Some(1.0)).then_some(()),
        || a.context(),
    );
    assert_eq!(
        a.metric("vgpu_license_state{state=\"licensed\"}"),
        Some(1.0)
    );
    assert_eq!(
        a.metric("vgpu_license_state{state=\"unlicensed\"}"),
        Some(0.0)
    );
    assert_eq!(
        a.metric("vgpu_license_expiry_timestamp_seconds"),
        Some(expiry.timestamp() as f64)
    );
    // A reading marks the textfile written (its mtime, which node-exporter exports and
    // staleness alerts read, moves) without writing the same bytes again: the same file.
    textfile_marked_fresh_without_a_rewrite(&m, &a);

    // Nothing to fix. The agent restarts gridd at most once at its start: for a token it has
    // not restarted gridd for yet, unless gridd already holds a license with it.
    assert!(m.restarts() <= 1, "{}", a.context());
    assert_eq!(
        a.metric("vgpu_license_gridd_restarts_total"),
        Some(m.restarts() as f64),
        "{}",
        a.context()
    );
    let before = m.restarts();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(m.restarts(), before, "no restart while licensed");
    assert_eq!(
        std::fs::metadata(m.status_path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
}

#[test]
fn scenario_token_dropped_with_the_wrong_mode() {
    // A gridd that does not notice a new token by itself: only a restart helps.
    let mut s = setup(|s| s.pickup_new_token = false);
    let (hook_url, hooks) = webhook_receiver();
    s.service_extra = format!("webhook_url = \"{hook_url}\"\n");
    let m = Machine::new(s);
    write_gridd_conf(&m);
    let first = m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("no token reported", T, |v| {
        v["state"] != "licensed" && reason(v) == Some("token_missing")
    });
    assert_eq!(v["state"], "unlicensed");
    assert_eq!(m.restarts(), 0, "no restart for a missing token");

    // cloud-init's write_files, with the wrong mode.
    m.drop_token(0o600);
    a.wait_state("licensed", T);
    assert_eq!(
        std::fs::metadata(m.token_path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o744
    );
    assert!(m.restarts() >= 1);
    assert_ne!(m.gridd_pid(), Some(first), "gridd was restarted");
    wait_for(
        "the restart in the metrics",
        T,
        || {
            a.metric("vgpu_license_gridd_restarts_total")
                .filter(|n| *n >= 1.0)
        },
        || a.context(),
    );
    // gridd's acquisition reaches the agent through the journal, which may come a moment
    // after nvidia-smi shows the license: then the missing token is cleared.
    a.wait_status("the missing token cleared", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    // The state change was POSTed to the webhook: the report itself.
    let deadline = Instant::now() + T;
    let posted = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let body = hooks
            .recv_timeout(left)
            .expect("a webhook POST of the licensed report");
        let r: Value = serde_json::from_slice(&body).expect("JSON");
        if r["state"] == "licensed" {
            break r;
        }
    };
    assert_eq!(posted["schema"], "vgpu-license-agent/report/v1");
}

/// A loopback HTTP server that answers 200 to every POST and hands over the bodies.
fn webhook_receiver() -> (String, std::sync::mpsc::Receiver<Vec<u8>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn);
            let mut length = 0usize;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_ok() {
                let _ = tx.send(body);
            }
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (url, rx)
}

/// The DLS down, then back, with gridd wording its network failure as `form` says (the real
/// wording is not known: see tests/sim/gridd_lines.rs).
fn dls_down_then_back(form: NetworkFailure) {
    // A gridd that does not retry by itself, like one started before the network.
    let m = Machine::new(setup(|s| {
        s.acquire_retry = false;
        s.network_failure = form;
    }));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.dls.set_mode(Mode::Refusing);
    m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("the DLS failure reported", T, |v| {
        matches!(reason(v), Some("dls_unreachable" | "unspecified"))
    });
    assert_ne!(v["state"], "licensed");
    if form == NetworkFailure::Full {
        // gridd's line says it (the agent's own probe may say it first, on a slow machine).
        let v = a.wait_status("gridd's failure line in the events", T, |v| {
            has_event(v, gridd_lines::ERROR_NETWORK)
        });
        assert_eq!(reason(&v), Some("dls_unreachable"), "{v:#}");
    }
    wait_for(
        "a restart of gridd",
        T,
        || (m.restarts() >= 1).then_some(()),
        || a.context(),
    );
    // The agent's own probe names the step that fails.
    a.wait_status("dls_unreachable from the probe", T, |v| {
        reason(v) == Some("dls_unreachable")
    });

    m.dls.set_mode(Mode::Up);
    // Licensed, and every restart the agent began before that done and counted.
    settle(&m, &a);
    let budget = 3;
    assert!(m.restarts() <= budget, "{} restarts", m.restarts());
    let after = m.restarts();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        m.restarts(),
        after,
        "no restart once licensed: {}",
        agent_says(&m, &a)
    );
    let v = a.status().unwrap();
    assert!(v["failure"].is_null(), "{v:#}");
}

#[test]
fn scenario_dls_down_then_back() {
    dls_down_then_back(NetworkFailure::Full);
}

#[test]
fn scenario_dls_down_then_back_with_the_bare_failure_line() {
    dls_down_then_back(NetworkFailure::Bare);
}

#[test]
fn scenario_clock_skew_is_reported_without_a_restart_storm() {
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.dls.set_skew(3600);
    m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("clock_skew", T, |v| reason(v) == Some("clock_skew"));
    assert_ne!(v["state"], "licensed");
    assert!(
        v["failure"]["advice"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    // Past the grace period and several backoffs: a restart cannot fix the clock.
    std::thread::sleep(Duration::from_secs(8));
    let v = a.status().unwrap();
    assert_eq!(reason(&v), Some("clock_skew"), "{v:#}");
    assert!(m.restarts() <= 1, "{} restarts: a storm", m.restarts());
    wait_for(
        "the failure counted in the metrics",
        T,
        || {
            a.metric("vgpu_license_failures_total{reason=\"clock_skew\"}")
                .filter(|n| *n >= 1.0)
        },
        || a.context(),
    );
    // In the journal with the catalog's ID, so that `journalctl -x` explains it.
    wait_for(
        "the clock_skew failure in the agent's journal",
        T,
        || {
            m.agent_journal(a.pid())
                .iter()
                .any(|e| e["MESSAGE_ID"] == message_ids::FAILURE_CLOCK_SKEW)
                .then_some(())
        },
        || a.context(),
    );
    // gridd named the skew; the agent's probe measures it (the gauge behind the alert).
    let skew = wait_for(
        "the skew measured in the metrics",
        T,
        || a.metric("vgpu_license_dls_clock_skew_seconds"),
        || a.context(),
    );
    assert!((skew + 3600.0).abs() < 10.0, "guest minus DLS: {skew}");
    // The clock is fixed (here: the DLS's): gridd's next try succeeds.
    m.dls.set_skew(0);
    a.wait_state("licensed", T);
}

#[test]
fn scenario_invalid_token_is_reported_without_a_restart() {
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    let mut bad = m.token();
    bad.truncate(bad.len() - 40);
    sim::write_mode(&m.token_path(), &bad, 0o744);
    let gridd = m.start_gridd();
    // The real gridd exits on it.
    wait_for(
        "gridd to exit on the bad token",
        T,
        || (!sim::shared::gridd_alive(gridd)).then_some(()),
        || m.gridd_log(),
    );
    let a = Agent::start(&m);
    let v = a.wait_status("token_invalid", T, |v| reason(v) == Some("token_invalid"));
    assert_ne!(v["state"], "licensed");
    std::thread::sleep(Duration::from_secs(6));
    let v = a.status().unwrap();
    assert_eq!(reason(&v), Some("token_invalid"), "{v:#}");
    assert_eq!(m.restarts(), 0, "a restart cannot fix the token");
    assert_eq!(std::fs::read(m.token_path()).unwrap(), bad, "left as it is");
}

#[test]
fn scenario_gridd_crash_is_noticed_and_gridd_restarted() {
    let (m, a) = licensed(Setup::default());
    let old = m.crash_gridd();
    let new = wait_for(
        "a new gridd after the crash",
        T,
        || m.gridd_pid().filter(|p| *p != old),
        || a.context(),
    );
    assert!(m.restarts() >= 1, "the agent restarted it");
    a.wait_status("the new gridd's start in the events", T, |v| {
        has_event(v, &format!("Started ({new})")) && v["state"] == "licensed"
    });
}

/// Each restart of gridd the agent makes is one line of its journal, with its catalog entry,
/// the command and the reason in it (and the reason as a field, for the catalog's text): the
/// restart for the token at start (an adoption's), and the restart after a crash (a
/// remedy's).
#[test]
fn scenario_one_restart_is_one_journal_line() {
    let (m, a) = licensed(Setup::default());
    let old = m.crash_gridd();
    wait_for(
        "a new gridd after the crash, licensed",
        T,
        || {
            let pid = m.gridd_pid().filter(|p| *p != old)?;
            let v = a.status()?;
            (v["state"] == "licensed" && has_event(&v, &format!("Started ({pid})"))).then_some(())
        },
        || a.context(),
    );
    // The agent's lines of its restarts (gridd's own lines are not in its journal).
    let restart_lines = || -> Vec<Value> {
        m.agent_journal(a.pid())
            .into_iter()
            .filter(|e| {
                let l = sim::message(e);
                l.contains("restart") && l.contains("nvidia-gridd") && !l.contains("not restarted")
            })
            .collect()
    };
    wait_for(
        "the line of the restart after the crash",
        T,
        || {
            restart_lines()
                .iter()
                .any(|e| {
                    e["MESSAGE_ID"] == message_ids::GRIDD_RESTARTED
                        && sim::message(e).contains("is not running")
                })
                .then_some(())
        },
        || format!("{:#?}", restart_lines()),
    );
    std::thread::sleep(Duration::from_secs(1));
    let said = restart_lines();
    let lines: Vec<String> = said.iter().map(sim::message).collect();
    // At most one line per restart (under load journald may take a line late, or drop it:
    // the count is a bound, each line's form is the point).
    assert!(
        said.len() <= m.restarts(),
        "one line per restart: {lines:#?}"
    );
    for e in &said {
        assert_eq!(e["MESSAGE_ID"], message_ids::GRIDD_RESTARTED, "{e:#}");
        let why = e["VGPU_LICENSE_REASON"].as_str().unwrap_or_default();
        assert!(!why.is_empty(), "the reason as a field: {e:#}");
        assert!(sim::message(e).contains(why), "{e:#}");
    }
}

/// Each renewal's new expiry shows in status.json within seconds, with the licensed poll far
/// away: gridd's renewal line carries it, and moves the lease with no reading of nvidia-smi.
#[test]
fn scenario_a_renewal_shows_in_status_json_at_once() {
    // gridd renews its day-long lease every 10 s.
    let m = Machine::new(setup(|s| s.renew_fraction = 10.0 / 86400.0));
    let config = m.config_text();
    assert!(config.contains("poll_licensed_seconds = 2\n"), "{config}");
    // Ten minutes: only gridd's lines can make the deadlines below.
    m.write_config(&config.replace(
        "poll_licensed_seconds = 2\n",
        "poll_licensed_seconds = 600\n",
    ));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    settle(&m, &a);
    let mut last = m.gpu_state().and_then(|s| s.expiry);
    for _ in 0..3 {
        let expiry = wait_for(
            "gridd's next renewal",
            T,
            || {
                m.gpu_state()
                    .and_then(|s| s.expiry)
                    .filter(|e| Some(*e) != last)
            },
            || m.gridd_log(),
        );
        last = Some(expiry);
        let want = chrono::DateTime::from_timestamp(expiry, 0)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        // Well within the 10 s to the next renewal; RFC 3339 times in UTC sort as text.
        a.wait_status(
            &format!("the renewed expiry {want} in status.json within 6 s"),
            Duration::from_secs(6),
            |v| {
                v["license"]["expiry"]
                    .as_str()
                    .is_some_and(|e| e >= want.as_str())
            },
        );
    }
}

#[test]
fn scenario_gridd_crash_while_unlicensed() {
    // gridd retrying against a DLS that is away, then gone: the unit is down.
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.dls.set_mode(Mode::Refusing);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_status("a failure", T, |v| !v["failure"].is_null());
    let old = m.crash_gridd();
    m.dls.set_mode(Mode::Up);
    wait_for(
        "a new gridd after the crash",
        T,
        || m.gridd_pid().filter(|p| *p != old),
        || a.context(),
    );
    a.wait_state("licensed", T);
}

#[test]
fn scenario_nvidia_smi_hanging_never_blocks_the_agent() {
    let (m, a) = licensed(Setup::default());
    m.update_sim(|s| s.smi_mode = SmiMode::Hang);
    // Reported: the report or the agent's log says nvidia-smi failed.
    wait_for(
        "the hung nvidia-smi reported",
        T,
        || {
            let report = std::fs::read_to_string(m.status_path()).unwrap_or_default();
            (report.contains("nvidia-smi") || agent_says(&m, &a).contains("nvidia-smi"))
                .then_some(())
        },
        || a.context(),
    );
    // Still working: gridd's next lines reach status.json while nvidia-smi hangs.
    let new = restart_gridd_by_hand(&m);
    let started = Instant::now();
    a.wait_status("gridd's new start in status.json", T, |v| {
        has_event(v, &format!("Started ({new})"))
    });
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "slow: {:?}",
        started.elapsed()
    );
    // Hung ones are killed, not piled up.
    let smis = a
        .children()
        .iter()
        .filter(|(_, comm, _)| comm.contains("nvidia-smi"))
        .count();
    assert!(smis <= 1, "{smis} nvidia-smi children");
    m.update_sim(|s| s.smi_mode = SmiMode::Normal);
    a.wait_status("nvidia-smi read again", T, |v| {
        v["state"] == "licensed" && v["gpus"][0]["profile"] == "NVIDIA L40S-24Q"
    });
}

#[test]
fn scenario_journalctl_killed_is_restarted() {
    let (m, a) = licensed(Setup::default());
    let journalctl = |a: &Agent| {
        a.children()
            .into_iter()
            .find(|(_, comm, _)| comm == "journalctl")
            .map(|(pid, _, _)| pid)
    };
    let old = wait_for(
        "the agent's journalctl",
        T,
        || journalctl(&a),
        || a.context(),
    );
    kill(Pid::from_raw(old), Signal::SIGKILL).unwrap();
    wait_for(
        "a new journalctl",
        T,
        || journalctl(&a).filter(|p| *p != old),
        || a.context(),
    );
    let new = restart_gridd_by_hand(&m);
    a.wait_status("gridd's later lines in status.json", T, |v| {
        has_event(v, &format!("Started ({new})")) && v["state"] == "licensed"
    });
}

#[test]
fn scenario_the_agent_stopped_leaves_no_journalctl() {
    let (_m, mut a) = licensed(Setup::default());
    let (pid, _, started) = wait_for(
        "the agent's journalctl",
        T,
        || {
            a.children()
                .into_iter()
                .find(|(_, comm, _)| comm == "journalctl")
        },
        || a.context(),
    );
    a.signal(Signal::SIGTERM);
    let status = a.wait_exit(T);
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}: {}",
        a.context()
    );
    // Killed and reaped by the agent: not left following the journal, the pid not reused
    // by a later process of the same start.
    let left = sim::proc_stat(pid).map(|(_, _, start)| start);
    assert_ne!(left, Some(started), "journalctl {pid} outlived the agent");
}

#[test]
fn scenario_sighup_with_a_bad_config_keeps_the_old_one() {
    let (m, mut a) = licensed(Setup::default());
    let good = m.config_text();
    m.write_config(&format!("{good}bogus_key_for_the_test = 1\n"));
    a.signal(Signal::SIGHUP);
    wait_for(
        "the agent to say why the config was refused",
        T,
        || {
            agent_says(&m, &a)
                .contains("bogus_key_for_the_test")
                .then_some(())
        },
        || a.context(),
    );
    assert!(a.running(), "still running:\n{}", a.context());
    // Still working with the old config (its restart command, its journalctl).
    let new = restart_gridd_by_hand(&m);
    a.wait_status("gridd's later lines in status.json", T, |v| {
        has_event(v, &format!("Started ({new})")) && v["state"] == "licensed"
    });
    // And a good config is taken on the next SIGHUP.
    m.write_config(&good);
    a.signal(Signal::SIGHUP);
    assert!(
        a.wait_exit(Duration::from_secs(2)).is_none(),
        "{}",
        a.context()
    );
}

#[test]
fn scenario_sigterm_in_the_middle_of_work() {
    // Commands' time limit far beyond "promptly": a stop must not wait for a hung child.
    let m = Machine::new(Setup {
        command_timeout: 20,
        ..Setup::default()
    });
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.dls.set_mode(Mode::Blackhole);
    m.start_gridd();
    let mut a = Agent::start(&m);
    a.wait_status("a first report", T, |_| true);
    // Work in flight: a hung nvidia-smi (and gridd stuck on a DLS that never answers).
    m.update_sim(|s| s.smi_mode = SmiMode::Hang);
    let children = wait_for(
        "an nvidia-smi running under the agent",
        T,
        || {
            let c = a.children();
            c.iter()
                .any(|(_, comm, _)| comm.contains("nvidia-smi"))
                .then_some(c)
        },
        || a.context(),
    );
    a.signal(Signal::SIGTERM);
    let started = Instant::now();
    let status = a.wait_exit(Duration::from_secs(25));
    let status =
        status.unwrap_or_else(|| panic!("still running 25 s after SIGTERM\n{}", a.context()));
    let took = started.elapsed();
    assert_eq!(status.code(), Some(0), "{}", a.context());
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM: it waited for its hung nvidia-smi's time limit"
    );
    // status.json whole (or removed), never half written.
    let _ = a.status();
    // No child left behind (gone, not even a zombie waiting for a parent).
    let left: HashSet<_> = children
        .iter()
        .filter(|(pid, _, start)| sim::proc_stat(*pid).is_some_and(|(_, _, s)| s == *start))
        .collect();
    assert!(left.is_empty(), "children left: {left:?}");
}

/// `status`, the metrics socket, the textfile, the journal and status.json are one report.
#[test]
fn scenario_every_output_tells_the_same() {
    let socket = std::env::temp_dir().join(format!("vla-metrics-{}.sock", std::process::id()));
    let (m, a) = licensed(Setup {
        service_extra: format!("metrics_socket = \"{}\"\n", socket.display()),
        ..Setup::default()
    });
    let v = a.wait_state("licensed", T);

    // `status` reads the running service's report and exits as a monitoring check.
    let out = m.cli(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", a.context());
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["state"], v["state"]);
    assert_eq!(s["license"], v["license"]);
    assert_eq!(s["agent_pid"], a.pid());
    let out = m.cli(&["status", "--wait", "5"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("From the running service's report"), "{text}");
    assert!(text.contains("State:    licensed"), "{text}");

    // The socket serves what the textfile holds.
    use std::io::{Read, Write};
    let mut conn = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert!(body.contains("vgpu_license_licensed 1\n"), "{body}");
    assert_eq!(body, a.metrics(), "socket and textfile differ");

    // The journal has the state change, with its catalog MESSAGE_ID.
    wait_for(
        "the licensed entry in the journal",
        T,
        || {
            m.agent_journal(a.pid())
                .into_iter()
                .find(|e| e["MESSAGE_ID"] == message_ids::LICENSED)
        },
        || a.context(),
    );
    let _ = std::fs::remove_file(&socket);
}

/// A clock windback failure as gridd logs it (tests/sim), from a DLS no gridd here talks to.
const FORGED_WINDBACK: &str = "Failed to acquire license from forged.example (Info: NVIDIA RTX Virtual Workstation - Error: Clock windback has been detected)";

/// Runs `program` as nobody: uid and gid 65534, and no supplementary groups (the standard
/// library drops root's when it sets a uid).
fn as_nobody(program: &std::path::Path, args: &[&str], stdin: &[u8]) {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(program)
        .args(args)
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Any local user can log under gridd's name; only journald's own fields tell who did. The
/// agent's journal follower, `status` (observing on its own) and `analyze` of a JSON export
/// all ignore such lines, and still count the simulated gridd's (root, process nvidia-gridd).
#[test]
fn scenario_a_forged_gridd_line_changes_nothing() {
    // The agent's journalctl selects by the agent's matches alone: the forgeries reach it.
    let (m, mut a) = licensed(Setup {
        whole_journal: true,
        ..Setup::default()
    });
    let gridd = m.gridd_pid().expect("gridd runs").to_string();
    let logger = ["/usr/bin/logger", "/bin/logger"]
        .into_iter()
        .map(std::path::Path::new)
        .find(|p| p.is_file())
        .expect("logger (util-linux) is installed");
    // A copy of logger named nvidia-gridd: journald then records `_COMM=nvidia-gridd` too.
    let dir = tempfile::Builder::new()
        .prefix("vgpu-forger-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let renamed = dir.path().join("nvidia-gridd");
    std::fs::copy(logger, &renamed).unwrap();
    crate::common::make_executable(&renamed);
    // As gridd sends them (a syslog datagram, gridd's pid in the header), and through the
    // native protocol claiming journald's fields (journald drops a client's `_` fields).
    let syslog = [
        "--socket",
        "/run/systemd/journal/dev-log",
        "--tag",
        "nvidia-gridd",
        &format!("--id={gridd}"),
        FORGED_WINDBACK,
    ];
    as_nobody(logger, &syslog, b"");
    as_nobody(&renamed, &syslog, b"");
    as_nobody(
        logger,
        &["--journald"],
        format!(
            "SYSLOG_IDENTIFIER=nvidia-gridd\nSYSLOG_PID={gridd}\n_UID=0\n_COMM=nvidia-gridd\n\
             _SYSTEMD_UNIT=nvidia-gridd.service\nMESSAGE={FORGED_WINDBACK}\n"
        )
        .as_bytes(),
    );
    wait_for(
        "the forged lines in the journal",
        T,
        || {
            let forged = sim::journal(&["SYSLOG_IDENTIFIER=nvidia-gridd"], Some(&m.since));
            let forged: Vec<_> = forged
                .iter()
                .filter(|e| sim::message(e) == FORGED_WINDBACK)
                .collect();
            (forged.len() == 3 && forged.iter().all(|e| e["_UID"] == "65534")).then_some(())
        },
        || a.context(),
    );
    // gridd's next lines come after the forged ones: once they are in status.json, the agent
    // has read past the forgeries.
    let new = restart_gridd_by_hand(&m);
    let started = format!("Started ({new})");
    let v = a.wait_status("the new gridd's lines in status.json", T, |v| {
        has_event(v, &started) && v["state"] == "licensed"
    });
    assert!(!has_event(&v, "forged.example"), "{v:#}");
    assert!(v["failure"].is_null(), "{v:#}");
    assert_eq!(
        a.metric("vgpu_license_failures_total{reason=\"clock_skew\"}")
            .unwrap_or(0.0),
        0.0,
        "{}",
        a.context()
    );

    // `analyze` of everything journald holds of this machine's boot, as JSON.
    let export = Command::new(m.path("bin/journalctl"))
        .args(["--boot", "--output=json", "--no-pager"])
        .output()
        .unwrap();
    assert!(export.status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_vgpu-license-agent"))
        .args(["analyze", "--json", "--journal", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&export.stdout)
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let r: Value = serde_json::from_slice(&out.stdout).expect("analyze's JSON report");
    assert!(has_event(&r, &started), "{r:#}");
    assert!(!has_event(&r, "forged.example"), "{r:#}");
    assert_ne!(reason(&r), Some("clock_skew"), "{r:#}");

    // `status` with no service running observes on its own (its own journalctl).
    a.signal(Signal::SIGTERM);
    assert!(
        a.wait_exit(Duration::from_secs(10)).is_some(),
        "{}",
        a.context()
    );
    let out = m.cli(&["status", "--json"]);
    let s: Value = serde_json::from_slice(&out.stdout).expect("status's JSON report");
    assert!(has_event(&s, &started), "{s:#}");
    assert!(!has_event(&s, "forged.example"), "{s:#}");
    assert_ne!(reason(&s), Some("clock_skew"), "{s:#}");
}

/// A token whose payload was edited after the DLS signed it: well formed, so the agent reads
/// it as a token (a guest has nothing to check the signature against), but gridd rejects it
/// and exits, as with any token it cannot decode.
fn edited_token_machine() -> (Machine, Vec<u8>) {
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    let edited = m.edited_token();
    sim::write_mode(&m.token_path(), &edited, 0o744);
    let gridd = m.start_gridd();
    wait_for(
        "gridd to exit on the edited token",
        T,
        || (!sim::shared::gridd_alive(gridd)).then_some(()),
        || m.gridd_log(),
    );
    assert!(
        m.gridd_messages(gridd)
            .iter()
            .any(|l| l == gridd_lines::DECODE_SIGNATURE.template)
    );
    (m, edited)
}

/// The agent cannot hold gridd up on a token gridd rejects: it says so (not licensed,
/// gridd's own line in the events), leaves the token as it is, does not restart gridd in a
/// storm, and the DLS's own token fixes it.
#[test]
fn scenario_edited_token_rejected_by_gridd() {
    let (m, edited) = edited_token_machine();
    let a = Agent::start(&m);
    let v = a.wait_status("gridd's rejection reported", T, |v| {
        !v["failure"].is_null() && has_event(v, gridd_lines::DECODE_SIGNATURE.template)
    });
    assert_ne!(v["state"], "licensed");
    // Past several restart backoffs: no storm, nothing leased.
    std::thread::sleep(Duration::from_secs(8));
    let v = a.status().unwrap();
    assert_ne!(v["state"], "licensed");
    assert!(!v["failure"].is_null(), "{v:#}");
    assert!(m.restarts() <= 3, "{} restarts: a storm", m.restarts());
    assert_eq!(
        std::fs::read(m.token_path()).unwrap(),
        edited,
        "left as it is"
    );
    assert!(
        !m.dls.requests().iter().any(|r| r.contains("/leasing/")),
        "no lease on an edited token"
    );
    // The DLS's own token fixes it (the agent restarts gridd for a new token; by hand where
    // its restart budget is spent).
    m.drop_token(0o744);
    let fixed = Instant::now();
    while m.gridd_pid().is_none() && fixed.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    if m.gridd_pid().is_none() {
        restart_gridd_by_hand(&m);
    }
    a.wait_status("licensed, the failure cleared", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
}

/// What the contract says gridd's `Failed to decode signature from token received` is:
/// `token_invalid`, the cause gridd gave as it exited; that the unit is inactive is only its
/// consequence (`policy::explains_exit`), and no restart can help.
#[test]
fn scenario_edited_token_is_reported_token_invalid() {
    let (m, _) = edited_token_machine();
    let a = Agent::start(&m);
    let v = a.wait_status("token_invalid", T, |v| reason(v) == Some("token_invalid"));
    assert_ne!(v["state"], "licensed");
    std::thread::sleep(Duration::from_secs(8));
    let v = a.status().unwrap();
    assert_eq!(reason(&v), Some("token_invalid"), "{v:#}");
    assert!(
        m.restarts() <= 1,
        "{} restarts: none can help",
        m.restarts()
    );
}

/// A proxy in front of the DLS answers 502 to every request: gridd fails its acquisition
/// with an HTTP error that names no cause the contract knows (`other`); the agent's own probe
/// gets the proxy's 502 too and says what it means, `dls_unreachable` (the proxy answers for
/// a DLS it cannot reach). gridd's line stays in the events, gridd is not restarted in a
/// storm, and the license is seen once the proxy passes again.
#[test]
fn scenario_proxy_in_front_of_the_dls_answers_502() {
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.dls.set_mode(Mode::BadGateway);
    m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("the acquisition failure reported", T, |v| {
        !v["failure"].is_null() && has_event(v, gridd_lines::ERROR_HTTP)
    });
    assert_ne!(v["state"], "licensed");
    assert_eq!(a.metric("vgpu_license_licensed"), Some(0.0));
    std::thread::sleep(Duration::from_secs(8));
    let v = a.status().unwrap();
    assert_ne!(v["state"], "licensed");
    assert!(!v["failure"].is_null(), "{v:#}");
    // gridd's failure names no cause: the probe's finding refines it.
    assert_eq!(reason(&v), Some("dls_unreachable"), "{v:#}");
    let message = v["failure"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("HTTPS request failed: HTTP 502")
            && message.contains("in front of the DLS"),
        "{v:#}"
    );
    assert!(
        has_event(
            &v,
            &gridd_lines::ACQUIRE_FAILED.format(&[
                "127.0.0.1",
                "NVIDIA RTX Virtual Workstation",
                gridd_lines::ERROR_HTTP
            ])
        ),
        "{v:#}"
    );
    assert!(m.restarts() <= 3, "{} restarts: a storm", m.restarts());
    m.dls.set_mode(Mode::Up);
    a.wait_status("licensed, the failure cleared", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
}

/// Driver 535 says plain `Unlicensed` (smi-cudaerror4vgpu-1.txt) and its gridd starts with
/// `vGPU Software package (0)`: without a token the agent says unlicensed, token missing.
#[test]
fn scenario_driver_535_without_a_token() {
    let m = Machine::new(setup(|s| s.driver_version = "535.183.06".into()));
    write_gridd_conf(&m);
    m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("token_missing", T, |v| reason(v) == Some("token_missing"));
    assert_eq!(v["state"], "unlicensed", "{v:#}");
    assert_eq!(v["license"]["status"], "Unlicensed", "{v:#}");
    assert_eq!(v["gpus"][0]["license_status"], "Unlicensed");
    // The metrics file is written after status.json.
    wait_for(
        "vgpu_license_licensed 0 in the metrics",
        T,
        || (a.metric("vgpu_license_licensed") == Some(0.0)).then_some(()),
        || a.context(),
    );
}

/// Two vGPUs on a platform that licenses them (`Licensed (Expiry: N/A)`, no token): the agent
/// reports both GPUs, licensed without an expiry, and `analyze` reads the same from
/// nvidia-smi's XML.
#[test]
fn scenario_two_gpus_licensed_by_the_platform() {
    let m = Machine::new(setup(|s| {
        s.gpu_count = 2;
        s.platform_licensed = true;
    }));
    m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("two licensed GPUs", T, |v| {
        v["state"] == "licensed" && v["gpus"].as_array().is_some_and(|g| g.len() == 2)
    });
    assert_eq!(v["license"]["status"], "Licensed (Expiry: N/A)", "{v:#}");
    assert!(v["license"]["expiry"].is_null(), "{v:#}");
    for (g, bus) in v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .zip(["00000000:02:01.0", "00000000:02:02.0"])
    {
        assert_eq!(g["bus_id"], bus);
        assert_eq!(g["license_status"], "Licensed (Expiry: N/A)");
        assert_eq!(g["profile"], "NVIDIA L40S-24Q");
    }
    assert!(v["failure"].is_null(), "no token is no failure here: {v:#}");
    assert_eq!(a.metric("vgpu_license_licensed"), Some(1.0));
    assert!(
        a.metrics()
            .lines()
            .all(|l| !l.starts_with("vgpu_license_expiry_timestamp_seconds")),
        "no expiry metric without an expiry"
    );
    // The same from the XML form, offline.
    let xml = m.path("smi.xml");
    std::fs::write(&xml, m.smi(&["-q", "-x"]).stdout).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-license-agent"))
        .arg("--config")
        .arg(&m.config)
        .args(["analyze", "--json", "--smi"])
        .arg(&xml)
        .output()
        .unwrap();
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(r["state"], "licensed", "{r:#}");
    assert_eq!(r["gpus"], v["gpus"], "XML and text read alike");
    assert_eq!(out.status.code(), Some(0));
}

/// Two vGPUs, a MIG-backed slice and a half card, each licensed on its own: gridd holds a
/// license for the first and none for the second (restricted). `status` gives each vGPU's
/// own license, its headline says how many are licensed and names the one that is not, and
/// so does the one line node-problem-detector and the Node condition carry.
#[test]
fn scenario_two_vgpus_one_not_licensed_each_shown_in_status() {
    const DC_1_12Q: &str = "NVIDIA RTX Pro 6000 Blackwell DC-1-12Q";
    const DC_48C: &str = "NVIDIA RTX Pro 6000 Blackwell DC-48C";
    let m = Machine::new(setup(|s| {
        s.profile = DC_1_12Q.into();
        s.gpu_count = 2;
        s.gpu_profiles = vec![DC_1_12Q.into(), DC_48C.into()];
        s.unlicensed_gpus = vec![1];
        s.grace_seconds = 0;
    }));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("one vGPU licensed, the other restricted", T, |v| {
        v["gpus"][0]["state"] == "licensed" && v["gpus"][1]["state"] == "restricted"
    });
    assert_eq!(v["state"], "restricted", "{v:#}");
    assert!(v["gpus"][0]["expiry"].is_string(), "{v:#}");
    assert!(v["gpus"][1]["expiry"].is_null(), "{v:#}");
    assert_eq!(v["license"]["status"], "Unlicensed (Restricted)", "{v:#}");
    let status = |args: &[&str]| {
        let out = m.cli(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let not_licensed = format!(
        "1 of 2 vGPUs licensed; not licensed: 00000000:02:02.0 {DC_48C} (Unlicensed (Restricted))"
    );
    let (code, text) = status(&["status"]);
    assert_eq!(code, Some(2), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!("CRITICAL: restricted: {not_licensed}")),
        "{text}"
    );
    assert!(
        lines.contains(&format!("Status:   {not_licensed}").as_str()),
        "{text}"
    );
    let gpu_lines: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("GPU:"))
        .collect();
    assert_eq!(gpu_lines.len(), 2, "{text}");
    assert!(
        gpu_lines[0].starts_with(&format!(
            "GPU:      00000000:02:01.0 {DC_1_12Q} (VGPU): Licensed until "
        )),
        "{text}"
    );
    assert_eq!(
        gpu_lines[1],
        format!("GPU:      00000000:02:02.0 {DC_48C} (VGPU): Unlicensed (Restricted)"),
        "{text}"
    );
    let (code, line) = status(&["status", "--npd"]);
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.contains(&format!("00000000:02:02.0 {DC_48C}")),
        "{line}"
    );
}

/// A CLS guest behind a proxy: the token names NVIDIA's Cloud License Service
/// (`api.cls.licensing.nvidia.com:443`), gridd.conf names a proxy (`ProxyServerAddress`,
/// `ProxyServerPort`) that lets only `CONNECT api.cls.licensing.nvidia.com:443` through, to
/// the simulated DLS. The simulated machine uses no DNS: the license service is reached
/// through the proxy or not at all.
fn cls_guest_behind_a_proxy(refusing: bool) -> (Machine, sim::ConnectProxy, Agent) {
    let m = Machine::new(Setup {
        token_node: Some(("api.cls.licensing.nvidia.com".into(), 443)),
        ..Setup::default()
    });
    let proxy = sim::ConnectProxy::start(&[(sim::CLS_TARGET, m.dls.addr())]);
    proxy.set_refusing(refusing);
    sim::write_mode(
        &m.sim_config().gridd_conf,
        format!(
            "FeatureType=1\nProxyServerAddress=127.0.0.1\nProxyServerPort={}\n",
            proxy.port()
        )
        .as_bytes(),
        0o644,
    );
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    (m, proxy, a)
}

/// `vgpu-license-agent diagnose --json` with the machine's config.
fn diagnose_json(m: &Machine) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_vgpu-license-agent"))
        .arg("--config")
        .arg(&m.config)
        .args(["diagnose", "--json"])
        .env("SIM_DIR", &m.sim)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "diagnose --json: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn check_of<'a>(d: &'a Value, name: &str) -> &'a Value {
    d["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no {name:?} check: {d:#}"))
}

#[test]
fn scenario_cls_guest_licensed_through_a_proxy() {
    let (m, proxy, a) = cls_guest_behind_a_proxy(false);
    // nvidia-smi may show the license before gridd's line reaches the journal follower (and
    // the agent restarts gridd once at its start, for the token): wait for both.
    let v = a.wait_status("licensed, gridd's acquisition in the events", T, |v| {
        v["state"] == "licensed"
            && has_event(
                v,
                "License acquired successfully. (Info: api.cls.licensing.nvidia.com, NVIDIA RTX Virtual Workstation; Expiry: ",
            )
    });
    assert_eq!(v["licensing_mode"], "cls", "{v:#}");
    assert!(v["failure"].is_null(), "{v:#}");
    assert_eq!(
        v["dls"],
        serde_json::json!([{"host": "api.cls.licensing.nvidia.com", "port": 443}])
    );
    assert_eq!(a.metric("vgpu_license_licensed"), Some(1.0));
    // gridd went through the proxy, and asked it for the CLS only.
    let asked = proxy.requests();
    let opened = format!("CONNECT {} 200", sim::CLS_TARGET);
    assert!(asked.contains(&opened), "{asked:?}");
    assert!(
        m.dls
            .requests()
            .iter()
            .any(|r| r == "POST /leasing/v1/lessor 200"),
        "{:?}",
        m.dls.requests()
    );

    // diagnose: the proxy check, and the license service's checks through it.
    let before = proxy.requests().len();
    let d = diagnose_json(&m);
    let via = format!("127.0.0.1:{}", proxy.port());
    let p = check_of(&d, "proxy");
    assert_eq!(p["status"], "ok", "{d:#}");
    assert!(p["message"].as_str().unwrap().contains(&via), "{p:#}");
    for name in ["dls-tcp", "dls-tls", "dls-https"] {
        let c = check_of(&d, name);
        assert_eq!(c["status"], "ok", "{name}: {d:#}");
        assert!(
            c["message"]
                .as_str()
                .unwrap()
                .contains("api.cls.licensing.nvidia.com:443"),
            "{name}: {c:#}"
        );
    }
    assert!(
        check_of(&d, "dls-tcp")["message"]
            .as_str()
            .unwrap()
            .contains(&format!("proxy {via}")),
        "{d:#}"
    );
    assert!(
        check_of(&d, "mode")["message"]
            .as_str()
            .unwrap()
            .contains("CLS"),
        "{d:#}"
    );
    assert!(
        proxy.requests()[before..].contains(&opened),
        "diagnose's probe went through the proxy: {:?}",
        proxy.requests()
    );
    assert!(
        proxy
            .requests()
            .iter()
            .all(|r| r.starts_with(&format!("CONNECT {} ", sim::CLS_TARGET))),
        "nothing but the CLS was asked of the proxy: {:?}",
        proxy.requests()
    );
    let text = serde_json::to_string(&d).unwrap();
    a.assert_no_secret(&text);
}

/// The proxy refuses the tunnel (403): gridd fails with its network failure line; the agent
/// says not licensed, `dls_unreachable`, naming the proxy; once the proxy lets it through the
/// guest is licensed and the failure is gone.
#[test]
fn scenario_cls_guest_whose_proxy_refuses_then_lets_it_through() {
    let (m, proxy, a) = cls_guest_behind_a_proxy(true);
    // gridd's failure line first, then the agent's own probe, which names the proxy (either
    // may come first: wait for each).
    let network = gridd_lines::ACQUIRE_FAILED.format(&[
        "api.cls.licensing.nvidia.com",
        "NVIDIA RTX Virtual Workstation",
        gridd_lines::ERROR_NETWORK,
    ]);
    let v = a.wait_status("gridd's network failure in the events", T, |v| {
        has_event(v, &network)
    });
    assert_ne!(v["state"], "licensed", "{v:#}");
    let via = format!("through proxy 127.0.0.1:{}", proxy.port());
    let v = a.wait_status("dls_unreachable through the proxy", T, |v| {
        reason(v) == Some("dls_unreachable")
            && v["failure"]["message"]
                .as_str()
                .is_some_and(|s| s.contains(&via))
    });
    assert_ne!(v["state"], "licensed", "{v:#}");
    assert_eq!(v["licensing_mode"], "cls", "{v:#}");
    assert_eq!(a.metric("vgpu_license_licensed"), Some(0.0));
    let refused = format!("CONNECT {} 403", sim::CLS_TARGET);
    assert!(
        proxy.requests().contains(&refused),
        "{:?}",
        proxy.requests()
    );
    assert!(m.dls.requests().is_empty(), "{:?}", m.dls.requests());

    proxy.set_refusing(false);
    a.wait_status("licensed, the failure cleared", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    assert!(m.restarts() <= 3, "{} restarts: a storm", m.restarts());
    assert!(
        proxy
            .requests()
            .contains(&format!("CONNECT {} 200", sim::CLS_TARGET))
    );
}

/// A legacy guest (driver 470, `GRID T4-8Q`): gridd.conf's ServerAddress and ServerPort, no
/// token. With the license server up the agent says licensed, legacy mode, no failure (a
/// missing token is none here); nvidia-smi's plain `Licensed` has no expiry.
#[test]
fn scenario_legacy_guest_licensed_by_its_license_server() {
    let m = Machine::new(setup(|s| {
        s.driver_version = "470.82.01".into();
        s.profile = "GRID T4-8Q".into();
    }));
    let server = sim::LegacyServer::start();
    sim::write_mode(
        &m.sim_config().gridd_conf,
        server.gridd_conf().as_bytes(),
        0o644,
    );
    m.start_gridd();
    let a = Agent::start(&m);
    let url = format!("http://{}:7070/request", server.addr.ip());
    let v = a.wait_status("licensed by the legacy server", T, |v| {
        v["state"] == "licensed" && has_event(v, &url)
    });
    assert_eq!(v["licensing_mode"], "legacy", "{v:#}");
    assert!(v["failure"].is_null(), "no token is no failure here: {v:#}");
    assert_eq!(v["license"]["status"], "Licensed", "{v:#}");
    assert!(v["license"]["expiry"].is_null(), "{v:#}");
    assert!(
        has_event(&v, "Your system is licensed for GRID vGPU."),
        "{v:#}"
    );
    assert_eq!(a.metric("vgpu_license_licensed"), Some(1.0));
    let before = m.restarts();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(m.restarts(), before, "no restart while licensed");
    let v = a.status().unwrap();
    assert_eq!(v["state"], "licensed");
    assert!(v["failure"].is_null(), "{v:#}");
}

/// The legacy license server down: gridd's legacy failure line, not licensed, and advice that
/// points to the server and to the move to a DLS; once the server is back, licensed.
#[test]
fn scenario_legacy_guest_whose_license_server_is_down() {
    let m = Machine::new(setup(|s| {
        s.driver_version = "470.82.01".into();
        s.profile = "GRID T4-8Q".into();
    }));
    let mut server = sim::LegacyServer::start();
    server.set_up(false);
    sim::write_mode(
        &m.sim_config().gridd_conf,
        server.gridd_conf().as_bytes(),
        0o644,
    );
    m.start_gridd();
    let a = Agent::start(&m);
    let failed = gridd_lines::LEGACY_ACQUIRE_FAILED.format(&[]);
    let v = a.wait_status("the legacy failure reported", T, |v| {
        v["failure"]["message"].as_str() == Some(failed.as_str())
    });
    assert_ne!(v["state"], "licensed", "{v:#}");
    assert_eq!(v["licensing_mode"], "legacy", "{v:#}");
    assert_ne!(reason(&v), Some("token_missing"), "{v:#}");
    let advice = v["failure"]["advice"].as_str().unwrap_or_default();
    assert!(
        advice.contains("legacy license server") && advice.contains("move to a DLS"),
        "{v:#}"
    );
    assert!(advice.contains(&server.addr.ip().to_string()), "{v:#}");
    assert_eq!(a.metric("vgpu_license_licensed"), Some(0.0));

    server.set_up(true);
    let v = a.wait_status("licensed, the failure cleared", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    assert_eq!(v["licensing_mode"], "legacy", "{v:#}");
    assert!(m.restarts() <= 3, "{} restarts: a storm", m.restarts());
}

/// NVIDIA's guide, followed as written: the DLS's download is copied into the token
/// directory under its own name, beside a gridd.conf put there by mistake (gridd exits on
/// it). The service moves the gridd.conf aside, adopts the token where it is (its name
/// kept), restarts gridd once, and the guest is licensed; nothing anywhere says
/// token_missing, the metrics included. A site's own name without `.tok` is the token too.
#[test]
fn scenario_a_token_under_the_download_name_beside_a_misplaced_gridd_conf() {
    const DOWNLOAD: &str = "client_configuration_token_11-30-2026-10-00-00.tok";
    let m = Machine::new(setup(|s| s.pickup_new_token = false));
    write_gridd_conf(&m);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_status("no token reported", T, |v| {
        reason(v) == Some("token_missing")
    });
    let dir = m.token_dir();
    sim::write_mode(&dir.join("gridd.conf"), b"FeatureType=1\n", 0o644);
    sim::write_mode(&dir.join(DOWNLOAD), &m.token(), 0o600);
    a.wait_status("licensed, nothing wrong", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![DOWNLOAD.to_string()], "{}", a.context());
    assert_eq!(
        std::fs::metadata(dir.join(DOWNLOAD))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o744
    );
    let replaced = m.path("var/lib/vgpu-license-agent/replaced");
    let moved: Vec<String> = std::fs::read_dir(&replaced)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(moved.contains(&"gridd.conf".to_string()), "{moved:?}");
    let metric = |name: &str| a.metric(name);
    wait_for(
        "the metrics licensed, with no token_missing",
        T,
        || {
            (metric("vgpu_license_licensed") == Some(1.0)
                && metric("vgpu_license_failure{reason=\"token_missing\"}") == Some(0.0)
                && metric("vgpu_license_token_expiry_timestamp_seconds").is_some())
            .then_some(())
        },
        || a.context(),
    );
    let restarts = m.restarts();
    assert!(restarts >= 1, "gridd restarted for the token");

    // The same token under a site's own name: still the token, no restart needed.
    std::fs::rename(dir.join(DOWNLOAD), dir.join("bgo-client-token-latest")).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let v = a.status().unwrap();
    assert_eq!(v["state"], "licensed", "{v:#}");
    assert!(v["failure"].is_null(), "{v:#}");
    assert_eq!(m.restarts(), restarts, "the same token costs no restart");
    assert_eq!(
        metric("vgpu_license_failure{reason=\"token_missing\"}"),
        Some(0.0),
        "{}",
        a.context()
    );
}

/// The agent's CPU seconds (user + system) and resident memory (KiB), from /proc.
fn cpu_and_rss(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .unwrap()
        .unwrap() as f64;
    let cpu = (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / ticks;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap();
    (cpu, rss)
}

/// A sync tool writes 20,000 files into the token directory while the service runs: the
/// changes are coalesced (one look at a time, not one per change), so the burst costs a few
/// seconds of CPU at most, memory stays small, and status.json still follows nvidia-smi
/// within a poll.
#[test]
fn scenario_a_burst_of_twenty_thousand_files_in_the_token_directory() {
    let (m, a) = licensed(Setup::default());
    let (cpu0, rss0) = cpu_and_rss(a.pid());
    let started = Instant::now();
    let dir = m.token_dir();
    for i in 0..20_000 {
        std::fs::write(dir.join(format!("sync-{i:05}.part")), b"x").unwrap();
    }
    // Let the watcher's events and the looks they cause run out.
    std::thread::sleep(Duration::from_secs(5));
    let (cpu1, rss) = cpu_and_rss(a.pid());
    let wall = started.elapsed().as_secs_f64();
    let share = (cpu1 - cpu0) / wall;
    eprintln!(
        "20,000 files: {:.2} s CPU in {wall:.2} s ({share:.2} of a core), RSS {rss0} KiB before, {rss} KiB after",
        cpu1 - cpu0
    );
    // The changes are coalesced: one look at the directory in flight, and the next one a gap
    // after it that grows with how long a look takes (each reads the 20,000 names), so the
    // burst, and the 5 s after it, cost well under a core however long the writing takes on
    // a loaded machine. Before, each event queued a full look, and the agent kept both
    // cores busy long after the writing ended.
    assert!(
        share < 0.75,
        "{:.2} s CPU in {wall:.2} s for the burst",
        cpu1 - cpu0
    );
    assert!(rss < rss0 + 8 * 1024, "RSS {rss0} KiB -> {rss} KiB");
    // Still following nvidia-smi.
    m.update_sim(|s| s.smi_mode = SmiMode::NoDriver);
    a.wait_state("no_driver", T);
    // And back (gridd itself may have read the 20,000 files by now and lost its license:
    // what matters is that the report follows nvidia-smi again).
    m.update_sim(|s| s.smi_mode = SmiMode::Normal);
    a.wait_status("the report following nvidia-smi again", T, |v| {
        v["state"] != "no_driver"
    });
}

/// The same image on a VM without a vGPU: the PCI bus shows no NVIDIA device. The service
/// reports `no_gpu` (exit 0, no failure), never restarts gridd, and the metrics raise
/// nothing a fleet alerts on.
#[test]
fn scenario_a_guest_without_a_gpu_is_no_gpu_and_left_alone() {
    let m = Machine::new(Setup::default());
    crate::common::no_pci_gpu(m.root());
    let a = Agent::start(&m);
    let v = a.wait_state("no_gpu", T);
    assert_eq!(v["exit_code"], 0, "{v:#}");
    assert!(v["failure"].is_null(), "{v:#}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(m.restarts(), 0, "{}", a.context());
    wait_for(
        "the metrics say no_gpu and no failure",
        T,
        || {
            (a.metric("vgpu_license_state{state=\"no_gpu\"}") == Some(1.0)
                && a.metric("vgpu_license_failure{reason=\"token_missing\"}") == Some(0.0)
                && a.metric("vgpu_license_failure{reason=\"gridd_not_running\"}") == Some(0.0))
            .then_some(())
        },
        || a.context(),
    );
}

/// An operator's `systemctl restart nvidia-gridd` passes through `inactive` with the restart's
/// start job queued (`systemctl list-jobs` lists it): gridd is coming back, and the agent, which
/// asks systemd as soon as gridd says it shuts down, does not restart it a second time.
#[test]
fn scenario_a_restart_by_hand_is_not_followed_by_the_agents_own() {
    // A grace longer than any acquisition on a loaded machine: a restart of the agent's own
    // here can only be for gridd taken as not running (which needs no grace), the verdict
    // this scenario is about, never for a new gridd slow to get its lease.
    let (m, a) = licensed_patient();
    let own = || a.metric("vgpu_license_gridd_restarts_total").unwrap_or(0.0);
    let before = own();
    for _ in 0..3 {
        let new = restart_gridd_by_hand(&m);
        a.wait_status("the new gridd licensed", T, |v| {
            has_event(v, &format!("Started ({new})")) && v["state"] == "licensed"
        });
    }
    // The answer to the agent's last question about the unit comes within a few seconds.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(own(), before, "{}", a.context());
}

/// Stopped while its restart of gridd is under way, the service lets the restart end before
/// it stops: killed halfway, a restart command that stops gridd and then starts it (a
/// script of the config's; `systemctl restart` queues a job that outlives its client)
/// would leave gridd stopped.
#[test]
fn scenario_stopped_mid_restart_the_restart_ends_first() {
    let (m, mut a) = licensed(Setup::default());
    // A restart that takes a while (its start job queued behind other units).
    m.update_sim(|s| s.restart_queued_ms = 1500);
    let old = m.crash_gridd();
    wait_for(
        "the agent's restart of gridd under way",
        T,
        || m.restarting().then_some(()),
        || a.context(),
    );
    a.signal(Signal::SIGTERM);
    a.wait_exit(T).expect("the service stops");
    assert!(
        !m.restarting(),
        "stopped with the restart half done: {}",
        a.context()
    );
    let pid = m.gridd_pid().expect("gridd runs again");
    assert_ne!(pid, old);
    assert!(
        a.journal_lines()
            .iter()
            .any(|l| l.contains("stopping once the restart of nvidia-gridd under way has ended")),
        "{}",
        a.context()
    );
}
