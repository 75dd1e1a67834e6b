//! The coordinator state machine: one member of the coordinator group.
//!
//! ```text
//!  inputs (handle_*)                    Coordinator                              outputs
//!  ─────────────────      ┌────────────────────────────────────────┐
//!  worker message ──┐     │ LeaderState (only while leading):      │ propose
//!  client message ──┼───> │  registry, timers, waits, replies owed ├─────> Replica (Raft) ──> Persist(batch)
//!  closed/garbled ──┘     │                                        │          │   └──────> ToPeer
//!  peer message ────────> │ Replica <──────────────────────────────┼──────────┘
//!  timer due ───────────> │                                        │   committed entries
//!  batch durable ───────> │ JobTable <──── apply ──────────────────┼── (majority-durable, durable here)
//!                         └───────────────────┬────────────────────┘
//!                                             └──> ToWorker / ToClient / Close / Event
//! ```
//!
//! Calling order for a driver:
//!
//! 1. Feed one input: `handle_worker_message`, `handle_client_message`, `handle_peer_message`,
//!    `handle_malformed`, `handle_closed`, `handle_timeout` (when `poll_timeout` is due) or
//!    `handle_persisted`.
//! 2. Drain `poll_output` until it returns `None`. Perform sends and closes in order. Write each
//!    `Persist` batch durably, in order (several may be merged into one transaction), and then
//!    call `handle_persisted` with the highest batch id that is durable. `ToPeer` messages may
//!    be lost, delayed or reordered; consensus copes.
//! 3. Sleep until `poll_timeout`, the next input, or shutdown.
//!
//! **Durability before visibility.** A state change is only ever revealed to another node by
//! applying a committed log entry, and an entry is committed only once it is durable on a
//! majority of the group, and applied only once it is durable here too. Replies to clients,
//! assignments and cancels to workers and result acknowledgements are all produced while
//! applying, so no such output can leave before the records it depends on are on disk. Reads
//! (`STATUS`, `LIST`, `WAIT`, `WORKERS`) are answered from the applied table, and in a group only
//! after a majority has confirmed this member still leads (ReadIndex, Raft dissertation 6.4).
//!
//! **Only the leader acts.** Followers apply committed entries silently and answer clients and
//! workers with a typed `NOT_LEADER` naming the leader they know. A newly elected leader holds
//! client and worker messages until its first entry of the term is applied (then its table holds
//! everything committed before it), builds its soft state from the table, and only then acts.
//! When it stops leading, that state is dropped and everything it owed is answered with
//! `NOT_LEADER`.
//!
//! Leader soft state (worker liveness, slots, deadlines, backoff timers, parked waits) is not
//! persisted or replicated. A new leader (or a restarted group of one) rebuilds it
//! conservatively: running attempts get a re-adoption window, backoffs restart from takeover.
//!
//! Inside, a coordinator is split by role:
//!
//! - [`member`]: what every member of the group has: the job table (the deterministic state
//!   machine every member applies committed entries to, silently), the consensus replica, the
//!   persistence batches and the outputs;
//! - [`leader`]: what only the leader has: the worker registry, timers, leases being settled,
//!   parked waits and the replies owed (keyed by the `(term, index)` of their proposal), built
//!   when the member starts leading;
//! - [`group`]: being one member of several: peer messages, role changes, what a member that
//!   does not lead answers, the cluster view, snapshots;
//! - [`crate::replica`]: consensus (Raft) behind a small interface.

mod config;
mod disk_image;
mod events;
mod group;
mod leader;
mod member;
mod persistence;
mod registry;
mod timers;

use std::collections::{BTreeMap, VecDeque};

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub use crate::storage::{BatchId, DurableState, HardState, PersistBatch, Record};
pub use config::{ConfigError, CoordinatorConfig, Retention};
pub use disk_image::DiskImage;
pub use events::{Event, LossReason};
pub use registry::WorkerEntry;

use crate::auth::{Caller, Role};
use crate::ids::{ConnectionId, LogIndex, NodeId};
use crate::job::Job;
use crate::protocol::codec::{FrameError, WireMessage};
use crate::protocol::{
    ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode, PeerMessage, WorkerToCoordinator,
};
use crate::replica::{Replica, ReplicaConfig};
use crate::storage::TableRows;
use crate::table::{JobTable, TableError};
use crate::time::{Instant, UnixMillis};
use group::Parked;
use leader::LeaderState;
use member::{Member, MemberAddresses};
use persistence::Persistence;

/// Which port a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Worker,
    Client,
}

/// What the coordinator asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    ToWorker {
        conn: ConnectionId,
        message: CoordinatorToWorker,
    },
    ToClient {
        conn: ConnectionId,
        message: ClientReply,
    },
    /// Send to another member of the group (best effort: consensus tolerates loss).
    ToPeer {
        to: NodeId,
        message: PeerMessage,
    },
    /// Close the connection (after sending anything queued before this output).
    Close {
        conn: ConnectionId,
    },
    /// Make these records durable, then call `handle_persisted(id)`.
    Persist(PersistBatch),
    Event(Event),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("the stored log has a gap: expected entry {expected}, found {found}")]
    LogGap { expected: LogIndex, found: LogIndex },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Mixed into the seed of the consensus RNG, so election timeouts draw from their own stream.
const CONSENSUS_SEED_SALT: u64 = 0x5241_4654;

/// The coordinator. See the module documentation for the calling order.
pub struct Coordinator {
    member: Member,
    /// Present exactly while this member leads and has caught up with its term.
    leader: Option<LeaderState>,
    /// Client and worker messages held while this member is leader but not yet caught up.
    parked: Parked,
}

impl Coordinator {
    /// A coordinator with an empty disk.
    pub fn new(config: CoordinatorConfig, seed: u64) -> Result<Coordinator, ConfigError> {
        match Coordinator::build(config, seed, Instant::ZERO, DurableState::default(), false) {
            Ok(coordinator) => Ok(coordinator),
            Err(RecoveryError::Config(error)) => Err(error),
            Err(other) => unreachable!("an empty disk always recovers: {other}"),
        }
    }

    /// A coordinator restarted on `durable`, at `now` on the new process's clock.
    ///
    /// A group of one replays its log beyond the materialized rows and takes over at once: every
    /// `RUNNING` attempt gets a re-adoption window (its worker may reconnect and report it),
    /// every `RETRY_WAIT` job restarts its backoff from now. A member of a larger group starts as
    /// a follower; entries beyond its rows are applied once a leader says they are committed. No
    /// instant from the previous process is trusted, because it was measured on another clock.
    pub fn recover(
        config: CoordinatorConfig,
        seed: u64,
        now: Instant,
        durable: DurableState,
    ) -> Result<Coordinator, RecoveryError> {
        Coordinator::build(config, seed, now, durable, true)
    }

    fn build(
        config: CoordinatorConfig,
        seed: u64,
        now: Instant,
        durable: DurableState,
        recovering: bool,
    ) -> Result<Coordinator, RecoveryError> {
        config.validate()?;
        // A driver should hand every process start a fresh seed. Should it reuse one, mixing in
        // how far the disk has come keeps ids from repeating: anything the previous process
        // revealed was made durable first, so the disk has moved on since it drew its ids.
        let last_on_disk = durable
            .log
            .iter()
            .map(|e| e.index)
            .max()
            .unwrap_or_default()
            .max(durable.applied);
        let seed = if recovering {
            mix_seed(seed, last_on_disk.0)
        } else {
            seed
        };
        let rows = TableRows {
            jobs: durable.jobs,
            queues: durable.queues,
            key_buckets: durable.key_buckets,
        };
        let table = JobTable::from_rows(rows, durable.applied)?;
        let mut entries = Vec::new();
        let mut expected = durable.applied.next();
        for entry in durable.log {
            if entry.index <= durable.applied {
                continue;
            }
            if entry.index != expected {
                return Err(RecoveryError::LogGap {
                    expected,
                    found: entry.index,
                });
            }
            expected = expected.next();
            entries.push(entry);
        }
        let replica_config = ReplicaConfig {
            id: config.node_id.clone(),
            members: config.members(),
            election_timeout_min: config.election_timeout_min,
            election_timeout_max: config.election_timeout_max,
            heartbeat_interval: config.replication_heartbeat,
            max_frame_bytes: config.max_frame_bytes,
            retained_entries: config.log_retained_entries,
        };
        let replica = Replica::new(
            replica_config,
            mix_seed(seed, CONSENSUS_SEED_SALT),
            now,
            durable.hard_state,
            (durable.applied, durable.applied_term),
            entries,
        );
        let mut addresses = BTreeMap::new();
        addresses.insert(
            config.node_id.clone(),
            MemberAddresses {
                client: config.client_address.clone(),
                worker: config.worker_address.clone(),
            },
        );
        let mut coordinator = Coordinator {
            member: Member {
                config,
                rng: ChaCha8Rng::seed_from_u64(seed),
                table,
                replica,
                persistence: Persistence::new(durable.applied),
                outputs: VecDeque::new(),
                now,
                addresses,
                callers: BTreeMap::new(),
            },
            leader: None,
            parked: Parked::default(),
        };
        coordinator.apply_committed();
        if coordinator.member.replica.is_abstaining() {
            coordinator.member.event(Event::Abstaining);
        }
        if coordinator.member.replica.is_leader() {
            // A group of one leads from its first moment.
            let leader = if recovering {
                LeaderState::take_over(&mut coordinator.member, leader::Takeover::Restart)
            } else {
                LeaderState::fresh(&coordinator.member)
            };
            coordinator.leader = Some(leader);
        }
        coordinator.member.replica.compact();
        Ok(coordinator)
    }

    // -----------------------------------------------------------------------------------------
    // Read access (for drivers, tests and the simulator's checker)
    // -----------------------------------------------------------------------------------------

    pub fn config(&self) -> &CoordinatorConfig {
        &self.member.config
    }

    pub fn table(&self) -> &JobTable {
        &self.member.table
    }

    pub fn job(&self, job_id: &crate::ids::JobId) -> Option<&Job> {
        self.member.table.get(job_id)
    }

    /// The consensus state of this member (term, role, log, commit index).
    pub fn replica(&self) -> &Replica {
        &self.member.replica
    }

    /// Whether this member leads and has caught up with its term, so it schedules and answers.
    pub fn is_acting_leader(&self) -> bool {
        self.leader.is_some()
    }

    /// The workers the leader tracks (none on a member that does not lead).
    pub fn workers(&self) -> impl Iterator<Item = &WorkerEntry> {
        self.leader.iter().flat_map(LeaderState::workers)
    }

    /// Timers armed (for tests and the simulator: it must track the work in flight, not grow).
    pub fn armed_timers(&self) -> usize {
        self.leader.as_ref().map_or(0, LeaderState::armed_timers)
    }

    /// Attempts still waiting to be re-adopted after recovery.
    pub fn awaiting_readoption(&self) -> usize {
        self.leader
            .as_ref()
            .map_or(0, LeaderState::awaiting_readoption)
    }

    // -----------------------------------------------------------------------------------------
    // Outputs
    // -----------------------------------------------------------------------------------------

    /// The next thing to do, or `None` when there is nothing left until the next input.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.member.poll_output()
    }

    /// When `handle_timeout` should next be called.
    /// Encoded bytes of log entries handed out for persistence (or about to be) and not yet
    /// reported durable. A driver stops taking new client requests while this is above its
    /// bound, so a slow disk cannot make proposals pile up in memory.
    pub fn unwritten_bytes(&self) -> u64 {
        self.member.persistence.unwritten_bytes()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let leader = self.leader.as_ref().and_then(LeaderState::next_timer);
        let replica = self.member.replica.poll_timeout();
        let rows = self.member.persistence.poll_timeout();
        [leader, replica, rows].into_iter().flatten().min()
    }

    // -----------------------------------------------------------------------------------------
    // Inputs
    // -----------------------------------------------------------------------------------------

    /// Every batch up to and including `batch` is durable.
    pub fn handle_persisted(&mut self, now: Instant, batch: BatchId) {
        self.member.advance_clock(now);
        if let Some(records) = self.member.persistence.durable(batch, self.member.now) {
            self.member.replica.handle_persisted(records);
        }
        self.apply_committed();
        // Applying may have changed what this member is; the leader state acts only if it
        // still leads.
        self.settle_role();
        if let Some(leader) = self.leader.as_mut() {
            leader.schedule(&mut self.member);
        }
        self.settle();
    }

    /// A frame on `conn` could not be decoded: answer with a typed error and hang up.
    pub fn handle_malformed(
        &mut self,
        now: Instant,
        conn: ConnectionId,
        link: Link,
        error: &FrameError,
    ) {
        let m = &mut self.member;
        m.advance_clock(now);
        let code = ErrorCode::from(error);
        let message = wrong_port_hint(link, error).unwrap_or_else(|| error.to_string());
        m.event(Event::MalformedFrame {
            conn,
            error: message.clone(),
        });
        match link {
            Link::Worker => m.send_worker(conn, CoordinatorToWorker::Error { code, message }),
            Link::Client => m.send_client(
                conn,
                ClientReply::Error {
                    request_id: None,
                    code,
                    message,
                },
            ),
        }
        m.close(conn);
        self.handle_closed(now, conn);
    }

    /// `conn` is gone (closed by the peer, reset, or closed by us).
    pub fn handle_closed(&mut self, now: Instant, conn: ConnectionId) {
        self.member.advance_clock(now);
        self.parked.forget(conn);
        if let Some(leader) = self.leader.as_mut() {
            leader.handle_closed(&mut self.member, conn);
        }
        self.member.callers.remove(&conn);
        self.settle();
    }

    /// The driver read the wall clock: `wall` at `now`. Drivers read it now and then (the
    /// runtime once a second); a step (`WALL_CLOCK_STEP_MIN` or more from what this member's
    /// clock expects) is taken, anything smaller is drift and ignored.
    pub fn handle_wall_clock(&mut self, now: Instant, wall: UnixMillis) {
        self.member.advance_clock(now);
        let Some(step_millis) = self.member.observe_wall_clock(wall) else {
            return;
        };
        self.member.event(Event::WallClockStepped { step_millis });
        if let Some(leader) = self.leader.as_mut() {
            leader.wall_clock_moved(&mut self.member);
        }
        self.settle();
    }

    /// The earliest timers are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.member.advance_clock(now);
        if self
            .member
            .replica
            .poll_timeout()
            .is_some_and(|at| at <= self.member.now)
        {
            self.member.replica.handle_timeout(self.member.now);
            // A leader that just stepped down (CheckQuorum) must not run its timers.
            self.settle_role();
        }
        if let Some(leader) = self.leader.as_mut() {
            leader.handle_timeout(&mut self.member);
        }
        self.settle();
    }

    pub fn handle_worker_message(
        &mut self,
        now: Instant,
        conn: ConnectionId,
        message: WorkerToCoordinator,
    ) {
        self.member.advance_clock(now);
        if let Some(leader) = self.leader.as_mut() {
            leader.handle_worker_message(&mut self.member, conn, message);
        } else {
            self.worker_message_without_leader(conn, message);
        }
        self.settle();
    }

    /// A request from `caller`, as its connection authenticated (`Caller::anonymous()` on a
    /// port that checks no tokens). A request the caller's role does not allow is answered
    /// `FORBIDDEN` and changes nothing, on every member alike.
    pub fn handle_client_message(
        &mut self,
        now: Instant,
        conn: ConnectionId,
        caller: &Caller,
        message: ClientRequest,
    ) {
        self.member.advance_clock(now);
        let known = self
            .member
            .callers
            .entry(conn)
            .or_insert_with(|| caller.clone());
        assert_eq!(
            known, caller,
            "client connection {conn} changed its caller; a connection authenticates once"
        );
        if caller.role.permits(&message) {
            self.client_message(conn, message);
        } else {
            self.forbid(conn, caller, &message);
        }
        self.settle();
    }

    fn forbid(&mut self, conn: ConnectionId, caller: &Caller, message: &ClientRequest) {
        let request = message.type_name();
        let needed = Role::needed_for(message);
        let m = &mut self.member;
        m.event(Event::Forbidden {
            conn,
            caller: caller.describe(),
            request,
        });
        m.send_client(
            conn,
            ClientReply::Error {
                request_id: Some(message.request_id()),
                code: ErrorCode::Forbidden,
                message: format!(
                    "{request} needs a token with the role {needed} or above; this connection holds {}",
                    caller.describe()
                ),
            },
        );
    }

    /// A message from another member of the group.
    pub fn handle_peer_message(&mut self, now: Instant, from: &NodeId, message: PeerMessage) {
        self.member.advance_clock(now);
        self.peer_message(from, message);
        self.settle();
    }

    /// Applies every committed entry to the table; the leader, if this member leads, makes each
    /// outcome visible.
    fn apply_committed(&mut self) {
        while let Some(entry) = self.member.replica.pop_committed() {
            let outcome = self
                .member
                .table
                .apply(entry.index, entry.at, &entry.command);
            self.member.persistence.mark_dirty(outcome.changed_jobs());
            let queues = self.member.table.take_changed_queues();
            self.member.persistence.mark_queues_dirty(queues);
            let buckets = self.member.table.take_changed_key_buckets();
            self.member.persistence.mark_key_buckets_dirty(buckets);
            if let Some(leader) = self.leader.as_mut() {
                leader.on_entry_applied(&mut self.member, &entry, outcome);
            }
        }
    }
}

/// A message of the other link's kind names the likely mistake: a worker pointed at the client
/// port, or a client at the worker port.
fn wrong_port_hint(link: Link, error: &FrameError) -> Option<String> {
    let FrameError::UnknownType { type_name } = error else {
        return None;
    };
    match link {
        Link::Client if WorkerToCoordinator::is_known_type(type_name) => Some(format!(
            "{type_name} is a worker's message, but this is the coordinator's client port: point the worker at the worker port (7070 by default)"
        )),
        Link::Worker if ClientRequest::is_known_type(type_name) => Some(format!(
            "{type_name} is a client's request, but this is the coordinator's worker port: point the client at the client port (7071 by default)"
        )),
        _ => None,
    }
}

/// Derives a new seed from `seed` and `salt` (splitmix64 finalizer), so nearby inputs give
/// unrelated streams.
fn mix_seed(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
