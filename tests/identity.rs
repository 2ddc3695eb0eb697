//! Clones and restored snapshots: `check-identity` at boot (a fixture root stands for the
//! guest: /etc/machine-id, the DMI product UUID, the NICs), and the service reporting what it
//! found once, as a `clone_detected` event, against the real journald and the simulator.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::Root;
use crate::common::sim::{Agent, Machine, Setup};

fn guest(d: &Path, machine_id: &str, uuid: &str) {
    fs::create_dir_all(d.join("etc")).unwrap();
    fs::write(d.join("etc/machine-id"), format!("{machine_id}\n")).unwrap();
    fs::create_dir_all(d.join("sys/class/dmi/id")).unwrap();
    fs::write(d.join("sys/class/dmi/id/product_uuid"), format!("{uuid}\n")).unwrap();
    fs::create_dir_all(d.join("sys/class/net/enp1s0")).unwrap();
    fs::write(
        d.join("sys/class/net/enp1s0/address"),
        "52:54:00:12:34:56\n",
    )
    .unwrap();
}

#[test]
fn a_clone_has_gridds_client_state_moved_aside_before_gridd_starts() {
    let root = Root::new();
    let g = root.path("guest");
    guest(
        &g,
        "0123456789abcdef0123456789abcdef",
        "11111111-2222-3333-4444-555555555555",
    );
    let state = root.path("var/lib/nvidia/GridLicensing");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("client.dat"), b"the original's registration").unwrap();
    let g_arg = g.to_str().unwrap();

    // First boot: recorded; nothing moved.
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("recorded"), "{}", r.stdout);
    // The same guest again; a NIC replaced is not a clone.
    fs::write(
        g.join("sys/class/net/enp1s0/address"),
        "52:54:00:ff:ff:ff\n",
    )
    .unwrap();
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert!(r.stdout.contains("the same guest"), "{}", r.stdout);
    assert!(state.join("client.dat").exists());

    // A clone: new product UUID (KubeVirt gives each VM its own), same disk.
    fs::write(
        g.join("sys/class/dmi/id/product_uuid"),
        "99999999-2222-3333-4444-555555555555\n",
    )
    .unwrap();
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("a clone or a restored snapshot"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("11111111-2222-3333-4444-555555555555 -> 99999999"),
        "{}",
        r.stdout
    );
    assert!(
        !state.join("client.dat").exists(),
        "gridd's state moved aside"
    );
    let replaced = root.state_dir().join("replaced");
    let kept: Vec<_> = fs::read_dir(&replaced)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        fs::read(kept[0].join("GridLicensing/client.dat")).unwrap(),
        b"the original's registration"
    );
    assert!(root.state_dir().join("clone-detected.json").exists());
    // The next boot of the clone is the same guest.
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert!(r.stdout.contains("the same guest"), "{}", r.stdout);

    // A client state directory that is a link out is refused, nothing moved.
    fs::write(g.join("etc/machine-id"), "ffff\n").unwrap();
    let elsewhere = root.path("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    fs::write(elsewhere.join("keep"), b"x").unwrap();
    fs::remove_dir_all(&state).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &state).unwrap();
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(r.stderr.contains("is a symlink"), "{}", r.stderr);
    assert!(elsewhere.join("keep").exists());
}

#[test]
fn scenario_the_service_reports_a_clone_once() {
    let m = Machine::new(Setup::default());
    let g = m.path("guest");
    guest(
        &g,
        "0123456789abcdef0123456789abcdef",
        "aaaaaaaa-0000-0000-0000-000000000001",
    );
    let config = m.config.to_str().unwrap().to_string();
    let check = || {
        let out = std::process::Command::new(crate::common::BIN)
            .args(["--config", &config, "check-identity", "--root"])
            .arg(&g)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    check();
    fs::write(
        g.join("sys/class/dmi/id/product_uuid"),
        "bbbbbbbb-0000-0000-0000-000000000002\n",
    )
    .unwrap();
    check();
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    let v = a.wait_status("the clone in the events", Duration::from_secs(45), |v| {
        v["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["kind"] == "clone_detected"))
    });
    let e = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "clone_detected")
        .unwrap();
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("aaaaaaaa-0000-0000-0000-000000000001 -> bbbbbbbb"),
        "{e}"
    );
    // Reported once: the record is marked seen, a restarted service does not report it again.
    let state = m.path("var/lib/vgpu-license-agent");
    assert!(state.join("clone-detected.seen.json").exists());
    assert!(!state.join("clone-detected.json").exists());
}

#[test]
fn on_a_clone_a_client_state_path_one_level_too_wide_is_refused_and_nothing_moves() {
    let root = Root::new();
    let config = fs::read_to_string(&root.config).unwrap();
    let wide = root.path("var/lib");
    root.write_config(&config.replace(
        &format!(
            "gridd_client_state = [\"{r}/var/lib/nvidia/GridLicensing\", \"{r}/var/lib/nvidia/vGPULicensing\"]",
            r = root.dir.path().display()
        ),
        &format!("gridd_client_state = [\"{}\"]", wide.display()),
    ));
    let others = [
        "var/lib/apt/lists/lock",
        "var/lib/dpkg/status",
        "var/lib/nvidia/GridLicensing/client.dat",
    ];
    for f in others {
        root.file(f, b"keep");
    }
    let g = root.path("guest");
    guest(
        &g,
        "0123456789abcdef0123456789abcdef",
        "11111111-0000-0000-0000-000000000001",
    );
    let g_arg = g.to_str().unwrap();
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    // The clone: refused at every boot until the config is fixed, nothing moved.
    fs::write(
        g.join("sys/class/dmi/id/product_uuid"),
        "22222222-0000-0000-0000-000000000002\n",
    )
    .unwrap();
    for _ in 0..2 {
        let r = root.run(&["check-identity", "--root", g_arg]);
        assert_eq!(r.code, Some(1), "{}", r.stdout);
        let line = r.error_line();
        assert!(line.contains(&wide.display().to_string()), "{line}");
        assert!(line.contains("paths.gridd_client_state"), "{line}");
        assert!(line.contains("nothing was moved"), "{line}");
        for f in others {
            assert_eq!(fs::read(root.path(f)).unwrap(), b"keep", "{f}");
        }
        assert!(!root.state_dir().join("replaced").exists());
        assert!(!root.state_dir().join("clone-detected.json").exists());
    }
}

#[test]
fn a_clone_of_a_prepared_image_is_a_new_guest_not_a_clone() {
    let root = Root::new();
    let g = root.path("guest");
    guest(
        &g,
        "0123456789abcdef0123456789abcdef",
        "11111111-0000-0000-0000-000000000001",
    );
    let g_arg = g.to_str().unwrap();
    let state = root.path("var/lib/nvidia/GridLicensing");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("client.dat"), b"the builder's").unwrap();
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert!(r.stdout.contains("recorded"), "{}", r.stdout);
    let r = root.run(&["prepare-image", "--purge-client-state"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    // The clone: its own product UUID and machine-id, the image's disk.
    guest(
        &g,
        "fedcba9876543210fedcba9876543210",
        "22222222-0000-0000-0000-000000000002",
    );
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("recorded"), "{}", r.stdout);
    assert!(!root.state_dir().join("clone-detected.json").exists());
}

/// A stateless image (an empty `/etc/machine-id` in the image): systemd mounts a transient ID
/// over the file at every boot. A new one each boot is not a clone, and gridd's client state
/// stays; a new product UUID still is one.
#[test]
fn a_transient_machine_id_new_at_every_boot_is_not_a_clone() {
    let root = Root::new();
    let g = root.path("guest");
    let uuid = "11111111-2222-3333-4444-555555555555";
    guest(&g, "0123456789abcdef0123456789abcdef", uuid);
    // The mount table as such a boot leaves it (the ID bind-mounted from /run/machine-id).
    fs::create_dir_all(g.join("proc/self")).unwrap();
    fs::write(
        g.join("proc/self/mountinfo"),
        "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
         25 22 0:23 /machine-id /etc/machine-id ro,relatime shared:7 - tmpfs tmpfs rw,mode=755\n",
    )
    .unwrap();
    let state = root.path("var/lib/nvidia/GridLicensing");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("client.dat"), b"this guest's registration").unwrap();
    let g_arg = g.to_str().unwrap();
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for boot in ["1111", "2222", "3333"] {
        fs::write(
            g.join("etc/machine-id"),
            format!("{boot}abcdef0123456789abcdef0123456789\n"),
        )
        .unwrap();
        let r = root.run(&["check-identity", "--root", g_arg]);
        assert!(r.stdout.contains("the same guest"), "{}", r.stdout);
        assert!(state.join("client.dat").exists(), "boot {boot}");
    }
    fs::write(
        g.join("sys/class/dmi/id/product_uuid"),
        "99999999-2222-3333-4444-555555555555\n",
    )
    .unwrap();
    let r = root.run(&["check-identity", "--root", g_arg]);
    assert!(
        r.stdout.contains("a clone or a restored snapshot"),
        "{}",
        r.stdout
    );
    assert!(!state.join("client.dat").exists());
}
