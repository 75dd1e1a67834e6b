//! What a worker is configured with, and why a configuration is refused.

use std::time::Duration;

use crate::ids::WorkerId;
use crate::limits::{PREFETCH_PER_SLOT_MAX, QUEUES_MAX, TASKS_PER_WORKER_MAX, WORKER_CAPACITY_MAX};
use crate::protocol::builtin_task_names;
use crate::queues::check_queue_name;
use crate::tasks::check_served_name;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    pub worker_id: WorkerId,
    pub capacity: u32,
    /// Assignments it may hold beyond `capacity`, waiting in order for a slot (at most
    /// [`PREFETCH_PER_SLOT_MAX`] per slot). The next job is then already here when a slot frees, instead of a round
    /// trip and a commit away.
    pub prefetch: u32,
    /// Coordinator worker-port addresses, tried in turn.
    pub coordinators: Vec<String>,
    /// Reconnect backoff: full jitter in `[0, min(reconnect_max, reconnect_base * 2^n)]`.
    pub reconnect_base: Duration,
    pub reconnect_max: Duration,
    /// How long to wait for a connection to open and registration to be answered.
    pub connect_timeout: Duration,
    /// The task kinds this worker serves: built-in kinds and user task names. It is given
    /// work of these kinds only.
    pub tasks: Vec<String>,
    /// The queues it takes work from (`None`: every queue).
    pub queues: Option<Vec<String>>,
}

impl WorkerConfig {
    pub fn new(worker_id: WorkerId, capacity: u32, coordinators: Vec<String>) -> WorkerConfig {
        WorkerConfig {
            worker_id,
            capacity,
            prefetch: 0,
            coordinators,
            reconnect_base: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(5_000),
            connect_timeout: Duration::from_millis(5_000),
            tasks: builtin_task_names(),
            queues: None,
        }
    }

    pub fn validate(&self) -> Result<(), WorkerConfigError> {
        if !(1..=WORKER_CAPACITY_MAX).contains(&self.capacity) {
            return Err(WorkerConfigError::Capacity(self.capacity));
        }
        if self.prefetch > self.capacity.saturating_mul(PREFETCH_PER_SLOT_MAX) {
            return Err(WorkerConfigError::Prefetch {
                prefetch: self.prefetch,
                capacity: self.capacity,
            });
        }
        if self.coordinators.is_empty() {
            return Err(WorkerConfigError::NoCoordinators);
        }
        if self.reconnect_base.is_zero() || self.reconnect_base > self.reconnect_max {
            return Err(WorkerConfigError::Backoff);
        }
        if self.connect_timeout.is_zero() {
            return Err(WorkerConfigError::ConnectTimeout);
        }
        if self.tasks.is_empty() || self.tasks.len() > TASKS_PER_WORKER_MAX {
            return Err(WorkerConfigError::TaskCount(self.tasks.len()));
        }
        for name in &self.tasks {
            check_served_name(name)
                .map_err(|error| WorkerConfigError::TaskName(error.to_string()))?;
        }
        if let Some(queues) = &self.queues {
            if queues.is_empty() || queues.len() > QUEUES_MAX {
                return Err(WorkerConfigError::QueueCount(queues.len()));
            }
            for name in queues {
                check_queue_name(name).map_err(WorkerConfigError::QueueName)?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerConfigError {
    #[error("capacity must be between 1 and {WORKER_CAPACITY_MAX} (got {0})")]
    Capacity(u32),
    #[error("prefetch may be at most {PREFETCH_PER_SLOT_MAX} per slot ({} with capacity {capacity}), got {prefetch}", capacity.saturating_mul(PREFETCH_PER_SLOT_MAX))]
    Prefetch { prefetch: u32, capacity: u32 },
    #[error("at least one coordinator address is needed")]
    NoCoordinators,
    #[error("reconnect backoff base must be positive and not above its maximum")]
    Backoff,
    #[error("connect timeout must be positive")]
    ConnectTimeout,
    #[error("a worker serves 1 to {TASKS_PER_WORKER_MAX} task kinds (got {0})")]
    TaskCount(usize),
    #[error("{0}")]
    TaskName(String),
    #[error("a worker takes work from 1 to {QUEUES_MAX} queues (got {0}); leave them out for every queue")]
    QueueCount(usize),
    #[error("{0}")]
    QueueName(String),
}
