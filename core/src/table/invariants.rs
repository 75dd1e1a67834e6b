//! The table's promises, checked as a whole: every row on its own, the derived indexes (queue,
//! idempotency keys, admission counter, finished index) against the rows, and each
//! data-parallel job against its partitions. Tests and the simulator call
//! `check_invariants` after every step; loading and applying check each row they touch.

use std::collections::BTreeSet;

use super::{JobTable, ScopedKey};
use crate::ids::JobId;
use crate::job::{Job, JobState, PartitionOf};
use crate::limits::ATTEMPT_HISTORY_MAX;

impl JobTable {
    /// Checks every invariant the table promises (2, 4, 5, 6 of docs/SIMULATION.md). Used by
    /// tests and the simulator after every step; `Err` names the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut active = 0;
        let mut queued = BTreeSet::new();
        let mut finished = BTreeSet::new();
        let mut scheduled = BTreeSet::new();
        for job in self.jobs.values() {
            if job.state == JobState::Scheduled {
                scheduled.insert((job.run_at.unwrap_or_default(), job.id));
            }
            check_row(job).map_err(|detail| format!("job {}: {detail}", job.id))?;
            if !job.state.is_terminal() {
                active += 1;
            } else if job.partition_of.is_none() {
                finished.insert((job.finished_at.unwrap_or_default(), job.id));
            }
            if job.state == JobState::Queued {
                queued.insert(job.id);
                if !self
                    .queue
                    .holds(job.queue_seq, job.id, &job.placement(), job.turn)
                {
                    return Err(format!(
                        "queued job {} is missing from the queue or filed under another place or turn",
                        job.id
                    ));
                }
                if !self.queues.contains_key(&job.queue) {
                    return Err(format!(
                        "queued job {} names queue {:?}, which the table does not hold",
                        job.id, job.queue
                    ));
                }
            }
            self.check_partitions(job)?;
            if let Some(key) = ScopedKey::of(job) {
                if self.idempotency.get(&key) != Some(&job.id) {
                    return Err(format!(
                        "job {} has key {key} but the index disagrees",
                        job.id
                    ));
                }
            }
        }
        if active != self.active {
            return Err(format!(
                "admission counter is {} but {} jobs are non-terminal",
                self.active, active
            ));
        }
        let usage = super::QueueUsage::of_rows(self.jobs.values());
        if usage != self.usage {
            return Err(format!(
                "queue usage is counted {:?} but the rows hold {usage:?}",
                self.usage
            ));
        }
        self.queue.check()?;
        self.check_key_rates()?;
        let in_queue: BTreeSet<JobId> = self.queue.iter().collect();
        if in_queue != queued || self.queue.len() != queued.len() {
            return Err(format!(
                "queue holds {} entries but {} jobs are QUEUED",
                self.queue.len(),
                queued.len()
            ));
        }
        self.check_dependents()?;
        if scheduled != self.scheduled {
            return Err(format!(
                "the index of scheduled jobs holds {} entries but {} jobs are SCHEDULED at their run_at",
                self.scheduled.len(),
                scheduled.len()
            ));
        }
        if finished != self.finished {
            return Err(format!(
                "the finished index holds {} jobs but {} top-level jobs are terminal",
                self.finished.len(),
                finished.len()
            ));
        }
        for (key, job_id) in &self.idempotency {
            match self.jobs.get(job_id) {
                Some(job) if ScopedKey::of(job).as_ref() == Some(key) => {}
                _ => {
                    return Err(format!(
                        "idempotency key {key} points at job {job_id} without it"
                    ))
                }
            }
        }
        Ok(())
    }

    /// The index of who waits for whom holds exactly each blocked job under each job it names
    /// that has not ended, and a blocked job still has one to wait for, none of which ended
    /// badly unless it runs after any outcome (it would have been released or cancelled). One
    /// it names may be gone: purged once it ended.
    fn check_dependents(&self) -> Result<(), String> {
        let mut derived: std::collections::BTreeMap<JobId, BTreeSet<JobId>> = Default::default();
        for job in self.jobs.values().filter(|j| j.state == JobState::Blocked) {
            let mut waiting = false;
            for parent in &job.after {
                match self.jobs.get(parent).map(|p| p.state) {
                    Some(state) if !state.is_terminal() => {
                        waiting = true;
                        derived.entry(*parent).or_default().insert(job.id);
                    }
                    Some(JobState::Failed | JobState::Cancelled) if !job.after_any_outcome => {
                        return Err(format!(
                            "job {} is BLOCKED though job {parent} it waits for ended badly",
                            job.id
                        ));
                    }
                    _ => {}
                }
            }
            if !waiting {
                return Err(format!(
                    "job {} is BLOCKED with every job it waits for ended",
                    job.id
                ));
            }
        }
        if derived != self.dependents {
            return Err(format!(
                "the index of waiting jobs holds {} jobs waited for, the rows {}",
                self.dependents.len(),
                derived.len()
            ));
        }
        Ok(())
    }

    /// A partition and its parent point at each other; a partition runs only while its parent
    /// does; a completed parent has every partition completed, a failed or cancelled one none
    /// still running; a running parent still has a partition to wait for.
    fn check_partitions(&self, job: &Job) -> Result<(), String> {
        if let Some(of) = job.partition_of {
            let parent = self.jobs.get(&of.parent).ok_or_else(|| {
                format!("partition {} names a missing parent {}", job.id, of.parent)
            })?;
            if parent.partitions.get(of.index as usize) != Some(&job.id) {
                return Err(format!(
                    "partition {} claims index {} of job {}, which does not list it there",
                    job.id, of.index, of.parent
                ));
            }
            if !job.state.is_terminal() && parent.state != JobState::Running {
                return Err(format!(
                    "partition {} is {} but its job {} is {}",
                    job.id, job.state, of.parent, parent.state
                ));
            }
        }
        if !job.is_parent() {
            return Ok(());
        }
        let mut completed = 0;
        for (index, id) in job.partitions.iter().enumerate() {
            let part = self
                .jobs
                .get(id)
                .ok_or_else(|| format!("job {} lists a missing partition {id}", job.id))?;
            if part.partition_of
                != Some(PartitionOf {
                    parent: job.id,
                    index: index as u32,
                })
            {
                return Err(format!(
                    "job {} lists {id} as partition {index}, which says {:?}",
                    job.id, part.partition_of
                ));
            }
            if part.state == JobState::Completed {
                completed += 1;
            }
            if job.state.is_terminal() && !part.state.is_terminal() {
                return Err(format!(
                    "job {} is {} while its partition {index} ({id}) is {}",
                    job.id, job.state, part.state
                ));
            }
        }
        let all = job.partitions.len();
        match job.state {
            JobState::Completed if completed != all => Err(format!(
                "job {} is COMPLETED with {completed} of {all} partitions completed",
                job.id
            )),
            JobState::Running if completed == all => Err(format!(
                "job {} is still RUNNING although all {all} partitions completed",
                job.id
            )),
            _ => Ok(()),
        }
    }
}

/// A job's history agrees with its state: only the last record may be open, and it is open
/// exactly while the job runs under that record's lease; no record ends before it starts.
/// (A row written before jobs kept a history has none, and is not checked.)
fn check_history(job: &Job) -> Result<(), String> {
    if job.history.len() > ATTEMPT_HISTORY_MAX {
        return Err(format!("{} history records", job.history.len()));
    }
    let Some(last) = job.history.last() else {
        return Ok(());
    };
    for record in &job.history[..job.history.len() - 1] {
        if record.outcome.is_none() {
            return Err(format!(
                "attempt {} is open but not the latest",
                record.lease_id
            ));
        }
    }
    for record in &job.history {
        if record.outcome.is_some() != record.ended_at_unix_ms.is_some()
            || record
                .ended_at_unix_ms
                .is_some_and(|end| end < record.started_at_unix_ms)
        {
            return Err(format!(
                "attempt {} ends at {:?} with outcome {:?}",
                record.lease_id, record.ended_at_unix_ms, record.outcome
            ));
        }
    }
    match (&job.lease, last.outcome) {
        (Some(lease), None) if lease.id == last.lease_id && lease.worker == last.worker => {}
        (None, Some(_)) => {}
        (lease, outcome) => {
            return Err(format!(
                "lease {:?} but the latest record is {} ({outcome:?})",
                lease.as_ref().map(|l| l.id),
                last.lease_id
            ))
        }
    }
    // Every charged attempt has a record (released ones have records too, uncharged).
    let records = job.history.len() + job.history_dropped as usize;
    if (job.attempt.0 as usize) > records {
        return Err(format!(
            "attempt {} with only {records} attempts recorded",
            job.attempt
        ));
    }
    if job.first_started_at.is_none() {
        return Err("attempts recorded but no first start".into());
    }
    Ok(())
}

/// The per-row invariants: lease exactly while running, attempt within budget, a result exactly
/// when completed. A data-parallel parent never holds a lease or starts an attempt.
pub(super) fn check_row(job: &Job) -> Result<(), String> {
    check_history(job)?;
    if job.max_attempts == 0 {
        return Err("max_attempts is 0".into());
    }
    if !job.state.is_terminal() && job.finished_at.is_some() {
        return Err(format!("{} with a finish time", job.state));
    }
    if job.state == JobState::Blocked
        && (job.after.is_empty()
            || job.attempt.0 != 0
            || job.is_parent()
            || job.partition_of.is_some())
    {
        return Err(format!(
            "blocked with {} jobs to wait for, attempt {}",
            job.after.len(),
            job.attempt
        ));
    }
    if job.state == JobState::Scheduled
        && (job.run_at.is_none()
            || job.attempt.0 != 0
            || job.is_parent()
            || job.partition_of.is_some())
    {
        return Err(format!(
            "scheduled with run_at {:?}, attempt {}, data-parallel = {}",
            job.run_at,
            job.attempt,
            job.is_parent() || job.partition_of.is_some()
        ));
    }
    if job.is_parent() {
        if job.lease.is_some() || job.attempt.0 != 0 || job.state == JobState::Queued {
            return Err(format!(
                "data-parallel parent {} with attempt {} and lease {:?}",
                job.state,
                job.attempt,
                job.lease.as_ref().map(|l| l.id)
            ));
        }
        if (job.state == JobState::Completed) != job.result.is_some() {
            return Err(format!(
                "parent {} with result present = {}",
                job.state,
                job.result.is_some()
            ));
        }
        return Ok(());
    }
    if job.attempt.0 > job.max_attempts {
        return Err(format!(
            "attempt {} exceeds max_attempts {}",
            job.attempt, job.max_attempts
        ));
    }
    if (job.state == JobState::Running) != job.lease.is_some() {
        return Err(format!(
            "state {} with lease {:?}",
            job.state,
            job.lease.as_ref().map(|l| l.id)
        ));
    }
    if job.state == JobState::Running && job.attempt.0 == 0 {
        return Err("running with attempt 0".into());
    }
    // A job waiting for another attempt must have one left (the last failure ends it).
    if matches!(job.state, JobState::Queued | JobState::RetryWait)
        && job.attempt.0 >= job.max_attempts
    {
        return Err(format!(
            "{} with every attempt used ({} of {})",
            job.state, job.attempt, job.max_attempts
        ));
    }
    if (job.state == JobState::Completed) != job.result.is_some() {
        return Err(format!(
            "state {} with result present = {}",
            job.state,
            job.result.is_some()
        ));
    }
    Ok(())
}
