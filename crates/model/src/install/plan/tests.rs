//! The plan as a value: made from what is in place, reading nothing. The token's bytes and
//! their SHA-256 are inputs here, so any bytes do.

use super::*;
use crate::restart::Touch;

const OLD: &[u8] = b"old token";
const NEW: &[u8] = b"new token";
const STAMP: &str = "20261203T150000Z";

/// The SHA-256 the agent would give `bytes` (any distinct name does for the plan).
fn sha(bytes: &[u8]) -> String {
    format!("sha-of-{}", String::from_utf8_lossy(bytes))
}

/// Paths nothing exists at: the plan is made from values alone.
fn settings() -> Settings {
    let mut s = Settings::default();
    let root = Path::new("/nonexistent/plan");
    s.paths.token_dir = root.join("etc/nvidia/ClientConfigToken");
    s.paths.gridd_conf = root.join("etc/nvidia/gridd.conf");
    s.paths.state_dir = root.join("var/lib/vgpu-license-agent");
    s
}

/// What is in place: the token `installed` (at the standard path, mode `mode`), the strays,
/// gridd.conf with FeatureType=1.
fn in_place(s: &Settings, installed: &[u8], mode: u32, strays: Vec<Stray>) -> Current {
    Current {
        dir_mode: Some(TOKEN_DIR_MODE),
        token: Some(Previous {
            path: s.paths.token_path(),
            bytes: installed.to_vec(),
            sha256: sha(installed),
            mode,
            ino: 1,
        }),
        strays,
        temps: Vec::new(),
        conf: Some(ConfNow {
            bytes: b"FeatureType=1\n".to_vec(),
            mode: 0o644,
            owner: (0, 0),
        }),
    }
}

fn ask(bytes: &[u8], licensed: bool) -> Ask<'_> {
    Ask {
        bytes,
        feature_type: FeatureType::Default(1),
        dry_run: false,
        restart: true,
        licensed,
        owe_restart: true,
        summary: String::new(),
        warnings: Vec::new(),
    }
}

/// What the agent remembers: gridd last restarted for `restarted_for`, nothing owed.
fn inputs(s: &Settings, bytes: &[u8], restarted_for: Option<&[u8]>) -> Inputs {
    Inputs {
        state: InstallState {
            token_sha256: restarted_for.map(sha),
            ..InstallState::default()
        },
        sha256: sha(bytes),
        replaced_root: s.paths.state_dir.join("replaced"),
        stamp: STAMP.into(),
        gpus: Vec::new(),
    }
}

/// The plan for `bytes` over `cur`, gridd restarted for `restarted_for` when it last was;
/// `licensed`: gridd holds a license.
fn plan_for(
    s: &Settings,
    cur: &Current,
    bytes: &[u8],
    restarted_for: &[u8],
    licensed: bool,
) -> Plan {
    Plan::make(
        ask(bytes, licensed),
        cur,
        s,
        inputs(s, bytes, Some(restarted_for)),
    )
}

fn stray(s: &Settings, name: &str) -> Stray {
    Stray {
        path: s.paths.token_dir.join(name),
        name: name.into(),
        verdict: None,
        other_token: false,
        sha256: None,
    }
}

/// A file of the token directory that decodes as a token (`verdict`: why it is refused;
/// `other`: another DLS instance's).
fn token_stray(s: &Settings, name: &str, sha: &str, verdict: Option<&str>, other: bool) -> Stray {
    Stray {
        verdict: verdict.map(str::to_string),
        other_token: other,
        sha256: Some(sha.into()),
        ..stray(s, name)
    }
}

#[test]
fn the_plan_restarts_gridd_only_for_what_it_reads() {
    let s = settings();
    // A stray moved aside beside a licensed gridd's token: nothing it reads changes.
    let cur = in_place(&s, OLD, TOKEN_MODE, vec![stray(&s, "README")]);
    let plan = plan_for(&s, &cur, OLD, OLD, true);
    assert!(matches!(
        plan.outcome.changes.as_slice(),
        [Change::MoveStray {
            why: Aside::Stray,
            ..
        }]
    ));
    assert_eq!(plan.outcome.restart_reason, None);
    // Without a license, the stray may be what gridd failed on.
    let plan = plan_for(&s, &cur, OLD, OLD, false);
    assert!(
        plan.outcome
            .restart_reason
            .unwrap()
            .contains("may have failed on")
    );
    // A new token: the old one kept aside, the new one written, restarted for it.
    let cur = in_place(&s, OLD, TOKEN_MODE, Vec::new());
    let plan = plan_for(&s, &cur, NEW, OLD, true);
    assert!(matches!(
        plan.outcome.changes.as_slice(),
        [Change::SavePrevious { .. }, Change::WriteToken { .. }]
    ));
    assert_eq!(
        plan.outcome.restart_reason.as_deref(),
        Some("the token changed")
    );
    assert_eq!(plan.token, NEW, "the plan carries the bytes it installs");
    // The same token with the wrong mode: its mode is set, and gridd restarted for it.
    let cur = in_place(&s, OLD, 0o600, Vec::new());
    let plan = plan_for(&s, &cur, OLD, OLD, true);
    assert!(matches!(
        plan.outcome.changes.as_slice(),
        [Change::ChmodToken {
            from: 0o600,
            to: TOKEN_MODE,
            ..
        }]
    ));
    assert_eq!(
        plan.outcome.restart_reason.as_deref(),
        Some("the token's mode changed")
    );
}

#[test]
fn all_in_place_is_nothing_to_do_and_strays_go_to_this_runs_directory() {
    let s = settings();
    // All in place, gridd restarted for this token: nothing to do.
    let cur = in_place(&s, OLD, TOKEN_MODE, Vec::new());
    let plan = plan_for(&s, &cur, OLD, OLD, true);
    assert!(plan.outcome.changes.is_empty());
    assert_eq!(plan.outcome.restart_reason, None);
    // Strays go to this run's directory in replaced/.
    let cur = in_place(&s, OLD, TOKEN_MODE, vec![stray(&s, "README")]);
    let plan = plan_for(&s, &cur, OLD, OLD, true);
    let Change::MoveStray { to, .. } = &plan.outcome.changes[0] else {
        unreachable!()
    };
    assert_eq!(
        to,
        &s.paths.state_dir.join("replaced/20261203T150000Z/README")
    );
}

#[test]
fn nvidia_smi_is_needed_only_for_a_feature_type_other_than_1() {
    let s = settings();
    let mut cur = in_place(&s, OLD, TOKEN_MODE, Vec::new());
    assert!(!needs_gpus(FeatureType::Default(1), &cur));
    assert!(!needs_gpus(FeatureType::Set(1), &cur));
    assert!(needs_gpus(FeatureType::Set(4), &cur));
    // gridd.conf says 1 already: it stays, whatever the default; without it, a default
    // other than 1 is judged.
    assert!(!needs_gpus(FeatureType::Default(2), &cur));
    cur.conf = None;
    assert!(needs_gpus(FeatureType::Default(2), &cur));
    cur = in_place(&s, OLD, TOKEN_MODE, Vec::new());
    for (conf, needs) in [
        ("FeatureType=4\n", true),
        ("FeatureType=0\n", false),
        ("FeatureType=x\n", false),
    ] {
        cur.conf.as_mut().unwrap().bytes = conf.as_bytes().to_vec();
        assert_eq!(needs_gpus(FeatureType::Default(1), &cur), needs, "{conf}");
    }
}

/// One case of the table: what is in place and asked, and the plan's answer.
struct Case {
    name: &'static str,
    /// The installed token, if any.
    installed: Option<&'static [u8]>,
    /// gridd.conf's bytes, if there is one.
    conf: Option<&'static str>,
    feature_type: FeatureType,
    token: &'static [u8],
    /// The token gridd was last restarted for, and whether a restart is owed.
    restarted_for: Option<&'static [u8]>,
    owed: bool,
    licensed: bool,
    dry_run: bool,
    /// Whether the restart may be made now (`false`: `--no-restart`, or the budget waits).
    restart: bool,
    owe_restart: bool,
    unit_missing: bool,
    /// The changes, as their one-word kinds.
    changes: &'static [&'static str],
    /// The reason, or a part of it.
    reason: Option<&'static str>,
    /// The restart once settled (a dry run's: as planned), and whether one stays owed.
    restart_is: Restart,
    owed_after: Option<bool>,
}

const BASE: Case = Case {
    name: "",
    installed: Some(OLD),
    conf: Some("FeatureType=1\n"),
    feature_type: FeatureType::Set(1),
    token: OLD,
    restarted_for: Some(OLD),
    owed: false,
    licensed: true,
    dry_run: false,
    restart: true,
    owe_restart: false,
    unit_missing: false,
    changes: &[],
    reason: None,
    restart_is: Restart::NotNeeded,
    owed_after: None,
};

fn kind(c: &Change) -> &'static str {
    match c {
        Change::CreateDir { .. } => "mkdir",
        Change::ChmodDir { .. } => "chmod-dir",
        Change::RemoveTemp { .. } => "rm-temp",
        Change::MoveStray { .. } => "move",
        Change::SavePrevious { .. } => "save",
        Change::WriteToken { .. } => "token",
        Change::ChmodToken { .. } => "chmod-token",
        Change::WriteGriddConf { .. } => "conf",
    }
}

fn run(c: &Case) -> (Vec<&'static str>, Option<String>, Restart, Option<bool>) {
    let s = settings();
    let mut cur = in_place(&s, c.installed.unwrap_or_default(), TOKEN_MODE, Vec::new());
    if c.installed.is_none() {
        cur.token = None;
    }
    cur.conf = c.conf.map(|b| ConfNow {
        bytes: b.as_bytes().to_vec(),
        mode: 0o644,
        owner: (0, 0),
    });
    let mut inputs = inputs(&s, c.token, c.restarted_for);
    inputs.state.restart_pending = c.owed;
    let ask = Ask {
        feature_type: c.feature_type,
        dry_run: c.dry_run,
        restart: c.restart,
        owe_restart: c.owe_restart,
        ..ask(c.token, c.licensed)
    };
    let plan = Plan::make(ask, &cur, &s, inputs);
    let kinds = plan.outcome.changes.iter().map(kind).collect();
    let reason = plan.outcome.restart_reason.clone();
    if c.dry_run {
        let o = plan.dry_run();
        return (kinds, reason, o.restart, None);
    }
    assert_eq!(
        plan.asks_unit(),
        reason.is_some() && c.restart,
        "{}",
        c.name
    );
    let made = plan.outcome.changes.clone();
    let (o, state) = plan.settled(made, c.unit_missing, "nvidia-gridd.service");
    if let Some(st) = &state {
        assert_eq!(st.token_sha256, Some(sha(c.token)), "{}", c.name);
    }
    (kinds, reason, o.restart, state.map(|s| s.restart_pending))
}

/// Each case's plan, restart and what stays owed, as the case says.
fn check(cases: &[Case]) {
    for c in cases {
        let (kinds, reason, restart, owed) = run(c);
        assert_eq!(kinds, c.changes, "{}", c.name);
        match (c.reason, reason.as_deref()) {
            (None, None) => {}
            (Some(want), Some(got)) => assert!(got.contains(want), "{}: {got}", c.name),
            (want, got) => panic!("{}: reason {got:?}, expected {want:?}", c.name),
        }
        assert_eq!(restart, c.restart_is, "{}", c.name);
        assert_eq!(owed, c.owed_after, "{}", c.name);
    }
}

#[test]
fn the_token_decides_the_plan_and_the_restart() {
    check(&[
        Case {
            name: "token unchanged: nothing to do",
            ..BASE
        },
        Case {
            name: "token unchanged, a dry run: nothing would change",
            dry_run: true,
            ..BASE
        },
        Case {
            name: "token changed, unit present: restart due, owed until made",
            token: NEW,
            changes: &["save", "token"],
            reason: Some("the token changed"),
            restart_is: Restart::Due,
            owed_after: Some(true),
            ..BASE
        },
        Case {
            name: "token changed, no unit: no restart, and why",
            token: NEW,
            unit_missing: true,
            changes: &["save", "token"],
            reason: Some("the token changed"),
            restart_is: Restart::NoUnit("nvidia-gridd.service".into()),
            owed_after: Some(false),
            ..BASE
        },
        Case {
            name: "token changed, a dry run: would restart",
            token: NEW,
            dry_run: true,
            changes: &["save", "token"],
            reason: Some("the token changed"),
            restart_is: Restart::WouldRestart,
            ..BASE
        },
    ]);
}

#[test]
fn a_restart_not_made_now_is_said_and_owed_or_left() {
    check(&[
        Case {
            name: "token changed, a dry run with --no-restart",
            token: NEW,
            dry_run: true,
            restart: false,
            changes: &["save", "token"],
            reason: Some("the token changed"),
            restart_is: Restart::Skipped,
            ..BASE
        },
        Case {
            name: "token changed, --no-restart: left to the user, none owed",
            token: NEW,
            restart: false,
            changes: &["save", "token"],
            reason: Some("the token changed"),
            restart_is: Restart::Skipped,
            owed_after: Some(false),
            ..BASE
        },
        Case {
            name: "token changed, the budget says wait: deferred and owed",
            token: NEW,
            restart: false,
            owe_restart: true,
            changes: &["save", "token"],
            reason: Some("the token changed"),
            restart_is: Restart::Deferred,
            owed_after: Some(true),
            ..BASE
        },
    ]);
}

#[test]
fn gridd_conf_decides_too() {
    check(&[
        Case {
            name: "FeatureType changed in gridd.conf",
            conf: Some("FeatureType=0\n"),
            changes: &["conf"],
            reason: Some("gridd.conf changed"),
            restart_is: Restart::Due,
            owed_after: Some(true),
            ..BASE
        },
        Case {
            name: "FeatureType 4 kept where the default is asked and it fits",
            conf: Some("FeatureType=4\n"),
            feature_type: FeatureType::Default(1),
            ..BASE
        },
        Case {
            name: "no gridd.conf: created",
            conf: None,
            changes: &["conf"],
            reason: Some("gridd.conf changed"),
            restart_is: Restart::Due,
            owed_after: Some(true),
            ..BASE
        },
    ]);
}

#[test]
fn what_the_agent_remembers_and_the_license_decide_too() {
    check(&[
        Case {
            name: "nothing installed: the token written, no copy kept",
            installed: None,
            restarted_for: None,
            token: NEW,
            changes: &["token"],
            reason: Some("the token changed"),
            restart_is: Restart::Due,
            owed_after: Some(true),
            ..BASE
        },
        Case {
            name: "nothing changed, a restart still owed",
            owed: true,
            reason: Some("still owed"),
            restart_is: Restart::Due,
            owed_after: Some(true),
            ..BASE
        },
        Case {
            name: "gridd last restarted for another token",
            restarted_for: Some(NEW),
            reason: Some("not the one nvidia-gridd was last restarted for"),
            restart_is: Restart::Due,
            owed_after: Some(true),
            ..BASE
        },
        Case {
            name: "never restarted for it, licensed: gridd found it on its own",
            restarted_for: None,
            ..BASE
        },
        Case {
            name: "never restarted for it, unlicensed",
            restarted_for: None,
            licensed: false,
            reason: Some("has not restarted it since"),
            restart_is: Restart::Due,
            owed_after: Some(true),
            ..BASE
        },
    ]);
}

#[test]
fn strays_are_moved_aside_for_what_they_are() {
    let s = settings();
    let state = InstallState::default();
    let token_file = s.paths.token_file.clone();
    let token = |name: &str, sha: &str, verdict: Option<&str>, other: bool| {
        token_stray(&s, name, sha, verdict, other)
    };
    let installed = Some("sha-installed");
    // A plain file, a broken token, a second copy of the installed one.
    assert_eq!(
        aside(&stray(&s, "README"), &state, &token_file, installed),
        Aside::Stray
    );
    let broken = Stray {
        verdict: Some("it does not decode".into()),
        ..stray(&s, "x.tok")
    };
    assert_eq!(
        aside(&broken, &state, &token_file, installed),
        Aside::Refused {
            why: "it does not decode".into(),
            valid: false
        }
    );
    let copy = token("copy.tok", "sha-installed", None, false);
    assert_eq!(aside(&copy, &state, &token_file, installed), Aside::Stray);
}

#[test]
fn the_token_in_place_until_now_is_moved_aside_as_the_previous_one() {
    let s = settings();
    let mut state = InstallState::default();
    let token_file = s.paths.token_file.clone();
    let token = |name: &str, sha: &str, verdict: Option<&str>, other: bool| {
        token_stray(&s, name, sha, verdict, other)
    };
    let installed = Some("sha-installed");
    // The token gridd was restarted for is the previous one; without a memory, the one under
    // the standard name is.
    state.token_sha256 = Some("sha-before".into());
    let before = token("a.tok", "sha-before", Some("older"), true);
    assert_eq!(
        aside(&before, &state, &token_file, installed),
        Aside::Previous
    );
    let other = token("b.tok", "sha-other", Some("older"), true);
    assert_eq!(
        aside(&other, &state, &token_file, installed),
        Aside::Refused {
            why: "older".into(),
            valid: true
        }
    );
    state.token_sha256 = None;
    let named = token(&token_file, "sha-before", None, false);
    assert_eq!(
        aside(&named, &state, &token_file, installed),
        Aside::Previous
    );
}

#[test]
fn the_token_directory_and_leftovers_come_first() {
    let s = settings();
    let mut cur = in_place(&s, OLD, TOKEN_MODE, Vec::new());
    cur.dir_mode = Some(0o700);
    cur.temps = vec![s.paths.token_dir.join(".tmp-1")];
    let plan = plan_for(&s, &cur, OLD, OLD, true);
    let kinds: Vec<_> = plan.outcome.changes.iter().map(kind).collect();
    assert_eq!(kinds, ["chmod-dir", "rm-temp"]);
    // Neither is something gridd reads.
    assert_eq!(plan.outcome.restart_reason, None);
    cur.dir_mode = None;
    let plan = plan_for(&s, &cur, OLD, OLD, true);
    assert!(matches!(
        plan.outcome.changes[0],
        Change::CreateDir {
            mode: TOKEN_DIR_MODE,
            ..
        }
    ));
    // The same token under another name keeps it.
    let mut cur = in_place(&s, OLD, TOKEN_MODE, Vec::new());
    let other = s.paths.token_dir.join("download.tok");
    cur.token.as_mut().unwrap().path = other.clone();
    let plan = plan_for(&s, &cur, OLD, OLD, true);
    assert_eq!(plan.outcome.kept_name, Some(other));
    assert!(plan.outcome.changes.is_empty());
}

#[test]
fn each_change_says_what_of_gridd_s_files_it_touches() {
    let p = |s: &str| PathBuf::from(s);
    let moved = |why: Aside| Change::MoveStray {
        from: p("/d/old.tok"),
        to: p("/r/old.tok"),
        why,
    };
    let refused = |valid| Aside::Refused {
        why: "older".into(),
        valid,
    };
    let cases = [
        (moved(Aside::Previous), Touch::Replaced("old.tok".into())),
        (
            moved(refused(true)),
            Touch::ValidTokenMoved("old.tok".into()),
        ),
        (moved(refused(false)), Touch::Stray),
        (moved(Aside::Stray), Touch::Stray),
        (
            Change::SavePrevious {
                from: p("/d/t.tok"),
                to: p("/r/t.tok"),
            },
            Touch::Nothing,
        ),
        (Change::RemoveTemp { path: p("/d/.t") }, Touch::Nothing),
        (
            Change::ChmodDir {
                path: p("/d"),
                from: 0o700,
                to: 0o755,
            },
            Touch::Nothing,
        ),
    ];
    for (change, touch) in cases {
        assert_eq!(change.touch(), touch, "{change:?}");
    }
}

#[test]
fn replaced_keeps_the_newest_and_this_runs_whatever_the_clock() {
    let stamp = |i: usize| format!("20260101T0000{i:02}Z");
    let mut dirs: Vec<String> = (0..REPLACED_KEPT + 3).map(stamp).collect();
    dirs.push("notes".into());
    dirs.push(format!("{}-2", stamp(1)));
    // 24 stamps: the 4 oldest go; `-2` sorts after its stamp; other names stay.
    let gone = replaced_to_prune(&dirs, &stamp(REPLACED_KEPT + 2));
    assert_eq!(
        gone,
        [stamp(0), stamp(1), format!("{}-2", stamp(1)), stamp(2)]
    );
    // This run's stamp is the oldest (a clock set back): it stays, with its `-2`.
    let gone = replaced_to_prune(&dirs, &stamp(1));
    assert_eq!(gone, [stamp(0), stamp(2), stamp(3), stamp(4)]);
    assert!(replaced_to_prune(&dirs[..REPLACED_KEPT], &stamp(0)).is_empty());
}
