//! The coordinator state machine.
//!
//! ```text
//!  inputs (handle_*)                       Coordinator                          outputs (poll_output)
//!  ─────────────────                ┌───────────────────────────┐               ───────────────────
//!  worker message ───────────┐      │ leader soft state:        │   propose     Persist(batch) ──> disk
//!  client message ───────────┼────> │  registry, timers, waits, ├──> CommandLog
//!  connection closed/garbled ┘      │  in-flight proposals      │       │
//!  timer due (handle_timeout)──────>│                           │       │ handle_persisted(batch)
//!                                   │                           │       v
//!                                   │ JobTable  <── apply ── committed entries
//!                                   └──────────┬────────────────┘
//!                                              └──> ToWorker / ToClient / Close / Event
//! ```
//!
//! Calling order for a driver:
//!
//! 1. Feed one input: `handle_worker_message`, `handle_client_message`, `handle_malformed`,
//!    `handle_closed`, `handle_timeout` (when `poll_timeout` is due) or `handle_persisted`.
//! 2. Drain `poll_output` until it returns `None`. Perform sends and closes in order. Write each
//!    `Persist` batch durably, in order (several may be merged into one transaction), and then
//!    call `handle_persisted` with the highest batch id that is durable.
//! 3. Sleep until `poll_timeout`, the next input, or shutdown.
//!
//! **Durability before visibility.** A state change is only ever revealed to another node by
//! applying a committed log entry, and an entry is committed only once it is durable. Replies to
//! clients, assignments and cancels to workers and result acknowledgements are all produced while
//! applying, so no such output can leave before the records it depends on are on disk. Reads
//! (`STATUS`, `LIST`) are answered from the applied table, which holds only durable state.
//!
//! Leader soft state (worker liveness, slots, deadlines, backoff timers, parked waits) is not
//! persisted. After a restart it is rebuilt conservatively: running attempts get a re-adoption
//! window, backoffs restart from the moment of recovery.
//!
//! Inside, a coordinator is split by role:
//!
//! - [`member`]: what every member of the group has: the job table (the deterministic state
//!   machine every member applies committed entries to, silently), the consensus replica, the
//!   persistence batches and the outputs;
//! - [`leader`]: what only the leader has: the worker registry, timers, leases being settled,
//!   parked waits and the replies owed (keyed by the `(term, index)` of their proposal), built
//!   when the member starts leading;
//! - [`crate::replica`]: consensus behind a small interface (propose, records to persist,
//!   committed entries to apply).

mod config;
mod disk_image;
mod events;
mod leader;
mod member;
mod persistence;
mod registry;
mod timers;

use std::collections::VecDeque;

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub use crate::storage::{BatchId, DurableState, PersistBatch, Record};
pub use config::{ConfigError, CoordinatorConfig};
pub use disk_image::DiskImage;
pub use events::{Event, LossReason};
pub use registry::WorkerEntry;

use crate::command::{JobTable, TableError};
use crate::ids::{ConnectionId, LogIndex, Term};
use crate::job::Job;
use crate::protocol::codec::FrameError;
use crate::protocol::{
    ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode, WorkerToCoordinator,
};
use crate::replica::Replica;
use crate::time::Instant;
use leader::LeaderState;
use member::Member;
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

/// The coordinator. See the module documentation for the calling order.
pub struct Coordinator {
    member: Member,
    /// Present exactly while this member leads.
    leader: Option<LeaderState>,
}

impl Coordinator {
    /// A coordinator with an empty disk.
    pub fn new(config: CoordinatorConfig, seed: u64) -> Result<Coordinator, ConfigError> {
        config.validate()?;
        let replica = Replica::new(config.node_id.clone(), Term(1), LogIndex(0));
        Ok(Coordinator {
            member: Member {
                config,
                rng: ChaCha8Rng::seed_from_u64(seed),
                table: JobTable::new(),
                replica,
                persistence: Persistence::new(LogIndex(0)),
                outputs: VecDeque::new(),
                now: Instant::ZERO,
            },
            leader: Some(LeaderState::new()),
        })
    }

    /// A coordinator restarted on `durable`, at `now` on the new process's clock.
    ///
    /// Replays the log beyond the materialized rows, then takes over as leader: every `RUNNING`
    /// attempt gets a re-adoption window (its worker may reconnect and report it), every
    /// `RETRY_WAIT` job restarts its backoff from now. No instant from the previous process is
    /// trusted, because it was measured on another clock.
    pub fn recover(
        config: CoordinatorConfig,
        seed: u64,
        now: Instant,
        durable: DurableState,
    ) -> Result<Coordinator, RecoveryError> {
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
        let mut coordinator = Coordinator::new(config, mix_seed(seed, last_on_disk.0))?;
        coordinator.leader = None;
        let m = &mut coordinator.member;
        m.now = now;
        m.table = JobTable::from_rows(durable.jobs, durable.applied)?;
        m.replica = Replica::new(m.config.node_id.clone(), Term(1), durable.applied);
        m.persistence = Persistence::new(durable.applied);
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
            m.replica.restore(entry);
        }
        coordinator.apply_committed();
        coordinator.leader = Some(LeaderState::take_over(&mut coordinator.member));
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
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.leader.as_ref().and_then(LeaderState::next_timer)
    }

    // -----------------------------------------------------------------------------------------
    // Inputs
    // -----------------------------------------------------------------------------------------

    /// Every batch up to and including `batch` is durable.
    pub fn handle_persisted(&mut self, now: Instant, batch: BatchId) {
        self.member.advance_clock(now);
        if let Some(index) = self.member.persistence.durable(batch) {
            self.member.replica.mark_durable(index);
        }
        self.apply_committed();
        if let Some(leader) = self.leader.as_mut() {
            leader.schedule(&mut self.member);
        }
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
        let message = error.to_string();
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
        if let Some(leader) = self.leader.as_mut() {
            leader.handle_closed(&mut self.member, conn);
        }
    }

    /// The earliest timers are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.member.advance_clock(now);
        if let Some(leader) = self.leader.as_mut() {
            leader.handle_timeout(&mut self.member);
        }
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
        }
    }

    pub fn handle_client_message(
        &mut self,
        now: Instant,
        conn: ConnectionId,
        message: ClientRequest,
    ) {
        self.member.advance_clock(now);
        if let Some(leader) = self.leader.as_mut() {
            leader.handle_client_message(&mut self.member, conn, message);
        }
    }

    /// Applies every committed entry to the table; the leader, if this member leads, makes each
    /// outcome visible.
    fn apply_committed(&mut self) {
        while let Some(entry) = self.member.replica.pop_committed() {
            let outcome = self.member.table.apply(entry.index, &entry.command);
            self.member.persistence.mark_dirty(outcome.changed_jobs());
            if let Some(leader) = self.leader.as_mut() {
                leader.on_entry_applied(&mut self.member, &entry, outcome);
            }
        }
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
