//! What every member of the coordinator group has, leader or not: its configuration and seeded
//! RNG, the job table it applies committed entries to, its consensus replica, its persistence
//! plumbing, and the queue of outputs for the driver.

use std::collections::{BTreeMap, VecDeque};

use rand_chacha::ChaCha8Rng;

use super::persistence::Persistence;
use super::{CoordinatorConfig, Event, Output};
use crate::auth::Caller;
use crate::command::Command;
use crate::ids::{ConnectionId, NodeId, RequestId};
use crate::limits::WALL_CLOCK_STEP_MIN;
use crate::protocol::{ClientReply, CoordinatorToWorker, ErrorCode, LeaderHint};
use crate::replica::{NotLeader, Proposal, Replica};
use crate::storage::Record;
use crate::table::{JobTable, ScopedKey};
use crate::time::{Instant, UnixMillis};

pub(super) struct Member {
    pub(super) config: CoordinatorConfig,
    pub(super) rng: ChaCha8Rng,
    pub(super) table: JobTable,
    pub(super) replica: Replica,
    pub(super) persistence: Persistence,
    pub(super) outputs: VecDeque<Output>,
    pub(super) now: Instant,
    /// Where each member's clients and workers connect, as its `HELLO` said (this member's own
    /// from its configuration).
    pub(super) addresses: BTreeMap<NodeId, MemberAddresses>,
    /// Who holds each open client connection, as it authenticated (the anonymous caller on a
    /// port that checks no tokens): one entry per connection that has sent a request, removed
    /// when it closes. Everything pending for a connection is dropped when it closes, so a
    /// request worked on later always finds its caller here.
    pub(super) callers: BTreeMap<ConnectionId, Caller>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MemberAddresses {
    pub(super) client: String,
    pub(super) worker: String,
}

impl Member {
    /// Who holds `conn`, a client connection with a request in hand.
    pub(super) fn caller(&self, conn: ConnectionId) -> &Caller {
        self.callers.get(&conn).unwrap_or_else(|| {
            panic!("client connection {conn} has no caller: a request outlived its connection")
        })
    }

    /// The token name `conn` came with, which a job it submits records.
    pub(super) fn owner(&self, conn: ConnectionId) -> Option<String> {
        self.caller(conn).name.clone()
    }

    /// `key` as bound for a submission on `conn`: within its caller's name.
    pub(super) fn scoped(&self, conn: ConnectionId, key: &str) -> ScopedKey {
        ScopedKey {
            owner: self.owner(conn),
            key: key.to_owned(),
        }
    }

    pub(super) fn event(&mut self, event: Event) {
        self.outputs.push_back(Output::Event(event));
    }

    pub(super) fn send_worker(&mut self, conn: ConnectionId, message: CoordinatorToWorker) {
        self.outputs.push_back(Output::ToWorker { conn, message });
    }

    pub(super) fn send_client(&mut self, conn: ConnectionId, message: ClientReply) {
        self.outputs.push_back(Output::ToClient { conn, message });
    }

    pub(super) fn close(&mut self, conn: ConnectionId) {
        self.outputs.push_back(Output::Close { conn });
    }

    pub(super) fn client_error(
        &mut self,
        conn: ConnectionId,
        request_id: RequestId,
        code: ErrorCode,
        message: String,
    ) {
        self.send_client(
            conn,
            ClientReply::Error {
                request_id: Some(request_id),
                code,
                message,
            },
        );
    }

    /// Appends a command to the log; it applies (and its effects leave) once committed.
    pub(super) fn propose(&mut self, command: Command) -> Result<Proposal, NotLeader> {
        let proposal = self.replica.propose(command, self.wall_now())?;
        self.take_replica_records();
        Ok(proposal)
    }

    /// Moves what consensus wants persisted into the open batch, handing the batch out whenever
    /// it fills up.
    pub(super) fn take_replica_records(&mut self) {
        let before = self.replica.records_taken();
        let records: Vec<_> = self.replica.take_records().collect();
        for (number, record) in (before + 1..).zip(records) {
            let entry_bytes = match &record {
                Record::Log(entry) => self.replica.log().bytes_at(entry.index).unwrap_or(0) as u64,
                _ => 0,
            };
            if self.persistence.push(record, number, entry_bytes) {
                self.flush_batch_now();
            }
        }
    }

    /// Hands the open batch to the driver now (if it holds anything).
    fn flush_batch_now(&mut self) {
        if let Some(batch) = self.persistence.flush(&self.table, &self.replica, self.now) {
            self.outputs.push_back(Output::Persist(batch));
        }
    }

    /// The next output: queued sends and events first, then the open batch.
    pub(super) fn poll_output(&mut self) -> Option<Output> {
        if let Some(output) = self.outputs.pop_front() {
            return Some(output);
        }
        self.take_replica_records();
        if let Some(output) = self.outputs.pop_front() {
            // Taking the records handed out a full batch: it goes first.
            return Some(output);
        }
        self.persistence
            .flush(&self.table, &self.replica, self.now)
            .map(Output::Persist)
    }

    /// Whether a read must be confirmed by a majority before it is answered (never in a group
    /// of one: its only member is its majority).
    pub(super) fn reads_need_confirmation(&self) -> bool {
        self.replica.config().members.len() > 1
    }

    /// Where to send a client or worker instead of this member: the leader it knows, with the
    /// address of the given link, if that member has told us its addresses.
    pub(super) fn leader_hint(&self, link: super::Link) -> Option<LeaderHint> {
        let leader = self.replica.leader_hint()?;
        let addresses = self.addresses.get(leader)?;
        let address = match link {
            super::Link::Client => &addresses.client,
            super::Link::Worker => &addresses.worker,
        };
        (!address.is_empty()).then(|| LeaderHint {
            node_id: leader.clone(),
            address: address.clone(),
        })
    }

    /// Every member's address for the given link, as far as known.
    pub(super) fn member_addresses(&self, link: super::Link) -> Vec<String> {
        self.addresses
            .values()
            .map(|a| match link {
                super::Link::Client => a.client.clone(),
                super::Link::Worker => a.worker.clone(),
            })
            .filter(|a| !a.is_empty())
            .collect()
    }

    /// The wall time now, as the driver's epoch and the monotonic time since give it.
    pub(super) fn wall_now(&self) -> UnixMillis {
        self.config.wall_clock_at_epoch.at(self.now)
    }

    /// The wall clock reads `wall` at `self.now`: if that is a step from what this member's
    /// clock expects (`WALL_CLOCK_STEP_MIN` or more either way), it is taken. Returns the step
    /// taken, in milliseconds (negative: backwards).
    pub(super) fn observe_wall_clock(&mut self, wall: UnixMillis) -> Option<i64> {
        let expected = self.wall_now();
        let step = i128::from(wall.0) - i128::from(expected.0);
        if step.unsigned_abs() < crate::time::as_millis_u64(WALL_CLOCK_STEP_MIN).into() {
            return None;
        }
        self.config.wall_clock_at_epoch = UnixMillis(wall.0.saturating_sub(self.now.as_millis()));
        Some(i64::try_from(step).unwrap_or(if step < 0 { i64::MIN } else { i64::MAX }))
    }

    pub(super) fn advance_clock(&mut self, now: Instant) {
        // Drivers hand out monotonic time; tolerate a repeated instant, never go backwards.
        self.now = self.now.max(now);
    }
}
