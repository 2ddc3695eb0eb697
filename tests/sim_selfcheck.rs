//! The simulator checked on its own (no agent): its gridd's lines reach the real journal as
//! `nvidia-gridd` and read as the agent's parsers expect, its nvidia-smi prints what the
//! parsers read as the simulated state, its DLS answers as each test sets it, and its restart
//! command restarts and counts. The end-to-end scenarios (tests/service.rs) rely on all this.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::sim::{self, FakeDls, Machine, Mode, Setup, SimConfig, SmiMode, wait_for};
use vgpu_license_agent::observe::journal::{self, GriddEvent};
use vgpu_license_agent::observe::smi::{self, LicenseStatus, classify_status};
use vgpu_license_agent::report::{EventKind, Reason};

const T: Duration = Duration::from_secs(15);

fn setup(f: impl FnOnce(&mut SimConfig)) -> Setup {
    let mut s = Setup::default();
    f(&mut s.sim);
    s
}

/// Waits until gridd `pid` logged a line containing `text`; returns all its lines.
fn wait_line(m: &Machine, pid: i32, text: &str) -> Vec<String> {
    wait_for(
        &format!("gridd {pid} to log {text:?}"),
        T,
        || {
            let lines = sim::gridd_messages(pid);
            lines.iter().any(|l| l.contains(text)).then_some(lines)
        },
        || m.gridd_log(),
    )
}

/// The agent's parser over the journal's JSON of gridd `pid`.
fn parsed_events(pid: i32) -> Vec<GriddEvent> {
    let out = Command::new("journalctl")
        .args([
            "--boot",
            "--output=json",
            "--no-pager",
            "_COMM=nvidia-gridd",
        ])
        .arg(format!("_PID={pid}"))
        .output()
        .unwrap();
    let mut v = Vec::new();
    journal::scan(&out.stdout[..], |e| v.push(e)).unwrap();
    v
}

fn smi_status(m: &Machine) -> (String, LicenseStatus) {
    let out = m.smi(&["-q"]);
    assert!(out.status.success());
    let snap = smi::parse(&out.stdout).unwrap();
    assert!(snap.whole);
    assert_eq!(snap.gpus.len(), 1);
    let status = snap.gpus[0].license_status.clone().unwrap();
    let class = classify_status(&status);
    (status, class)
}

#[test]
fn fake_dls_behaves_as_set() {
    let dls = FakeDls::start();
    let t = Duration::from_millis(800);
    let date = sim::https::https_date("127.0.0.1", dls.port(), t).unwrap();
    assert!((date - chrono::Utc::now()).num_seconds().abs() <= 2);
    dls.set_skew(3600);
    let date = sim::https::https_date("localhost", dls.port(), t).unwrap();
    let skew = (date - chrono::Utc::now()).num_seconds();
    assert!((3598..=3602).contains(&skew), "{skew}");
    assert!(dls.requests().iter().all(|r| r == "POST /auth/v1/origin"));
    assert_eq!(dls.requests().len(), 2);

    dls.set_mode(Mode::Refusing);
    let e = sim::https::https_date("127.0.0.1", dls.port(), t).unwrap_err();
    assert!(e.contains("connect") && e.contains("refused"), "{e}");
    dls.set_mode(Mode::BadTls);
    let e = sim::https::https_date("127.0.0.1", dls.port(), t).unwrap_err();
    assert!(e.starts_with("tls"), "{e}");
    dls.set_mode(Mode::Blackhole);
    let started = Instant::now();
    let e = sim::https::https_date("127.0.0.1", dls.port(), t).unwrap_err();
    assert!(started.elapsed() >= t, "{e}");
    dls.set_mode(Mode::Up);
    dls.set_skew(-120);
    let date = sim::https::https_date("127.0.0.1", dls.port(), t).unwrap();
    assert!(((date - chrono::Utc::now()).num_seconds() + 120).abs() <= 2);
}

#[test]
fn gridd_acquires_logs_to_the_journal_and_smi_shows_the_license() {
    let m = Machine::new(Setup::default());
    m.drop_token(0o744);
    let pid = m.start_gridd();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap()
            .trim(),
        "nvidia-gridd"
    );
    let lines = wait_line(&m, pid, "License acquired successfully");
    let want = [
        format!("Started ({pid})"),
        "vGPU Software package (0)".into(),
        "Ignore service provider and node-locked licensing".into(),
        "NLS initialized".into(),
        "Acquiring license. (Info: 127.0.0.1; NVIDIA RTX Virtual Workstation)".into(),
    ];
    let mut at = 0;
    for w in &want {
        at += lines[at..]
            .iter()
            .position(|l| l == w)
            .unwrap_or_else(|| panic!("{w:?} not in order in {lines:#?}"));
    }
    // No gridd.conf: the real daemon complains about it, harmlessly.
    assert!(lines.iter().any(|l| l.starts_with("Failed to open file")));

    // As the agent reads it: journald's fields and the agent's own parser.
    let entries = sim::journal(&["_COMM=nvidia-gridd", &format!("_PID={pid}")], None);
    assert!(
        entries
            .iter()
            .all(|e| e["SYSLOG_IDENTIFIER"] == "nvidia-gridd"
                && e["_COMM"] == "nvidia-gridd"
                && e["SYSLOG_PID"] == pid.to_string().as_str())
    );
    let events = parsed_events(pid);
    let acquired = events
        .iter()
        .find(|e| e.what.kind == EventKind::Acquired)
        .expect("an acquired event");
    assert_eq!(acquired.what.server.as_deref(), Some("127.0.0.1"));
    assert_eq!(
        acquired.what.edition.as_deref(),
        Some("NVIDIA RTX Virtual Workstation")
    );
    let expiry = acquired.what.expiry.expect("an expiry");
    let lease = (expiry - chrono::Utc::now()).num_seconds();
    assert!((86380..=86400).contains(&lease), "{lease}");
    // gridd's format: no zero padding.
    let line = lines
        .iter()
        .find(|l| l.starts_with("License acquired"))
        .unwrap();
    let stamp = line.split("Expiry: ").nth(1).unwrap();
    let stamp = stamp.trim_end_matches(" GMT");
    // A zero is printed as "0" (minute 0 reads ":0:"), never as "00" or "07".
    assert!(
        stamp
            .split(['-', ':', ' '])
            .all(|n| !n.is_empty() && (n == "0" || !n.starts_with('0'))),
        "{stamp}"
    );

    let (status, class) = smi_status(&m);
    assert!(status.starts_with("Licensed (Expiry: "), "{status}");
    assert_eq!(class, LicenseStatus::Licensed(Some(expiry)));
    let xml = smi::parse(&m.smi(&["-q", "-x"]).stdout).unwrap();
    assert_eq!(xml.gpus[0].license_status.as_deref(), Some(status.as_str()));
    assert_eq!(xml.gpus[0].profile.as_deref(), Some("NVIDIA L40S-24Q"));
    assert_eq!(xml.gpus[0].virtualization_mode.as_deref(), Some("VGPU"));
    let text = smi::parse(&m.smi(&["-q"]).stdout).unwrap();
    assert_eq!(
        text.gpus[0].edition.as_deref(),
        Some("NVIDIA RTX Virtual Workstation")
    );
    assert_eq!(text.driver_version.as_deref(), Some("550.90.07"));

    // The systemctl stand-in and the restart command.
    let sc = m.path("bin/systemctl");
    let out = Command::new(&sc)
        .args(["is-active", "nvidia-gridd.service"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "active");
    let out = Command::new(sim::example("sim-restart-gridd"))
        .arg("--sim-dir")
        .arg(&m.sim)
        .output()
        .unwrap();
    assert!(out.status.success());
    let new: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_ne!(new, pid);
    assert_eq!(m.restarts(), 1);
    let old = sim::gridd_messages(pid);
    assert_eq!(
        &old[old.len() - 2..],
        [
            "License returned successfully. (Info: 127.0.0.1)".to_string(),
            format!("Shutdown ({pid})")
        ]
    );
    wait_line(&m, new, "License acquired successfully");
    assert_eq!(m.gridd_pid(), Some(new));
}

#[test]
fn gridd_without_a_readable_token_keeps_trying_and_picks_one_up() {
    let m = Machine::new(Setup::default());
    let pid = m.start_gridd();
    wait_line(
        &m,
        pid,
        "Unable to fetch the client configuration token file",
    );
    assert_eq!(
        smi_status(&m),
        (
            "Unlicensed (Unrestricted)".to_string(),
            LicenseStatus::Unlicensed
        )
    );
    // A token gridd's user cannot read is as good as none.
    m.drop_token(0o600);
    let count = |l: &[String]| {
        l.iter()
            .filter(|l| l.starts_with("Unable to fetch"))
            .count()
    };
    let seen = count(&sim::gridd_messages(pid));
    wait_for(
        "another Unable to fetch",
        T,
        || (count(&sim::gridd_messages(pid)) > seen).then_some(()),
        || m.gridd_log(),
    );
    assert_eq!(m.gridd_pid(), Some(pid), "it keeps running");
    std::fs::set_permissions(
        m.token_path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o744),
    )
    .unwrap();
    wait_line(&m, pid, "License acquired successfully");
    let events = parsed_events(pid);
    assert!(
        events
            .iter()
            .any(|e| e.what.reason == Some(Reason::TokenMissing))
    );
}

#[test]
fn gridd_without_pickup_waits_for_a_restart() {
    let m = Machine::new(setup(|s| s.pickup_new_token = false));
    let pid = m.start_gridd();
    wait_line(&m, pid, "Unable to fetch");
    m.drop_token(0o744);
    let count = |l: &[String]| {
        l.iter()
            .filter(|l| l.starts_with("Unable to fetch"))
            .count()
    };
    wait_for(
        "two more Unable to fetch",
        T,
        || (count(&sim::gridd_messages(pid)) >= 3).then_some(()),
        || m.gridd_log(),
    );
    assert!(
        !sim::gridd_messages(pid)
            .iter()
            .any(|l| l.starts_with("Acquiring"))
    );
}

/// Runs a gridd as a child of the test, to see its exit code.
fn run_gridd_to_exit(m: &Machine) -> (i32, i32) {
    let mut child = Command::new(sim::example("sim-nvidia-gridd"))
        .arg("--sim-dir")
        .arg(&m.sim)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let deadline = Instant::now() + T;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return (pid, s.code().unwrap());
        }
        assert!(Instant::now() < deadline, "{}", m.gridd_log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn gridd_exits_on_a_token_it_cannot_decode_or_a_stray_file() {
    let m = Machine::new(Setup::default());
    let want = [
        "Failed to decode signature from token received",
        "Failed to read configurations from client configuration token (Error: Invalid client configuration token)",
        "Failed to setup cloud License Manager: 3",
    ];
    // A copy-paste that broke the token.
    let mut bad = m.token();
    bad.truncate(bad.len() - 40);
    sim::write_mode(&m.token_path(), &bad, 0o744);
    let (pid, code) = run_gridd_to_exit(&m);
    assert_eq!(code, 1);
    let lines = wait_line(&m, pid, "Shutdown");
    let tail: Vec<&str> = lines[lines.len() - 4..]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(tail[..3], want);
    assert_eq!(tail[3], format!("Shutdown ({pid})"));
    let events = parsed_events(pid);
    assert!(events.iter().any(
        |e| e.what.kind == EventKind::TokenError && e.what.reason == Some(Reason::TokenInvalid)
    ));
    // A good token, and a gridd.conf put in the token directory.
    m.drop_token(0o744);
    sim::write_mode(&m.token_dir().join("gridd.conf"), b"FeatureType=1\n", 0o644);
    let (pid, code) = run_gridd_to_exit(&m);
    assert_eq!(code, 1);
    wait_line(&m, pid, "Failed to setup cloud License Manager: 3");
    assert_eq!(
        smi_status(&m).1,
        LicenseStatus::Unlicensed,
        "no license after a failed start"
    );
}

#[test]
fn gridd_meets_clock_skew_and_an_unreachable_dls() {
    let m = Machine::new(Setup::default());
    m.drop_token(0o744);
    m.dls.set_skew(3600);
    let pid = m.start_gridd();
    wait_line(
        &m,
        pid,
        "Failed to acquire license from 127.0.0.1 (Info: NVIDIA RTX Virtual Workstation - Error: Clock windback has been detected)",
    );
    assert!(parsed_events(pid).iter().any(
        |e| e.what.kind == EventKind::AcquireFailed && e.what.reason == Some(Reason::ClockSkew)
    ));
    // A DLS that refuses, then one that speaks no TLS: the bare line.
    m.dls.set_skew(0);
    m.dls.set_mode(Mode::Refusing);
    let bare = |l: &String| l == "Failed to acquire license from 127.0.0.1";
    wait_for(
        "the bare failure line",
        T,
        || sim::gridd_messages(pid).iter().any(bare).then_some(()),
        || m.gridd_log(),
    );
    m.dls.set_mode(Mode::BadTls);
    let n = sim::gridd_messages(pid).iter().filter(|l| bare(l)).count();
    wait_for(
        "another bare failure line",
        T,
        || (sim::gridd_messages(pid).iter().filter(|l| bare(l)).count() > n).then_some(()),
        || m.gridd_log(),
    );
    // Back: gridd retries by itself.
    m.dls.set_mode(Mode::Up);
    wait_line(&m, pid, "License acquired successfully");
}

#[test]
fn gridd_that_does_not_retry_waits_for_a_restart() {
    let m = Machine::new(setup(|s| s.acquire_retry = false));
    m.drop_token(0o744);
    m.dls.set_mode(Mode::Refusing);
    let pid = m.start_gridd();
    wait_line(&m, pid, "Failed to acquire license from 127.0.0.1");
    m.dls.set_mode(Mode::Up);
    let acquiring = |p| {
        sim::gridd_messages(p)
            .iter()
            .filter(|l| l.starts_with("Acquiring"))
            .count()
    };
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(acquiring(pid), 1, "no retry without a restart");
    let out = Command::new(sim::example("sim-restart-gridd"))
        .arg(&m.sim)
        .output()
        .unwrap();
    let new: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    wait_line(&m, new, "License acquired successfully");
}

#[test]
fn leases_renew_expire_and_the_grace_period_ends() {
    let m = Machine::new(setup(|s| {
        s.lease_seconds = 3;
        s.renew_fraction = 0.3;
        s.grace_seconds = 2;
    }));
    m.drop_token(0o744);
    let pid = m.start_gridd();
    wait_line(
        &m,
        pid,
        "License renewed successfully. (Info: 127.0.0.1, NVIDIA RTX Virtual Workstation; Expiry: ",
    );
    assert!(
        parsed_events(pid)
            .iter()
            .any(|e| e.what.kind == EventKind::Renewed && e.what.expiry.is_some())
    );
    // The DLS goes away: renewals fail, the lease runs out, the grace period, then throttled.
    m.dls.set_mode(Mode::Refusing);
    wait_line(&m, pid, "Valid GRID license not found.");
    let (status, class) = smi_status(&m);
    assert_eq!(class, LicenseStatus::Unlicensed, "{status}");
    assert_eq!(status, "Unlicensed (Unrestricted)");
    wait_for(
        "Unlicensed (Restricted)",
        T,
        || (smi_status(&m).1 == LicenseStatus::Restricted).then_some(()),
        || m.gridd_log(),
    );
    assert_eq!(smi_status(&m).0, "Unlicensed (Restricted)");
    assert!(
        parsed_events(pid)
            .iter()
            .any(|e| e.what.kind == EventKind::UnlicensedNotice)
    );
}

#[test]
fn passthrough_gpu_is_not_licensable() {
    let m = Machine::new(setup(|s| s.passthrough = true));
    let pid = m.start_gridd();
    wait_line(&m, pid, "Licensing not supported for GPUs in the system");
    assert!(
        parsed_events(pid)
            .iter()
            .any(|e| e.what.reason == Some(Reason::LicensingUnsupported))
    );
    let snap = smi::parse(&m.smi(&["-q"]).stdout).unwrap();
    assert_eq!(
        snap.gpus[0].virtualization_mode.as_deref(),
        Some("Pass-Through")
    );
    assert!(!snap.gpus[0].has_license_section);
    assert_eq!(snap.gpus[0].profile.as_deref(), Some("NVIDIA L40S"));
    let xml = smi::parse(&m.smi(&["-q", "-x"]).stdout).unwrap();
    assert!(!xml.gpus[0].has_license_section);
}

#[test]
fn smi_hangs_or_fails_as_set_and_prints_the_other_forms() {
    // No gridd here: the journal lock is not needed, but the machine takes it anyway.
    let m = Machine::new(Setup::default());
    let list = m.smi(&["-L"]);
    assert_eq!(
        String::from_utf8_lossy(&list.stdout).trim(),
        "GPU 0: NVIDIA L40S-24Q (UUID: GPU-62f13b27-1eda-11b2-a8b5-0869ebe25264)"
    );
    let table = String::from_utf8_lossy(&m.smi(&[]).stdout).into_owned();
    assert!(table.contains("NVIDIA-SMI 550.90.07") && table.contains("NVIDIA L40S-24Q"));
    assert_eq!(m.smi(&["--bogus"]).status.code(), Some(2));

    m.update_sim(|s| s.smi_mode = SmiMode::NoDriver);
    let out = m.smi(&["-q"]);
    assert_eq!(out.status.code(), Some(9));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    ));
    assert!(smi::parse(&out.stdout).unwrap().driver_error.is_some());

    m.update_sim(|s| s.smi_mode = SmiMode::Hang);
    let mut child = Command::new(m.path("bin/nvidia-smi"))
        .arg("-q")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "it hangs");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn systemctl_stand_in_tells_whether_gridd_runs() {
    let m = Machine::new(Setup::default());
    let sc = |args: &[&str]| {
        let o = Command::new(m.path("bin/systemctl"))
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        )
    };
    assert_eq!(
        sc(&["is-active", "nvidia-gridd.service"]),
        (Some(3), "inactive".into())
    );
    let pid = m.start_gridd();
    assert_eq!(
        sc(&["is-active", "nvidia-gridd.service"]),
        (Some(0), "active".into())
    );
    assert_eq!(
        sc(&["show", "-P", "MainPID", "nvidia-gridd.service"]),
        (Some(0), pid.to_string())
    );
    m.crash_gridd();
    assert_eq!(
        sc(&["is-active", "nvidia-gridd.service"]),
        (Some(3), "inactive".into())
    );
}
