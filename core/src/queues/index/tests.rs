use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// A number in `range`, from the test's seeded generator.
fn draw(rng: &mut ChaCha8Rng, range: std::ops::Range<u64>) -> u64 {
    range.start + rng.next_u64() % (range.end - range.start)
}

fn id(n: u128) -> JobId {
    JobId(uuid::Uuid::from_u128(n))
}

/// The next job of the test queue at `now` with nothing in flight and nothing held back.
fn pick_now(queue: &JobQueue, now: UnixMillis, bound_millis: u64) -> Option<JobId> {
    let ageing = Ageing { now, bound_millis };
    queue.pick("sleep", "default", ageing, |_| 0, |_| false, |_| false)
}

fn at(key: &str, priority: u8, queued_at: u64) -> Placement<'_> {
    Placement {
        kind: "sleep",
        queue: "default",
        key,
        priority,
        queued_at: UnixMillis(queued_at),
    }
}

/// A queue fed and drained one start at a time, remembering each job's placement.
#[derive(Default)]
struct Fixture {
    queue: JobQueue,
    placed: BTreeMap<JobId, (u64, String, u8, u64)>,
    next: u64,
}

impl Fixture {
    fn push(&mut self, key: &str, priority: u8, queued_at: u64) -> JobId {
        self.next += 1;
        let job = id(u128::from(self.next));
        let p = at(key, priority, queued_at);
        let tag = self.queue.next_tag(&p);
        assert!(self.queue.insert(self.next, job, &p, tag));
        self.placed
            .insert(job, (self.next, key.to_owned(), priority, queued_at));
        job
    }

    fn next_start(&mut self, now: u64, aging: u64) -> Option<JobId> {
        let job = pick_now(&self.queue, UnixMillis(now), aging)?;
        let (seq, key, priority, queued_at) = self.placed.remove(&job).expect("placed");
        let (started, _) = self
            .queue
            .start(seq, &at(&key, priority, queued_at))
            .expect("queued");
        assert_eq!(started, job);
        self.queue.check().expect("consistent");
        Some(job)
    }
}

#[test]
fn without_keys_a_queue_is_priority_then_first_in_first_out() {
    let mut f = Fixture::default();
    let low = f.push("", 0, 0);
    let high = f.push("", 5, 0);
    let low_later = f.push("", 0, 0);
    let high_later = f.push("", 5, 0);
    let order: Vec<_> = std::iter::from_fn(|| f.next_start(10, 1_000)).collect();
    assert_eq!(order, vec![high, high_later, low, low_later]);
}

#[test]
fn a_job_that_waited_the_ageing_bound_goes_before_younger_higher_priority_ones() {
    let mut f = Fixture::default();
    let old_low = f.push("", 0, 0);
    let young_high = f.push("", 9, 900);
    // At 999 the low job has waited 999 ms of a 1,000 ms bound: priority decides.
    assert_eq!(f.next_start(999, 1_000), Some(young_high));
    let fresh_high = f.push("", 9, 1_000);
    // At 1,000 it has waited the bound and goes first.
    assert_eq!(f.next_start(1_000, 1_000), Some(old_low));
    assert_eq!(f.next_start(1_000, 1_000), Some(fresh_high));
}

#[test]
fn a_light_key_waits_for_about_one_start_per_busy_key_not_for_the_backlog() {
    let mut f = Fixture::default();
    for _ in 0..1_000 {
        f.push("heavy", 0, 0);
    }
    for _ in 0..10 {
        f.next_start(0, u64::MAX);
    }
    let light: Vec<_> = (0..10).map(|_| f.push("light", 0, 0)).collect();
    let mut starts_until_light_done = 0;
    let mut pending: BTreeSet<JobId> = light.into_iter().collect();
    while !pending.is_empty() {
        let job = f.next_start(0, u64::MAX).expect("jobs remain");
        pending.remove(&job);
        starts_until_light_done += 1;
    }
    // The two keys alternate: 10 light starts and at most 11 heavy ones.
    assert!(
        starts_until_light_done <= 21,
        "the light key's 10 jobs took {starts_until_light_done} starts"
    );
}

#[test]
fn equal_keys_that_stay_busy_share_starts_within_one() {
    let mut f = Fixture::default();
    let keys = ["a", "b", "c"];
    for n in 0..300 {
        f.push(keys[n % 3], (n % 4) as u8, 0);
    }
    let mut count: BTreeMap<String, i64> = BTreeMap::new();
    for _ in 0..240 {
        let job = f.next_start(0, u64::MAX).expect("jobs remain");
        // Job number n (from 1) was pushed under key (n - 1) % 3.
        let n = job.0.as_u128() as usize - 1;
        *count.entry(keys[n % 3].to_owned()).or_default() += 1;
        let most = count.values().max().copied().unwrap_or(0);
        let least = keys
            .iter()
            .map(|k| count.get(*k).copied().unwrap_or(0))
            .min()
            .unwrap_or(0);
        assert!(most - least <= 1, "starts per key drifted apart: {count:?}");
    }
}

#[test]
fn picking_past_assignments_in_flight_matches_starting_them() {
    // A leader that has proposed assignments not yet applied must pick what the table will
    // pick after applying them.
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..200 {
        let mut f = Fixture::default();
        for _ in 0..draw(&mut rng, 1..40) {
            let key = ["", "a", "b", "c"][draw(&mut rng, 0..4) as usize];
            let priority = draw(&mut rng, 0..3) as u8;
            f.push(key, priority, draw(&mut rng, 0..50));
        }
        let now = UnixMillis(draw(&mut rng, 0..100));
        let aging = draw(&mut rng, 1..100);
        let mut in_flight: BTreeMap<JobId, String> = BTreeMap::new();
        let mut applied = Fixture {
            queue: f.queue.clone(),
            placed: f.placed.clone(),
            next: f.next,
        };
        loop {
            let lane_count = |key: &str| in_flight.values().filter(|k| *k == key).count();
            let ahead = f.queue.pick(
                "sleep",
                "default",
                Ageing {
                    now,
                    bound_millis: aging,
                },
                lane_count,
                |_| false,
                |job| in_flight.contains_key(&job),
            );
            let after = pick_now(&applied.queue, now, aging);
            assert_eq!(ahead, after, "picked ahead of the applies differs");
            let Some(job) = after else { break };
            applied.next_start(now.0, aging);
            in_flight.insert(job, f.placed[&job].1.clone());
        }
    }
}

#[test]
fn a_rebuilt_index_continues_exactly_where_the_live_one_was() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut f = Fixture::default();
    let mut tags: BTreeMap<JobId, u64> = BTreeMap::new();
    for step in 0..2_000u64 {
        if draw(&mut rng, 0..100) < 55 {
            let key = ["", "a", "b", "c", "d"][draw(&mut rng, 0..5) as usize];
            let job = f.push(key, draw(&mut rng, 0..3) as u8, step);
            let (seq, ..) = f.placed[&job];
            let p = &f.placed[&job];
            let tag = f.queue.lanes("sleep", "default").expect("queued").lanes[&p.1].jobs[&seq].tag;
            tags.insert(job, tag);
        } else if let Some(job) = pick_now(&f.queue, UnixMillis(step), 300) {
            let (seq, key, priority, queued_at) = f.placed.remove(&job).expect("placed");
            let (_, retag) = f
                .queue
                .start(seq, &at(&key, priority, queued_at))
                .expect("queued");
            tags.remove(&job);
            if let Some(retag) = retag {
                tags.insert(retag.job_id, retag.tag);
            }
        }
        if step % 97 == 0 {
            // Rebuild from "rows": each queued job with its stored turn.
            let mut rebuilt = JobQueue::default();
            for (job, (seq, key, priority, queued_at)) in &f.placed {
                assert!(rebuilt.insert(*seq, *job, &at(key, *priority, *queued_at), tags[job]));
            }
            rebuilt.check().expect("rebuilt consistent");
            for now in [step, step + 1_000] {
                assert_eq!(
                    pick_now(&rebuilt, UnixMillis(now), 300),
                    pick_now(&f.queue, UnixMillis(now), 300)
                );
            }
            let probe = at("fresh-key", 0, step);
            assert_eq!(rebuilt.next_tag(&probe), f.queue.next_tag(&probe));
        }
    }
}

#[test]
fn a_cancel_gives_up_its_own_turn_and_empties_leave_nothing_behind() {
    let mut f = Fixture::default();
    let a = f.push("a", 0, 0);
    let b = f.push("b", 0, 0);
    let (seq, key, priority, queued_at) = f.placed.remove(&a).expect("placed");
    assert_eq!(f.queue.remove(seq, &at(&key, priority, queued_at)), Some(a));
    f.queue.check().expect("consistent");
    assert_eq!(f.next_start(0, u64::MAX), Some(b));
    assert!(f.queue.is_empty());
    assert!(!f.queue.has_kind("sleep"));
    f.queue.check().expect("consistent");
}

#[test]
fn parking_a_lane_spares_the_walk_and_changes_no_turn() {
    // Two identical queues; one parks lanes and releases them, the other never does.
    let (mut f, mut twin) = (Fixture::default(), Fixture::default());
    for key in ["a", "b", "c"] {
        for q in [&mut f, &mut twin] {
            q.push(key, 0, 0);
            q.push(key, 0, 0);
        }
    }
    f.queue.park("sleep", "default", "a", UnixMillis(500));
    f.queue.park("sleep", "default", "b", UnixMillis(300));
    f.queue.check().expect("consistent");
    // A new lane takes the smallest turn of the queue, parked lanes included.
    assert_eq!(
        f.queue.next_tag(&at("new", 0, 0)),
        twin.queue.next_tag(&at("new", 0, 0))
    );
    // Only the open lane is walked.
    let mut walked = Vec::new();
    let ageing = Ageing {
        now: UnixMillis(0),
        bound_millis: 60_000,
    };
    let picked = f.queue.pick(
        "sleep",
        "default",
        ageing,
        |_| 0,
        |key| {
            walked.push(key.to_owned());
            false
        },
        |_| false,
    );
    assert_eq!(walked, ["c"]);
    assert_eq!(picked, Some(id(5)), "key c's first job");
    // A start in a parked lane (a leader whose clock was later) keeps it parked and filed.
    for q in [&mut f, &mut twin] {
        assert_eq!(q.queue.start(1, &at("a", 0, 0)).map(|s| s.0), Some(id(1)));
        q.placed.remove(&id(1));
        q.queue.check().expect("consistent");
    }
    assert_eq!(f.queue.parked().count(), 2);
    // Time releases b first, then a; the order is as if they had never been parked.
    f.queue.release_parked(UnixMillis(300));
    assert_eq!(f.queue.parked().count(), 1);
    f.queue.release_parked(UnixMillis(500));
    f.queue.check().expect("consistent");
    let drained = |q: &mut Fixture| -> Vec<JobId> {
        std::iter::from_fn(|| q.next_start(0, 60_000)).collect()
    };
    let order = drained(&mut f);
    assert_eq!(order.len(), 5, "every job still queued starts");
    assert_eq!(order, drained(&mut twin));
}
