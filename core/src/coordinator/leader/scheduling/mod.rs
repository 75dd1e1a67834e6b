//! Scheduling at the leader: queued jobs onto free slots in the order of [`crate::queues`] —
//! across queues by weight, across fairness keys by turn, within a lane by priority with
//! ageing — each onto the least-loaded live worker that serves its kind and its queue, under a
//! fresh lease drawn from the member's seeded RNG. A job whose kind or queue no free worker
//! serves waits without holding up the jobs behind it.
//!
//! A queue's rules hold jobs back: a paused queue starts nothing, a queue running its
//! concurrency limit nothing more, a fairness key running the queue's per-key limit nothing
//! more (its lane is passed over; the lanes passed are at most the attempts running), and a
//! queue or key whose rate bucket is empty nothing until a token is due, when a timer
//! schedules again. A key out of rate tokens has its lane parked by the table until its
//! token is due, so a pick walks past only the keys whose starts are still on their way.
//! The leader counts its own assignments in flight against every limit, and the table
//! checks every rule again when an `Assign` applies, so no leader — a deposed one included —
//! can start a job past one.
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

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::LeaderState;
use crate::command::{Command, LogEntry};
use crate::coordinator::events::Event;
use crate::coordinator::member::Member;
use crate::coordinator::timers::Timer;
use crate::coordinator::WorkerEntry;
use crate::ids::{Incarnation, JobId, LeaseId, WorkerId};
use crate::job::Lease;
use crate::queues::{Ageing, HeldBack};
use crate::table::{Applied, JobTable, Outcome};
use crate::time::{Instant, UnixMillis};

mod fresh;
mod in_flight;

pub(super) use fresh::{FreshJob, FreshJobs};
pub(super) use in_flight::{InFlight, Lane};

/// What scheduling keeps between passes.
#[derive(Debug, Default)]
pub(super) struct Scheduling {
    /// Jobs with an `Assign` in flight (queued, or fresh: their `Submit` not yet applied).
    pub(super) in_flight: InFlight,
    /// Plain jobs whose `Submit` is in flight, not yet assigned.
    pub(super) fresh: FreshJobs,
    /// When the armed `RateDue` timer fires, if one is armed.
    rate_wake: Option<Instant>,
    /// The queues a rule held back on the last pass, each with the first rule that did: a
    /// queue newly held back is an event (a limit reached with work waiting).
    held: BTreeMap<String, HeldBack>,
}

/// What one pass found holding queues back, and when the first rate token it waits for is due.
#[derive(Default)]
struct Pass {
    held: BTreeMap<String, HeldBack>,
    rate_due: Option<UnixMillis>,
}

impl Pass {
    fn hold(&mut self, queue: &str, why: HeldBack) {
        if !self.held.contains_key(queue) {
            self.held.insert(queue.to_owned(), why);
        }
    }

    /// The rule a table's answer names, noting when the token it waits for is due.
    fn held_by(&mut self, held: Option<(HeldBack, Option<UnixMillis>)>) -> Option<HeldBack> {
        let (why, due) = held?;
        self.rate_due = self.rate_due.into_iter().chain(due).min();
        Some(why)
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
        self.scheduling.fresh.applied(entry.index, submitted);
        // A job whose assignment is on its way entered its lane (a fresh job's `Submit`), or
        // left it without starting (cancelled, alone or with its data-parallel job).
        for change in std::iter::once(applied).chain(&outcome.follow_on) {
            match change {
                Applied::Submitted { job_id } => self.scheduling.in_flight.entered_lane(job_id),
                Applied::Cancelled { job_id, .. } => self.scheduling.in_flight.left_lane(job_id),
                _ => {}
            }
        }
        if let Command::Assign { job_id, lease, .. } = &entry.command {
            self.scheduling.in_flight.remove(job_id);
            if let Applied::UnknownJob { .. } = applied {
                // A fresh job's `Submit` created no job: the slot it was given is free again.
                if let Some(worker) = self.registry.get_mut(&lease.worker) {
                    worker.free(lease.id);
                }
            }
        }
        self.scheduling.in_flight.debug_check();
    }

    /// Fills free slots in queue order (see the module doc), kind by kind, while some worker
    /// with room serves a kind with queued jobs; then the fresh jobs.
    pub(in crate::coordinator) fn schedule(&mut self, m: &mut Member) {
        if m.replica.transferring_to().is_some() {
            // Handing over: let the log go quiet so the next leader can catch up.
            return;
        }
        let now = m.wall_now();
        m.table.release_rate_waits(now);
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
        let mut pass = Pass::default();
        for (kind, room) in room {
            self.schedule_kind(m, &kind, room, &mut pass);
        }
        self.schedule_fresh(m, &mut pass);
        self.end_pass(m, pass);
    }

    /// Up to `room` starts of `kind`: each time the queue with the smallest pass (counting the
    /// starts in flight) that has a job to start and a free worker to take it.
    fn schedule_kind(&mut self, m: &mut Member, kind: &str, mut room: usize, pass: &mut Pass) {
        let now = m.wall_now();
        // Queues with nothing more to start on this pass: held back by a rule, every job on
        // its way, or no free worker serving this kind takes work from them.
        let mut done: BTreeSet<String> = BTreeSet::new();
        while room > 0 {
            let Some((queue, aging_millis)) = self.next_queue(&m.table, kind, now, &done, pass)
            else {
                return;
            };
            let in_flight = &self.scheduling.in_flight;
            let table = &m.table;
            let mut key_held = None;
            let picked = table.queue_index().pick(
                kind,
                &queue,
                Ageing {
                    now,
                    bound_millis: aging_millis,
                },
                |key| in_flight.in_lane(kind, &queue, key),
                |key| {
                    let why = Self::key_held_back(table, &queue, key, in_flight, now, pass);
                    key_held = key_held.or(why);
                    why.is_some()
                },
                |job_id| in_flight.contains(&job_id),
            );
            let Some(job_id) = picked else {
                // Keys out of rate tokens wait parked, not walked: they hold the queue back too.
                let parked = table.queue_index().has_parked(kind, &queue);
                if let Some(why) = key_held.or(parked.then_some(HeldBack::KeyRate)) {
                    pass.hold(&queue, why);
                }
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
    /// flight are counted, ties by name, among the queues not `done` and not held back. Its
    /// ageing bound with it. Walks the queues with a queued job of the kind (at most
    /// `QUEUES_MAX`), not their jobs or keys.
    fn next_queue(
        &self,
        table: &JobTable,
        kind: &str,
        now: UnixMillis,
        done: &BTreeSet<String>,
        pass: &mut Pass,
    ) -> Option<(String, u64)> {
        let mut best: Option<(u64, &str, u64)> = None;
        for name in table.queue_index().queues_of(kind) {
            if done.contains(name) {
                continue;
            }
            let Some(queue) = table.queue_state(name) else {
                panic!("jobs are queued in {name:?}, which the table does not hold");
            };
            let in_flight = self.scheduling.in_flight.in_queue(name) as u64;
            if let Some(why) = Self::queue_held_back(table, name, in_flight, now, pass) {
                pass.hold(name, why);
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

    /// The rule of `queue` that holds all its jobs back now, counting `in_flight` starts on
    /// their way (the table's rules; see [`JobTable::queue_held_back`]), noting in `pass`
    /// when a rate token it waits for is due.
    fn queue_held_back(
        table: &JobTable,
        queue: &str,
        in_flight: u64,
        now: UnixMillis,
        pass: &mut Pass,
    ) -> Option<HeldBack> {
        pass.held_by(table.queue_held_back(queue, in_flight, now))
    }

    /// The per-key rule of `queue` that holds back the jobs of fairness key `key` now (none
    /// for the jobs without a key), counting the key's starts in flight (the table's rules;
    /// see [`JobTable::key_held_back`]), noting in `pass` when a token it waits for is due.
    fn key_held_back(
        table: &JobTable,
        queue: &str,
        key: &str,
        in_flight: &InFlight,
        now: UnixMillis,
        pass: &mut Pass,
    ) -> Option<HeldBack> {
        let key = (!key.is_empty()).then_some(key)?;
        let keyed = in_flight.with_key(queue, key) as u64;
        pass.held_by(table.key_held_back(queue, Some(key), keyed, now))
    }

    /// The fresh jobs, highest priority first (then in proposal order), while some worker
    /// serving their kind and queue has room and no rule of their queue holds them back.
    fn schedule_fresh(&mut self, m: &mut Member, pass: &mut Pass) {
        if self.scheduling.fresh.0.is_empty() || self.registry.with_free_slots().next().is_none() {
            return;
        }
        let now = m.wall_now();
        let mut order: Vec<usize> = (0..self.scheduling.fresh.0.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.scheduling.fresh.0[i].priority));
        let mut full: BTreeSet<(String, String)> = BTreeSet::new();
        let mut taken = vec![false; self.scheduling.fresh.0.len()];
        for i in order {
            let job = &self.scheduling.fresh.0[i];
            let lane = job.lane.clone();
            let (job_id, place) = (job.job_id, (lane.kind.clone(), lane.queue.clone()));
            if full.contains(&place) {
                continue;
            }
            let in_flight = &self.scheduling.in_flight;
            let in_queue = in_flight.in_queue(&lane.queue) as u64;
            let held =
                Self::queue_held_back(&m.table, &lane.queue, in_queue, now, pass).or_else(|| {
                    Self::key_held_back(&m.table, &lane.queue, &lane.key, in_flight, now, pass)
                });
            if let Some(why) = held {
                // Queued when its `Submit` applies, and scheduled from there.
                pass.hold(&lane.queue, why);
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
        self.scheduling
            .fresh
            .0
            .retain(|_| !taken.next().unwrap_or(false));
    }

    /// After a pass: a queue newly held back by a limit is an event, and a rate token due
    /// later arms a timer to schedule again then (one timer, the earliest).
    fn end_pass(&mut self, m: &mut Member, pass: Pass) {
        for (queue, why) in &pass.held {
            if self.scheduling.held.get(queue) != Some(why) {
                m.event(Event::QueueHeldBack {
                    queue: queue.clone(),
                    rule: *why,
                });
            }
        }
        self.scheduling.held = pass.held;
        // Lanes parked for their keys' rate are not walked: the first to rejoin wakes us too.
        let parked = m
            .table
            .queue_index()
            .parked()
            .next()
            .map(|(until, ..)| until);
        let Some(due) = pass.rate_due.into_iter().chain(parked).min() else {
            return;
        };
        let wait = Duration::from_millis(due.0.saturating_sub(m.wall_now().0));
        let at = m.now.saturating_add(wait);
        if self.scheduling.rate_wake.is_none_or(|armed| armed > at) {
            self.timers.arm(at, Timer::RateDue);
            self.scheduling.rate_wake = Some(at);
        }
    }

    /// A `RateDue` timer fired (the schedule that follows every timer does the rest). An
    /// earlier one armed for later may still fire; only the one armed last is forgotten.
    pub(super) fn rate_due(&mut self, now: Instant) {
        if self.scheduling.rate_wake.is_some_and(|at| at <= now) {
            self.scheduling.rate_wake = None;
        }
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
        self.scheduling.in_flight.add(job_id, lane, queued);
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
