//! The queue of `QUEUED` jobs: FIFO by queue position, and the same positions split by task
//! kind, so a scheduler can find the oldest job a given worker serves without walking past
//! jobs that no worker it has can run.

use std::collections::BTreeMap;

use crate::ids::JobId;

#[derive(Clone, Debug, Default)]
pub struct JobQueue {
    all: BTreeMap<u64, JobId>,
    by_kind: BTreeMap<String, BTreeMap<u64, JobId>>,
}

impl JobQueue {
    /// Queues `job_id` at `seq`; `false` (and no change) if `seq` is taken.
    pub fn insert(&mut self, seq: u64, job_id: JobId, kind: &str) -> bool {
        if self.all.contains_key(&seq) {
            return false;
        }
        self.all.insert(seq, job_id);
        // Look the kind up before allocating its name: almost every insert finds it.
        match self.by_kind.get_mut(kind) {
            Some(of_kind) => {
                of_kind.insert(seq, job_id);
            }
            None => {
                self.by_kind
                    .insert(kind.to_owned(), BTreeMap::from([(seq, job_id)]));
            }
        }
        true
    }

    /// Removes the job at `seq` (of `kind`); the job that was there, if any.
    pub fn remove(&mut self, seq: u64, kind: &str) -> Option<JobId> {
        let removed = self.all.remove(&seq)?;
        if let Some(of_kind) = self.by_kind.get_mut(kind) {
            let also = of_kind.remove(&seq);
            assert_eq!(
                also,
                Some(removed),
                "queue position {seq} was not filed under its kind {kind:?}"
            );
            if of_kind.is_empty() {
                self.by_kind.remove(kind);
            }
        } else {
            panic!("queue position {seq} was not filed under its kind {kind:?}");
        }
        Some(removed)
    }

    /// True if `job_id` is queued at `seq`, filed under `kind`.
    pub fn holds(&self, seq: u64, job_id: JobId, kind: &str) -> bool {
        self.all.get(&seq) == Some(&job_id)
            && self
                .by_kind
                .get(kind)
                .and_then(|jobs| jobs.get(&seq))
                .is_some_and(|id| *id == job_id)
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Every queued job, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = JobId> + '_ {
        self.all.values().copied()
    }

    /// The queued jobs of one kind, oldest first, with their positions.
    pub fn of_kind<'a>(&'a self, kind: &str) -> impl Iterator<Item = (u64, JobId)> + 'a {
        self.by_kind
            .get(kind)
            .into_iter()
            .flat_map(|jobs| jobs.iter().map(|(seq, id)| (*seq, *id)))
    }

    /// The kinds with at least one queued job.
    pub fn kinds(&self) -> impl Iterator<Item = &str> + '_ {
        self.by_kind.keys().map(String::as_str)
    }

    /// The split by kind holds exactly the positions of the whole queue.
    pub fn check(&self) -> Result<(), String> {
        let filed: usize = self.by_kind.values().map(BTreeMap::len).sum();
        if filed != self.all.len() {
            return Err(format!(
                "the queue holds {} jobs but {filed} are filed by kind",
                self.all.len()
            ));
        }
        for (kind, jobs) in &self.by_kind {
            if jobs.is_empty() {
                return Err(format!("an empty queue is kept for kind {kind:?}"));
            }
            for (seq, id) in jobs {
                if self.all.get(seq) != Some(id) {
                    return Err(format!(
                        "job {id} is filed under {kind:?} at {seq}, which the queue does not hold"
                    ));
                }
            }
        }
        Ok(())
    }
}
