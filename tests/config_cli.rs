//! `config check` and `config show` as an operator and `ExecReload=` run them, `status --wait
//! --require-licensed` as vgpu-license-agent-wait-licensed.service runs it, and `run` when
//! the journal cannot be read: the real binary on a fake root.

use std::fs;
use std::process::Stdio;

use crate::common::Root;

/// An executable script in the fake root.
fn script(root: &Root, name: &str, body: &str) -> String {
    let p = root.file(name, format!("#!/bin/sh\n{body}\n").as_bytes());
    crate::common::make_executable(&p);
    p.to_str().unwrap().to_string()
}

#[test]
fn check_passes_a_good_config_and_names_what_it_read() {
    let root = Root::new();
    root.dropin("50-poll.toml", "[service]\npoll_licensed_seconds = 60\n");
    let r = root.run(&["config", "check"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.starts_with("config OK: "), "{}", r.stdout);
    assert!(r.stdout.contains("50-poll.toml"), "{}", r.stdout);
    assert_eq!(r.stderr, "");
}

#[test]
fn check_fails_on_a_bad_dropin_with_the_file_and_the_key() {
    let root = Root::new();
    root.dropin("60-bad.toml", "[service]\npoll_licensed_seconds = 0\n");
    let r = root.run(&["config", "check"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    let line = r.error_line();
    assert!(line.contains("60-bad.toml"), "{line}");
    assert!(
        line.contains("service.poll_licensed_seconds = 0: expected between 1 and 86400"),
        "{line}"
    );
    assert_eq!(r.stdout, "");
}

#[test]
fn check_warns_of_dropins_it_does_not_read() {
    let root = Root::new();
    // A valid drop-in with the wrong name: the service ignores it, the check says so.
    root.dropin("50-x.conf", "[service]\npoll_licensed_seconds = 60\n");
    let r = root.run(&["config", "check"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("warning: ")
            && r.stderr
                .contains("50-x.conf ignored: only *.toml drop-ins are read"),
        "{}",
        r.stderr
    );
    assert!(!r.stdout.contains("50-x.conf"), "{}", r.stdout);
}

#[test]
fn check_refuses_an_output_inside_the_token_directory_and_touches_nothing() {
    let root = Root::new();
    let status = root.token_dir().join("status.tok");
    root.dropin(
        "70-out.toml",
        &format!("[paths]\nstatus_file = \"{}\"\n", status.display()),
    );
    let r = root.run(&["config", "check"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    let line = r.error_line();
    assert!(
        line.contains("paths.status_file") && line.contains("paths.token_dir"),
        "{line}"
    );
    assert!(!status.exists() && !root.token_dir().exists());
}

#[test]
fn check_refuses_a_metrics_socket_on_a_file_that_is_not_a_socket() {
    let root = Root::new();
    let own = root.file("home/notes.txt", b"the operator's own file\n");
    root.dropin(
        "70-sock.toml",
        &format!("[service]\nmetrics_socket = \"{}\"\n", own.display()),
    );
    let r = root.run(&["config", "check"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.error_line().contains("service.metrics_socket"),
        "{}",
        r.stderr
    );
    assert_eq!(fs::read(&own).unwrap(), b"the operator's own file\n");
}

#[test]
fn show_names_each_keys_file_and_hides_webhook_credentials() {
    let root = Root::new();
    root.dropin(
        "50-hook.toml",
        "[service]\nwebhook_url = \"https://ops:hunter2@hooks.example.com/vgpu?key=s3cret\"\nrestart_budget_per_hour = 2\n",
    );
    let r = root.run(&["config", "show"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let out = &r.stdout;
    assert!(!out.contains("hunter2") && !out.contains("s3cret"), "{out}");
    let dropin = root.config.parent().unwrap().join("config.d/50-hook.toml");
    let line = |key: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in:\n{out}"))
            .to_string()
    };
    assert_eq!(
        line("restart_budget_per_hour"),
        format!("restart_budget_per_hour = 2  # {}", dropin.display())
    );
    assert!(
        line("webhook_url").starts_with("webhook_url = \"https://hooks.example.com/vgpu?...\""),
        "{out}"
    );
    assert_eq!(
        line("timeout_seconds"),
        format!("timeout_seconds = 10  # {}", root.config.display())
    );
    assert_eq!(
        line("poll_unlicensed_seconds"),
        "poll_unlicensed_seconds = 15  # default"
    );
}

#[test]
fn show_fails_like_check_on_a_bad_config() {
    let root = Root::new();
    root.dropin("60-bad.toml", "[service]\nno_such_key = 1\n");
    let r = root.run(&["config", "show"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(r.error_line().contains("no_such_key"), "{}", r.stderr);
    assert_eq!(r.stdout, "");
}

#[test]
fn require_licensed_is_zero_once_licensed_and_one_when_the_wait_ends_without() {
    let root = Root::new();
    let licensed = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/samples/smi-fastapi-dls-1.txt"
    );
    let smi = script(&root, "bin/nvidia-smi", &format!("cat '{licensed}'"));
    root.dropin(
        "50-smi.toml",
        &format!("[commands]\nnvidia_smi = \"{smi}\"\n"),
    );
    let r = root.run(&["status", "--wait", "30", "--require-licensed"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);

    // No nvidia-smi at all: not licensed, and the wait of 0 s ends at once.
    let root = Root::new();
    let r = root.run(&["status", "--wait", "0", "--require-licensed"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("Not licensed after waiting 0 s"),
        "{}",
        r.stdout
    );
    // Without the flag, the monitoring codes.
    let r = root.run(&["status", "--wait", "0"]);
    assert!(matches!(r.code, Some(2 | 3)), "{}{}", r.stdout, r.stderr);
}

#[test]
fn require_licensed_needs_wait() {
    let root = Root::new();
    let r = root.run(&["status", "--require-licensed"]);
    // A check called wrongly is UNKNOWN to a monitoring system.
    assert_eq!(r.code, Some(3), "{}{}", r.stdout, r.stderr);
}

#[test]
fn run_stops_when_the_journal_cannot_be_read_instead_of_looping() {
    let root = Root::new();
    let journalctl = script(
        &root,
        "bin/journalctl",
        &format!(
            "echo \"$*\" >> '{}'\necho 'No journal files were opened due to insufficient permissions.' >&2\nexit 1",
            root.path("journalctl-runs").display()
        ),
    );
    root.dropin(
        "50-journal.toml",
        &format!("[commands]\njournalctl = \"{journalctl}\"\n"),
    );
    // `timeout` only guards the test run against a service that never stops.
    let out = std::process::Command::new("timeout")
        .args(["300", crate::common::BIN, "run", "--log-stderr"])
        .env("VGPU_LICENSE_AGENT_CONFIG", &root.config)
        .stdin(Stdio::null())
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let r = root.finish(out);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("cannot read nvidia-gridd's journal")
            && r.stderr.contains("insufficient permissions"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("restarting it"), "{}", r.stderr);
    // The follower (`--follow`) started once; other reads of the journal are not it.
    let runs = fs::read_to_string(root.path("journalctl-runs")).unwrap();
    let follows = runs.lines().filter(|l| l.contains("--follow")).count();
    assert_eq!(follows, 1, "the follower started again: {runs}");
}

/// The config names the programs root runs (`commands.*`): a drop-in another user can write,
/// or a link to a file another user owns, is refused by `config check`, and `status` run as
/// root never runs what it names.
#[test]
fn a_config_file_another_user_could_change_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = Root::new();
    let marker = root.path("ran");
    let evil = script(&root, "evil-smi", &format!("touch '{}'", marker.display()));
    let text = format!("[commands]\nnvidia_smi = \"{evil}\"\n");
    root.dropin("60-smi.toml", &text);
    let dropin = root.config.parent().unwrap().join("config.d/60-smi.toml");
    fs::set_permissions(&dropin, fs::Permissions::from_mode(0o666)).unwrap();
    let r = root.run(&["config", "check"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    let line = r.error_line();
    assert!(line.contains("60-smi.toml"), "{line}");
    assert!(
        line.contains("writable by other users (mode 0666)"),
        "{line}"
    );
    assert!(line.contains("chmod go-w"), "{line}");
    let r = root.run(&["status"]);
    assert_eq!(r.code, Some(3), "UNKNOWN: {}{}", r.stdout, r.stderr);
    assert!(
        !marker.exists(),
        "the program the refused drop-in names never ran"
    );

    // A link to a file another user owns.
    fs::remove_file(&dropin).unwrap();
    let theirs = root.file("home/user/smi.toml", text.as_bytes());
    fs::set_permissions(&theirs, fs::Permissions::from_mode(0o644)).unwrap();
    if !nix::unistd::geteuid().is_root() {
        crate::common::skipped("chown to another user needs root");
        return;
    }
    nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    std::os::unix::fs::symlink(&theirs, &dropin).unwrap();
    let r = root.run(&["config", "check"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.error_line().contains("owned by uid 65534"),
        "{}",
        r.error_line()
    );
    root.run(&["status"]);
    assert!(!marker.exists());

    // Root's own file, linked: fine.
    nix::unistd::chown(&theirs, Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
    let r = root.run(&["config", "check"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
}

/// Every path under `dir`, sorted.
fn listing(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// [`Root::run`] with a time limit: a command still running after it (a service that
/// started) is killed and fails the test.
fn run_within(root: &Root, args: &[&str]) -> crate::common::Run {
    let mut child = root
        .cmd(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still running after 20 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    root.finish(child.wait_with_output().unwrap())
}

/// A config file named on purpose (`--config`, or the environment) that is not there is a
/// mistyped path, not the defaults: `config check` and the service both refuse it in one
/// line, and change nothing; the other commands too.
#[test]
fn a_named_config_that_does_not_exist_is_an_error_everywhere() {
    let root = Root::new();
    let typo = root.path("agent/conifg.toml");
    let typo = typo.to_str().unwrap();
    let before = listing(root.dir.path());
    for (args, code) in [
        (vec!["config", "check", "--config", typo], 1),
        (vec!["--config", typo, "config", "show"], 1),
        (vec!["status", "--config", typo], 3),
        (vec!["run", "--config", typo], 1),
    ] {
        let r = run_within(&root, &args);
        assert_eq!(r.code, Some(code), "{args:?}: {}{}", r.stdout, r.stderr);
        let line = r.error_line();
        assert!(
            line.contains(typo) && line.contains("does not exist") && line.contains("--config"),
            "{args:?}: {line}"
        );
        assert_eq!(r.stdout, "", "{args:?}");
    }
    // Named by the environment, as a unit or a script may.
    let mut cmd = root.cmd(&["config", "check"]);
    let r = root.finish(cmd.env("VGPU_LICENSE_AGENT_CONFIG", typo).output().unwrap());
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.error_line().contains("unset VGPU_LICENSE_AGENT_CONFIG"),
        "{}",
        r.stderr
    );
    assert_eq!(listing(root.dir.path()), before, "nothing changed");
    // The file there: fine again.
    let r = root.run(&["config", "check", "--config", root.config.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    // A directory of drop-ins alone is a config (how a drop-in is checked on its own, as
    // cloud-init/check.sh does): accepted, and said to have no main file.
    let only = tempfile::tempdir().unwrap();
    fs::create_dir(only.path().join("config.d")).unwrap();
    fs::write(
        only.path().join("config.d/50-cloud-init.toml"),
        "[gridd]\nfeature_type = 1\n",
    )
    .unwrap();
    let main = only.path().join("config.toml");
    let r = run_within(
        &root,
        &["config", "check", "--config", main.to_str().unwrap()],
    );
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("50-cloud-init.toml") && r.stdout.contains("there is no"),
        "{}",
        r.stdout
    );
}
