//! `prepare-image` run as the real binary against a fake root.

mod common;

use std::fs;

use common::{Root, valid_token};

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
