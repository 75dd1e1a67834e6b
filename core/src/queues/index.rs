//! The index of `QUEUED` jobs: first in first out over everything (for listing), and the
//! scheduling order of [`super`] — per task kind, per queue, one lane per fairness key, lanes by
//! the smallest turn they hold, jobs within a lane by priority then position.
//!
//! Picking the next job of a `(kind, queue)` costs a logarithm of the jobs and lanes there plus
//! the assignments the leader has in flight in it (it skips those); it never walks the lanes.
//!
//! A lane whose key has no rate token until some time is *parked* until then: out of the turn
//! order a pick walks, so keys waiting for their rate cost a pick nothing, however many there
//! are. Parking changes no turn and no replicated state; it only spares the walk. A parked
//! lane rejoins when its time comes (the table releases lanes at each entry's stamp, the
//! leader at its clock before it schedules), when its key's bucket is forgotten, or when its
//! queue's per-key rate is set anew.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::ids::JobId;
use crate::time::UnixMillis;

/// What the place of one queued job depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement<'a> {
    pub kind: &'a str,
    pub queue: &'a str,
    /// The fairness key; `""` for the jobs without one, which share one lane.
    pub key: &'a str,
    pub priority: u8,
    /// The wall-time stamp of the entry that queued it, for ageing.
    pub queued_at: UnixMillis,
}

/// When a pick happens, and its queue's ageing bound: a job queued at least `bound_millis`
/// before `now` goes before the younger jobs of its lane.
#[derive(Clone, Copy, Debug)]
pub struct Ageing {
    pub now: UnixMillis,
    pub bound_millis: u64,
}

/// A turn: its tag, then the queue position of the job holding it (rows written before turns
/// existed all hold tag 0, so the position is what keeps turns distinct).
type Turn = (u64, u64);

/// A job started out of turn order: the job that held its lane's smallest turn now holds
/// `tag` instead, and its row must say so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retag {
    pub job_id: JobId,
    pub tag: u64,
}

#[derive(Clone, Debug, Default)]
pub struct JobQueue {
    all: BTreeMap<u64, JobId>,
    kinds: BTreeMap<String, KindQueues>,
    /// How many jobs each queue with a queued job holds (every kind).
    depths: BTreeMap<String, usize>,
    /// Every parked lane, by when it rejoins.
    parked: BTreeSet<ParkedLane>,
}

/// A parked lane as the time index files it: `(until, kind, queue, key)`.
type ParkedLane = (UnixMillis, Arc<str>, Arc<str>, Arc<str>);

/// The queues with a queued job of one kind.
#[derive(Clone, Debug, Default)]
struct KindQueues {
    queues: BTreeMap<String, Lanes>,
}

/// The lanes of one `(kind, queue)`.
#[derive(Clone, Debug, Default)]
struct Lanes {
    /// Each lane not parked under the tag of the smallest turn it holds (ties by key: a
    /// lane's place must not depend on which of its jobs holds the turn, which a start may
    /// change). (The key is shared with its lane, so moving a lane allocates nothing.)
    by_turn: BTreeSet<(u64, Arc<str>)>,
    /// The parked lanes, filed the same way: a new lane's first turn counts them too.
    parked: BTreeSet<(u64, Arc<str>)>,
    lanes: BTreeMap<String, Lane>,
    jobs: usize,
}

/// The queued jobs of one `(kind, queue, fairness key)`.
#[derive(Clone, Debug)]
struct Lane {
    key: Arc<str>,
    /// By queue position: first in, first out (ageing looks at the front).
    jobs: BTreeMap<u64, Queued>,
    /// Highest priority first, then by position.
    ranked: BTreeSet<(Reverse<u8>, u64)>,
    /// The turns its jobs hold.
    turns: BTreeSet<Turn>,
    /// Parked until this time (see the module doc), if it is.
    parked_until: Option<UnixMillis>,
}

#[derive(Clone, Copy, Debug)]
struct Queued {
    job_id: JobId,
    priority: u8,
    tag: u64,
    queued_at: UnixMillis,
}

impl Lane {
    fn first_turn(&self) -> Turn {
        *self
            .turns
            .first()
            .unwrap_or_else(|| panic!("an empty lane is kept"))
    }

    /// Where the lane stands among its queue's lanes: its smallest tag.
    fn place(&self) -> u64 {
        self.first_turn().0
    }
}

impl Lanes {
    /// The set a lane is filed in: the turn order, or the parked lanes.
    fn filed_in(&mut self, parked: bool) -> &mut BTreeSet<(u64, Arc<str>)> {
        if parked {
            &mut self.parked
        } else {
            &mut self.by_turn
        }
    }

    /// The smallest turn any lane holds, parked or not.
    fn first_tag(&self) -> Option<u64> {
        let open = self.by_turn.first().map(|(tag, _)| *tag);
        let parked = self.parked.first().map(|(tag, _)| *tag);
        match (open, parked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl JobQueue {
    /// The tag a job queued now at `p` would hold: one past its lane's last turn, or the
    /// smallest turn of its queue if its lane is empty (0 in an empty queue).
    pub fn next_tag(&self, p: &Placement<'_>) -> u64 {
        let Some(lanes) = self.lanes(p.kind, p.queue) else {
            return 0;
        };
        match lanes.lanes.get(p.key) {
            Some(lane) => lane
                .turns
                .last()
                .map_or(0, |(tag, _)| tag.saturating_add(1)),
            None => lanes.first_tag().unwrap_or(0),
        }
    }

    /// Queues `job_id` at position `seq`, placed by `p`, holding turn `tag`; `false` (and no
    /// change) if `seq` is taken.
    pub fn insert(&mut self, seq: u64, job_id: JobId, p: &Placement<'_>, tag: u64) -> bool {
        if self.all.contains_key(&seq) {
            return false;
        }
        self.all.insert(seq, job_id);
        match self.depths.get_mut(p.queue) {
            Some(depth) => *depth += 1,
            None => {
                self.depths.insert(p.queue.to_owned(), 1);
            }
        }
        // Look names up before allocating them: almost every insert finds them.
        if !self.kinds.contains_key(p.kind) {
            self.kinds.insert(p.kind.to_owned(), KindQueues::default());
        }
        let of_kind = self.kinds.get_mut(p.kind).expect("inserted above");
        if !of_kind.queues.contains_key(p.queue) {
            of_kind.queues.insert(p.queue.to_owned(), Lanes::default());
        }
        let lanes = of_kind.queues.get_mut(p.queue).expect("inserted above");
        if !lanes.lanes.contains_key(p.key) {
            let lane = Lane {
                key: Arc::from(p.key),
                jobs: BTreeMap::new(),
                ranked: BTreeSet::new(),
                turns: BTreeSet::new(),
                parked_until: None,
            };
            lanes.lanes.insert(p.key.to_owned(), lane);
        }
        let lane = lanes.lanes.get_mut(p.key).expect("inserted above");
        let before = lane.turns.first().map(|turn| turn.0);
        lane.jobs.insert(
            seq,
            Queued {
                job_id,
                priority: p.priority,
                tag,
                queued_at: p.queued_at,
            },
        );
        lane.ranked.insert((Reverse(p.priority), seq));
        lane.turns.insert((tag, seq));
        let after = lane.place();
        lanes.jobs += 1;
        if before != Some(after) {
            let (key, parked) = (lane.key.clone(), lane.parked_until.is_some());
            let filed = lanes.filed_in(parked);
            if let Some(before) = before {
                filed.remove(&(before, key.clone()));
            }
            filed.insert((after, key));
        }
        true
    }

    /// Takes the job at `seq` out of the queue without starting it (a cancel); it gives its own
    /// turn up. The job that was there, if any.
    pub fn remove(&mut self, seq: u64, p: &Placement<'_>) -> Option<JobId> {
        let (job, _) = self.take(seq, p, false)?;
        Some(job)
    }

    /// Takes the job at `seq` out of the queue to start it: it consumes its lane's smallest
    /// turn. The job, and the retag of the job that held that turn if it was another.
    pub fn start(&mut self, seq: u64, p: &Placement<'_>) -> Option<(JobId, Option<Retag>)> {
        self.take(seq, p, true)
    }

    fn take(&mut self, seq: u64, p: &Placement<'_>, start: bool) -> Option<(JobId, Option<Retag>)> {
        let job_id = *self.all.get(&seq)?;
        let of_kind = self
            .kinds
            .get_mut(p.kind)
            .unwrap_or_else(|| misfiled(seq, p));
        let lanes = of_kind
            .queues
            .get_mut(p.queue)
            .unwrap_or_else(|| misfiled(seq, p));
        let lane = lanes
            .lanes
            .get_mut(p.key)
            .unwrap_or_else(|| misfiled(seq, p));
        let first = lane.first_turn();
        let job = lane.jobs.remove(&seq).unwrap_or_else(|| misfiled(seq, p));
        assert_eq!(
            job.job_id, job_id,
            "queue position {seq} filed for two jobs"
        );
        assert!(lane.ranked.remove(&(Reverse(job.priority), seq)));
        assert!(lane.turns.remove(&(job.tag, seq)));
        let mut retag = None;
        if start && first.1 != seq {
            // The start consumes the smallest turn: its holder takes the started job's turn.
            assert!(lane.turns.remove(&first));
            lane.turns.insert((job.tag, first.1));
            let holder = lane
                .jobs
                .get_mut(&first.1)
                .unwrap_or_else(|| panic!("turn {first:?} is held by no queued job"));
            holder.tag = job.tag;
            retag = Some(Retag {
                job_id: holder.job_id,
                tag: job.tag,
            });
        }
        let after = lane.turns.first().map(|turn| turn.0);
        let emptied = lane.jobs.is_empty();
        let (key, parked_until) = (lane.key.clone(), lane.parked_until);
        lanes.jobs -= 1;
        if after != Some(first.0) {
            let filed = lanes.filed_in(parked_until.is_some());
            assert!(filed.remove(&(first.0, key.clone())));
            if let Some(after) = after {
                filed.insert((after, key.clone()));
            }
        }
        if emptied {
            lanes.lanes.remove(p.key);
            if let Some(until) = parked_until {
                let filed = (until, Arc::from(p.kind), Arc::from(p.queue), key);
                assert!(self.parked.remove(&filed), "parked lane {p:?} not filed");
            }
        }
        if lanes.jobs == 0 {
            of_kind.queues.remove(p.queue);
            if of_kind.queues.is_empty() {
                self.kinds.remove(p.kind);
            }
        }
        self.all.remove(&seq);
        let depth = self
            .depths
            .get_mut(p.queue)
            .unwrap_or_else(|| misfiled(seq, p));
        *depth -= 1;
        if *depth == 0 {
            self.depths.remove(p.queue);
        }
        Some((job_id, retag))
    }

    /// True if `job_id` is queued at `seq`, placed by `p`, holding turn `tag`.
    pub fn holds(&self, seq: u64, job_id: JobId, p: &Placement<'_>, tag: u64) -> bool {
        self.all.get(&seq) == Some(&job_id)
            && self
                .lanes(p.kind, p.queue)
                .and_then(|lanes| lanes.lanes.get(p.key))
                .and_then(|lane| lane.jobs.get(&seq))
                .is_some_and(|q| {
                    q.job_id == job_id
                        && q.priority == p.priority
                        && q.tag == tag
                        && q.queued_at == p.queued_at
                })
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

    /// The kinds with at least one queued job.
    pub fn kinds(&self) -> impl Iterator<Item = &str> + '_ {
        self.kinds.keys().map(String::as_str)
    }

    pub fn has_kind(&self, kind: &str) -> bool {
        self.kinds.contains_key(kind)
    }

    /// The queues with a queued job of `kind`.
    pub fn queues_of<'a>(&'a self, kind: &str) -> impl Iterator<Item = &'a str> + 'a {
        self.kinds
            .get(kind)
            .into_iter()
            .flat_map(|of_kind| of_kind.queues.keys().map(String::as_str))
    }

    /// How many jobs are queued in `queue` (every kind).
    pub fn depth(&self, queue: &str) -> usize {
        self.depths.get(queue).copied().unwrap_or(0)
    }

    /// The queues holding a queued job.
    pub fn busy_queues(&self) -> impl Iterator<Item = &str> + '_ {
        self.depths.keys().map(String::as_str)
    }

    /// When the longest-waiting job of `queue` was queued (a walk of its lanes: for reports,
    /// not for scheduling).
    pub fn oldest_in(&self, queue: &str) -> Option<UnixMillis> {
        self.kinds
            .values()
            .filter_map(|of_kind| of_kind.queues.get(queue))
            .flat_map(|lanes| lanes.lanes.values())
            .filter_map(|lane| lane.jobs.values().next().map(|q| q.queued_at))
            .min()
    }

    /// The next job to start in `(kind, queue)` at `ageing.now`, passing over the jobs `in_flight`
    /// says already have an assignment on the way: the lane holding the smallest turn once
    /// each lane's assignments in flight (`lane_in_flight`) have consumed theirs, among the
    /// lanes `lane_held` does not hold back (a key at its limit), and in it the oldest job if
    /// it has waited `ageing.bound_millis`, else the highest priority, oldest first.
    ///
    /// Lanes held back are walked past. A key held back by its concurrency limit runs jobs, so
    /// those lanes are at most the attempts running; a key out of rate tokens is parked by the
    /// table and not walked at all, except for the keys whose starts are still on their way
    /// (the leader's in flight), and a key the table has not yet seen run out.
    pub fn pick(
        &self,
        kind: &str,
        queue: &str,
        ageing: Ageing,
        lane_in_flight: impl Fn(&str) -> usize,
        mut lane_held: impl FnMut(&str) -> bool,
        in_flight: impl Fn(JobId) -> bool,
    ) -> Option<JobId> {
        let lanes = self.lanes(kind, queue)?;
        let mut best: Option<(u64, &str)> = None;
        for (tag, key) in &lanes.by_turn {
            if lane_held(key) {
                continue;
            }
            let lane = &lanes.lanes[key.as_ref()];
            let consumed = lane_in_flight(key);
            let turn = if consumed == 0 {
                *tag
            } else {
                match lane.turns.iter().nth(consumed) {
                    Some((tag, _)) => *tag,
                    None => continue, // every job of the lane is on its way to a worker
                }
            };
            if best.is_none_or(|best| (turn, key.as_ref()) < best) {
                best = Some((turn, key));
            }
            if consumed == 0 {
                // Every later lane's smallest turn is at least this one's.
                break;
            }
        }
        let lane = &lanes.lanes[best?.1];
        let waiting = |(_, q): &(&u64, &Queued)| !in_flight(q.job_id);
        let oldest = lane.jobs.iter().find(waiting)?.1;
        if ageing.now.0.saturating_sub(oldest.queued_at.0) >= ageing.bound_millis {
            return Some(oldest.job_id);
        }
        // One priority in the whole lane (the usual case): the order by rank is the order by
        // position, whose first waiting job was just found.
        let highest = lane.ranked.first().map(|(Reverse(p), _)| *p);
        let lowest = lane.ranked.last().map(|(Reverse(p), _)| *p);
        if highest == lowest {
            return Some(oldest.job_id);
        }
        lane.ranked
            .iter()
            .map(|(_, seq)| lane.jobs[seq].job_id)
            .find(|job_id| !in_flight(*job_id))
    }

    fn lanes(&self, kind: &str, queue: &str) -> Option<&Lanes> {
        self.kinds.get(kind)?.queues.get(queue)
    }

    /// Parks the lane `(kind, queue, key)` until `until` (or moves its time there): a pick
    /// passes over it without walking it. Nothing if the lane holds no job.
    pub fn park(&mut self, kind: &str, queue: &str, key: &str, until: UnixMillis) {
        let Some(lanes) = self
            .kinds
            .get_mut(kind)
            .and_then(|of_kind| of_kind.queues.get_mut(queue))
        else {
            return;
        };
        let Some(lane) = lanes.lanes.get_mut(key) else {
            return;
        };
        let (place, key) = (lane.place(), lane.key.clone());
        let (kind, queue): (Arc<str>, Arc<str>) = (Arc::from(kind), Arc::from(queue));
        match lane.parked_until.replace(until) {
            Some(earlier) => {
                let filed = (earlier, kind.clone(), queue.clone(), key.clone());
                assert!(self.parked.remove(&filed), "parked lane not filed by time");
            }
            None => {
                assert!(lanes.by_turn.remove(&(place, key.clone())));
                lanes.parked.insert((place, key.clone()));
            }
        }
        self.parked.insert((until, kind, queue, key));
    }

    /// Parks the lanes of `key` in `queue` (every kind) until `until`.
    pub fn park_key(&mut self, queue: &str, key: &str, until: UnixMillis) {
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .filter(|(_, of_kind)| {
                of_kind
                    .queues
                    .get(queue)
                    .is_some_and(|l| l.lanes.contains_key(key))
            })
            .map(|(kind, _)| kind.clone())
            .collect();
        for kind in kinds {
            self.park(&kind, queue, key, until);
        }
    }

    /// Returns every lane parked until `now` or earlier to the turn order.
    pub fn release_parked(&mut self, now: UnixMillis) {
        while self.parked.first().is_some_and(|(until, ..)| *until <= now) {
            let Some((_, kind, queue, key)) = self.parked.pop_first() else {
                break;
            };
            self.rejoin(&kind, &queue, &key);
        }
    }

    /// Returns the lanes of `key` in `queue` (every kind) to the turn order.
    pub fn release_key(&mut self, queue: &str, key: &str) {
        let mut parked: Vec<(UnixMillis, Arc<str>, Arc<str>)> = Vec::new();
        for (kind, of_kind) in &self.kinds {
            let lane = of_kind.queues.get(queue).and_then(|l| l.lanes.get(key));
            if let Some((until, lane)) = lane.and_then(|l| Some((l.parked_until?, l))) {
                parked.push((until, Arc::from(kind.as_str()), lane.key.clone()));
            }
        }
        let queue: Arc<str> = Arc::from(queue);
        for (until, kind, key) in parked {
            assert!(self
                .parked
                .remove(&(until, kind.clone(), queue.clone(), key.clone())));
            self.rejoin(&kind, &queue, &key);
        }
    }

    /// Returns every parked lane of `queue` to the turn order.
    pub fn release_queue(&mut self, queue: &str) {
        let held: Vec<_> = self
            .parked
            .iter()
            .filter(|(_, _, q, _)| **q == *queue)
            .cloned()
            .collect();
        for filed in held {
            self.parked.remove(&filed);
            let (_, kind, queue, key) = filed;
            self.rejoin(&kind, &queue, &key);
        }
    }

    /// A parked lane, already taken out of the time index, rejoins the turn order.
    fn rejoin(&mut self, kind: &str, queue: &str, key: &str) {
        let lanes = self
            .kinds
            .get_mut(kind)
            .and_then(|of_kind| of_kind.queues.get_mut(queue))
            .unwrap_or_else(|| panic!("parked lane {kind:?}/{queue:?}/{key:?} has no queue"));
        let lane = lanes
            .lanes
            .get_mut(key)
            .unwrap_or_else(|| panic!("parked lane {kind:?}/{queue:?}/{key:?} is gone"));
        assert!(lane.parked_until.take().is_some(), "rejoined an open lane");
        let filed = (lane.place(), lane.key.clone());
        assert!(lanes.parked.remove(&filed));
        lanes.by_turn.insert(filed);
    }

    /// Whether a lane of `(kind, queue)` is parked.
    pub fn has_parked(&self, kind: &str, queue: &str) -> bool {
        self.lanes(kind, queue)
            .is_some_and(|lanes| !lanes.parked.is_empty())
    }

    /// Every parked lane: `(until, kind, queue, key)`.
    pub fn parked(&self) -> impl Iterator<Item = (UnixMillis, &str, &str, &str)> + '_ {
        self.parked
            .iter()
            .map(|(until, kind, queue, key)| (*until, &**kind, &**queue, &**key))
    }

    /// The indexes agree: every job filed once, in the lane it names, with its turn and rank,
    /// and every lane under its smallest turn, in the turn order or, parked, by time.
    pub fn check(&self) -> Result<(), String> {
        let mut filed = 0;
        let mut parked = 0;
        for (kind, of_kind) in &self.kinds {
            if of_kind.queues.is_empty() {
                return Err(format!("an empty kind {kind:?} is kept"));
            }
            for (queue, lanes) in &of_kind.queues {
                let mut jobs = 0;
                if lanes.by_turn.len() + lanes.parked.len() != lanes.lanes.len() {
                    return Err(format!(
                        "{kind:?}/{queue:?}: {} lanes but {} filed by turn and {} parked",
                        lanes.lanes.len(),
                        lanes.by_turn.len(),
                        lanes.parked.len()
                    ));
                }
                for (key, lane) in &lanes.lanes {
                    check_lane(lane)
                        .map_err(|e| format!("lane {kind:?}/{queue:?}/{key:?}: {e}"))?;
                    let place = (lane.place(), lane.key.clone());
                    let filed_right = match lane.parked_until {
                        Some(until) => {
                            parked += 1;
                            lanes.parked.contains(&place)
                                && self.parked.contains(&(
                                    until,
                                    Arc::from(kind.as_str()),
                                    Arc::from(queue.as_str()),
                                    lane.key.clone(),
                                ))
                        }
                        None => lanes.by_turn.contains(&place),
                    };
                    if !filed_right || *lane.key != **key {
                        return Err(format!(
                            "lane {kind:?}/{queue:?}/{key:?} is not filed under its first turn"
                        ));
                    }
                    for (seq, q) in &lane.jobs {
                        if self.all.get(seq) != Some(&q.job_id) {
                            return Err(format!(
                                "job {} is filed at {seq}, which the queue does not hold",
                                q.job_id
                            ));
                        }
                    }
                    jobs += lane.jobs.len();
                }
                if jobs != lanes.jobs || jobs == 0 {
                    return Err(format!(
                        "{kind:?}/{queue:?} counts {} jobs and holds {jobs}",
                        lanes.jobs
                    ));
                }
                filed += jobs;
            }
        }
        let deep: usize = self.depths.values().sum();
        if deep != self.all.len() || self.depths.values().any(|d| *d == 0) {
            return Err(format!(
                "the queue holds {} jobs but the depths of its queues add up to {deep}",
                self.all.len()
            ));
        }
        if filed != self.all.len() {
            return Err(format!(
                "the queue holds {} jobs but {filed} are filed in lanes",
                self.all.len()
            ));
        }
        if parked != self.parked.len() {
            return Err(format!(
                "{parked} lanes are parked but {} are filed by time",
                self.parked.len()
            ));
        }
        Ok(())
    }
}

fn misfiled<T>(seq: u64, p: &Placement<'_>) -> T {
    panic!("queue position {seq} is not filed under {p:?}")
}

fn check_lane(lane: &Lane) -> Result<(), String> {
    if lane.jobs.is_empty() {
        return Err("it is empty and kept".to_owned());
    }
    if lane.ranked.len() != lane.jobs.len() || lane.turns.len() != lane.jobs.len() {
        return Err(format!(
            "{} jobs, {} ranked, {} turns",
            lane.jobs.len(),
            lane.ranked.len(),
            lane.turns.len()
        ));
    }
    for (seq, q) in &lane.jobs {
        if !lane.ranked.contains(&(Reverse(q.priority), *seq))
            || !lane.turns.contains(&(q.tag, *seq))
        {
            return Err(format!(
                "job {} at {seq} is not ranked or holds no turn",
                q.job_id
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
