//! One member's log in memory: a base (the last entry already folded into the job table, known
//! only by its index and term) and the entries after it, each with its encoded size so that an
//! `APPEND` can be cut to fit a frame without encoding anything twice.
//!
//! ```text
//!   ... compacted ... [base] [base+1] [base+2] ... [last]
//!                       ^ term known, entry gone     ^ last_index()
//! ```

use std::collections::VecDeque;

use crate::command::LogEntry;
use crate::ids::{LogIndex, Term};

#[derive(Clone, Debug)]
struct Stored {
    entry: LogEntry,
    bytes: usize,
}

#[derive(Clone, Debug)]
pub struct RaftLog {
    base_index: LogIndex,
    base_term: Term,
    /// Entries `base_index + 1 ..= last_index()`, in order.
    entries: VecDeque<Stored>,
    /// Encoded bytes of `entries`.
    bytes: usize,
}

/// Bytes an entry takes on the wire inside an `APPEND` (the coordinators' link is binary).
pub fn encoded_bytes(entry: &LogEntry) -> usize {
    // Counted as it is written, never kept: every appended entry is measured, on every member.
    // An entry that cannot be encoded cannot be replicated either; counting it as huge makes the
    // sender put it in a message of its own, where the encoder reports the problem.
    crate::protocol::codec::binary_encoded_len(entry).unwrap_or(usize::MAX / 4)
}

impl RaftLog {
    /// A log whose entries up to `base_index` (of term `base_term`) are in the job table.
    pub fn new(base_index: LogIndex, base_term: Term) -> RaftLog {
        RaftLog {
            base_index,
            base_term,
            entries: VecDeque::new(),
            bytes: 0,
        }
    }

    pub fn base_index(&self) -> LogIndex {
        self.base_index
    }

    pub fn base_term(&self) -> Term {
        self.base_term
    }

    pub fn last_index(&self) -> LogIndex {
        LogIndex(self.base_index.0 + self.entries.len() as u64)
    }

    pub fn last_term(&self) -> Term {
        self.entries
            .back()
            .map_or(self.base_term, |stored| stored.entry.term)
    }

    fn position(&self, index: LogIndex) -> Option<usize> {
        if index <= self.base_index || index > self.last_index() {
            return None;
        }
        usize::try_from(index.0 - self.base_index.0 - 1).ok()
    }

    /// The term of the entry at `index`, if this log knows it (the base or a held entry).
    pub fn term_at(&self, index: LogIndex) -> Option<Term> {
        if index == self.base_index {
            return Some(self.base_term);
        }
        self.position(index).map(|i| self.entries[i].entry.term)
    }

    pub fn get(&self, index: LogIndex) -> Option<&LogEntry> {
        self.position(index).map(|i| &self.entries[i].entry)
    }

    /// The encoded size of the entry at `index`, if this log holds it.
    pub fn bytes_at(&self, index: LogIndex) -> Option<usize> {
        self.position(index).map(|i| self.entries[i].bytes)
    }

    /// Appends `entry`, which must be the next index.
    pub fn append(&mut self, entry: LogEntry) {
        assert_eq!(
            entry.index,
            self.last_index().next(),
            "log entries are appended in order"
        );
        assert!(
            entry.term >= self.last_term(),
            "terms never decrease along a log"
        );
        let bytes = encoded_bytes(&entry);
        self.bytes = self.bytes.saturating_add(bytes);
        self.entries.push_back(Stored { entry, bytes });
    }

    /// Drops every entry after `index` (a conflicting suffix, paper 5.3).
    pub fn truncate_after(&mut self, index: LogIndex) {
        assert!(
            index >= self.base_index,
            "cannot truncate into the compacted part of the log"
        );
        let keep = usize::try_from(index.0 - self.base_index.0).unwrap_or(usize::MAX);
        while self.entries.len() > keep {
            if let Some(dropped) = self.entries.pop_back() {
                self.bytes = self.bytes.saturating_sub(dropped.bytes);
            }
        }
    }

    /// Entries from `start` on, at most `max_entries` and (beyond the first) `max_bytes`.
    pub fn entries_from(
        &self,
        start: LogIndex,
        max_entries: usize,
        max_bytes: usize,
    ) -> Vec<LogEntry> {
        let Some(first) = self.position(start) else {
            return Vec::new();
        };
        let mut total = 0usize;
        let mut out = Vec::new();
        for stored in self.entries.iter().skip(first).take(max_entries) {
            // One byte more per entry covers the array's header in the binary frame: 1 byte
            // for up to 15 entries, 3 for up to 65,535, never more than the entries.
            let cost = stored.bytes.saturating_add(1);
            if !out.is_empty() && total.saturating_add(cost) > max_bytes {
                break;
            }
            total = total.saturating_add(cost);
            out.push(stored.entry.clone());
        }
        out
    }

    /// The first index holding `term`, searching back from `from` (for a rejection hint).
    pub fn first_index_of_term(&self, term: Term, from: LogIndex) -> LogIndex {
        let mut index = from;
        while index > self.base_index.next() {
            let before = LogIndex(index.0 - 1);
            if self.term_at(before) != Some(term) {
                break;
            }
            index = before;
        }
        index
    }

    /// The last index holding `term`, if any entry this log holds has it.
    pub fn last_index_of_term(&self, term: Term) -> Option<LogIndex> {
        self.entries
            .iter()
            .rev()
            .find(|stored| stored.entry.term == term)
            .map(|stored| stored.entry.index)
    }

    /// Whether a log ending at (`last_index`, `last_term`) is at least as up to date as this one
    /// (paper 5.4.1: the later last term wins; equal terms, the longer log).
    pub fn candidate_up_to_date(&self, last_index: LogIndex, last_term: Term) -> bool {
        (last_term, last_index) >= (self.last_term(), self.last_index())
    }

    /// Forgets entries up to `index`, which becomes the base. `index` must be held here.
    pub fn compact_through(&mut self, index: LogIndex) {
        if index <= self.base_index {
            return;
        }
        let term = self
            .term_at(index)
            .expect("compaction stays within the log");
        let drop = usize::try_from(index.0 - self.base_index.0).unwrap_or(usize::MAX);
        for dropped in self.entries.drain(..drop.min(self.entries.len())) {
            self.bytes = self.bytes.saturating_sub(dropped.bytes);
        }
        self.base_index = index;
        self.base_term = term;
    }

    /// Forgets the oldest entries, none beyond `applied`, while more than `max_bytes` are held.
    pub fn compact_to_bytes(&mut self, max_bytes: usize, applied: LogIndex) {
        let mut through = self.base_index;
        let mut bytes = self.bytes;
        for stored in &self.entries {
            if bytes <= max_bytes || stored.entry.index > applied {
                break;
            }
            bytes = bytes.saturating_sub(stored.bytes);
            through = stored.entry.index;
        }
        self.compact_through(through);
    }

    /// A snapshot through (`index`, `term`) was installed: entries after it are kept if the log
    /// agrees at `index`, otherwise the whole log is replaced by the snapshot (paper 7).
    pub fn reset_to(&mut self, index: LogIndex, term: Term) {
        if self.term_at(index) == Some(term) && index >= self.base_index {
            self.compact_through(index);
            return;
        }
        self.entries.clear();
        self.bytes = 0;
        self.base_index = index;
        self.base_term = term;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::ids::JobId;

    fn entry(index: u64, term: u64) -> LogEntry {
        LogEntry {
            index: LogIndex(index),
            term: Term(term),
            at: crate::time::UnixMillis::UNSTAMPED,
            command: Command::Requeue {
                job_id: JobId(uuid::Uuid::nil()),
            },
        }
    }

    fn log_of(terms: &[u64]) -> RaftLog {
        let mut log = RaftLog::new(LogIndex(0), Term(0));
        for (i, term) in terms.iter().enumerate() {
            log.append(entry(i as u64 + 1, *term));
        }
        log
    }

    #[test]
    fn an_entry_is_counted_at_exactly_its_encoded_size() {
        for entry in [entry(7, 3), entry(u64::MAX, u64::MAX)] {
            let mut frame = Vec::new();
            crate::protocol::codec::encode_binary_frame(&entry, usize::MAX, &mut frame)
                .expect("encodes");
            let header = crate::limits::FRAME_HEADER_BYTES;
            assert_eq!(encoded_bytes(&entry), frame.len() - header);
        }
    }

    #[test]
    fn terms_are_known_for_the_base_and_held_entries_only() {
        let mut log = log_of(&[1, 1, 2, 3]);
        assert_eq!(log.term_at(LogIndex(0)), Some(Term(0)));
        assert_eq!(log.term_at(LogIndex(3)), Some(Term(2)));
        assert_eq!(log.term_at(LogIndex(5)), None);
        log.compact_through(LogIndex(2));
        assert_eq!(log.base_index(), LogIndex(2));
        assert_eq!(log.term_at(LogIndex(2)), Some(Term(1)));
        assert_eq!(log.term_at(LogIndex(1)), None, "compacted");
        assert_eq!(log.last_index(), LogIndex(4));
    }

    #[test]
    fn truncation_drops_the_suffix_and_appending_continues_from_there() {
        let mut log = log_of(&[1, 1, 2, 2]);
        log.truncate_after(LogIndex(2));
        assert_eq!(log.last_index(), LogIndex(2));
        log.append(entry(3, 3));
        assert_eq!(log.last_term(), Term(3));
    }

    #[test]
    fn the_conflict_hints_find_the_edges_of_a_term() {
        let log = log_of(&[1, 2, 2, 2, 3]);
        assert_eq!(log.first_index_of_term(Term(2), LogIndex(4)), LogIndex(2));
        assert_eq!(log.last_index_of_term(Term(2)), Some(LogIndex(4)));
        assert_eq!(log.last_index_of_term(Term(7)), None);
    }

    #[test]
    fn up_to_date_compares_last_term_first_then_length() {
        // Paper 5.4.1.
        let log = log_of(&[1, 2, 2]);
        assert!(
            log.candidate_up_to_date(LogIndex(1), Term(3)),
            "later term wins"
        );
        assert!(
            log.candidate_up_to_date(LogIndex(3), Term(2)),
            "same term, same length"
        );
        assert!(
            !log.candidate_up_to_date(LogIndex(2), Term(2)),
            "same term, shorter"
        );
        assert!(
            !log.candidate_up_to_date(LogIndex(9), Term(1)),
            "earlier term loses"
        );
    }

    #[test]
    fn entries_are_cut_by_count_and_bytes_but_never_to_nothing() {
        let log = log_of(&[1, 1, 1, 1]);
        assert_eq!(log.entries_from(LogIndex(2), 2, usize::MAX).len(), 2);
        assert_eq!(
            log.entries_from(LogIndex(1), 10, 1).len(),
            1,
            "one entry always goes"
        );
        assert!(log.entries_from(LogIndex(5), 10, usize::MAX).is_empty());
    }

    #[test]
    fn a_snapshot_keeps_a_matching_suffix_and_replaces_a_conflicting_log() {
        let mut log = log_of(&[1, 1, 2, 2]);
        log.reset_to(LogIndex(2), Term(1));
        assert_eq!(
            (log.base_index(), log.last_index()),
            (LogIndex(2), LogIndex(4))
        );
        let mut log = log_of(&[1, 1, 2, 2]);
        log.reset_to(LogIndex(3), Term(5));
        assert_eq!(
            (log.base_index(), log.last_index()),
            (LogIndex(3), LogIndex(3))
        );
        assert_eq!(log.last_term(), Term(5));
    }
}
