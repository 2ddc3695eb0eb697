//! `install` run as the real binary against a fake root (paths from the agent's config).

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Mount, Root, mode, skipped, token, valid_token};

const USER_CONF: &[u8] = b"# my settings\r\nEnableUI=TRUE\n\n# FeatureType=2\nFeatureType=0\n";

/// A root with a previous install: token `old` and a user's gridd.conf (FeatureType=1).
fn installed_root() -> (Root, Vec<u8>) {
    let mut root = Root::new();
    fs::create_dir_all(root.path("etc/nvidia")).unwrap();
    fs::write(root.gridd_conf(), USER_CONF).unwrap();
    let old = valid_token("old");
    root.install_ok(&old, &[]);
    assert_eq!(root.restarts(), 1);
    (root, old)
}

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// `cmd` as a user without root's privileges, for what root would not see: permission bits.
/// Not root: `cmd` itself. Root: `cmd` under `setpriv` as nobody (uid and gid 65534, no
/// supplementary groups), with the whole fake root given to nobody so that the config, the
/// token to install and the state directory stay within its reach; permission bits set on
/// the tree are kept. `Err(why)` where setpriv cannot run.
fn as_other_user(root: &Root, cmd: Command) -> Result<Command, String> {
    if !is_root() {
        return Ok(cmd);
    }
    let setpriv = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    match Command::new("setpriv").args(setpriv).arg("true").status() {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("setpriv {} true: {s}", setpriv.join(" "))),
        Err(e) => return Err(format!("setpriv (util-linux) cannot run: {e}")),
    }
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(root.dir.path())
        .status()
        .unwrap();
    assert!(
        chown.success(),
        "chown -R 65534:65534 {:?}",
        root.dir.path()
    );
    // The config stays root's: root refuses one another user could change (it names the
    // programs root runs), and the other user reads it as it is.
    let mut config = Some(root.config.as_path());
    while let Some(p) = config.filter(|p| p.starts_with(root.dir.path()) && *p != root.dir.path()) {
        nix::unistd::chown(
            p,
            Some(nix::unistd::Uid::from_raw(0)),
            Some(nix::unistd::Gid::from_raw(0)),
        )
        .unwrap();
        config = p.parent();
    }
    let mut c = Command::new("setpriv");
    c.args(setpriv)
        .arg("--")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdin(Stdio::null());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    Ok(c)
}

fn assert_unchanged(root: &Root, before: &(Option<Vec<u8>>, Option<Vec<u8>>), case: &str) {
    assert!(
        root.snapshot() == *before,
        "{case}: token or gridd.conf changed"
    );
    let names = root.token_dir_names();
    assert_eq!(
        names,
        vec!["client_configuration_token.tok".to_string()],
        "{case}: token directory"
    );
    assert_eq!(root.restarts(), 1, "{case}: restarted");
}

#[test]
fn fresh_root_twice_leaves_the_contract_files_with_one_restart() {
    let mut root = Root::new();
    let tok = valid_token("a");
    let first = root.install_ok(&tok, &[]);
    assert!(first.stdout.contains("installed token"), "{}", first.stdout);
    assert!(first.stdout.contains("restarted nvidia-gridd"));
    let second = root.install_ok(&tok, &[]);
    assert!(
        second.stdout.contains("nothing to change") && second.stdout.contains("not restarted"),
        "{}",
        second.stdout
    );
    assert_eq!(root.restarts(), 1);
    assert_eq!(fs::read(root.token_path()).unwrap(), tok);
    assert_eq!(mode(&root.token_path()), 0o744);
    assert_eq!(mode(&root.token_dir()), 0o755);
    assert_eq!(mode(&root.gridd_conf()), 0o644);
    assert_eq!(
        root.token_dir_names(),
        vec!["client_configuration_token.tok"]
    );
    let conf = fs::read_to_string(root.gridd_conf()).unwrap();
    assert!(conf.lines().any(|l| l == "FeatureType=1"), "{conf}");
    assert_eq!(
        conf.lines()
            .filter(|l| l.starts_with("FeatureType"))
            .count(),
        1
    );
}

#[test]
fn the_bytes_on_disk_are_the_bytes_given() {
    let mut root = Root::new();
    let mut tok = valid_token("nl");
    tok.extend_from_slice(b"\r\n");
    root.install_ok(&tok, &[]);
    assert_eq!(fs::read(root.token_path()).unwrap(), tok);
}

#[test]
fn the_bad_input_matrix_changes_nothing() {
    let (root, _old) = installed_root();
    let before = root.snapshot();
    let good = valid_token("new");
    let big = vec![b'a'; 10 << 20];
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", b"".to_vec(), "the token is empty"),
        ("garbage", b"hello world".to_vec(), "three base64url parts"),
        (
            "gridd.conf",
            b"# gridd.conf\nFeatureType=1\n".to_vec(),
            "this is a gridd.conf",
        ),
        (
            "truncated",
            good[..good.len() - 60].to_vec(),
            "looks truncated",
        ),
        ("cut in half", good[..good.len() / 2].to_vec(), "token"),
        ("10 MB", big.clone(), "larger than 64 KiB, far more"),
        (
            "invalid UTF-8",
            vec![0xff, 0xfe, 0x00, 0x41],
            "invalid UTF-8",
        ),
        (
            "expired",
            token("exp", 1_600_000_000, 1_700_000_000),
            "the token expired at 2023-11-14T22:13:20Z",
        ),
        (
            "not yet valid",
            token("nyv", 4_000_000_000, 4_100_000_000),
            "not valid before",
        ),
        (
            "PEM",
            b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec(),
            "PEM",
        ),
    ];
    for (case, input, want) in &cases {
        let f = root.file("in/bad.tok", input);
        let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
        assert_eq!(r.code, Some(1), "{case}: {}{}", r.stdout, r.stderr);
        let line = r.error_line();
        assert!(line.contains(want), "{case}: {line}");
        assert!(r.stdout.is_empty(), "{case}: {}", r.stdout);
        assert_unchanged(&root, &before, case);
    }
    // The same through standard input, 10 MB included.
    for (case, input, want) in [&cases[0], &cases[5], &cases[7]] {
        let r = root.run_stdin(&["install", "--token-file", "-"], input);
        assert_eq!(r.code, Some(1), "stdin {case}");
        assert!(r.error_line().contains(want), "stdin {case}: {}", r.stderr);
        assert_unchanged(&root, &before, case);
    }
    // An unreadable file: a directory, a missing file, and a file without read permission
    // (for a user other than root, which reads it anyway).
    let d = root.path("in/a-dir");
    fs::create_dir_all(&d).unwrap();
    let r = root.run(&["install", "--token-file", d.to_str().unwrap()]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.error_line()
            .contains("not a regular file but a directory"),
        "{}",
        r.stderr
    );
    let r = root.run(&["install", "--token-file", "/nonexistent/dir/x.tok"]);
    assert_eq!(r.code, Some(1));
    assert!(r.error_line().contains("No such file"), "{}", r.stderr);
    let f = root.file("in/noread.tok", &good);
    fs::set_permissions(&f, fs::Permissions::from_mode(0o000)).unwrap();
    match as_other_user(
        &root,
        root.cmd(&["install", "--token-file", f.to_str().unwrap()]),
    ) {
        Ok(mut cmd) => {
            let r = root.finish(cmd.output().unwrap());
            assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
            let line = r.error_line();
            assert!(
                line.contains("cannot read the token file") && line.contains("Permission denied"),
                "{line}"
            );
        }
        Err(why) => skipped(&format!("a token file without read permission: {why}")),
    }
    assert_unchanged(&root, &before, "unreadable");
    // Bad base64, the token's text given as base64, a bad FeatureType.
    for (args, want) in [
        (
            vec!["install", "--token-base64", "@@not base64@@"],
            "not valid base64",
        ),
        (
            vec![
                "install",
                "--token-base64",
                std::str::from_utf8(&good).unwrap(),
            ],
            "token's text itself",
        ),
        (
            vec![
                "install",
                "--token-base64",
                "eyJhbGciOiJSUzI1NiJ9",
                "--feature-type",
                "3",
            ],
            "--feature-type 3",
        ),
    ] {
        let r = root.run(&args);
        assert_eq!(r.code, Some(1), "{args:?}");
        assert!(r.error_line().contains(want), "{}", r.stderr);
        assert_unchanged(&root, &before, want);
    }
}

#[test]
fn force_installs_an_expired_token_with_a_warning() {
    let (mut root, _) = installed_root();
    let expired = token("exp", 1_600_000_000, 1_700_000_000);
    let r = root.install_ok(&expired, &["--force"]);
    assert!(
        r.stderr.contains("warning: --force: the token expired"),
        "{}",
        r.stderr
    );
    assert_eq!(fs::read(root.token_path()).unwrap(), expired);
}

#[test]
fn a_symlink_at_the_target_is_never_written_through() {
    let (root, old) = installed_root();
    let victim = root.file("victim", b"do not touch");
    fs::remove_file(root.token_path()).unwrap();
    std::os::unix::fs::symlink(&victim, root.token_path()).unwrap();
    let f = root.file("in/new.tok", &valid_token("new"));
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(1));
    let line = r.error_line();
    assert!(
        line.contains("is a symlink") && line.contains("rm "),
        "{line}"
    );
    assert_eq!(fs::read(&victim).unwrap(), b"do not touch");
    assert!(
        fs::symlink_metadata(root.token_path())
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(root.restarts(), 1);
    // The same for gridd.conf.
    fs::remove_file(root.token_path()).unwrap();
    fs::write(root.token_path(), &old).unwrap();
    let conf = fs::read(root.gridd_conf()).unwrap();
    let real_conf = root.file("real-gridd.conf", &conf);
    fs::remove_file(root.gridd_conf()).unwrap();
    std::os::unix::fs::symlink(&real_conf, root.gridd_conf()).unwrap();
    let r = root.run(&[
        "install",
        "--token-file",
        f.to_str().unwrap(),
        "--feature-type",
        "4",
    ]);
    assert_eq!(r.code, Some(1));
    assert!(r.error_line().contains("gridd.conf"), "{}", r.stderr);
    assert_eq!(fs::read(&real_conf).unwrap(), conf);
    assert_eq!(fs::read(root.token_path()).unwrap(), old);
}

/// A file name is outside text too: a symlink planted at the token's path, pointing to a
/// name with a terminal escape and a line break, is named in one line with both escaped.
#[test]
fn a_file_name_cannot_write_to_the_terminal() {
    let (root, old) = installed_root();
    let victim = root.file("victim\u{1b}[2J\nvgpu-license-agent: installed", b"x");
    fs::remove_file(root.token_path()).unwrap();
    std::os::unix::fs::symlink(&victim, root.token_path()).unwrap();
    let f = root.file("in/new.tok", &valid_token("new"));
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(1));
    assert!(!r.stderr.contains('\u{1b}'), "{:?}", r.stderr);
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{:?}", r.stderr);
    assert!(
        r.stderr.contains("victim\\u{1b}[2J\\nvgpu-license-agent"),
        "{:?}",
        r.stderr
    );
    assert_eq!(fs::read(&victim).unwrap(), b"x");
    assert!(!old.is_empty());
}

#[test]
fn a_read_only_token_directory_changes_nothing() {
    // Both ways a token directory is not writable: a read-only file system (EROFS), and a
    // directory without write permission for the user running install (EACCES).
    let new = valid_token("new");
    {
        // A read-only tmpfs where mounting is allowed; else an injected EROFS (debug builds).
        let (root, old) = installed_root();
        let before = root.snapshot();
        let mount = Mount::tmpfs(&root.token_dir(), "size=1m,mode=0755");
        let f = root.file("in/new.tok", &new);
        let mut cmd = root.cmd(&["install", "--token-file", f.to_str().unwrap()]);
        let how = match &mount {
            Some(m) => {
                fs::write(root.token_path(), &old).unwrap();
                fs::set_permissions(root.token_path(), fs::Permissions::from_mode(0o744)).unwrap();
                assert!(m.remount("ro"));
                Some("read-only tmpfs")
            }
            None if cfg!(debug_assertions) => {
                cmd.env("VGPU_LICENSE_AGENT_FAULT", "erofs");
                Some("injected EROFS (VGPU_LICENSE_AGENT_FAULT=erofs)")
            }
            None => {
                skipped(
                    "a read-only token directory: no tmpfs can be mounted here (needs root with CAP_SYS_ADMIN), and a release build has no injected EROFS (VGPU_LICENSE_AGENT_FAULT is read by debug builds only)",
                );
                None
            }
        };
        if let Some(how) = how {
            let r = root.finish(cmd.output().unwrap());
            assert_eq!(r.code, Some(1), "{how}: {}{}", r.stdout, r.stderr);
            let line = r.error_line();
            assert!(
                line.contains("Read-only file system")
                    && line.contains("remount it read-write")
                    && line.contains("nothing was changed"),
                "{how}: {line}"
            );
            assert_unchanged(&root, &before, how);
        }
    }
    let (root, _) = installed_root();
    let before = root.snapshot();
    let f = root.file("in/new.tok", &new);
    let cmd = root.cmd(&["install", "--token-file", f.to_str().unwrap()]);
    // Root ignores the mode: install runs as another user.
    let mut cmd = match as_other_user(&root, cmd) {
        Ok(cmd) => cmd,
        Err(why) => {
            skipped(&format!(
                "a token directory without write permission: {why}"
            ));
            return;
        }
    };
    fs::set_permissions(root.token_dir(), fs::Permissions::from_mode(0o555)).unwrap();
    let r = root.finish(cmd.output().unwrap());
    // Writable again, so that the temporary root can be removed by a user other than root.
    fs::set_permissions(root.token_dir(), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    let line = r.error_line();
    assert!(
        (line.contains("Permission denied") || line.contains("which this user may not"))
            && line.contains("as root")
            && line.contains("nothing was changed"),
        "{line}"
    );
    assert_unchanged(&root, &before, "no write permission");
}

#[test]
fn a_full_disk_changes_nothing() {
    // The token directory on a 64 KiB tmpfs, filled up, where mounting is allowed; else an
    // injected ENOSPC (debug builds only).
    let mut root = Root::new();
    let fs_dir = root.path("small");
    let mount = Mount::tmpfs(&fs_dir, "size=64k");
    let tok_dir = fs_dir.join("tok");
    root.dropin(
        "10-small.toml",
        &format!("[paths]\ntoken_dir = \"{}\"\n", tok_dir.display()),
    );
    let old = valid_token("old");
    root.install_ok(&old, &[]);
    let token_path = tok_dir.join("client_configuration_token.tok");
    let before = (fs::read(&token_path).ok(), fs::read(root.gridd_conf()).ok());
    let mut cmd_fault = None;
    if mount.is_some() {
        eprintln!("full-disk test: 64 KiB tmpfs, filled");
        let mut filler = fs::File::create(fs_dir.join("filler")).unwrap();
        let chunk = [0u8; 4096];
        while filler.write_all(&chunk).is_ok() {}
        drop(filler);
    } else if cfg!(debug_assertions) {
        eprintln!("full-disk test: injected ENOSPC (no mount allowed)");
        cmd_fault = Some("enospc");
    } else {
        skipped(
            "no tmpfs can be mounted here (needs root with CAP_SYS_ADMIN), and a release build has no injected ENOSPC (VGPU_LICENSE_AGENT_FAULT is read by debug builds only)",
        );
        return;
    }
    let f = root.file("in/new.tok", &valid_token("new-and-different"));
    let mut cmd = root.cmd(&["install", "--token-file", f.to_str().unwrap()]);
    if let Some(fault) = cmd_fault {
        cmd.env("VGPU_LICENSE_AGENT_FAULT", fault);
    }
    let r = root.finish(cmd.output().unwrap());
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    let line = r.error_line();
    assert!(line.contains("No space left on device"), "{line}");
    assert!(line.contains("make room"), "{line}");
    assert!(line.contains("nothing was changed"), "{line}");
    assert_eq!(
        (fs::read(&token_path).ok(), fs::read(root.gridd_conf()).ok()),
        before
    );
    let names: Vec<_> = fs::read_dir(&tok_dir).unwrap().collect();
    assert_eq!(names.len(), 1, "temporary file left behind");
    assert_eq!(root.restarts(), 1);
}

#[test]
fn a_crash_between_write_and_rename_is_cleaned_up_next_run() {
    let (mut root, old) = installed_root();
    let before = root.snapshot();
    let new = valid_token("new");
    root.secrets.push(new.clone());
    // A leftover planted as a crash would leave it...
    let planted = root
        .token_dir()
        .join(".client_configuration_token.tok.vla-tmp-99999-0000abcd-0");
    fs::write(&planted, &new[..100]).unwrap();
    // ...and a real crash (abort) right before the rename, injected: debug builds only.
    let f = root.file("in/new.tok", &new);
    if !cfg!(debug_assertions) {
        skipped(
            "the crash before the rename: a release build has no injected abort (VGPU_LICENSE_AGENT_FAULT is read by debug builds only); the planted leftover is still checked",
        );
    } else {
        let out = root
            .cmd(&["install", "--token-file", f.to_str().unwrap()])
            .env("VGPU_LICENSE_AGENT_FAULT", "abort-before-rename")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), None, "killed by SIGABRT");
        assert!(root.snapshot() == before, "crash changed the token");
        assert!(
            root.token_dir_names()
                .iter()
                .any(|n| n.contains(".vla-tmp-")),
            "temp files left by the crash"
        );
    }
    assert_eq!(fs::read(root.token_path()).unwrap(), old);
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("left by an interrupted install"),
        "{}",
        r.stdout
    );
    assert_eq!(
        root.token_dir_names(),
        vec!["client_configuration_token.tok"]
    );
    assert_eq!(fs::read(root.token_path()).unwrap(), new);
    // Temp files are removed, not kept as strays.
    let replaced = root.state_dir().join("replaced");
    for d in fs::read_dir(replaced).unwrap() {
        for f in fs::read_dir(d.unwrap().path()).unwrap() {
            let name = f.unwrap().file_name();
            assert!(!name.to_string_lossy().contains("vla-tmp"), "{name:?}");
        }
    }
}

#[test]
fn strays_are_moved_aside_not_deleted() {
    let (mut root, old) = installed_root();
    fs::write(root.token_dir().join("old-token.tok"), b"stray token").unwrap();
    // Moved by a rename, never opened: a FIFO does not block install, a link is moved as a
    // link (what it points to is not touched).
    nix::unistd::mkfifo(
        &root.token_dir().join("planted.tok"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let victim = root.file("victim", b"not the agent's");
    std::os::unix::fs::symlink(&victim, root.token_dir().join("link.tok")).unwrap();
    let new = valid_token("new");
    let r = root.install_ok(&new, &[]);
    assert_eq!(r.stdout.matches("moved ").count(), 3, "{}", r.stdout);
    assert!(
        r.stdout.contains("saved the previous token"),
        "{}",
        r.stdout
    );
    assert_eq!(
        root.token_dir_names(),
        vec!["client_configuration_token.tok"]
    );
    let replaced = root.state_dir().join("replaced");
    let dirs: Vec<_> = fs::read_dir(&replaced)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1);
    let stamp = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        stamp.len() == 16 && stamp.ends_with('Z') && stamp.as_bytes()[8] == b'T',
        "{stamp}"
    );
    assert_eq!(
        fs::read(dirs[0].join("old-token.tok")).unwrap(),
        b"stray token"
    );
    assert!(
        fs::symlink_metadata(dirs[0].join("planted.tok"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert_eq!(fs::read_link(dirs[0].join("link.tok")).unwrap(), victim);
    assert_eq!(fs::read(&victim).unwrap(), b"not the agent's");
    assert_eq!(
        fs::read(dirs[0].join("client_configuration_token.tok")).unwrap(),
        old
    );
    assert_eq!(mode(&replaced), 0o700);
    assert_eq!(root.restarts(), 2);
    // Idempotent afterwards.
    let r = root.install_ok(&new, &[]);
    assert!(r.stdout.contains("nothing to change"), "{}", r.stdout);
    assert_eq!(root.restarts(), 2);
}

#[test]
fn a_stray_alone_or_a_wrong_mode_is_a_change_that_restarts() {
    let (mut root, old) = installed_root();
    fs::set_permissions(root.token_path(), fs::Permissions::from_mode(0o600)).unwrap();
    let r = root.install_ok(&old, &[]);
    assert!(r.stdout.contains("mode 0600 -> 0744"), "{}", r.stdout);
    assert_eq!(mode(&root.token_path()), 0o744);
    assert_eq!(root.restarts(), 2);
    fs::write(root.token_dir().join("x.tok"), b"x").unwrap();
    root.install_ok(&old, &[]);
    assert_eq!(root.restarts(), 3);
}

#[test]
fn gridd_conf_keeps_every_other_line_and_warns_about_legacy_keys() {
    let mut root = Root::new();
    let conf = b"# site settings\nServerAddress=10.0.0.5\nServerPort=7070\n\n# FeatureType=2\nFeatureType=\"0\"\nEnableUI=TRUE\n";
    root.file("etc/nvidia/gridd.conf", conf);
    fs::set_permissions(root.gridd_conf(), fs::Permissions::from_mode(0o640)).unwrap();
    let r = root.install_ok(&valid_token("a"), &[]);
    assert_eq!(
        fs::read(root.gridd_conf()).unwrap(),
        b"# site settings\nServerAddress=10.0.0.5\nServerPort=7070\n\n# FeatureType=2\nFeatureType=\"1\"\nEnableUI=TRUE\n"
    );
    assert_eq!(
        mode(&root.gridd_conf()),
        0o640,
        "an existing file keeps its mode"
    );
    assert!(
        r.stdout
            .contains("line 6: FeatureType=\"0\" -> FeatureType=\"1\""),
        "{}",
        r.stdout
    );
    let warnings: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(warnings.len(), 2, "{}", r.stderr);
    assert!(
        warnings[0]
            .starts_with("vgpu-license-agent: warning: gridd.conf line 2 sets ServerAddress")
    );
    assert!(warnings[1].contains("ServerPort") && warnings[1].contains("unused"));
    // A missing key is added at the end.
    fs::write(root.gridd_conf(), b"EnableUI=TRUE").unwrap();
    root.install_ok(&valid_token("a"), &["--feature-type", "4"]);
    assert_eq!(
        fs::read(root.gridd_conf()).unwrap(),
        b"EnableUI=TRUE\nFeatureType=4\n"
    );
}

#[test]
fn feature_type_that_does_not_fit_the_vgpu_profile_gets_a_warning() {
    let root = Root::new();
    let smi = root.file(
        "fake-nvidia-smi",
        b"#!/bin/sh\ncat <<'EOF'\n==============NVSMI LOG==============\nAttached GPUs : 1\nGPU 00000000:02:01.0\n    Product Name                          : NVIDIA L40S-24Q\n    GPU Virtualization Mode\n        Virtualization Mode               : VGPU\nEOF\n",
    );
    crate::common::make_executable(&smi);
    root.dropin(
        "20-smi.toml",
        &format!("[commands]\nnvidia_smi = \"{}\"\n", smi.display()),
    );
    let mut root = root;
    let r = root.install_ok(&valid_token("a"), &["--feature-type", "4"]);
    assert!(
        r.stderr.contains("NVIDIA L40S-24Q") && r.stderr.contains("--feature-type 1"),
        "{}",
        r.stderr
    );
    let r = root.install_ok(&valid_token("a"), &["--feature-type", "1"]);
    assert!(r.stderr.is_empty(), "{}", r.stderr);
}

#[test]
fn dry_run_says_what_would_change_and_changes_nothing() {
    let (mut root, _old) = installed_root();
    fs::write(root.token_dir().join("stray.tok"), b"x").unwrap();
    let before = root.snapshot();
    let new = valid_token("new");
    root.secrets.push(new.clone());
    let f = root.file("in/new.tok", &new);
    let state_before = fs::read(root.state_dir().join("install-state.json")).unwrap();
    let r = root.run(&[
        "install",
        "--token-file",
        f.to_str().unwrap(),
        "--feature-type",
        "4",
        "--dry-run",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for want in [
        "would move",
        "stray.tok",
        "would save the previous token",
        "would install token",
        "mode 0744",
        "would edit",
        "FeatureType=1 -> FeatureType=4",
        "would restart nvidia-gridd",
    ] {
        assert!(r.stdout.contains(want), "{want}: {}", r.stdout);
    }
    assert!(root.snapshot() == before);
    assert!(root.token_dir().join("stray.tok").exists());
    assert!(!root.state_dir().join("replaced").exists());
    assert_eq!(
        fs::read(root.state_dir().join("install-state.json")).unwrap(),
        state_before
    );
    assert_eq!(root.restarts(), 1);
}

#[test]
fn no_restart_skips_the_restart_and_says_so() {
    let (mut root, _) = installed_root();
    let r = root.install_ok(&valid_token("new"), &["--no-restart"]);
    assert!(r.stdout.contains("--no-restart"), "{}", r.stdout);
    assert_eq!(root.restarts(), 1);
}

#[test]
fn a_failed_restart_is_an_error_and_is_retried_by_the_next_run() {
    let mut root = Root::new();
    let flag = root.path("restart-fails");
    fs::write(&flag, b"").unwrap();
    let script = root.path("restart.sh");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nif [ -e {f} ]; then echo 'Unit nvidia-gridd.service not found.' >&2; exit 5; fi\necho restart >> {r}\n",
            f = flag.display(),
            r = root.path("restarts").display()
        ),
    )
    .unwrap();
    let tok = valid_token("a");
    root.secrets.push(tok.clone());
    let f = root.file("in/t.tok", &tok);
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(1));
    let line = r.error_line();
    assert!(
        line.contains("installed, but restarting nvidia-gridd failed")
            && line.contains("Unit nvidia-gridd.service not found."),
        "{line}"
    );
    assert_eq!(fs::read(root.token_path()).unwrap(), tok);
    fs::remove_file(&flag).unwrap();
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("an earlier restart is still owed"),
        "{}",
        r.stdout
    );
    assert_eq!(root.restarts(), 1);
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert!(r.stdout.contains("nothing to change"));
    assert_eq!(root.restarts(), 1);
}

#[test]
fn a_hanging_restart_is_killed_in_time() {
    let mut root = Root::with_config("");
    let script = root.path("restart.sh");
    fs::write(&script, "#!/bin/sh\nsleep 60 &\nsleep 60\n").unwrap();
    root.dropin("30-timeout.toml", "[commands]\ntimeout_seconds = 1\n");
    let tok = valid_token("a");
    root.secrets.push(tok.clone());
    let f = root.file("in/t.tok", &tok);
    let start = Instant::now();
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert!(start.elapsed() < Duration::from_secs(20), "hung");
    assert_eq!(r.code, Some(1));
    assert!(
        r.error_line().contains("did not finish within 1s"),
        "{}",
        r.stderr
    );
}

#[test]
fn two_installs_at_once_leave_one_whole_token() {
    let root = Root::new();
    // A slow restart widens the window in which the two runs overlap.
    fs::write(
        root.path("restart.sh"),
        format!(
            "#!/bin/sh\nsleep 0.2\necho restart >> {}\n",
            root.path("restarts").display()
        ),
    )
    .unwrap();
    let a = valid_token("aaaa");
    let mut b = valid_token("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb");
    b.extend_from_slice(&[b'\n'; 3]);
    let fa = root.file("in/a.tok", &a);
    let fb = root.file("in/b.tok", &b);
    for round in 0..4 {
        let pa = root
            .cmd(&["install", "--token-file", fa.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pb = root
            .cmd(&["install", "--token-file", fb.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let oa = pa.wait_with_output().unwrap();
        let ob = pb.wait_with_output().unwrap();
        assert!(
            oa.status.success(),
            "{}",
            String::from_utf8_lossy(&oa.stderr)
        );
        assert!(
            ob.status.success(),
            "{}",
            String::from_utf8_lossy(&ob.stderr)
        );
        let got = fs::read(root.token_path()).unwrap();
        assert!(got == a || got == b, "round {round}: a mix of two tokens");
        assert_eq!(
            root.token_dir_names(),
            vec!["client_configuration_token.tok"]
        );
    }
}

#[test]
fn token_from_stdin_and_base64() {
    let mut root = Root::new();
    let tok = valid_token("stdin");
    root.secrets.push(tok.clone());
    let r = root.run_stdin(&["install", "--token-file", "-"], &tok);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(fs::read(root.token_path()).unwrap(), tok);
    let tok2 = valid_token("b64");
    root.secrets.push(tok2.clone());
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&tok2);
    let r = root.run(&["install", "--token-base64", &b64]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(fs::read(root.token_path()).unwrap(), tok2);
    assert_eq!(root.restarts(), 2);
}

/// The token's file encoded twice (`base64` of `base64`, as a pipeline that encodes a value
/// already encoded makes it): said as such, with how to give it, and nothing installed; the
/// token (in either encoding) never printed.
#[test]
fn a_token_base64_encoded_twice_is_said_to_be() {
    use base64::Engine;
    let mut root = Root::new();
    let tok = valid_token("twice");
    root.secrets.push(tok.clone());
    let std = base64::engine::general_purpose::STANDARD;
    let once = std.encode(&tok);
    let twice = std.encode(&once);
    for value in [
        twice.clone(),
        format!("{twice}\n"),
        std.encode(format!("{once}\n")),
    ] {
        let r = root.run(&["install", "--token-base64", &value]);
        assert_eq!(r.code, Some(1), "{}", r.stderr);
        let line = r.error_line();
        assert!(line.contains("encoded twice"), "{line}");
        assert!(
            line.contains("base64 -w0 client_configuration_token.tok"),
            "{line}"
        );
        assert!(!line.contains("three base64url parts"), "{line}");
        assert!(
            !line.contains(&once[..40]) && !line.contains(&twice[..40]),
            "{line}"
        );
        assert!(r.stdout.is_empty(), "{}", r.stdout);
        assert!(!root.token_path().exists());
        assert_eq!(root.restarts(), 0);
    }
}

/// A one-shot HTTP server on the loopback: answers each connection with the next response.
fn serve(responses: Vec<Vec<u8>>) -> (u16, std::thread::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let mut requests = Vec::new();
        for resp in responses {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let head = crate::common::read_request_head(&mut s).unwrap_or_default();
            requests.push(String::from_utf8_lossy(&head).into_owned());
            let _ = s.write_all(&resp);
        }
        requests
    });
    (port, handle)
}

fn http(status: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[test]
fn token_url_retries_and_never_prints_credentials() {
    let mut root = Root::new();
    let tok = valid_token("url");
    root.secrets.push(tok.clone());
    // A 503, then the token.
    let (port, server) = serve(vec![
        http("503 Service Unavailable", b""),
        http("200 OK", &tok),
    ]);
    let url = format!("http://agent:pa55word@127.0.0.1:{port}/t/token.tok?sig=s3cr3t");
    let r = root.run(&["install", "--token-url", &url, "--retries", "2"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(fs::read(root.token_path()).unwrap(), tok);
    let requests = server.join().unwrap();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[0].contains("authorization: Basic")
            || requests[0].contains("Authorization: Basic")
    );
    // A 404 is not retried; the message names the URL without user, password or query.
    let (port, server) = serve(vec![http("404 Not Found", b"")]);
    let url = format!("http://agent:pa55word@127.0.0.1:{port}/t/token.tok?sig=s3cr3t");
    let r = root.run(&["install", "--token-url", &url]);
    assert_eq!(r.code, Some(1));
    let line = r.error_line();
    assert!(
        line.contains("404") && line.contains(&format!("http://127.0.0.1:{port}/t/token.tok?...")),
        "{line}"
    );
    for secret in ["pa55word", "agent:pa55", "s3cr3t"] {
        assert!(!r.stderr.contains(secret) && !r.stdout.contains(secret));
    }
    server.join().unwrap();
    // Nobody listening, and an oversized answer.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("http://agent:pa55word@127.0.0.1:{port}/x?sig=s3cr3t");
    let r = root.run(&[
        "install",
        "--token-url",
        &url,
        "--retries",
        "1",
        "--timeout",
        "2",
    ]);
    assert_eq!(r.code, Some(1));
    let line = r.error_line();
    assert!(line.contains("after 2 attempt(s)"), "{line}");
    assert!(
        !line.contains("pa55word") && !line.contains("s3cr3t"),
        "{line}"
    );
    let (port, server) = serve(vec![http("200 OK", &vec![b'a'; 200_000])]);
    let r = root.run(&[
        "install",
        "--token-url",
        &format!("http://127.0.0.1:{port}/big"),
    ]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.error_line()
            .contains("far more than a client configuration token")
    );
    let _ = server.join();
    // Plain HTTP to anything but the loopback is refused.
    let r = root.run(&[
        "install",
        "--token-url",
        "http://u:pa55word@dls.example/t.tok",
    ]);
    assert_eq!(r.code, Some(1));
    assert!(r.error_line().contains("only https://"));
    assert!(!r.stderr.contains("pa55word"));
    assert_eq!(root.restarts(), 1);
}

/// A URL with a password or a signed query given in the environment, which no other user
/// can read (the command line is anyone's, in `/proc/PID/cmdline`): installed the same, and
/// shown by no `--help`.
#[test]
fn token_url_from_the_environment_stays_out_of_the_command_line() {
    let mut root = Root::new();
    let tok = valid_token("env-url");
    root.secrets.push(tok.clone());
    let (port, server) = serve(vec![http("200 OK", &tok)]);
    let url = format!("http://agent:pa55word@127.0.0.1:{port}/t/token.tok?sig=s3cr3t");
    let out = root
        .cmd(&["install"])
        .env("VGPU_LICENSE_AGENT_TOKEN_URL", &url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read(root.token_path()).unwrap(), tok);
    let requests = server.join().unwrap();
    assert!(
        requests[0]
            .to_ascii_lowercase()
            .contains("authorization: basic")
    );
    let help = root
        .cmd(&["install", "--help"])
        .env("VGPU_LICENSE_AGENT_TOKEN_URL", &url)
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("VGPU_LICENSE_AGENT_TOKEN_URL"), "{help}");
    for secret in ["pa55word", "s3cr3t"] {
        assert!(!help.contains(secret), "{help}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(secret));
        assert!(!String::from_utf8_lossy(&out.stderr).contains(secret));
    }
}

#[test]
fn https_errors_are_one_line_without_credentials() {
    let root = Root::new();
    // A server that speaks no TLS: the handshake fails.
    let (port, server) = serve(vec![b"garbage\r\n\r\n".to_vec()]);
    let url = format!("https://user:pa55word@127.0.0.1:{port}/t.tok?k=s3cr3t");
    let r = root.run(&[
        "install",
        "--token-url",
        &url,
        "--retries",
        "0",
        "--timeout",
        "5",
    ]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let line = r.error_line();
    assert!(
        line.contains("cannot download the token from https://127.0.0.1"),
        "{line}"
    );
    assert!(
        !line.contains("pa55word") && !line.contains("s3cr3t"),
        "{line}"
    );
    let _ = server.join();
    // A CA file that is not PEM.
    let ca = root.file("ca.pem", b"not a certificate");
    let r = root.run(&[
        "install",
        "--token-url",
        "https://127.0.0.1:1/t.tok",
        "--ca-file",
        ca.to_str().unwrap(),
    ]);
    assert_eq!(r.code, Some(1));
    assert!(r.error_line().contains("--ca-file"), "{}", r.stderr);
}

#[test]
fn a_token_path_elsewhere_in_gridd_conf_gets_a_warning() {
    let mut root = Root::new();
    root.file(
        "etc/nvidia/gridd.conf",
        b"FeatureType=1\nClientConfigTokenPath=/opt/tokens\n",
    );
    let r = root.install_ok(&valid_token("a"), &[]);
    assert!(
        r.stderr.contains("ClientConfigTokenPath=/opt/tokens")
            && r.stderr.contains("paths.token_dir"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_failed_write_on_a_fresh_root_leaves_no_new_directory() {
    let mut root = Root::new();
    let tok = valid_token("a");
    root.secrets.push(tok.clone());
    let f = root.file("in/t.tok", &tok);
    // etc/nvidia on a full 64 KiB tmpfs where mounting is allowed (the token directory can
    // still be made there, its file cannot be written); else an injected ENOSPC.
    let mount = Mount::tmpfs(&root.path("etc/nvidia"), "size=64k,mode=0755");
    let mut cmd = root.cmd(&["install", "--token-file", f.to_str().unwrap()]);
    if mount.is_some() {
        let mut filler = fs::File::create(root.path("etc/nvidia/.filler")).unwrap();
        let chunk = [0u8; 4096];
        while filler.write_all(&chunk).is_ok() {}
    } else if cfg!(debug_assertions) {
        fs::create_dir_all(root.path("etc/nvidia")).unwrap();
        cmd.env("VGPU_LICENSE_AGENT_FAULT", "enospc");
    } else {
        skipped(
            "no tmpfs can be mounted here (needs root with CAP_SYS_ADMIN), and a release build has no injected ENOSPC (VGPU_LICENSE_AGENT_FAULT is read by debug builds only)",
        );
        return;
    }
    let r = root.finish(cmd.output().unwrap());
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.error_line().contains("No space left on device"),
        "{}",
        r.stderr
    );
    assert!(!root.token_dir().exists());
    assert!(!root.gridd_conf().exists());
    assert_eq!(root.restarts(), 0);
}

#[test]
fn a_guest_its_cloud_platform_licenses_is_not_given_a_token_unless_forced() {
    let root = Root::new();
    // nvidia-smi as on a cloud GPU instance licensed by the platform: no expiry, no token.
    let smi = root.file(
        "cloud-nvidia-smi",
        b"#!/bin/sh\ncat <<'E'\n==============NVSMI LOG==============\n\nDriver Version                            : 550.90.07\n\nGPU 00000000:00:1E.0\n    Product Name                          : NVIDIA L4-3Q\n    vGPU Software Licensed Product\n        Product Name                      : NVIDIA RTX Virtual Workstation\n        License Status                    : Licensed (Expiry: N/A)\nE\n",
    );
    crate::common::make_executable(&smi);
    root.dropin(
        "smi.toml",
        &format!("[commands]\nnvidia_smi = \"{}\"\n", smi.display()),
    );
    let tok = root.file("in/t.tok", &valid_token("cloud"));
    let r = root.run(&["install", "--token-file", tok.to_str().unwrap()]);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.error_line().contains("licensed by its cloud platform"),
        "{}",
        r.stderr
    );
    assert!(!root.token_path().exists());
    let r = root.run(&["install", "--force", "--token-file", tok.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(root.token_path().exists());
}

/// The DLS's download name, as NVIDIA's guide copies it into the token directory.
const DOWNLOAD_NAME: &str = "client_configuration_token_11-30-2026-10-00-00.tok";

/// A token saved under the DLS's download name is the installed token: installing the same
/// token again changes nothing and keeps that name; a new one replaces it, and the old one is
/// kept in `replaced/`, so exactly one token is left.
#[test]
fn a_token_under_any_name_is_the_installed_token() {
    let root = Root::new();
    let tok = valid_token("download");
    fs::create_dir_all(root.token_dir()).unwrap();
    let at = root.token_dir().join(DOWNLOAD_NAME);
    fs::write(&at, &tok).unwrap();
    fs::set_permissions(&at, fs::Permissions::from_mode(0o600)).unwrap();
    let f = root.file("in/same.tok", &tok);
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("it keeps that name"), "{}", r.stdout);
    assert!(r.stdout.contains("mode 0600 -> 0744"), "{}", r.stdout);
    assert_eq!(root.token_dir_names(), vec![DOWNLOAD_NAME]);
    assert_eq!(mode(&at), 0o744);
    // Idempotent: nothing more to change.
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert!(r.stdout.contains("nothing to change"), "{}", r.stdout);

    // A new token: the old one is moved aside, whatever its name; one token is left.
    let new = valid_token("new");
    let f = root.file("in/new.tok", &new);
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert_eq!(
        root.token_dir_names(),
        vec!["client_configuration_token.tok"]
    );
    assert_eq!(fs::read(root.token_path()).unwrap(), new);
    let replaced = root.state_dir().join("replaced");
    let kept: Vec<Vec<u8>> = fs::read_dir(&replaced)
        .unwrap()
        .flat_map(|d| fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(kept, vec![tok]);
}

/// A site's own name, without `.tok` (NREC drops `bgo-client-token-latest`): the token all
/// the same, and `status` does not call it missing.
#[test]
fn a_token_without_tok_suffix_is_judged_not_missing() {
    // This guest's own journal stays out of what is observed.
    let root = Root::with_config("journalctl = \"/bin/true\"\n");
    fs::create_dir_all(root.token_dir()).unwrap();
    let at = root.token_dir().join("bgo-client-token-latest");
    fs::write(&at, valid_token("site")).unwrap();
    // No driver answers here (the driver is the headline), but a missing token would be
    // named all the same.
    let says_missing = |root: &Root| {
        let r = root.run(&["status", "--json"]);
        serde_json::from_str::<serde_json::Value>(&r.stdout).expect(&r.stdout);
        r.stdout.contains("token_missing")
    };
    assert!(!says_missing(&root));
    // The same directory without it: the token is missing.
    fs::rename(&at, root.path("elsewhere")).unwrap();
    assert!(says_missing(&root));
}

/// The classic misplaced file: a gridd.conf (and an editor's backup) in the token directory.
/// gridd exits on them; install moves them aside, nothing is lost.
#[test]
fn a_gridd_conf_in_the_token_directory_is_moved_aside() {
    let (root, _) = installed_root();
    fs::write(root.token_dir().join("gridd.conf"), b"FeatureType=1\n").unwrap();
    fs::write(
        root.token_dir().join("client_configuration_token.tok~"),
        b"x",
    )
    .unwrap();
    let f = root.file("in/new.tok", &valid_token("new"));
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("gridd.conf to "), "{}", r.stdout);
    assert_eq!(
        root.token_dir_names(),
        vec!["client_configuration_token.tok"]
    );
    let moved: Vec<String> = fs::read_dir(root.state_dir().join("replaced"))
        .unwrap()
        .flat_map(|d| fs::read_dir(d.unwrap().path()).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(moved.contains(&"gridd.conf".to_string()), "{moved:?}");
}

/// A stray larger than any token, when moving it would copy it to another file system, is
/// named and left where it is; nothing else changes.
#[test]
fn a_huge_stray_is_never_copied_across_file_systems() {
    let (root, old) = installed_root();
    let big = root.token_dir().join("backup.img");
    let f = fs::File::create(&big).unwrap();
    f.set_len(1 << 30).unwrap();
    // Closed: a file still open for writing is left to its writer, not moved.
    drop(f);
    let tok = root.file("in/new.tok", &valid_token("new"));
    let before = root.restarts();
    let mut cmd = root.cmd(&["install", "--token-file", tok.to_str().unwrap()]);
    cmd.env("VGPU_LICENSE_AGENT_FAULT", "exdev");
    let r = root.finish(cmd.output().unwrap());
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    let line = r.error_line();
    assert!(
        line.contains("backup.img") && line.contains("rm ") && line.contains("nothing was changed"),
        "{line}"
    );
    assert_eq!(fs::metadata(&big).unwrap().len(), 1 << 30);
    assert_eq!(fs::read(root.token_path()).unwrap(), old);
    assert_eq!(root.restarts(), before);
}

/// A token directory owned by another user lets that user replace the token: install
/// refuses it and changes nothing.
#[test]
fn a_token_directory_owned_by_another_user_is_refused() {
    if !is_root() {
        skipped("a_token_directory_owned_by_another_user_is_refused: needs root to chown");
        return;
    }
    let (root, old) = installed_root();
    nix::unistd::chown(
        &root.token_dir(),
        Some(nix::unistd::Uid::from_raw(65534)),
        None,
    )
    .unwrap();
    let f = root.file("in/new.tok", &valid_token("new"));
    let r = root.run(&["install", "--token-file", f.to_str().unwrap()]);
    assert_eq!(r.code, Some(1));
    assert!(
        r.error_line().contains("owned by uid 65534") && r.error_line().contains("chown root:root"),
        "{}",
        r.stderr
    );
    assert_eq!(fs::read(root.token_path()).unwrap(), old);
}

/// A token that expires soon is installed with a word, and `status` says it too (one
/// threshold, the alert's 14 days, everywhere).
#[test]
fn a_token_that_expires_soon_is_installed_with_a_warning() {
    let root = Root::new();
    let now = chrono::Utc::now().timestamp();
    let tok = root.file(
        "in/soon.tok",
        &crate::common::token("soon", now - 3600, now + 150),
    );
    let r = root.run(&["install", "--token-file", tok.to_str().unwrap()]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let said = format!("{}{}", r.stdout, r.stderr);
    assert!(said.contains("the token expires at"), "{said}");
    assert!(said.contains("minutes"), "{said}");
    let r = root.run(&["diagnose"]);
    assert!(r.stdout.contains("expires within 14 days"), "{}", r.stdout);
}
