//! Hostile input, tried the way an attacker or a careless hand would: FIFOs, devices and
//! endless streams where a file is expected, entity bombs, numbers that overflow, directories
//! that are not the agent's, secrets in URLs, commands that never answer. Each must end in
//! bounded time with a one-line error, and change nothing.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Root, mode, valid_token};

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
}

/// A short fingerprint of a file's bytes (FNV-1a), so a failed comparison stays readable.
fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

/// Every file under `dir` with its mode and content (links as their target), to compare a
/// tree byte for byte and mode for mode.
fn tree(dir: &Path) -> Vec<(String, u32, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let m = fs::symlink_metadata(&d).unwrap();
        let rel = d.strip_prefix(dir).unwrap().display().to_string();
        if m.file_type().is_symlink() {
            out.push((
                rel,
                0,
                digest(fs::read_link(&d).unwrap().as_os_str().as_encoded_bytes()),
            ));
        } else if m.is_dir() {
            out.push((rel, m.permissions().mode() & 0o7777, 0));
            for e in fs::read_dir(&d).unwrap() {
                stack.push(e.unwrap().path());
            }
        } else if m.is_file() {
            out.push((
                rel,
                m.permissions().mode() & 0o7777,
                digest(&fs::read(&d).unwrap()),
            ));
        } else {
            out.push((rel, m.permissions().mode() & 0o7777, 1));
        }
    }
    out.sort();
    out
}

/// The whole fake root, but for the agent's lock file (created by any install).
fn root_tree(root: &Root) -> Vec<(String, u32, u64)> {
    tree(root.dir.path())
        .into_iter()
        .filter(|(p, _, _)| !p.ends_with("install.lock"))
        .collect()
}

#[track_caller]
fn one_line_error(r: &common::Run, code: i32, want: &str) {
    assert_eq!(r.code, Some(code), "{}{}", r.stdout, r.stderr);
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains(want), "want {want:?}: {}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

#[test]
fn a_fifo_or_a_device_as_the_token_file_is_refused_at_once() {
    let mut root = Root::new();
    root.install_ok(&valid_token("a"), &[]);
    let fifo = root.path("in.fifo");
    mkfifo(&fifo);
    let before = root_tree(&root);
    for (path, want) in [
        (fifo.to_str().unwrap(), "not a regular file but a FIFO"),
        ("/dev/zero", "not a regular file but a character device"),
        ("/dev/null", "not a regular file but a character device"),
    ] {
        let start = Instant::now();
        let r = root.run(&["install", "--token-file", path]);
        one_line_error(&r, 1, want);
        assert!(start.elapsed() < Duration::from_secs(10), "{path}");
        assert_eq!(root_tree(&root), before, "{path}");
    }
    // The same for every other command that reads a file.
    for args in [
        vec!["token", "inspect", fifo.to_str().unwrap()],
        vec!["analyze", "--smi", fifo.to_str().unwrap()],
        vec!["analyze", "--journal", fifo.to_str().unwrap()],
        vec!["analyze", "--journal", "/dev/zero"],
        vec!["analyze", "--smi", "/dev/urandom"],
    ] {
        let r = root.run(&args);
        let code = if args[0] == "analyze" { 3 } else { 1 };
        one_line_error(&r, code, "not a regular file");
    }
}

#[test]
fn an_endless_or_silent_standard_input_ends_in_bounded_time() {
    let mut root = Root::with_config("");
    root.install_ok(&valid_token("a"), &[]);
    let before = root_tree(&root);
    // `yes | install --token-file -`: stops at the cap.
    let mut yes = Command::new("yes").stdout(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    let out = root
        .cmd(&["install", "--token-file", "-"])
        .stdin(yes.stdout.take().unwrap())
        .output()
        .unwrap();
    // `yes` ends on the closed pipe.
    yes.wait().unwrap();
    let r = root.finish(out);
    one_line_error(&r, 1, "larger than 64 KiB");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(root_tree(&root), before);
    // A pipe that stays open and silent: ends at the time limit (commands.timeout_seconds).
    root.dropin("t.toml", "[commands]\ntimeout_seconds = 2\n");
    let before = root_tree(&root);
    let mut child = root
        .cmd(&["install", "--token-file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"eyJh").unwrap();
    let start = Instant::now();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    let r = root.finish(out);
    one_line_error(&r, 1, "did not end within 2 s");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(root_tree(&root), before);
}

#[test]
fn xml_entities_are_refused_without_expansion() {
    let root = Root::new();
    let laughs = "<?xml version=\"1.0\"?>\n<!DOCTYPE lolz [\n <!ENTITY lol \"lol\">\n \
        <!ENTITY lol2 \"&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;\">\n \
        <!ENTITY lol3 \"&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;\">\n \
        <!ENTITY lol4 \"&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;\">\n]>\n\
        <nvidia_smi_log><driver_version>&lol4;</driver_version></nvidia_smi_log>\n";
    let big_entity = format!(
        "<?xml version=\"1.0\"?>\n<!DOCTYPE nvidia_smi_log [<!ENTITY a \"{}\">]>\n<nvidia_smi_log>{}</nvidia_smi_log>\n",
        "x".repeat(100_000),
        "&a;".repeat(50_000)
    );
    for (name, text) in [("laughs", laughs.to_string()), ("big", big_entity)] {
        let f = root.file(&format!("{name}.xml"), text.as_bytes());
        let r = root.run(&["analyze", "--smi", f.to_str().unwrap()]);
        one_line_error(&r, 3, "entity declarations");
    }
    // nvidia-smi's own DOCTYPE (an external DTD, never loaded) is still read.
    let f = root.file(
        "real.xml",
        b"<?xml version=\"1.0\" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">\n<nvidia_smi_log>\n<driver_version>550.90.07</driver_version>\n<attached_gpus>1</attached_gpus>\n<gpu id=\"00000000:00:05.0\">\n<product_name>NVIDIA L40S-24Q</product_name>\n<gpu_virtualization_mode>\n<virtualization_mode>VGPU</virtualization_mode>\n</gpu_virtualization_mode>\n<vgpu_software_licensed_product>\n<licensed_product_name>NVIDIA RTX Virtual Workstation</licensed_product_name>\n<license_status>Licensed (Expiry: 2099-1-1 0:0:0 GMT)</license_status>\n</vgpu_software_licensed_product>\n</gpu>\n</nvidia_smi_log>\n",
    );
    let r = root.run(&["analyze", "--smi", f.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("\"state\": \"licensed\""), "{}", r.stdout);
}

#[test]
fn numbers_out_of_range_are_config_errors_not_aborts() {
    let root = Root::new();
    // A flag: refused by the parser, exit 3 for a check.
    let r = root.run(&["status", "--wait", "9223372036854775808"]);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    for (key, section, value) in [
        ("timeout_seconds", "commands", "9223372036854775807"),
        ("expiry_warning_hours", "service", "18446744073709551615"),
        ("poll_licensed_seconds", "service", "9223372036854775807"),
        (
            "restart_backoff_max_seconds",
            "service",
            "9223372036854775807",
        ),
        ("restart_budget_per_hour", "service", "4294967295"),
        ("probe_timeout_seconds", "service", "0"),
    ] {
        root.dropin("n.toml", &format!("[{section}]\n{key} = {value}\n"));
        for cmd in ["status", "diagnose"] {
            let r = root.run(&[cmd]);
            one_line_error(&r, 3, &format!("{section}.{key}"));
            assert!(r.stderr.contains("expected between"), "{}", r.stderr);
        }
    }
}

#[test]
fn a_token_dir_that_is_not_the_agents_own_is_refused_not_cleaned() {
    // The likely mistake: token_dir = the directory of gridd.conf.
    let root = Root::new();
    let etc = root.gridd_conf().parent().unwrap().to_path_buf();
    fs::create_dir_all(etc.join("sub")).unwrap();
    fs::write(root.gridd_conf(), b"FeatureType=1\n").unwrap();
    fs::write(etc.join("sub/keep"), b"x").unwrap();
    root.dropin(
        "dir.toml",
        &format!("[paths]\ntoken_dir = \"{}\"\n", etc.display()),
    );
    let tok = root.file("in/t.tok", &valid_token("a"));
    let before = root_tree(&root);
    let r = root.run(&["install", "--token-file", tok.to_str().unwrap()]);
    one_line_error(&r, 1, "holds what is not the agent's");
    assert!(
        r.stderr.contains("gridd.conf") && r.stderr.contains("sub"),
        "{}",
        r.stderr
    );
    let r = root.run(&["prepare-image"]);
    one_line_error(&r, 1, "holds what is not the agent's");
    assert_eq!(root_tree(&root), before);
    assert_eq!(root.restarts(), 0);

    // A token directory that is a symlink to someone else's directory.
    let root = Root::new();
    let victim = root.path("victim");
    fs::create_dir_all(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o775)).unwrap();
    fs::write(victim.join("data.tok"), b"someone's").unwrap();
    fs::create_dir_all(root.token_dir().parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&victim, root.token_dir()).unwrap();
    let tok = root.file("in/t.tok", &valid_token("a"));
    let before = root_tree(&root);
    let r = root.run(&["install", "--token-file", tok.to_str().unwrap()]);
    one_line_error(&r, 1, "is a symlink");
    let r = root.run(&["prepare-image", "--purge-client-state"]);
    one_line_error(&r, 1, "is a symlink");
    assert_eq!(root_tree(&root), before);
    assert_eq!(mode(&victim), 0o775);

    // The same for the state directory.
    let root = Root::new();
    let victim = root.path("victim-state");
    fs::create_dir_all(&victim).unwrap();
    fs::write(victim.join("important"), b"x").unwrap();
    fs::create_dir_all(root.state_dir().parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&victim, root.state_dir()).unwrap();
    let tok = root.file("in/t.tok", &valid_token("a"));
    let before = root_tree(&root);
    let r = root.run(&["install", "--token-file", tok.to_str().unwrap()]);
    one_line_error(&r, 1, "(paths.state_dir) is a symlink");
    let r = root.run(&["prepare-image"]);
    one_line_error(&r, 1, "(paths.state_dir) is a symlink");
    assert_eq!(root_tree(&root), before);
}

#[test]
fn urls_never_show_their_credentials() {
    let root = Root::new();
    root.dropin(
        "w.toml",
        "[service]\nwebhook_url = \"http://user:hunter2@10.0.0.1/hook?key=s3cr3t\"\n",
    );
    for cmd in ["status", "diagnose"] {
        let r = root.run(&[cmd]);
        one_line_error(&r, 3, "service.webhook_url");
        assert!(
            !r.stderr.contains("hunter2") && !r.stderr.contains("s3cr3t"),
            "{}",
            r.stderr
        );
    }
    let root = Root::new();
    let r = root.run(&[
        "install",
        "--token-url",
        "http://user:hunter2@10.0.0.1/t.tok?sig=s3cr3t",
    ]);
    one_line_error(&r, 1, "only https://");
    assert!(!r.stderr.contains("hunter2") && !r.stderr.contains("s3cr3t"));
}

#[test]
fn a_hung_nvidia_smi_is_unknown_naming_the_time_limit() {
    let root = Root::new();
    let smi = root.file("hung-nvidia-smi", b"#!/bin/sh\nsleep 300\n");
    fs::set_permissions(&smi, fs::Permissions::from_mode(0o755)).unwrap();
    root.dropin(
        "smi.toml",
        &format!(
            "[commands]\nnvidia_smi = \"{}\"\ntimeout_seconds = 1\njournalctl = \"/bin/true\"\n",
            smi.display()
        ),
    );
    let start = Instant::now();
    let r = root.run(&["status"]);
    assert_eq!(r.code, Some(3), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("did not finish within 1s"),
        "{}",
        r.stdout
    );
    assert!(start.elapsed() < Duration::from_secs(20));
    // And no nvidia-smi is left behind.
    let left = Command::new("pgrep")
        .args(["-f", smi.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn control_characters_never_reach_the_terminal() {
    let root = Root::new();
    let journal = root.file(
        "j.log",
        b"Nov 30 10:00:00 host nvidia-gridd[42]: Failed to acquire license from dls.example \x1b[2J\x1b]0;pwned\x07 (Info: x - Error: y)\n",
    );
    let r = root.run(&["analyze", "--journal", journal.to_str().unwrap()]);
    assert!(
        !r.stdout.contains('\x1b') && !r.stderr.contains('\x1b'),
        "{:?}",
        r.stdout
    );
    let f = root.path("bad\x1b[31mname.tok");
    let r = root.run(&["token", "inspect", f.to_str().unwrap()]);
    assert!(!r.stderr.contains('\x1b'), "{:?}", r.stderr);
    assert!(
        r.stderr.contains("bad\\u{1b}[31mname.tok"),
        "{:?}",
        r.stderr
    );
}

#[test]
fn an_install_that_fails_half_way_undoes_every_step() {
    for fault in [
        "stray-move-fails",
        "exdev,copy-enospc",
        "token-commit-fails",
    ] {
        let mut root = Root::new();
        root.install_ok(&valid_token("old"), &[]);
        // Steps that will have been taken when the fault strikes: the directory's mode
        // fixed, strays moved aside, the previous token copied.
        fs::set_permissions(root.token_dir(), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(root.token_dir().join("a.tok"), b"stray a").unwrap();
        fs::write(root.token_dir().join("b.tok"), b"stray b").unwrap();
        let tok = root.file("in/new.tok", &valid_token("new"));
        let before = root_tree(&root);
        let restarts = root.restarts();
        let mut cmd = root.cmd(&["install", "--token-file", tok.to_str().unwrap()]);
        cmd.env("VGPU_LICENSE_AGENT_FAULT", fault);
        let r = root.finish(cmd.output().unwrap());
        one_line_error(&r, 1, "nothing was changed");
        assert_eq!(root_tree(&root), before, "{fault}");
        assert_eq!(root.restarts(), restarts, "{fault}");
    }
}
