//! The simulator checked on its own (no agent): its gridd's lines reach the real journal as
//! `nvidia-gridd`, are each a line the samples show (or marked as one they do not), and read
//! as the agent's parsers expect; its gridd accepts the tokens its DLS signed and no other;
//! its nvidia-smi prints what the parsers read as the simulated state; its DLS serves the
//! leasing paths as each test sets it; and its restart command restarts and counts. The
//! end-to-end scenarios (tests/service.rs) rely on all this.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::sim::gridd_lines::{self, Source};
use crate::common::sim::{
    self, FakeDls, Machine, Mode, NetworkFailure, Setup, SimConfig, SmiMode, wait_for,
};
use vgpu_license_model::observe::journal::{self, GriddEvent};
use vgpu_license_model::observe::smi::{self, LicenseStatus, classify_status};
use vgpu_license_model::report::{EventKind, Reason};

const T: Duration = Duration::from_secs(15);

fn setup(f: impl FnOnce(&mut SimConfig)) -> Setup {
    let mut s = Setup::default();
    f(&mut s.sim);
    s
}

/// Waits until gridd `pid` logged a line containing `text`; returns all its lines, each
/// checked to be one of the templates of `tests/sim/gridd_lines.rs`.
fn wait_line(m: &Machine, pid: i32, text: &str) -> Vec<String> {
    let lines = wait_for(
        &format!("gridd {pid} to log {text:?}"),
        T,
        || {
            let lines = m.gridd_messages(pid);
            lines.iter().any(|l| l.contains(text)).then_some(lines)
        },
        || m.gridd_log(),
    );
    assert_known_lines(&lines);
    lines
}

/// Every line is one of the simulator's templates.
fn assert_known_lines(lines: &[String]) {
    for l in lines {
        assert!(
            gridd_lines::template_of(l).is_some(),
            "the simulated gridd logged a line with no template in gridd_lines.rs: {l:?}"
        );
    }
}

/// A sample's gridd messages: the text after `nvidia-gridd[PID]: `, `nvidia-gridd: ` or a
/// Windows log's `<N>:`.
fn sample_messages(file: &str) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/samples")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let l = l.trim_end();
            if let Some(i) = l.find("nvidia-gridd[") {
                let r = &l[i..];
                return Some(r[r.find("]: ")? + 3..].to_string());
            }
            if let Some(i) = l.find("nvidia-gridd: ") {
                return Some(l[i + "nvidia-gridd: ".len()..].to_string());
            }
            let i = l.find(">:")?;
            l[..i]
                .rfind('<')
                .filter(|j| l[j + 1..i].chars().all(|c| c.is_ascii_digit()))
                .map(|_| l[i + 2..].to_string())
        })
        .collect()
}

fn sample_files() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/samples");
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gridd-log-"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_line_gridd_can_log_is_held_to_its_source() {
    let all: Vec<(String, Vec<String>)> = sample_files()
        .into_iter()
        .map(|f| {
            let m = sample_messages(&f);
            (f, m)
        })
        .collect();
    assert!(all.len() >= 10, "the samples are where they were");
    for line in gridd_lines::ALL {
        match line.source {
            Source::Sample(files) => {
                assert!(!files.is_empty());
                for f in files {
                    let (_, msgs) = all
                        .iter()
                        .find(|(n, _)| n == f)
                        .unwrap_or_else(|| panic!("{f}: no such gridd sample"));
                    assert!(
                        msgs.iter().any(|m| line.matches(m)),
                        "{:?} is said to be in {f}, which has no such line:\n{msgs:#?}",
                        line.template
                    );
                }
            }
            Source::Unsampled(why) => {
                assert!(!why.is_empty());
                for (f, msgs) in &all {
                    assert!(
                        !msgs.iter().any(|m| line.matches(m)),
                        "{:?} is marked as shown by no sample, but {f} shows it: mark it so",
                        line.template
                    );
                }
            }
        }
    }
    // The matcher itself: a value for each `{}`, the literals in place.
    let acquired = gridd_lines::ACQUIRED;
    assert!(acquired.matches(
        "License acquired successfully. (Info: 10.0.0.5, NVIDIA Virtual PC; Expiry: 2024-1-2 3:4:5 GMT)"
    ));
    assert!(!acquired.matches("License acquired successfully. (Info: , x; Expiry: y)"));
    assert!(!acquired.matches("License acquired successfully. (Info: a, b; Expiry: c"));
    assert!(!gridd_lines::STARTED.matches("Started ()"));
    assert_eq!(
        gridd_lines::template_of("Failed to acquire license from h (Info: e - Error: x)")
            .map(|l| l.template),
        Some(gridd_lines::ACQUIRE_FAILED.template)
    );
    assert_eq!(
        gridd_lines::template_of("Failed to acquire license from h").map(|l| l.template),
        Some(gridd_lines::ACQUIRE_FAILED_BARE.template)
    );
    assert!(gridd_lines::template_of("Failed to acquire license").is_none());
    // The error texts the simulator puts in its failure lines are each in a sample.
    let fne = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/samples/flexnet-embedded-error-strings.txt"),
    )
    .unwrap();
    for text in [
        gridd_lines::ERROR_WINDBACK,
        gridd_lines::ERROR_HTTP,
        gridd_lines::TOKEN_CONFIG_ERROR_TEXT,
    ] {
        assert!(fne.lines().any(|l| l == text), "{text:?}");
    }
    assert!(
        sample_messages("gridd-log-fastapi-dls-4-windows.txt")
            .iter()
            .any(|m| m.ends_with(&format!("(Error: {})", gridd_lines::ERROR_NETWORK)))
    );
}

#[test]
fn dls_signed_tokens_verify_and_edited_ones_do_not() {
    use sim::dls::jws::{self, Rejected};
    use vgpu_license_model::token::Token;
    // The committed key pair is one.
    let public = jws::spki_rsa_public_key(&jws::pem_der(jws::PUBLIC_KEY_PEM)).unwrap();
    assert_eq!(public, jws::signing_key_public());

    let good = sim::token_for("dls.example", 8082, "t");
    let v = jws::verify(&good).unwrap();
    assert_eq!(
        v.nodes,
        [jws::Node {
            host: "dls.example".into(),
            auth_port: 8082,
            lease_port: 8082
        }]
    );
    // An edited payload: the agent reads it as a token (nothing to verify against on a
    // guest), the simulated gridd rejects it, as the real one does.
    let edited = sim::edit_payload(&good, |p| {
        p["service_instance_configuration"]["node_url_list"][0]["url"] = "evil.example".into()
    });
    assert_eq!(
        Token::decode(&edited).unwrap().nodes[0].host,
        "evil.example"
    );
    assert_eq!(jws::verify(&edited).unwrap_err(), Rejected::Signature);
    // Tokens with a filler signature (the agent's other tests) are not the DLS's.
    let filler = crate::common::valid_token("x");
    assert!(Token::decode(&filler).is_ok());
    assert_eq!(jws::verify(&filler).unwrap_err(), Rejected::Signature);
    // Truncated, not a token at all.
    assert!(matches!(
        jws::verify(&good[..good.len() - 40]),
        Err(Rejected::Signature | Rejected::Malformed(_))
    ));
    assert!(matches!(
        jws::verify(b"FeatureType=1\n"),
        Err(Rejected::Malformed(_))
    ));
    // The signature covers the header too.
    let text = String::from_utf8(good.clone()).unwrap();
    let (_, rest) = text.split_once('.').unwrap();
    let other_header = format!(
        "{}.{rest}",
        base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            br#"{"typ":"JWT","alg":"RS256"}"#
        )
    );
    assert_eq!(
        jws::verify(other_header.as_bytes()).unwrap_err(),
        Rejected::Signature
    );
    // The signature is the key's, not a constant: two payloads, two signatures.
    let other = sim::token_for("dls.example", 8082, "u");
    assert_ne!(
        String::from_utf8(good).unwrap().rsplit('.').next(),
        String::from_utf8(other).unwrap().rsplit('.').next()
    );
}

/// The agent's parser over the journal's JSON of gridd `pid`.
fn parsed_events(m: &Machine, pid: i32) -> Vec<GriddEvent> {
    // This machine's gridd since the machine started: pids come round again in the boot's
    // journal, and other tests' machines run at the same time.
    let out = Command::new("journalctl")
        .args([
            "--boot",
            "--output=json",
            "--no-pager",
            "_COMM=nvidia-gridd",
            &m.gridd_match,
        ])
        .arg(format!("_PID={pid}"))
        .arg(format!("--since={}", m.since))
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
    assert_eq!(
        dls.requests(),
        ["POST /auth/v1/origin 200", "POST /auth/v1/origin 200"]
    );
    // Only the leasing API's paths: anything else is a 404, with a Date all the same (the
    // agent's probe reads it from any answer).
    let t2 = Duration::from_secs(3);
    let a = sim::https::request("127.0.0.1", dls.port(), "GET", "/", "", t2).unwrap();
    assert_eq!(a.status, 404);
    assert!(a.date.is_some());
    let a = sim::https::request("127.0.0.1", dls.port(), "GET", "/auth/v1/origin", "", t2).unwrap();
    assert_eq!(a.status, 405);
    let lease = sim::https::request(
        "127.0.0.1",
        dls.port(),
        "POST",
        "/leasing/v1/lessor",
        "{}",
        t2,
    )
    .unwrap();
    assert_eq!(lease.status, 200);
    let body: serde_json::Value = serde_json::from_slice(&lease.body).unwrap();
    let r = body["lease_result_list"][0]["lease"]["ref"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(dls.leases(), std::slice::from_ref(&r));
    let path = format!("/leasing/v1/lease/{r}");
    let renew = sim::https::request("127.0.0.1", dls.port(), "PUT", &path, "{}", t2).unwrap();
    assert_eq!(renew.status, 200);
    let ret = sim::https::request("127.0.0.1", dls.port(), "DELETE", &path, "", t2).unwrap();
    assert_eq!(ret.status, 200);
    assert!(dls.leases().is_empty());
    let again = sim::https::request("127.0.0.1", dls.port(), "PUT", &path, "{}", t2).unwrap();
    assert_eq!(again.status, 404, "a returned lease is gone");
    // A proxy whose DLS is down.
    dls.set_mode(Mode::BadGateway);
    let a =
        sim::https::request("127.0.0.1", dls.port(), "POST", "/auth/v1/origin", "{}", t2).unwrap();
    assert_eq!(a.status, 502);
    assert!(!a.success());
    dls.set_mode(Mode::Up);

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
    // Refusing last: it gives the port up, and on a loaded machine another test's server
    // may take it before a later mode binds it again.
    dls.set_mode(Mode::Refusing);
    let e = sim::https::https_date("127.0.0.1", dls.port(), t).unwrap_err();
    assert!(e.contains("connect") && e.contains("refused"), "{e}");
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
    // Driver 550 (gridd-log-fnos-1.txt) says no `vGPU Software package (0)`.
    assert!(!lines.iter().any(|l| l.starts_with("vGPU Software package")));
    // The licensing client's walk, every step a 2xx.
    assert_eq!(
        m.dls.requests(),
        [
            "POST /auth/v1/origin 200",
            "POST /auth/v1/code 200",
            "POST /auth/v1/token 200",
            "POST /leasing/v1/lessor 200",
        ]
    );
    assert_eq!(m.dls.leases().len(), 1);

    // As the agent reads it: journald's fields and the agent's own parser.
    let entries = m.gridd_entries(&["_COMM=nvidia-gridd", &format!("_PID={pid}")]);
    assert!(
        entries
            .iter()
            .all(|e| e["SYSLOG_IDENTIFIER"] == "nvidia-gridd"
                && e["_COMM"] == "nvidia-gridd"
                && e["SYSLOG_PID"] == pid.to_string().as_str())
    );
    let events = parsed_events(&m, pid);
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
    let out = Command::new(sim::program("sim-restart-gridd"))
        .arg("--sim-dir")
        .arg(&m.sim)
        .output()
        .unwrap();
    assert!(out.status.success());
    let new: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_ne!(new, pid);
    assert_eq!(m.restarts(), 1);
    let old = m.gridd_messages(pid);
    assert_known_lines(&old);
    assert!(
        m.dls
            .requests()
            .iter()
            .any(|r| r.starts_with("DELETE /leasing/v1/lease/") && r.ends_with(" 200")),
        "{:?}",
        m.dls.requests()
    );
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
    let seen = count(&m.gridd_messages(pid));
    wait_for(
        "another Unable to fetch",
        T,
        || (count(&m.gridd_messages(pid)) > seen).then_some(()),
        || m.gridd_log(),
    );
    assert_eq!(m.gridd_pid(), Some(pid), "it keeps running");
    std::fs::set_permissions(
        m.token_path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o744),
    )
    .unwrap();
    wait_line(&m, pid, "License acquired successfully");
    let events = parsed_events(&m, pid);
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
        || (count(&m.gridd_messages(pid)) >= 3).then_some(()),
        || m.gridd_log(),
    );
    assert!(
        !m.gridd_messages(pid)
            .iter()
            .any(|l| l.starts_with("Acquiring"))
    );
}

/// Runs a gridd as a child of the test, to see its exit code.
fn run_gridd_to_exit(m: &Machine) -> (i32, i32) {
    let mut child = Command::new(sim::program("sim-nvidia-gridd"))
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
        gridd_lines::DECODE_SIGNATURE.template.to_string(),
        gridd_lines::READ_TOKEN_CONFIG.format(&[gridd_lines::TOKEN_CONFIG_ERROR_TEXT]),
        gridd_lines::SETUP_LICENSE_MANAGER.template.to_string(),
    ];
    // A copy-paste that broke the token, then one whose payload was edited (well formed, a
    // token to the agent; its signature no longer verifies).
    let mut broken = m.token();
    broken.truncate(broken.len() - 40);
    for bad in [broken, m.edited_token()] {
        sim::write_mode(&m.token_path(), &bad, 0o744);
        let (pid, code) = run_gridd_to_exit(&m);
        assert_eq!(code, 1);
        let lines = wait_line(&m, pid, "Shutdown");
        let tail = &lines[lines.len() - 4..];
        assert_eq!(tail[..3], want);
        assert_eq!(tail[3], format!("Shutdown ({pid})"));
        assert!(!lines.iter().any(|l| l.starts_with("Acquiring")));
        let events = parsed_events(&m, pid);
        assert!(
            events.iter().any(|e| e.what.kind == EventKind::TokenError
                && e.what.reason == Some(Reason::TokenInvalid))
        );
    }
    assert!(m.dls.requests().is_empty(), "no DLS contact on a bad token");
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

/// The count of gridd `pid`'s lines equal to `line`.
fn count_line(m: &Machine, pid: i32, line: &str) -> usize {
    m.gridd_messages(pid).iter().filter(|l| *l == line).count()
}

/// Waits for gridd `pid` to log `line` once more than it has so far.
fn wait_another(m: &Machine, pid: i32, line: &str) {
    let n = count_line(m, pid, line);
    wait_for(
        &format!("another {line:?}"),
        T,
        || (count_line(m, pid, line) > n).then_some(()),
        || m.gridd_log(),
    );
}

#[test]
fn gridd_meets_clock_skew_an_unreachable_dls_and_a_failing_proxy() {
    let m = Machine::new(Setup::default());
    m.drop_token(0o744);
    m.dls.set_skew(3600);
    let pid = m.start_gridd();
    let failed = |error: &str| {
        gridd_lines::ACQUIRE_FAILED.format(&["127.0.0.1", "NVIDIA RTX Virtual Workstation", error])
    };
    wait_line(&m, pid, &failed(gridd_lines::ERROR_WINDBACK));
    assert!(parsed_events(&m, pid).iter().any(
        |e| e.what.kind == EventKind::AcquireFailed && e.what.reason == Some(Reason::ClockSkew)
    ));
    // A DLS that refuses, then one that speaks no TLS: the full failure line (the form of
    // gridd's real failure lines; `network_failure` in the sim's settings).
    m.dls.set_skew(0);
    m.dls.set_mode(Mode::Refusing);
    let network = failed(gridd_lines::ERROR_NETWORK);
    wait_another(&m, pid, &network);
    m.dls.set_mode(Mode::BadTls);
    wait_another(&m, pid, &network);
    assert!(
        parsed_events(&m, pid)
            .iter()
            .any(|e| e.what.kind == EventKind::AcquireFailed
                && e.what.reason == Some(Reason::DlsUnreachable))
    );
    // A proxy in front of the DLS answers 502: an HTTP error, not a lease.
    m.dls.set_mode(Mode::BadGateway);
    let http = failed(gridd_lines::ERROR_HTTP);
    wait_another(&m, pid, &http);
    assert!(
        m.dls
            .requests()
            .iter()
            .any(|r| r == "POST /auth/v1/origin 502")
    );
    assert!(
        !m.dls.requests().iter().any(|r| r.contains("/leasing/")),
        "no lease asked for after a failed step: {:?}",
        m.dls.requests()
    );
    assert_eq!(smi_status(&m).1, LicenseStatus::Unlicensed);
    // Back: gridd retries by itself.
    m.dls.set_mode(Mode::Up);
    let lines = wait_line(&m, pid, "License acquired successfully");
    assert!(
        !lines
            .iter()
            .any(|l| l == "Failed to acquire license from 127.0.0.1")
    );
}

#[test]
fn gridd_can_word_a_network_failure_bare() {
    let m = Machine::new(setup(|s| s.network_failure = NetworkFailure::Bare));
    m.drop_token(0o744);
    m.dls.set_mode(Mode::Refusing);
    let pid = m.start_gridd();
    let bare = gridd_lines::ACQUIRE_FAILED_BARE.format(&["127.0.0.1"]);
    wait_another(&m, pid, &bare);
    let lines = wait_line(&m, pid, &bare);
    assert!(!lines.iter().any(|l| l.contains("Error:")), "{lines:#?}");
    assert!(
        parsed_events(&m, pid)
            .iter()
            .any(|e| e.what.kind == EventKind::AcquireFailed
                && e.what.reason == Some(Reason::Unspecified))
    );
    m.dls.set_mode(Mode::Up);
    wait_line(&m, pid, "License acquired successfully");
}

#[test]
fn driver_535_logs_its_start_up_and_says_plain_unlicensed() {
    let m = Machine::new(setup(|s| s.driver_version = "535.183.06".into()));
    let pid = m.start_gridd();
    let lines = wait_line(
        &m,
        pid,
        "Unable to fetch the client configuration token file",
    );
    // As gridd-log-cudaerror4vgpu-1.txt (driver 535.183.06), in this order.
    let want = [
        format!("Started ({pid})"),
        "vGPU Software package (0)".into(),
        "Ignore service provider and node-locked licensing".into(),
        "NLS initialized".into(),
    ];
    let mut at = 0;
    for w in &want {
        at += lines[at..]
            .iter()
            .position(|l| l == w)
            .unwrap_or_else(|| panic!("{w:?} not in order in {lines:#?}"));
    }
    // As smi-cudaerror4vgpu-1.txt: `Unlicensed`, which the agent reads as unlicensed.
    let (status, class) = smi_status(&m);
    assert_eq!(status, "Unlicensed");
    assert_eq!(class, LicenseStatus::Unlicensed);
    let text = smi::parse(&m.smi(&["-q"]).stdout).unwrap();
    assert_eq!(text.driver_version.as_deref(), Some("535.183.06"));
    let xml = smi::parse(&m.smi(&["-q", "-x"]).stdout).unwrap();
    assert_eq!(xml.gpus[0].license_status.as_deref(), Some("Unlicensed"));
    assert_eq!(xml.driver_version.as_deref(), Some("535.183.06"));
}

#[test]
fn smi_prints_two_gpus_and_a_platform_license_in_text_and_xml() {
    let m = Machine::new(setup(|s| {
        s.gpu_count = 2;
        s.platform_licensed = true;
    }));
    for args in [&["-q"][..], &["-q", "-x"][..]] {
        let out = m.smi(args);
        assert!(out.status.success());
        let snap = smi::parse(&out.stdout).unwrap();
        assert!(snap.whole, "{args:?}");
        assert_eq!(snap.gpus.len(), 2, "{args:?}");
        let ids: Vec<_> = snap.gpus.iter().map(|g| g.bus_id.clone()).collect();
        assert_eq!(
            ids,
            [
                Some("00000000:02:01.0".to_string()),
                Some("00000000:02:02.0".to_string())
            ],
            "{args:?}"
        );
        for g in &snap.gpus {
            let status = g.license_status.as_deref().unwrap();
            assert_eq!(status, "Licensed (Expiry: N/A)", "{args:?}");
            assert_eq!(classify_status(status), LicenseStatus::Licensed(None));
            assert_eq!(g.profile.as_deref(), Some("NVIDIA L40S-24Q"));
            assert_eq!(g.virtualization_mode.as_deref(), Some("VGPU"));
        }
    }
    let list = String::from_utf8(m.smi(&["-L"]).stdout).unwrap();
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(
        list.lines()
            .nth(1)
            .unwrap()
            .starts_with("GPU 1: NVIDIA L40S-24Q (UUID: GPU-")
    );
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
        m.gridd_messages(p)
            .iter()
            .filter(|l| l.starts_with("Acquiring"))
            .count()
    };
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(acquiring(pid), 1, "no retry without a restart");
    let out = Command::new(sim::program("sim-restart-gridd"))
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
        parsed_events(&m, pid)
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
        parsed_events(&m, pid)
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
        parsed_events(&m, pid)
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

/// The test proxy: `CONNECT` to the targets it is given, tunnelled to the fake DLS; a 403 to
/// any other target and while refusing; a 405 to anything but `CONNECT`. Every request
/// recorded.
#[test]
fn connect_proxy_tunnels_only_what_it_is_given() {
    let dls = FakeDls::start();
    let proxy = sim::ConnectProxy::start(&[(sim::CLS_TARGET, dls.addr())]);
    let t = Duration::from_secs(3);
    let via = Some(("127.0.0.1", proxy.port()));
    let cls = "api.cls.licensing.nvidia.com";
    let a = sim::https::request_via(via, cls, 443, "POST", "/auth/v1/origin", "{}", t).unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(dls.requests(), ["POST /auth/v1/origin 200"]);
    let other = sim::https::request_via(via, "dls.example", 443, "GET", "/", "", t).unwrap_err();
    assert!(other.contains("403"), "{other}");
    proxy.set_refusing(true);
    let refused = sim::https::request_via(via, cls, 443, "GET", "/", "", t).unwrap_err();
    assert!(refused.contains("403 Forbidden"), "{refused}");
    let mut plain = std::net::TcpStream::connect(proxy.addr()).unwrap();
    use std::io::{Read, Write};
    plain
        .write_all(b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    plain.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert_eq!(
        proxy.requests(),
        [
            format!("CONNECT {} 200", sim::CLS_TARGET),
            "CONNECT dls.example:443 403".into(),
            format!("CONNECT {} 403", sim::CLS_TARGET),
            "GET http://example.com/ 405".into(),
        ]
    );
    assert_eq!(dls.requests().len(), 1, "nothing refused reached the DLS");
    // Without a proxy, the simulated machine resolves only /etc/hosts' names, never by DNS.
    let direct = sim::https::request(cls, 443, "GET", "/", "", t).unwrap_err();
    assert!(direct.contains("uses no DNS"), "{direct}");
}

/// A CLS guest: the token names `api.cls.licensing.nvidia.com:443`. Without gridd.conf's
/// proxy keys gridd tries the host itself and fails with the network failure line (the name
/// does not resolve on the simulated machine); with them it goes through the proxy, fails
/// the same way while the proxy refuses, and leases from the DLS behind it once it lets
/// gridd through.
#[test]
fn gridd_reaches_the_cls_only_through_the_proxy_gridd_conf_names() {
    let m = Machine::new(Setup {
        token_node: Some(("api.cls.licensing.nvidia.com".into(), 443)),
        ..Setup::default()
    });
    let proxy = sim::ConnectProxy::start(&[(sim::CLS_TARGET, m.dls.addr())]);
    let conf = m.sim_config().gridd_conf;
    sim::write_mode(&conf, b"FeatureType=1\n", 0o644);
    m.drop_token(0o744);
    let network = gridd_lines::ACQUIRE_FAILED.format(&[
        "api.cls.licensing.nvidia.com",
        "NVIDIA RTX Virtual Workstation",
        gridd_lines::ERROR_NETWORK,
    ]);
    let pid = m.start_gridd();
    wait_another(&m, pid, &network);
    assert!(proxy.requests().is_empty(), "{:?}", proxy.requests());
    assert!(m.dls.requests().is_empty(), "{:?}", m.dls.requests());
    sim::shared::stop_gridd(&m.sim, Duration::from_secs(5)).unwrap();

    sim::write_mode(
        &conf,
        format!(
            "FeatureType=1\nProxyServerAddress=127.0.0.1\nProxyServerPort={}\n",
            proxy.port()
        )
        .as_bytes(),
        0o644,
    );
    proxy.set_refusing(true);
    let pid = m.start_gridd();
    wait_another(&m, pid, &network);
    let refused = format!("CONNECT {} 403", sim::CLS_TARGET);
    assert!(
        proxy.requests().contains(&refused),
        "{:?}",
        proxy.requests()
    );
    assert!(m.dls.requests().is_empty(), "{:?}", m.dls.requests());
    assert_eq!(smi_status(&m).1, LicenseStatus::Unlicensed);
    assert!(
        parsed_events(&m, pid)
            .iter()
            .any(|e| e.what.kind == EventKind::AcquireFailed
                && e.what.reason == Some(Reason::DlsUnreachable))
    );

    proxy.set_refusing(false);
    let lines = wait_line(&m, pid, "License acquired successfully");
    assert!(
        lines.iter().any(|l| l.starts_with(
            "License acquired successfully. (Info: api.cls.licensing.nvidia.com, NVIDIA RTX Virtual Workstation; Expiry: "
        )),
        "{lines:#?}"
    );
    let opened = format!("CONNECT {} 200", sim::CLS_TARGET);
    assert!(proxy.requests().contains(&opened), "{:?}", proxy.requests());
    assert!(
        proxy
            .requests()
            .iter()
            .all(|r| r.starts_with(&format!("CONNECT {} ", sim::CLS_TARGET))),
        "{:?}",
        proxy.requests()
    );
    assert!(
        m.dls
            .requests()
            .iter()
            .any(|r| r == "POST /leasing/v1/lessor 200"),
        "{:?}",
        m.dls.requests()
    );
    assert!(matches!(smi_status(&m).1, LicenseStatus::Licensed(Some(_))));
}

/// A legacy guest (driver 470): no token, no NLS. gridd.conf's ServerAddress and ServerPort
/// name the license server; while it is down, the legacy failure line again and again; once
/// it answers, the legacy acquisition (the server's URL) and the state line, and nvidia-smi
/// says plain `Licensed`, without an expiry. A stopped gridd's license goes with it.
#[test]
fn legacy_gridd_licenses_from_the_server_gridd_conf_names() {
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
    let pid = m.start_gridd();
    let failed = gridd_lines::LEGACY_ACQUIRE_FAILED.format(&[]);
    wait_another(&m, pid, &failed);
    wait_another(&m, pid, &failed);
    assert_eq!(smi_status(&m).1, LicenseStatus::Unlicensed);
    assert!(
        parsed_events(&m, pid)
            .iter()
            .any(|e| e.what.kind == EventKind::AcquireFailed
                && e.what.legacy
                && e.what.reason == Some(Reason::Unspecified))
    );

    server.set_up(true);
    let url = format!("http://{}:7070/request", server.addr.ip());
    let lines = wait_line(&m, pid, "Your system is licensed for GRID vGPU.");
    // As gridd-log-legacy-flexnet-1.txt, in this order; nothing of the token path.
    let want = [
        format!("Started ({pid})"),
        "Service provider detection complete.".into(),
        format!("License acquired successfully. Server URL : {url}"),
        "Your system is licensed for GRID vGPU.".into(),
    ];
    let mut at = 0;
    for w in &want {
        at += lines[at..]
            .iter()
            .position(|l| l == w)
            .unwrap_or_else(|| panic!("{w:?} not in order in {lines:#?}"));
    }
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("NLS") || l.contains("token")),
        "{lines:#?}"
    );
    let (status, class) = smi_status(&m);
    assert_eq!(status, "Licensed");
    assert_eq!(class, LicenseStatus::Licensed(None));
    let ev = parsed_events(&m, pid);
    assert!(ev.iter().any(|e| e.what.kind == EventKind::Acquired
        && e.what.legacy
        && e.what.server.as_deref() == Some(&server.addr.ip().to_string()[..])));

    sim::shared::stop_gridd(&m.sim, Duration::from_secs(5)).unwrap();
    assert_eq!(smi_status(&m).1, LicenseStatus::Unlicensed);
}

/// The keys of `nvidia-smi vgpu -q` text, in order, with their indentation.
fn vgpu_q_keys(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("    "))
        .map(|l| match l.split_once(':') {
            Some((k, _)) => k.trim_end().to_string(),
            None => l.trim_end().to_string(),
        })
        .collect()
}

/// The simulated host: `nvidia-smi -q` says `Host VGPU`, `vgpu -q` lays each VM out with the
/// keys of the real 580 host's output (smi-host-vgpu-q-two-vms.txt), in its order, and reads
/// as the parser expects; the simulated vGPU manager's lines reach the real journal as
/// `nvidia-vgpu-mgr`'s, each a line of the samples but for its versions.
#[test]
fn the_simulated_host_prints_and_logs_as_the_real_one() {
    let m = Machine::new(setup(|c| c.host = true));
    let q = String::from_utf8(m.smi(&["-q"]).stdout).unwrap();
    assert!(
        q.lines().any(|l| l
            .split_once(':')
            .is_some_and(|(k, v)| k.trim() == "Virtualization Mode" && v.trim() == "Host VGPU")),
        "{q}"
    );
    assert!(!q.contains("License Status"), "{q}");
    m.vgpu_mgr(&[
        "3251637554",
        "booting",
        "instance-00000004",
        "083bc63f-0a3c-4647-9bb4-27f905b7d7bb",
    ]);
    m.vgpu_mgr(&[
        "3251637566",
        "unlicensed",
        "instance-00000005",
        "f0adb76f-7612-4c68-84b4-375a4e6c5476",
    ]);
    let out = String::from_utf8(m.smi(&["vgpu", "-q"]).stdout).unwrap();
    let sample = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/samples/smi-host-vgpu-q-two-vms.txt"),
    )
    .unwrap();
    assert_eq!(vgpu_q_keys(&out), vgpu_q_keys(&sample), "{out}");
    let snap = smi::parse(out.as_bytes()).unwrap();
    assert!(snap.host_view);
    let vms: Vec<(Option<&str>, Option<&str>)> = snap
        .host_vgpus
        .iter()
        .map(|v| (v.guest_driver.as_deref(), v.license_status.as_deref()))
        .collect();
    assert_eq!(
        vms,
        [
            (Some("N/A"), Some("N/A (Expiry: N/A)")),
            (Some("580.105.08"), Some("Unlicensed (Unrestricted)"))
        ]
    );
    m.vgpu_mgr(&["3251637566", "licensed"]);
    m.vgpu_mgr(&["3251637554", "stopped"]);
    let out = String::from_utf8(m.smi(&["vgpu", "-q"]).stdout).unwrap();
    let snap = smi::parse(out.as_bytes()).unwrap();
    assert_eq!(snap.host_vgpus.len(), 1);
    assert!(
        snap.host_vgpus[0]
            .license_status
            .as_deref()
            .is_some_and(|s| s.starts_with("Licensed (Expiry: ")),
        "{out}"
    );
    // The lines, from journald, as the vGPU manager's.
    let lines = wait_for(
        "the vGPU manager's license line",
        T,
        || {
            let e = sim::journal(&["_COMM=nvidia-vgpu-mgr"], Some(&m.since));
            let lines: Vec<String> = e.iter().map(sim::message).collect();
            lines
                .iter()
                .any(|l| l.ends_with("vGPU license state: Licensed"))
                .then_some(lines)
        },
        String::new,
    );
    let samples: Vec<String> = [
        "host-vgpu-mgr-log-ubuntu-server-docs.txt",
        "host-vgpu-mgr-log-vgpu_unlock-rs-37.txt",
    ]
    .iter()
    .flat_map(|f| {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/samples")
                .join(f),
        )
        .unwrap();
        text.lines()
            .filter_map(|l| Some(l[l.find("]: ")? + 3..].to_string()))
            .collect::<Vec<_>>()
    })
    .collect();
    let versions = |l: &str| match l.split_once("Driver Version: ") {
        Some((head, _)) => format!("{head}Driver Version: X"),
        None => l.to_string(),
    };
    let known: Vec<String> = samples.iter().map(|l| versions(l)).collect();
    for line in &lines {
        // The throttled guest's wording is the guest's own `License Status` (no sample of
        // the host logging it).
        let line = line.replace("Unlicensed (Restricted)", "Unlicensed (Unrestricted)");
        assert!(known.contains(&versions(&line)), "{line:?} is in no sample");
    }
}
