//! How a coordinator behaves, and the configurations it refuses.

use std::time::Duration;

use crate::ids::NodeId;
use crate::limits::{
    ACTIVE_JOBS_CEILING, ATTEMPTS_MAX, CONFIG_MILLIS_MAX, FRAME_BYTES_MAX_CEILING,
    FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MIN, GROUP_MEMBERS_MAX, RETAIN_TERMINAL_AGE_DEFAULT,
    RETAIN_TERMINAL_COUNT_DEFAULT, RETAIN_TERMINAL_MIN_AGE_DEFAULT, WAITERS_MAX,
    WAITERS_PER_CONNECTION_DEFAULT,
};
use crate::time::UnixMillis;

/// How a coordinator behaves. Defaults are those of the documented CLI (README.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    pub node_id: NodeId,
    /// Deadline of one attempt, measured on this coordinator's clock from assignment.
    pub task_timeout: Duration,
    /// How often workers are told to heartbeat.
    pub heartbeat_interval: Duration,
    /// Silence after which a worker is declared lost.
    pub heartbeat_timeout: Duration,
    /// Attempts a job gets when its submission does not say.
    pub default_max_attempts: u32,
    /// Retry backoff: full jitter in `[0, min(retry_max, retry_base * 2^(attempt-1))]`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Admission limit on non-terminal jobs.
    pub max_active_jobs: u64,
    /// After recovery, how long a running attempt waits for its worker to come back and report
    /// it. `None` means one heartbeat timeout.
    pub readoption_window: Option<Duration>,
    /// The frame limit of this coordinator's links: a task whose assignment could not be framed
    /// is refused at submission instead of failing every worker it is sent to.
    pub max_frame_bytes: usize,
    /// The other members of the coordinator group (empty: a group of one). Membership is
    /// static: every member is started with the same group.
    pub peers: Vec<NodeId>,
    /// A member that hears no leader for a time drawn from `[min, max)` starts an election.
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// How often a leader sends heartbeats to the other members.
    pub replication_heartbeat: Duration,
    /// Applied log entries a member keeps beyond what every follower holds: a follower further
    /// behind than this catches up from a snapshot of the table instead of the log.
    pub log_retained_entries: u64,
    /// Where this member's clients and workers connect, as the other members and their clients
    /// reach it: followers redirect to the leader's addresses.
    pub client_address: String,
    pub worker_address: String,
    /// Hand leadership to the next member after this many submissions in one term (term
    /// rotation, done by leadership transfer). `None`: never.
    pub rotate_leader_after_jobs: Option<u64>,
    /// How long terminal jobs are kept before the leader purges them.
    pub retention: Retention,
    /// `WAIT`s one client connection may have parked (all connections together: `WAITERS_MAX`).
    pub max_waiters_per_connection: usize,
    /// The wall time at the driver's epoch (`Instant::ZERO`). Core reads no clock; this is how
    /// a leader knows what wall time to stamp on the entries it proposes.
    pub wall_clock_at_epoch: UnixMillis,
}

/// How long terminal jobs (`COMPLETED`, `FAILED`, `CANCELLED`) stay in the table, with their
/// payloads, results and idempotency keys. The leader purges a job once either bound says so;
/// `None` is no bound of that kind. A data-parallel job counts once and goes with its
/// partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Purge a job this long after it finished.
    pub max_age: Option<Duration>,
    /// Keep at most this many terminal jobs, purging the longest finished first...
    pub max_count: Option<u64>,
    /// ...but never, for the count, one that finished less than this long ago: a client that
    /// lost its connection resends a keyed submission within its call timeout, and finds
    /// the job its key names rather than a new one.
    pub min_age: Duration,
}

impl Retention {
    /// Keep everything (the table grows without bound).
    pub const FOREVER: Retention = Retention {
        max_age: None,
        max_count: None,
        min_age: RETAIN_TERMINAL_MIN_AGE_DEFAULT,
    };
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            max_age: Some(RETAIN_TERMINAL_AGE_DEFAULT),
            max_count: Some(RETAIN_TERMINAL_COUNT_DEFAULT),
            min_age: RETAIN_TERMINAL_MIN_AGE_DEFAULT,
        }
    }
}

impl Default for CoordinatorConfig {
    fn default() -> CoordinatorConfig {
        CoordinatorConfig {
            node_id: NodeId("coordinator-1".to_owned()),
            task_timeout: Duration::from_millis(600_000),
            heartbeat_interval: Duration::from_millis(2_000),
            heartbeat_timeout: Duration::from_millis(6_000),
            default_max_attempts: 3,
            retry_base: Duration::from_millis(1_000),
            retry_max: Duration::from_millis(60_000),
            max_active_jobs: 10_000,
            readoption_window: None,
            max_frame_bytes: FRAME_BYTES_MAX_DEFAULT,
            peers: Vec::new(),
            election_timeout_min: Duration::from_millis(200),
            election_timeout_max: Duration::from_millis(400),
            replication_heartbeat: Duration::from_millis(50),
            log_retained_entries: crate::limits::LOG_RETAINED_ENTRIES_MAX,
            client_address: String::new(),
            worker_address: String::new(),
            rotate_leader_after_jobs: None,
            retention: Retention::default(),
            max_waiters_per_connection: WAITERS_PER_CONNECTION_DEFAULT,
            wall_clock_at_epoch: UnixMillis::UNSTAMPED,
        }
    }
}

/// A configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} must be between 1 and {CONFIG_MILLIS_MAX} ms (got {millis} ms)")]
    DurationOutOfRange { name: &'static str, millis: u128 },
    #[error("the heartbeat interval ({interval} ms) must be shorter than the heartbeat timeout ({timeout} ms)")]
    HeartbeatIntervalNotBelowTimeout { interval: u128, timeout: u128 },
    #[error("the retry base ({base} ms) must not exceed the retry maximum ({max} ms)")]
    RetryBaseAboveMax { base: u128, max: u128 },
    #[error("max attempts must be between 1 and {ATTEMPTS_MAX} (got {0})")]
    MaxAttemptsOutOfRange(u32),
    #[error("max active jobs must be between 1 and {ACTIVE_JOBS_CEILING} (got {0})")]
    MaxActiveJobsOutOfRange(u64),
    #[error(
        "max frame bytes must be between {FRAME_BYTES_MIN} and {FRAME_BYTES_MAX_CEILING} (got {0})"
    )]
    MaxFrameBytesOutOfRange(usize),
    #[error("a group has 1 to {GROUP_MEMBERS_MAX} members (got {0})")]
    GroupSize(usize),
    #[error("member {0} is listed twice in the group (or the peers name this member itself)")]
    DuplicateMember(NodeId),
    #[error("the election timeout range must be non-empty (min {min} ms < max {max} ms)")]
    ElectionTimeoutRange { min: u128, max: u128 },
    #[error("the replication heartbeat ({heartbeat} ms) must be at most a third of the minimum election timeout ({min} ms), or followers would start elections under a live leader")]
    ReplicationHeartbeatTooSlow { heartbeat: u128, min: u128 },
    #[error("--rotate-leader-after-jobs must be at least 1")]
    RotateAfterZero,
    #[error("a retention count must be at least 1 (use no count to keep any number)")]
    RetainNone,
    #[error("waits per connection must be between 1 and {WAITERS_MAX} (got {0})")]
    WaitersPerConnection(usize),
}

impl CoordinatorConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let durations = [
            ("task timeout", self.task_timeout),
            ("heartbeat interval", self.heartbeat_interval),
            ("heartbeat timeout", self.heartbeat_timeout),
            ("retry base", self.retry_base),
            ("retry max", self.retry_max),
            ("re-adoption window", self.readoption_window()),
            ("election timeout minimum", self.election_timeout_min),
            ("election timeout maximum", self.election_timeout_max),
            ("replication heartbeat", self.replication_heartbeat),
        ];
        for (name, duration) in durations {
            let millis = duration.as_millis();
            if millis == 0 || millis > u128::from(CONFIG_MILLIS_MAX) {
                return Err(ConfigError::DurationOutOfRange { name, millis });
            }
        }
        if self.heartbeat_interval >= self.heartbeat_timeout {
            return Err(ConfigError::HeartbeatIntervalNotBelowTimeout {
                interval: self.heartbeat_interval.as_millis(),
                timeout: self.heartbeat_timeout.as_millis(),
            });
        }
        if self.retry_base > self.retry_max {
            return Err(ConfigError::RetryBaseAboveMax {
                base: self.retry_base.as_millis(),
                max: self.retry_max.as_millis(),
            });
        }
        if !(1..=ATTEMPTS_MAX).contains(&self.default_max_attempts) {
            return Err(ConfigError::MaxAttemptsOutOfRange(
                self.default_max_attempts,
            ));
        }
        if !(1..=ACTIVE_JOBS_CEILING).contains(&self.max_active_jobs) {
            return Err(ConfigError::MaxActiveJobsOutOfRange(self.max_active_jobs));
        }
        if !(FRAME_BYTES_MIN..=FRAME_BYTES_MAX_CEILING).contains(&self.max_frame_bytes) {
            return Err(ConfigError::MaxFrameBytesOutOfRange(self.max_frame_bytes));
        }
        let members = self.members();
        if members.len() > GROUP_MEMBERS_MAX {
            return Err(ConfigError::GroupSize(members.len()));
        }
        for (i, member) in members.iter().enumerate() {
            if members[..i].contains(member) {
                return Err(ConfigError::DuplicateMember(member.clone()));
            }
        }
        if self.election_timeout_min >= self.election_timeout_max {
            return Err(ConfigError::ElectionTimeoutRange {
                min: self.election_timeout_min.as_millis(),
                max: self.election_timeout_max.as_millis(),
            });
        }
        if self.replication_heartbeat.saturating_mul(3) > self.election_timeout_min {
            return Err(ConfigError::ReplicationHeartbeatTooSlow {
                heartbeat: self.replication_heartbeat.as_millis(),
                min: self.election_timeout_min.as_millis(),
            });
        }
        if self.rotate_leader_after_jobs == Some(0) {
            return Err(ConfigError::RotateAfterZero);
        }
        if self.retention.max_count == Some(0) {
            return Err(ConfigError::RetainNone);
        }
        if !(1..=WAITERS_MAX).contains(&self.max_waiters_per_connection) {
            return Err(ConfigError::WaitersPerConnection(
                self.max_waiters_per_connection,
            ));
        }
        Ok(())
    }

    /// Every member of the group, this one first.
    pub fn members(&self) -> Vec<NodeId> {
        std::iter::once(self.node_id.clone())
            .chain(self.peers.iter().cloned())
            .collect()
    }

    pub fn readoption_window(&self) -> Duration {
        self.readoption_window.unwrap_or(self.heartbeat_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_each_bad_setting_is_refused_by_name() {
        assert_eq!(CoordinatorConfig::default().validate(), Ok(()));
        let refused = |change: fn(&mut CoordinatorConfig)| {
            let mut config = CoordinatorConfig::default();
            change(&mut config);
            config.validate().expect_err("a bad setting")
        };
        assert_eq!(
            refused(|c| c.retention.max_count = Some(0)),
            ConfigError::RetainNone
        );
        assert_eq!(
            refused(|c| c.max_waiters_per_connection = 0),
            ConfigError::WaitersPerConnection(0)
        );
        assert_eq!(
            refused(|c| c.max_waiters_per_connection = WAITERS_MAX + 1),
            ConfigError::WaitersPerConnection(WAITERS_MAX + 1)
        );
        assert_eq!(
            refused(|c| c.rotate_leader_after_jobs = Some(0)),
            ConfigError::RotateAfterZero
        );
        assert!(matches!(
            refused(|c| c.heartbeat_interval = c.heartbeat_timeout),
            ConfigError::HeartbeatIntervalNotBelowTimeout { .. }
        ));
    }
}
