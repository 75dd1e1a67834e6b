//! The client link at the leader: status, waits, cancels and listings (submissions are in
//! `submissions`).

use std::time::Duration;

use super::{LeaderState, Pending, Read, Waiter};
use crate::auth::Role;
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::timers::Timer;
use crate::ids::{ConnectionId, JobId, RequestId};
use crate::job::JobState;
use crate::limits::{LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, WAITERS_MAX, WAIT_MILLIS_MAX};
use crate::protocol::{ClientReply, ClientRequest, ErrorCode, JobView};

impl LeaderState {
    /// What clients see of a job, from the applied table, marked `unserved` while it (or a
    /// partition of it) is queued and no worker that takes work serves its kind.
    pub(super) fn job_view(&self, m: &Member, job_id: &JobId) -> Option<JobView> {
        let mut view = m.table.view(job_id)?;
        let queued = view.state == JobState::Queued
            || view
                .partitions
                .as_ref()
                .is_some_and(|parts| parts.pieces.iter().any(|p| p.state == JobState::Queued));
        view.unserved = queued && !self.registry.serves(view.task.kind());
        view.progress = view
            .lease_id
            .and_then(|lease| self.progress.get(&lease))
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

    pub(super) fn wait(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        job_id: JobId,
        timeout_millis: Option<u64>,
    ) {
        let timeout_millis = timeout_millis.unwrap_or(WAIT_MILLIS_MAX);
        if timeout_millis > WAIT_MILLIS_MAX {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!("wait timeout must be at most {WAIT_MILLIS_MAX} ms (got {timeout_millis})"),
            );
        }
        let Some(job) = m.table.get(&job_id) else {
            return self.job_not_found(m, conn, request_id, job_id);
        };
        if job.state.is_terminal() {
            let Some(job) = self.job_view(m, &job_id) else {
                return self.job_not_found(m, conn, request_id, job_id);
            };
            return m.send_client(
                conn,
                ClientReply::WaitResult {
                    request_id,
                    job: Box::new(job),
                    timed_out: false,
                },
            );
        }
        if self.waiter_count >= WAITERS_MAX {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::TooManyWaiters,
                format!("{WAITERS_MAX} waits are already parked; poll with STATUS or retry later"),
            );
        }
        let on_this_connection = self.waiters_per_conn.get(&conn).copied().unwrap_or(0);
        let per_connection = m.config.max_waiters_per_connection;
        if on_this_connection >= per_connection {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::TooManyWaiters,
                format!("this connection already has {per_connection} waits parked; wait on fewer jobs at once, or poll with STATUS"),
            );
        }
        let at = m.now.saturating_add(Duration::from_millis(timeout_millis));
        let timer = self
            .timers
            .arm(at, Timer::WaitTimeout(conn, request_id, job_id));
        self.waiters.entry(job_id).or_default().push(Waiter {
            conn,
            request_id,
            timer,
        });
        self.waiter_count += 1;
        *self.waiters_per_conn.entry(conn).or_default() += 1;
    }

    /// `n` parked waits of `conn` are gone (answered, timed out or dropped).
    fn unpark(&mut self, conn: ConnectionId, n: usize) {
        self.waiter_count -= n;
        if let Some(count) = self.waiters_per_conn.get_mut(&conn) {
            assert!(*count >= n, "{conn} had {count} waits parked, {n} went");
            *count -= n;
            if *count == 0 {
                self.waiters_per_conn.remove(&conn);
            }
        } else {
            assert_eq!(n, 0, "{conn} had no waits parked, {n} went");
        }
    }

    pub(super) fn time_out_waiter(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        job_id: JobId,
    ) {
        let Some(list) = self.waiters.get_mut(&job_id) else {
            return;
        };
        let before = list.len();
        list.retain(|w| !(w.conn == conn && w.request_id == request_id));
        let removed = before - list.len();
        if list.is_empty() {
            self.waiters.remove(&job_id);
        }
        if removed == 0 {
            return;
        }
        self.unpark(conn, removed);
        if m.reads_need_confirmation() {
            let read = Read::WaitTimedOut {
                conn,
                request_id,
                job_id,
            };
            return self.confirm_then(m, read);
        }
        self.answer_wait_timeout(m, conn, request_id, job_id);
    }

    /// A wait's time ran out: it is answered with the job as it is now.
    pub(super) fn answer_wait_timeout(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        job_id: JobId,
    ) {
        // The job may have finished and been purged while the read was being confirmed.
        let Some(job) = self.job_view(m, &job_id) else {
            return self.job_not_found(m, conn, request_id, job_id);
        };
        let timed_out = !job.state.is_terminal();
        m.send_client(
            conn,
            ClientReply::WaitResult {
                request_id,
                job: Box::new(job),
                timed_out,
            },
        );
    }

    pub(super) fn wake_waiters(&mut self, m: &mut Member, job_id: JobId) {
        let Some(list) = self.waiters.remove(&job_id) else {
            return;
        };
        let Some(job) = self.job_view(m, &job_id) else {
            // Every waiter is answered and its slot freed, whatever became of the job.
            for waiter in list {
                self.unpark(waiter.conn, 1);
                self.timers.disarm(waiter.timer);
                self.job_not_found(m, waiter.conn, waiter.request_id, job_id);
            }
            return;
        };
        for waiter in list {
            self.unpark(waiter.conn, 1);
            self.timers.disarm(waiter.timer);
            m.send_client(
                waiter.conn,
                ClientReply::WaitResult {
                    request_id: waiter.request_id,
                    job: Box::new(job.clone()),
                    timed_out: false,
                },
            );
        }
    }

    pub(super) fn drop_waiters_of(&mut self, conn: ConnectionId) {
        if self.waiter_count == 0 {
            return;
        }
        let mut dropped = 0;
        let mut timers = Vec::new();
        self.waiters.retain(|_, list| {
            list.retain(|w| {
                let keep = w.conn != conn;
                if !keep {
                    timers.push(w.timer);
                    dropped += 1;
                }
                keep
            });
            !list.is_empty()
        });
        for timer in timers {
            self.timers.disarm(timer);
        }
        self.unpark(conn, dropped);
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
            return self.confirm_then(m, Read::Request { conn, request });
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
