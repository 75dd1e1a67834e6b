//! The one driver tests use: a coordinator fed and drained in the calling order documented on
//! [`crate::coordinator`], its batches written to an in-memory disk (or held back, as a slow
//! disk would), its timers fired in order as virtual time passes, and its invariants checked
//! after every output it produces.
//!
//! Unit tests, property and model tests and the fuzz target all drive a coordinator through
//! [`Driver`], so they follow one step order and check the same invariants: the job table's own
//! (`JobTable::check_invariants`) and that no worker holds more attempts than its capacity and
//! prefetch allow. Tests that need to see each output as it appears use [`Driver::next_output`]
//! instead of [`Driver::pump`]; both go through the same step.
//!
//! A group is driven as one `Driver` per member, the test routing peer messages between them.
//! The simulator keeps a world of its own (disks that stall and tear, networks that lose and
//! delay) but feeds and drains each coordinator in the same documented order.
//!
//! Nothing here touches a clock, a socket or a file: it is as deterministic as the coordinator.

use std::time::Duration;

use crate::coordinator::{
    ConfigError, Coordinator, CoordinatorConfig, DiskImage, Output, PersistBatch, Record,
    RecoveryError,
};
use crate::time::Instant;

/// One coordinator, its disk, its clock, and what it sent.
pub struct Driver {
    pub c: Coordinator,
    /// The coordinator process's clock.
    pub now: Instant,
    /// What reached the disk.
    pub disk: DiskImage,
    /// While true, batches are held back instead of written.
    pub hold_writes: bool,
    /// Batches written by the coordinator but not yet durable, oldest first.
    pub held: Vec<PersistBatch>,
    /// Every output other than `Persist`, in order (events included).
    pub sent: Vec<Output>,
    /// Log entries made durable so far.
    pub entries_written: usize,
    /// While true, every batch made durable is also kept in `landed`, for tests that learn
    /// from what reached the disk.
    pub keep_landed: bool,
    pub landed: Vec<PersistBatch>,
}

impl Driver {
    /// A coordinator with an empty disk at time zero, drained once.
    pub fn new(config: CoordinatorConfig, seed: u64) -> Result<Driver, ConfigError> {
        let mut driver = Driver::around(Coordinator::new(config, seed)?, Instant::ZERO);
        driver.pump();
        Ok(driver)
    }

    /// Wraps a coordinator built elsewhere, at `now`, with an empty disk.
    pub fn around(c: Coordinator, now: Instant) -> Driver {
        Driver {
            c,
            now,
            disk: DiskImage::default(),
            hold_writes: false,
            held: Vec::new(),
            sent: Vec::new(),
            entries_written: 0,
            keep_landed: false,
            landed: Vec::new(),
        }
    }

    /// The process dies: batches not yet durable are lost, and a new process recovers from the
    /// disk at the same instant. What the old process sent is forgotten.
    pub fn crash_and_recover(
        &mut self,
        config: CoordinatorConfig,
        seed: u64,
    ) -> Result<(), RecoveryError> {
        self.crash(0);
        self.recover_at(config, seed, self.now)?;
        self.pump();
        Ok(())
    }

    /// The process dies while writing: the oldest `landed` held batches reach the disk, the
    /// rest are lost.
    pub fn crash(&mut self, landed: usize) {
        let landed = landed.min(self.held.len());
        let batches: Vec<PersistBatch> = self.held.drain(..landed).collect();
        for batch in batches {
            self.write(batch);
        }
        self.held.clear();
        self.hold_writes = false;
    }

    /// A new process starts on the disk, its clock reading `now` (a process's clock may start
    /// anywhere: nothing measured on the old one carries over); nothing is drained yet.
    pub fn recover_at(
        &mut self,
        config: CoordinatorConfig,
        seed: u64,
        now: Instant,
    ) -> Result<(), RecoveryError> {
        self.c = Coordinator::recover(config, seed, now, self.disk.durable_state())?;
        self.now = now;
        self.sent.clear();
        Ok(())
    }

    /// The next output that is not a `Persist` (each batch met on the way is written or held),
    /// with the invariants checked after every output; `None` once the coordinator is idle.
    pub fn next_output(&mut self) -> Option<Output> {
        loop {
            let output = self.c.poll_output()?;
            let shown = match output {
                // Batches become durable in order: once one is held, later ones wait behind it.
                Output::Persist(batch) if self.hold_writes || !self.held.is_empty() => {
                    self.held.push(batch);
                    None
                }
                Output::Persist(batch) => {
                    self.write(batch);
                    None
                }
                other => Some(other),
            };
            self.check();
            if shown.is_some() {
                return shown;
            }
        }
    }

    /// Drains every output (step 2 of the calling order), keeping all but batches in `sent`.
    pub fn pump(&mut self) {
        while let Some(output) = self.next_output() {
            self.sent.push(output);
        }
    }

    /// Makes `batch` durable and tells the coordinator.
    fn write(&mut self, batch: PersistBatch) {
        let id = batch.id;
        self.store(batch);
        self.c.handle_persisted(self.now, id);
    }

    /// Puts `batch` on the disk (without telling the coordinator).
    fn store(&mut self, batch: PersistBatch) {
        self.entries_written += batch
            .records
            .iter()
            .filter(|r| matches!(r, Record::Log(_)))
            .count();
        self.disk.write(&batch.records);
        if self.keep_landed {
            self.landed.push(batch);
        }
    }

    /// Makes the oldest `count` held batches durable in one transaction and reports the last
    /// one (step 2 allows merging); the caller drains what follows. False if none was held.
    pub fn land_held(&mut self, count: usize) -> bool {
        let count = count.min(self.held.len());
        let batches: Vec<PersistBatch> = self.held.drain(..count).collect();
        let Some(last) = batches.last().map(|batch| batch.id) else {
            return false;
        };
        for batch in batches {
            self.store(batch);
        }
        self.c.handle_persisted(self.now, last);
        true
    }

    /// Lets only the oldest held batch reach the disk; later ones stay held.
    pub fn release_one(&mut self) {
        assert!(self.land_held(1), "no batch is held");
        self.pump();
    }

    /// Stops holding writes and lets every held batch reach the disk, in order.
    pub fn release_writes(&mut self) {
        self.hold_writes = false;
        self.land_held(self.held.len());
        self.pump();
    }

    /// Fires the coordinator's next timer if it is due by `until`, at its own instant (step 1 of
    /// the calling order); the caller drains what follows. False if none is due.
    pub fn fire_next_timer(&mut self, until: Instant) -> bool {
        match self.c.poll_timeout() {
            Some(at) if at <= until => {
                self.now = self.now.max(at);
                self.c.handle_timeout(self.now);
                true
            }
            _ => false,
        }
    }

    /// Advances the clock by `by`, firing every timer on the way, in order, each at its instant.
    pub fn advance(&mut self, by: Duration) {
        let target = self.now.saturating_add(by);
        while self.fire_next_timer(target) {
            self.pump();
        }
        self.now = target;
    }

    /// Takes what was sent so far.
    pub fn take_sent(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.sent)
    }

    /// The invariants every step must keep; panics naming the first one broken.
    pub fn check(&self) {
        if let Err(violation) = self.c.table().check_invariants() {
            panic!("job table invariant broken: {violation}");
        }
        for worker in self.c.workers() {
            assert!(
                worker.leases.len() <= worker.lease_bound(),
                "worker {} holds {} attempts with capacity {} and prefetch {}",
                worker.id,
                worker.leases.len(),
                worker.capacity,
                worker.prefetch
            );
        }
    }
}
