//! The follower's side of replication: accepting `APPEND`s (the consistency check, conflict
//! truncation and the commit index, paper 5.3) and receiving a snapshot in chunks (paper 7).
//! Every acknowledgement waits until what it acknowledges is durable here.

use super::{Incoming, Replica, ReplicaEvent, Role};
use crate::command::LogEntry;
use crate::ids::{LogIndex, NodeId, Term};
use crate::limits::SNAPSHOT_BYTES_MAX;
use crate::protocol::PeerMessage;
use crate::storage::{Record, TableRows};

impl Replica {
    /// A message from the leader of our current term: follow it. False (and reported) if this
    /// member leads the same term, which Raft makes impossible.
    fn heard_from_leader(&mut self, from: &NodeId, term: Term) -> bool {
        if self.is_leader() {
            self.violation(
                from,
                format!("claims to lead term {}, which this member leads", term.0),
            );
            return false;
        }
        // A candidate (or pre-candidate) learns that its term already has a leader.
        self.role = Role::Follower;
        self.set_leader(Some(from.clone()));
        if !self.is_abstaining() {
            // An abstaining member's timer only paces its probes for terms: a live leader
            // must not silence them.
            self.reset_election_deadline();
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_append(
        &mut self,
        from: &NodeId,
        term: Term,
        prev_index: LogIndex,
        prev_term: Term,
        entries: Vec<LogEntry>,
        leader_commit: LogIndex,
        seq: u64,
    ) {
        if term < self.term {
            // A deposed leader: our term tells it so. The reply answers no round of any
            // current leader, so it echoes no sequence number: the sender may lead a later
            // term by now, and must not take it for an answer to that term's round (a read
            // confirmed by it would not be, dissertation 6.4).
            let reply = self.append_reply(false, LogIndex(0), None, 0);
            self.send(from.clone(), reply);
            return;
        }
        if !self.heard_from_leader(from, term) {
            return;
        }
        let base = self.log.base_index();
        // Entries up to the base are in our job table already, hence committed and equal to the
        // leader's: skip them.
        let (prev_index, prev_term, entries) = if prev_index < base {
            let skip = usize::try_from(base.0 - prev_index.0).unwrap_or(usize::MAX);
            let rest: Vec<LogEntry> = entries.into_iter().skip(skip).collect();
            (base, self.log.base_term(), rest)
        } else {
            (prev_index, prev_term, entries)
        };
        if self.log.term_at(prev_index) != Some(prev_term) {
            let (hint, conflict_term) = match self.log.term_at(prev_index) {
                None => (self.log.last_index().next(), None),
                Some(held) => (self.log.first_index_of_term(held, prev_index), Some(held)),
            };
            let reply = self.append_reply(false, hint, conflict_term, seq);
            self.send(from.clone(), reply);
            return;
        }
        let last_new = LogIndex(prev_index.0 + entries.len() as u64);
        // Consecutive indexes after `prev_index`, terms never falling and never above the
        // leader's: anything else is a broken peer, and is refused before it touches the log.
        let mut previous_term = prev_term;
        let in_order = entries.iter().enumerate().all(|(i, entry)| {
            let fits = entry.index.0 == prev_index.0 + 1 + i as u64
                && entry.term >= previous_term
                && entry.term <= term;
            previous_term = entry.term;
            fits
        });
        if !in_order {
            self.violation(
                from,
                "sent entries out of order, with falling terms or from a future term".into(),
            );
            return;
        }
        for entry in entries {
            match self.log.term_at(entry.index) {
                Some(held) if held == entry.term => continue,
                Some(_) => {
                    let keep = LogIndex(entry.index.0 - 1);
                    if keep < self.commit {
                        // Leader completeness (paper 5.4) makes this impossible; never give up
                        // a committed entry because a peer says so.
                        self.violation(
                            from,
                            format!(
                                "would overwrite committed entry {} (commit {})",
                                entry.index, self.commit
                            ),
                        );
                        return;
                    }
                    self.log.truncate_after(keep);
                    self.note_truncation(keep);
                    self.emit(Record::TruncateLogAfter(keep));
                }
                None => {}
            }
            self.log.append(entry.clone());
            self.emit(Record::Log(Box::new(entry)));
        }
        // Paper figure 2: commit up to what the leader committed, but no further than what this
        // message proved we hold.
        let commit = leader_commit.min(last_new);
        if commit > self.commit {
            self.commit = commit;
        }
        self.assert_commit_held();
        let reply = self.append_reply(true, last_new, None, seq);
        self.send_when_durable(from.clone(), reply);
        self.note_caught_up(last_new, leader_commit, term);
    }

    fn append_reply(
        &self,
        success: bool,
        index: LogIndex,
        conflict_term: Option<Term>,
        seq: u64,
    ) -> PeerMessage {
        PeerMessage::AppendReply {
            term: self.term,
            success,
            index,
            conflict_term,
            seq,
            // Decided now, with what it acknowledges: a reply waiting for the disk must not
            // start counting because the member rejoined meanwhile.
            abstaining: self.is_abstaining(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_snapshot(
        &mut self,
        from: &NodeId,
        term: Term,
        index: LogIndex,
        index_term: Term,
        offset: u64,
        total: u64,
        data: &[u8],
        seq: u64,
    ) {
        if term < self.term {
            // As for an `APPEND` of an older term: no sequence number to mistake.
            let reply = PeerMessage::SnapshotReply {
                term: self.term,
                index,
                received: 0,
                seq: 0,
                abstaining: self.is_abstaining(),
            };
            self.send(from.clone(), reply);
            return;
        }
        if !self.heard_from_leader(from, term) {
            return;
        }
        if index <= self.applied
            || self.log.term_at(index) == Some(index_term) && index <= self.commit
        {
            // We hold all of it already: tell the leader to go on from there.
            let reply = PeerMessage::SnapshotReply {
                term,
                index,
                received: total,
                seq,
                abstaining: self.is_abstaining(),
            };
            self.send_when_durable(from.clone(), reply);
            return;
        }
        if total > SNAPSHOT_BYTES_MAX {
            self.refuse_incoming(from, index, seq);
            return;
        }
        let fresh = self
            .incoming
            .as_ref()
            .is_none_or(|incoming| incoming.index != index || incoming.term != index_term);
        if fresh && offset == 0 {
            self.incoming = Some(Incoming {
                index,
                term: index_term,
                total,
                data: Vec::new(),
            });
        }
        let Some(incoming) = self.incoming.as_mut() else {
            self.refuse_incoming(from, index, seq);
            return;
        };
        if incoming.index != index || incoming.total != total {
            self.refuse_incoming(from, index, seq);
            return;
        }
        if offset == incoming.data.len() as u64 {
            if incoming.data.len() as u64 + data.len() as u64 > total {
                self.incoming = None;
                self.refuse_incoming(from, index, seq);
                return;
            }
            incoming.data.extend_from_slice(data);
        }
        let received = incoming.data.len() as u64;
        if received < total {
            let reply = PeerMessage::SnapshotReply {
                term,
                index,
                received,
                seq,
                abstaining: self.is_abstaining(),
            };
            self.send(from.clone(), reply);
            return;
        }
        // The whole table arrived: the coordinator decodes it and installs it. The final
        // acknowledgement goes out once the installed table is durable.
        if let Some(incoming) = self.incoming.take() {
            self.pending_snapshot_reply = Some((from.clone(), seq, incoming.total));
            self.events.push_back(ReplicaEvent::SnapshotReceived {
                index: incoming.index,
                term: incoming.term,
                data: incoming.data,
            });
        }
    }

    /// Starts the snapshot over: the leader resends from the first byte.
    fn refuse_incoming(&mut self, from: &NodeId, index: LogIndex, seq: u64) {
        let reply = PeerMessage::SnapshotReply {
            term: self.term,
            index,
            received: 0,
            seq,
            abstaining: self.is_abstaining(),
        };
        self.send(from.clone(), reply);
    }

    /// The coordinator decoded the snapshot of `SnapshotReceived` into `rows` and replaced its
    /// table with them: the log restarts after `index`, and the leader hears of it once the
    /// rows are durable.
    pub fn install_snapshot(&mut self, index: LogIndex, term: Term, rows: TableRows) {
        let conflicting = self.log.term_at(index) != Some(term);
        self.log.reset_to(index, term);
        if conflicting {
            self.note_truncation(index);
            self.emit(Record::TruncateLogAfter(index));
        }
        self.emit(Record::Snapshot { index, term, rows });
        if index > self.commit {
            self.commit = index;
        }
        self.applied = self.applied.max(index);
        self.installed_snapshot = self.installed_snapshot.max(index);
        if let Some((to, seq, total)) = self.pending_snapshot_reply.take() {
            let reply = PeerMessage::SnapshotReply {
                term: self.term,
                index,
                received: total,
                seq,
                abstaining: self.is_abstaining(),
            };
            self.send_when_durable(to, reply);
        }
    }

    /// The snapshot of `SnapshotReceived` did not decode: the leader will send it again.
    pub fn refuse_snapshot(&mut self, index: LogIndex) {
        if let Some((to, seq, _)) = self.pending_snapshot_reply.take() {
            self.refuse_incoming(&to, index, seq);
        }
    }
}
