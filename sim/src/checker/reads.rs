//! Reads are linearizable: an answer about a job, or a listing of jobs, reflects at least
//! everything the committed log held when the request reached a coordinator. (A write
//! acknowledged to anyone before the read was sent was committed before then, so this is the
//! stronger test.) A deposed leader answering from its stale table fails it.

use herder_core::ids::{JobId, LogIndex};
use herder_core::job::JobState;
use herder_core::protocol::{ClientReply, ErrorCode, JobView};

use super::{Check, Checker};

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// What the committed log said of a job when a read about it reached a coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadFloor {
    pub job: JobId,
    pub state: JobState,
    pub attempt: u32,
    /// Attempts a drain had handed back by then (each lowers the attempt count by one).
    pub releases: u32,
    /// A committed purge had removed the job already: only `JOB_NOT_FOUND` is current.
    pub purged: bool,
    /// For a data-parallel parent: what the committed log said of each partition, in order
    /// (a view of the parent shows them, and they must be as current).
    pub pieces: Vec<ReadFloor>,
}

/// What the committed log held when a `LIST` of the newest jobs reached a coordinator: every
/// job a listing shows (partitions are shown inside their parent), newest first, with where it
/// was submitted.
#[derive(Clone, Debug)]
pub struct ListFloor {
    limit: usize,
    jobs: Vec<(LogIndex, ReadFloor)>,
}

/// What a read must reflect at least, noted as it reached a coordinator.
#[derive(Clone, Debug)]
pub enum Floor {
    /// A read about one job (none: the job was not committed yet, as far as is known).
    Job(Option<ReadFloor>),
    List(ListFloor),
}

impl Checker {
    /// Judges the answer to a read against what it had to reflect.
    pub fn check_floor(&self, floor: Floor, reply: &ClientReply) -> Check {
        match floor {
            Floor::Job(floor) => self.check_read(floor, reply),
            Floor::List(floor) => self.check_list(&floor, reply),
        }
    }

    /// What the committed log says of `job` now (none: not created yet, as far as is known).
    pub fn read_floor(&self, job: &JobId) -> Option<ReadFloor> {
        let purged = !self.model.jobs.contains_key(job);
        self.model.job_ever(job).map(|row| ReadFloor {
            job: *job,
            state: row.state,
            attempt: row.attempt,
            releases: row.releases,
            purged,
            pieces: row
                .partitions
                .iter()
                .filter_map(|piece| self.read_floor(piece))
                .collect(),
        })
    }

    /// Reads are linearizable: the answer to a read reflects at least everything committed
    /// before the read arrived (a deposed leader answering from its stale table fails this).
    pub fn check_read(&self, floor: Option<ReadFloor>, reply: &ClientReply) -> Check {
        let Some(floor) = floor else {
            return Ok(());
        };
        let view = match reply {
            ClientReply::Job { job, .. }
            | ClientReply::WaitResult { job, .. }
            | ClientReply::CancelResult { job, .. } => {
                ensure!(
                    !floor.purged,
                    "stale read: job {} shown as {}, but a committed purge had removed it before the request arrived",
                    job.id,
                    job.state
                );
                job
            }
            ClientReply::Error {
                code: ErrorCode::JobNotFound,
                ..
            } => {
                // Fine only if a committed purge has removed it since the request arrived.
                ensure!(
                    self.model.purged.contains_key(&floor.job),
                    "stale read: JOB_NOT_FOUND, but the job was committed ({}, attempt {}) before the request arrived and was never purged",
                    floor.state,
                    floor.attempt
                );
                return Ok(());
            }
            _ => return Ok(()),
        };
        self.check_view_floor(&floor, view)
    }

    /// A view of a job, and of each of its partitions, is no older than what the committed log
    /// said of it before the request arrived.
    fn check_view_floor(&self, floor: &ReadFloor, view: &JobView) -> Check {
        self.check_state_floor(floor, view.id, view.state, view.attempt)?;
        let pieces = view.partitions.as_ref().map_or(&[][..], |p| &p.pieces[..]);
        for piece in &floor.pieces {
            match pieces.iter().find(|shown| shown.job_id == piece.job) {
                Some(shown) => {
                    self.check_state_floor(piece, shown.job_id, shown.state, shown.attempt)?
                }
                None => ensure!(
                    false,
                    "stale read: job {} shown without its partition {}, which the committed log held before the request arrived",
                    view.id,
                    piece.job
                ),
            }
        }
        Ok(())
    }

    /// A job shown as `state` on attempt `attempt` is no older than `floor`.
    fn check_state_floor(
        &self,
        floor: &ReadFloor,
        job: JobId,
        state: JobState,
        attempt: u32,
    ) -> Check {
        // The attempt count only grows, but for releases committed since (each gives one back).
        let released_since = self
            .model
            .job_ever(&floor.job)
            .map_or(0, |row| row.releases.saturating_sub(floor.releases));
        ensure!(
            attempt + released_since >= floor.attempt
                && (!floor.state.is_terminal() || state == floor.state),
            "stale read: job {job} shown as {state} attempt {attempt}, but it was {} attempt {} by the committed log before the request arrived",
            floor.state,
            floor.attempt
        );
        Ok(())
    }

    /// What a `LIST` of the newest `limit` jobs must show at least, or `None` for a listing
    /// this check does not judge (one filtered by state or paged).
    pub fn list_floor(
        &self,
        limit: usize,
        state: Option<JobState>,
        before: Option<JobId>,
    ) -> Option<ListFloor> {
        if state.is_some() || before.is_some() {
            return None;
        }
        let mut jobs: Vec<(LogIndex, ReadFloor)> = self
            .model
            .jobs
            .iter()
            .filter(|(_, job)| job.parent.is_none())
            .filter_map(|(id, _)| {
                let at = *self.model.submitted_at.get(id)?;
                Some((at, self.read_floor(id)?))
            })
            .collect();
        jobs.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
        jobs.truncate(limit);
        Some(ListFloor { limit, jobs })
    }

    /// A listing shows every job of its floor it has room for (newer than the oldest it shows,
    /// or all when it is not full), each no older than the floor says; a job left out must
    /// have been purged since; and it shows no job the committed log never held.
    pub fn check_list(&self, floor: &ListFloor, reply: &ClientReply) -> Check {
        let ClientReply::JobList { jobs, .. } = reply else {
            return Ok(());
        };
        let mut oldest_shown = None;
        for view in jobs {
            let at = self.model.submitted_at.get(&view.id);
            ensure!(
                at.is_some(),
                "stale read: LIST shows job {}, which the committed log never held",
                view.id
            );
            oldest_shown = oldest_shown.min(at).or(at);
        }
        let full = jobs.len() >= floor.limit;
        for (at, job) in &floor.jobs {
            if full && oldest_shown.is_some_and(|oldest| at <= oldest) {
                continue;
            }
            match jobs.iter().find(|view| view.id == job.job) {
                Some(view) => self.check_view_floor(job, view)?,
                None => ensure!(
                    !self.model.jobs.contains_key(&job.job),
                    "stale read: LIST of the newest {} leaves out job {} (submitted at entry {at}, {} when the request arrived), which the committed log held then and has not purged",
                    floor.limit,
                    job.job,
                    job.state
                ),
            }
        }
        Ok(())
    }
}
