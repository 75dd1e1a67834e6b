//! Retention: the leader purges terminal jobs that its policy no longer keeps, and those a
//! client's `PURGE` names, through `Purge` entries in the log.
//!
//! The policy is applied by a sweep once a second. A sweep proposes up to
//! `PURGES_IN_FLIGHT_MAX` batches, and a full batch that applies sweeps again at once, so a
//! backlog drains at whatever rate the log takes while a steady load costs one small purge a
//! second.
//!
//! Which jobs go is decided here, on the leader, from the finish stamps the table holds; the
//! entry then names them by id, so every member removes exactly the same rows. Apply skips an
//! id that is no longer purgeable, so a purge proposed from a table that has since moved on is
//! harmless.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{LeaderState, Pending};
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::timers::Timer;
use crate::ids::{ConnectionId, JobId, RequestId};
use crate::job::JobState;
use crate::limits::{
    PEER_ENVELOPE_BYTES, PURGES_IN_FLIGHT_MAX, PURGE_JOBS_PER_ENTRY_MAX, RETENTION_SWEEP_INTERVAL,
};
use crate::protocol::{ClientReply, ErrorCode};

/// Bytes a job id takes in an encoded `Purge` entry (a quoted UUID and a comma).
const PURGE_ID_BYTES: usize = 40;

/// Purges proposed and not yet applied.
#[derive(Debug, Default)]
pub(super) struct Purging {
    /// Ids named by those purges: not named again until they apply.
    ids: BTreeSet<JobId>,
    /// Policy purges among them (a client's purge does not take a policy slot).
    policy_in_flight: usize,
}

impl Purging {
    pub(super) fn contains(&self, job_id: &JobId) -> bool {
        self.ids.contains(job_id)
    }
}

impl LeaderState {
    /// Arms the first retention sweep of this term.
    pub(super) fn start_retention(&mut self, m: &Member) {
        let at = m.now.saturating_add(RETENTION_SWEEP_INTERVAL);
        self.timers.arm(at, Timer::RetentionSweep);
    }

    /// The sweep timer fired: purge what the policy no longer keeps, and re-arm.
    pub(super) fn retention_sweep(&mut self, m: &mut Member) {
        self.sweep(m);
        self.start_retention(m);
    }

    /// Proposes policy purges while the policy has jobs to drop and purge slots are free.
    pub(super) fn sweep(&mut self, m: &mut Member) {
        let policy = m.config.retention;
        let cutoff = policy.max_age.and_then(|age| m.wall_now().checked_sub(age));
        let count_cutoff = m.wall_now().checked_sub(policy.min_age);
        while self.purging.policy_in_flight < PURGES_IN_FLIGHT_MAX {
            // Jobs being purged already count as gone.
            let kept = m.table.finished_jobs() - self.purging.ids.len() as u64;
            let mut over_count = policy.max_count.map_or(0, |max| kept.saturating_sub(max));
            let mut batch = Vec::new();
            for (finished_at, job_id) in m.table.finished_oldest_first() {
                if batch.len() >= purge_batch_max(m) {
                    break;
                }
                if self.purging.contains(&job_id) {
                    continue;
                }
                // A job finished before jobs carried times has no age: only the count bound
                // (which takes it first) may purge it, so an upgrade does not purge them all.
                let too_old = !finished_at.is_unstamped()
                    && cutoff.is_some_and(|cutoff| finished_at <= cutoff);
                let countable = count_cutoff.is_some_and(|cutoff| finished_at <= cutoff);
                if !too_old && (over_count == 0 || !countable) {
                    break; // oldest first: every later job is younger, and within the count
                }
                over_count = over_count.saturating_sub(1);
                batch.push(job_id);
            }
            if batch.is_empty() {
                return;
            }
            self.purging.policy_in_flight += 1;
            self.propose_purge(m, batch, Pending::PolicyPurge);
        }
    }

    /// A client's `PURGE`: one batch of the matching jobs now, and how many more match.
    pub(super) fn purge(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        state: Option<JobState>,
        older_than: Duration,
    ) {
        if let Some(state) = state.filter(|s| !s.is_terminal()) {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!(
                    "only terminal jobs (COMPLETED, FAILED, CANCELLED) can be purged, not {state}"
                ),
            );
        }
        let cutoff = m.wall_now().checked_sub(older_than);
        let matching: Vec<JobId> = m
            .table
            .finished_oldest_first()
            .take_while(|(finished_at, _)| cutoff.is_some_and(|cutoff| *finished_at <= cutoff))
            .map(|(_, job_id)| job_id)
            .filter(|job_id| !self.purging.contains(job_id))
            .filter(|job_id| {
                state.is_none_or(|s| m.table.get(job_id).is_some_and(|job| job.state == s))
            })
            .collect();
        let take = matching.len().min(purge_batch_max(m));
        let remaining = (matching.len() - take) as u64;
        if take == 0 {
            let reply = ClientReply::Purged {
                request_id,
                purged: 0,
                remaining,
            };
            return m.send_client(conn, reply);
        }
        let batch = matching[..take].to_vec();
        let pending = Pending::Purge {
            conn,
            request_id,
            remaining,
        };
        self.propose_purge(m, batch, pending);
    }

    fn propose_purge(&mut self, m: &mut Member, job_ids: Vec<JobId>, pending: Pending) {
        self.purging.ids.extend(job_ids.iter().copied());
        self.propose(m, Command::Purge { job_ids }, Some(pending));
    }

    /// A `Purge` entry applied (ours if `pending` says so): answer its client, and sweep again
    /// if it was a full policy batch.
    pub(super) fn purge_applied(
        &mut self,
        m: &mut Member,
        job_ids: &[JobId],
        purged: u64,
        pending: Option<Pending>,
    ) {
        for job_id in job_ids {
            self.purging.ids.remove(job_id);
        }
        match pending {
            Some(Pending::PolicyPurge) => {
                self.purging.policy_in_flight -= 1;
                // A full batch may have left more behind: keep going. Otherwise what ages into
                // the policy meanwhile waits for the next sweep, so a steady load makes one
                // purge a second rather than one per applied purge.
                if job_ids.len() >= purge_batch_max(m) {
                    self.sweep(m);
                }
            }
            Some(Pending::Purge {
                conn,
                request_id,
                remaining,
            }) => {
                let reply = ClientReply::Purged {
                    request_id,
                    purged,
                    remaining,
                };
                m.send_client(conn, reply);
            }
            _ => {}
        }
        if purged > 0 {
            m.event(crate::coordinator::Event::JobsPurged {
                purged,
                kept: m.table.finished_jobs(),
            });
        }
    }
}

/// Most ids one `Purge` entry may name: it must fit an `APPEND` frame on its own.
fn purge_batch_max(m: &Member) -> usize {
    let room = m.config.max_frame_bytes.saturating_sub(PEER_ENVELOPE_BYTES);
    (room / PURGE_ID_BYTES).clamp(1, PURGE_JOBS_PER_ENTRY_MAX)
}
