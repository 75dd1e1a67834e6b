//! What each queue uses now, against its limits: attempts running, in the queue and under each
//! fairness key, and jobs unfinished. Apply keeps it current; loading and the invariant checker
//! count it afresh from the rows, so it is derived state, never persisted.

use std::collections::BTreeMap;

use crate::job::Job;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct QueueUsage {
    /// Jobs holding a lease, by queue: what a concurrency limit counts, whichever leader
    /// started them.
    running: BTreeMap<String, u64>,
    /// Of those, the ones with a fairness key, by queue then key.
    running_by_key: BTreeMap<String, BTreeMap<String, u64>>,
    /// Jobs not yet terminal (a data-parallel parent and each partition count), by queue:
    /// what a queue's admission limit counts.
    active: BTreeMap<String, u64>,
}

impl QueueUsage {
    /// The usage the rows describe.
    pub(super) fn of_rows<'a>(jobs: impl IntoIterator<Item = &'a Job>) -> QueueUsage {
        let mut usage = QueueUsage::default();
        for job in jobs {
            if !job.state.is_terminal() {
                usage.admitted(job);
            }
            if job.lease.is_some() {
                usage.started(job);
            }
        }
        usage
    }

    pub(super) fn running(&self, queue: &str) -> u64 {
        self.running.get(queue).copied().unwrap_or(0)
    }

    pub(super) fn running_with_key(&self, queue: &str, key: &str) -> u64 {
        self.running_by_key
            .get(queue)
            .and_then(|keys| keys.get(key))
            .copied()
            .unwrap_or(0)
    }

    pub(super) fn active(&self, queue: &str) -> u64 {
        self.active.get(queue).copied().unwrap_or(0)
    }

    /// An attempt of `job` took a lease.
    pub(super) fn started(&mut self, job: &Job) {
        count_up(&mut self.running, &job.queue);
        if let Some(key) = &job.fairness_key {
            count_up(
                self.running_by_key.entry(job.queue.clone()).or_default(),
                key,
            );
        }
    }

    /// An attempt of `job` gave its lease up.
    pub(super) fn left(&mut self, job: &Job) {
        count_down(&mut self.running, &job.queue, "running", job);
        if let Some(key) = &job.fairness_key {
            let Some(keys) = self.running_by_key.get_mut(&job.queue) else {
                panic!(
                    "job {} left its lease with no attempt of its queue counted by key",
                    job.id
                );
            };
            count_down(keys, key, "running with its key", job);
            if keys.is_empty() {
                self.running_by_key.remove(&job.queue);
            }
        }
    }

    /// `job` was created, not yet terminal.
    pub(super) fn admitted(&mut self, job: &Job) {
        count_up(&mut self.active, &job.queue);
    }

    /// `job` became terminal.
    pub(super) fn ended(&mut self, job: &Job) {
        count_down(&mut self.active, &job.queue, "active", job);
    }
}

fn count_up(counts: &mut BTreeMap<String, u64>, name: &str) {
    match counts.get_mut(name) {
        Some(count) => *count += 1,
        None => {
            counts.insert(name.to_owned(), 1);
        }
    }
}

/// One fewer under `name`; a count that would go below zero is a bug in apply, caught in
/// every build (a wrapped count would lift a limit).
fn count_down(counts: &mut BTreeMap<String, u64>, name: &str, what: &str, job: &Job) {
    let Some(count) = counts.get_mut(name) else {
        panic!(
            "job {} of queue {:?} is counted out of {what} with none counted under {name:?}",
            job.id, job.queue
        );
    };
    *count -= 1;
    if *count == 0 {
        counts.remove(name);
    }
}
