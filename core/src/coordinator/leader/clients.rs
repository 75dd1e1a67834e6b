//! The client link at the leader: submissions (validation, idempotency, admission, splitting),
//! status, waits, cancels and listings.

use std::time::Duration;

use super::admission::ParkedResend;
use super::{LeaderState, Pending, Read, Submission, Waiter};
use crate::command::{Command, SubmitOptions};
use crate::coordinator::member::Member;
use crate::coordinator::timers::Timer;
use crate::coordinator::Event;
use crate::ids::{ConnectionId, JobId, RequestId};
use crate::job::JobState;
use crate::limits::{
    ASSIGN_ENVELOPE_BYTES, ATTEMPTS_MAX, ATTEMPT_ERROR_BYTES_MAX, IDEMPOTENCY_KEY_BYTES_MAX,
    JOB_TIMEOUT_MILLIS_MAX, KEYED_RESENDS_PARKED_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX,
    PARTITIONS_MAX, PARTITION_VIEW_BYTES_MAX, WAITERS_MAX, WAIT_MILLIS_MAX,
};
use crate::protocol::{ClientReply, ClientRequest, ErrorCode, JobView, Partitions};
use crate::tasks::TaskSpec;

impl LeaderState {
    pub(super) fn submit(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        submission: Submission,
        confirmed: bool,
    ) {
        let Submission {
            task: raw_task,
            max_attempts: asked_attempts,
            idempotency_key,
            partitions,
            timeout_millis,
        } = submission;
        let task = match TaskSpec::from_json(&raw_task) {
            Ok(task) => task,
            Err(error) => {
                return m.client_error(conn, request_id, ErrorCode::InvalidTask, error.to_string())
            }
        };
        let encoded = serde_json::to_vec(&task).map_or(usize::MAX, |bytes| bytes.len());
        // The log entry also carries the key (escaped as JSON), and must fit one APPEND.
        let key_bytes = idempotency_key.as_ref().map_or(0, |k| {
            serde_json::to_vec(k).map_or(usize::MAX, |bytes| bytes.len())
        });
        if encoded
            .saturating_add(key_bytes)
            .saturating_add(ASSIGN_ENVELOPE_BYTES)
            > m.config.max_frame_bytes
        {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidTask,
                format!(
                    "the task is {encoded} bytes as JSON; its assignment would not fit the frame limit of {} bytes",
                    m.config.max_frame_bytes
                ),
            );
        }
        let max_attempts = asked_attempts.unwrap_or(m.config.default_max_attempts);
        if !(1..=ATTEMPTS_MAX).contains(&max_attempts) {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!("max_attempts must be between 1 and {ATTEMPTS_MAX} (got {max_attempts})"),
            );
        }
        if let Err(message) = check_partitions_request(&task, partitions) {
            return m.client_error(conn, request_id, ErrorCode::InvalidRequest, message);
        }
        if let Some(millis) = timeout_millis {
            if !(1..=JOB_TIMEOUT_MILLIS_MAX).contains(&millis) {
                return m.client_error(
                    conn,
                    request_id,
                    ErrorCode::InvalidRequest,
                    format!(
                        "timeout_millis must be between 1 and {JOB_TIMEOUT_MILLIS_MAX} (got {millis})"
                    ),
                );
            }
        }
        // What the job records of the partition request, and a keyed resend must repeat.
        let partitions_asked = task
            .is_data_parallel()
            .then(|| partitions.unwrap_or(Partitions::Auto));
        if let Some(key) = &idempotency_key {
            if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
                return m.client_error(
                    conn,
                    request_id,
                    ErrorCode::InvalidRequest,
                    format!(
                        "idempotency key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes (got {})",
                        key.len()
                    ),
                );
            }
            // A known key is answered from the applied (durable) table, with apply's own rule,
            // once this member is confirmed to lead: a deposed leader may still hold a key
            // whose job the group has since purged (and the key since bound to another job).
            let asked = SubmitOptions {
                task: &task,
                max_attempts,
                partitions_asked,
                timeout_millis,
            };
            let known = m.table.check_idempotency(key, &asked);
            if known.is_some() && !confirmed && m.reads_need_confirmation() {
                let request = Submission {
                    task: raw_task,
                    max_attempts: asked_attempts,
                    idempotency_key,
                    partitions,
                    timeout_millis,
                }
                .into_request(request_id);
                return self.confirm_then(m, Read::Request { conn, request });
            }
            match known {
                Some(Ok(job_id)) => {
                    return m.send_client(
                        conn,
                        ClientReply::SubmitAccepted {
                            term: self.term,
                            request_id,
                            job_id,
                            existing: true,
                        },
                    )
                }
                Some(Err(existing)) => {
                    return self.idempotency_conflict(m, conn, request_id, existing)
                }
                None => {}
            }
            // A key whose submission is still being written: answered once that entry applies.
            if let Some(at) = self.admitting.proposal_for(key) {
                let resend = ParkedResend {
                    conn,
                    request_id,
                    submission: Submission {
                        task: raw_task,
                        max_attempts: asked_attempts,
                        idempotency_key,
                        partitions,
                        timeout_millis,
                    },
                };
                if let Err(resend) = self.admitting.park(at, resend) {
                    let message = format!(
                        "{KEYED_RESENDS_PARKED_MAX} resends already wait for their first submission to be written; retry shortly"
                    );
                    m.send_client(
                        resend.conn,
                        ClientReply::SubmitRejected {
                            request_id: resend.request_id,
                            retryable: true,
                            active_jobs: m.table.active_jobs(),
                            admitting_jobs: self.admitting.slots(),
                            max_active_jobs: m.config.max_active_jobs,
                            message,
                        },
                    );
                }
                return;
            }
        }
        // Admission counts the applied table's active jobs and the submissions still being
        // written, so a refusal writes nothing. Apply checks again with the same rule.
        let pieces = self.resolve_partitions(m, &task, partitions);
        // Every reply about the job must fit a frame: the parent's view carries the whole task,
        // a line per partition and at most one worker's error.
        let view_bytes = encoded
            .saturating_add(pieces.saturating_mul(PARTITION_VIEW_BYTES_MAX))
            .saturating_add(ATTEMPT_ERROR_BYTES_MAX)
            .saturating_add(idempotency_key.as_ref().map_or(0, String::len))
            .saturating_add(ASSIGN_ENVELOPE_BYTES);
        if task.is_data_parallel() && view_bytes > m.config.max_frame_bytes {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidTask,
                format!(
                    "the task is {encoded} bytes as JSON; split {pieces} ways, a reply showing the job could need {view_bytes} bytes, over the frame limit of {} bytes; submit a smaller input or fewer partitions",
                    m.config.max_frame_bytes
                ),
            );
        }
        let limit = m.config.max_active_jobs;
        let slots = 1 + pieces as u64;
        if slots > limit {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!(
                    "a job split into {pieces} partitions needs {slots} admission slots (the job and each partition), but --max-active-jobs is {limit}; ask for fewer partitions or raise the limit"
                ),
            );
        }
        let (active, admitting) = (m.table.active_jobs(), self.admitting.slots());
        if active.saturating_add(admitting).saturating_add(slots) > limit {
            if !confirmed && m.reads_need_confirmation() {
                // A refusal reads the table: it must not come from a leader that was deposed
                // while other members finished jobs.
                let request = Submission {
                    task: raw_task,
                    max_attempts: asked_attempts,
                    idempotency_key,
                    partitions,
                    timeout_millis,
                }
                .into_request(request_id);
                return self.confirm_then(m, Read::Request { conn, request });
            }
            return self.reject_submission(m, conn, request_id, active, admitting, limit);
        }
        // The job's id first, then one per partition, each unlike any drawn before it.
        let mut ids = Vec::with_capacity(1 + pieces);
        for _ in 0..=pieces {
            let id = self.fresh_job_id(m, &ids);
            ids.push(id);
        }
        let partitions = ids.split_off(1);
        let job_id = ids[0];
        let key = idempotency_key.clone();
        let proposal = self.propose(
            m,
            Command::Submit {
                job_id,
                task,
                max_attempts,
                idempotency_key,
                max_active_jobs: limit,
                partitions,
                partitions_asked,
                timeout_millis,
            },
            Some(Pending::Submit { conn, request_id }),
        );
        self.admitting
            .proposed((proposal.term, proposal.index), slots, key);
    }

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

    /// A job id no job in the table (nor in `taken`) has.
    pub(super) fn fresh_job_id(&mut self, m: &mut Member, taken: &[JobId]) -> JobId {
        loop {
            let id = JobId::random(&mut m.rng);
            if m.table.get(&id).is_none() && !taken.contains(&id) {
                return id;
            }
        }
    }

    /// How many partition jobs a submission becomes: `min(partitions, items)` for a
    /// data-parallel task (`auto`, or no request, means one per live worker, at least one, at
    /// most what admission leaves room for), 0 for any other task. The request was checked by
    /// [`check_partitions_request`].
    pub(super) fn resolve_partitions(
        &self,
        m: &Member,
        task: &TaskSpec,
        partitions: Option<Partitions>,
    ) -> usize {
        if !task.is_data_parallel() {
            return 0;
        }
        let requested = match partitions.unwrap_or(Partitions::Auto) {
            Partitions::Auto => {
                // One per live worker, but never more than admission leaves room for now (the
                // parent takes a slot too). When nothing is left, one partition is asked for,
                // and admission refuses it.
                let live = self.registry.iter().filter(|w| w.alive).count() as u64;
                let room = m
                    .config
                    .max_active_jobs
                    .saturating_sub(m.table.active_jobs())
                    .saturating_sub(self.admitting.slots())
                    .saturating_sub(1)
                    .max(1);
                u32::try_from(live.clamp(1, room)).unwrap_or(PARTITIONS_MAX)
            }
            Partitions::Count(n) => n,
        };
        // `TaskSpec::split` makes exactly `min(partitions, items)` pieces; counting them here
        // spares copying the input, which apply splits once.
        let pieces = u64::from(requested.clamp(1, PARTITIONS_MAX)).min(task.items());
        usize::try_from(pieces).unwrap_or(PARTITIONS_MAX as usize)
    }

    pub(super) fn reject_submission(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        active_jobs: u64,
        admitting_jobs: u64,
        max_active_jobs: u64,
    ) {
        m.event(Event::SubmitRejected {
            active_jobs,
            admitting_jobs,
            max_active_jobs,
        });
        m.send_client(
            conn,
            ClientReply::SubmitRejected {
                request_id,
                retryable: true,
                active_jobs,
                admitting_jobs,
                max_active_jobs,
                message: format!(
                    "coordinator is at its limit of {max_active_jobs} active jobs ({active_jobs} active, {admitting_jobs} being admitted); retry later"
                ),
            },
        );
    }

    pub(super) fn idempotency_conflict(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        existing: JobId,
    ) {
        m.client_error(
            conn,
            request_id,
            ErrorCode::IdempotencyConflict,
            format!(
                "idempotency key is bound to job {existing} with a different task, max attempts, timeout or partition request; use a new key"
            ),
        );
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

/// A `partitions` request is for a data-parallel task and within `1..=PARTITIONS_MAX`.
fn check_partitions_request(task: &TaskSpec, partitions: Option<Partitions>) -> Result<(), String> {
    match partitions {
        Some(_) if !task.is_data_parallel() => Err(format!(
            "partitions apply only to max, prime-count-list and prime-sum tasks, not {}",
            task.kind()
        )),
        Some(Partitions::Count(n)) if !(1..=PARTITIONS_MAX).contains(&n) => Err(format!(
            "partitions must be between 1 and {PARTITIONS_MAX} (got {n})"
        )),
        _ => Ok(()),
    }
}
