//! The leader's side of replication (paper 5.3, 5.4, 7; dissertation 3.10, 6.2, 6.4): what
//! each follower holds, pipelined `APPEND`s, fast backtracking after a rejection, snapshots in
//! chunks, the commit rule, heartbeats, CheckQuorum, leadership transfer and ReadIndex.
//!
//! ```text
//!   per follower:  Probe ──success──> Replicate (up to APPENDS_IN_FLIGHT_MAX in flight)
//!                    ^ rejection / silence │
//!                    └─────────────────────┘
//!                  Probe/Replicate ──needs a compacted entry──> Snapshot ──installed──> Probe
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::log::RaftLog;
use super::{Replica, ReplicaConfig, ReplicaEvent, Role, StepDownReason, TransferError};
use crate::ids::{LogIndex, NodeId, Term};
use crate::limits::{
    APPENDS_IN_FLIGHT_MAX, APPEND_ENTRIES_MAX, PEER_ENVELOPE_BYTES, SNAPSHOT_CHUNKS_IN_FLIGHT_MAX,
};
use crate::protocol::{ChunkBytes, PeerMessage};
use crate::time::{as_millis_u64, Instant};

/// Where the leader gets a snapshot when a follower needs entries it no longer holds.
pub trait SnapshotSource {
    /// The job table as of its last applied entry: that entry's index, and the encoded rows.
    fn snapshot(&self) -> (LogIndex, Vec<u8>);
}

/// The leader's view of one follower, for `herder cluster`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowerProgress {
    pub id: NodeId,
    /// The last entry known to be durable on the follower and equal to the leader's.
    pub matched: LogIndex,
    pub next: LogIndex,
    pub mode: &'static str,
    /// How long ago the follower last answered this leader (`None`: not yet).
    pub last_heard_millis_ago: Option<u64>,
}

#[derive(Debug)]
enum Mode {
    /// Not known where the logs agree: one `APPEND` at a time until one succeeds.
    Probe { sent_at: Option<Instant> },
    /// Logs agree up to `matched`: new entries are sent as they come, several in flight.
    Replicate,
    /// The follower needs entries that were compacted away: it gets the job table instead.
    Snapshot(Arc<Image>),
}

#[derive(Debug)]
struct Image {
    index: LogIndex,
    term: Term,
    data: Vec<u8>,
}

#[derive(Debug)]
struct Progress {
    next: LogIndex,
    matched: LogIndex,
    mode: Mode,
    /// Replicate: the last index of each `APPEND` in flight, and when it left.
    in_flight: VecDeque<(LogIndex, Instant)>,
    /// Snapshot: the next byte to send, the bytes the follower confirmed, when a chunk last left.
    snapshot_offset: u64,
    snapshot_received: u64,
    snapshot_sent_at: Option<Instant>,
    last_heard: Option<Instant>,
    /// The highest `seq` this follower echoed: it recognised this leader after that round.
    acked_seq: u64,
    /// Replies echoing a `seq` below this answer messages sent before the follower's latest
    /// connection (`HELLO`), possibly to a process that has since lost its disk: ignored.
    first_seq: u64,
    /// What the follower had acknowledged before it reconnected, until its first reply on the
    /// new connection shows whether it still holds it (if not, its disk was lost).
    matched_before: LogIndex,
    /// Whether anything went to this follower in the current flush.
    sent_this_flush: bool,
    /// Its latest reply said it abstains (an empty disk not yet rejoined): it is replicated
    /// to, but counts towards no majority.
    abstaining: bool,
}

impl Progress {
    fn new(next: LogIndex, first_seq: u64) -> Progress {
        Progress {
            next,
            matched: LogIndex(0),
            mode: Mode::Probe { sent_at: None },
            in_flight: VecDeque::new(),
            snapshot_offset: 0,
            snapshot_received: 0,
            snapshot_sent_at: None,
            last_heard: None,
            acked_seq: 0,
            first_seq,
            matched_before: LogIndex(0),
            sent_this_flush: false,
            abstaining: false,
        }
    }
}

#[derive(Debug)]
struct PendingRead {
    id: u64,
    index: LogIndex,
    /// The heartbeat round whose acknowledgement by a majority confirms it (`None`: not sent).
    seq: Option<u64>,
}

#[derive(Debug)]
struct Transfer {
    to: NodeId,
    deadline: Instant,
}

#[derive(Debug)]
pub(super) struct Leading {
    /// See [`Replica::leader_since`].
    pub(super) term_start: LogIndex,
    progress: BTreeMap<NodeId, Progress>,
    heartbeat_at: Instant,
    heartbeat_due: bool,
    quorum_check_at: Instant,
    quorum_window_start: Instant,
    /// New entries were appended since the last flush.
    pub(super) replication_due: bool,
    seq: u64,
    reads: VecDeque<PendingRead>,
    transfer: Option<Transfer>,
    /// The last snapshot built, reused while it is still newer than the log's base.
    image: Option<Arc<Image>>,
}

impl Leading {
    pub(super) fn new(config: &ReplicaConfig, term_start: LogIndex, now: Instant) -> Leading {
        let progress = config
            .members
            .iter()
            .filter(|m| **m != config.id)
            .map(|peer| (peer.clone(), Progress::new(term_start, 0)))
            .collect();
        Leading {
            term_start,
            progress,
            heartbeat_at: now.saturating_add(config.heartbeat_interval),
            heartbeat_due: true,
            quorum_check_at: now.saturating_add(config.election_timeout_min),
            quorum_window_start: now,
            replication_due: true,
            seq: 0,
            reads: VecDeque::new(),
            transfer: None,
            image: None,
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        if self.progress.is_empty() {
            return None;
        }
        let mut at = self.heartbeat_at.min(self.quorum_check_at);
        if let Some(transfer) = &self.transfer {
            at = at.min(transfer.deadline);
        }
        Some(at)
    }

    pub(super) fn queue_read(&mut self, id: u64, index: LogIndex) {
        self.reads.push_back(PendingRead {
            id,
            index,
            seq: None,
        });
    }

    /// The lowest index every follower holds (entries after it may still be needed).
    pub(super) fn slowest_match(&self) -> LogIndex {
        self.progress
            .values()
            .map(|p| p.matched)
            .min()
            .unwrap_or(LogIndex(u64::MAX))
    }

    pub(super) fn transferring_to(&self) -> Option<&NodeId> {
        self.transfer.as_ref().map(|t| &t.to)
    }

    pub(super) fn views(&self, now: Instant) -> Vec<FollowerProgress> {
        self.progress
            .iter()
            .map(|(id, p)| FollowerProgress {
                id: id.clone(),
                matched: p.matched,
                next: p.next,
                mode: match p.mode {
                    Mode::Probe { .. } => "probe",
                    Mode::Replicate => "replicate",
                    Mode::Snapshot(_) => "snapshot",
                },
                last_heard_millis_ago: p
                    .last_heard
                    .map(|at| as_millis_u64(now.saturating_since(at))),
            })
            .collect()
    }
}

/// How long an `APPEND` or snapshot chunk may go unanswered before it is sent again.
fn retransmit_after(config: &ReplicaConfig) -> Duration {
    config.heartbeat_interval.saturating_mul(2)
}

/// An `APPEND` of the entries from `next` on (possibly none), cut to fit a frame.
fn log_append(
    log: &RaftLog,
    term: Term,
    next: LogIndex,
    max_bytes: usize,
    commit: LogIndex,
    seq: u64,
) -> PeerMessage {
    let prev_index = LogIndex(next.0.saturating_sub(1));
    let prev_term = log.term_at(prev_index).unwrap_or_default();
    let entries = log.entries_from(next, APPEND_ENTRIES_MAX, max_bytes);
    PeerMessage::Append {
        term,
        prev_index,
        prev_term,
        entries,
        // The follower commits no further than what this message proves it holds (figure 2).
        commit,
        seq,
    }
}

/// Bytes of snapshot per chunk, so that a chunk plus its envelope fits a (binary) frame.
fn snapshot_chunk_bytes(config: &ReplicaConfig) -> usize {
    config
        .max_frame_bytes
        .saturating_sub(PEER_ENVELOPE_BYTES)
        .max(1)
}

impl Replica {
    fn leading(&mut self) -> Option<&mut Leading> {
        match &mut self.role {
            Role::Leader(leading) => Some(leading),
            _ => None,
        }
    }

    /// Whether this leader is handing over to another member (new client work is refused
    /// meanwhile, so the hand-over finds a quiet log).
    pub fn transferring_to(&self) -> Option<&NodeId> {
        match &self.role {
            Role::Leader(leading) => leading.transferring_to(),
            _ => None,
        }
    }

    /// Starts handing leadership to `to` (or the most up-to-date follower): once its log and
    /// the commit index have caught up with this leader's, it is told to start an election
    /// (`TIMEOUT_NOW`) and this member steps down. Abandoned after one election timeout.
    pub fn transfer_leadership(&mut self, to: Option<NodeId>) -> Result<NodeId, TransferError> {
        if self.config.members.len() == 1 {
            return Err(TransferError::Alone);
        }
        let not_leader = self.not_leader();
        let deadline = self.now.saturating_add(self.config.election_timeout_max);
        let Some(leading) = self.leading() else {
            return Err(TransferError::NotLeader(not_leader));
        };
        let target = match to {
            Some(id) if leading.progress.contains_key(&id) => id,
            Some(id) => return Err(TransferError::NotAPeer(id)),
            // The most up-to-date member that takes part in elections (an abstaining one
            // would ignore the hand-over).
            None => leading
                .progress
                .iter()
                .filter(|(_, p)| !p.abstaining)
                .max_by(|a, b| a.1.matched.cmp(&b.1.matched).then(b.0.cmp(a.0)))
                .map(|(id, _)| id.clone())
                .ok_or(TransferError::Alone)?,
        };
        leading.transfer = Some(Transfer {
            to: target.clone(),
            deadline,
        });
        leading.replication_due = true;
        self.try_finish_transfer();
        Ok(target)
    }

    fn try_finish_transfer(&mut self) {
        let last = self.log.last_index();
        let quiet = self.commit == last && self.durable == last;
        let term = self.term;
        let Some(leading) = self.leading() else {
            return;
        };
        let Some(transfer) = &leading.transfer else {
            return;
        };
        let to = transfer.to.clone();
        let caught_up = leading.progress.get(&to).is_some_and(|p| p.matched == last);
        if !(caught_up && quiet) {
            return;
        }
        self.send(to.clone(), PeerMessage::TimeoutNow { term });
        self.role = Role::Follower;
        self.leader = None;
        self.handed_to = Some(to.clone());
        self.reset_election_deadline();
        self.events.push_back(ReplicaEvent::SteppedDown {
            term,
            reason: StepDownReason::Transferred { to },
        });
    }

    /// Heartbeats, retransmissions, CheckQuorum and the transfer deadline.
    pub(super) fn leader_tick(&mut self) {
        let now = self.now;
        let quorum = self.config.quorum();
        let heartbeat = self.config.heartbeat_interval;
        let election_min = self.config.election_timeout_min;
        let retransmit = retransmit_after(&self.config);
        let Some(leading) = self.leading() else {
            return;
        };
        if now >= leading.heartbeat_at {
            leading.heartbeat_at = now.saturating_add(heartbeat);
            leading.heartbeat_due = true;
            for p in leading.progress.values_mut() {
                let stale = |at: Instant| at.saturating_add(retransmit) <= now;
                match &p.mode {
                    Mode::Probe { sent_at: Some(at) } if stale(*at) => {
                        p.mode = Mode::Probe { sent_at: None };
                    }
                    Mode::Replicate if p.in_flight.front().is_some_and(|(_, at)| stale(*at)) => {
                        // Something was lost on the way: find out where the follower is.
                        p.in_flight.clear();
                        p.next = p.matched.next();
                        p.mode = Mode::Probe { sent_at: None };
                    }
                    Mode::Snapshot(_) if p.snapshot_sent_at.is_some_and(stale) => {
                        p.snapshot_offset = p.snapshot_received;
                        p.snapshot_sent_at = None;
                    }
                    _ => {}
                }
            }
        }
        if now >= leading.quorum_check_at {
            let window_start = leading.quorum_window_start;
            let heard_from = 1 + leading
                .progress
                .values()
                .filter(|p| !p.abstaining && p.last_heard.is_some_and(|at| at >= window_start))
                .count();
            leading.quorum_window_start = now;
            leading.quorum_check_at = now.saturating_add(election_min);
            if heard_from < quorum {
                self.role = Role::Follower;
                self.leader = None;
                self.reset_election_deadline();
                self.events.push_back(ReplicaEvent::SteppedDown {
                    term: self.term,
                    reason: StepDownReason::LostQuorum { heard_from, quorum },
                });
                return;
            }
        }
        if let Some(leading) = self.leading() {
            if leading.transfer.as_ref().is_some_and(|t| now >= t.deadline) {
                leading.transfer = None;
            }
        }
    }

    /// Sends what each follower is owed: new entries, a probe, snapshot chunks, or a heartbeat
    /// (always one when a read waits for confirmation or a heartbeat is due).
    pub fn flush(&mut self, snapshots: &dyn SnapshotSource) {
        let Role::Leader(leading) = &mut self.role else {
            return;
        };
        if leading.progress.is_empty() {
            return;
        }
        let confirm_reads = leading.reads.iter().any(|r| r.seq.is_none());
        if confirm_reads {
            leading.seq += 1;
            let seq = leading.seq;
            for read in leading.reads.iter_mut().filter(|r| r.seq.is_none()) {
                read.seq = Some(seq);
            }
        }
        let heartbeat = std::mem::take(&mut leading.heartbeat_due) || confirm_reads;
        leading.replication_due = false;
        let peers: Vec<NodeId> = leading.progress.keys().cloned().collect();
        for peer in &peers {
            self.replicate_to(peer, snapshots);
        }
        if heartbeat {
            for peer in &peers {
                self.heartbeat_to(peer);
            }
        }
        if let Some(leading) = self.leading() {
            for p in leading.progress.values_mut() {
                p.sent_this_flush = false;
            }
        }
    }

    fn replicate_to(&mut self, peer: &NodeId, snapshots: &dyn SnapshotSource) {
        let now = self.now;
        let term = self.term;
        let commit = self.commit;
        let last = self.log.last_index();
        let base = self.log.base_index();
        let max_bytes = self
            .config
            .max_frame_bytes
            .saturating_sub(PEER_ENVELOPE_BYTES);
        let chunk_bytes = snapshot_chunk_bytes(&self.config);
        let Role::Leader(leading) = &mut self.role else {
            return;
        };
        let seq = leading.seq;
        let Some(p) = leading.progress.get_mut(peer) else {
            return;
        };
        // A follower that needs a compacted entry gets the table instead.
        if !matches!(p.mode, Mode::Snapshot(_)) && p.next <= base {
            let image = current_image(&mut leading.image, &self.log, snapshots);
            p.mode = Mode::Snapshot(image);
            p.snapshot_offset = 0;
            p.snapshot_received = 0;
            p.snapshot_sent_at = None;
            p.in_flight.clear();
        }
        let mut out = Vec::new();
        match &mut p.mode {
            Mode::Probe { sent_at } => {
                if sent_at.is_none() {
                    *sent_at = Some(now);
                    out.push(log_append(&self.log, term, p.next, max_bytes, commit, seq));
                }
            }
            Mode::Replicate => {
                while p.in_flight.len() < APPENDS_IN_FLIGHT_MAX && p.next <= last {
                    let message = log_append(&self.log, term, p.next, max_bytes, commit, seq);
                    let PeerMessage::Append { entries, .. } = &message else {
                        unreachable!("log_append builds an APPEND")
                    };
                    let Some(sent_last) = entries.last().map(|e| e.index) else {
                        break;
                    };
                    p.next = sent_last.next();
                    p.in_flight.push_back((sent_last, now));
                    out.push(message);
                }
            }
            Mode::Snapshot(image) => {
                let image = Arc::clone(image);
                out = snapshot_chunks(p, &image, (term, seq), chunk_bytes, now);
            }
        }
        if !out.is_empty() {
            p.sent_this_flush = true;
        }
        for message in out {
            self.send(peer.clone(), message);
        }
    }

    fn heartbeat_to(&mut self, peer: &NodeId) {
        let term = self.term;
        let commit = self.commit;
        let base = self.log.base_index();
        let Role::Leader(leading) = &self.role else {
            return;
        };
        let seq = leading.seq;
        let Some(p) = leading.progress.get(peer) else {
            return;
        };
        if p.sent_this_flush {
            return;
        }
        // At the entry it is known to match, the follower's log cannot disagree, so the
        // heartbeat is never taken for a conflict.
        let prev_index = p.matched.max(base);
        let prev_term = self.log.term_at(prev_index).unwrap_or_default();
        let message = PeerMessage::Append {
            term,
            prev_index,
            prev_term,
            entries: Vec::new(),
            commit,
            seq,
        };
        self.send(peer.clone(), message);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_append_reply(
        &mut self,
        from: &NodeId,
        term: Term,
        success: bool,
        index: LogIndex,
        conflict_term: Option<Term>,
        seq: u64,
        abstaining: bool,
    ) {
        if term != self.term {
            return;
        }
        let now = self.now;
        let last = self.log.last_index();
        let Role::Leader(leading) = &mut self.role else {
            return;
        };
        let Some(p) = leading.progress.get_mut(from) else {
            return;
        };
        if seq < p.first_seq {
            return; // an answer to a message sent before the follower reconnected
        }
        if seq > leading.seq {
            // No round of this term carried it: not an answer to anything this leader sent.
            return;
        }
        p.last_heard = Some(now);
        p.acked_seq = p.acked_seq.max(seq);
        p.abstaining = abstaining;
        if p.matched_before > LogIndex(0) {
            // The first answer since it reconnected: does it still hold what it acknowledged?
            let holds = match (success, conflict_term) {
                (true, _) => index,
                // It lacks the entry before the ones sent: its log ends just before `index`.
                (false, None) => LogIndex(index.0.saturating_sub(1)),
                // It holds an entry at the probed position: at least the old acknowledgement.
                (false, Some(_)) => p.matched_before,
            };
            if holds < p.matched_before {
                self.events.push_back(ReplicaEvent::FollowerLostEntries {
                    follower: from.clone(),
                    acknowledged: p.matched_before,
                    holds,
                });
            }
            p.matched_before = LogIndex(0);
        }
        if success && index > last {
            let what = format!("acknowledged entry {index} beyond the leader's last {last}");
            self.violation(from, what);
            return;
        }
        if success {
            if index > p.matched {
                p.matched = index;
            }
            match p.mode {
                Mode::Probe { .. } => {
                    p.mode = Mode::Replicate;
                    p.next = p.matched.next();
                    p.in_flight.clear();
                }
                Mode::Replicate => {
                    p.next = p.next.max(p.matched.next());
                    while p.in_flight.front().is_some_and(|(sent, _)| *sent <= index) {
                        p.in_flight.pop_front();
                    }
                }
                Mode::Snapshot(_) => {}
            }
            leading.replication_due = true;
        } else if index <= p.matched && conflict_term.is_none() {
            // "I lack entries before `index`", yet it acknowledged more on this connection,
            // and that is durable on its disk (a process that lost its disk is a new
            // connection: `peer_reconnected`). An old answer, overtaken: ignored.
        } else if !matches!(p.mode, Mode::Snapshot(_)) {
            // Paper 5.3: go back to where the follower's log may agree; `index` is the first
            // entry of the term it holds at the rejected position (or just past its log), so
            // one round trip skips a whole conflicting term. Never below what it acknowledged
            // on this connection: a conflicting term run may reach back past it, but what it
            // acknowledged matches.
            p.next = index.min(last.next()).max(p.matched.next());
            p.mode = Mode::Probe { sent_at: None };
            p.in_flight.clear();
            leading.replication_due = true;
        }
        self.confirm_reads();
        if success {
            self.advance_commit();
            self.try_finish_transfer();
        }
    }

    pub(super) fn on_snapshot_reply(
        &mut self,
        from: &NodeId,
        term: Term,
        index: LogIndex,
        received: u64,
        seq: u64,
        abstaining: bool,
    ) {
        if term != self.term {
            return;
        }
        let now = self.now;
        let Some(leading) = self.leading() else {
            return;
        };
        let Some(p) = leading.progress.get_mut(from) else {
            return;
        };
        if seq < p.first_seq {
            return; // an answer to a chunk sent before the follower reconnected
        }
        p.last_heard = Some(now);
        p.acked_seq = p.acked_seq.max(seq);
        p.abstaining = abstaining;
        if let Mode::Snapshot(image) = &p.mode {
            if image.index == index {
                if received >= image.data.len() as u64 {
                    // Installed and durable: replication continues after it.
                    p.matched = p.matched.max(index);
                    p.next = index.next();
                    p.mode = Mode::Probe { sent_at: None };
                } else {
                    p.snapshot_received = p.snapshot_received.max(received);
                    if received < p.snapshot_offset && received < p.snapshot_received {
                        p.snapshot_offset = received;
                    }
                }
                leading.replication_due = true;
            }
        }
        self.confirm_reads();
        self.advance_commit();
    }

    /// `peer` opened a new connection to this member (its `HELLO`): it may be a new process,
    /// perhaps on an empty disk, so nothing it acknowledged before counts any more. Its progress
    /// starts over with a probe, and answers to anything sent before now are ignored: an
    /// acknowledgement still in flight from a process that then lost its disk must not count
    /// towards a commit.
    pub(super) fn peer_reconnected(&mut self, peer: &NodeId) {
        let next = self.log.last_index().next();
        let Role::Leader(leading) = &mut self.role else {
            return;
        };
        leading.seq += 1;
        let first_seq = leading.seq;
        if let Some(p) = leading.progress.get_mut(peer) {
            let matched_before = p.matched.max(p.matched_before);
            let last_heard = p.last_heard;
            *p = Progress::new(next, first_seq);
            p.matched_before = matched_before;
            // It is alive (it just connected): the quorum check need not forget it.
            p.last_heard = last_heard;
            leading.replication_due = true;
        }
    }

    /// Commits the highest entry of this term that a majority holds durably (paper 5.4.2:
    /// entries of earlier terms are committed only by committing one of the current term).
    pub(super) fn advance_commit(&mut self) {
        let quorum = self.config.quorum();
        let durable = self.durable;
        let Role::Leader(leading) = &self.role else {
            return;
        };
        // An abstaining follower may have forgotten a later term in which another leader
        // committed something else at these indexes: what it holds proves nothing.
        let mut matched: Vec<LogIndex> = leading
            .progress
            .values()
            .filter(|p| !p.abstaining)
            .map(|p| p.matched)
            .collect();
        matched.push(durable);
        matched.sort_unstable_by(|a, b| b.cmp(a));
        let Some(&candidate) = matched.get(quorum - 1) else {
            return;
        };
        if candidate > self.commit && self.log.term_at(candidate) == Some(self.term) {
            // A majority may hold it before this leader's own disk does, but never beyond
            // what this leader has.
            self.commit = candidate;
            self.assert_commit_held();
        }
    }

    /// Releases every read whose heartbeat round a majority has acknowledged.
    fn confirm_reads(&mut self) {
        let quorum = self.config.quorum();
        let Role::Leader(leading) = &mut self.role else {
            return;
        };
        while let Some(read) = leading.reads.front() {
            let Some(seq) = read.seq else {
                break;
            };
            let acked = 1 + leading
                .progress
                .values()
                .filter(|p| !p.abstaining && p.acked_seq >= seq)
                .count();
            if acked < quorum {
                break;
            }
            if let Some(read) = leading.reads.pop_front() {
                self.events.push_back(ReplicaEvent::ReadReady {
                    id: read.id,
                    index: read.index,
                });
            }
        }
    }
}

/// The image of the table to send a follower that needs compacted entries: the one being sent
/// already if it still covers the log's base, else a new one from `snapshots`, kept in `cache`.
fn current_image(
    cache: &mut Option<Arc<Image>>,
    log: &RaftLog,
    snapshots: &dyn SnapshotSource,
) -> Arc<Image> {
    let base = log.base_index();
    if let Some(image) = cache.as_ref().filter(|image| image.index >= base) {
        return image.clone();
    }
    let (index, data) = snapshots.snapshot();
    let term = log.term_at(index);
    assert!(
        term.is_some(),
        "a snapshot at {index} is not covered by the log (base {base})"
    );
    let image = Arc::new(Image {
        index,
        term: term.unwrap_or_default(),
        data,
    });
    *cache = Some(image.clone());
    image
}

/// The chunks of `image` follower `p` is owed now, in the leader's `(term, seq)`: up to a
/// window beyond what it has acknowledged receiving (one empty chunk for an empty table).
fn snapshot_chunks(
    p: &mut Progress,
    image: &Image,
    (term, seq): (Term, u64),
    chunk_bytes: usize,
    now: Instant,
) -> Vec<PeerMessage> {
    let mut out = Vec::new();
    let total = image.data.len() as u64;
    let window = chunk_bytes as u64 * SNAPSHOT_CHUNKS_IN_FLIGHT_MAX as u64;
    while p.snapshot_offset < total
        && p.snapshot_offset < p.snapshot_received.saturating_add(window)
    {
        let start = usize::try_from(p.snapshot_offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(chunk_bytes).min(image.data.len());
        let data = ChunkBytes(image.data[start..end].to_vec());
        out.push(PeerMessage::Snapshot {
            term,
            index: image.index,
            index_term: image.term,
            offset: p.snapshot_offset,
            total,
            data,
            seq,
        });
        p.snapshot_offset = end as u64;
        p.snapshot_sent_at = Some(now);
    }
    if total == 0 && p.snapshot_sent_at.is_none() {
        // An empty table is still a snapshot: one empty chunk says so.
        out.push(PeerMessage::Snapshot {
            term,
            index: image.index,
            index_term: image.term,
            offset: 0,
            total: 0,
            data: ChunkBytes::default(),
            seq,
        });
        p.snapshot_sent_at = Some(now);
    }
    out
}
