//! A token dropped in the directory, or given by the token source: read, adopted with
//! install's plan, refused or deferred, and what is said of it.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{error, info, warn};

use super::schedule::Timer;
use super::{
    ADOPT_AFTER_FAILURE, AdoptError, Core, Effect, Now, TOKEN_NOTICE_FOR, TOKEN_READ_GAP, look_gap,
    secs,
};
use crate::assemble::TokenRead;
use crate::install::{Aside, Change, Outcome, Restart};
use crate::node::Mode;
use crate::report::{State, message_ids};
use crate::restart::TokenRestart;

/// Adopting the token that the token directory (or the token source) holds.
#[derive(Debug, Default)]
pub(super) struct Adoption {
    /// The directory changed during an adoption: another one follows it.
    pub(super) again: bool,
    /// The last adoption failed at this time: the directory's changes (many of them the
    /// adoption's own undo) do not start another one before [`ADOPT_AFTER_FAILURE`].
    pub(super) failed: Option<Duration>,
    /// The token source holds a token the agent refused: why.
    pub(super) source_rejected: Option<String>,
    /// When the agent first refused it: the warning's date (the last nvidia-smi reading,
    /// minutes old while licensed, may be older than the token).
    pub(super) source_rejected_at: Option<DateTime<Utc>>,
    /// The token source was read at least once (before, a missing token is not counted:
    /// the source may bring one).
    pub(super) source_read: bool,
    /// Files meant as tokens that an adoption refused and moved aside: what to say, and
    /// until when (monotonic).
    pub(super) rejected: Option<(String, Duration)>,
    /// When the agent refused them: the warning's date.
    pub(super) rejected_at: Option<DateTime<Utc>>,
    /// The last rotation an adoption made: a note, and until when.
    pub(super) rotated: Option<(String, Duration)>,
    /// The last "token not adopted" line logged: the same refusal, met again at each change
    /// of the directory while it stands, is said once (until something else happens).
    pub(super) refusal_said: Option<String>,
    /// The last adoption deferred gridd's restart, and said so; and until when.
    pub(super) deferral_said: bool,
    pub(super) deferred_until: Option<Duration>,
    /// The directory's changes start no adoption before this (monotonic): the last one's end
    /// and the gap its length set ([`look_gap`]).
    pub(super) calm_at: Duration,
    /// Its deadline came while an adoption ran: the next one is made as that one ends.
    pub(super) due: bool,
}

/// An adoption that changed something, said line by line: each names what it is about
/// ("token: ...", "restarted ..."). A file meant as a token that was refused is a warning:
/// the operator who copied it believes the rotation went through. The token's warnings are
/// said with what was done, not at every periodic look (the report keeps what lasts, an
/// expiring token among it).
pub(super) fn say_outcome(outcome: &Outcome) {
    let refused: Vec<String> = outcome
        .changes
        .iter()
        .filter(|c| {
            matches!(
                c,
                Change::MoveStray {
                    why: Aside::Refused { .. },
                    ..
                }
            )
        })
        .map(|c| c.describe(true))
        .collect();
    // The restart is said once it is made, by [`say_restarted`], with its catalog entry.
    let restart = matches!(outcome.restart, Restart::Done | Restart::Due)
        .then(|| outcome.lines().pop())
        .flatten();
    for line in outcome.lines() {
        if Some(&line) == restart.as_ref() {
            continue;
        }
        if refused.contains(&line) {
            warn!(
                message_id = message_ids::FAILURE_TOKEN_REJECTED,
                "token not adopted: {}",
                crate::text::escape(&line)
            );
        } else {
            info!("{}", crate::text::escape(&line));
        }
    }
    for w in &outcome.warnings {
        warn!("token: {}", crate::text::escape(w));
    }
}

/// What comes after an adoption ends, or the token directory changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Next {
    /// An adoption now.
    Now,
    /// An adoption owed at this deadline: the service wakes for it.
    Owed(Duration),
    /// The look is brought forward to this deadline (a failure's wait).
    Look(Duration),
    Nothing,
}

impl Adoption {
    /// An adoption that took `took` ended at `now` (`did_something`: it changed the
    /// directory or restarted gridd, which takes seconds and says nothing of how long a look
    /// takes): when the directory's changes may start the next one, and the next one made
    /// now if its deadline came meanwhile, or owed if the directory changed.
    pub(super) fn ended(&mut self, did_something: bool, took: Duration, now: Duration) -> Next {
        self.calm_at = now
            + if did_something {
                TOKEN_READ_GAP
            } else {
                look_gap(took)
            };
        let again = std::mem::take(&mut self.again);
        if std::mem::take(&mut self.due) {
            Next::Now
        } else if again {
            Next::Owed(self.calm_at)
        } else {
            Next::Nothing
        }
    }

    /// The token directory changed at `now`: adopt what is there, unless the last adoption
    /// failed moments ago (then when the wait is over).
    pub(super) fn changed(&self, now: Duration) -> Next {
        match self.failed {
            Some(t) if now < t + ADOPT_AFTER_FAILURE => Next::Look(t + ADOPT_AFTER_FAILURE),
            // A burst of changes (a sync tool writing thousands of files) is adopted a gap
            // apart ([`look_gap`]), not in one adoption after another for its length: each
            // reads the whole directory.
            _ if now < self.calm_at => Next::Owed(self.calm_at),
            _ => Next::Now,
        }
    }

    /// No adoption at `now`: waited for (a writer settling, a newer token), or refused and
    /// said.
    pub(super) fn not_adopted(&mut self, e: AdoptError, now: Duration) -> Next {
        match e {
            AdoptError::NoToken(_) => {}
            // Judged once the writer is done: the deadline wakes the service.
            AdoptError::Settling(wait) => return Next::Owed(now + wait),
            AdoptError::Superseded => {
                info!("the token was replaced while being adopted: adopting the new one");
                self.again = true;
            }
            // cloud-init may still be writing it: the next change or tick tries again.
            AdoptError::Rejected(why) => {
                warn!(
                    "token not adopted: {}",
                    crate::text::escape(&why.to_string())
                )
            }
            AdoptError::Refused(why) | AdoptError::Other(why) => {
                error!("token not adopted: {}", crate::text::escape(&why))
            }
            AdoptError::SourceRejected(why) => {
                warn!(
                    message_id = message_ids::FAILURE_TOKEN_SOURCE_REJECTED,
                    "token not adopted: {}",
                    crate::text::escape(&why)
                )
            }
        }
        Next::Nothing
    }

    /// Whether the outcome's deferred restart was said already: a restart still owed, met
    /// again by a look that changed nothing (the agent's own chmod wakes it, and so does
    /// each periodic look), was said when it was deferred: the journal says it once, and
    /// once when it is made.
    pub(super) fn said_already(&mut self, outcome: &Outcome) -> bool {
        let deferred = outcome.restart == Restart::Deferred;
        let said = self.deferral_said && !outcome.changed() && deferred;
        self.deferral_said = deferred;
        said
    }

    /// A restart for the token owed, allowed from `at` (seconds on the core's clock): until
    /// when it is deferred (adopted again, and gridd restarted, at that deadline, however
    /// quiet the service is meanwhile); said once (`say`).
    pub(super) fn defer(&mut self, at: f64, now: Now, say: bool) -> Duration {
        // Whole seconds, rounded up: the restart comes when the line says. A later look that
        // finds it still owed keeps the deadline said (rounding up again from a later moment
        // would move it).
        let until = match self.deferred_until {
            Some(t) if !say && t > now.mono => t,
            _ => {
                let wait = Duration::from_secs_f64((at - secs(now)).max(1.0).ceil());
                if say {
                    info!(
                        "nvidia-gridd is restarted for the new token in {:.0} s: the restart budget or backoff says wait",
                        wait.as_secs_f64()
                    );
                }
                now.mono + wait
            }
        };
        self.deferred_until = Some(until);
        until
    }

    /// Whether a refusal is news: not the one last said.
    pub(super) fn news(&mut self, line: &str) -> bool {
        if self.refusal_said.as_deref() == Some(line) {
            return false;
        }
        self.refusal_said = Some(line.to_string());
        true
    }

    /// Whether the adoption failed in a way that waits, and the token source's verdict,
    /// which stands until the next adoption says otherwise (a good rotation, or the source
    /// fixed back to the installed token). Whether that verdict changed.
    pub(super) fn verdict(&mut self, result: &Result<Box<Outcome>, AdoptError>, now: Now) -> bool {
        // Only a failure whose undo changed the directory (a full disk, say) waits: a token
        // or a directory refused as it stands (cloud-init still writing it, a FIFO at the
        // token path) changes nothing, and the next change is looked at at once.
        self.failed = match result {
            Err(AdoptError::Other(_)) => Some(now.mono),
            _ => None,
        };
        let rejected = match result {
            Err(AdoptError::SourceRejected(why)) => Some(why.clone()),
            Err(AdoptError::Superseded | AdoptError::Settling(_)) => self.source_rejected.clone(),
            _ => None,
        };
        let changed = rejected != self.source_rejected;
        if changed {
            self.source_rejected_at = Some(now.wall);
        }
        self.source_rejected = rejected;
        self.source_read = true;
        changed
    }

    /// Whether an adoption's outcome is to be said: a refusal only when it is not the one
    /// last said. A change made, or another outcome, ends the refusal (the next one is news
    /// again); a quiet look (nothing to do, a file still being written) does not.
    pub(super) fn is_news(&mut self, result: &Result<Box<Outcome>, AdoptError>) -> bool {
        let refusal = match result {
            Err(AdoptError::Rejected(why)) => Some(why.to_string()),
            Err(
                AdoptError::Refused(why) | AdoptError::Other(why) | AdoptError::SourceRejected(why),
            ) => Some(why.clone()),
            _ => None,
        };
        match refusal {
            Some(why) => self.news(&why),
            None => {
                match result {
                    Ok(o) if !o.changed() && o.restart == Restart::NotNeeded => {}
                    Err(AdoptError::Settling(_) | AdoptError::NoToken(_)) => {}
                    _ => self.refusal_said = None,
                }
                true
            }
        }
    }

    /// Remembers what an adoption refused or rotated, for the report of the next while. A
    /// new token in place with nothing refused ends an earlier refusal: the operator
    /// copied the right file.
    pub(super) fn took(&mut self, outcome: &Outcome, now: Now) {
        let until = now.mono + TOKEN_NOTICE_FOR;
        let mut refused = Vec::new();
        let mut new_token = false;
        for c in &outcome.changes {
            match c {
                Change::MoveStray {
                    from,
                    to,
                    why: Aside::Refused { why, valid },
                } => refused.push(refused_line(from, to, why, *valid)),
                Change::MoveStray {
                    from,
                    to,
                    why: Aside::Previous,
                } => {
                    new_token = true;
                    self.rotated = Some((rotated_note(from, to, now), until));
                }
                Change::WriteToken { .. } => new_token = true,
                _ => {}
            }
        }
        if !refused.is_empty() {
            self.rejected = Some((refused.join("; "), until));
            self.rejected_at = Some(now.wall);
        } else if new_token {
            self.rejected = None;
        }
    }

    /// What is still recent at `now`.
    pub(super) fn recent(notice: &Option<(String, Duration)>, now: Now) -> Option<String> {
        notice
            .as_ref()
            .filter(|(_, until)| now.mono < *until)
            .map(|(s, _)| s.clone())
    }
}

/// A file meant as a token that an adoption refused and moved aside: what, where, why, and
/// how to choose it where it is valid.
fn refused_line(from: &Path, to: &Path, why: &str, valid: bool) -> String {
    format!(
        "{} was not adopted and is now {}: {why}{}",
        crate::text::show_path(from),
        crate::text::show_path(to),
        if valid {
            format!(
                "; to choose it instead: vgpu-license-agent install --token-file {}",
                crate::text::show_path(to)
            )
        } else {
            String::new()
        }
    )
}

/// The note of a rotation made at `now`: the token replaced, where it is kept, how to go back.
fn rotated_note(from: &Path, to: &Path, now: Now) -> String {
    format!(
        "The token was rotated at {}: a newer token replaces {}, which is kept at {} (to go back: vgpu-license-agent install --token-file {}).",
        crate::time::rfc3339(now.wall),
        crate::text::show_path(from),
        crate::text::show_path(to),
        crate::text::show_path(to)
    )
}

/// A restart of gridd the agent made, in one line: the command and why, the reason also as a
/// field (the catalog entry's text names it).
pub(super) fn say_restarted(command: &str, why: &str) {
    info!(
        message_id = message_ids::GRIDD_RESTARTED,
        vgpu_license_reason = why,
        "{}",
        crate::text::escape(&crate::install::restarted_line(command, why))
    );
}

impl Core {
    /// The token directory as read: gridd.conf's legacy server and the files held open at
    /// once; the token unless it is being written, and a new one is news for the probe.
    pub(super) fn on_token(&mut self, read: TokenRead, now: Now, fx: &mut Vec<Effect>) {
        self.busy.token = false;
        if std::mem::take(&mut self.busy.token_again) {
            // Changed again meanwhile: looked at again after a short gap, so that a burst of
            // changes is a few looks, not one after another for its length.
            let took = now.mono.saturating_sub(self.busy.token_since);
            self.schedule
                .set(Timer::TokenRead, now.mono + look_gap(took));
        }
        self.seen.legacy_server = read.legacy_server;
        self.seen.held = read.held_writers;
        if let Some(at) = self.seen.settling(&read.token, now.mono) {
            self.schedule.set(Timer::TokenRead, at);
            return;
        }
        let Some(replaced) = self.seen.token_read(read.token, now.mono) else {
            return;
        };
        if replaced {
            // A new token is news: a vague failure is probed again at once, and what the
            // last probe found was about the old token's DLS.
            self.probing.forget();
            self.published.dirty = true;
        }
        // The licensing Secret is compared with this token only once read after it came (a
        // new driver pod's token against the Secret read minutes before would ask for a
        // recycle just made): read now.
        if self.settings.kubernetes.licensing_secret.is_some() {
            fx.push(Effect::ReadSecret);
        }
    }

    /// An adoption's outcome: the source's verdict, what it changed, the restart it made.
    pub(super) fn on_adopted(
        &mut self,
        result: Result<Box<Outcome>, AdoptError>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        self.busy.adopt = false;
        self.published.dirty |= self.adoption.verdict(&result, now);
        if let Ok(o) = &result {
            self.adoption.took(o, now);
            self.published.dirty |= o.changed();
        }
        if result.as_ref().is_ok_and(|o| o.changed()) {
            self.read_token(now, fx);
        }
        let restarted = result
            .as_ref()
            .is_ok_and(|o| matches!(o.restart, Restart::Done | Restart::Failed(_)));
        let changed = result.as_ref().is_ok_and(|o| o.changed());
        self.adopted(result, now, fx);
        self.own_work_ended(restarted, now, fx);
        let took = now.mono.saturating_sub(self.busy.adopt_since);
        let next = self.adoption.ended(restarted || changed, took, now.mono);
        self.adopt_next(next, now, fx);
    }

    /// The token directory changed: adopt what is there ([`Adoption::changed`]).
    pub(super) fn dir_changed(&mut self, now: Now, fx: &mut Vec<Effect>) {
        let next = self.adoption.changed(now.mono);
        self.adopt_next(next, now, fx);
    }

    /// The next adoption as the adoption slice said: now, owed at a deadline, or at the
    /// look's.
    fn adopt_next(&mut self, next: Next, now: Now, fx: &mut Vec<Effect>) {
        match next {
            Next::Now => self.adopt(now, fx),
            Next::Owed(at) => self.adopt_at(at),
            Next::Look(at) => self.schedule.set_earlier(Timer::Look, at),
            Next::Nothing => {}
        }
    }

    /// An adoption owed at `at`: the loop wakes for it.
    pub(super) fn adopt_at(&mut self, at: Duration) {
        self.schedule.set_earlier(Timer::Owed, at);
    }

    /// Reads the token directory, once at a time: a burst of changes (a sync tool writing
    /// thousands of files) costs one read in flight and one more after it, not one each.
    pub(super) fn read_token(&mut self, now: Now, fx: &mut Vec<Effect>) {
        if std::mem::replace(&mut self.busy.token, true) {
            self.busy.token_again = true;
        } else {
            self.busy.token_since = now.mono;
            fx.push(Effect::ReadToken);
        }
    }

    /// A token dropped by cloud-init (or anyone): validated, mode fixed, strays moved aside,
    /// gridd restarted: the same code as `install`.
    pub(super) fn adopt(&mut self, now: Now, fx: &mut Vec<Effect>) {
        // Whether gridd already holds a license decides whether a token in place needs a
        // restart: wait for the first report (it adopts at once).
        let Some(report) = &self.published.report else {
            return;
        };
        // Observing only: the token is the operator's (or the admin's) to put in place. A
        // vGPU host holds no token: its guests do.
        if self.node.mode == Mode::Observe || self.is_host() {
            return;
        }
        let licensed = report.state == State::Licensed;
        if std::mem::replace(&mut self.busy.adopt, true) {
            self.adoption.again = true;
            return;
        }
        // A new token's restart spends the same budget as every restart, and with a license
        // held the same backoff (40 rotations in 20 s are one restart now and the owed one
        // later, not 40); a new token while no license is held is the fix arriving.
        let may_restart =
            self.remedy
                .may_restart_for_token(&self.settings.service, secs(now), licensed);
        self.busy.adopt_since = now.mono;
        self.busy.adopt_after = self.busy.restarts_ended;
        fx.push(Effect::Adopt {
            licensed,
            may_restart,
        });
    }

    /// An adoption's outcome as news: said (once), and what it means for the next
    /// adoption and for gridd's restart.
    pub(super) fn adopted(
        &mut self,
        result: Result<Box<Outcome>, AdoptError>,
        now: Now,
        fx: &mut Vec<Effect>,
    ) {
        if !self.adoption.is_news(&result) {
            return;
        }
        match result {
            Ok(outcome) => {
                // A restart still owed is said once ([`Adoption::said_already`]).
                let said_already = self.adoption.said_already(&outcome);
                if !said_already && (outcome.changed() || outcome.restart != Restart::NotNeeded) {
                    say_outcome(&outcome);
                    // A new token, or one now in place: a vague failure is news again.
                    self.probing.news();
                }
                self.restart_done(&outcome, now, !said_already, fx);
            }
            Err(e) => {
                let next = self.adoption.not_adopted(e, now.mono);
                self.adopt_next(next, now, fx);
            }
        }
    }

    /// What an adoption's restart of gridd means for the service: due (made here, as every
    /// restart of the agent's own, so that the remedy sees it before it happens), owed until
    /// the budget allows, or (an older agent's adoption) made or failed, which counts too.
    pub(super) fn restart_done(
        &mut self,
        outcome: &Outcome,
        now: Now,
        say_deferral: bool,
        fx: &mut Vec<Effect>,
    ) {
        let decided = crate::restart::for_adopted_token(
            &outcome.restart,
            outcome.restart_reason.as_deref(),
            self.busy.restart.is_some(),
            self.busy.adopt_after != self.busy.restarts_ended,
        );
        match decided {
            TokenRestart::AdoptAgain => self.adopt_at(now.mono + Duration::from_secs(1)),
            TokenRestart::Now(why) => {
                self.busy.restart = Some(why.clone());
                self.remedy.restarted(secs(now), 0.5);
                fx.push(Effect::RestartGridd {
                    why,
                    for_token: true,
                });
            }
            TokenRestart::Made => self.restart_made(outcome, now),
            TokenRestart::Deferred => {
                let at = self.remedy.next_allowed_for_token(
                    &self.settings.service,
                    secs(now),
                    self.published.licensed(),
                );
                let until = self.adoption.defer(at, now, say_deferral);
                self.adopt_at(until);
            }
            TokenRestart::Failed(why) => {
                // A failed attempt counts against the budget and the backoff too.
                self.remedy.restarted(secs(now), 0.5);
                error!(
                    "restarting nvidia-gridd failed: {}",
                    crate::text::escape(&why)
                );
            }
            TokenRestart::None => {}
        }
    }

    /// A restart an (older agent's) adoption made itself: counted, said, and read after.
    fn restart_made(&mut self, outcome: &Outcome, now: Now) {
        self.counters.gridd_restarts += 1;
        self.remedy.restarted(secs(now), 0.5);
        say_restarted(
            &outcome.restart_command,
            outcome.restart_reason.as_deref().unwrap_or("for the token"),
        );
        self.readings.soon(now.mono + Duration::from_secs(1));
        // Asked once the adoption is over.
        self.unit.question.after_own_work();
    }
}
