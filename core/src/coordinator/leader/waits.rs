//! Parked waits: a client's `WAIT` for a job that is not finished yet, answered when the job
//! becomes terminal or the wait's time runs out, bounded in all (`WAITERS_MAX`) and per
//! connection (`max_waiters_per_connection`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::reads::Read;
use super::LeaderState;
use crate::coordinator::member::Member;
use crate::coordinator::timers::{Timer, TimerKey};
use crate::ids::{ConnectionId, JobId, RequestId};
use crate::limits::{WAITERS_MAX, WAIT_MILLIS_MAX};
use crate::protocol::{ClientReply, ErrorCode};

#[derive(Clone, Debug)]
pub(super) struct Waiter {
    pub(super) conn: ConnectionId,
    pub(super) request_id: RequestId,
    /// The wait's timeout, disarmed when it is answered another way.
    timer: TimerKey,
}

/// Every parked wait, by job, with the counts that bound them.
#[derive(Debug, Default)]
pub(super) struct Waits {
    by_job: BTreeMap<JobId, Vec<Waiter>>,
    /// How many waits `by_job` holds.
    count: usize,
    /// Parked waits per connection (never zero: a connection without waits has no entry).
    per_conn: BTreeMap<ConnectionId, usize>,
}

impl Waits {
    /// Why `conn` may not park another wait, if it may not.
    fn refusal(&self, conn: ConnectionId, per_connection: usize) -> Option<String> {
        if self.count >= WAITERS_MAX {
            return Some(format!(
                "{WAITERS_MAX} waits are already parked; poll with STATUS or retry later"
            ));
        }
        let on_this_connection = self.per_conn.get(&conn).copied().unwrap_or(0);
        (on_this_connection >= per_connection).then(|| {
            format!("this connection already has {per_connection} waits parked; wait on fewer jobs at once, or poll with STATUS")
        })
    }

    fn park(&mut self, job_id: JobId, waiter: Waiter) {
        *self.per_conn.entry(waiter.conn).or_default() += 1;
        self.by_job.entry(job_id).or_default().push(waiter);
        self.count += 1;
        self.debug_check();
    }

    /// `n` parked waits of `conn` are gone (answered, timed out or dropped).
    fn unpark(&mut self, conn: ConnectionId, n: usize) {
        assert!(self.count >= n, "{} waits parked, {n} went", self.count);
        self.count -= n;
        if let Some(count) = self.per_conn.get_mut(&conn) {
            assert!(*count >= n, "{conn} had {count} waits parked, {n} went");
            *count -= n;
            if *count == 0 {
                self.per_conn.remove(&conn);
            }
        } else {
            assert_eq!(n, 0, "{conn} had no waits parked, {n} went");
        }
    }

    /// Takes out the one wait `(conn, request_id)` parked on `job_id`; false if it is gone.
    fn take(&mut self, job_id: JobId, conn: ConnectionId, request_id: RequestId) -> bool {
        let Some(list) = self.by_job.get_mut(&job_id) else {
            return false;
        };
        let before = list.len();
        list.retain(|w| !(w.conn == conn && w.request_id == request_id));
        let removed = before - list.len();
        if list.is_empty() {
            self.by_job.remove(&job_id);
        }
        self.unpark(conn, removed);
        self.debug_check();
        removed > 0
    }

    /// Takes out every wait parked on `job_id`.
    fn take_job(&mut self, job_id: JobId) -> Vec<Waiter> {
        let list = self.by_job.remove(&job_id).unwrap_or_default();
        for waiter in &list {
            self.unpark(waiter.conn, 1);
        }
        self.debug_check();
        list
    }

    /// Takes out every wait of `conn`, returning their timers.
    fn take_conn(&mut self, conn: ConnectionId) -> Vec<TimerKey> {
        if self.count == 0 {
            return Vec::new();
        }
        let mut timers = Vec::new();
        self.by_job.retain(|_, list| {
            list.retain(|w| {
                let keep = w.conn != conn;
                if !keep {
                    timers.push(w.timer);
                }
                keep
            });
            !list.is_empty()
        });
        self.unpark(conn, timers.len());
        self.debug_check();
        timers
    }

    /// Every wait still parked (the leader is stepping down).
    pub(super) fn into_all(self) -> impl Iterator<Item = Waiter> {
        self.by_job.into_values().flatten()
    }

    /// The counts agree with the waits parked (debug builds: every test and simulator step).
    fn debug_check(&self) {
        if cfg!(debug_assertions) {
            let parked: usize = self.by_job.values().map(Vec::len).sum();
            let counted: usize = self.per_conn.values().sum();
            assert!(
                parked == self.count && counted == self.count,
                "{parked} waits parked, {} counted, {counted} counted by connection",
                self.count
            );
            assert!(self.by_job.values().all(|list| !list.is_empty()));
        }
    }
}

impl LeaderState {
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
        let per_connection = m.config.max_waiters_per_connection;
        if let Some(message) = self.waits.refusal(conn, per_connection) {
            return m.client_error(conn, request_id, ErrorCode::TooManyWaiters, message);
        }
        let at = m.now.saturating_add(Duration::from_millis(timeout_millis));
        let timer = self
            .timers
            .arm(at, Timer::WaitTimeout(conn, request_id, job_id));
        let waiter = Waiter {
            conn,
            request_id,
            timer,
        };
        self.waits.park(job_id, waiter);
    }

    pub(super) fn time_out_waiter(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        job_id: JobId,
    ) {
        if !self.waits.take(job_id, conn, request_id) {
            return;
        }
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

    /// `job_id` became terminal (or was purged): every wait parked on it is answered.
    pub(super) fn wake_waiters(&mut self, m: &mut Member, job_id: JobId) {
        let list = self.waits.take_job(job_id);
        if list.is_empty() {
            return;
        }
        let view = self.job_view(m, &job_id);
        for waiter in list {
            self.timers.disarm(waiter.timer);
            // Every waiter is answered and its slot freed, whatever became of the job.
            let Some(job) = &view else {
                self.job_not_found(m, waiter.conn, waiter.request_id, job_id);
                continue;
            };
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

    /// `conn` closed: its parked waits are dropped with their timers.
    pub(super) fn drop_waiters_of(&mut self, conn: ConnectionId) {
        for timer in self.waits.take_conn(conn) {
            self.timers.disarm(timer);
        }
    }
}
