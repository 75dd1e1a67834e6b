//! Submissions the leader has proposed and not yet applied.
//!
//! Admission counts them together with the applied table's active jobs, so a burst that
//! arrives between two disk writes cannot overshoot `max_active_jobs`, and a submission refused
//! for want of room is refused before anything is written. Their idempotency keys are known
//! too: a keyed resend of a submission still being written waits for that entry to apply and
//! is then answered from the table, like any known key (even when admission is full).
//!
//! Every entry here is of the leader's own term: a leader starts leading only once every
//! earlier entry is applied, so nothing proposed by another leader can be in flight unseen.

use std::collections::BTreeMap;

use super::submissions::SubmitTo;
use crate::ids::{ConnectionId, LogIndex, Term};
use crate::limits::KEYED_RESENDS_PARKED_MAX;
use crate::protocol::JobSubmission;
use crate::table::ScopedKey;

/// A proposal's place in the log.
type At = (Term, LogIndex);

/// A keyed submission that arrived while its key's submission was in flight.
pub(super) struct ParkedResend {
    pub(super) to: SubmitTo,
    pub(super) submission: Box<JobSubmission>,
}

impl ParkedResend {
    fn conn(&self) -> ConnectionId {
        match self.to {
            SubmitTo::Request { conn, .. } | SubmitTo::BatchItem { conn, .. } => conn,
        }
    }
}

struct InFlight {
    /// Admission slots it takes: the job and each partition.
    slots: u64,
    /// The queue it goes to.
    queue: String,
    key: Option<ScopedKey>,
    resends: Vec<ParkedResend>,
}

#[derive(Default)]
pub(super) struct Admitting {
    entries: BTreeMap<At, InFlight>,
    /// Sum of `slots` over `entries`, in all and by queue.
    slots: u64,
    by_queue: BTreeMap<String, u64>,
    keys: BTreeMap<ScopedKey, At>,
    resends: usize,
}

impl Admitting {
    /// Admission slots taken by submissions proposed and not yet applied.
    pub(super) fn slots(&self) -> u64 {
        self.slots
    }

    /// Admission slots of `queue` taken by submissions proposed and not yet applied.
    pub(super) fn queue_slots(&self, queue: &str) -> u64 {
        self.by_queue.get(queue).copied().unwrap_or(0)
    }

    /// A submission to `queue` was proposed at `at`.
    pub(super) fn proposed(&mut self, at: At, slots: u64, key: Option<ScopedKey>, queue: String) {
        if let Some(key) = &key {
            let earlier = self.keys.insert(key.clone(), at);
            assert!(
                earlier.is_none(),
                "idempotency key {key} proposed twice while in flight (at {earlier:?} and {at:?})"
            );
        }
        let earlier = self.entries.insert(
            at,
            InFlight {
                slots,
                queue: queue.clone(),
                key,
                resends: Vec::new(),
            },
        );
        assert!(earlier.is_none(), "two submissions proposed at {at:?}");
        self.slots += slots;
        *self.by_queue.entry(queue).or_default() += slots;
    }

    /// Where the in-flight submission bound to `key` is, if there is one.
    pub(super) fn proposal_for(&self, key: &ScopedKey) -> Option<At> {
        self.keys.get(key).copied()
    }

    /// Parks a resend until the submission at `at` applies; gives it back when
    /// `KEYED_RESENDS_PARKED_MAX` resends already wait.
    pub(super) fn park(&mut self, at: At, resend: ParkedResend) -> Result<(), ParkedResend> {
        if self.resends >= KEYED_RESENDS_PARKED_MAX {
            return Err(resend);
        }
        let Some(entry) = self.entries.get_mut(&at) else {
            panic!("a resend parked on {at:?}, which holds no submission in flight");
        };
        entry.resends.push(resend);
        self.resends += 1;
        Ok(())
    }

    /// The entry at `at` applied: if it was a submission of ours, its slots and key are freed
    /// (the table counts them now) and the resends that waited for it are handed back.
    pub(super) fn applied(&mut self, at: At) -> Vec<ParkedResend> {
        let Some(entry) = self.entries.remove(&at) else {
            return Vec::new();
        };
        self.slots -= entry.slots;
        let Some(in_queue) = self.by_queue.get_mut(&entry.queue) else {
            panic!(
                "a submission to {:?} applied with none counted in flight there",
                entry.queue
            );
        };
        *in_queue -= entry.slots;
        if *in_queue == 0 {
            self.by_queue.remove(&entry.queue);
        }
        if let Some(key) = &entry.key {
            self.keys.remove(key);
        }
        self.resends -= entry.resends.len();
        entry.resends
    }

    /// `conn` closed: its parked resends are dropped (nobody is left to answer).
    pub(super) fn drop_conn(&mut self, conn: ConnectionId) {
        for entry in self.entries.values_mut() {
            let before = entry.resends.len();
            entry.resends.retain(|r| r.conn() != conn);
            self.resends -= before - entry.resends.len();
        }
    }

    /// Every resend still parked (the leader is stepping down).
    pub(super) fn into_resends(self) -> impl Iterator<Item = ParkedResend> {
        self.entries.into_values().flat_map(|e| e.resends)
    }
}
