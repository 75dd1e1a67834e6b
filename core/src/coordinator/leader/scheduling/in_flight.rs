//! The assignments this leader proposed that have not applied yet, counted the ways a pick
//! must pass over them: by job, by queue, by lane and by fairness key.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::ids::JobId;

/// Where a job is ordered: its kind, queue and fairness key (`""` for none).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::coordinator::leader) struct Lane {
    pub(in crate::coordinator::leader) kind: String,
    pub(in crate::coordinator::leader) queue: String,
    pub(in crate::coordinator::leader) key: String,
}

/// The assignments proposed and not yet applied: by job, and counted by queue and by lane so
/// a pick can pass over them as the table will once they apply. Bounded by the leases the
/// workers can hold.
#[derive(Debug, Default)]
pub(in crate::coordinator::leader) struct InFlight {
    /// Asked of every job a pick passes over, so a hash set (job ids are random enough to be
    /// their own hash; nothing iterates it, so its order cannot leak into a decision).
    /// With each, whether it is counted in its lane: a job is, exactly while it is queued there
    /// (a fresh job once its `Submit` applied, and not after a cancel took it out), so a pick
    /// never counts a turn the lane does not hold.
    jobs: HashMap<JobId, (Lane, bool), BuildHasherDefault<JobIdHasher>>,
    by_queue: BTreeMap<String, usize>,
    /// Kind, then queue, then key: looked up by borrowed names, with no allocation per pick.
    by_lane: BTreeMap<String, BTreeMap<String, BTreeMap<String, usize>>>,
    /// Queue, then fairness key, for the jobs with one, whatever their kind and whether
    /// queued or fresh: what a per-key limit counts.
    by_key: BTreeMap<String, BTreeMap<String, usize>>,
}

/// Hashes a job id by its last eight bytes, which are random in every id Herder draws.
#[derive(Default)]
struct JobIdHasher(u64);

impl Hasher for JobIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes.iter().rev().take(8).rev() {
            self.0 = (self.0 << 8) | u64::from(byte);
        }
    }
}

impl InFlight {
    pub(in crate::coordinator::leader) fn contains(&self, job_id: &JobId) -> bool {
        self.jobs.contains_key(job_id)
    }

    pub(super) fn in_queue(&self, queue: &str) -> usize {
        self.by_queue.get(queue).copied().unwrap_or(0)
    }

    pub(super) fn in_lane(&self, kind: &str, queue: &str, key: &str) -> usize {
        self.by_lane
            .get(kind)
            .and_then(|queues| queues.get(queue))
            .and_then(|keys| keys.get(key))
            .copied()
            .unwrap_or(0)
    }

    /// Assignments in flight of `queue`'s jobs with fairness key `key`.
    pub(super) fn with_key(&self, queue: &str, key: &str) -> usize {
        self.by_key
            .get(queue)
            .and_then(|keys| keys.get(key))
            .copied()
            .unwrap_or(0)
    }

    /// An assignment of `job_id` was proposed; `queued` says whether the job is queued in its
    /// lane now (a fresh job is not yet).
    pub(super) fn add(&mut self, job_id: JobId, lane: Lane, queued: bool) {
        count_up(&mut self.by_queue, &lane.queue);
        if !lane.key.is_empty() {
            let keys = match self.by_key.get_mut(&lane.queue) {
                Some(keys) => keys,
                None => self.by_key.entry(lane.queue.clone()).or_default(),
            };
            count_up(keys, &lane.key);
        }
        if queued {
            self.count_in_lane(&lane);
        }
        let earlier = self.jobs.insert(job_id, (lane, queued));
        assert!(
            earlier.is_none(),
            "job {job_id} assigned while an assignment of it is in flight"
        );
    }

    /// A job with an assignment in flight entered its lane (its `Submit` applied).
    pub(super) fn entered_lane(&mut self, job_id: &JobId) {
        if let Some((lane, counted)) = self.jobs.get_mut(job_id) {
            if !*counted {
                *counted = true;
                let lane = lane.clone();
                self.count_in_lane(&lane);
            }
        }
    }

    /// A job with an assignment in flight left its lane without starting (a cancel).
    pub(super) fn left_lane(&mut self, job_id: &JobId) {
        if let Some((lane, counted)) = self.jobs.get_mut(job_id) {
            if *counted {
                *counted = false;
                let lane = lane.clone();
                self.uncount_in_lane(&lane);
            }
        }
    }

    fn count_in_lane(&mut self, lane: &Lane) {
        let queues = match self.by_lane.get_mut(&lane.kind) {
            Some(queues) => queues,
            None => self.by_lane.entry(lane.kind.clone()).or_default(),
        };
        let keys = match queues.get_mut(&lane.queue) {
            Some(keys) => keys,
            None => queues.entry(lane.queue.clone()).or_default(),
        };
        count_up(keys, &lane.key);
    }

    /// The assignment of `job_id` applied (or found no job).
    pub(super) fn remove(&mut self, job_id: &JobId) {
        let Some((lane, counted)) = self.jobs.remove(job_id) else {
            panic!("an assignment of {job_id} applied that this leader did not count in flight");
        };
        decrement(&mut self.by_queue, &lane.queue);
        if !lane.key.is_empty() {
            let Some(keys) = self.by_key.get_mut(&lane.queue) else {
                panic!("nothing counted in flight by key in queue {:?}", lane.queue);
            };
            decrement(keys, &lane.key);
            if keys.is_empty() {
                self.by_key.remove(&lane.queue);
            }
        }
        if counted {
            self.uncount_in_lane(&lane);
        }
    }

    fn uncount_in_lane(&mut self, lane: &Lane) {
        let queues = self.by_lane.get_mut(&lane.kind);
        let keys = queues.and_then(|queues| queues.get_mut(&lane.queue));
        let Some(keys) = keys else {
            panic!("nothing counted in flight in lane {lane:?}");
        };
        decrement(keys, &lane.key);
        if keys.is_empty() {
            let queues = self.by_lane.get_mut(&lane.kind).expect("looked up above");
            queues.remove(&lane.queue);
            if queues.is_empty() {
                self.by_lane.remove(&lane.kind);
            }
        }
    }

    /// The counts are the counts of the jobs.
    pub(in crate::coordinator::leader) fn debug_check(&self) {
        if cfg!(debug_assertions) {
            let lanes: usize = self
                .by_lane
                .values()
                .flat_map(BTreeMap::values)
                .flat_map(BTreeMap::values)
                .sum();
            let queues: usize = self.by_queue.values().sum();
            let keys: usize = self.by_key.values().flat_map(BTreeMap::values).sum();
            let counted = self.jobs.values().filter(|(_, counted)| *counted).count();
            let keyed = self
                .jobs
                .values()
                .filter(|(lane, _)| !lane.key.is_empty())
                .count();
            assert!(
                lanes == counted && queues == self.jobs.len() && keys == keyed,
                "{} assignments in flight, counted {lanes} by lane and {queues} by queue",
                self.jobs.len()
            );
        }
    }
}

/// One more under `key`, allocating its name only the first time.
fn count_up(counts: &mut BTreeMap<String, usize>, key: &str) {
    match counts.get_mut(key) {
        Some(count) => *count += 1,
        None => {
            counts.insert(key.to_owned(), 1);
        }
    }
}

fn decrement(counts: &mut BTreeMap<String, usize>, key: &str) {
    let count = counts
        .get_mut(key)
        .unwrap_or_else(|| panic!("nothing counted in flight under {key:?}"));
    *count -= 1;
    if *count == 0 {
        counts.remove(key);
    }
}
