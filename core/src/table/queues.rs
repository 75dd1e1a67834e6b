//! `SetQueue`, and creating a queue for its first job.

use super::{Applied, JobTable};
use crate::ids::JobId;
use crate::limits::QUEUES_MAX;
use crate::queues::{HeldBack, QueueChange, QueueSettings, QueueState};
use crate::time::UnixMillis;

impl JobTable {
    pub(super) fn apply_set_queue(&mut self, queue: &str, change: &QueueChange) -> Applied {
        let refused = |reason: String, full: bool| Applied::QueueRefused {
            queue: queue.to_owned(),
            reason,
            full,
        };
        if let Err(reason) = crate::queues::check_queue_name(queue).and(change.check()) {
            return refused(reason, false);
        }
        if !self.queues.contains_key(queue) {
            if let Err(reason) = self.create_queue(queue) {
                return refused(reason, true);
            }
        }
        let state = self.queues.get_mut(queue).expect("created above");
        let resumed = state.settings.paused && change.paused == Some(false);
        let reset = change.apply_to(&mut state.settings);
        if reset.queue {
            // A rate limit set (or removed) starts from a full bucket.
            state.rate_tat_micros = 0;
        }
        self.queues_changed.insert(queue.to_owned());
        if reset.keys {
            self.reset_key_rates(queue);
        }
        if resumed {
            self.rejoin(queue);
        }
        Applied::QueueSet {
            queue: queue.to_owned(),
        }
    }

    /// The rule of `queue` that holds every job of it back from a start at `at`, counting
    /// `starting` more starts on their way: paused, at its concurrency limit, or no token in
    /// its rate bucket (with when the next is due). A per-key limit holds back the jobs of one
    /// key, not the queue (`key_held_back`). The leader asks before it proposes a start (with its
    /// starts in flight, at its clock); apply asks again (with none, at the entry's stamp).
    pub fn queue_held_back(
        &self,
        queue: &str,
        starting: u64,
        at: UnixMillis,
    ) -> Option<(HeldBack, Option<UnixMillis>)> {
        let state = self.queues.get(queue)?;
        if state.settings.paused {
            return Some((HeldBack::Paused, None));
        }
        if self.queue_full(queue, starting) {
            return Some((HeldBack::Concurrency, None));
        }
        let rate = state.settings.rate?;
        let due = rate.blocked_until(state.rate_tat_micros, at, starting)?;
        Some((HeldBack::Rate, Some(due)))
    }

    /// The per-key rule of `queue` that holds back the jobs of fairness key `key` from a start
    /// at `at`, counting `starting` more starts of the key on their way: its concurrency
    /// limit, then its rate (with when the next token is due). Jobs without a key are held by
    /// neither. Asked like `queue_held_back`, by the leader and again by apply.
    pub fn key_held_back(
        &self,
        queue: &str,
        key: Option<&str>,
        starting: u64,
        at: UnixMillis,
    ) -> Option<(HeldBack, Option<UnixMillis>)> {
        if self.key_full(queue, key, starting) {
            return Some((HeldBack::KeyConcurrency, None));
        }
        let due = self.key_rate_due(queue, key, starting, at)?;
        Some((HeldBack::KeyRate, Some(due)))
    }

    /// A `Submit` for `job_id` taking `slots` jobs may name `queue`: it exists, or there is
    /// room to create it, and its unfinished jobs stay within its admission limit.
    pub(super) fn admit_queue(
        &self,
        job_id: JobId,
        queue: &str,
        slots: u64,
    ) -> Result<(), Applied> {
        let Some(state) = self.queues.get(queue) else {
            if self.queues.len() < QUEUES_MAX {
                return Ok(());
            }
            return Err(Applied::TooManyQueues {
                job_id,
                queues: self.queues.len() as u64,
            });
        };
        let active_jobs = self.active_in(queue);
        match state.settings.max_active_jobs {
            Some(limit) if active_jobs.saturating_add(slots) > limit => {
                Err(Applied::QueueAdmissionRejected {
                    job_id,
                    queue: queue.to_owned(),
                    active_jobs,
                    max_active_jobs: limit,
                })
            }
            _ => Ok(()),
        }
    }

    /// Creates `queue` with the default settings if it is new, at the smallest pass of the busy
    /// queues (it has no credit to bank); an error if the table holds `QUEUES_MAX` already.
    pub(super) fn create_queue(&mut self, queue: &str) -> Result<(), String> {
        if self.queues.contains_key(queue) {
            return Ok(());
        }
        if self.queues.len() >= QUEUES_MAX {
            return Err(format!(
                "the cluster holds its maximum of {QUEUES_MAX} queues"
            ));
        }
        let pass = self.floor_pass(queue).unwrap_or(0);
        self.queues.insert(
            queue.to_owned(),
            QueueState {
                name: queue.to_owned(),
                settings: QueueSettings::default(),
                pass,
                rate_tat_micros: 0,
                key_clock_micros: 0,
            },
        );
        self.queues_changed.insert(queue.to_owned());
        Ok(())
    }
}
