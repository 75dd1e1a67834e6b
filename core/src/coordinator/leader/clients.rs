//! The client link at the leader: status, cancels and listings (waits are in `waits`,
//! submissions in `submissions`).

use super::reads::Read;
use super::{LeaderState, Pending};
use crate::auth::Role;
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::Event;
use crate::ids::{ConnectionId, JobId, RequestId};
use crate::job::{JobState, Lease};
use crate::limits::{LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX};
use crate::protocol::{ClientReply, ClientRequest, ErrorCode, JobView};

impl LeaderState {
    pub(super) fn on_unknown_job(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
    ) {
        match pending {
            Some(Pending::Cancel { conn, request_id }) => {
                self.job_not_found(m, conn, request_id, job_id)
            }
            pending => {
                let message = format!("no job {job_id}");
                self.refuse_pending_submission(m, pending, ErrorCode::JobNotFound, message);
            }
        }
    }

    pub(super) fn on_cancelled(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        previous: JobState,
        revoked: Option<Lease>,
    ) {
        m.event(Event::JobCancelled { job_id, previous });
        if let Some(lease) = revoked {
            self.revoked_by_cancel(m, job_id, &lease);
        }
        self.answer_cancel(m, pending, job_id, true);
        self.wake_waiters(m, job_id);
    }

    pub(super) fn answer_cancel(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        cancelled: bool,
    ) {
        if let Some(Pending::Cancel { conn, request_id }) = pending {
            // Every request gets its one answer, whatever became of the job.
            match self.job_view(m, &job_id) {
                Some(job) => m.send_client(
                    conn,
                    ClientReply::CancelResult {
                        term: self.term,
                        request_id,
                        job: Box::new(job),
                        cancelled,
                    },
                ),
                None => self.job_not_found(m, conn, request_id, job_id),
            }
        }
    }

    /// What clients see of a job, from the applied table, marked `unserved` while it (or a
    /// partition of it) waits (queued, scheduled or blocked) and no worker that takes work
    /// serves its kind.
    pub(super) fn job_view(&self, m: &Member, job_id: &JobId) -> Option<JobView> {
        let mut view = m.table.view(job_id)?;
        let queued = matches!(
            view.state,
            JobState::Queued | JobState::Scheduled | JobState::Blocked
        ) || view
            .partitions
            .as_ref()
            .is_some_and(|parts| parts.pieces.iter().any(|p| p.state == JobState::Queued));
        view.unserved = queued && !self.registry.serves(view.task.kind());
        view.progress = view
            .lease_id
            .and_then(|lease| self.attempts.progress_of(lease))
            .cloned();
        Some(view)
    }

    pub(super) fn job_not_found(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        job_id: JobId,
    ) {
        m.client_error(
            conn,
            request_id,
            ErrorCode::JobNotFound,
            format!("no job {job_id}"),
        );
    }

    pub(super) fn list(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        (state, limit): (Option<JobState>, Option<u32>),
        before: Option<JobId>,
    ) {
        let limit = limit.unwrap_or(LIST_LIMIT_DEFAULT);
        if limit > LIST_LIMIT_MAX {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!("list limit must be at most {LIST_LIMIT_MAX} (got {limit})"),
            );
        }
        let before = match before.map(|id| m.table.get(&id).map(|job| job.submitted_at)) {
            None => None,
            Some(Some(index)) => Some(index),
            Some(None) => {
                return m.client_error(
                    conn,
                    request_id,
                    ErrorCode::JobNotFound,
                    "the job a listing pages from (`before`) is unknown (purged?); list from the newest again".to_owned(),
                )
            }
        };
        let jobs = m
            .table
            .newest_first_before(before)
            .filter(|job| state.is_none_or(|s| job.state == s))
            .take(limit as usize)
            .filter_map(|job| self.job_view(m, &job.id))
            .collect();
        m.send_client(conn, ClientReply::JobList { request_id, jobs });
    }

    pub(super) fn cancel(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        job_id: JobId,
        confirmed: bool,
    ) {
        let answered_from_table = m
            .table
            .get(&job_id)
            .is_none_or(|job| job.state.is_terminal());
        if answered_from_table && !confirmed && m.reads_need_confirmation() {
            // "No such job" and "already terminal" read the table: confirm this member still
            // leads first (a deposed leader may hold a job the group has since purged).
            let request = ClientRequest::Cancel { request_id, job_id };
            return self.confirm_then(
                m,
                Read::Request {
                    conn,
                    request: Box::new(request),
                },
            );
        }
        let terminal = m
            .table
            .get(&job_id)
            .filter(|job| job.state.is_terminal())
            .and_then(|job| self.job_view(m, &job.id));
        let partition_of = m.table.get(&job_id).and_then(|job| job.partition_of);
        if let Some(of) = partition_of {
            m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!(
                    "job {job_id} is partition {} of job {}; cancel that job instead",
                    of.index, of.parent
                ),
            );
        } else if m.table.get(&job_id).is_none() {
            self.job_not_found(m, conn, request_id, job_id);
        } else if let Some(owner) = foreign_owner(m, conn, job_id) {
            let caller = m.caller(conn).clone();
            m.event(crate::coordinator::Event::Forbidden {
                conn,
                caller: caller.describe(),
                request: "CANCEL",
            });
            m.client_error(
                conn,
                request_id,
                ErrorCode::Forbidden,
                format!(
                    "job {job_id} was submitted by {}; {} may cancel only its own jobs (an admin token cancels any)",
                    owner.map_or_else(|| "a caller with no token".to_owned(), |o| format!("token {o:?}")),
                    caller.describe()
                ),
            );
        } else if let Some(job) = terminal {
            // Terminal is final: answer from the durable table without writing anything.
            m.send_client(
                conn,
                ClientReply::CancelResult {
                    term: self.term,
                    request_id,
                    job: Box::new(job),
                    cancelled: false,
                },
            );
        } else {
            self.propose(
                m,
                Command::Cancel { job_id },
                Some(Pending::Cancel { conn, request_id }),
            );
        }
    }
}

/// The submitter of `job_id`, when the caller on `conn` may not cancel it: a token below
/// `admin` cancels only the jobs it submitted itself.
fn foreign_owner(m: &Member, conn: ConnectionId, job_id: JobId) -> Option<Option<String>> {
    let caller = m.caller(conn);
    if caller.role >= Role::Admin {
        return None;
    }
    let owner = m.table.get(&job_id)?.submitted_by.clone();
    (owner != caller.name).then_some(owner)
}
