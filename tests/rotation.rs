//! Day 2 in the token directory, end to end (the real agent, the real journald, the
//! simulator): NVIDIA's rotation (a new token copied beside the installed one), a broken token
//! copied beside it, a stray dropped there, a restart that must wait for the backoff, and a
//! new token while no license is held. What operators rely on: the newest valid token wins,
//! nothing refused is silent, a licensed gridd is restarted only when what it reads changed,
//! and a restart said to come in N s comes then.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::sim::{self, Agent, Machine, Mode, Setup, reason, token_for, write_gridd_conf};
use crate::service::{T, agent_says, licensed_patient, settle};
use serde_json::Value;

/// The name the DLS gives a token it hands out.
const DOWNLOAD: &str = "client_configuration_token_12-01-2026-09-30-00.tok";

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

/// Every file under `replaced/`, with its bytes.
fn replaced(m: &Machine) -> Vec<(String, Vec<u8>)> {
    let root = m.path("var/lib/vgpu-license-agent/replaced");
    let Ok(dirs) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    dirs.flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// A valid token for this machine's DLS that differs from [`Machine::token`].
fn new_token(m: &Machine, jti: &str) -> Vec<u8> {
    token_for("127.0.0.1", m.dls.port(), jti)
}

/// `status --json` as a monitoring check runs it: its exit code and report.
fn status(m: &Machine) -> (Option<i32>, Value) {
    let (code, out) = cli(m, &["status", "--json"]);
    (code, serde_json::from_str(&out).unwrap_or(Value::Null))
}

/// A command of the agent with the machine's config: its exit code and standard output.
fn cli(m: &Machine, args: &[&str]) -> (Option<i32>, String) {
    let out = m.cli(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// No restart of gridd happens in the next `window`.
fn no_restart_for(m: &Machine, a: &Agent, window: Duration) {
    let before = m.restarts();
    std::thread::sleep(window);
    assert_eq!(m.restarts(), before, "no restart: {}", a.context());
}

#[test]
fn scenario_nvidia_rotation_adopts_the_new_token_with_one_restart() {
    let (m, a) = licensed_patient();
    let old = std::fs::read(m.token_path()).unwrap();
    let before = m.restarts();
    let dir = m.token_dir();
    let new = new_token(&m, "rotated");
    // As NVIDIA's guide says: copy the DLS's file into the directory (cp gives it 0644).
    sim::write_mode(&dir.join(DOWNLOAD), &new, 0o644);
    sim::wait_for(
        "the new token alone in the token directory",
        T,
        || (names(&dir) == [DOWNLOAD]).then_some(()),
        || a.context(),
    );
    assert_eq!(std::fs::read(dir.join(DOWNLOAD)).unwrap(), new);
    sim::wait_for(
        "gridd restarted for the new token",
        T,
        || (m.restarts() > before).then_some(()),
        || a.context(),
    );
    // The rotation stays visible in the report, with the way back.
    let v = a.wait_status(
        "licensed again, nothing wrong, the rotation noted",
        T,
        |v| {
            v["state"] == "licensed"
                && v["failure"].is_null()
                && v["notes"].to_string().contains("The token was rotated")
        },
    );
    let notes = v["notes"].to_string();
    assert!(notes.contains("install --token-file"), "{v:#}");
    assert!(
        replaced(&m).contains(&("client_configuration_token.tok".into(), old)),
        "the old token is kept in replaced/"
    );
    no_restart_for(&m, &a, Duration::from_secs(3));
    assert_eq!(m.restarts(), before + 1, "one restart: {}", a.context());
    let said = agent_says(&m, &a);
    assert!(
        said.contains("a newer token replaces client_configuration_token.tok"),
        "the restart's true reason: {said}"
    );
}

#[test]
fn scenario_a_truncated_token_beside_the_good_one_is_a_visible_warning() {
    let (m, a) = licensed_patient();
    let before = m.restarts();
    let installed = std::fs::read(m.token_path()).unwrap();
    let new = new_token(&m, "cut");
    let cut = &new[..new.len() / 2];
    sim::write_mode(&m.token_dir().join(DOWNLOAD), cut, 0o644);
    let v = a.wait_status("token_rejected, licensed", T, |v| {
        reason(v) == Some("token_rejected")
    });
    assert_eq!(v["state"], "licensed", "{v:#}");
    let message = v["failure"]["message"].as_str().unwrap();
    assert!(message.contains(DOWNLOAD), "names the file: {message}");
    // The words the agent uses for the same file alone in the directory.
    let alone = vgpu_license_model::token::Token::decode(cut)
        .unwrap_err()
        .to_string();
    assert!(message.contains(&alone), "{message}\nvs\n{alone}");
    sim::wait_for(
        "the metric vgpu_license_token_rejected 1",
        T,
        || (a.metric("vgpu_license_token_rejected") == Some(1.0)).then_some(()),
        || a.context(),
    );
    let (code, s) = status(&m);
    assert_eq!(code, Some(1), "a warning: {s:#}");
    assert_eq!(s["failure"]["reason"], "token_rejected");
    // `diagnose` at the same moment says the same, in its lines and in its report.
    let (code, out) = cli(&m, &["diagnose"]);
    assert_eq!(code, Some(1), "{out}");
    let license = out.lines().find(|l| l.contains(" license ")).unwrap_or("");
    assert!(
        license.starts_with("WARN")
            && license.contains("token_rejected")
            && license.contains(DOWNLOAD),
        "{out}"
    );
    let (code, out) = cli(&m, &["diagnose", "--json"]);
    let d: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(code, Some(1), "{d:#}");
    assert_eq!(d["failure"]["reason"], "token_rejected", "{d:#}");
    // `token inspect` of the installed token says it too: the file refused beside it.
    let (code, out) = cli(&m, &["token", "inspect"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("Status:   token_rejected") && out.contains(DOWNLOAD),
        "{out}"
    );
    assert!(
        a.journal_lines()
            .iter()
            .any(|l| l.contains("token not adopted"))
    );
    assert_eq!(std::fs::read(m.token_path()).unwrap(), installed);
    assert_eq!(names(&m.token_dir()), ["client_configuration_token.tok"]);
    assert_eq!(m.restarts(), before, "no restart: {}", a.context());

    // The right file copied next: adopted, and the warning is over.
    sim::write_mode(&m.token_dir().join(DOWNLOAD), &new, 0o644);
    a.wait_status("the rotation, the warning gone", T, |v| {
        v["state"] == "licensed" && v["failure"].is_null()
    });
    assert_eq!(a.metric("vgpu_license_token_rejected"), Some(0.0));
}

#[test]
fn scenario_a_stray_is_moved_without_a_restart() {
    let (m, a) = licensed_patient();
    let before = m.restarts();
    let dir = m.token_dir();
    sim::write_mode(&dir.join("README"), b"how we rotate tokens\n", 0o644);
    sim::write_mode(&dir.join("gridd.conf"), b"FeatureType=1\n", 0o644);
    sim::wait_for(
        "the strays moved aside",
        T,
        || (names(&dir) == ["client_configuration_token.tok"]).then_some(()),
        || a.context(),
    );
    no_restart_for(&m, &a, Duration::from_secs(3));
    assert_eq!(m.restarts(), before);
    let v = a.status().unwrap();
    assert_eq!(v["state"], "licensed");
    let said = agent_says(&m, &a);
    assert!(!said.contains("the token or gridd.conf changed"), "{said}");
    let r: Vec<String> = replaced(&m).into_iter().map(|(n, _)| n).collect();
    assert!(
        r.contains(&"README".into()) && r.contains(&"gridd.conf".into()),
        "{r:?}"
    );
}

/// The microseconds since the epoch of a journal entry.
fn entry_time(e: &Value) -> f64 {
    e["__REALTIME_TIMESTAMP"]
        .as_str()
        .and_then(|t| t.parse::<f64>().ok())
        .map(|us| us / 1e6)
        .unwrap_or_default()
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn scenario_a_deferred_restart_is_made_at_its_deadline() {
    // A backoff long enough to defer the second rotation, and a licensed poll far away: only
    // the deferral's own deadline can make the restart on time.
    let m = Machine::new(Setup::default());
    let config = m
        .config_text()
        .replace(
            "restart_backoff_seconds = 1\n",
            "restart_backoff_seconds = 8\n",
        )
        .replace(
            "restart_backoff_max_seconds = 4\n",
            "restart_backoff_max_seconds = 16\n",
        )
        .replace(
            "poll_licensed_seconds = 2\n",
            "poll_licensed_seconds = 600\n",
        );
    assert!(config.contains("restart_backoff_seconds = 8\n"), "{config}");
    m.write_config(&config);
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    settle(&m, &a);
    let dir = m.token_dir();
    // Two rotations in a row, each while the license is held: the first restarts at once or
    // is deferred, the second waits for the backoff the first began (a rotation while no
    // license is held would go in at once).
    for (i, jti) in ["first", "second"].iter().enumerate() {
        // Licensed by the gridd that runs now, as the agent's report says (not a report of
        // the gridd before the last restart).
        settle(&m, &a);
        let before = m.restarts();
        let name = format!("client_configuration_token_12-01-2026-09-3{i}-00.tok");
        let written = epoch_now();
        sim::write_mode(&dir.join(&name), &new_token(&m, jti), 0o644);
        sim::wait_for(
            "the new token adopted",
            T,
            || (names(&dir) == [name.clone()]).then_some(()),
            || a.context(),
        );
        let restarted = sim::wait_for(
            "gridd restarted for it",
            Duration::from_secs(40),
            || (m.restarts() > before).then(epoch_now),
            || a.context(),
        );
        if i == 1 {
            let deferral = m
                .agent_journal(a.pid())
                .into_iter()
                .filter(|e| entry_time(e) >= written)
                .find(|e| sim::message(e).contains("is restarted for the new token in"))
                .unwrap_or_else(|| panic!("the second rotation was deferred: {}", a.context()));
            let text = sim::message(&deferral);
            let secs: f64 = text
                .split("for the new token in ")
                .nth(1)
                .and_then(|t| t.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap();
            let deadline = entry_time(&deferral) + secs;
            // The agent's own line of the restart, timed by the journal (no test's polling in
            // between).
            let done = sim::wait_for(
                "the agent's line of the owed restart",
                T,
                || {
                    m.agent_journal(a.pid())
                        .into_iter()
                        .filter(|e| entry_time(e) >= entry_time(&deferral))
                        .find(|e| {
                            let l = sim::message(e);
                            l.starts_with("restarted nvidia-gridd (")
                                && l.contains("): an earlier restart is still owed")
                        })
                        .map(|e| entry_time(&e))
                },
                || a.context(),
            );
            assert!(done >= restarted - 5.0);
            // Said once: the looks that follow (the agent's own chmod of the new token wakes
            // it) find the same restart owed, and repeat nothing.
            let deferrals: Vec<String> = m
                .agent_journal(a.pid())
                .into_iter()
                .filter(|e| entry_time(e) >= written)
                .map(|e| sim::message(&e))
                .filter(|m| {
                    m.contains("is restarted for the new token in")
                        || m.contains("not restarted yet")
                })
                .collect();
            assert_eq!(deferrals.len(), 2, "{deferrals:#?}");
            let late = done - deadline;
            println!("deferred {secs} s; restarted {late:+.2} s from the deadline");
            assert!(late.abs() <= 1.0, "{late:+.2} s from the deadline: {text}");
        }
    }
}

#[test]
fn scenario_a_new_token_without_a_license_is_applied_at_once() {
    // The DLS refuses: the agent restarts gridd and backs off for a minute.
    let m = Machine::new(Setup::default());
    let config = m
        .config_text()
        .replace(
            "restart_backoff_seconds = 1\n",
            "restart_backoff_seconds = 60\n",
        )
        .replace(
            "restart_backoff_max_seconds = 4\n",
            "restart_backoff_max_seconds = 120\n",
        );
    m.write_config(&config);
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.dls.set_mode(Mode::Refusing);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_status("a failure", T, |v| !v["failure"].is_null());
    sim::wait_for(
        "a restart of the agent's",
        T,
        || (m.restarts() >= 1).then_some(()),
        || a.context(),
    );
    std::thread::sleep(Duration::from_secs(1));
    let before = m.restarts();
    // The fix arrives: a new token. (The DLS comes back once gridd was restarted for it:
    // back before, gridd's own retry would get a license with the old token, and a licensed
    // gridd's restart for a new one rightly waits for the backoff.)
    let at = Instant::now();
    sim::write_mode(&m.token_dir().join(DOWNLOAD), &new_token(&m, "fix"), 0o644);
    sim::wait_for(
        "gridd restarted for the new token within 5 s, backoff or not",
        Duration::from_secs(5),
        || (m.restarts() > before).then_some(()),
        || a.context(),
    );
    println!(
        "restarted {:.2} s after the token came",
        at.elapsed().as_secs_f64()
    );
    m.dls.set_mode(Mode::Up);
    a.wait_state("licensed", T);
    let said = agent_says(&m, &a);
    assert!(said.contains("a newer token replaces"), "{said}");
}

/// The service killed at every step of an adoption (NVIDIA's rotation: a new token copied
/// beside the installed one): the directory holds a whole valid token each time, and the
/// next start finishes the job (the new token alone, under whichever name, the old one kept
/// in `replaced/`).
#[test]
fn scenario_an_adoption_killed_at_any_step_leaves_a_whole_token() {
    // The token adopted is already in place: no new token is written (the install's
    // `crash-after-commit` step), the rest are the install's.
    for point in [
        "crash-after-stage",
        "crash-after-save",
        "crash-after-first-move",
        "crash-after-all-moves",
    ] {
        let (m, mut a) = licensed_patient();
        a.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(a.wait_exit(T).is_some(), "{point}: {}", a.context());
        let old = std::fs::read(m.token_path()).unwrap();
        let new = new_token(&m, point);
        sim::write_mode(&m.token_dir().join(DOWNLOAD), &new, 0o644);
        std::fs::write(m.token_dir().join("README"), b"a stray").unwrap();
        let mut crashed =
            Agent::start_with_env(&m, &[("VGPU_LICENSE_AGENT_FAULT", point.as_ref())]);
        let status = crashed.wait_exit(T);
        assert!(
            status.is_some_and(|s| !s.success()),
            "{point}: stopped dead: {}",
            crashed.context()
        );
        let whole: Vec<String> = names(&m.token_dir())
            .into_iter()
            .filter(|n| !n.starts_with('.'))
            .filter(|n| std::fs::read(m.token_dir().join(n)).is_ok_and(|b| b == old || b == new))
            .collect();
        assert!(!whole.is_empty(), "{point}: no whole token left");
        let a = Agent::start(&m);
        sim::wait_for(
            "the adoption finished by the next start",
            T,
            || {
                let left = names(&m.token_dir());
                (left.len() == 1
                    && std::fs::read(m.token_dir().join(&left[0])).is_ok_and(|b| b == new))
                .then_some(())
            },
            || format!("{point}: {:?}\n{}", names(&m.token_dir()), a.context()),
        );
        assert!(
            replaced(&m).iter().any(|(_, b)| *b == old),
            "{point}: the old token kept in replaced/"
        );
    }
}

/// A new token written in two writes beside the installed one (`cat > FILE`, scp, a config
/// tool), with a pause between them longer than the second a file must be still before it
/// is judged: the half file, still open for writing, is not judged a stray and moved away
/// under its writer; once whole and closed, it is the rotation, adopted with one restart.
#[test]
fn scenario_a_token_being_written_is_not_moved_under_its_writer() {
    use std::io::Write;
    let (m, a) = licensed_patient();
    settle(&m, &a);
    let before = m.restarts();
    let new = new_token(&m, "in-two-writes");
    let path = m.token_dir().join(DOWNLOAD);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&new[..new.len() / 2]).unwrap();
    f.flush().unwrap();
    // Longer than the settling second, however late this thread wakes.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        path.exists(),
        "the half-written file stays where its writer writes: {}",
        a.context()
    );
    f.write_all(&new[new.len() / 2..]).unwrap();
    drop(f);
    sim::wait_for(
        "the whole new token adopted",
        T,
        || (names(&m.token_dir()) == [DOWNLOAD] && m.restarts() > before).then_some(()),
        || a.context(),
    );
    assert_eq!(std::fs::read(&path).unwrap(), new, "{}", a.context());
    assert!(
        replaced(&m).iter().all(|(n, _)| n != DOWNLOAD),
        "no part of the new token in replaced/"
    );
}

/// A file held open for writing in the token directory (a user's editor, a stuck copy)
/// holds nothing else up: a new token dropped beside it is adopted with one restart, the held
/// file left where its writer writes (never moved under it), and judged once it is closed.
#[test]
fn scenario_a_held_file_does_not_stall_the_token_directory() {
    use std::io::Write;
    let (m, a) = licensed_patient();
    settle(&m, &a);
    let before = m.restarts();
    let held = m.token_dir().join("notes.txt");
    let mut editor = std::fs::File::create(&held).unwrap();
    editor.write_all(b"half a note").unwrap();
    editor.flush().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let new = new_token(&m, "beside-a-held-file");
    sim::write_mode(&m.token_dir().join(DOWNLOAD), &new, 0o644);
    sim::wait_for(
        "the new token adopted while the other file is held",
        T,
        || {
            let there = names(&m.token_dir());
            let adopted = there.len() == 2 && there.iter().any(|n| n == DOWNLOAD);
            (adopted && m.restarts() > before).then_some(())
        },
        || a.context(),
    );
    assert!(
        held.exists(),
        "the held file stays under its writer: {}",
        a.context()
    );
    // Closed: judged as any file, and moved aside as a stray.
    drop(editor);
    sim::wait_for(
        "the closed file moved aside",
        T,
        || (!held.exists()).then_some(()),
        || a.context(),
    );
    assert!(replaced(&m).iter().any(|(n, _)| n == "notes.txt"));
}

/// A file that is no token, dropped where the token goes and written to again and again (a
/// sync tool, a loop in a script): each change is judged, but the same refusal is logged
/// once, not at every look; a different file is news again.
#[test]
fn scenario_the_same_refusal_is_logged_once() {
    let m = Machine::new(Setup::default());
    write_gridd_conf(&m);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_status("a report", T, |_| true);
    let refusals = || {
        a.journal_lines()
            .iter()
            .filter(|l| l.contains("token not adopted"))
            .count()
    };
    // `bytes` written `times` times, 400 ms apart: then the refusals said are `said`.
    let rewrite = |bytes: &[u8], times: usize, said: usize| {
        for _ in 0..times {
            sim::write_mode(&m.token_path(), bytes, 0o644);
            std::thread::sleep(Duration::from_millis(400));
        }
        sim::wait_for(
            "the refusal said",
            T,
            || (refusals() >= said).then_some(()),
            || a.context(),
        );
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(refusals(), said, "{}", a.context());
    };
    rewrite(b"<html>404 Not Found</html>\n", 6, 1);
    // Another file, refused for another reason: its own line, said once too.
    rewrite(b"aaaa.bbbb.cccc\n", 3, 2);
}

/// The first install on a guest whose gridd looked for a token and found none: until the
/// restarted gridd says something, `status` does not show the old gridd's "no token" as if
/// the install had failed; the new gridd's own failure is the failure again.
#[test]
fn scenario_the_failure_of_the_gridd_before_an_install_is_history() {
    // The DLS accepts and never answers: the new gridd's first word comes after 6 s.
    let m = Machine::new(sim::setup(|c| c.network_timeout_ms = 6000));
    write_gridd_conf(&m);
    m.start_gridd();
    sim::wait_for(
        "status: no token, from gridd's own line",
        T,
        || {
            let (_, v) = status(&m);
            (reason(&v) == Some("token_missing")).then_some(())
        },
        || status(&m).1.to_string(),
    );
    m.dls.set_mode(Mode::Blackhole);
    let file = m.path("new.tok");
    sim::write_mode(&file, &m.token(), 0o600);
    let out = m.cli(&["install", "--token-file", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let at = Instant::now();
    let v = sim::wait_for(
        "gridd's restart in its journal",
        T,
        || {
            let (_, v) = status(&m);
            (v["events"].to_string().matches("Started").count() >= 2).then_some(v)
        },
        || status(&m).1.to_string(),
    );
    assert!(
        at.elapsed() < Duration::from_secs(5),
        "too slow to see the window"
    );
    assert_ne!(reason(&v), Some("token_missing"), "{v:#}");
    assert!(v["failure"].is_null(), "{v:#}");
    // The new gridd's failure, once it says it.
    let v = sim::wait_for(
        "the new gridd's failure",
        T,
        || {
            let (_, v) = status(&m);
            reason(&v).is_some().then_some(v)
        },
        || status(&m).1.to_string(),
    );
    assert_eq!(reason(&v), Some("dls_unreachable"), "{v:#}");
}
