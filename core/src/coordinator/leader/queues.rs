//! `QUEUES` and `SET_QUEUE`: operators reading queues and changing their settings. A change is
//! a replicated command like any other, so every member schedules by the same settings.

use super::{LeaderState, Pending};
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::ids::{ConnectionId, RequestId};
use crate::limits::QUEUES_MAX;
use crate::protocol::{ClientReply, ErrorCode};
use crate::queues::{check_queue_name, QueueChange};

impl LeaderState {
    pub(super) fn list_queues(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
    ) {
        let queues = m.table.queue_views(m.wall_now());
        m.send_client(conn, ClientReply::QueueList { request_id, queues });
    }

    /// Proposes the change once it is known to apply: a valid name and settings, and room for
    /// the queue if it is new (checked again when it applies).
    pub(super) fn set_queue(
        &mut self,
        m: &mut Member,
        (conn, request_id): (ConnectionId, RequestId),
        queue: String,
        change: QueueChange,
    ) {
        if let Err(message) = check_queue_name(&queue).and(change.check()) {
            return m.client_error(conn, request_id, ErrorCode::InvalidRequest, message);
        }
        if m.table.queue_state(&queue).is_none() && m.table.queue_count() >= QUEUES_MAX {
            let message = format!("the cluster holds its maximum of {QUEUES_MAX} queues");
            return m.client_error(conn, request_id, ErrorCode::TooManyQueues, message);
        }
        self.propose(
            m,
            Command::SetQueue { queue, change },
            Some(Pending::SetQueue { conn, request_id }),
        );
    }

    /// A `SetQueue` applied: answer with the queue as it now stands, or why it did not change.
    /// A resumed or reweighted queue may have jobs to start at once, whatever else happens.
    pub(super) fn on_queue_set(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        queue: &str,
        refused: Option<(ErrorCode, String)>,
    ) {
        if refused.is_none() {
            self.schedule(m);
        }
        let Some(Pending::SetQueue { conn, request_id }) = pending else {
            return;
        };
        if let Some((code, message)) = refused {
            return m.client_error(conn, request_id, code, message);
        }
        match m.table.queue_view(queue, m.wall_now()) {
            Some(queue) => m.send_client(conn, ClientReply::QueueSet { request_id, queue }),
            None => panic!("queue {queue:?} was set and the table does not hold it"),
        }
    }
}
