//! Hostile input, tried the way an attacker or a careless hand would: FIFOs, devices and
//! endless streams where a file is expected, entity bombs, numbers that overflow, directories
//! that are not the agent's, secrets in URLs, commands that never answer. Each must end in
//! bounded time with a one-line error, and change nothing.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{Root, mode, valid_token};

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
fn one_line_error(r: &crate::common::Run, code: i32, want: &str) {
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
    one_line_error(&r, 1, "is not a token directory");
    assert!(
        r.stderr.contains("gridd.conf") && r.stderr.contains("sub"),
        "{}",
        r.stderr
    );
    let r = root.run(&["prepare-image"]);
    one_line_error(&r, 1, "is not a token directory");
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
    crate::common::make_executable(&smi);
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

/// Runs the agent like [`Root::run`], and how long it took; one that runs past two minutes
/// is killed and fails the test, so that a hang is a failure, not a test that never ends.
fn within(root: &Root, args: &[&str]) -> (crate::common::Run, Duration) {
    const LIMIT: Duration = Duration::from_secs(120);
    let start = Instant::now();
    let mut child = root
        .cmd(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still running after {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    let out = std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    };
    (root.finish(out), took)
}

/// A loopback port nobody listens on.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// An HTTP server on the loopback that answers every request with a 200 and then trickles:
/// the head at once and the body one byte every 0.5 s, or (`slow_head`) the head itself one
/// byte at a time. It never ends an answer; it stops when dropped.
struct Trickle {
    port: u16,
    stop: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
}

impl Trickle {
    fn start(slow_head: bool) -> Trickle {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let (st, conns) = (stop.clone(), connections.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        conns.fetch_add(1, Ordering::Relaxed);
                        let st = st.clone();
                        std::thread::spawn(move || trickle_answer(s, slow_head, &st));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Trickle {
            port,
            stop,
            connections,
        }
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn trickle_answer(mut s: TcpStream, slow_head: bool, stop: &AtomicBool) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if crate::common::read_request_head(&mut s).is_none() {
        return;
    }
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 5000\r\n\r\n";
    let (now, slow): (&[u8], &[u8]) = if slow_head { (b"", head) } else { (head, b"") };
    if s.write_all(now).is_err() {
        return;
    }
    let body = std::iter::repeat(&b'e');
    for b in slow.iter().chain(body) {
        if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_trickling_token_url_ends_within_the_time_limit_and_changes_nothing() {
    let mut root = Root::new();
    root.install_ok(&valid_token("a"), &[]);
    let snapshot = root.snapshot();
    let before = root_tree(&root);
    let restarts = root.restarts();
    for slow_head in [false, true] {
        let server = Trickle::start(slow_head);
        let url = format!("http://127.0.0.1:{}/t.tok", server.port);
        let (r, took) = within(
            &root,
            &[
                "install",
                "--token-url",
                &url,
                "--timeout",
                "2",
                "--retries",
                "1",
            ],
        );
        one_line_error(&r, 1, "cannot download the token");
        assert!(
            r.stderr.contains("after 2 attempt(s)")
                && r.stderr
                    .contains("within the time limit of 2 s (--timeout)"),
            "slow head {slow_head}: {}",
            r.stderr
        );
        // Two attempts of 2 s and a 1 s pause: far less than this, even on a loaded machine.
        assert!(
            took < Duration::from_secs(20),
            "slow head {slow_head}: {took:?}"
        );
        let n = server.connections.load(Ordering::Relaxed);
        assert!((1..=2).contains(&n), "slow head {slow_head}: {n} attempts");
        assert_eq!(root.snapshot(), snapshot, "slow head {slow_head}");
        assert_eq!(root_tree(&root), before, "slow head {slow_head}");
        assert_eq!(root.restarts(), restarts);
    }
}

/// A character device like `/dev/zero` (1, 5) at `p`, where the agent's own paths lie. Only
/// root may make one: elsewhere the caller says what it skips.
fn mkzero(p: &Path) -> bool {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    mknod(
        p,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o644),
        makedev(1, 5),
    )
    .is_ok()
}

/// `line`, repeated until the text is larger than `size` bytes.
fn padded(head: &str, line: &str, size: usize) -> String {
    let mut text = head.to_string();
    while text.len() <= size {
        text.push_str(line);
    }
    text
}

#[test]
fn a_fifo_a_device_or_a_huge_file_as_the_config_is_refused_at_once() {
    let mut root = Root::new();
    root.install_ok(&valid_token("a"), &[]);
    // The fake root's paths as a drop-in as well: a command that skipped a broken main file
    // would still act on the fake root only.
    root.dropin("00-root.toml", &fs::read_to_string(&root.config).unwrap());
    let fifo = root.path("agent/fifo.toml");
    mkfifo(&fifo);
    let zero = root.path("agent/zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    // Valid TOML throughout: only the cap can refuse it.
    let big = root.file(
        "agent/big.toml",
        padded("[service]\n", "# a comment line of the config\n", 1 << 20).as_bytes(),
    );
    let tok = root.file("in/new.tok", &valid_token("b"));
    let tok = tok.to_str().unwrap();
    let before = root_tree(&root);
    let restarts = root.restarts();
    for (config, want) in [
        (&fifo, "not a regular file but a FIFO"),
        (&zero, "not a regular file but a character device"),
        (&big, "larger than 1 MiB"),
    ] {
        let config = config.to_str().unwrap();
        for (args, code) in [
            (vec!["status"], 3),
            (vec!["diagnose", "--json"], 3),
            (vec!["install", "--token-file", tok], 1),
            (vec!["prepare-image", "--purge-client-state"], 1),
            (vec!["token", "inspect"], 1),
        ] {
            let mut all = vec!["--config", config];
            all.extend(&args);
            let (r, took) = within(&root, &all);
            one_line_error(&r, code, want);
            assert!(r.stderr.contains("config"), "{}", r.stderr);
            assert!(took < Duration::from_secs(20), "{config} {args:?}");
            assert_eq!(root_tree(&root), before, "{config} {args:?}");
        }
    }
    // A drop-in that is a FIFO stops every command the same way.
    let dropin = root.path("agent/config.d/50-fifo.toml");
    mkfifo(&dropin);
    let before = root_tree(&root);
    for (args, code) in [
        (vec!["status"], 3),
        (vec!["install", "--token-file", tok], 1),
    ] {
        let (r, took) = within(&root, &args);
        one_line_error(&r, code, "not a regular file but a FIFO");
        assert!(r.stderr.contains("50-fifo.toml"), "{}", r.stderr);
        assert!(took < Duration::from_secs(20), "{args:?}");
        assert_eq!(root_tree(&root), before, "{args:?}");
    }
    assert_eq!(root.restarts(), restarts);
}

#[test]
fn a_fifo_a_device_or_a_huge_ca_file_is_refused_before_any_download() {
    let mut root = Root::new();
    root.install_ok(&valid_token("a"), &[]);
    let fifo = root.path("in/ca.fifo");
    fs::create_dir_all(fifo.parent().unwrap()).unwrap();
    mkfifo(&fifo);
    // Real certificates, over and over: read whole, this would be a valid bundle.
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap()
        .pem();
    let big = root.file("in/big-ca.pem", padded("", &cert, 4 << 20).as_bytes());
    let url = format!("http://127.0.0.1:{}/t.tok", closed_port());
    let snapshot = root.snapshot();
    let before = root_tree(&root);
    let restarts = root.restarts();
    for (ca, want) in [
        (fifo.to_str().unwrap(), "not a regular file but a FIFO"),
        ("/dev/zero", "not a regular file but a character device"),
        (big.to_str().unwrap(), "larger than 4 MiB"),
    ] {
        let (r, took) = within(
            &root,
            &[
                "install",
                "--token-url",
                &url,
                "--ca-file",
                ca,
                "--retries",
                "0",
                "--timeout",
                "2",
            ],
        );
        one_line_error(&r, 1, want);
        assert!(r.stderr.contains("--ca-file"), "{}", r.stderr);
        assert!(took < Duration::from_secs(20), "{ca}");
        assert_eq!(root.snapshot(), snapshot, "{ca}");
        assert_eq!(root_tree(&root), before, "{ca}");
    }
    assert_eq!(root.restarts(), restarts);
}

/// A process that `status` takes for a running service (its name is the agent's): an
/// install waiting for a token on a standard input that never ends. Ended when dropped.
struct LiveAgent {
    child: std::process::Child,
    _root: Root,
}

impl LiveAgent {
    fn start() -> LiveAgent {
        let root = Root::new();
        root.dropin("t.toml", "[commands]\ntimeout_seconds = 600\n");
        let child = root
            .cmd(&["install", "--token-file", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let agent = LiveAgent { child, _root: root };
        let comm = format!("/proc/{}/comm", agent.pid());
        let deadline = Instant::now() + Duration::from_secs(20);
        while !fs::read_to_string(&comm).is_ok_and(|c| c.starts_with("vgpu-license-ag")) {
            assert!(Instant::now() < deadline, "the agent did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LiveAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The report `status --json` gives for `root`, as a service would have written it.
fn service_report(root: &Root, agent: &LiveAgent) -> serde_json::Value {
    let r = root.run(&["status", "--json"]);
    let mut v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    v["agent_pid"] = agent.pid().into();
    v
}

#[test]
fn a_fifo_a_device_or_a_huge_status_json_is_passed_over_for_observing_now() {
    // This guest's own journal stays out of what is observed.
    let root = Root::with_config("journalctl = \"/bin/true\"\n");
    let agent = LiveAgent::start();
    let status_file = root.path("run/vgpu-license-agent/status.json");
    fs::create_dir_all(status_file.parent().unwrap()).unwrap();
    let observed = root.run(&["status"]);
    assert!(
        observed
            .stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("The service is not running: observed now.")),
        "{}",
        observed.stdout
    );
    assert!(matches!(observed.code, Some(0..=3)), "{:?}", observed.code);
    // A report that claims licensed, from a live service: believed when it is read whole.
    let mut report = service_report(&root, &agent);
    report["state"] = "licensed".into();
    report["exit_code"] = 0.into();
    let text = report.to_string();
    fs::write(&status_file, &text).unwrap();
    let r = root.run(&["status"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("From the running service's report")),
        "{}",
        r.stdout
    );
    // The same report, padded with blanks (still valid JSON) past the 16 MiB cap; a FIFO; a
    // device.
    let mut huge = text.into_bytes();
    huge.resize(17 << 20, b' ');
    fs::write(&status_file, &huge).unwrap();
    let fifo = root.path("run/vgpu-license-agent/fifo.json");
    mkfifo(&fifo);
    for (path, name) in [
        (status_file.as_path(), "huge"),
        (fifo.as_path(), "fifo"),
        (Path::new("/dev/zero"), "device"),
    ] {
        root.dropin(
            "status.toml",
            &format!("[paths]\nstatus_file = \"{}\"\n", path.display()),
        );
        let before = root_tree(&root);
        for json in [false, true] {
            let args = if json {
                vec!["status", "--json"]
            } else {
                vec!["status"]
            };
            let (r, took) = within(&root, &args);
            assert!(took < Duration::from_secs(20), "{name} {args:?}");
            assert_eq!(r.code, observed.code, "{name}: {}{}", r.stdout, r.stderr);
            assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
            if json {
                let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
                assert!(v.get("agent_pid").is_none(), "{name}: {v}");
            } else {
                assert!(
                    r.stdout
                        .lines().nth(1).is_some_and(|l| l.starts_with("The service is not running: observed now.")),
                    "{name}: {}",
                    r.stdout
                );
            }
            assert_eq!(root_tree(&root), before, "{name} {args:?}");
        }
    }
}

#[test]
fn status_exits_zero_to_three_whatever_status_json_claims() {
    // This guest's own journal stays out of what is observed.
    let root = Root::with_config("journalctl = \"/bin/true\"\n");
    let agent = LiveAgent::start();
    let status_file = root.path("run/vgpu-license-agent/status.json");
    fs::create_dir_all(status_file.parent().unwrap()).unwrap();
    let report = service_report(&root, &agent);
    // A plain claim is believed: the forged file below is read as the service's.
    let mut warning = report.clone();
    warning["state"] = "unlicensed".into();
    warning["exit_code"] = 1.into();
    fs::write(&status_file, warning.to_string()).unwrap();
    let r = root.run(&["status"]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("From the running service's report")),
        "{}",
        r.stdout
    );
    for state in ["licensed", "unlicensed", "unknown"] {
        for claim in [4u8, 127, 200, 255] {
            let mut forged = report.clone();
            forged["state"] = state.into();
            forged["exit_code"] = claim.into();
            fs::write(&status_file, forged.to_string()).unwrap();
            for args in [vec!["status"], vec!["status", "--json"]] {
                let r = root.run(&args);
                assert!(
                    matches!(r.code, Some(0..=3)),
                    "{state} exit_code {claim} {args:?}: {:?} {}{}",
                    r.code,
                    r.stdout,
                    r.stderr
                );
            }
        }
    }
}

#[test]
fn a_fifo_a_device_or_a_huge_gridd_conf_is_refused_at_once() {
    for kind in ["fifo", "device", "huge"] {
        let mut root = Root::new();
        root.install_ok(&valid_token("a"), &[]);
        let conf = root.gridd_conf();
        fs::remove_file(&conf).unwrap();
        let want = match kind {
            "fifo" => {
                mkfifo(&conf);
                "not a regular file"
            }
            "device" => {
                if !mkzero(&conf) {
                    crate::common::skipped("a character device in place of gridd.conf: not root");
                    continue;
                }
                "not a regular file"
            }
            _ => {
                // A valid gridd.conf throughout: only the cap can refuse it.
                let text = padded(
                    "FeatureType=1\n",
                    "# a comment line of gridd.conf\n",
                    1 << 20,
                );
                fs::write(&conf, text).unwrap();
                "larger than 1 MiB"
            }
        };
        let tok = root.file("in/new.tok", &valid_token("b"));
        let before = root_tree(&root);
        let restarts = root.restarts();
        let (r, took) = within(&root, &["install", "--token-file", tok.to_str().unwrap()]);
        one_line_error(&r, 1, want);
        assert!(r.stderr.contains("gridd.conf"), "{kind}: {}", r.stderr);
        assert!(took < Duration::from_secs(20), "{kind}");
        assert_eq!(root_tree(&root), before, "{kind}");
        assert_eq!(root.restarts(), restarts, "{kind}");
        // The checks read it too: they end, and say something about it.
        for args in [vec!["diagnose"], vec!["status"]] {
            let (r, took) = within(&root, &args);
            assert!(
                matches!(r.code, Some(0..=3)),
                "{kind} {args:?}: {:?} {}",
                r.code,
                r.stderr
            );
            assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
            assert!(took < Duration::from_secs(30), "{kind} {args:?}");
            assert_eq!(root_tree(&root), before, "{kind} {args:?}");
        }
    }
}

#[test]
fn a_token_naming_thousands_of_nodes_makes_a_bounded_few_probes() {
    let mut root = Root::new();
    root.dropin("p.toml", "[service]\nprobe_timeout_seconds = 2\n");
    // One listener for every loopback address: the address a connection reached names the
    // node probed. Each connection is held a moment, then closed (no TLS is spoken).
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let reached = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let (active, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let server = {
        let (stop, reached, active, most) =
            (stop.clone(), reached.clone(), active.clone(), most.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        if let Ok(a) = s.local_addr() {
                            reached.lock().unwrap().insert(a.ip());
                        }
                        let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        let active = active.clone();
                        std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_millis(300));
                            drop(s);
                            active.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })
    };
    const NODES: usize = 2000;
    let tok = crate::common::sim::edit_payload(&valid_token("many"), |p| {
        let sic = &mut p["service_instance_configuration"];
        sic["svc_port_set_list"][0]["svc_port_map"] = serde_json::json!([
            {"service": "auth", "port": port}, {"service": "lease", "port": port}
        ]);
        sic["node_url_list"] = (0..NODES)
            .map(|i| serde_json::json!({"url": format!("127.1.{}.{}", i / 250, i % 250 + 1)}))
            .collect();
    });
    assert!(tok.len() < 64 << 10, "{} bytes: not a token", tok.len());
    root.install_ok(&tok, &[]);

    let (r, took) = within(&root, &["diagnose", "--json"]);
    assert!(matches!(r.code, Some(0..=3)), "{:?} {}", r.code, r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let probed = v["dls_probes"].as_array().unwrap().len();
    assert!((1..=16).contains(&probed), "{probed} nodes probed");
    assert!(took < Duration::from_secs(60), "{took:?}");
    let said = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["message"].as_str())
        .find(|m| m.contains(&NODES.to_string()) && m.contains("probed"))
        .unwrap_or_else(|| panic!("no check names the {NODES} endpoints: {}", v["checks"]));
    assert!(
        said.contains(&format!("{} not", NODES - probed)),
        "{probed} probed: {said}"
    );
    let hosts = reached.lock().unwrap().len();
    assert!(
        (1..=probed).contains(&hosts),
        "{hosts} nodes reached, {probed} probes"
    );
    assert!(
        most.load(Ordering::SeqCst) <= 16,
        "{} at once",
        most.load(Ordering::SeqCst)
    );

    // The same for a person.
    reached.lock().unwrap().clear();
    let (r, took) = within(&root, &["diagnose"]);
    assert!(took < Duration::from_secs(60));
    assert!(matches!(r.code, Some(0..=3)), "{:?} {}", r.code, r.stderr);
    assert!(
        r.stdout.contains(&NODES.to_string())
            && r.stdout.contains(&format!("{} not", NODES - probed)),
        "{}",
        r.stdout
    );
    assert!(reached.lock().unwrap().len() <= probed);
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}

#[test]
fn purging_client_state_never_follows_a_symlink_out() {
    // gridd's client state directory is itself a link to someone else's directory.
    let mut root = Root::new();
    root.install_ok(&valid_token("a"), &[]);
    let victim = root.path("victim");
    fs::create_dir_all(victim.join("sub")).unwrap();
    fs::write(victim.join("precious.dat"), b"not gridd's").unwrap();
    fs::write(victim.join("sub/more.dat"), b"nor this").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o750)).unwrap();
    let state = root.path("var/lib/nvidia/GridLicensing");
    fs::create_dir_all(state.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&victim, &state).unwrap();
    let victim_before = tree(&victim);
    let before = root_tree(&root);
    let r = root.run(&["prepare-image", "--purge-client-state", "--dry-run"]);
    assert!(matches!(r.code, Some(0 | 1)), "{}", r.stderr);
    assert!(!r.stdout.contains("precious.dat"), "{}", r.stdout);
    assert_eq!(root_tree(&root), before);
    let r = root.run(&["prepare-image", "--purge-client-state"]);
    assert_eq!(tree(&victim), victim_before, "{}{}", r.stdout, r.stderr);
    assert_eq!(mode(&victim), 0o750);
    assert!(!r.stdout.contains("precious.dat"), "{}", r.stdout);
    match r.code {
        // Refused: nothing at all was removed, the link included.
        Some(1) => {
            one_line_error(&r, 1, "symlink");
            assert_eq!(root_tree(&root), before);
        }
        // Or the link alone removed, never what it points to.
        Some(0) => assert!(
            fs::symlink_metadata(&state).is_err()
                || fs::symlink_metadata(&state)
                    .unwrap()
                    .file_type()
                    .is_symlink()
        ),
        other => panic!("{other:?}: {}{}", r.stdout, r.stderr),
    }

    // A link inside gridd's directory, to someone else's directory.
    let mut root = Root::new();
    root.install_ok(&valid_token("a"), &[]);
    let victim = root.path("victim");
    fs::create_dir_all(&victim).unwrap();
    fs::write(victim.join("precious.dat"), b"not gridd's").unwrap();
    let state = root.path("var/lib/nvidia/GridLicensing");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("client.dat"), b"gridd's").unwrap();
    std::os::unix::fs::symlink(&victim, state.join("escape")).unwrap();
    let victim_before = tree(&victim);
    let r = root.run(&["prepare-image", "--purge-client-state"]);
    assert_eq!(tree(&victim), victim_before, "{}{}", r.stdout, r.stderr);
    assert!(matches!(r.code, Some(0 | 1)), "{}", r.stderr);
    assert!(!r.stdout.contains("precious.dat"), "{}", r.stdout);
    if r.code == Some(1) {
        assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr);
    } else {
        assert!(fs::symlink_metadata(state.join("escape")).is_err());
    }
}

/// No raw ESC, BEL or CR on either stream.
#[track_caller]
fn no_raw_controls(what: &str, r: &crate::common::Run) {
    for (name, out) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        assert!(
            !out.contains(['\x1b', '\x07', '\r']),
            "{what}: raw control character on {name}: {out:?}"
        );
        assert!(!out.contains("panicked"), "{what}: {out}");
    }
}

/// No raw control character, and no line forged by a newline from outside (text that
/// follows the newline of `FORGED_NEWLINE` never starts a line).
#[track_caller]
fn clean(what: &str, r: &crate::common::Run) {
    no_raw_controls(what, r);
    for (name, out) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        assert!(
            !out.lines().any(|l| l.starts_with("FORGED")),
            "{what}: a line forged on {name}: {out:?}"
        );
    }
}

/// Control characters as a token's field or a URL may carry them: clear the screen, set the
/// terminal's title, ring, return, and a new line that would pass for the agent's own.
const FORGED_NEWLINE: &str = "\x1b[2J\x1b]0;pwned\x07\r\nFORGED \x1b[31m";

#[test]
fn control_characters_in_a_token_or_a_url_never_reach_the_terminal() {
    let mut root = Root::new();
    root.dropin("p.toml", "[service]\nprobe_timeout_seconds = 2\n");
    root.install_ok(&valid_token("a"), &[]);
    let evil = FORGED_NEWLINE;
    let evil_token = |exp: i64| {
        crate::common::sim::edit_payload(&valid_token("x"), |p| {
            p["iss"] = format!("NLS{evil}").into();
            p["jti"] = format!("j{evil}").into();
            p["exp"] = exp.into();
            p["service_instance_configuration"]["node_url_list"][0]["url"] =
                format!("dls{evil}.invalid").into();
        })
    };
    let tok = evil_token(2_078_691_200);
    let f = root.file("in/evil.tok", &tok);
    let f = f.to_str().unwrap();
    let r = root.run(&["token", "inspect", f]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    clean("token inspect", &r);
    assert!(r.stdout.contains("\\u{1b}[2J"), "{}", r.stdout);
    // JSON keeps the text as it was, JSON-escaped.
    let r = root.run(&["token", "inspect", "--json", f]);
    clean("token inspect --json", &r);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["issuer"], format!("NLS{evil}"));

    // Installed (or refused): whatever install says is clean.
    let r = root.run(&["install", "--token-file", f]);
    clean("install", &r);
    // In place, as if dropped there: every check that shows it is clean.
    fs::write(root.token_path(), &tok).unwrap();
    for args in [vec!["token", "inspect"], vec!["status"], vec!["diagnose"]] {
        let (r, took) = within(&root, &args);
        clean(&format!("{args:?}"), &r);
        if args[0] == "diagnose" {
            // Such a name never goes into a request line: the DNS step refuses it.
            assert!(r.stdout.contains("is not a host name"), "{}", r.stdout);
        }
        assert!(took < Duration::from_secs(60), "{args:?}");
    }

    // An expired one: the refusal is clean.
    let expired = root.file("in/expired.tok", &evil_token(1_700_000_100));
    let r = root.run(&["install", "--token-file", expired.to_str().unwrap()]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    clean("install expired", &r);
    // A file name.
    let named = root.file(&format!("in/n{evil}.tok"), b"not a token");
    let r = root.run(&["install", "--token-file", named.to_str().unwrap()]);
    assert_eq!(r.code, Some(1));
    clean("install named", &r);

    // URLs.
    let port = closed_port();
    for url in [
        format!("http://127.0.0.1:{port}/{evil}t.tok"),
        format!("http://127.0.0.1:{port}/t.tok?{evil}"),
        format!("http://127.0.0.1:{port}/t.tok#{evil}"),
        format!("http://u{evil}:p{evil}@127.0.0.1:{port}/t.tok"),
        format!("https://dls{evil}.example/t.tok"),
        format!("{evil}https://dls.example/t.tok"),
        format!("ht{evil}tp://dls.example/t.tok"),
        format!("http://dls.example/{evil}"),
    ] {
        let (r, took) = within(
            &root,
            &[
                "install",
                "--token-url",
                &url,
                "--retries",
                "0",
                "--timeout",
                "2",
            ],
        );
        assert_eq!(r.code, Some(1), "{url:?}: {}", r.stderr);
        assert_eq!(
            r.stderr.trim_end().lines().count(),
            1,
            "{url:?}: {:?}",
            r.stderr
        );
        clean(&format!("{url:?}"), &r);
        assert!(took < Duration::from_secs(20), "{url:?}");
    }
}

/// A local user who can write the token directory swaps the token for a symlink to a file of
/// its own, for a FIFO, and back, in a loop, while installs run (the same token: a chmod;
/// another: a copy of the previous one kept aside). Root acts only through what it checked:
/// the file behind the link is never changed, no install blocks, and every install ends.
#[test]
fn a_token_swapped_for_a_link_or_a_fifo_during_installs_changes_nothing_outside() {
    let mut root = Root::new();
    let a = valid_token("a");
    root.install_ok(&a, &[]);
    let victim = root.file("victim", b"not the agent's");
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
    let swap = root.path("swap");
    fs::create_dir_all(&swap).unwrap();
    let token_path = root.token_path();
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (stop, swaps, swap, token_path, victim, a) = (
            stop.clone(),
            swaps.clone(),
            swap.clone(),
            token_path.clone(),
            victim.clone(),
            a.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let link = swap.join("link");
                let _ = fs::remove_file(&link);
                let _ = std::os::unix::fs::symlink(&victim, &link);
                let _ = fs::rename(&link, &token_path);
                std::thread::sleep(Duration::from_millis(2));
                let file = swap.join("file");
                let _ = fs::write(&file, &a);
                let _ = fs::set_permissions(&file, fs::Permissions::from_mode(0o600));
                let _ = fs::rename(&file, &token_path);
                std::thread::sleep(Duration::from_millis(5));
                let fifo = swap.join("fifo");
                let _ = fs::remove_file(&fifo);
                let _ = nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600));
                let _ = fs::rename(&fifo, &token_path);
                std::thread::sleep(Duration::from_millis(2));
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let tokens = [a.clone(), valid_token("b")];
    let mut installed = 0;
    for i in 0..40 {
        let f = root.file(&format!("in/{i}.tok"), &tokens[i % 2]);
        // Whatever each install concludes, it ends (within() fails a call that hangs).
        let (r, _) = within(&root, &["install", "--token-file", f.to_str().unwrap()]);
        installed += usize::from(r.code == Some(0));
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(swaps.load(Ordering::Relaxed) > 40, "the swapper ran");
    // Some installs found the token a regular file and acted (a chmod, a copy kept aside).
    assert!(installed > 0, "no install got through");
    assert_eq!(fs::read(&victim).unwrap(), b"not the agent's");
    assert_eq!(mode(&victim), 0o600, "root never chmods through the link");
    // Nothing the agent put aside is a FIFO it blocked on or a copy of the victim.
    let replaced = fs::read_dir(root.state_dir().join("replaced"));
    for d in replaced.into_iter().flatten() {
        for e in fs::read_dir(d.unwrap().path()).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_file() {
                assert_ne!(fs::read(&p).unwrap(), b"not the agent's", "{}", p.display());
            }
        }
    }
}

/// An install over a token under the DLS's download name, stopped dead (a power loss, a
/// SIGKILL) at every step: the directory holds a whole valid token at each of them, and the
/// next install finishes the job.
#[test]
fn an_install_killed_at_any_step_leaves_a_whole_token() {
    const DOWNLOAD: &str = "client_configuration_token_11-30-2026-10-00-00.tok";
    for point in [
        "crash-after-stage",
        "crash-after-save",
        "crash-after-commit",
        "crash-after-first-move",
        "crash-after-all-moves",
    ] {
        let root = Root::new();
        fs::create_dir_all(root.token_dir()).unwrap();
        let old = valid_token("old");
        fs::write(root.token_dir().join(DOWNLOAD), &old).unwrap();
        fs::set_permissions(
            root.token_dir().join(DOWNLOAD),
            fs::Permissions::from_mode(0o744),
        )
        .unwrap();
        fs::write(root.token_dir().join("README"), b"a stray").unwrap();
        let new = valid_token("new");
        let tok = root.file("in/new.tok", &new);
        let mut cmd = root.cmd(&["install", "--token-file", tok.to_str().unwrap()]);
        cmd.env("VGPU_LICENSE_AGENT_FAULT", point);
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{point}: stopped dead");
        // What gridd reads now: every regular file but the agent's temporary (dot) files.
        let tokens: Vec<Vec<u8>> = fs::read_dir(root.token_dir())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .map(|e| fs::read(e.path()).unwrap())
            .filter(|b| *b == old || *b == new)
            .collect();
        assert!(!tokens.is_empty(), "{point}: no whole token left");
        // The next install finishes: the new token alone, the old one kept aside.
        let r = root.run(&["install", "--token-file", tok.to_str().unwrap()]);
        assert_eq!(r.code, Some(0), "{point}: {}{}", r.stdout, r.stderr);
        let names: Vec<String> = fs::read_dir(root.token_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["client_configuration_token.tok"], "{point}");
        assert_eq!(fs::read(root.token_path()).unwrap(), new, "{point}");
        let kept = walk(&root.state_dir().join("replaced"))
            .into_iter()
            .any(|p| fs::read(&p).is_ok_and(|b| b == old));
        assert!(kept, "{point}: the old token kept in replaced/");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A guest failing for days: gridd's journal of this boot is longer than the output cap
/// (14,001 entries, about 12 MB of `journalctl --output=json`, shaped as the real journal
/// prints gridd's syslog lines). `status` reads its newest part and says so, instead of
/// dropping the whole journal and the reason with it.
#[test]
fn a_journal_longer_than_the_cap_is_read_from_its_newest_part() {
    let root = Root::new();
    let export = root.path("journal.json");
    let mut text = String::new();
    let start: u64 = 1_796_000_000_000_000;
    for i in 0..14_001u64 {
        let message = if i + 1 == 14_001 {
            "Failed to open file /etc/nvidia/gridd.conf (No such file or directory)".to_string()
        } else {
            "Failed to acquire license from 192.168.178.110 (Error: Generic network communication failure)".to_string()
        };
        let at = start + i * 60_000_000;
        let entry = serde_json::json!({
            "__REALTIME_TIMESTAMP": at.to_string(),
            "_SOURCE_REALTIME_TIMESTAMP": at.to_string(),
            "SYSLOG_PID": "3239",
            "_BOOT_ID": "fbca72dd130144f0b2a21a7e5fe8794f",
            "_EXE": "/usr/bin/nvidia-gridd",
            "SYSLOG_IDENTIFIER": "nvidia-gridd",
            "_CMDLINE": "/usr/bin/nvidia-gridd",
            "_COMM": "nvidia-gridd",
            "SYSLOG_RAW": format!("<27>nvidia-gridd[3239]: {message}"),
            "_TRANSPORT": "syslog",
            "_SYSTEMD_UNIT": "nvidia-gridd.service",
            "_GID": "0",
            "_UID": "0",
            "__CURSOR": format!("s=cb5e753f3b9a47c380c9d377626751e8;i={i:x};b=fbca72dd130144f0b2a21a7e5fe8794f;m=4a893213d;t=661afbbb0d098;x=5d55dfbe82893ca1"),
            "PRIORITY": "3",
            "_HOSTNAME": "vm",
            "_MACHINE_ID": "3d1219c7c4c5404aaa1f6d2a48adfda4",
            "MESSAGE": message,
            "_PID": "3239",
            "SYSLOG_FACILITY": "3",
        });
        text.push_str(&entry.to_string());
        text.push('\n');
    }
    assert!(text.len() > 10 << 20, "{} bytes", text.len());
    fs::write(&export, &text).unwrap();
    let journalctl = root.path("journalctl");
    fs::write(
        &journalctl,
        format!("#!/bin/sh\nexec cat '{}'\n", export.display()),
    )
    .unwrap();
    crate::common::make_executable(&journalctl);
    root.dropin(
        "journal.toml",
        &format!("[commands]\njournalctl = \"{}\"\n", journalctl.display()),
    );
    let r = root.run(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let events = v["events"].as_array().unwrap();
    assert!(
        events.last().is_some_and(|e| e["message"]
            .as_str()
            .is_some_and(|m| m.contains("Failed to open file /etc/nvidia/gridd.conf"))),
        "the newest entry is read: {v}"
    );
    assert!(
        v["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .is_some_and(|n| n.contains("only its newest entries were read"))),
        "{v}"
    );
}

/// A reader that goes away first (`status | grep -q`, `| head -1`): every command that only
/// reads and prints ends quietly, by the closed pipe as `cat` does, never with a panic and an
/// abort (a core dump that, for `diagnose`, holds the token it read).
#[test]
fn a_closed_pipe_ends_a_reading_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let mut root = Root::new();
    let tok = valid_token("pipe");
    root.secrets.push(tok.clone());
    let file = root.file("in/t.tok", &tok);
    let r = root.run(&["install", "--token-file", file.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let token = root.token_path();
    for args in [
        vec!["status"],
        vec!["status", "--json"],
        vec!["token", "inspect", token.to_str().unwrap()],
        vec!["config", "show"],
        vec!["diagnose"],
        vec!["diagnose", "--json"],
    ] {
        // The read end is closed before the command writes a byte.
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        let out = root
            .cmd(&args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.signal() == Some(nix::libc::SIGPIPE) || out.status.code().is_some(),
            "{args:?}: {:?} {err}",
            out.status
        );
        assert_ne!(
            out.status.signal(),
            Some(nix::libc::SIGABRT),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
