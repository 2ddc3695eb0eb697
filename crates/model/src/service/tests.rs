use std::time::Duration;

use super::in_flight::UnitQuestion;
use super::readings::Readings;
use super::report::Published;
use super::{MIN_REPORT_GAP, Now, SMI_FLOOR};
use crate::report::State;
use crate::state::evaluate;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn an_event_brings_nvidia_smis_reading_forward_never_back() {
    let mut due = Readings::default();
    due.set_pace(secs(60));
    due.soon(secs(90));
    assert_eq!(due.next(), Some(secs(60)));
    due.soon(secs(5));
    assert_eq!(due.next(), Some(secs(5)));
    due.soon(secs(30));
    assert_eq!(due.next(), Some(secs(5)), "never put back");
    // A reading starts: nothing more until it answers; an event meanwhile is kept over the
    // pace the answer sets.
    let now = Now {
        mono: secs(5),
        wall: chrono::DateTime::UNIX_EPOCH,
    };
    assert!(due.start(now));
    assert_eq!(due.next(), Some(secs(3605)));
    due.soon(secs(6));
    due.set_pace(secs(305));
    assert_eq!(due.next(), Some(secs(6)));
}

#[test]
fn whatever_asks_a_reading_starts_a_floor_after_the_last_answer() {
    let mut due = Readings::default();
    due.set_pace(secs(3600));
    due.answered_at = Some(secs(10));
    due.soon(secs(10));
    assert_eq!(due.next(), Some(secs(10) + SMI_FLOOR), "not back to back");
    due.soon(secs(5));
    assert_eq!(due.next(), Some(secs(10) + SMI_FLOOR));
    let mut later = Readings::default();
    later.answered_at = Some(secs(10));
    later.soon(secs(30));
    assert_eq!(later.next(), Some(secs(30)), "a later one keeps its time");
}

#[test]
fn status_json_is_written_on_news_or_a_new_observation_and_reports_keep_their_gap() {
    let heartbeat = secs(30);
    let mut p = Published {
        report: None,
        metrics: String::new(),
        beat: secs(0),
        made: None,
        dirty: false,
        rewrite: false,
        ready: false,
    };
    let r = evaluate(crate::state::Observations::default());
    assert!(p.made_at(secs(1), heartbeat, &r, "m"), "the first");
    assert!(!p.made_at(secs(2), heartbeat, &r, "m"), "nothing new");
    assert!(p.made_at(secs(3), heartbeat, &r, "m2"), "new metrics");
    let mut other = r.clone();
    other.state = if r.state == State::Licensed {
        State::Unlicensed
    } else {
        State::Licensed
    };
    assert!(p.made_at(secs(4), heartbeat, &other, "m2"), "a new state");
    assert!(!p.made_at(secs(600), heartbeat, &other, "m2"), "time alone");
    assert!(!p.heartbeat_due(secs(601), heartbeat), "just remade");
    assert!(p.heartbeat_due(secs(630), heartbeat));
    other.observed_at = Some("2026-12-03T12:00:00Z".parse().unwrap());
    assert!(
        p.made_at(secs(631), heartbeat, &other, "m2"),
        "a new observation"
    );
    assert_eq!(p.report.as_ref().map(|r| r.state), Some(other.state));
    assert!(p.gap_over(secs(0)), "none made yet");
    p.made = Some(secs(10));
    assert!(!p.gap_over(secs(10) + MIN_REPORT_GAP / 2));
    assert!(p.gap_over(secs(10) + MIN_REPORT_GAP));
}

#[test]
fn one_unit_question_at_a_time_and_one_more_if_wanted_meanwhile() {
    let mut q = UnitQuestion::default();
    assert!(q.ask());
    assert!(!q.ask(), "one is on its way");
    assert_eq!(q.answered(false, false), (true, true), "the wanted one now");
    assert!(q.ask());
    assert_eq!(q.answered(true, false), (true, false));
}

#[test]
fn not_running_from_before_gridd_started_is_asked_again_not_believed() {
    let mut q = UnitQuestion::default();
    assert!(q.ask());
    q.gridd_moved();
    assert_eq!(q.answered(true, false), (false, true));
    assert!(q.ask());
    assert_eq!(
        q.answered(true, false),
        (true, false),
        "asked after the start"
    );
    // A start while none is on its way: the next question is after it.
    q.gridd_moved();
    assert!(q.ask());
    assert_eq!(q.answered(true, false), (true, false));
    // "Running" is believed whenever it was asked.
    assert!(q.ask());
    q.gridd_moved();
    assert_eq!(q.answered(false, false), (true, false));
}

#[test]
fn not_running_during_the_agents_own_work_waits_for_its_end() {
    let mut q = UnitQuestion::default();
    assert!(q.ask());
    assert_eq!(q.answered(true, true), (false, false), "not while it runs");
    assert!(q.owed(false) && !q.owed(true));
    assert!(q.ask());
    assert!(!q.owed(false), "asked since");
    assert_eq!(q.answered(true, false), (true, false));
    // Owed at the end of a restart with a question on its way: asked on its answer.
    assert!(q.ask());
    q.after_own_work();
    q.gridd_moved();
    assert_eq!(q.answered(false, false), (true, true));
}

#[test]
fn a_report_is_news_when_any_field_but_its_time_and_pid_differs() {
    use super::report::same_report;
    use crate::observe::unit::UnitState;
    let a = evaluate(crate::state::Observations::default());
    let mut b = a.clone();
    b.observed_at = Some(chrono::DateTime::UNIX_EPOCH);
    b.agent_pid = Some(7);
    assert!(same_report(&a, &b), "only the time and the pid differ");
    // A fact added to the report counts without being listed anywhere else.
    let mut c = a.clone();
    c.gridd_unit = Some(UnitState::Active.as_str().to_string());
    assert!(!same_report(&a, &c));
    let mut d = a.clone();
    d.state = State::Licensed;
    assert!(!same_report(&a, &d));
}

#[test]
fn a_reading_runs_one_at_a_time_and_its_answer_sets_the_floor() {
    let now = |s: u64| Now {
        mono: secs(s),
        wall: chrono::DateTime::UNIX_EPOCH,
    };
    let mut r = Readings::new(secs(0));
    assert!(r.due(secs(0)), "the first at once");
    assert!(r.start(now(0)));
    assert!(!r.start(now(1)), "not while one runs");
    // Asked for while it runs: kept for after its answer.
    r.soon(secs(1));
    r.answered(secs(2));
    assert!(!r.running);
    assert_eq!(r.next(), Some(secs(2) + SMI_FLOOR), "kept, after the floor");
}

#[test]
fn a_vague_failure_is_probed_at_once_when_new_and_again_when_due() {
    use super::failing::Probing;
    use super::{MEASURE_REPEAT, PROBE_REPEAT};
    use crate::report::Reason;
    let mut p = Probing::default();
    let vague = Some(Reason::Unspecified);
    let wanted = p.wanted(vague, "no", State::Unlicensed, false);
    assert_eq!(wanted, Some(PROBE_REPEAT), "new: at once");
    p.started(vague, "no");
    assert_eq!(p.wanted(vague, "no", State::Unlicensed, false), None);
    assert_eq!(
        p.wanted(vague, "no", State::Unlicensed, true),
        Some(PROBE_REPEAT),
        "the same, once due"
    );
    assert_eq!(
        p.wanted(vague, "other words", State::Unlicensed, false),
        Some(PROBE_REPEAT),
        "other words are news"
    );
    p.news();
    assert!(p.wanted(vague, "no", State::Unlicensed, false).is_some());
    let skew = Some(Reason::ClockSkew);
    assert_eq!(
        p.wanted(skew, "", State::Unlicensed, false),
        Some(MEASURE_REPEAT),
        "measured, more rarely"
    );
    let specific = Some(Reason::TokenMissing);
    assert_eq!(p.wanted(specific, "", State::Unlicensed, true), None);
}

#[test]
fn a_directory_change_adopts_at_once_after_a_gap_or_after_a_failures_wait() {
    use super::adoption::{Adoption, Next};
    use super::{ADOPT_AFTER_FAILURE, TOKEN_READ_GAP};
    let mut a = Adoption::default();
    assert_eq!(a.changed(secs(10)), Next::Now);
    assert_eq!(
        a.ended(true, secs(0), secs(10)),
        Next::Nothing,
        "nothing owed"
    );
    assert_eq!(a.changed(secs(10)), Next::Owed(secs(10) + TOKEN_READ_GAP));
    a.again = true;
    assert_eq!(
        a.ended(true, secs(0), secs(20)),
        Next::Owed(secs(20) + TOKEN_READ_GAP)
    );
    a.due = true;
    assert_eq!(
        a.ended(false, secs(0), secs(30)),
        Next::Now,
        "its deadline came"
    );
    a.failed = Some(secs(40));
    assert_eq!(
        a.changed(secs(41)),
        Next::Look(secs(40) + ADOPT_AFTER_FAILURE)
    );
}
