//! Per-key rate limits: one token bucket for each fairness key of a queue that has one set.
//!
//! Each bucket is one number, its theoretical arrival time (see [`crate::queues::rate`]), moved
//! only by applied `Assign`s. A key's starts are timed by its queue's *key clock*: the latest
//! stamp any start of the queue carried, or the entry's stamp if later. Time by that clock
//! never runs backwards, so a bucket that has refilled by it is full for every later
//! judgement and is forgotten: the table holds buckets only for keys that started within about
//! one period, not for every key ever seen. Buckets are rows of their own, persisted and
//! carried by snapshots beside the job and queue rows.
//!
//! A key left without a token parks its lane (see [`crate::queues::index`]) until the token
//! is due, so the leader's picks do not walk keys that wait for their rate.

use std::collections::{BTreeMap, BTreeSet};

use super::JobTable;
use crate::ids::JobId;
use crate::queues::rate::micros;
use crate::queues::KeyBucket;
use crate::time::UnixMillis;

/// The buckets of every queue with a per-key rate, and which changed since they were last
/// persisted.
#[derive(Clone, Debug, Default)]
pub(super) struct KeyBuckets {
    queues: BTreeMap<String, QueueBuckets>,
    /// `(queue, key)` of every bucket set or forgotten since the last take.
    changed: BTreeSet<(String, String)>,
}

/// One queue's buckets, by key and by theoretical arrival time (to forget the refilled ones
/// first).
#[derive(Clone, Debug, Default)]
struct QueueBuckets {
    tats: BTreeMap<String, u64>,
    by_tat: BTreeSet<(u64, String)>,
}

impl KeyBuckets {
    /// The bucket of `key` in `queue`; `0` (full) if none is held.
    pub(super) fn tat(&self, queue: &str, key: &str) -> u64 {
        self.queues
            .get(queue)
            .and_then(|q| q.tats.get(key))
            .copied()
            .unwrap_or(0)
    }

    fn set(&mut self, queue: &str, key: &str, tat: u64) {
        if !self.queues.contains_key(queue) {
            self.queues
                .insert(queue.to_owned(), QueueBuckets::default());
        }
        let buckets = self.queues.get_mut(queue).expect("inserted above");
        if let Some(earlier) = buckets.tats.insert(key.to_owned(), tat) {
            assert!(buckets.by_tat.remove(&(earlier, key.to_owned())));
        }
        buckets.by_tat.insert((tat, key.to_owned()));
        self.changed.insert((queue.to_owned(), key.to_owned()));
    }

    /// Forgets the buckets of `queue` that are full by `clock`: the keys forgotten.
    fn forget_refilled(&mut self, queue: &str, clock: u64) -> Vec<String> {
        let Some(buckets) = self.queues.get_mut(queue) else {
            return Vec::new();
        };
        let mut forgotten = Vec::new();
        while buckets.by_tat.first().is_some_and(|(tat, _)| *tat <= clock) {
            let Some((_, key)) = buckets.by_tat.pop_first() else {
                break;
            };
            buckets.tats.remove(&key);
            self.changed.insert((queue.to_owned(), key.clone()));
            forgotten.push(key);
        }
        if buckets.tats.is_empty() {
            self.queues.remove(queue);
        }
        forgotten
    }

    /// Forgets every bucket of `queue` (its per-key rate was set anew or removed).
    fn forget_queue(&mut self, queue: &str) {
        if let Some(buckets) = self.queues.remove(queue) {
            for key in buckets.tats.into_keys() {
                self.changed.insert((queue.to_owned(), key));
            }
        }
    }

    /// Every bucket held, as rows.
    pub(super) fn rows(&self) -> impl Iterator<Item = KeyBucket> + '_ {
        self.queues.iter().flat_map(|(queue, buckets)| {
            buckets.tats.iter().map(|(key, tat)| KeyBucket {
                queue: queue.clone(),
                key: key.clone(),
                tat_micros: *tat,
            })
        })
    }

    pub(super) fn len(&self) -> usize {
        self.queues.values().map(|q| q.tats.len()).sum()
    }

    /// Loads one persisted bucket; `false` if the table already holds it.
    pub(super) fn load(&mut self, bucket: &KeyBucket) -> bool {
        if self.tat(&bucket.queue, &bucket.key) != 0 {
            return false;
        }
        self.set(&bucket.queue, &bucket.key, bucket.tat_micros);
        self.changed.clear();
        true
    }

    /// The two indexes agree.
    pub(super) fn check(&self) -> Result<(), String> {
        for (queue, buckets) in &self.queues {
            let agree = buckets.tats.len() == buckets.by_tat.len()
                && buckets
                    .by_tat
                    .iter()
                    .all(|(tat, key)| buckets.tats.get(key) == Some(tat));
            if !agree || buckets.tats.is_empty() {
                return Err(format!(
                    "the key buckets of queue {queue:?} are filed inconsistently"
                ));
            }
        }
        Ok(())
    }
}

impl JobTable {
    /// When `key`'s bucket in `queue` next has a token for a start at `at`, counting
    /// `starting` more starts of the key on their way; `None` if it has one now, or the queue
    /// has no per-key rate, or the job no key. Judged at `at` or the queue's key clock,
    /// whichever is later.
    pub fn key_rate_due(
        &self,
        queue: &str,
        key: Option<&str>,
        starting: u64,
        at: UnixMillis,
    ) -> Option<UnixMillis> {
        let key = key.filter(|key| !key.is_empty())?;
        let state = self.queues.get(queue)?;
        let rate = state.settings.key_rate?;
        let now = micros(at).max(state.key_clock_micros);
        rate.blocked_until_micros(self.key_buckets.tat(queue, key), now, starting)
    }

    /// The bucket of `key` in `queue`, if the table holds one.
    pub fn key_bucket(&self, queue: &str, key: &str) -> Option<u64> {
        Some(self.key_buckets.tat(queue, key)).filter(|tat| *tat != 0)
    }

    /// Every key bucket held, as rows.
    pub fn key_bucket_rows(&self) -> impl Iterator<Item = KeyBucket> + '_ {
        self.key_buckets.rows()
    }

    /// How many key buckets the table holds.
    pub fn key_bucket_count(&self) -> usize {
        self.key_buckets.len()
    }

    /// The key buckets set or forgotten since the last call, to be persisted.
    pub fn take_changed_key_buckets(&mut self) -> BTreeSet<(String, String)> {
        std::mem::take(&mut self.key_buckets.changed)
    }

    /// Lanes parked for their rate until `now` or earlier rejoin the turn order. Changes no
    /// replicated state: the leader calls it at its clock before it schedules, the table at
    /// each entry's stamp.
    pub fn release_rate_waits(&mut self, now: UnixMillis) {
        self.queue.release_parked(now);
    }

    /// `job_id` (in queue `queue`) started at this entry: the queue's key clock moves to the
    /// entry's stamp, the job's key takes a token from its bucket, buckets refilled by the
    /// clock are forgotten (their keys' lanes rejoin the turn order), and the key's lanes (of
    /// every kind) are parked if its bucket is left without a token.
    pub(super) fn key_rate_started(&mut self, job_id: JobId) {
        let Some(job) = self.jobs.get(&job_id) else {
            panic!("job {job_id} vanished during apply");
        };
        let Some(state) = self.queues.get_mut(&job.queue) else {
            panic!(
                "job {job_id} names queue {:?}, which the table does not hold",
                job.queue
            );
        };
        let clock = state.key_clock_micros.max(micros(self.entry_at));
        state.key_clock_micros = clock;
        debug_assert!(
            self.queues_changed.contains(&job.queue),
            "a start marks its queue's row changed before its key's bucket moves"
        );
        let rate = state.settings.key_rate;
        for key in self.key_buckets.forget_refilled(&job.queue, clock) {
            self.queue.release_key(&job.queue, &key);
        }
        let key = job.fairness_key.as_deref().filter(|key| !key.is_empty());
        let (Some(rate), Some(key)) = (rate, key) else {
            return;
        };
        let tat = self.key_buckets.tat(&job.queue, key);
        let Some(tat) = rate.admit_micros(tat, clock) else {
            panic!("job {job_id} started beyond its key's rate limit (checked before)");
        };
        let (queue, key) = (job.queue.clone(), key.to_owned());
        self.key_buckets.set(&queue, &key, tat);
        if let Some(until) = rate.blocked_until_micros(tat, clock, 0) {
            // The bucket is the key's in every task kind: so is the wait.
            self.queue.park_key(&queue, &key, until);
        }
    }

    /// `queue`'s per-key rate was set anew or removed: every key's bucket is full again, and
    /// every lane parked for it rejoins the turn order.
    pub(super) fn reset_key_rates(&mut self, queue: &str) {
        self.key_buckets.forget_queue(queue);
        self.queue.release_queue(queue);
    }

    /// The key buckets agree with their queues, and every parked lane truly waits: its key's
    /// bucket has no token until at least the time it is parked to.
    pub(super) fn check_key_rates(&self) -> Result<(), String> {
        self.key_buckets.check()?;
        for bucket in self.key_buckets.rows() {
            let Some(state) = self.queues.get(&bucket.queue) else {
                return Err(format!(
                    "a key bucket names queue {:?}, which is not held",
                    bucket.queue
                ));
            };
            if state.settings.key_rate.is_none() {
                return Err(format!(
                    "queue {:?} holds key buckets and has no per-key rate",
                    bucket.queue
                ));
            }
            if bucket.tat_micros <= state.key_clock_micros {
                return Err(format!(
                    "the bucket of key {:?} in queue {:?} has refilled by its clock and is kept",
                    bucket.key, bucket.queue
                ));
            }
        }
        for (until, _kind, queue, key) in self.queue.parked() {
            let due = self.key_rate_due(queue, Some(key), 0, UnixMillis(0));
            if due.is_none_or(|due| due < until) {
                return Err(format!(
                    "the lane of key {key:?} in queue {queue:?} is parked until {until:?}, and its bucket has a token from {due:?}"
                ));
            }
        }
        Ok(())
    }
}
