//! The fairness rule between fairness keys, judged on the model's own job states.
//!
//! A *lane* is the queued jobs of one task kind, queue and fairness key (no key is a lane too).
//! Two lanes of the same kind and queue are *backlogged together* over a stretch of the log
//! when both hold a queued job at every entry of it. Over any window of such a stretch, the
//! starts of the two differ by at most [`Fairness::bound`]: twice one more than the leases the
//! workers can hold (a leader picks from its applied table while up to that many of its
//! assignments are on their way, so its view of the lanes lags the log by at most so many
//! starts, in either direction).
//!
//! A stretch is judged only while nothing else tilts it: a lane that lost a queued job without
//! starting it (a cancel) is set aside until it empties, and so is every lane of a queue with a
//! per-key concurrency or rate limit (it holds a busy key back on purpose).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use herder_core::ids::{JobId, LogIndex};

/// Kind, queue and fairness key (`""` for none).
pub type Lane = (String, String, String);

/// Two lanes of one kind and queue backlogged together: the running difference of their
/// starts (the first's minus the second's) and its extremes since the stretch began.
#[derive(Clone, Copy, Debug, Default)]
struct Pair {
    since: LogIndex,
    difference: i64,
    lowest: i64,
    highest: i64,
}

#[derive(Clone, Debug, Default)]
pub struct Fairness {
    /// The most the starts of two lanes may differ by over a window.
    bound: i64,
    /// Lanes holding a queued job now, and whether each is set aside until it empties.
    lanes: BTreeMap<Lane, bool>,
    /// Pairs of clean lanes backlogged together, the smaller lane first.
    pairs: BTreeMap<(Lane, Lane), Pair>,
}

impl Fairness {
    /// The rule for workers that can hold `leases` leases in all.
    pub fn new(leases: u64) -> Fairness {
        Fairness {
            bound: 2 * (i64::try_from(leases).unwrap_or(i64::MAX / 4) + 1),
            ..Fairness::default()
        }
    }

    pub fn bound(&self) -> i64 {
        self.bound
    }

    /// Entry `at` applied: `before` and `after` are the queued jobs' lanes around it,
    /// `started` the jobs it started, and `key_limited` the queues with a per-key limit
    /// (concurrency or rate).
    pub fn observe(
        &mut self,
        at: LogIndex,
        before: &HashMap<JobId, Lane>,
        after: &HashMap<JobId, Lane>,
        started: &BTreeSet<JobId>,
        key_limited: &BTreeSet<String>,
    ) -> Result<(), String> {
        if self.bound == 0 {
            return Ok(()); // no workers known: nothing to judge
        }
        for job in started {
            if let Some(lane) = before.get(job) {
                self.started(at, lane)?;
            }
        }
        // A job that left its lane without starting leaves a gap in its lane's turns.
        for (job, lane) in before {
            if !after.contains_key(job) && !started.contains(job) {
                self.set_aside(lane);
            }
        }
        let now: BTreeSet<&Lane> = after.values().collect();
        let emptied: Vec<Lane> = self
            .lanes
            .keys()
            .filter(|lane| !now.contains(lane))
            .cloned()
            .collect();
        for lane in emptied {
            self.lanes.remove(&lane);
            self.pairs.retain(|(a, b), _| *a != lane && *b != lane);
        }
        for lane in now {
            if key_limited.contains(&lane.1) {
                self.set_aside(lane);
                self.lanes.insert(lane.clone(), true);
                continue;
            }
            if self.lanes.contains_key(lane) {
                continue;
            }
            for (other, aside) in &self.lanes {
                if !aside && other.0 == lane.0 && other.1 == lane.1 {
                    let key = ordered(lane, other);
                    self.pairs.insert(
                        key,
                        Pair {
                            since: at,
                            ..Pair::default()
                        },
                    );
                }
            }
            self.lanes.insert(lane.clone(), false);
        }
        Ok(())
    }

    /// A job of `lane` started at `at`: every pair it is in moves, and must stay in bounds.
    fn started(&mut self, at: LogIndex, lane: &Lane) -> Result<(), String> {
        for ((first, second), pair) in self.pairs.iter_mut() {
            let step = if first == lane {
                1
            } else if second == lane {
                -1
            } else {
                continue;
            };
            pair.difference += step;
            pair.lowest = pair.lowest.min(pair.difference);
            pair.highest = pair.highest.max(pair.difference);
            if pair.highest - pair.lowest > self.bound {
                return Err(format!(
                    "fairness: at entry {at}, keys {:?} and {:?} of queue {:?} and kind {:?}, both with jobs queued since entry {}: over a window of that stretch one started {} more than the other (bound {})",
                    first.2,
                    second.2,
                    first.1,
                    first.0,
                    pair.since,
                    pair.highest - pair.lowest,
                    self.bound
                ));
            }
        }
        Ok(())
    }

    fn set_aside(&mut self, lane: &Lane) {
        if let Some(aside) = self.lanes.get_mut(lane) {
            *aside = true;
        }
        self.pairs.retain(|(a, b), _| a != lane && b != lane);
    }
}

fn ordered(a: &Lane, b: &Lane) -> (Lane, Lane) {
    if a <= b {
        (a.clone(), b.clone())
    } else {
        (b.clone(), a.clone())
    }
}
