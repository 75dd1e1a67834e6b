//! A queue's concurrency and rate limits, and another's per-key rate, hold exactly across a
//! leader's SIGKILL, with real processes on 127.0.0.1: a three-coordinator group, two workers
//! with more slots than the limits allow, and the leader killed while the queues' jobs run.
//!
//! What is checked is read back from the jobs' own histories (each attempt's start and end
//! stamps, written by whichever leader proposed them): at no instant more attempts of the
//! queue running than its concurrency limit, and no run of starts faster than its rate, nor
//! of one key's starts faster than the per-key rate.

mod common;

use common::cluster::Group;
use serde_json::Value;

/// At most this many of the queue's jobs run at once.
const CONCURRENCY: usize = 2;
/// At most `RATE_STARTS` starts per `RATE_PERIOD_MILLIS`.
const RATE_STARTS: u64 = 3;
const RATE_PERIOD_MILLIS: u64 = 1_000;
const JOBS: usize = 14;
/// At most `KEY_RATE_STARTS` starts per `RATE_PERIOD_MILLIS` for each fairness key.
const KEY_RATE_STARTS: u64 = 2;
const KEYS: [&str; 2] = ["tenant-a", "tenant-b"];
const JOBS_PER_KEY: usize = 5;

/// Submits a 600 ms sleep to `queue` (with `key`, if given) under an idempotency key; its id.
fn submit(group: &Group, addrs: &str, queue: &str, key: Option<&str>, name: &str) -> String {
    let mut args = vec![
        "submit",
        "sleep",
        "--milliseconds",
        "600",
        "--queue",
        queue,
        "--idempotency-key",
        name,
        "--json",
        "--coordinator",
        addrs,
    ];
    if let Some(key) = key {
        args.extend(["--fairness-key", key]);
    }
    let output = group
        .cli_json(&args)
        .unwrap_or_else(|| panic!("submission {name} acknowledged"));
    output["job_id"].as_str().expect("a job id").to_owned()
}

/// The rate as the bucket promises it: the starts from any one on, `n` of them, spaced at the
/// steady interval, span at most the time they took plus one period.
fn assert_within_rate(mut starts: Vec<u64>, rate_starts: u64, what: &str) {
    starts.sort_unstable();
    let interval_micros = (RATE_PERIOD_MILLIS * 1000).div_ceil(rate_starts);
    for k in 0..starts.len() {
        for j in k..starts.len() {
            let n = (j - k + 1) as u64;
            let took_micros = (starts[j] - starts[k]) * 1000;
            assert!(
                n * interval_micros <= took_micros + RATE_PERIOD_MILLIS * 1000,
                "{what}: {n} starts within {} ms (rate {rate_starts} per {RATE_PERIOD_MILLIS} ms): {starts:?}",
                starts[j] - starts[k]
            );
        }
    }
    // More starts than one burst, so the rate had starts to hold back.
    assert!(starts.len() as u64 > rate_starts + 1, "{what}: {starts:?}");
}

/// Every attempt of `views`, as (started, ended) stamps in milliseconds (an attempt cut short
/// by the failover ends too, when a leader settles it).
fn attempts(views: &[Value]) -> Vec<(u64, u64)> {
    views
        .iter()
        .flat_map(|view| {
            view["history"]
                .as_array()
                .unwrap_or_else(|| panic!("a job view with a history: {view}"))
                .iter()
                .map(|attempt| {
                    let stamp = |field: &str| {
                        attempt[field]
                            .as_u64()
                            .unwrap_or_else(|| panic!("attempt {field}: {attempt}"))
                    };
                    (stamp("started_at_unix_ms"), stamp("ended_at_unix_ms"))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The most attempts running at one instant. An attempt ending at the instant another starts
/// made room for it (the start was proposed after the end applied), so ends count first.
fn most_at_once(attempts: &[(u64, u64)]) -> usize {
    let mut edges: Vec<(u64, i8)> = attempts
        .iter()
        .flat_map(|(start, end)| [(*start, 1), (*end, -1)])
        .collect();
    edges.sort();
    let (mut now, mut most) = (0i64, 0i64);
    for (_, step) in edges {
        now += i64::from(step);
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

#[test]
fn a_queues_limits_hold_across_a_sigkilled_leader() {
    let mut group = Group::local("queue-limits");
    group.start_all();
    let (leader, term) = group.wait_for_leader(&[], 0);
    let addrs = group.client_addrs();
    let rate = format!("{RATE_STARTS}/{RATE_PERIOD_MILLIS}ms");
    let concurrency = CONCURRENCY.to_string();
    let set = group
        .cli_json(&[
            "queue",
            "set",
            "limited",
            "--concurrency",
            &concurrency,
            "--rate",
            &rate,
            "--json",
            "--coordinator",
            &addrs,
        ])
        .expect("the queue's limits are set");
    assert_eq!(set["queue"]["concurrency"], CONCURRENCY, "{set}");
    assert_eq!(set["queue"]["rate"]["starts"], RATE_STARTS, "{set}");
    group.start_worker("w1", 4);
    group.start_worker("w2", 4);
    group.wait_for_worker("w1");
    group.wait_for_worker("w2");

    let jobs: Vec<String> = (0..JOBS)
        .map(|k| submit(&group, &addrs, "limited", None, &format!("limited-{k}")))
        .collect();
    let key_rate = format!("{KEY_RATE_STARTS}/{RATE_PERIOD_MILLIS}ms");
    let set = group
        .cli_json(&[
            "queue",
            "set",
            "tenants",
            "--key-rate",
            &key_rate,
            "--json",
            "--coordinator",
            &addrs,
        ])
        .expect("the per-key rate is set");
    assert_eq!(set["queue"]["key_rate"]["starts"], KEY_RATE_STARTS, "{set}");
    let keyed: Vec<(usize, String)> = (0..JOBS_PER_KEY)
        .flat_map(|n| KEYS.iter().enumerate().map(move |(k, key)| (n, k, *key)))
        .map(|(n, k, key)| {
            (
                k,
                submit(&group, &addrs, "tenants", Some(key), &format!("{key}-{n}")),
            )
        })
        .collect();
    // Kill the leader once some have finished and others run.
    group.poll("some of the queue's jobs to finish", || {
        let done = jobs
            .iter()
            .filter(|job| {
                group
                    .status(&[], job)
                    .is_some_and(|v| v["state"] == "COMPLETED")
            })
            .count();
        (done >= 3).then_some(())
    });
    group.kill(leader);
    group.wait_for_leader(&[leader], term);

    let views: Vec<Value> = jobs
        .iter()
        .map(|job| group.wait_terminal(&[leader], job))
        .collect();
    for view in &views {
        assert_eq!(view["state"], "COMPLETED", "{view}");
    }
    let limited = attempts(&views);
    assert!(limited.len() >= JOBS, "{limited:?}");
    let most = most_at_once(&limited);
    assert!(
        most <= CONCURRENCY,
        "{most} attempts of the queue ran at once (limit {CONCURRENCY}): {limited:?}"
    );
    let starts: Vec<u64> = limited.iter().map(|(start, _)| *start).collect();
    assert_within_rate(starts, RATE_STARTS, "queue limited");
    // Each key of the other queue within its own rate.
    for (k, key) in KEYS.iter().enumerate() {
        let views: Vec<Value> = keyed
            .iter()
            .filter(|(of, _)| *of == k)
            .map(|(_, job)| group.wait_terminal(&[leader], job))
            .collect();
        for view in &views {
            assert_eq!(view["state"], "COMPLETED", "{view}");
        }
        let starts: Vec<u64> = attempts(&views).iter().map(|(start, _)| *start).collect();
        assert_within_rate(starts, KEY_RATE_STARTS, key);
    }
}
