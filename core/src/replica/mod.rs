//! Consensus: Raft (Ongaro and Ousterhout, 2014; the Raft dissertation, Ongaro, 2014), as a
//! sans-IO state machine. It decides which commands are in the log, which are committed and who
//! leads; it knows nothing of jobs. The coordinator talks to it through this surface only:
//!
//! ```text
//!   propose(command)        ──> Ok(Proposal { term, index }) | Err(NotLeader { leader_hint })
//!   handle_message(from, m) <── a peer's PRE_VOTE / VOTE / APPEND / SNAPSHOT / ... (+ replies)
//!   handle_timeout(now)     <── poll_timeout() is due: elections, heartbeats, quorum checks
//!   take_records()          ──> records to persist (term and vote, entries, truncations), in order
//!   handle_persisted(seq)   <── every record up to `records_taken()` == seq is durable here
//!   flush(snapshots)        ──> build the APPENDs / SNAPSHOT chunks owed to followers
//!   poll_message()          ──> (peer, message) to send
//!   pop_committed()         ──> committed entries, in index order, each exactly once, to apply
//!   poll_event()            ──> role changes, confirmed reads, a snapshot to install
//! ```
//!
//! Calling order for the coordinator: after feeding any input, `take_records` into the open
//! persistence batch, then `flush`, then drain `poll_message`, `poll_event` and `pop_committed`.
//!
//! Rules that hold by construction:
//!
//! - **Durable before it answers.** A vote, an append acknowledgement or a snapshot
//!   acknowledgement is held back until every record this member produced before it is durable
//!   (paper figure 2, "respond after persisting"). A leader sends its own new entries at once and
//!   counts itself towards a majority only for what is durable on its disk (dissertation 10.2.1).
//! - **Committed means on a majority, counted in the current term only** (paper 5.4.2, figure 8).
//! - **Applied means committed and durable here**, so a member never reveals what its own disk
//!   could still lose.
//! - **PreVote and CheckQuorum** (dissertation 9.6 and 6.2): a member cut off from the group asks
//!   before it raises its term, members that hear from a live leader refuse, and a leader that
//!   has not heard from a majority within an election timeout steps down.
//!
//! A group of one needs no election: its only member is its majority. It leads from its first
//! moment, and every entry on its disk is committed.

mod election;
mod follower;
mod leader;
pub mod log;
mod rejoin;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::command::{Command, LogEntry};
use crate::ids::{LogIndex, NodeId, Term};
use crate::protocol::PeerMessage;
use crate::storage::{HardState, Record};
use crate::time::{Instant, UnixMillis};
use leader::Leading;
use log::RaftLog;
use rejoin::Abstaining;

pub use leader::{FollowerProgress, SnapshotSource};

/// How one member takes part in consensus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    pub id: NodeId,
    /// Every member of the group, this one included. Membership is static.
    pub members: Vec<NodeId>,
    /// Election timeouts are drawn uniformly from `[min, max)` (paper 5.2).
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// How often a leader sends heartbeats (and retransmits what was not acknowledged).
    pub heartbeat_interval: Duration,
    /// The frame limit of the peer link: an `APPEND` or `SNAPSHOT` chunk never exceeds it.
    pub max_frame_bytes: usize,
    /// Applied entries kept beyond what every follower holds (see `compact`).
    pub retained_entries: u64,
}

impl ReplicaConfig {
    /// A group of one with the given id.
    pub fn single(id: NodeId, max_frame_bytes: usize) -> ReplicaConfig {
        ReplicaConfig {
            members: vec![id.clone()],
            id,
            election_timeout_min: Duration::from_millis(300),
            election_timeout_max: Duration::from_millis(600),
            heartbeat_interval: Duration::from_millis(50),
            max_frame_bytes,
            retained_entries: crate::limits::LOG_RETAINED_ENTRIES_MAX,
        }
    }

    fn quorum(&self) -> usize {
        self.members.len() / 2 + 1
    }
}

/// Where a proposed command landed in the log. Its outcome is known when the entry at exactly
/// this `(term, index)` is applied; an entry of another term at the same index is someone
/// else's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Proposal {
    pub term: Term,
    pub index: LogIndex,
}

/// This member does not lead; `leader_hint` is the leader it knows of, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLeader {
    pub leader_hint: Option<NodeId>,
}

/// A member's role in the current term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleKind {
    Follower,
    /// Asking whether an election could be won, without raising its term (dissertation 9.6).
    PreCandidate,
    Candidate,
    Leader,
}

impl std::fmt::Display for RoleKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RoleKind::Follower => "follower",
            RoleKind::PreCandidate => "pre-candidate",
            RoleKind::Candidate => "candidate",
            RoleKind::Leader => "leader",
        })
    }
}

/// Why a leader stopped leading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepDownReason {
    /// A message carried a higher term.
    HigherTerm { term: Term, from: NodeId },
    /// It had not heard from a majority within an election timeout (CheckQuorum).
    LostQuorum { heard_from: usize, quorum: usize },
    /// It handed leadership to another member (`TIMEOUT_NOW`).
    Transferred { to: NodeId },
}

impl std::fmt::Display for StepDownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepDownReason::HigherTerm { term, from } => {
                write!(f, "{from} is in the higher term {}", term.0)
            }
            StepDownReason::LostQuorum { heard_from, quorum } => write!(
                f,
                "heard from {heard_from} of the {quorum} members a majority needs within an election timeout"
            ),
            StepDownReason::Transferred { to } => write!(f, "handed leadership to {to}"),
        }
    }
}

/// Something the coordinator must know or act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaEvent {
    /// This member won the election for `term`. It is ready to serve once its first entry of
    /// the term is applied (see [`Replica::leader_since`]).
    BecameLeader {
        term: Term,
    },
    SteppedDown {
        term: Term,
        reason: StepDownReason,
    },
    /// An election timeout passed without word from a leader.
    ElectionStarted {
        term: Term,
        pre_vote: bool,
    },
    /// A new leader of `term` made itself known.
    LeaderKnown {
        term: Term,
        leader: NodeId,
    },
    /// Leadership was confirmed for read `id`: once `index` is applied, the read may be answered
    /// (dissertation 6.4).
    ReadReady {
        id: u64,
        index: LogIndex,
    },
    /// A whole snapshot arrived. The coordinator decodes it, replaces its table and calls
    /// [`Replica::install_snapshot`] (or [`Replica::refuse_snapshot`] if it does not decode).
    SnapshotReceived {
        index: LogIndex,
        term: Term,
        data: Vec<u8>,
    },
    /// A message from a node that is not a member was ignored.
    StrangerIgnored {
        from: NodeId,
    },
    /// An empty member has heard every member (and, in a group that holds data, caught up):
    /// it takes part in elections from `term` on (see `rejoin`).
    Rejoined {
        term: Term,
    },
    /// A follower no longer holds entries it acknowledged (its disk was lost): replication to it
    /// starts over from what it holds.
    FollowerLostEntries {
        follower: NodeId,
        acknowledged: LogIndex,
        holds: LogIndex,
    },
    /// A member sent something Raft rules out (a bug somewhere); it was ignored.
    ProtocolViolation {
        from: NodeId,
        what: String,
    },
}

/// Why leadership could not be handed over.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("this member does not lead")]
    NotLeader(NotLeader),
    #[error("{0} is not a member of the group (or is this member)")]
    NotAPeer(NodeId),
    #[error("a group of one has no one to hand leadership to")]
    Alone,
}

#[derive(Debug)]
enum Role {
    Follower,
    PreCandidate { granted: BTreeSet<NodeId> },
    Candidate { granted: BTreeSet<NodeId> },
    Leader(Box<Leading>),
}

/// A snapshot arriving from the leader, chunk by chunk.
#[derive(Debug)]
struct Incoming {
    index: LogIndex,
    term: Term,
    total: u64,
    data: Vec<u8>,
}

pub struct Replica {
    config: ReplicaConfig,
    rng: ChaCha8Rng,
    now: Instant,
    term: Term,
    voted_for: Option<NodeId>,
    role: Role,
    /// The leader of the current term, once known.
    leader: Option<NodeId>,
    /// When this member last heard from the leader of its term (for the PreVote lease check).
    leader_contact: Option<Instant>,
    log: RaftLog,
    commit: LogIndex,
    /// The last entry handed out by `pop_committed` (or folded in by a snapshot).
    applied: LogIndex,
    /// Entries up to here are on this member's disk.
    durable: LogIndex,
    election_deadline: Instant,
    /// Records produced and not yet taken by the coordinator.
    records: Vec<Record>,
    records_emitted: u64,
    records_taken: u64,
    /// Records durable so far (a count, comparable with `records_taken`).
    records_durable: u64,
    /// (records taken through, last log index then): how far the log is durable once they are.
    marks: VecDeque<(u64, LogIndex)>,
    /// The term is new and not yet written (a group of one writes it with its first entry).
    hard_state_unsaved: bool,
    messages: VecDeque<(NodeId, PeerMessage)>,
    /// Replies released once `records_durable` reaches the first field.
    held: VecDeque<(u64, NodeId, PeerMessage)>,
    events: VecDeque<ReplicaEvent>,
    incoming: Option<Incoming>,
    /// Whom to tell, once an installed snapshot is durable: (leader, seq, snapshot bytes).
    pending_snapshot_reply: Option<(NodeId, u64, u64)>,
    /// Abstaining from elections after an empty start (see `rejoin`).
    abstaining: Option<Abstaining>,
    /// The last snapshot this process installed: entries up to it were never applied here.
    installed_snapshot: LogIndex,
    /// The member this one handed leadership to, until a leader is known again (a hint for
    /// redirects while the election it started runs).
    handed_to: Option<NodeId>,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.config.id)
            .field("term", &self.term)
            .field("role", &self.role_kind())
            .field("last", &self.log.last_index())
            .field("commit", &self.commit)
            .finish_non_exhaustive()
    }
}

impl Replica {
    /// A member starting at `now` on what its disk holds: its term and vote, the log base (the
    /// entry the job table reflects) and the log entries after it.
    pub fn new(
        config: ReplicaConfig,
        seed: u64,
        now: Instant,
        hard_state: HardState,
        base: (LogIndex, Term),
        entries: Vec<LogEntry>,
    ) -> Replica {
        assert!(
            config.members.contains(&config.id),
            "a member is in its own group"
        );
        let mut log = RaftLog::new(base.0, base.1);
        for entry in entries {
            log.append(entry);
        }
        let last = log.last_index();
        let empty = hard_state == HardState::default() && last == LogIndex(0);
        let mut replica = Replica {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now,
            term: hard_state.term.max(log.last_term()),
            voted_for: hard_state.voted_for.clone(),
            role: Role::Follower,
            leader: None,
            leader_contact: None,
            log,
            commit: base.0,
            applied: base.0,
            durable: last,
            election_deadline: now,
            records: Vec::new(),
            records_emitted: 0,
            records_taken: 0,
            records_durable: 0,
            marks: VecDeque::new(),
            hard_state_unsaved: false,
            messages: VecDeque::new(),
            held: VecDeque::new(),
            events: VecDeque::new(),
            incoming: None,
            pending_snapshot_reply: None,
            abstaining: ((empty && config.members.len() > 1) || hard_state.abstaining)
                .then(Abstaining::default),
            installed_snapshot: LogIndex(0),
            handed_to: None,
            config,
        };
        if replica.config.members.len() == 1 {
            // Everything on the only member's disk is on a majority: committed. No election is
            // held, so the term stays what the disk says (1 on an empty disk): no other member
            // could ever have led it.
            replica.commit = last;
            replica.term = replica.term.max(Term(1));
            let me = Some(replica.config.id.clone());
            replica.hard_state_unsaved = replica.term != hard_state.term || replica.voted_for != me;
            replica.voted_for = me;
            replica.leader = Some(replica.config.id.clone());
            let leading = Leading::new(&replica.config, last, now);
            replica.role = Role::Leader(Box::new(leading));
        } else {
            replica.reset_election_deadline();
        }
        replica
    }

    // -----------------------------------------------------------------------------------------
    // Read access
    // -----------------------------------------------------------------------------------------

    pub fn id(&self) -> &NodeId {
        &self.config.id
    }

    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    pub fn term(&self) -> Term {
        self.term
    }

    pub fn voted_for(&self) -> Option<&NodeId> {
        self.voted_for.as_ref()
    }

    pub fn role_kind(&self) -> RoleKind {
        match self.role {
            Role::Follower => RoleKind::Follower,
            Role::PreCandidate { .. } => RoleKind::PreCandidate,
            Role::Candidate { .. } => RoleKind::Candidate,
            Role::Leader(_) => RoleKind::Leader,
        }
    }

    pub fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader(_))
    }

    /// The leader of the current term, if known (this member itself when it leads).
    pub fn leader(&self) -> Option<&NodeId> {
        self.leader.as_ref()
    }

    /// While leading: the index of the last entry from before this term (a group of one) or of
    /// this term's first entry. Once it is applied, the table holds everything committed before
    /// this member took over, and the leader may act on it.
    pub fn leader_since(&self) -> Option<LogIndex> {
        match &self.role {
            Role::Leader(leading) => Some(leading.term_start),
            _ => None,
        }
    }

    pub fn last_index(&self) -> LogIndex {
        self.log.last_index()
    }

    pub fn last_term(&self) -> Term {
        self.log.last_term()
    }

    pub fn committed_index(&self) -> LogIndex {
        self.commit
    }

    pub fn durable_index(&self) -> LogIndex {
        self.durable
    }

    pub fn applied_index(&self) -> LogIndex {
        self.applied
    }

    /// The last snapshot this process installed (0: none): the entries up to it reached this
    /// member's job table through the snapshot, not through its log.
    pub fn installed_snapshot(&self) -> LogIndex {
        self.installed_snapshot
    }

    pub fn log(&self) -> &RaftLog {
        &self.log
    }

    /// The term of the entry at `index`, if this member still holds it (or it is the base).
    pub fn term_at(&self, index: LogIndex) -> Option<Term> {
        self.log.term_at(index)
    }

    /// The leader's view of each follower (empty on a member that does not lead).
    pub fn followers(&self) -> Vec<FollowerProgress> {
        match &self.role {
            Role::Leader(leading) => leading.views(self.now),
            _ => Vec::new(),
        }
    }

    fn not_leader(&self) -> NotLeader {
        NotLeader {
            leader_hint: self.leader_hint().cloned(),
        }
    }

    /// Where a client or worker should go instead of this member: the leader it knows, or the
    /// member it just handed leadership to.
    pub fn leader_hint(&self) -> Option<&NodeId> {
        self.transferring_to()
            .or(self.leader.as_ref())
            .or(self.handed_to.as_ref())
            .filter(|l| **l != self.config.id)
    }

    // -----------------------------------------------------------------------------------------
    // Proposals and reads
    // -----------------------------------------------------------------------------------------

    /// Appends `command` to the log if this member leads. It commits (and so applies) once it is
    /// durable on a majority; the `APPEND`s carrying it go out at the next `flush`.
    /// `at` is the wall time the entry is stamped with.
    pub fn propose(&mut self, command: Command, at: UnixMillis) -> Result<Proposal, NotLeader> {
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        Ok(self.append_own(command, at))
    }

    fn append_own(&mut self, command: Command, at: UnixMillis) -> Proposal {
        self.save_hard_state_if_unsaved();
        let entry = LogEntry {
            index: self.log.last_index().next(),
            term: self.term,
            at,
            command,
        };
        let proposal = Proposal {
            term: entry.term,
            index: entry.index,
        };
        self.log.append(entry.clone());
        self.emit(Record::Log(Box::new(entry)));
        if let Role::Leader(leading) = &mut self.role {
            leading.replication_due = true;
        }
        proposal
    }

    /// Asks for leadership to be confirmed for read `id` (dissertation 6.4, ReadIndex): a
    /// [`ReplicaEvent::ReadReady`] follows once a majority has acknowledged this member as
    /// leader after the request.
    pub fn request_read(&mut self, id: u64) -> Result<(), NotLeader> {
        let quorum = self.config.quorum();
        let commit = self.commit;
        let Role::Leader(leading) = &mut self.role else {
            return Err(self.not_leader());
        };
        assert!(
            commit >= leading.term_start,
            "reads are served only once the leader's first entry is committed"
        );
        if quorum == 1 {
            self.events
                .push_back(ReplicaEvent::ReadReady { id, index: commit });
            return Ok(());
        }
        leading.queue_read(id, commit);
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // Persistence
    // -----------------------------------------------------------------------------------------

    fn emit(&mut self, record: Record) {
        self.records.push(record);
        self.records_emitted += 1;
    }

    fn save_hard_state(&mut self) {
        self.hard_state_unsaved = false;
        self.emit(Record::HardState(HardState {
            term: self.term,
            voted_for: self.voted_for.clone(),
            abstaining: self.abstaining.is_some(),
        }));
    }

    fn save_hard_state_if_unsaved(&mut self) {
        if self.hard_state_unsaved {
            self.save_hard_state();
        }
    }

    /// The records to persist, in the order they must reach the disk.
    pub fn take_records(&mut self) -> std::vec::Drain<'_, Record> {
        if !self.records.is_empty() {
            self.records_taken += self.records.len() as u64;
            self.marks
                .push_back((self.records_taken, self.log.last_index()));
        }
        self.records.drain(..)
    }

    /// How many records have been taken so far: once a batch holding all of them is durable,
    /// call [`Replica::handle_persisted`] with this number.
    pub fn records_taken(&self) -> u64 {
        self.records_taken
    }

    /// Every record up to the `through`-th taken is durable on this member's disk.
    pub fn handle_persisted(&mut self, through: u64) {
        assert!(
            through <= self.records_taken,
            "records cannot be durable before they are taken"
        );
        self.records_durable = self.records_durable.max(through);
        while let Some(&(seq, index)) = self.marks.front() {
            if seq > self.records_durable {
                break;
            }
            self.marks.pop_front();
            self.durable = self.durable.max(index.min(self.log.last_index()));
        }
        while let Some((required, _, _)) = self.held.front() {
            if *required > self.records_durable {
                break;
            }
            if let Some((_, to, message)) = self.held.pop_front() {
                // One decided in a term this member has since left is dropped: nobody needs a
                // vote, a request or an answer of an ended term, and sending it would speak
                // for a term the member no longer holds.
                if message.term().is_none_or(|term| term >= self.term) {
                    self.messages.push_back((to, message));
                }
            }
        }
        if self.is_leader() {
            self.advance_commit();
        }
    }

    /// Sends `message` once everything produced so far is durable.
    fn send_when_durable(&mut self, to: NodeId, message: PeerMessage) {
        if self.records_emitted <= self.records_durable {
            self.messages.push_back((to, message));
        } else {
            self.held.push_back((self.records_emitted, to, message));
        }
    }

    fn send(&mut self, to: NodeId, message: PeerMessage) {
        self.messages.push_back((to, message));
    }

    /// A suffix after `index` is gone: nothing beyond it can be durable any more.
    fn note_truncation(&mut self, index: LogIndex) {
        self.durable = self.durable.min(index);
        for mark in self.marks.iter_mut() {
            mark.1 = mark.1.min(index);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Outputs
    // -----------------------------------------------------------------------------------------

    pub fn poll_message(&mut self) -> Option<(NodeId, PeerMessage)> {
        self.messages.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<ReplicaEvent> {
        self.events.pop_front()
    }

    /// Commit never reaches past the entries this member holds; asserted where it moves, in
    /// every build.
    fn assert_commit_held(&self) {
        let held = self.log.last_index();
        assert!(
            self.commit <= held,
            "commit {} beyond the last entry held, {held}",
            self.commit
        );
    }

    /// The next committed entry not yet applied. Only entries durable here are handed out.
    pub fn pop_committed(&mut self) -> Option<LogEntry> {
        let ready = self.commit.min(self.durable);
        if self.applied >= ready {
            return None;
        }
        let next = self.applied.next();
        let entry = self.log.get(next).cloned();
        assert!(
            entry.is_some(),
            "committed entry {next} is missing from the log (base {})",
            self.log.base_index()
        );
        self.applied = next;
        entry
    }

    /// Forgets applied entries no follower is likely to need any more; a follower that needs
    /// one later gets a snapshot instead. A group of one keeps none.
    pub fn compact(&mut self) {
        let through = if self.config.members.len() == 1 {
            self.applied
        } else {
            // A leader keeps what its slowest follower still lacks; any member keeps a window
            // of applied entries, for the followers it may have to serve once it leads.
            let keep_from = match &self.role {
                Role::Leader(leading) => leading.slowest_match(),
                _ => LogIndex(0),
            };
            let floor = LogIndex(self.applied.0.saturating_sub(self.config.retained_entries));
            keep_from.max(floor).min(self.applied)
        };
        self.log.compact_through(through);
        self.log
            .compact_to_bytes(crate::limits::LOG_RETAINED_BYTES_MAX, self.applied);
    }

    /// When `handle_timeout` should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.role {
            Role::Leader(leading) => leading.next_deadline(),
            _ => Some(self.election_deadline),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Inputs
    // -----------------------------------------------------------------------------------------

    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        match self.role {
            Role::Leader(_) => self.leader_tick(),
            _ => {
                if self.now >= self.election_deadline {
                    if self.is_abstaining() {
                        self.probe_terms();
                    } else {
                        self.start_pre_vote();
                    }
                }
            }
        }
    }

    /// `peer` opened a new connection to this member (its `HELLO` arrived). Whatever it said
    /// on an earlier connection may have come from a process that has since lost its disk, so
    /// a leader starts that follower's progress over (see `Leading`).
    pub fn peer_connected(&mut self, now: Instant, peer: &NodeId) {
        self.now = self.now.max(now);
        if self.config.members.contains(peer) && *peer != self.config.id {
            self.peer_reconnected(peer);
        }
    }

    pub fn handle_message(&mut self, now: Instant, from: &NodeId, message: PeerMessage) {
        self.now = self.now.max(now);
        if !self.config.members.contains(from) || *from == self.config.id {
            self.events
                .push_back(ReplicaEvent::StrangerIgnored { from: from.clone() });
            return;
        }
        self.note_peer(from, &message);
        let Some(term) = message.term() else {
            return;
        };
        // Paper 5.1: a higher term makes this member a follower of it, except for the
        // questions and answers of PreVote, which are about a term nobody is in yet, and for
        // votes ignored because a live leader is known (dissertation 9.6).
        if term > self.term && self.adopts_higher_term(&message) {
            let leader = match &message {
                PeerMessage::Append { .. }
                | PeerMessage::Snapshot { .. }
                | PeerMessage::TimeoutNow { .. } => Some(from.clone()),
                _ => None,
            };
            self.become_follower(term, leader, Some(from.clone()));
        }
        match message {
            PeerMessage::Hello { .. } => {}
            PeerMessage::PreVote {
                term,
                last_index,
                last_term,
            } => self.on_pre_vote(from, term, last_index, last_term),
            PeerMessage::PreVoteReply { term, granted, .. } => {
                self.on_pre_vote_reply(from, term, granted)
            }
            PeerMessage::Vote {
                term,
                last_index,
                last_term,
                ..
            } => self.on_vote(from, term, last_index, last_term),
            PeerMessage::VoteReply { term, granted } => self.on_vote_reply(from, term, granted),
            PeerMessage::Append {
                term,
                prev_index,
                prev_term,
                entries,
                commit,
                seq,
            } => self.on_append(from, term, prev_index, prev_term, entries, commit, seq),
            PeerMessage::AppendReply {
                term,
                success,
                index,
                conflict_term,
                seq,
                abstaining,
            } => self.on_append_reply(from, term, success, index, conflict_term, seq, abstaining),
            PeerMessage::Snapshot {
                term,
                index,
                index_term,
                offset,
                total,
                data,
                seq,
            } => self.on_snapshot(from, term, index, index_term, offset, total, &data.0, seq),
            PeerMessage::SnapshotReply {
                term,
                index,
                received,
                seq,
                abstaining,
            } => self.on_snapshot_reply(from, term, index, received, seq, abstaining),
            PeerMessage::TimeoutNow { term } => self.on_timeout_now(from, term),
        }
    }

    /// Whether a message of a higher term than ours makes us adopt that term.
    fn adopts_higher_term(&self, message: &PeerMessage) -> bool {
        match message {
            PeerMessage::PreVote { .. } => false,
            PeerMessage::PreVoteReply { granted, .. } => !granted,
            PeerMessage::Vote { transfer, .. } => *transfer || !self.hears_from_leader(),
            _ => true,
        }
    }

    /// Whether a leader (this member, or the one it follows) was heard from within the minimum
    /// election timeout: then no election is needed, and votes for one are refused.
    fn hears_from_leader(&self) -> bool {
        match &self.role {
            Role::Leader(_) => true,
            _ => self
                .leader_contact
                .is_some_and(|at| self.now < at.saturating_add(self.config.election_timeout_min)),
        }
    }

    /// Becomes a follower in `term` (a higher one, or the current one when a leader for it
    /// appears). `leader` is the leader if the message proves it.
    fn become_follower(&mut self, term: Term, leader: Option<NodeId>, cause: Option<NodeId>) {
        let was_leader = self.is_leader();
        if term > self.term {
            self.term = term;
            self.voted_for = None;
            self.save_hard_state();
        }
        self.role = Role::Follower;
        if was_leader {
            let from = cause.unwrap_or_else(|| self.config.id.clone());
            self.events.push_back(ReplicaEvent::SteppedDown {
                term: self.term,
                reason: StepDownReason::HigherTerm { term, from },
            });
        }
        self.set_leader(leader);
        self.reset_election_deadline();
    }

    fn set_leader(&mut self, leader: Option<NodeId>) {
        if leader.is_some() && self.leader != leader {
            if let Some(id) = leader.clone() {
                self.events.push_back(ReplicaEvent::LeaderKnown {
                    term: self.term,
                    leader: id,
                });
            }
        }
        if leader.is_some() {
            self.leader_contact = Some(self.now);
            self.handed_to = None;
        }
        self.leader = leader;
    }

    fn violation(&mut self, from: &NodeId, what: String) {
        self.events.push_back(ReplicaEvent::ProtocolViolation {
            from: from.clone(),
            what,
        });
    }

    fn reset_election_deadline(&mut self) {
        let min = self.config.election_timeout_min.as_micros() as u64;
        let max = (self.config.election_timeout_max.as_micros() as u64).max(min + 1);
        let micros = min + self.rng.next_u64() % (max - min);
        self.election_deadline = self.now.saturating_add(Duration::from_micros(micros));
    }
}
