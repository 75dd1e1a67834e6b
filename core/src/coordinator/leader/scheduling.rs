//! Scheduling at the leader: queued jobs onto free slots in the order of [`crate::queues`] —
//! across queues by weight, across fairness keys by turn, within a lane by priority with
//! ageing — each onto the least-loaded live worker that serves its kind and its queue, under a
//! fresh lease drawn from the member's seeded RNG. A paused queue starts nothing. A job whose
//! kind or queue no free worker serves waits without holding up the jobs behind it.
//!
//! The table's order moves only when an `Assign` applies (the queue's pass advances, the
//! lane's turn is consumed), but the leader proposes several before the first applies. So it
//! counts its assignments in flight by queue and by lane and picks past them, exactly as the
//! table will once they apply: a new leader, with nothing in flight, picks what the old one
//! would have.
//!
//! After the queued jobs come the fresh ones: plain jobs whose `Submit` is proposed and not
//! yet applied, highest priority first. Assigning one now puts its `Assign` in the same write
//! as its `Submit`, so a job that finds a slot free costs one commit before it starts instead
//! of two. Nothing leaves early: the worker hears of the assignment only when the `Assign`
//! applies, after the `Submit` before it in the log. If that `Submit` created no job (an
//! idempotent answer, a refusal at apply), the `Assign` finds no job and its slot is freed.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::LeaderState;
use crate::command::{Command, LogEntry};
use crate::coordinator::member::Member;
use crate::coordinator::WorkerEntry;
use crate::ids::{Incarnation, JobId, LeaseId, LogIndex, WorkerId};
use crate::job::Lease;
use crate::table::{Applied, JobTable, Outcome};

/// A plain job whose `Submit` this leader proposed at `at` and which has not applied yet.
#[derive(Clone, Debug)]
pub(super) struct FreshJob {
    pub(super) at: LogIndex,
    pub(super) job_id: JobId,
    pub(super) lane: Lane,
    pub(super) priority: u8,
}

/// The fresh jobs not yet assigned, in proposal (and so log) order. They are as many as the
/// submissions being written, which admission bounds.
#[derive(Debug, Default)]
pub(super) struct FreshJobs(VecDeque<FreshJob>);

impl FreshJobs {
    pub(super) fn proposed(&mut self, job: FreshJob) {
        assert!(
            self.0.back().is_none_or(|last| last.at < job.at),
            "fresh job {} proposed at {} after one at {:?}",
            job.job_id,
            job.at,
            self.0.back().map(|last| last.at)
        );
        self.0.push_back(job);
    }

    /// The entry at `index` applied: a fresh job proposed there is fresh no longer (it is in the
    /// table now, queued, or it was never created).
    pub(super) fn applied(&mut self, index: LogIndex, job_id: Option<JobId>) {
        let Some(front) = self.0.front() else {
            return;
        };
        // Entries apply in log order and each one applied is checked here, so no fresh job can
        // have been passed over.
        assert!(
            front.at >= index,
            "fresh job {} proposed at {} outlived the apply of that entry (now at {index})",
            front.job_id,
            front.at
        );
        if front.at == index {
            assert_eq!(
                Some(front.job_id),
                job_id,
                "entry {index} applied is not the submission proposed there"
            );
            self.0.pop_front();
        }
    }
}

/// Where a job is ordered: its kind, queue and fairness key (`""` for none).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Lane {
    pub(super) kind: String,
    pub(super) queue: String,
    pub(super) key: String,
}

/// The assignments proposed and not yet applied: by job, and counted by queue and by lane so
/// a pick can pass over them as the table will once they apply. Bounded by the leases the
/// workers can hold.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    /// Asked of every job a pick passes over, so a hash set (job ids are random enough to be
    /// their own hash; nothing iterates it, so its order cannot leak into a decision).
    /// With each, whether it is counted in its lane: a job is, exactly while it is queued there
    /// (a fresh job once its `Submit` applied, and not after a cancel took it out), so a pick
    /// never counts a turn the lane does not hold.
    jobs: HashMap<JobId, (Lane, bool), BuildHasherDefault<JobIdHasher>>,
    by_queue: BTreeMap<String, usize>,
    /// Kind, then queue, then key: looked up by borrowed names, with no allocation per pick.
    by_lane: BTreeMap<String, BTreeMap<String, BTreeMap<String, usize>>>,
}

/// Hashes a job id by its last eight bytes, which are random in every id Herder draws.
#[derive(Default)]
pub(super) struct JobIdHasher(u64);

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
    pub(super) fn contains(&self, job_id: &JobId) -> bool {
        self.jobs.contains_key(job_id)
    }

    fn in_queue(&self, queue: &str) -> usize {
        self.by_queue.get(queue).copied().unwrap_or(0)
    }

    fn in_lane(&self, kind: &str, queue: &str, key: &str) -> usize {
        self.by_lane
            .get(kind)
            .and_then(|queues| queues.get(queue))
            .and_then(|keys| keys.get(key))
            .copied()
            .unwrap_or(0)
    }

    /// An assignment of `job_id` was proposed; `queued` says whether the job is queued in its
    /// lane now (a fresh job is not yet).
    fn add(&mut self, job_id: JobId, lane: Lane, queued: bool) {
        count_up(&mut self.by_queue, &lane.queue);
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
    fn entered_lane(&mut self, job_id: &JobId) {
        if let Some((lane, counted)) = self.jobs.get_mut(job_id) {
            if !*counted {
                *counted = true;
                let lane = lane.clone();
                self.count_in_lane(&lane);
            }
        }
    }

    /// A job with an assignment in flight left its lane without starting (a cancel).
    fn left_lane(&mut self, job_id: &JobId) {
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
    fn remove(&mut self, job_id: &JobId) {
        let Some((lane, counted)) = self.jobs.remove(job_id) else {
            panic!("an assignment of {job_id} applied that this leader did not count in flight");
        };
        decrement(&mut self.by_queue, &lane.queue);
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
    pub(super) fn debug_check(&self) {
        if cfg!(debug_assertions) {
            let lanes: usize = self
                .by_lane
                .values()
                .flat_map(BTreeMap::values)
                .flat_map(BTreeMap::values)
                .sum();
            let queues: usize = self.by_queue.values().sum();
            let counted = self.jobs.values().filter(|(_, counted)| *counted).count();
            assert!(
                lanes == counted && queues == self.jobs.len(),
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

impl LeaderState {
    /// An entry applied: a job whose `Submit` applied is no longer fresh, and an `Assign` is no
    /// longer in flight (if it found no job, the slot it was given is free again).
    pub(super) fn scheduling_applied(&mut self, entry: &LogEntry, outcome: &Outcome) {
        let applied = &outcome.applied;
        let submitted = match &entry.command {
            Command::Submit { job_id, .. } => Some(*job_id),
            _ => None,
        };
        self.fresh.applied(entry.index, submitted);
        // A job whose assignment is on its way entered its lane (a fresh job's `Submit`), or
        // left it without starting (cancelled, alone or with its data-parallel job).
        for change in std::iter::once(applied).chain(&outcome.follow_on) {
            match change {
                Applied::Submitted { job_id } => self.in_flight.entered_lane(job_id),
                Applied::Cancelled { job_id, .. } => self.in_flight.left_lane(job_id),
                _ => {}
            }
        }
        if let Command::Assign { job_id, lease, .. } = &entry.command {
            self.in_flight.remove(job_id);
            if let Applied::UnknownJob { .. } = applied {
                // A fresh job's `Submit` created no job: the slot it was given is free again.
                if let Some(worker) = self.registry.get_mut(&lease.worker) {
                    worker.free(lease.id);
                }
            }
        }
        self.in_flight.debug_check();
    }

    /// Fills free slots in queue order (see the module doc), kind by kind, while some worker
    /// with room serves a kind with queued jobs; then the fresh jobs.
    pub(in crate::coordinator) fn schedule(&mut self, m: &mut Member) {
        if m.replica.transferring_to().is_some() {
            // Handing over: let the log go quiet so the next leader can catch up.
            return;
        }
        // Each kind with a queued job, with the free slots of the workers serving it. The
        // kinds come from the workers (bounded by their registrations), not from the queue
        // (whose kinds clients choose).
        let mut room: BTreeMap<String, usize> = BTreeMap::new();
        for worker in self.registry.with_free_slots() {
            for kind in &worker.tasks {
                if m.table.queue_index().has_kind(kind) {
                    let free = worker.free_slots() as usize;
                    match room.get_mut(kind.as_str()) {
                        Some(room) => *room += free,
                        None => {
                            room.insert(kind.clone(), free);
                        }
                    }
                }
            }
        }
        for (kind, room) in room {
            self.schedule_kind(m, &kind, room);
        }
        self.schedule_fresh(m);
    }

    /// Up to `room` starts of `kind`: each time the queue with the smallest pass (counting the
    /// starts in flight) that has a job to start and a free worker to take it.
    fn schedule_kind(&mut self, m: &mut Member, kind: &str, mut room: usize) {
        let now = m.wall_now();
        // Queues with nothing more to start on this pass: paused, every job on its way, or no
        // free worker serving this kind takes work from them.
        let mut done: BTreeSet<String> = BTreeSet::new();
        while room > 0 {
            let Some((queue, aging_millis)) = self.next_queue(&m.table, kind, &done) else {
                return;
            };
            let in_flight = &self.in_flight;
            let picked = m.table.queue_index().pick(
                kind,
                &queue,
                now,
                aging_millis,
                |key| in_flight.in_lane(kind, &queue, key),
                |job_id| in_flight.contains(&job_id),
            );
            let Some(job_id) = picked else {
                done.insert(queue);
                continue;
            };
            let Some(job) = m.table.get(&job_id) else {
                panic!("the queue index holds job {job_id}, which the table does not");
            };
            let lane = Lane {
                kind: kind.to_owned(),
                queue: queue.clone(),
                key: job.fairness_key.clone().unwrap_or_default(),
            };
            // Partitions of one job go to distinct workers where capacity allows.
            let parent = job.partition_of.map(|of| of.parent);
            let Some(worker) = self.pick_worker(&m.table, kind, &queue, parent) else {
                done.insert(queue);
                continue;
            };
            self.assign(m, job_id, lane, worker);
            room -= 1;
        }
    }

    /// The queue to start a job of `kind` from next: the smallest pass once its starts in
    /// flight are counted, ties by name, among the queues not `done` and not paused. Its ageing
    /// bound with it. Walks the queues with a queued job of the kind (at most `QUEUES_MAX`),
    /// not their jobs or keys.
    fn next_queue(
        &self,
        table: &JobTable,
        kind: &str,
        done: &BTreeSet<String>,
    ) -> Option<(String, u64)> {
        let mut best: Option<(u64, &str, u64)> = None;
        for name in table.queue_index().queues_of(kind) {
            if done.contains(name) {
                continue;
            }
            let Some(queue) = table.queue_state(name) else {
                panic!("jobs are queued in {name:?}, which the table does not hold");
            };
            let in_flight = self.in_flight.in_queue(name) as u64;
            // Paused, or running its limit once the starts on their way are counted.
            if queue.settings.paused || table.queue_full(name, in_flight) {
                continue;
            }
            let pass = queue
                .pass
                .saturating_add(in_flight.saturating_mul(queue.settings.stride()));
            if best.is_none_or(|(best, _, _)| pass < best) {
                best = Some((pass, name, queue.settings.aging_millis));
            }
        }
        best.map(|(_, name, aging)| (name.to_owned(), aging))
    }

    /// The fresh jobs, highest priority first (then in proposal order), while some worker
    /// serving their kind and queue has room. A paused queue's fresh jobs wait to be queued.
    fn schedule_fresh(&mut self, m: &mut Member) {
        if self.fresh.0.is_empty() || self.registry.with_free_slots().next().is_none() {
            return;
        }
        let mut order: Vec<usize> = (0..self.fresh.0.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.fresh.0[i].priority));
        let mut full: BTreeSet<(String, String)> = BTreeSet::new();
        let mut taken = vec![false; self.fresh.0.len()];
        for i in order {
            let job = &self.fresh.0[i];
            let lane = job.lane.clone();
            let (job_id, place) = (job.job_id, (lane.kind.clone(), lane.queue.clone()));
            let in_flight = self.in_flight.in_queue(&lane.queue) as u64;
            if full.contains(&place)
                || m.table.queue_full(&lane.queue, in_flight)
                || m.table
                    .queue_state(&lane.queue)
                    .is_some_and(|q| q.settings.paused)
            {
                continue;
            }
            match self.pick_worker(&m.table, &lane.kind, &lane.queue, None) {
                Some(worker) => {
                    self.assign(m, job_id, lane, worker);
                    taken[i] = true;
                }
                None => {
                    full.insert(place);
                }
            }
        }
        let mut taken = taken.into_iter();
        self.fresh.0.retain(|_| !taken.next().unwrap_or(false));
    }

    /// The least-loaded worker with a free slot serving `kind` and `queue`, counting for a
    /// partition of `parent` how many of its siblings each worker already runs.
    fn pick_worker(
        &self,
        table: &JobTable,
        kind: &str,
        queue: &str,
        parent: Option<JobId>,
    ) -> Option<(WorkerId, Incarnation)> {
        let siblings_on = |worker: &WorkerEntry| match parent {
            Some(parent) => worker
                .leases
                .values()
                .filter(|id| {
                    table
                        .get(id)
                        .and_then(|job| job.partition_of)
                        .is_some_and(|of| of.parent == parent)
                })
                .count(),
            None => 0,
        };
        let worker = self.registry.least_loaded_for(kind, queue, siblings_on)?;
        assert!(
            worker.serves(kind) && worker.serves_queue(queue) && worker.takes_work(),
            "scheduled a {kind} job of queue {queue:?} onto worker {}, which does not serve it or takes no work",
            worker.id
        );
        Some((worker.id.clone(), worker.incarnation))
    }

    /// Proposes `job_id`'s next attempt on `worker` under a fresh lease.
    fn assign(
        &mut self,
        m: &mut Member,
        job_id: JobId,
        lane: Lane,
        worker: (WorkerId, Incarnation),
    ) {
        let (worker_id, incarnation) = worker;
        let lease = Lease {
            id: LeaseId::random(&mut m.rng),
            worker: worker_id.clone(),
            incarnation,
        };
        if let Some(entry) = self.registry.get_mut(&worker_id) {
            let earlier = entry.leases.insert(lease.id, job_id);
            assert!(earlier.is_none(), "lease {} handed out twice", lease.id);
            assert!(
                entry.leases.len() <= entry.lease_bound(),
                "worker {worker_id} given {} leases; it has {} slots and prefetches {}",
                entry.leases.len(),
                entry.capacity,
                entry.prefetch
            );
        }
        // A fresh job is not in the table yet: it enters its lane when its `Submit` applies.
        let queued = m
            .table
            .get(&job_id)
            .is_some_and(|job| job.state == crate::job::JobState::Queued);
        self.in_flight.add(job_id, lane, queued);
        let as_of = m.table.applied_index();
        self.propose(
            m,
            Command::Assign {
                job_id,
                lease,
                as_of,
            },
            None,
        );
    }
}
