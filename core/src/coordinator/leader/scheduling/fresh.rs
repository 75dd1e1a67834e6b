//! Fresh jobs: plain jobs whose `Submit` this leader proposed and which have not applied yet,
//! so they can be assigned in the same write as their submission.

use std::collections::VecDeque;

use super::Lane;
use crate::ids::{JobId, LogIndex};

/// A plain job whose `Submit` this leader proposed at `at` and which has not applied yet.
#[derive(Clone, Debug)]
pub(in crate::coordinator::leader) struct FreshJob {
    pub(in crate::coordinator::leader) at: LogIndex,
    pub(in crate::coordinator::leader) job_id: JobId,
    pub(in crate::coordinator::leader) lane: Lane,
    pub(in crate::coordinator::leader) priority: u8,
}

/// The fresh jobs not yet assigned, in proposal (and so log) order. They are as many as the
/// submissions being written, which admission bounds.
#[derive(Debug, Default)]
pub(in crate::coordinator::leader) struct FreshJobs(pub(super) VecDeque<FreshJob>);

impl FreshJobs {
    pub(in crate::coordinator::leader) fn proposed(&mut self, job: FreshJob) {
        assert!(
            self.0.back().is_none_or(|last| last.at < job.at),
            "fresh job {} proposed at {} after one at {:?}",
            job.job_id,
            job.at,
            self.0.back().map(|last| last.at)
        );
        self.0.push_back(job);
    }

    /// The entry at `index` applied: a fresh job proposed there is fresh no longer (it is in the
    /// table now, queued, or it was never created).
    pub(in crate::coordinator::leader) fn applied(
        &mut self,
        index: LogIndex,
        job_id: Option<JobId>,
    ) {
        let Some(front) = self.0.front() else {
            return;
        };
        // Entries apply in log order and each one applied is checked here, so no fresh job can
        // have been passed over.
        assert!(
            front.at >= index,
            "fresh job {} proposed at {} outlived the apply of that entry (now at {index})",
            front.job_id,
            front.at
        );
        if front.at == index {
            assert_eq!(
                Some(front.job_id),
                job_id,
                "entry {index} applied is not the submission proposed there"
            );
            self.0.pop_front();
        }
    }
}
