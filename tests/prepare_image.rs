//! `prepare-image` run as the real binary against a fake root.

use std::fs;

use crate::common::{Root, valid_token};

fn prepared_root() -> Root {
    let mut root = Root::new();
    root.install_ok(&valid_token("old"), &[]);
    fs::write(root.token_dir().join("stray.tok"), b"x").unwrap();
    root.install_ok(&valid_token("new"), &[]);
    root.file("run/vgpu-license-agent/status.json", b"{}");
    root.file(
        "var/lib/prometheus/node-exporter/vgpu_license_agent.prom",
        b"vgpu_license_licensed 1\n",
    );
    root.file("var/lib/nvidia/GridLicensing/client.dat", b"state");
    fs::create_dir_all(root.path("var/lib/nvidia/vGPULicensing")).unwrap();
    root
}

#[test]
fn dry_run_lists_and_removes_nothing() {
    let root = prepared_root();
    let r = root.run(&["prepare-image", "--dry-run"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for want in [
        "would remove",
        "client_configuration_token.tok",
        "replaced",
        "status.json",
        "vgpu_license_agent.prom",
        "GridLicensing (1 entries)",
        "--purge-client-state",
        "/etc/machine-id",
    ] {
        assert!(r.stdout.contains(want), "{want}: {}", r.stdout);
    }
    assert!(!r.stdout.contains("vGPULicensing"), "empty: not listed");
    assert!(root.token_path().exists());
    assert!(root.state_dir().join("replaced").exists());
    assert!(
        root.path("var/lib/nvidia/GridLicensing/client.dat")
            .exists()
    );
}

#[test]
fn removes_the_token_and_the_state_and_keeps_client_state_unless_asked() {
    let root = prepared_root();
    let conf = fs::read(root.gridd_conf()).unwrap();
    let r = root.run(&["prepare-image"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("removed "), "{}", r.stdout);
    assert!(root.token_dir().is_dir(), "the directory stays");
    assert!(root.token_dir_names().is_empty());
    assert_eq!(fs::read_dir(root.state_dir()).unwrap().count(), 0);
    assert!(!root.path("run/vgpu-license-agent/status.json").exists());
    assert!(
        !root
            .path("var/lib/prometheus/node-exporter/vgpu_license_agent.prom")
            .exists()
    );
    assert_eq!(
        fs::read(root.gridd_conf()).unwrap(),
        conf,
        "gridd.conf stays"
    );
    assert!(
        root.path("var/lib/nvidia/GridLicensing/client.dat")
            .exists()
    );
    assert!(r.stdout.contains("left in place"));

    let r = root.run(&["prepare-image", "--purge-client-state"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("GridLicensing/client.dat"),
        "{}",
        r.stdout
    );
    assert!(root.path("var/lib/nvidia/GridLicensing").is_dir());
    assert!(
        !root
            .path("var/lib/nvidia/GridLicensing/client.dat")
            .exists()
    );

    let r = root.run(&["prepare-image"]);
    assert_eq!(r.code, Some(0));
    assert!(
        r.stdout.contains("no token and no agent state"),
        "{}",
        r.stdout
    );

    // A clone then installs its own token as on a fresh root: one restart.
    let mut root = root;
    let before = root.restarts();
    root.install_ok(&valid_token("clone"), &[]);
    assert_eq!(root.restarts(), before + 1);
}

/// A `systemctl` that logs its calls and answers `is-active` with `active` for the units
/// named in `active` (and as systemd does for a unit it does not have: `inactive`, exit 3).
fn fake_systemctl(root: &Root, active: &[&str], stop_fails: bool) -> std::path::PathBuf {
    let log = root.path("systemctl.log");
    let script = root.path("bin/systemctl");
    fs::create_dir_all(script.parent().unwrap()).unwrap();
    let mut cases = String::new();
    for u in active {
        cases.push_str(&format!("    is-active:{u}) echo active; exit 0;;\n"));
    }
    fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{log}'\ncase \"$1:$2\" in\n{cases}    is-active:*) echo inactive; exit 3;;\n    stop:*) {stop};;\nesac\n",
            log = log.display(),
            stop = if stop_fails {
                "echo 'Job failed' >&2; exit 1"
            } else {
                "exit 0"
            },
        ),
    )
    .unwrap();
    crate::common::make_executable(&script);
    script
}

fn systemctl_calls(root: &Root) -> Vec<String> {
    fs::read_to_string(root.path("systemctl.log"))
        .map(|s| s.lines().map(String::from).collect())
        .unwrap_or_default()
}

fn root_with_systemctl(active: &[&str], stop_fails: bool) -> Root {
    let mut root = Root::new();
    let script = fake_systemctl(&root, active, stop_fails);
    // The config's last table is [commands].
    let config = fs::read_to_string(&root.config).unwrap();
    root.write_config(&format!("{config}systemctl = \"{}\"\n", script.display()));
    root.install_ok(&valid_token("builder"), &[]);
    root
}

#[test]
fn a_running_agent_is_stopped_first_and_a_builder_without_gridd_is_no_error() {
    let root = root_with_systemctl(&["vgpu-license-agent.service"], false);
    let r = root.run(&["prepare-image", "--dry-run"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("would stop vgpu-license-agent.service"),
        "{}",
        r.stdout
    );
    assert!(!systemctl_calls(&root).iter().any(|c| c.starts_with("stop")));
    assert!(root.token_path().exists());

    let r = root.run(&["prepare-image"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("stopped vgpu-license-agent.service"),
        "{}",
        r.stdout
    );
    let calls = systemctl_calls(&root);
    assert!(
        calls.contains(&"stop vgpu-license-agent.service".to_string()),
        "{calls:?}"
    );
    // No gridd unit (no driver yet): asked about, never stopped, no error.
    assert!(calls.contains(&"is-active nvidia-gridd.service".to_string()));
    assert!(!calls.contains(&"stop nvidia-gridd.service".to_string()));
    assert!(!root.token_path().exists());
}

#[test]
fn a_stop_that_fails_removes_nothing() {
    let root = root_with_systemctl(
        &["vgpu-license-agent.service", "nvidia-gridd.service"],
        true,
    );
    let r = root.run(&["prepare-image"]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(
        r.error_line()
            .contains("cannot stop vgpu-license-agent.service: Job failed"),
        "{}",
        r.stderr
    );
    assert!(root.token_path().exists(), "nothing removed");
}

#[test]
fn a_lock_that_cannot_be_opened_is_said_so_not_a_running_install() {
    let mut root = Root::new();
    root.install_ok(&valid_token("t"), &[]);
    let state = root.state_dir();
    let lock = state.join("install.lock");
    let _ = fs::remove_file(&lock);
    // A read-only state directory: root is not stopped by the mode, so it is a read-only
    // mount there.
    let _mount;
    if nix::unistd::geteuid().is_root() {
        for e in fs::read_dir(&state).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                fs::remove_dir_all(p).unwrap();
            } else {
                fs::remove_file(p).unwrap();
            }
        }
        match crate::common::Mount::tmpfs(&state, "mode=0755") {
            Some(m) if m.remount("ro") => _mount = m,
            _ => {
                crate::common::skipped("no read-only tmpfs can be mounted here");
                return;
            }
        }
    } else {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&state, fs::Permissions::from_mode(0o555)).unwrap();
    }
    let r = root.run(&["prepare-image"]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    let line = r.error_line();
    assert!(line.contains("cannot open the lock"), "{line}");
    assert!(!line.contains("an install is running"), "{line}");
    assert!(root.token_path().exists(), "nothing removed");
}

#[test]
fn a_client_state_path_one_level_too_wide_is_refused_and_nothing_is_removed() {
    let mut root = Root::new();
    let config = fs::read_to_string(&root.config).unwrap();
    let wide = root.path("var/lib");
    root.write_config(&config.replace(
        &format!(
            "gridd_client_state = [\"{r}/var/lib/nvidia/GridLicensing\", \"{r}/var/lib/nvidia/vGPULicensing\"]",
            r = root.dir.path().display()
        ),
        &format!("gridd_client_state = [\"{}\"]", wide.display()),
    ));
    root.install_ok(&valid_token("t"), &[]);
    let others = [
        "var/lib/apt/lists/lock",
        "var/lib/dpkg/status",
        "var/lib/nvidia/GridLicensing/client.dat",
    ];
    for f in others {
        root.file(f, b"keep");
    }
    for args in [
        &["prepare-image", "--purge-client-state"][..],
        &["prepare-image", "--purge-client-state", "--dry-run"][..],
        &["prepare-image"][..],
    ] {
        let r = root.run(args);
        assert_eq!(r.code, Some(1), "{args:?}: {}", r.stdout);
        let line = r.error_line();
        assert!(line.contains(&wide.display().to_string()), "{line}");
        assert!(line.contains("paths.gridd_client_state"), "{line}");
        assert!(line.contains("apt, dpkg"), "{line}");
        assert!(line.contains("nothing was removed"), "{line}");
        for f in others {
            assert_eq!(fs::read(root.path(f)).unwrap(), b"keep", "{f}");
        }
        assert!(root.token_path().exists(), "nothing removed");
    }
    // A directory holding nothing but gridd's own directories is gridd's.
    root.write_config(&config.replace(
        &format!(
            "gridd_client_state = [\"{r}/var/lib/nvidia/GridLicensing\", \"{r}/var/lib/nvidia/vGPULicensing\"]",
            r = root.dir.path().display()
        ),
        &format!(
            "gridd_client_state = [\"{}\"]",
            root.path("var/lib/nvidia").display()
        ),
    ));
    let r = root.run(&["prepare-image", "--purge-client-state"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!root.path("var/lib/nvidia/GridLicensing").exists());
    assert!(root.path("var/lib/dpkg/status").exists());
}

const IID: &str = "iid-builder-1";

/// A mounted image tree as a builder leaves it after a first boot with cloud-init's
/// write_files user-data carrying the token: cloud-init's instance data, seed-less; its logs;
/// a persistent journal; the agent's drop-in.
fn image(token: &[u8]) -> tempfile::TempDir {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let d = tempfile::tempdir().unwrap();
    let put = |rel: &str, bytes: &[u8]| {
        let p = d.path().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    };
    let tok = String::from_utf8(token.to_vec()).unwrap();
    let user_data = format!(
        "#cloud-config\nwrite_files:\n- path: /etc/nvidia/ClientConfigToken/client_configuration_token.tok\n  permissions: '0744'\n  content: {tok}\n"
    );
    let user_data_b64 = format!(
        "#cloud-config\nwrite_files:\n- path: /etc/nvidia/ClientConfigToken/client_configuration_token.tok\n  encoding: b64\n  content: {}\n",
        b64.encode(token)
    );
    let inst = format!("var/lib/cloud/instances/{IID}");
    put(&format!("{inst}/user-data.txt"), user_data.as_bytes());
    // The processed form: MIME, base64 wrapped at 76.
    let wrapped: String = b64
        .encode(user_data_b64.as_bytes())
        .as_bytes()
        .chunks(76)
        .map(|c| format!("{}\n", String::from_utf8_lossy(c)))
        .collect();
    put(
        &format!("{inst}/user-data.txt.i"),
        format!("Content-Type: multipart/mixed\nContent-Transfer-Encoding: base64\n\n{wrapped}")
            .as_bytes(),
    );
    put(&format!("{inst}/cloud-config.txt"), user_data.as_bytes());
    // A pickle holds the raw text between opcodes.
    put(
        &format!("{inst}/obj.pkl"),
        &[
            b"\x80\x04\x95\x00\x8c\x0euserdata_raw\x94X".as_slice(),
            user_data.as_bytes(),
            b"\x94.",
        ]
        .concat(),
    );
    put(
        &format!("{inst}/scripts/runcmd"),
        format!(
            "#!/bin/sh\necho '{}' | base64 -d > /tmp/t\n",
            b64.encode(token)
        )
        .as_bytes(),
    );
    std::os::unix::fs::symlink(
        format!("/var/lib/cloud/instances/{IID}"),
        d.path().join("var/lib/cloud/instance"),
    )
    .unwrap();
    put("var/lib/cloud/data/instance-id", IID.as_bytes());
    put(
        "var/lib/cloud/seed/nocloud/meta-data",
        b"instance-id: iid-builder-1\n",
    );
    put(
        "var/log/cloud-init.log",
        b"Writing to /etc/nvidia/ClientConfigToken\n",
    );
    put(
        "var/log/cloud-init-output.log",
        format!("runcmd: {}\n", b64.encode(token)).as_bytes(),
    );
    put(
        "var/log/journal/0123456789abcdef0123456789abcdef/system.journal",
        &[b"LPKSHHRH\0\0\0\0MESSAGE=".as_slice(), user_data.as_bytes()].concat(),
    );
    put("var/log/syslog", b"unrelated\n");
    put(
        "etc/vgpu-license-agent/config.d/90-cloud-init.toml",
        b"[gridd]\nfeature_type = 1\n",
    );
    put(
        "etc/nvidia/ClientConfigToken/client_configuration_token.tok",
        token,
    );
    put("var/lib/vgpu-license-agent/install-state.json", b"{}");
    put("var/lib/nvidia/GridLicensing/client.dat", b"builder's");
    put("var/lib/apt/lists/lock", b"");
    d
}

fn in_image(d: &Path, args: &[&str]) -> crate::common::Run {
    let out = std::process::Command::new(crate::common::BIN)
        .args(args)
        .arg("--root")
        .arg(d)
        .env_remove("VGPU_LICENSE_AGENT_CONFIG")
        .env("PATH", "/nonexistent")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    crate::common::Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Every file below `d` holding the token's bytes or its base64, by a plain search of the
/// whole tree.
fn holders(d: &Path, token: &[u8]) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(token);
    let mut files = Vec::new();
    let mut stack = vec![d.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            stack.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if m.is_file() {
            let bytes = fs::read(&p).unwrap();
            let has = |n: &[u8]| bytes.windows(n.len()).any(|w| w == n);
            if has(token) || has(b64.as_bytes()) || has(&b64.as_bytes()[..60]) {
                files.push(p.strip_prefix(d).unwrap().display().to_string());
            }
        }
    }
    files.sort();
    files
}

use base64::Engine;
use std::path::Path;

#[test]
fn in_a_mounted_image_every_copy_of_the_token_is_named_then_cleaned() {
    let token = valid_token("builder");
    let img = image(&token);
    let d = img.path();
    let parts = crate::common::secret_parts(&token);
    let no_secret = |r: &crate::common::Run| {
        for p in &parts {
            assert!(
                !r.stdout.contains(p) && !r.stderr.contains(p),
                "token printed"
            );
        }
    };

    // What it would do, before anything changes: all of it, drop-ins kept.
    let r = in_image(
        d,
        &["prepare-image", "--dry-run", "--cloud-init", "--journal"],
    );
    no_secret(&r);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    for want in [
        "would remove",
        "client_configuration_token.tok",
        "var/lib/cloud/instances",
        "var/lib/cloud/instance\n",
        "var/log/cloud-init.log",
        "var/log/cloud-init-output.log",
        "system.journal",
        "kept ",
        "config.d/90-cloud-init.toml",
    ] {
        assert!(r.stdout.contains(want), "{want}: {}", r.stdout);
    }
    assert!(!r.stdout.contains("would remove") || !r.stdout.contains("seed\n"));
    assert!(
        !r.stdout.contains("would stop"),
        "no service of the builder"
    );
    assert_eq!(holders(d, &token).len(), 7, "{:?}", holders(d, &token));

    // Without the cloud-init and journal steps: the token's own copies go, each other one
    // is named, and the command fails.
    let r = in_image(d, &["prepare-image"]);
    no_secret(&r);
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.error_line().contains("still hold the token"),
        "{}",
        r.stderr
    );
    let mut left = holders(d, &token);
    assert_eq!(left.len(), 6, "{left:?}");
    // Found by the command only: the whole user-data in base64, wrapped (the MIME form).
    left.push(format!("var/lib/cloud/instances/{IID}/user-data.txt.i"));
    for f in &left {
        assert!(
            r.stdout
                .contains(&format!("still holds the token: {}", d.join(f).display())),
            "{f} not named: {}",
            r.stdout
        );
    }
    assert_eq!(
        r.stdout.matches("still holds the token: ").count(),
        left.len(),
        "{}",
        r.stdout
    );
    assert!(
        !d.join("etc/nvidia/ClientConfigToken/client_configuration_token.tok")
            .exists()
    );
    assert!(d.join("var/lib/nvidia/GridLicensing/client.dat").exists());

    // The documented call: nothing of the token is left anywhere in the tree.
    let r = in_image(
        d,
        &[
            "prepare-image",
            "--purge-client-state",
            "--cloud-init",
            "--journal",
        ],
    );
    no_secret(&r);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert_eq!(holders(d, &token), Vec::<String>::new());
    assert!(!d.join("var/lib/cloud/instances").exists());
    assert!(!d.join("var/lib/cloud/instance").exists());
    assert!(
        d.join("var/lib/cloud/seed/nocloud/meta-data").exists(),
        "the seed is kept"
    );
    assert!(!d.join("var/lib/nvidia/GridLicensing/client.dat").exists());
    assert!(
        d.join("etc/vgpu-license-agent/config.d/90-cloud-init.toml")
            .exists()
    );
    assert!(d.join("var/lib/apt/lists/lock").exists());
    assert!(d.join("var/log/syslog").exists());
    let marker: serde_json::Value = serde_json::from_slice(
        &fs::read(d.join("var/lib/vgpu-license-agent.image-prepared.json")).unwrap(),
    )
    .unwrap();
    assert!(
        marker["boot_id"].is_null(),
        "the builder's boot is not the image's"
    );
    assert!(marker["at"].is_string());
}

#[test]
fn a_root_reached_through_a_symlink_out_of_the_image_is_refused() {
    let token = valid_token("builder");
    let img = image(&token);
    let d = img.path();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("keep.dat"), b"the builder's").unwrap();
    fs::remove_dir_all(d.join("var/lib/nvidia")).unwrap();
    std::os::unix::fs::symlink(outside.path(), d.join("var/lib/nvidia")).unwrap();
    let r = in_image(d, &["prepare-image", "--purge-client-state"]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(r.error_line().contains("through a symlink"), "{}", r.stderr);
    assert!(outside.path().join("keep.dat").exists());
    assert!(
        d.join("etc/nvidia/ClientConfigToken/client_configuration_token.tok")
            .exists()
    );

    // The same for cloud-init's logs: the image's /var/log a link to the builder's.
    fs::remove_file(d.join("var/lib/nvidia")).unwrap();
    let logs = tempfile::tempdir().unwrap();
    fs::write(logs.path().join("cloud-init.log"), b"the builder's").unwrap();
    fs::remove_dir_all(d.join("var/log")).unwrap();
    std::os::unix::fs::symlink(logs.path(), d.join("var/log")).unwrap();
    let r = in_image(d, &["prepare-image", "--cloud-init"]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(r.error_line().contains("through a symlink"), "{}", r.stderr);
    assert!(logs.path().join("cloud-init.log").exists());
    assert!(
        d.join("var/lib/cloud/instances").exists(),
        "nothing removed"
    );
}

/// A journalctl whose previous boot (`--boot=-1`) is `boot_id`'s, where gridd held a lease
/// and said nothing more (killed): a last shutdown that leaked it.
fn journalctl_with_previous_boot(root: &Root, boot_id: &str, at_micros: i64) {
    let entry = |msg: &str| {
        serde_json::json!({
            "__REALTIME_TIMESTAMP": at_micros.to_string(), "_BOOT_ID": boot_id,
            "_UID": "0", "_COMM": "nvidia-gridd", "_PID": "812",
            "SYSLOG_IDENTIFIER": "nvidia-gridd", "MESSAGE": msg,
        })
        .to_string()
    };
    let boot = root.file(
        "previous-boot.json",
        format!(
            "{}\n",
            entry("License acquired successfully. (Info: 10.0.0.5, NVIDIA RTX Virtual Workstation; Expiry: 2025-12-1 0:0:0 GMT)")
        )
        .as_bytes(),
    );
    let script = root.path("bin/journalctl");
    fs::create_dir_all(script.parent().unwrap()).unwrap();
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = --boot=-1 ] && exec cat '{}'; done\nexit 0\n",
            boot.display()
        ),
    )
    .unwrap();
    crate::common::make_executable(&script);
    let config = fs::read_to_string(&root.config).unwrap();
    if !config.contains("journalctl =") {
        root.write_config(&format!("{config}journalctl = \"{}\"\n", script.display()));
    }
}

#[test]
fn after_prepare_image_a_clones_first_boot_reports_no_last_shutdown_of_the_builder() {
    use vgpu_license_agent::image::prepared::last_shutdown as previous_boot_shutdown;
    let this_boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let mut root = Root::new();
    journalctl_with_previous_boot(
        &root,
        &this_boot.trim().replace('-', ""),
        1_764_460_800_000_000,
    );
    root.install_ok(&valid_token("builder"), &[]);
    let settings = vgpu_license_agent::config::load(&root.config).unwrap();
    // Not prepared: the previous boot's leaked lease is reported, as on any guest.
    let before = previous_boot_shutdown(&settings).expect("a last shutdown");
    assert!(!before.lease_returned);

    let r = root.run(&["prepare-image"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("image-prepared.json"), "{}", r.stdout);
    // The clone boots: its previous boot in the kept journal is the one prepare-image ran in.
    assert_eq!(previous_boot_shutdown(&settings), None);

    // A later boot of the clone has a previous boot of its own, which ended after the image
    // was prepared: reported again.
    let later = chrono::Utc::now().timestamp_micros() + 3_600_000_000;
    journalctl_with_previous_boot(&root, "f00dfeedf00dfeedf00dfeedf00dfeed", later);
    let settings = vgpu_license_agent::config::load(&root.config).unwrap();
    assert!(previous_boot_shutdown(&settings).is_some());
}

/// `--root /` (or a path that leads there) is the running system, not an offline image: it is
/// refused with the way to prepare this machine, and nothing is planned, such as unlinking
/// the live journal's files.
#[test]
fn the_running_system_as_root_is_refused() {
    let link = tempfile::tempdir().unwrap();
    let to_root = link.path().join("slash");
    std::os::unix::fs::symlink("/", &to_root).unwrap();
    for root in [std::path::Path::new("/"), to_root.as_path()] {
        for args in [
            &["prepare-image", "--dry-run", "--journal"][..],
            &["prepare-image", "--journal"][..],
        ] {
            let r = in_image(root, args);
            assert_eq!(r.code, Some(1), "{args:?} {}{}", r.stdout, r.stderr);
            assert!(r.stdout.is_empty(), "{}", r.stdout);
            assert!(
                r.error_line().contains(
                    "is the running system, not a mounted image: run prepare-image without --root"
                ),
                "{}",
                r.stderr
            );
        }
    }
}

/// A NoCloud seed whose user-data is MIME, made as docs/kubevirt.md says (`cloud-init devel
/// make-mime`: its parts base64), with the token in a write_files part (`encoding: b64`), and
/// the same seed gzip'd (cloud-init reads both). The first run rightly fails on the seed,
/// having removed the installed token; the second, with no token left to compare with, must
/// still find it there, and does not call the image clean.
#[test]
fn a_token_in_a_mime_or_gzip_seed_is_found_again_when_no_installed_token_is_left() {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let token = valid_token("builder");
    let dir = tempfile::tempdir().unwrap();
    let part = dir.path().join("token.yaml");
    fs::write(
        &part,
        format!(
            "#cloud-config\nwrite_files:\n- path: /etc/nvidia/ClientConfigToken/client_configuration_token.tok\n  permissions: '0744'\n  encoding: b64\n  content: {}\n",
            b64.encode(&token)
        ),
    )
    .unwrap();
    let mime = match std::process::Command::new("cloud-init")
        .args(["devel", "make-mime", "-a"])
        .arg(format!("{}:cloud-config", part.display()))
        .output()
    {
        Ok(out) if out.status.success() => out.stdout,
        Ok(out) => panic!("cloud-init devel make-mime: {out:?}"),
        Err(_) => {
            return crate::common::skipped(
                "cloud-init is not installed (apt-get install cloud-init)",
            );
        }
    };
    assert!(
        !String::from_utf8_lossy(&mime).contains(&b64.encode(&token)[..40]),
        "make-mime hides the token's base64 in a base64 part"
    );
    let gzipped = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(&mime).unwrap();
        e.finish().unwrap()
    };
    for (what, user_data) in [("MIME", mime.clone()), ("gzip'd MIME", gzipped)] {
        let img = tempfile::tempdir().unwrap();
        let d = img.path();
        let put = |rel: &str, bytes: &[u8]| {
            let p = d.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, bytes).unwrap();
        };
        put("var/lib/cloud/seed/nocloud/user-data", &user_data);
        put(
            "var/lib/cloud/seed/nocloud/meta-data",
            b"instance-id: iid-builder-1\n",
        );
        put(
            "etc/nvidia/ClientConfigToken/client_configuration_token.tok",
            &token,
        );
        let seed = d.join("var/lib/cloud/seed/nocloud/user-data");
        let args = [
            "prepare-image",
            "--purge-client-state",
            "--cloud-init",
            "--journal",
        ];
        for run in ["first", "second"] {
            let r = in_image(d, &args);
            assert_eq!(
                r.code,
                Some(1),
                "{what}, {run} run: {}{}",
                r.stdout,
                r.stderr
            );
            assert!(
                r.stdout
                    .contains(&format!("still holds the token: {}", seed.display())),
                "{what}, {run} run: the seed not named: {}",
                r.stdout
            );
        }
        assert!(
            !d.join("etc/nvidia/ClientConfigToken/client_configuration_token.tok")
                .exists()
        );
    }
}

/// A gzip'd user-data seed of a few dozen KB that inflates past the decoder's 16 MiB cap
/// (here: 17 MiB of padding, then the token's write_files): it is not searched whole, so the
/// image is never called clean; the seed is named with why, and the run fails.
#[test]
fn a_seed_that_decodes_past_the_cap_is_named_never_called_clean() {
    use std::io::Write;
    let b64 = &base64::engine::general_purpose::STANDARD;
    let token = valid_token("builder");
    let mut doc = b"#cloud-config\n".to_vec();
    doc.extend(std::iter::repeat_n(b"# padding\n".as_slice(), (17 << 20) / 10).flatten());
    doc.extend_from_slice(
        format!(
            "write_files:\n- path: /etc/nvidia/ClientConfigToken/client_configuration_token.tok\n  encoding: b64\n  content: {}\n",
            b64.encode(&token)
        )
        .as_bytes(),
    );
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&doc).unwrap();
    let gzipped = e.finish().unwrap();
    assert!(gzipped.len() < 100_000, "{} bytes on disk", gzipped.len());
    let img = tempfile::tempdir().unwrap();
    let d = img.path();
    let seed = d.join("var/lib/cloud/seed/nocloud/user-data");
    fs::create_dir_all(seed.parent().unwrap()).unwrap();
    fs::write(&seed, &gzipped).unwrap();
    let token_path = d.join("etc/nvidia/ClientConfigToken/client_configuration_token.tok");
    fs::create_dir_all(token_path.parent().unwrap()).unwrap();
    fs::write(&token_path, &token).unwrap();
    for args in [&["prepare-image", "--dry-run"][..], &["prepare-image"][..]] {
        let r = in_image(d, args);
        assert_eq!(r.code, Some(1), "{args:?}: {}{}", r.stdout, r.stderr);
        assert!(
            r.stdout.contains(&format!(
                "not searched whole, may hold the token: {}",
                seed.display()
            )) && r.stdout.contains("more than 16 MiB"),
            "{args:?}: {}",
            r.stdout
        );
        assert!(
            r.stderr.contains("could not be searched whole"),
            "{}",
            r.stderr
        );
    }
}
