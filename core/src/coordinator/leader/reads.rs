//! Reads answered only once a majority confirms this member still leads (ReadIndex,
//! dissertation 6.4): a deposed leader that has not heard of its successor must not answer
//! from a table that may be missing committed entries.
//!
//! A read is asked of consensus, confirmed as of a commit index, then answered once this member
//! has applied that index. Reads are answered in the order they were confirmed.

use std::collections::{BTreeMap, VecDeque};

use super::LeaderState;
use crate::coordinator::member::Member;
use crate::ids::{ConnectionId, JobId, LogIndex, RequestId};
use crate::limits::READS_IN_FLIGHT_MAX;
use crate::protocol::{ClientRequest, ErrorCode};

/// A client request or a timed-out wait, answered once a majority confirms this member still
/// leads.
#[derive(Clone, Debug)]
pub(super) enum Read {
    Request {
        conn: ConnectionId,
        request: Box<ClientRequest>,
    },
    WaitTimedOut {
        conn: ConnectionId,
        request_id: RequestId,
        job_id: JobId,
    },
}

impl Read {
    pub(super) fn conn(&self) -> ConnectionId {
        match self {
            Read::Request { conn, .. } | Read::WaitTimedOut { conn, .. } => *conn,
        }
    }

    pub(super) fn request_id(&self) -> RequestId {
        match self {
            Read::Request { request, .. } => request.request_id(),
            Read::WaitTimedOut { request_id, .. } => *request_id,
        }
    }
}

/// The reads this leader owes, at most `READS_IN_FLIGHT_MAX` of them.
#[derive(Debug, Default)]
pub(super) struct Reads {
    /// Asked of consensus and not yet confirmed, by read id.
    asked: BTreeMap<u64, Read>,
    next_id: u64,
    /// Confirmed as of an index this member may not have applied yet, in confirmation order
    /// (so in order of index: a leader's commit index never moves back within its term).
    confirmed: VecDeque<(LogIndex, Read)>,
}

impl Reads {
    fn len(&self) -> usize {
        self.asked.len() + self.confirmed.len()
    }

    /// Takes `read` in under a fresh id, or hands it back if the bound is reached.
    fn ask(&mut self, read: Read) -> Result<u64, Read> {
        if self.len() >= READS_IN_FLIGHT_MAX {
            return Err(read);
        }
        self.next_id += 1;
        self.asked.insert(self.next_id, read);
        Ok(self.next_id)
    }

    /// Read `id` was confirmed as of `index` (nothing if its connection closed meanwhile).
    fn confirm(&mut self, id: u64, index: LogIndex) {
        assert!(id <= self.next_id, "read {id} confirmed but never asked");
        if let Some(read) = self.asked.remove(&id) {
            assert!(
                self.confirmed.back().is_none_or(|(last, _)| *last <= index),
                "read {id} confirmed at {index}, before an earlier confirmation's index"
            );
            self.confirmed.push_back((index, read));
        }
    }

    /// The next confirmed read whose index `applied` covers.
    fn next_ready(&mut self, applied: LogIndex) -> Option<Read> {
        if self.confirmed.front()?.0 > applied {
            return None;
        }
        self.confirmed.pop_front().map(|(_, read)| read)
    }

    pub(super) fn drop_conn(&mut self, conn: ConnectionId) {
        self.asked.retain(|_, read| read.conn() != conn);
        self.confirmed.retain(|(_, read)| read.conn() != conn);
    }

    /// Every read still owed (the leader is stepping down).
    pub(super) fn into_all(self) -> impl Iterator<Item = Read> {
        let confirmed = self.confirmed.into_iter().map(|(_, read)| read);
        self.asked.into_values().chain(confirmed)
    }
}

impl LeaderState {
    /// Answers `read` once a majority has confirmed this member still leads (at once in a
    /// group of one).
    pub(super) fn confirm_then(&mut self, m: &mut Member, read: Read) {
        let id = match self.reads.ask(read) {
            Ok(id) => id,
            Err(read) => {
                return m.client_error(
                    read.conn(),
                    read.request_id(),
                    ErrorCode::TooManyWaiters,
                    format!("{READS_IN_FLIGHT_MAX} reads are waiting for the leader to confirm it still leads; retry shortly"),
                )
            }
        };
        if let Err(not_leader) = m.replica.request_read(id) {
            // Leader state exists only while consensus says this member leads.
            panic!("a leader's read was refused: {not_leader:?}");
        }
    }

    /// Consensus confirmed leadership for read `id` as of `index`.
    pub(in crate::coordinator) fn read_confirmed(
        &mut self,
        m: &mut Member,
        id: u64,
        index: LogIndex,
    ) {
        self.reads.confirm(id, index);
        self.answer_confirmed_reads(m);
    }

    /// Answers, in order, the confirmed reads whose index is applied.
    pub(super) fn answer_confirmed_reads(&mut self, m: &mut Member) {
        while let Some(read) = self.reads.next_ready(m.table.applied_index()) {
            match read {
                Read::Request { conn, request } => self.answer_request(m, conn, *request, true),
                Read::WaitTimedOut {
                    conn,
                    request_id,
                    job_id,
                } => self.answer_wait_timeout(m, conn, request_id, job_id),
            }
        }
    }
}
