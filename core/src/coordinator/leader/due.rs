//! Delayed jobs at the leader: one timer, armed for the earliest `run_at` in the table, and
//! the `Due` entries that queue the jobs whose time this leader's clock has reached.
//!
//! However many jobs are scheduled, the leader holds one timer and at most one `Due` entry in
//! flight (of up to `DUE_JOBS_PER_ENTRY_MAX` jobs); when it applies, the next batch follows.
//! Nothing here is trusted by apply: a `Due` queues only jobs whose `run_at` its own stamp has
//! reached, and the stamp is this clock's reading when it was proposed.

use std::time::Duration;

use super::{LeaderState, Pending};
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::timers::{Timer, TimerKey};
use crate::coordinator::Event;
use crate::limits::DUE_JOBS_PER_ENTRY_MAX;
use crate::time::UnixMillis;

#[derive(Debug, Default)]
pub(super) struct DueJobs {
    /// The timer armed for the earliest `run_at`, and that `run_at`.
    armed: Option<(UnixMillis, TimerKey)>,
    /// A `Due` entry is proposed and not yet applied: nothing more is proposed until it is,
    /// so no job is named by two of them.
    in_flight: bool,
}

impl LeaderState {
    /// Queues what this leader's clock says is due, or arms the timer for the next `run_at`.
    /// Cheap enough to call whenever the earliest `run_at` may have changed.
    pub(in crate::coordinator) fn check_due(&mut self, m: &mut Member) {
        if self.due.in_flight {
            return;
        }
        let now = m.wall_now();
        let job_ids = m.table.due_by(now, DUE_JOBS_PER_ENTRY_MAX);
        if !job_ids.is_empty() {
            self.due.in_flight = true;
            let proposal = self.propose(m, Command::Due { job_ids }, Some(Pending::Due));
            // `propose` stamps the entry with this same clock reading, so apply finds every
            // job it names due.
            assert_eq!(
                m.replica.log().get(proposal.index).map(|e| e.at),
                Some(now),
                "a Due entry stamped other than the clock that found its jobs due"
            );
            return;
        }
        let Some(next) = m.table.next_run_at() else {
            self.disarm_due();
            return;
        };
        if self.due.armed.is_some_and(|(at, _)| at == next) {
            return;
        }
        self.disarm_due();
        let wait = Duration::from_millis(next.0.saturating_sub(now.0));
        let key = self.timers.arm(m.now.saturating_add(wait), Timer::RunAtDue);
        self.due.armed = Some((next, key));
    }

    /// The timer for the earliest `run_at` fired.
    pub(super) fn run_at_due(&mut self, m: &mut Member) {
        self.due.armed = None;
        self.check_due(m);
    }

    /// A `Due` entry applied: `queued` of its jobs were queued. If it was ours, the next batch
    /// may go.
    pub(super) fn on_due_checked(
        &mut self,
        m: &mut Member,
        pending: Option<&Pending>,
        queued: u64,
    ) {
        if queued > 0 {
            let scheduled = m.table.scheduled_jobs();
            m.event(Event::ScheduledJobsDue { queued, scheduled });
        }
        if matches!(pending, Some(Pending::Due)) {
            self.due.in_flight = false;
        }
        self.check_due(m);
    }

    /// The wall clock was read anew (it may have jumped): the timer is armed again from it.
    pub(in crate::coordinator) fn wall_clock_moved(&mut self, m: &mut Member) {
        self.disarm_due();
        self.check_due(m);
    }

    fn disarm_due(&mut self) {
        if let Some((_, key)) = self.due.armed.take() {
            self.timers.disarm(key);
        }
    }
}
