//! Worker liveness and slot accounting: leader soft state, never replicated or persisted.
//!
//! A slot is held from the moment the leader proposes an assignment until the worker reports the
//! attempt finished (any outcome, including "cancelled") or the worker is lost. A revoked lease
//! keeps its slot until then, because the task may still be running on the worker: capacity
//! counts what the worker is really doing.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{ConnectionId, Incarnation, JobId, LeaseId, WorkerId};
use crate::protocol::WorkerView;
use crate::time::Instant;

#[derive(Clone, Debug)]
pub struct WorkerEntry {
    pub id: WorkerId,
    pub incarnation: Incarnation,
    /// Which registration of this worker id this is (a coordinator-wide counter).
    pub registration: u64,
    pub capacity: u32,
    /// Assignments it holds beyond `capacity`, waiting at the worker for a slot.
    pub prefetch: u32,
    pub conn: Option<ConnectionId>,
    pub alive: bool,
    pub last_heartbeat: Instant,
    /// Slots in use: lease -> job.
    pub leases: BTreeMap<LeaseId, JobId>,
    /// When each lease sent to the worker is due to end (its attempt's deadline), for the
    /// leases in `leases` that have gone out. A prefetched lease's own deadline is placed after
    /// the ends of the attempts it waits behind.
    pub ends: BTreeMap<LeaseId, Instant>,
    /// Leases whose deadline passed while the worker still held them: when they end is not
    /// known, so nothing more is queued behind them (see `free_slots`).
    pub overdue: BTreeSet<LeaseId>,
    /// The task kinds it serves (fixed for the life of its process).
    pub tasks: BTreeSet<String>,
    /// The queues it takes work from (`None`: every queue).
    pub queues: Option<BTreeSet<String>>,
    /// Shutting down: it gets no new work.
    pub draining: bool,
}

impl WorkerEntry {
    /// Live, connected and not draining: it may be given work of the kinds it serves.
    pub fn takes_work(&self) -> bool {
        self.alive && self.conn.is_some() && !self.draining
    }

    pub fn serves(&self, kind: &str) -> bool {
        self.tasks.contains(kind)
    }

    pub fn serves_queue(&self, queue: &str) -> bool {
        self.queues
            .as_ref()
            .is_none_or(|queues| queues.contains(queue))
    }

    /// Leases it can still be given: its slots plus what it prefetches, less what it holds.
    /// While it holds an overdue lease, only its slots: an attempt queued behind one that
    /// outlived its deadline could not be given a deadline it would meet.
    pub fn free_slots(&self) -> u32 {
        let used = u32::try_from(self.leases.len()).unwrap_or(u32::MAX);
        let room = if self.overdue.is_empty() {
            self.capacity.saturating_add(self.prefetch)
        } else {
            self.capacity
        };
        room.saturating_sub(used)
    }

    /// Whether it has a slot free now, not only room to queue.
    pub fn has_idle_slot(&self) -> bool {
        self.leases.len() < self.capacity as usize
    }

    /// The most leases it may hold at once.
    pub fn lease_bound(&self) -> usize {
        self.capacity.saturating_add(self.prefetch) as usize
    }

    /// Frees a lease's slot, with its end.
    pub fn free(&mut self, lease_id: LeaseId) -> Option<JobId> {
        self.ends.remove(&lease_id);
        self.overdue.remove(&lease_id);
        self.leases.remove(&lease_id)
    }

    /// When an attempt sent now for `lease_id` can start at the latest, given what the worker
    /// holds: now if a slot is free; otherwise once enough of the attempts ahead of it have
    /// ended. Waiting attempts start in arrival order, and each end frees a slot for the next,
    /// so with `n` attempts ahead and `capacity` slots it starts by the `n - capacity + 1`-th
    /// earliest of their ends (each ends by its deadline).
    pub fn latest_start(&self, lease_id: LeaseId, now: Instant) -> Instant {
        let mut ahead: Vec<Instant> = self
            .ends
            .iter()
            .filter(|(lease, _)| **lease != lease_id)
            .map(|(_, end)| *end)
            .collect();
        let slots = self.capacity as usize;
        if ahead.len() < slots {
            return now;
        }
        let rank = ahead.len() - slots;
        let (_, end, _) = ahead.select_nth_unstable(rank);
        (*end).max(now)
    }

    pub fn view(&self, now: Instant) -> WorkerView {
        WorkerView {
            id: self.id.clone(),
            incarnation: self.incarnation,
            alive: self.alive,
            capacity: self.capacity,
            prefetch: self.prefetch,
            running: u32::try_from(self.leases.len()).unwrap_or(u32::MAX),
            last_heartbeat_millis_ago: now.saturating_since(self.last_heartbeat).as_millis() as u64,
            tasks: self.tasks.iter().cloned().collect(),
            draining: self.draining,
        }
    }
}

#[derive(Debug, Default)]
pub struct Registry {
    workers: BTreeMap<WorkerId, WorkerEntry>,
    by_conn: BTreeMap<ConnectionId, WorkerId>,
}

impl Registry {
    pub fn get(&self, id: &WorkerId) -> Option<&WorkerEntry> {
        self.workers.get(id)
    }

    pub fn get_mut(&mut self, id: &WorkerId) -> Option<&mut WorkerEntry> {
        self.workers.get_mut(id)
    }

    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// The worker registered on `conn`, if any.
    pub fn worker_on(&self, conn: ConnectionId) -> Option<&WorkerId> {
        self.by_conn.get(&conn)
    }

    pub fn iter(&self) -> impl Iterator<Item = &WorkerEntry> {
        self.workers.values()
    }

    /// Inserts or replaces the entry for `entry.id`, binding its connection.
    pub fn insert(&mut self, entry: WorkerEntry) {
        if let Some(old) = self.workers.get(&entry.id) {
            if let Some(conn) = old.conn {
                self.by_conn.remove(&conn);
            }
        }
        if let Some(conn) = entry.conn {
            self.by_conn.insert(conn, entry.id.clone());
        }
        self.workers.insert(entry.id.clone(), entry);
    }

    /// Moves a live worker to a new connection, returning the old one.
    pub fn rebind(&mut self, id: &WorkerId, conn: ConnectionId) -> Option<ConnectionId> {
        let entry = self.workers.get_mut(id)?;
        let old = entry.conn.replace(conn);
        if let Some(old) = old {
            self.by_conn.remove(&old);
        }
        self.by_conn.insert(conn, id.clone());
        old
    }

    /// Marks a worker lost: unbinds its connection and hands back its slots.
    pub fn mark_lost(&mut self, id: &WorkerId) -> (Option<ConnectionId>, BTreeMap<LeaseId, JobId>) {
        let Some(entry) = self.workers.get_mut(id) else {
            return (None, BTreeMap::new());
        };
        entry.alive = false;
        let conn = entry.conn.take();
        if let Some(conn) = conn {
            self.by_conn.remove(&conn);
        }
        entry.ends.clear();
        entry.overdue.clear();
        (conn, std::mem::take(&mut entry.leases))
    }

    /// Forgets the oldest lost workers beyond `keep` entries (the `workers` listing keeps a few).
    pub fn evict_lost(&mut self, keep: usize) {
        while self.workers.len() > keep {
            let oldest = self
                .workers
                .values()
                .filter(|w| !w.alive)
                .min_by_key(|w| (w.last_heartbeat, w.id.clone()))
                .map(|w| w.id.clone());
            match oldest {
                Some(id) => {
                    self.workers.remove(&id);
                }
                None => break,
            }
        }
    }

    /// Workers that take work and have a free slot.
    pub fn with_free_slots(&self) -> impl Iterator<Item = &WorkerEntry> {
        self.workers
            .values()
            .filter(|w| w.takes_work() && w.free_slots() > 0)
    }

    /// True if some worker that takes work serves `kind` (whether or not it has a slot free).
    pub fn serves(&self, kind: &str) -> bool {
        self.workers
            .values()
            .any(|w| w.takes_work() && w.serves(kind))
    }

    /// The worker serving `kind` and `queue` with a free slot and the fewest attempts in hand, after first
    /// minimising `penalty` (e.g. how many partitions of the same job a worker already runs, so
    /// partitions spread across workers) and preferring a worker with a slot idle now to one
    /// that would queue the job. Ties: most free slots, then the smallest id, so the choice is
    /// deterministic.
    pub fn least_loaded_for(
        &self,
        kind: &str,
        queue: &str,
        penalty: impl Fn(&WorkerEntry) -> usize,
    ) -> Option<&WorkerEntry> {
        self.with_free_slots()
            .filter(|w| w.serves(kind) && w.serves_queue(queue))
            .min_by(|a, b| {
                penalty(a)
                    .cmp(&penalty(b))
                    .then(b.has_idle_slot().cmp(&a.has_idle_slot()))
                    .then(a.leases.len().cmp(&b.leases.len()))
                    .then(b.free_slots().cmp(&a.free_slots()))
                    .then(a.id.cmp(&b.id))
            })
    }
}
