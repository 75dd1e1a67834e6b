//! Consensus: which commands are in the log, which are committed, and who leads.
//!
//! The coordinator talks to consensus through this small surface and nothing else:
//!
//! ```text
//!   propose(command) ──> Ok(Proposal { term, index }) | Err(NotLeader { leader_hint })
//!   take_records()   ──> records to persist (log entries), in order
//!   mark_durable(i)  <── the driver made everything up to log index i durable here
//!   pop_committed()  ──> committed entries, in index order, each exactly once, to apply
//!   is_leader()      ──> whether this member may lead (schedule, accept results, answer)
//! ```
//!
//! This is the group of one: the member always leads its own term, and an entry is committed as
//! soon as it is durable on its disk (durable on every member is durable on a majority).
//! Nothing above this module depends on that shortcut.

use std::collections::VecDeque;

use crate::command::{Command, LogEntry};
use crate::ids::{LogIndex, NodeId, Term};
use crate::storage::Record;

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

#[derive(Debug)]
pub struct Replica {
    id: NodeId,
    term: Term,
    /// Entries appended and not yet applied, in index order.
    unapplied: VecDeque<LogEntry>,
    last: LogIndex,
    durable: LogIndex,
    committed: LogIndex,
    /// Records produced and not yet taken by the coordinator.
    records: Vec<Record>,
}

impl Replica {
    /// A member whose log up to `applied` is already reflected in its job table.
    pub fn new(id: NodeId, term: Term, applied: LogIndex) -> Replica {
        Replica {
            id,
            term,
            unapplied: VecDeque::new(),
            last: applied,
            durable: applied,
            committed: applied,
            records: Vec::new(),
        }
    }

    /// Re-admits an entry found on disk at recovery: durable, and in a group of one, committed.
    pub fn restore(&mut self, entry: LogEntry) {
        assert_eq!(
            entry.index,
            self.last.next(),
            "restored log entries must be contiguous"
        );
        self.last = entry.index;
        self.durable = entry.index;
        self.committed = entry.index;
        self.unapplied.push_back(entry);
    }

    /// Appends `command` to the log if this member leads. The entry's record is queued for
    /// [`Replica::take_records`]; it commits (and so applies) only once durable.
    pub fn propose(&mut self, command: Command) -> Result<Proposal, NotLeader> {
        self.last = self.last.next();
        let entry = LogEntry {
            index: self.last,
            term: self.term,
            command,
        };
        let proposal = Proposal {
            term: entry.term,
            index: entry.index,
        };
        self.unapplied.push_back(entry.clone());
        self.records.push(Record::Log(entry));
        Ok(proposal)
    }

    /// The records to persist, in the order they must reach the disk.
    pub fn take_records(&mut self) -> std::vec::Drain<'_, Record> {
        self.records.drain(..)
    }

    /// Everything up to `index` is on this member's disk.
    pub fn mark_durable(&mut self, index: LogIndex) {
        assert!(
            index <= self.last,
            "cannot be durable beyond the last entry"
        );
        self.durable = self.durable.max(index);
        // Commit rule of a group of one: durable here is durable on a majority.
        self.committed = self.durable;
    }

    /// The next committed entry not yet applied.
    pub fn pop_committed(&mut self) -> Option<LogEntry> {
        match self.unapplied.front() {
            Some(entry) if entry.index <= self.committed => self.unapplied.pop_front(),
            _ => None,
        }
    }

    pub fn id(&self) -> &NodeId {
        &self.id
    }

    pub fn is_leader(&self) -> bool {
        true
    }

    pub fn term(&self) -> Term {
        self.term
    }

    pub fn last_index(&self) -> LogIndex {
        self.last
    }

    pub fn committed_index(&self) -> LogIndex {
        self.committed
    }

    pub fn durable_index(&self) -> LogIndex {
        self.durable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::JobId;

    fn cancel() -> Command {
        Command::Cancel {
            job_id: JobId(uuid::Uuid::nil()),
        }
    }

    fn replica() -> Replica {
        Replica::new(NodeId("c1".into()), Term(1), LogIndex(0))
    }

    #[test]
    fn nothing_is_applied_before_it_is_durable() {
        let mut replica = replica();
        let first = replica.propose(cancel()).expect("leads");
        let second = replica.propose(cancel()).expect("leads");
        assert_eq!((first.index, second.index), (LogIndex(1), LogIndex(2)));
        assert_eq!(
            replica.take_records().count(),
            2,
            "both entries are to be persisted"
        );
        assert_eq!(replica.pop_committed(), None, "appended but not durable");
        replica.mark_durable(LogIndex(1));
        assert_eq!(replica.pop_committed().map(|e| e.index), Some(LogIndex(1)));
        assert_eq!(replica.pop_committed(), None, "entry 2 is not durable yet");
        replica.mark_durable(LogIndex(2));
        assert_eq!(replica.pop_committed().map(|e| e.index), Some(LogIndex(2)));
    }

    #[test]
    fn a_proposal_names_the_term_and_index_of_its_entry() {
        let mut replica = replica();
        let proposal = replica.propose(cancel()).expect("leads");
        let records: Vec<Record> = replica.take_records().collect();
        assert_eq!(
            records,
            vec![Record::Log(LogEntry {
                index: proposal.index,
                term: proposal.term,
                command: cancel(),
            })]
        );
    }
}
