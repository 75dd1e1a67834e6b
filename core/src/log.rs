//! The command log as one coordinator sees it: entries proposed, entries durable on this disk,
//! entries committed, entries applied.
//!
//! ```text
//!   propose -> [ appended | durable here | committed | applied ]
//!                          ^ handle_persisted     ^ commit rule      ^ JobTable::apply
//! ```
//!
//! In a group of one the commit rule is "durable on my disk". Replication replaces exactly that
//! rule (durable on a majority) and adds terms and truncation; nothing upstream changes.

use std::collections::VecDeque;

use crate::command::{Command, LogEntry};
use crate::ids::{LogIndex, Term};

#[derive(Debug)]
pub struct CommandLog {
    term: Term,
    /// Entries appended and not yet applied, in index order.
    unapplied: VecDeque<LogEntry>,
    last: LogIndex,
    durable: LogIndex,
    committed: LogIndex,
}

impl CommandLog {
    /// A log whose entries up to `applied` are already reflected in the job table.
    pub fn new(term: Term, applied: LogIndex) -> CommandLog {
        CommandLog {
            term,
            unapplied: VecDeque::new(),
            last: applied,
            durable: applied,
            committed: applied,
        }
    }

    /// Appends a command, returning the entry to persist.
    pub fn append(&mut self, command: Command) -> LogEntry {
        self.last = self.last.next();
        let entry = LogEntry {
            index: self.last,
            term: self.term,
            command,
        };
        self.unapplied.push_back(entry.clone());
        entry
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

    /// Everything up to `index` is on this node's disk.
    pub fn mark_durable(&mut self, index: LogIndex) {
        assert!(
            index <= self.last,
            "cannot be durable beyond the last entry"
        );
        self.durable = self.durable.max(index);
        // Commit rule for a group of one: durable here is durable on a majority.
        self.committed = self.durable;
    }

    /// The next committed entry not yet applied.
    pub fn pop_committed(&mut self) -> Option<LogEntry> {
        match self.unapplied.front() {
            Some(entry) if entry.index <= self.committed => self.unapplied.pop_front(),
            _ => None,
        }
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

    pub fn term(&self) -> Term {
        self.term
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

    #[test]
    fn nothing_is_applied_before_it_is_durable() {
        let mut log = CommandLog::new(Term(1), LogIndex(0));
        let first = log.append(cancel());
        let second = log.append(cancel());
        assert_eq!((first.index, second.index), (LogIndex(1), LogIndex(2)));
        assert_eq!(log.pop_committed(), None, "appended but not durable");
        log.mark_durable(LogIndex(1));
        assert_eq!(log.pop_committed().map(|e| e.index), Some(LogIndex(1)));
        assert_eq!(log.pop_committed(), None, "entry 2 is not durable yet");
        log.mark_durable(LogIndex(2));
        assert_eq!(log.pop_committed().map(|e| e.index), Some(LogIndex(2)));
    }
}
