//! `paths.token_source`: the token delivered by the platform (a Kubernetes Secret shared into
//! a KubeVirt guest) and rotated under the running service, against the real journald and
//! the simulator. The source is laid out as a Secret volume is: the token file is a link
//! through `..data`, a link to a timestamped directory that the kubelet swaps atomically.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::Duration;

use crate::common::sim::{self, Agent, Machine, Setup, token_for, wait_for};

const T: Duration = Duration::from_secs(45);
const NAME: &str = "client_configuration_token.tok";

/// Publishes `bytes` in the Secret-like directory `dir` under a new timestamped directory and
/// swaps `..data` to it in one rename, as the kubelet does.
fn publish(dir: &Path, generation: u32, bytes: &[u8]) {
    publish_as(dir, generation, NAME, bytes);
}

/// [`publish`] under the Secret's key `key`.
fn publish_as(dir: &Path, generation: u32, key: &str, bytes: &[u8]) {
    let data = dir.join(format!("..2026_11_30_{generation:04}"));
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join(key), bytes).unwrap();
    fs::set_permissions(data.join(key), fs::Permissions::from_mode(0o644)).unwrap();
    let tmp = dir.join("..data_tmp");
    let _ = fs::remove_file(&tmp);
    symlink(data.file_name().unwrap(), &tmp).unwrap();
    fs::rename(&tmp, dir.join("..data")).unwrap();
    if fs::symlink_metadata(dir.join(key)).is_err() {
        symlink(format!("..data/{key}"), dir.join(key)).unwrap();
    }
}

/// A Secret whose one key is not named like a token file (`token`): its value is the token,
/// judged as any token is, as the token directory takes any file that decodes.
#[test]
fn scenario_a_secret_key_not_named_tok_is_the_token() {
    let mut token = Vec::new();
    let (m, _source, agent) = with_source(|m, source| {
        token = token_for("127.0.0.1", m.dls.port(), "key-token");
        publish_as(source, 1, "token", &token);
    });
    wait_installed(
        &m,
        &agent,
        &token,
        "the Secret's `token` installed and licensed",
    );
}

/// A machine whose agent takes its token from a Secret-like directory (`token_source` in a
/// drop-in), `fill`ed before gridd and the agent start.
fn with_source(fill: impl FnOnce(&Machine, &Path)) -> (Machine, std::path::PathBuf, Agent) {
    let m = Machine::new(Setup::default());
    sim::write_mode(&m.sim_config().gridd_conf, b"FeatureType=1\n", 0o644);
    let source = m.path("run/vgpu-license/token");
    fs::create_dir_all(&source).unwrap();
    fill(&m, &source);
    let dropins = m.config.parent().unwrap().join("config.d");
    fs::create_dir_all(&dropins).unwrap();
    fs::write(
        dropins.join("source.toml"),
        format!("[paths]\ntoken_source = \"{}\"\n", source.display()),
    )
    .unwrap();
    m.start_gridd();
    let agent = Agent::start(&m);
    (m, source, agent)
}

/// Waits until `token` is the installed token and the guest licensed.
fn wait_installed(m: &Machine, agent: &Agent, token: &[u8], what: &str) {
    wait_for(
        what,
        T,
        || {
            let v = agent.status()?;
            (installed(m).as_deref() == Some(token) && v["state"] == "licensed").then_some(())
        },
        || agent.context(),
    );
}

fn installed(m: &Machine) -> Option<Vec<u8>> {
    fs::read(m.token_path()).ok()
}

#[test]
fn scenario_token_source_rotated_under_the_running_service() {
    let mut a_token = Vec::new();
    let (m, source, agent) = with_source(|m, source| {
        a_token = token_for("127.0.0.1", m.dls.port(), "rotation-a");
        publish(source, 1, &a_token);
    });
    let port = m.dls.port();

    // The first token is installed from the source (no token was in the directory).
    wait_installed(
        &m,
        &agent,
        &a_token,
        "the source's token installed and licensed",
    );
    let mode = fs::metadata(m.token_path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o744);

    // A rotation: installed once, gridd restarted once for it.
    let before = m.restarts();
    let b_token = token_for("127.0.0.1", port, "rotation-b");
    publish(&source, 2, &b_token);
    wait_for(
        "the rotated token installed",
        T,
        || (installed(&m).as_deref() == Some(b_token.as_slice())).then_some(()),
        || agent.context(),
    );
    wait_for(
        "gridd restarted for the new token, licensed again",
        T,
        || {
            let v = agent.status()?;
            (m.restarts() > before && v["state"] == "licensed").then_some(())
        },
        || agent.context(),
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        m.restarts(),
        before + 1,
        "one restart for one rotation\n{}",
        agent.context()
    );

    // A rotation to a bad token: reported, the installed token kept, no restart.
    let restarts = m.restarts();
    publish(&source, 3, b"FeatureType=1\n# not a token\n");
    wait_for(
        "the bad token reported",
        T,
        || {
            agent
                .logs()
                .contains("token not adopted")
                .then_some(())
                .or_else(|| {
                    m.agent_journal(agent.pid())
                        .iter()
                        .any(|e| sim::message(e).contains("token not adopted"))
                        .then_some(())
                })
        },
        || agent.context(),
    );
    assert_eq!(installed(&m).as_deref(), Some(b_token.as_slice()));
    assert_eq!(m.restarts(), restarts);
    // Said once, however often the source is looked at or the kubelet swaps the same bytes
    // in again.
    let refusals = || {
        m.agent_journal(agent.pid())
            .iter()
            .filter(|e| sim::message(e).contains("token not adopted"))
            .count()
    };
    for generation in 4..7 {
        std::thread::sleep(Duration::from_millis(700));
        publish(&source, generation, b"FeatureType=1\n# not a token\n");
    }
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(refusals(), 1, "{}", agent.context());
    // Visible where a fleet looks, not only in the journal: a warning while the installed
    // token holds, in status.json and the metrics.
    let v = agent.wait_status("the bad rotation in status.json", T, |v| {
        v["state"] == "licensed" && v["failure"]["reason"] == "token_source_rejected"
    });
    assert_eq!(v["exit_code"], 1, "{v:#}");
    wait_for(
        "the bad rotation in the metrics",
        T,
        || {
            (agent.metric("vgpu_license_failure{reason=\"token_source_rejected\"}") == Some(1.0))
                .then_some(())
        },
        || agent.context(),
    );

    // Back to a good one, twice in quick succession: the last one wins.
    let c_token = token_for("127.0.0.1", port, "rotation-c");
    let d_token = token_for("127.0.0.1", port, "rotation-d");
    publish(&source, 4, &c_token);
    publish(&source, 5, &d_token);
    wait_for(
        "the last of two quick rotations installed, licensed, the warning gone",
        T,
        || {
            let v = agent.status()?;
            (installed(&m).as_deref() == Some(d_token.as_slice())
                && v["state"] == "licensed"
                && v["failure"].is_null())
            .then_some(())
        },
        || agent.context(),
    );

    // gridd may still be restarting for the last one (its license seen before that restart
    // came): let it settle, licensed, before the next step counts restarts.
    std::thread::sleep(Duration::from_secs(3));
    agent.wait_state("licensed", T);
    let settled = m.restarts();

    // The source disappears (the Secret is unshared): the installed token stays.
    fs::remove_dir_all(&source).unwrap();
    wait_for(
        "the missing source reported",
        T,
        || {
            m.agent_journal(agent.pid())
                .iter()
                .any(|e| sim::message(e).contains("token_source) cannot be read"))
                .then_some(())
        },
        || agent.context(),
    );
    assert_eq!(installed(&m).as_deref(), Some(d_token.as_slice()));
    assert_eq!(
        m.restarts(),
        settled,
        "no restart for a source that went away"
    );
    agent.wait_state("licensed", T);
    // No token's content in anything the agent wrote or logged.
    agent.assert_no_secret(&agent.logs());
    for t in [&a_token, &b_token, &c_token, &d_token] {
        for part in crate::common::secret_parts(t) {
            let logged: String = m
                .agent_journal(agent.pid())
                .iter()
                .map(sim::message)
                .collect();
            assert!(!logged.contains(&part), "a token's content was logged");
        }
    }
}

/// The share that brings the token did not mount: its mount point is an empty directory of
/// the root file system. The guest is told that, not to rotate a Secret that is fine, and not
/// that an installed token stays where there is none.
#[test]
fn scenario_a_share_that_did_not_mount_is_said_as_such() {
    let (m, _source, agent) = with_source(|_, _| {});
    let v = agent.wait_status("token_source_rejected", T, |v| {
        v["failure"]["reason"] == "token_source_rejected"
    });
    let message = v["failure"]["message"].as_str().unwrap();
    assert!(message.contains("not a mounted share"), "{message}");
    assert!(message.contains("did not mount"), "{message}");
    assert!(message.contains("no token is installed"), "{message}");
    assert!(!message.contains("installed token stays"), "{message}");
    assert_eq!(v["exit_code"], 2, "critical: no token at all");
    // The fix is the mount, not a Secret to rotate nor a token to install by hand.
    let advice = v["failure"]["advice"].as_str().unwrap();
    assert!(advice.contains("findmnt"), "{advice}");
    assert!(
        !advice.contains("put a valid client configuration token"),
        "{advice}"
    );
    let human = run(&m, &["status"]);
    let fix = human.lines().find(|l| l.starts_with("Fix:")).unwrap_or("");
    assert!(fix.contains("did not mount"), "{human}");
    let out = run(&m, &["diagnose"]);
    for (name, wrong) in [
        ("token-source", "rotate the Kubernetes Secret"),
        ("token", "install --token-file"),
    ] {
        let l = out
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name} line: {out}"));
        assert!(l.starts_with("FAIL") && !l.contains(wrong), "{l}");
    }
    assert!(out.contains("mount the share"), "{out}");
}

/// A command of the agent with the machine's config: its standard output.
fn run(m: &Machine, args: &[&str]) -> String {
    let out = m.cli(args);
    String::from_utf8_lossy(&out.stdout).into_owned()
}
