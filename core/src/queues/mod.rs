//! Named queues, priorities and fairness keys: which queued job a free slot runs next.
//!
//! Every job belongs to a queue (`default` unless it names one), has a priority (`0..=9`,
//! higher first) and may carry a fairness key (a tenant, say). The order has three levels:
//!
//! 1. **Across queues, by weight.** Each queue has a *pass*, replicated in the job table: every
//!    start in the queue advances it by `STRIDE / weight`, and the next start goes to the queue
//!    with the smallest pass among those with a job a free worker can run (stride scheduling).
//!    A queue that had nothing queued, or is resumed, rejoins at the smallest pass of the queues
//!    competing for starts (queued, not paused, below their limit), so idle time is not banked.
//! 2. **Across fairness keys within a queue, equally.** The jobs of one key form a *lane*; each
//!    job holds a *turn* (a tag), handed out when it is queued: one more than the last turn of
//!    its lane, or, for a lane that was empty, the smallest turn of the queue. The next start
//!    goes to the lane holding the smallest turn. A key with 100,000 queued jobs holds 100,000
//!    consecutive turns; a key that arrives later starts at the front, so it waits for about one
//!    start per other busy key, not for the backlog. Turns live in the job rows, so a table
//!    rebuilt from its rows continues exactly where the live one was.
//! 3. **Within a lane, by priority, then first in first out** — except that a job queued for
//!    at least its queue's ageing bound goes before every younger job of its lane, oldest
//!    first, so a low-priority job is served however many high-priority ones keep arriving.
//!
//! A start consumes its lane's smallest turn whichever job it starts: the job that held that
//! turn takes over the started job's turn (see [`index`]). That keeps the lane's turns the
//! turns of its queued jobs, which is what makes them derivable from rows.
//!
//! Jobs without a fairness key share one lane per queue, so without keys a queue is simply
//! priority-then-FIFO. Ordering is per task kind: a lane is `(kind, queue, key)`, so a job no
//! free worker can run never holds up the jobs behind it.

pub mod index;
pub mod rate;

use serde::{Deserialize, Serialize};

use crate::limits::{
    FAIRNESS_KEY_BYTES_MAX, PRIORITY_AGING_MILLIS_DEFAULT, PRIORITY_AGING_MILLIS_MAX,
    QUEUE_CONCURRENCY_MAX, QUEUE_MAX_ACTIVE_JOBS_MAX, QUEUE_NAME_BYTES_MAX, QUEUE_WEIGHT_MAX,
};

pub use index::{Ageing, JobQueue, Placement};
pub use rate::{KeyBucket, RateLimit};

/// The queue of a job that names none.
pub const DEFAULT_QUEUE: &str = "default";

/// The queue of a row or entry written before jobs named one.
pub fn default_queue() -> String {
    DEFAULT_QUEUE.to_owned()
}

pub fn is_default_queue(queue: &str) -> bool {
    queue == DEFAULT_QUEUE
}

/// The highest priority; `0` is the lowest and the default.
pub const PRIORITY_MAX: u8 = 9;

/// A queue's pass advances by this over its weight per start. Divisible by every weight from 1
/// to 16 (720,720 is their least common multiple); for other weights the remainder is a
/// rounding error under one part in 720,000.
pub const STRIDE: u64 = 720_720_000;

/// A queue rule that holds a queued job back from starting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum HeldBack {
    Paused,
    /// The queue runs its concurrency limit.
    Concurrency,
    /// The job's fairness key runs the queue's per-key limit.
    KeyConcurrency,
    /// The queue's rate bucket has no token.
    Rate,
    /// The rate bucket of the job's fairness key has no token.
    KeyRate,
}

impl HeldBack {
    pub const ALL: [HeldBack; 5] = [
        HeldBack::Paused,
        HeldBack::Concurrency,
        HeldBack::KeyConcurrency,
        HeldBack::Rate,
        HeldBack::KeyRate,
    ];

    /// Its name in metrics.
    pub fn label(self) -> &'static str {
        match self {
            HeldBack::Paused => "paused",
            HeldBack::Concurrency => "concurrency",
            HeldBack::KeyConcurrency => "key_concurrency",
            HeldBack::Rate => "rate",
            HeldBack::KeyRate => "key_rate",
        }
    }
}

/// What an operator sets on a queue; replicated, so every member schedules alike.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSettings {
    /// Its share of the workers against other busy queues (`1..=QUEUE_WEIGHT_MAX`).
    pub weight: u32,
    /// Nothing new starts while paused; queued jobs stay and running ones finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// A job queued at least this long goes before the younger jobs of its lane.
    pub aging_millis: u64,
    /// At most this many of its jobs run at once (`None`: no limit). The table refuses a start
    /// beyond it, whichever leader proposed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// At most this many of its jobs with one fairness key run at once (jobs without a key
    /// are not counted under it). Refused at apply like `concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_concurrency: Option<u32>,
    /// At most so many starts per period (see [`rate`]). Refused at apply, by entry stamps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// At most so many starts per period for each fairness key (jobs without a key are not
    /// counted under it): one bucket per key (see [`rate`]). Refused at apply like `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_rate: Option<RateLimit>,
    /// At most this many of its jobs unfinished (queued, waiting to retry or running) at
    /// once: a submission beyond it is refused, retryably, naming the queue. Beside the
    /// cluster's own admission limit, never above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_jobs: Option<u64>,
}

impl Default for QueueSettings {
    fn default() -> QueueSettings {
        QueueSettings {
            weight: 1,
            paused: false,
            aging_millis: PRIORITY_AGING_MILLIS_DEFAULT,
            concurrency: None,
            key_concurrency: None,
            rate: None,
            key_rate: None,
            max_active_jobs: None,
        }
    }
}

impl QueueSettings {
    /// How far one start advances the queue's pass.
    pub fn stride(&self) -> u64 {
        assert!(
            (1..=QUEUE_WEIGHT_MAX).contains(&self.weight),
            "queue weight {} outside 1..={QUEUE_WEIGHT_MAX} (checked when set)",
            self.weight
        );
        STRIDE / u64::from(self.weight)
    }
}

/// A change to a queue's settings: the fields given replace the current ones, the others stay.
/// Applied at apply time, so two changes proposed together both take effect.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueChange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aging_millis: Option<u64>,
    /// The most of its jobs that may run at once; `0` removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// The most of its jobs with one fairness key that may run at once; `0` removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_concurrency: Option<u32>,
    /// A new rate limit, with a full bucket; `starts: 0` removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// A new per-key rate limit, every key's bucket full; `starts: 0` removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_rate: Option<RateLimit>,
    /// The most of its jobs that may be unfinished at once; `0` removes the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_jobs: Option<u64>,
}

impl QueueChange {
    /// Every value within its bounds, and at least one given.
    pub fn check(&self) -> Result<(), String> {
        if *self == QueueChange::default() {
            return Err("the change names no setting".to_owned());
        }
        if let Some(weight) = self.weight {
            if !(1..=QUEUE_WEIGHT_MAX).contains(&weight) {
                return Err(format!(
                    "weight must be between 1 and {QUEUE_WEIGHT_MAX} (got {weight})"
                ));
            }
        }
        for (what, limit) in [
            ("concurrency", self.concurrency),
            ("key_concurrency", self.key_concurrency),
        ] {
            if let Some(limit) = limit.filter(|limit| *limit > QUEUE_CONCURRENCY_MAX) {
                return Err(format!(
                    "{what} must be between 1 and {QUEUE_CONCURRENCY_MAX}, or 0 for no limit (got {limit})"
                ));
            }
        }
        for rate in [self.rate, self.key_rate].into_iter().flatten() {
            if rate.starts > 0 {
                rate.check()?;
            }
        }
        if let Some(limit) = self.max_active_jobs {
            if limit > QUEUE_MAX_ACTIVE_JOBS_MAX {
                return Err(format!(
                    "max_active_jobs must be between 1 and {QUEUE_MAX_ACTIVE_JOBS_MAX}, or 0 for no limit (got {limit})"
                ));
            }
        }
        if let Some(millis) = self.aging_millis {
            if !(1..=PRIORITY_AGING_MILLIS_MAX).contains(&millis) {
                return Err(format!(
                    "aging_millis must be between 1 and {PRIORITY_AGING_MILLIS_MAX} (got {millis})"
                ));
            }
        }
        Ok(())
    }

    /// A change that pauses (`true`) or resumes (`false`) a queue and nothing else.
    pub fn pause(paused: bool) -> QueueChange {
        QueueChange {
            paused: Some(paused),
            ..QueueChange::default()
        }
    }

    /// Sets what the change names in `settings`; which rate limits it set (or removed), whose
    /// buckets then start full.
    pub fn apply_to(&self, settings: &mut QueueSettings) -> RatesReset {
        if let Some(weight) = self.weight {
            settings.weight = weight;
        }
        if let Some(paused) = self.paused {
            settings.paused = paused;
        }
        if let Some(millis) = self.aging_millis {
            settings.aging_millis = millis;
        }
        if let Some(limit) = self.concurrency {
            settings.concurrency = (limit > 0).then_some(limit);
        }
        if let Some(limit) = self.key_concurrency {
            settings.key_concurrency = (limit > 0).then_some(limit);
        }
        if let Some(limit) = self.max_active_jobs {
            settings.max_active_jobs = (limit > 0).then_some(limit);
        }
        if let Some(rate) = self.rate {
            settings.rate = (rate.starts > 0).then_some(rate);
        }
        if let Some(rate) = self.key_rate {
            settings.key_rate = (rate.starts > 0).then_some(rate);
        }
        RatesReset {
            queue: self.rate.is_some(),
            keys: self.key_rate.is_some(),
        }
    }
}

/// Which of a queue's rate limits a change set anew (or removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RatesReset {
    /// The queue's own limit: its bucket starts full.
    pub queue: bool,
    /// The per-key limit: every key's bucket starts full.
    pub keys: bool,
}

/// A queue as the job table holds and persists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    pub name: String,
    pub settings: QueueSettings,
    /// Stride scheduling's pass: where the queue stands in the weighted share of starts.
    pub pass: u64,
    /// The rate limit's bucket: its theoretical arrival time in microseconds since the epoch
    /// (see [`rate`]); `0` is a full bucket.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rate_tat_micros: u64,
    /// The clock of its per-key rate buckets, in microseconds since the epoch: the latest
    /// stamp any start of the queue carried. A key's bucket is judged at this time or the
    /// entry's stamp, whichever is later, so a bucket that has refilled by this clock can be
    /// forgotten: no later judgement can find it less than full.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub key_clock_micros: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Whether `name` may name a queue: 1 to [`QUEUE_NAME_BYTES_MAX`] bytes of ASCII letters,
/// digits and `-_.:/`, starting with a letter or digit (the rules of task names).
pub fn check_queue_name(name: &str) -> Result<(), String> {
    check_label("queue name", name, QUEUE_NAME_BYTES_MAX)
}

/// Whether `key` may be a fairness key: the same characters as a queue name, at most
/// [`FAIRNESS_KEY_BYTES_MAX`] bytes.
pub fn check_fairness_key(key: &str) -> Result<(), String> {
    check_label("fairness key", key, FAIRNESS_KEY_BYTES_MAX)
}

/// Whether `priority` is one.
pub fn check_priority(priority: u8) -> Result<(), String> {
    if priority > PRIORITY_MAX {
        return Err(format!(
            "priority must be between 0 and {PRIORITY_MAX} (got {priority})"
        ));
    }
    Ok(())
}

fn check_label(what: &str, label: &str, max: usize) -> Result<(), String> {
    let shown: String = label.chars().take(80).collect();
    if label.is_empty() {
        return Err(format!("the {what} is empty"));
    }
    if label.len() > max {
        return Err(format!("the {what} {shown:?} is longer than {max} bytes"));
    }
    if !label.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(format!(
            "the {what} {shown:?} must start with a letter or a digit"
        ));
    }
    if !label
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
    {
        return Err(format!(
            "the {what} {shown:?} may hold only ASCII letters, digits and - _ . : /"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_task_name_rules() {
        assert!(check_queue_name("emails").is_ok());
        assert!(check_queue_name("tenant-7/reports").is_ok());
        assert!(check_queue_name("").is_err());
        assert!(check_queue_name("-x").is_err());
        assert!(check_queue_name("a b").is_err());
        assert!(check_queue_name(&"q".repeat(QUEUE_NAME_BYTES_MAX + 1)).is_err());
        assert!(check_fairness_key(&"k".repeat(FAIRNESS_KEY_BYTES_MAX)).is_ok());
        assert!(check_fairness_key(&"k".repeat(FAIRNESS_KEY_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn a_change_keeps_what_it_does_not_name() {
        let mut settings = QueueSettings::default();
        let change = QueueChange {
            paused: Some(true),
            ..QueueChange::default()
        };
        assert!(change.check().is_ok());
        change.apply_to(&mut settings);
        assert!(settings.paused);
        assert_eq!(settings.weight, 1);
        assert!(QueueChange::default().check().is_err());
        let heavy = QueueChange {
            weight: Some(QUEUE_WEIGHT_MAX + 1),
            ..QueueChange::default()
        };
        assert!(heavy.check().is_err());
    }

    #[test]
    fn heavier_queues_advance_less_per_start() {
        let light = QueueSettings::default();
        let heavy = QueueSettings {
            weight: 3,
            ..QueueSettings::default()
        };
        assert_eq!(light.stride(), 3 * heavy.stride());
    }
}
