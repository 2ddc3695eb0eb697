use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::model::install::Aside;
use crate::model::token::testing::make_token;
use crate::model::token::{Token, Untimely};

fn payload(jti: &str, exp: i64) -> serde_json::Value {
    serde_json::json!({
        "iss": "NLS Service Instance", "iat": 1700000000, "nbf": 1700000000, "exp": exp,
        "jti": jti,
        "service_instance_configuration": {
            "svc_port_set_list": [{"idx": 0, "svc_port_map": [
                {"service": "auth", "port": 443}, {"service": "lease", "port": 443}]}],
            "node_url_list": [{"idx": 0, "url": "dls.example", "svc_port_set_idx": 0}]
        }
    })
}

/// The service's adoption as a whole: adopted, then the restart it leaves due made (the
/// service's core makes it through its own restart of gridd, then records it).
fn adopt_dropped_token(
    s: &Settings,
    licensed: bool,
    may_restart: bool,
) -> Result<Outcome, AdoptError> {
    let mut o = adopt::adopt_dropped_token(s, licensed, may_restart)?;
    make_restart(s, &mut o);
    Ok(o)
}

fn tok(jti: &str) -> Vec<u8> {
    make_token(&payload(jti, 2078691200)).into_bytes()
}

fn settings(root: &Path) -> Settings {
    let mut s = Settings::default();
    s.paths.token_dir = root.join("etc/nvidia/ClientConfigToken");
    s.paths.gridd_conf = root.join("etc/nvidia/gridd.conf");
    s.paths.state_dir = root.join("var/lib/vgpu-license-agent");
    s.commands.restart_gridd = vec![
        "sh".into(),
        "-c".into(),
        format!("echo r >> {}", root.join("restarts").display()),
    ];
    s.commands.nvidia_smi = root.join("none").display().to_string();
    s
}

/// A guest whose token directory holds a token cloud-init dropped (`dropped.tok`), nothing
/// installed yet.
fn dropped(jti: &str) -> (tempfile::TempDir, Settings) {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    fs::create_dir_all(&s.paths.token_dir).unwrap();
    fs::write(s.paths.token_dir.join("dropped.tok"), tok(jti)).unwrap();
    (d, s)
}

/// NVIDIA's rotation: a newer token (`new`) copied beside the one in place, under the DLS's
/// download name, a moment later (its modification time is later); its path.
fn rotate(s: &Settings) -> std::path::PathBuf {
    std::thread::sleep(Duration::from_millis(20));
    let new = s
        .paths
        .token_dir
        .join("client_configuration_token_12-01-2026-09-30-00.tok");
    fs::write(&new, tok("new")).unwrap();
    new
}

fn restarts(root: &Path) -> usize {
    fs::read_to_string(root.join("restarts"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn request(token: Vec<u8>) -> Request {
    Request {
        token,
        feature_type: 1,
        force: false,
        dry_run: false,
        restart: true,
    }
}

#[test]
fn adopts_a_token_dropped_by_cloud_init_once() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    fs::create_dir_all(&s.paths.token_dir).unwrap();
    fs::write(s.paths.token_path(), tok("a")).unwrap();
    fs::set_permissions(s.paths.token_path(), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(s.paths.token_dir.join("old.tok"), b"old").unwrap();

    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert_eq!(o.restart, Restart::Done);
    assert!(o.changes.iter().any(|c| matches!(
        c,
        Change::ChmodToken {
            from: 0o600,
            to: 0o744,
            ..
        }
    )));
    assert!(
        o.changes
            .iter()
            .any(|c| matches!(c, Change::MoveStray { .. }))
    );
    assert!(
        o.changes
            .iter()
            .any(|c| matches!(c, Change::WriteGriddConf { created: true, .. }))
    );
    assert!(
        !o.changes
            .iter()
            .any(|c| matches!(c, Change::WriteToken { .. }))
    );
    assert_eq!(restarts(d.path()), 1);

    let again = adopt_dropped_token(&s, false, true).unwrap();
    assert!(!again.changed());
    assert_eq!(again.restart, Restart::NotNeeded);
    assert_eq!(restarts(d.path()), 1);
}

#[test]
fn a_token_already_in_place_is_restarted_for_once() {
    // cloud-init's write_files left the token with the right mode and gridd.conf is right:
    // nothing to change, but gridd has not been restarted since the token appeared.
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    fs::create_dir_all(&s.paths.token_dir).unwrap();
    fs::set_permissions(&s.paths.token_dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(s.paths.token_path(), tok("a")).unwrap();
    fs::set_permissions(s.paths.token_path(), fs::Permissions::from_mode(0o744)).unwrap();
    fs::write(&s.paths.gridd_conf, b"FeatureType=1\n").unwrap();
    fs::set_permissions(&s.paths.gridd_conf, fs::Permissions::from_mode(0o644)).unwrap();
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert!(!o.changed(), "{:?}", o.changes);
    assert_eq!(o.restart, Restart::Done);
    assert!(o.restart_reason.unwrap().contains("not restarted it since"));
    // An install of the same token afterwards changes and restarts nothing.
    let o = install(&request(tok("a")), &s).unwrap();
    assert_eq!(o.restart, Restart::NotNeeded);
    assert_eq!(restarts(d.path()), 1);
}

#[test]
fn adopt_keeps_the_feature_type_install_set_unless_the_config_names_one() {
    let d = tempfile::tempdir().unwrap();
    let mut s = settings(d.path());
    let mut req = request(tok("a"));
    req.feature_type = 4;
    install(&req, &s).unwrap();
    let path = s.paths.gridd_conf.clone();
    let conf = || fs::read_to_string(&path).unwrap();
    assert!(conf().contains("FeatureType=4"), "{}", conf());
    assert_eq!(restarts(d.path()), 1);

    // The service, with the default config, leaves the operator's value alone.
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert!(!o.changed(), "{:?}", o.changes);
    assert_eq!(o.restart, Restart::NotNeeded);
    assert!(conf().contains("FeatureType=4"));

    // The driver template's FeatureType=0 (unlicensed) is not kept.
    fs::write(&path, b"# template\nFeatureType=0\nEnableUI=FALSE\n").unwrap();
    adopt_dropped_token(&s, false, true).unwrap();
    assert_eq!(conf(), "# template\nFeatureType=1\nEnableUI=FALSE\n");
    install(&req, &s).unwrap();
    assert!(conf().contains("FeatureType=4"));
    // Nor is a passthrough value on a guest whose nvidia-smi shows a vGPU.
    let smi = d.path().join("nvidia-smi");
    crate::files::fsutil::write_test_program(
        &smi,
        "#!/bin/sh\nprintf 'GPU 00000000:00:05.0\\n    Product Name : NVIDIA L40S-24Q\\n    GPU Virtualization Mode\\n        Virtualization Mode : VGPU\\n    vGPU Software Licensed Product\\n        Product Name : NVIDIA RTX Virtual Workstation\\n        License Status : Unlicensed (Restricted)\\n'\n",
    );
    s.commands.nvidia_smi = smi.display().to_string();
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert!(conf().contains("FeatureType=1"), "{:?}", o.changes);
    install(&req, &s).unwrap();
    s.commands.nvidia_smi = d.path().join("none").display().to_string();
    assert!(conf().contains("FeatureType=4"));

    // A value set in the agent's config is kept in place.
    s.apply_toml("[gridd]\nfeature_type = 2\n").unwrap();
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert!(o.changed());
    assert!(conf().contains("FeatureType=2") && !conf().contains("FeatureType=4"));
}

/// A look at a token already in place, with gridd.conf's FeatureType=1 (which fits every
/// guest), runs no nvidia-smi: the service looks every few minutes.
#[test]
fn an_adoption_that_keeps_feature_type_1_asks_nvidia_smi_nothing() {
    let d = tempfile::tempdir().unwrap();
    let mut s = settings(d.path());
    let smi = d.path().join("nvidia-smi");
    crate::files::fsutil::write_test_program(
        &smi,
        &format!(
            "#!/bin/sh\necho x >> {}\n",
            d.path().join("smi-runs").display()
        ),
    );
    s.commands.nvidia_smi = smi.display().to_string();
    fs::create_dir_all(&s.paths.token_dir).unwrap();
    fs::write(s.paths.token_path(), tok("a")).unwrap();
    fs::write(&s.paths.gridd_conf, b"FeatureType=1\n").unwrap();
    adopt_dropped_token(&s, false, true).unwrap();
    let o = adopt_dropped_token(&s, true, false).unwrap();
    assert!(!o.changed(), "{:?}", o.changes);
    assert!(!d.path().join("smi-runs").exists(), "nvidia-smi was run");
    // FeatureType=4 is looked at against the GPUs nvidia-smi shows.
    fs::write(&s.paths.gridd_conf, b"FeatureType=4\n").unwrap();
    adopt_dropped_token(&s, true, false).unwrap();
    assert!(d.path().join("smi-runs").exists(), "nvidia-smi was not run");
}

#[test]
fn adopt_refuses_a_bad_or_missing_token_and_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    let e = adopt_dropped_token(&s, false, true).unwrap_err();
    assert!(matches!(e, AdoptError::NoToken(_)), "{e}");
    fs::create_dir_all(&s.paths.token_dir).unwrap();
    fs::write(s.paths.token_path(), b"FeatureType=1\n").unwrap();
    fs::write(s.paths.token_dir.join("stray"), b"x").unwrap();
    let e = adopt_dropped_token(&s, false, true).unwrap_err();
    assert!(matches!(
        e,
        AdoptError::Rejected(TokenRejected::Invalid(TokenError::LooksLikeGriddConf))
    ));
    assert!(s.paths.token_dir.join("stray").exists());
    assert!(!s.paths.gridd_conf.exists());
    let expired = make_token(&payload("e", 1700000001)).into_bytes();
    fs::write(s.paths.token_path(), expired).unwrap();
    let e = adopt_dropped_token(&s, false, true).unwrap_err();
    assert!(matches!(
        e,
        AdoptError::Rejected(TokenRejected::Untimely {
            why: Untimely::Expired(_),
            ..
        })
    ));
    assert_eq!(restarts(d.path()), 0);
}

#[test]
fn dry_run_plans_without_touching_anything() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    let mut req = request(tok("a"));
    req.dry_run = true;
    let o = install(&req, &s).unwrap();
    assert_eq!(o.restart, Restart::WouldRestart);
    assert_eq!(o.changes.len(), 3, "{:?}", o.changes);
    assert!(o.lines().iter().skip(1).all(|l| l.starts_with("would ")));
    assert!(!d.path().join("etc").exists());
    assert!(!s.paths.state_dir.exists());
}

#[test]
fn validity_is_checked_against_the_given_time() {
    let t = tok("a");
    let before = DateTime::from_timestamp(1_600_000_000, 0).unwrap();
    assert!(matches!(
        validate(&t, before, false),
        Err(TokenRejected::Untimely {
            why: Untimely::NotYetValid(_),
            ..
        })
    ));
    let (_, warning) = validate(&t, before, true).unwrap();
    assert!(warning.unwrap().contains("not valid before"));
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    let e = install_at(&request(t), &s, before).unwrap_err();
    assert!(e.to_string().contains("fix the clock"), "{e}");
    assert!(!d.path().join("etc").exists());
}

/// An `install` that replaces the token while the service is adopting the one it read: the
/// adoption, once it holds the lock, finds the token is no longer the bytes it read and
/// changes nothing (writing them would put the old token back over the new one).
/// An adoption allowed to restart, without a license, of bytes read in place or not.
fn how(in_place: bool) -> adopt::Adoption {
    adopt::Adoption {
        licensed: false,
        may_restart: true,
        in_place,
    }
}

#[test]
fn an_install_during_an_adoption_is_never_undone() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    fs::create_dir_all(&s.paths.token_dir).unwrap();
    // What the adoption read before the lock, and what install put there meanwhile.
    let read_before = tok("old");
    fs::write(s.paths.token_path(), tok("new")).unwrap();
    let e = adopt::adopt_bytes(&s, &read_before, how(true)).unwrap_err();
    assert!(matches!(e, AdoptError::Superseded), "{e}");
    assert_eq!(fs::read(s.paths.token_path()).unwrap(), tok("new"));
    assert_eq!(restarts(d.path()), 0);
    assert!(!s.paths.state_dir.join("replaced").exists());
    // What is there now is adopted as it stands.
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert_eq!(o.restart, Restart::Done);
    assert_eq!(fs::read(s.paths.token_path()).unwrap(), tok("new"));
    // The token source's bytes are the operator's word, not a stale read: they are written.
    let o = adopt::adopt_bytes(&s, &tok("source"), how(false)).unwrap();
    assert!(o.changed());
    assert_eq!(fs::read(s.paths.token_path()).unwrap(), tok("source"));
}

/// A token changed while the service's restart budget or backoff says wait is installed at
/// once, but gridd's restart waits and stays owed; the next adoption the budget allows makes
/// it, once.
#[test]
fn a_token_change_restart_waits_for_the_budget_and_stays_owed() {
    let (d, s) = dropped("a");
    let o = adopt_dropped_token(&s, false, false).unwrap();
    assert_eq!(o.restart, Restart::Deferred);
    assert!(o.changed());
    assert_eq!(restarts(d.path()), 0);
    assert!(
        o.lines().iter().any(|l| l.contains("not restarted yet")),
        "{:?}",
        o.lines()
    );
    // Still not allowed: nothing more to do, nothing restarted.
    let o = adopt_dropped_token(&s, false, false).unwrap();
    assert_eq!(restarts(d.path()), 0, "{o:?}");
    // Allowed: the owed restart, once.
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert_eq!(o.restart, Restart::Done);
    assert!(
        o.restart_reason
            .as_deref()
            .unwrap_or("")
            .contains("still owed"),
        "{o:?}"
    );
    assert_eq!(restarts(d.path()), 1);
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert_eq!(o.restart, Restart::NotNeeded);
    assert_eq!(restarts(d.path()), 1);
}

/// A token dropped under the DLS's download name is adopted where it is, under its name.
#[test]
fn a_token_dropped_under_its_download_name_is_adopted_in_place() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    fs::create_dir_all(&s.paths.token_dir).unwrap();
    let at = s
        .paths
        .token_dir
        .join("client_configuration_token_11-30-2026-10-00-00.tok");
    fs::write(&at, tok("a")).unwrap();
    fs::write(s.paths.token_dir.join("gridd.conf"), b"FeatureType=1\n").unwrap();
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert_eq!(o.restart, Restart::Done);
    assert_eq!(o.kept_name.as_deref(), Some(at.as_path()));
    assert_eq!(fs::read(&at).unwrap(), tok("a"));
    assert_eq!(fsutil::mode_of(&fs::metadata(&at).unwrap()), TOKEN_MODE);
    let left: Vec<_> = fs::read_dir(&s.paths.token_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![at.file_name().unwrap().to_os_string()]);
}

/// `replaced/` keeps the last [`REPLACED_KEPT`] installs' files, the oldest removed first;
/// what is not a stamp directory stays.
#[test]
fn replaced_is_bounded_oldest_first() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("replaced");
    fs::create_dir_all(&root).unwrap();
    for i in 0..REPLACED_KEPT + 3 {
        fs::create_dir(root.join(format!("20260101T0000{i:02}Z"))).unwrap();
    }
    fs::create_dir(root.join("keep-me")).unwrap();
    // The newest is this run's.
    prune_replaced(&root, &format!("20260101T0000{:02}Z", REPLACED_KEPT + 2));
    let mut left: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left.len(), REPLACED_KEPT + 1, "{left:?}");
    assert_eq!(left[0], "20260101T000003Z");
    assert!(left.contains(&"keep-me".to_string()));
}

/// With the clock set back, this run's directory has the oldest stamp of all: it stays, and
/// the oldest of the others goes.
#[test]
fn replaced_keeps_what_this_run_made_whatever_the_clock() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("replaced");
    fs::create_dir_all(&root).unwrap();
    for i in 0..REPLACED_KEPT {
        fs::create_dir(root.join(format!("20260101T0000{i:02}Z"))).unwrap();
    }
    let this_run = "20200101T000000Z";
    fs::create_dir(root.join(format!("{this_run}-2"))).unwrap();
    prune_replaced(&root, this_run);
    assert!(root.join(format!("{this_run}-2")).is_dir());
    assert!(!root.join("20260101T000000Z").exists());
    assert_eq!(fs::read_dir(&root).unwrap().count(), REPLACED_KEPT);
}

/// A token with a CR line end is installed as it is, with a warning that says what to do.
#[test]
fn a_crlf_token_is_installed_with_a_warning() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    let mut t = tok("crlf");
    t.extend_from_slice(b"\r\n");
    let o = install(&request(t.clone()), &s).unwrap();
    assert!(o.warnings.iter().any(|w| w.contains("dos2unix")), "{o:?}");
    assert_eq!(fs::read(s.paths.token_path()).unwrap(), t);
}

/// NVIDIA's rotation: the new token copied beside the installed one under the DLS's download
/// name wins, the old one is kept aside as the previous token, gridd is restarted once for it
/// (licensed or not), and the reason says so.
#[test]
fn a_token_copied_beside_the_installed_one_is_the_rotation() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    install(&request(tok("old")), &s).unwrap();
    assert_eq!(restarts(d.path()), 1);
    let new = rotate(&s);

    let o = adopt_dropped_token(&s, true, true).unwrap();
    assert_eq!(o.restart, Restart::Done, "{o:#?}");
    assert_eq!(restarts(d.path()), 2);
    assert!(
        o.restart_reason
            .as_deref()
            .is_some_and(|r| r.starts_with("a newer token replaces client_configuration_token.tok")),
        "{o:#?}"
    );
    let names: Vec<_> = fsutil::list_dir(&s.paths.token_dir)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, vec![new.file_name().unwrap().to_owned()]);
    assert_eq!(fs::read(&new).unwrap(), tok("new"));
    assert!(o.changes.iter().any(|c| matches!(
        c,
        Change::MoveStray {
            why: Aside::Previous,
            ..
        }
    )));
    // Adopted again: nothing changes, nothing is restarted.
    let o = adopt_dropped_token(&s, true, true).unwrap();
    assert_eq!((o.changed(), o.restart), (false, Restart::NotNeeded));
}

/// The service's restart for one token runs while a newer one is adopted: gridd may have
/// started before the newer one was in place, so its restart stays owed (and is made once,
/// by the next adoption) rather than being taken as paid by the restart that ended.
#[test]
fn a_token_adopted_while_a_restart_ran_is_owed_its_own() {
    let (d, s) = dropped("old");
    let o = adopt::adopt_dropped_token(&s, false, true).unwrap();
    assert_eq!(o.restart, Restart::Due, "{o:#?}");
    // The service's restart begins, for the token in place now.
    let target = restart_target(&s);
    assert!(target.is_some());
    rotate(&s);
    let o = adopt::adopt_dropped_token(&s, true, true).unwrap();
    assert_eq!(o.restart, Restart::Due, "{o:#?}");
    // The restart ends: it was made for the old token.
    restart_made(&s, target.as_deref()).unwrap();
    let o = adopt_dropped_token(&s, true, true).unwrap();
    assert_eq!(
        o.restart,
        Restart::Done,
        "the new token's restart was lost: {o:#?}"
    );
    assert_eq!(restarts(d.path()), 1);
    let o = adopt_dropped_token(&s, true, true).unwrap();
    assert_eq!(o.restart, Restart::NotNeeded, "{o:#?}");
    assert_eq!(restarts(d.path()), 1);
}

/// A stray moved out of the token directory costs a licensed gridd no restart; without a
/// license it may be what gridd failed on.
#[test]
fn a_stray_moved_restarts_gridd_only_without_a_license() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    install(&request(tok("a")), &s).unwrap();
    let before = restarts(d.path());
    fs::write(s.paths.token_dir.join("README"), b"notes").unwrap();
    let o = adopt_dropped_token(&s, true, true).unwrap();
    assert!(o.changed());
    assert_eq!(o.restart, Restart::NotNeeded, "{o:#?}");
    assert_eq!(restarts(d.path()), before);

    fs::write(s.paths.token_dir.join("README"), b"notes").unwrap();
    let o = adopt_dropped_token(&s, false, true).unwrap();
    assert_eq!(o.restart, Restart::Done);
    assert_eq!(
        o.restart_reason.as_deref(),
        Some("files nvidia-gridd may have failed on were moved out of the token directory")
    );
}

/// A broken token copied beside the working one is refused in the words used for a token
/// alone, and costs a licensed gridd no restart.
#[test]
fn a_broken_token_beside_the_installed_one_is_refused_with_why() {
    let d = tempfile::tempdir().unwrap();
    let s = settings(d.path());
    install(&request(tok("a")), &s).unwrap();
    let before = restarts(d.path());
    let good = tok("b");
    let broken = &good[..good.len() - 40];
    fs::write(s.paths.token_dir.join("new.tok"), broken).unwrap();
    let o = adopt_dropped_token(&s, true, true).unwrap();
    let words = Token::decode(broken).unwrap_err().to_string();
    assert!(
        o.changes.iter().any(|c| matches!(
            c,
            Change::MoveStray { why: Aside::Refused { why, valid: false }, .. } if *why == words
        )),
        "{o:#?}"
    );
    assert_eq!(o.restart, Restart::NotNeeded);
    assert_eq!(restarts(d.path()), before);
    assert_eq!(fs::read(s.paths.token_path()).unwrap(), tok("a"));
}
