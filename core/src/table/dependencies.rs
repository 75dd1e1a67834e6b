//! Dependencies: a job that names others in `after` is `BLOCKED` until every one of them is
//! terminal, then queued (or scheduled, if its `run_at` is still ahead); if one of them ends
//! `FAILED` or `CANCELLED` it is cancelled with that reason, unless it asked to run after any
//! outcome; one it names that the table does not hold (never submitted, or purged) cancels it
//! too, whatever it asked, since how that one ended is not known. A cancel spreads along the graph: a cancelled job's own dependents are judged in
//! the same entry.
//!
//! The index of who waits for whom (`dependents`: a job not yet terminal -> the `BLOCKED` jobs
//! waiting for it) is derived from the rows, rebuilt on load and checked by
//! `check_invariants`, never stored on its own.

use super::{transition, Applied, JobTable};
use crate::ids::JobId;
use crate::job::{Job, JobState};

/// How a blocked job stands against the jobs it names.
enum Verdict {
    /// One it names ended badly and it did not ask to run anyway.
    Cancel {
        because: String,
    },
    /// Every one it names is terminal.
    Release,
    Wait,
}

impl JobTable {
    /// The `BLOCKED` jobs waiting for `job_id`.
    pub fn dependents_of(&self, job_id: &JobId) -> impl Iterator<Item = JobId> + '_ {
        self.dependents.get(job_id).into_iter().flatten().copied()
    }

    /// `job_id` (in the table, `BLOCKED`) waits for each job it names that is not terminal
    /// yet; then, in case none is, it is judged at once.
    pub(super) fn block(&mut self, job_id: JobId, follow_on: &mut Vec<Applied>) {
        let parents = self.job_mut(job_id).after.clone();
        for parent in parents {
            if self
                .jobs
                .get(&parent)
                .is_some_and(|p| !p.state.is_terminal())
            {
                self.dependents.entry(parent).or_default().insert(job_id);
            }
        }
        self.judge_dependents_of(vec![job_id], follow_on, true);
    }

    /// `job_id` leaves `BLOCKED` (released or cancelled): it no longer waits for anyone.
    pub(super) fn unblock(&mut self, job_id: JobId) {
        let parents = self.job_mut(job_id).after.clone();
        for parent in parents {
            if let Some(children) = self.dependents.get_mut(&parent) {
                children.remove(&job_id);
                if children.is_empty() {
                    self.dependents.remove(&parent);
                }
            }
        }
    }

    /// The jobs of this entry that became terminal: the jobs waiting for them are judged
    /// (and, when that cancels them, theirs in turn).
    pub(super) fn settle_dependents(&mut self, changed: Vec<JobId>, follow_on: &mut Vec<Applied>) {
        let ended: Vec<JobId> = changed
            .into_iter()
            .filter(|id| self.dependents.contains_key(id))
            .filter(|id| self.jobs.get(id).is_some_and(|j| j.state.is_terminal()))
            .collect();
        if !ended.is_empty() {
            self.judge_dependents_of(ended, follow_on, false);
        }
    }

    /// Judges the jobs waiting for each of `jobs` (or, with `themselves`, those jobs), and
    /// follows every cancel it makes to the jobs waiting for that one.
    fn judge_dependents_of(
        &mut self,
        jobs: Vec<JobId>,
        follow_on: &mut Vec<Applied>,
        themselves: bool,
    ) {
        let mut to_judge: Vec<JobId> = if themselves {
            jobs
        } else {
            jobs.iter()
                .filter_map(|id| self.dependents.remove(id))
                .flatten()
                .collect()
        };
        // Each cancel makes one more job terminal, once: the walk ends.
        while let Some(child) = to_judge.pop() {
            let Some(job) = self.jobs.get(&child) else {
                panic!("blocked job {child} vanished during apply");
            };
            if job.state != JobState::Blocked {
                continue; // judged already, through another job it waited for
            }
            // A job it names that is gone was purged: at its creation, before this job
            // could see how it ended; later, after it ended in a way this job was judged by.
            match self.verdict(job, themselves) {
                Verdict::Wait => {}
                Verdict::Release => {
                    self.unblock(child);
                    self.release(child);
                    follow_on.push(Applied::Unblocked { job_id: child });
                }
                Verdict::Cancel { because } => {
                    let cancelled = self.cancel_one(child, &because);
                    follow_on.extend(cancelled);
                    to_judge.extend(self.dependents.remove(&child).into_iter().flatten());
                }
            }
        }
    }

    /// How `job` stands. A job it names that the table does not hold was never submitted or
    /// was purged (only a terminal job is). When `job` is new, how that one ended is not known,
    /// so it does not run, whatever it asked. Later, one purged since ended while `job` waited,
    /// and `job` was judged by that end then (cancelled, had it ended badly): it counts as
    /// ended.
    fn verdict(&self, job: &Job, new: bool) -> Verdict {
        let mut all_ended = true;
        for parent in &job.after {
            match self.jobs.get(parent).map(|p| p.state) {
                None if !new => {}
                None => {
                    return Verdict::Cancel {
                        because: format!(
                            "job {parent} it waits for is not known (never submitted, or purged)"
                        ),
                    };
                }
                Some(state @ (JobState::Failed | JobState::Cancelled))
                    if !job.after_any_outcome =>
                {
                    return Verdict::Cancel {
                        because: format!("job {parent} it waited for ended {state}"),
                    };
                }
                Some(state) if !state.is_terminal() => all_ended = false,
                _ => {}
            }
        }
        if all_ended {
            Verdict::Release
        } else {
            Verdict::Wait
        }
    }

    /// A blocked job whose jobs all ended: scheduled if its time is still ahead of this
    /// entry's stamp, queued otherwise.
    fn release(&mut self, job_id: JobId) {
        let at = self.entry_at;
        let job = self.job_mut(job_id);
        match job.run_at.filter(|run_at| *run_at > at) {
            Some(run_at) => {
                transition(job, JobState::Scheduled);
                self.schedule(job_id, run_at);
            }
            None => self.enqueue(job_id),
        }
    }
}
