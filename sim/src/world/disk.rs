//! The coordinators' simulated disks: a `Persist` batch becomes durable after a random delay,
//! in order, and only then is the machine told; a crash loses what is still pending, except a
//! torn tail that lands unreported; and at the end the disk alone must rebuild the live table.

use herder_core::coordinator::{BatchId, PersistBatch, Record};

use super::events::Ev;
use super::{NodeRef, World};
use crate::checker::Check;

impl World {
    /// Hands `batch` to coordinator `c`'s disk: it becomes durable after a random delay, never
    /// before a batch handed over earlier.
    pub(super) fn persist(&mut self, c: usize, batch: PersistBatch) {
        let (lo, hi) = self.scenario.disk_us;
        let delay = self.disk_rng.range(lo, hi);
        let coord = &mut self.coords[c];
        let at = (self.now + delay).max(coord.last_durable_at);
        coord.last_durable_at = at;
        let (id, gen, records) = (batch.id, coord.gen, batch.records.len());
        let gives_up = batch
            .records
            .iter()
            .any(|record| matches!(record, Record::TruncateLogAfter(_)));
        coord.pending.push_back(batch);
        if gives_up {
            self.count("consensus: a member gives up a conflicting suffix of its log");
        }
        self.note(
            NodeRef::Coordinator(c),
            format_args!("persist batch {} ({records} records)", id.0),
        );
        self.push(
            at,
            Ev::Durable {
                coord: c,
                gen,
                batch: id,
            },
        );
    }

    pub(super) fn durable(&mut self, c: usize, gen: u64, batch: BatchId) -> Check {
        let node = &mut self.coords[c];
        if node.gen != gen {
            return Ok(());
        }
        while node.pending.front().is_some_and(|b| b.id <= batch) {
            if let Some(landed) = node.pending.pop_front() {
                node.disk.write(&landed.records);
                self.checker.record_durable(c, &landed.records)?;
            }
        }
        let node = &mut self.coords[c];
        let local = node.clock.local(self.now);
        if let Some(m) = &mut node.machine {
            m.handle_persisted(local, batch);
        }
        self.note(
            NodeRef::Coordinator(c),
            format_args!("batch {} durable", batch.0),
        );
        self.drain_coord(c)
    }

    /// Coordinator `c`'s process died: of the batches still pending, the first `landed` reached
    /// the disk without being reported (a torn tail), the rest are lost. Returns how many were
    /// lost.
    pub(super) fn crash_disk(&mut self, c: usize, landed: usize) -> Result<usize, String> {
        let node = &mut self.coords[c];
        let pending: Vec<PersistBatch> = node.pending.drain(..).collect();
        for batch in &pending[..landed] {
            node.disk.write(&batch.records);
            self.checker.record_durable(c, &batch.records)?;
        }
        Ok(pending.len() - landed)
    }

    /// At the end, with nothing in flight to a disk: recovering from the disk alone must
    /// rebuild exactly the table the live coordinator holds (nothing applied is missing from
    /// disk, nothing on disk is unapplied).
    pub(super) fn check_disk_matches(&self) -> Check {
        for (c, coord) in self.coords.iter().enumerate() {
            let Some(machine) = &coord.machine else {
                continue;
            };
            if !coord.pending.is_empty() {
                continue;
            }
            let live = machine.table();
            // In a group, entries beyond what the member applied may be on its disk but not yet
            // known committed: recovery applies them only once a leader says so.
            let durable = coord
                .disk
                .table_through(live.applied_index())
                .map_err(|e| format!("coord-{c}: the disk does not recover: {e}"))?;
            if durable.applied_index() != live.applied_index() {
                return Err(format!(
                    "coord-{c}: the disk rebuilds the table at entry {} but the live table is at {}",
                    durable.applied_index(),
                    live.applied_index()
                ));
            }
            for job in live.jobs() {
                if durable.get(&job.id) != Some(job) {
                    return Err(format!(
                        "coord-{c}: job {} on disk is {:?}, live it is {job:?}",
                        job.id,
                        durable.get(&job.id)
                    ));
                }
            }
            if durable.len() != live.len() {
                return Err(format!(
                    "coord-{c}: the disk holds {} jobs, the live table {}",
                    durable.len(),
                    live.len()
                ));
            }
        }
        Ok(())
    }
}
