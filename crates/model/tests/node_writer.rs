//! The Node writer's decisions in simulated time: when the condition is written and written
//! again, the `lastTransitionTime` it carries, when the opt-in taint goes on and off (given
//! the node's uptime), and the backoff after failed writes. The writer is driven here as
//! `src/kube/writer.rs` drives it (what happens in with `handle`, its actions out of `poll`,
//! the next wake from `poll_timeout`), against a simulated Node that answers or fails as
//! told; no clock, no `/proc/uptime`, no wait. `tests/kube.rs` shows the real writer
//! sending to a simulated API server.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use vgpu_license_model::node::condition::{Condition, Outcome, TAINT_SETTLE};
use vgpu_license_model::node::writer::{Action, BACKOFF, Input, NodeWriter};
use vgpu_license_model::time::{Now, rfc3339};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
}

/// `s` seconds after the writer started, the wall clock as far on from [`t0`].
fn at(s: u64) -> Now {
    Now {
        mono: Duration::from_secs(s),
        wall: t0() + chrono::Duration::seconds(s as i64),
    }
}

fn wall(s: u64) -> String {
    rfc3339(at(s).wall)
}

fn unlicensed() -> Condition {
    Condition {
        status: "False",
        reason: "DlsUnreachable".into(),
        message: "unlicensed".into(),
        unlicensed: true,
    }
}

fn licensed() -> Condition {
    Condition {
        status: "True",
        reason: "Licensed".into(),
        message: "licensed".into(),
        unlicensed: false,
    }
}

/// The Node as the simulated API keeps it, and what it was sent.
#[derive(Default)]
struct Node {
    /// Its condition's status and `lastTransitionTime`.
    condition: Option<(String, String)>,
    tainted: bool,
    /// Every status patch refused (a 500), every taint patch refused (a 403).
    fail_status: bool,
    fail_taint: bool,
    /// The status patches sent (refused ones too), with when.
    patches: Vec<(u64, Value)>,
    /// The taint writes tried: when, and on or off.
    taint_writes: Vec<(u64, bool)>,
}

/// The writer's shell in simulated time: conditions from the service at given times, the
/// node booted `up` seconds before the writer started.
struct Sim {
    writer: NodeWriter,
    node: Node,
    now: u64,
    changes: VecDeque<(u64, Condition)>,
    /// The outcomes of the writes, for the service.
    outcomes: Vec<(u64, Outcome)>,
}

impl Sim {
    fn new(heartbeat: u64, taint: bool, up: u64) -> Sim {
        let mut writer = NodeWriter::new(Duration::from_secs(heartbeat), taint);
        writer.handle(Input::Uptime(Duration::from_secs(up)), at(0));
        Sim {
            writer,
            node: Node::default(),
            now: 0,
            changes: VecDeque::new(),
            outcomes: Vec::new(),
        }
    }

    /// The service sends `cond` at `t`.
    fn send(&mut self, t: u64, cond: Condition) -> &mut Sim {
        self.changes.push_back((t, cond));
        self
    }

    /// Plays the shell until `end`: each turn waits for a change or the writer's timeout,
    /// then carries out what the writer asks until it asks nothing more.
    fn run_until(&mut self, end: u64) -> &mut Sim {
        loop {
            let wake = self.writer.poll_timeout().as_secs();
            let (t, change) = match self.changes.front() {
                Some((tc, _)) if *tc <= wake => (*tc, self.changes.pop_front()),
                _ => (wake, None),
            };
            if t > end {
                if let Some(c) = change {
                    self.changes.push_front(c);
                }
                self.now = end;
                return self;
            }
            self.now = t;
            if let Some((_, cond)) = change {
                self.writer.handle(Input::Condition(cond), at(t));
            }
            while let Some(action) = self.writer.poll(at(t)) {
                let input = match action {
                    Action::ReadNode => Input::NodeRead(Ok(self.node.condition.clone())),
                    Action::Patch(body) => Input::Patched(self.patch(body)),
                    Action::Taint(want) => Input::Tainted(self.taint(want)),
                    Action::Done(outcome) => {
                        self.outcomes.push((t, outcome));
                        continue;
                    }
                };
                self.writer.handle(input, at(t));
            }
        }
    }

    /// The simulated API's answer to a status patch.
    fn patch(&mut self, body: Value) -> Result<(), String> {
        let c = &body["status"]["conditions"][0];
        let condition = (
            c["status"].as_str().unwrap().to_string(),
            c["lastTransitionTime"].as_str().unwrap().to_string(),
        );
        self.node.patches.push((self.now, body));
        if self.node.fail_status {
            return Err("HTTP 500".into());
        }
        self.node.condition = Some(condition);
        Ok(())
    }

    /// The simulated API's answer to a taint write.
    fn taint(&mut self, want: bool) -> Result<(), String> {
        self.node.taint_writes.push((self.now, want));
        if self.node.fail_taint {
            return Err("HTTP 403".into());
        }
        self.node.tainted = want;
        Ok(())
    }

    /// The status patches: when, the status, `lastTransitionTime`, `lastHeartbeatTime`.
    fn patches(&self) -> Vec<(u64, String, String, String)> {
        self.node
            .patches
            .iter()
            .map(|(t, p)| {
                let c = &p["status"]["conditions"][0];
                let s = |k: &str| c[k].as_str().unwrap().to_string();
                (
                    *t,
                    s("status"),
                    s("lastTransitionTime"),
                    s("lastHeartbeatTime"),
                )
            })
            .collect()
    }

    fn patch_times(&self) -> Vec<u64> {
        self.node.patches.iter().map(|(t, _)| *t).collect()
    }
}

fn p(t: u64, status: &str, since: u64) -> (u64, String, String, String) {
    (t, status.to_string(), wall(since), wall(t))
}

#[test]
fn a_change_is_written_at_once_and_the_heartbeat_refreshes_it_keeping_the_transition() {
    let mut sim = Sim::new(60, false, 3600);
    sim.send(0, unlicensed())
        .send(130, licensed())
        .run_until(200);
    assert_eq!(
        sim.patches(),
        vec![
            p(0, "False", 0),
            p(60, "False", 0),
            p(120, "False", 0),
            p(130, "True", 130),
            p(190, "True", 130),
        ]
    );
    // The same condition sent again is no write, a heartbeat after the last one or not:
    // the Node holds it.
    let mut sim = Sim::new(60, false, 3600);
    sim.send(0, unlicensed())
        .send(50, unlicensed())
        .send(100, unlicensed())
        .run_until(100);
    assert_eq!(sim.patch_times(), vec![0]);
}

#[test]
fn failed_writes_back_off_and_keep_the_time_of_the_change() {
    let mut sim = Sim::new(60, false, 3600);
    sim.node.fail_status = true;
    sim.send(0, unlicensed()).run_until(1000);
    // 5 s, doubling, at most 5 min.
    assert_eq!(
        sim.patch_times(),
        vec![0, 5, 15, 35, 75, 155, 315, 615, 915]
    );
    assert!(
        sim.patches()
            .iter()
            .all(|(_, s, since, _)| s == "False" && *since == wall(0)),
        "{:?}",
        sim.patches()
    );
    // The API answers again: the Node gets the change's time, not the write's.
    sim.node.fail_status = false;
    sim.run_until(1250);
    assert_eq!(sim.node.condition, Some(("False".into(), wall(0))));
    assert_eq!(sim.patch_times().last(), Some(&1215));
    // A success starts the backoff again from 5 s: the heartbeat at 1275 fails, the retry
    // comes at 1280.
    sim.node.fail_status = true;
    sim.run_until(1280);
    assert_eq!(sim.patch_times()[9..], [1215, 1275, 1280]);
}

#[test]
fn a_change_while_failing_is_tried_at_once_with_its_own_time() {
    let mut sim = Sim::new(300, false, 3600);
    sim.node.fail_status = true;
    sim.send(0, unlicensed()).send(20, licensed()).run_until(30);
    let p = sim.patches();
    assert_eq!(sim.patch_times(), vec![0, 5, 15, 20]);
    assert_eq!((p[3].1.as_str(), p[3].2.clone()), ("True", wall(20)));
    // The retries of True keep 20's time; the backoff goes on growing (40 s after the 4th).
    sim.run_until(100);
    assert_eq!(sim.patch_times()[4..], [60]);
    assert!(
        sim.patches()[3..]
            .iter()
            .all(|(_, _, since, _)| *since == wall(20))
    );
    sim.node.fail_status = false;
    sim.run_until(200);
    assert_eq!(sim.node.condition, Some(("True".into(), wall(20))));
}

#[test]
fn the_nodes_own_transition_time_stands_for_the_status_it_shows() {
    // An agent restarted: the Node shows True since long ago, and keeps that time.
    let mut sim = Sim::new(60, false, 3600);
    sim.node.condition = Some(("True".into(), "2026-01-01T00:00:00Z".into()));
    sim.send(0, licensed()).send(30, unlicensed()).run_until(30);
    let p = sim.patches();
    assert_eq!(p[0].2, "2026-01-01T00:00:00Z");
    assert_eq!((p[1].1.as_str(), p[1].2.clone()), ("False", wall(30)));
    // Another status on the Node: the change's time.
    let mut sim = Sim::new(60, false, 3600);
    sim.node.condition = Some(("False".into(), "2026-01-01T00:00:00Z".into()));
    sim.send(7, licensed()).run_until(7);
    assert_eq!(sim.patches()[0].2, wall(7));
}

#[test]
fn the_transition_follows_the_wall_clock_of_the_change_not_of_the_write() {
    // The wall clock stepped back between the change and the write that went through: the
    // Node still gets the change's time (what the retries carried).
    let transition = |a: Option<Action>| match a {
        Some(Action::Patch(body)) => body["status"]["conditions"][0]["lastTransitionTime"]
            .as_str()
            .unwrap()
            .to_string(),
        other => panic!("{other:?}"),
    };
    let mut w = NodeWriter::new(Duration::from_secs(60), false);
    w.handle(Input::Condition(unlicensed()), at(0));
    assert_eq!(w.poll(at(0)), Some(Action::ReadNode));
    w.handle(Input::NodeRead(Ok(None)), at(0));
    assert_eq!(transition(w.poll(at(0))), wall(0));
    assert_eq!(w.poll(at(0)), None, "the patch's answer is awaited");
    w.handle(Input::Patched(Err("HTTP 500".into())), at(0));
    assert!(matches!(w.poll(at(0)), Some(Action::Done(o)) if o.failed()));
    assert_eq!(w.poll_timeout(), Duration::from_secs(5));
    let stepped = Now {
        mono: Duration::from_secs(5),
        wall: t0() - chrono::Duration::hours(1),
    };
    assert_eq!(transition(w.poll(stepped)), wall(0));
}

#[test]
fn the_taint_goes_on_past_the_settling_time_after_boot_and_off_once_licensed() {
    // Booted 100 s before the writer started: unlicensed, but gridd's first acquisition may
    // still be under way until the settling time (5 min) after boot.
    assert_eq!(TAINT_SETTLE, Duration::from_secs(300));
    let mut sim = Sim::new(60, true, 100);
    sim.send(0, unlicensed())
        .send(300, licensed())
        .send(400, unlicensed())
        .run_until(500);
    assert_eq!(
        sim.node.taint_writes,
        vec![(0, false), (240, true), (300, false), (400, true)]
    );
    assert!(sim.node.tainted);
    // Up long past it: on at the first write.
    let mut sim = Sim::new(60, true, 3600);
    sim.send(0, unlicensed()).run_until(500);
    assert_eq!(sim.node.taint_writes, vec![(0, true)]);
}

#[test]
fn a_taint_taken_off_by_hand_stays_off_until_the_license_changes() {
    let mut sim = Sim::new(60, true, 3600);
    sim.send(0, unlicensed()).run_until(10);
    assert!(sim.node.tainted);
    sim.node.tainted = false;
    sim.run_until(1000);
    assert!(!sim.node.tainted, "the heartbeats leave it off");
    assert_eq!(sim.node.taint_writes, vec![(0, true)]);
    sim.send(1010, licensed())
        .send(1020, unlicensed())
        .run_until(1020);
    assert_eq!(
        sim.node.taint_writes,
        vec![(0, true), (1010, false), (1020, true)]
    );
}

#[test]
fn without_the_key_no_taint_is_ever_written() {
    let mut sim = Sim::new(60, false, 100);
    sim.send(0, unlicensed())
        .send(1000, licensed())
        .send(2000, unlicensed())
        .run_until(5000);
    assert!(sim.node.taint_writes.is_empty());
    assert!(sim.patch_times().len() > 80, "{:?}", sim.patch_times());
}

#[test]
fn a_refused_taint_is_retried_with_backoff_without_writing_the_condition_again() {
    let mut sim = Sim::new(300, true, 3600);
    sim.node.fail_taint = true;
    sim.send(0, unlicensed()).run_until(30);
    assert_eq!(
        sim.node.taint_writes,
        vec![(0, true), (5, true), (15, true)]
    );
    assert_eq!(sim.patch_times(), vec![0], "the condition is fresh");
    sim.node.fail_taint = false;
    sim.run_until(400);
    assert_eq!(
        sim.node.taint_writes,
        vec![(0, true), (5, true), (15, true), (35, true)]
    );
    assert!(sim.node.tainted);
    // What the service is told: the condition written, the taint refused three times.
    let told: Vec<_> = sim.outcomes.iter().map(|(t, o)| (*t, o.failed())).collect();
    assert_eq!(
        told,
        vec![(0, true), (5, true), (15, true), (35, false), (335, false)]
    );
    assert_eq!(sim.outcomes[0].1.condition, Some(Ok(())));
    assert_eq!(sim.outcomes[1].1.condition, None, "the condition is fresh");
    // The heartbeat, a heartbeat after the condition's write, with the taint already on.
    assert_eq!(sim.patch_times(), vec![0, 335]);
}

#[test]
fn the_node_writers_backoff_is_5_s_doubling_to_5_min() {
    let s = Duration::from_secs;
    assert_eq!(
        BACKOFF.schedule(8),
        [5, 10, 20, 40, 80, 160, 300, 300].map(s)
    );
}
