//! Delayed jobs and jobs that wait for others, across a leader's SIGKILL, with real processes
//! on 127.0.0.1: a three-coordinator group, one worker, and the leader killed while the jobs
//! still wait. Read back from the jobs' own histories (stamped by whichever leader proposed
//! each entry): no delayed job started before its time, a chain ran in order, a fan-in started
//! after every parent ended, and a job after a failed one never ran.

mod common;

use common::cluster::Group;
use serde_json::Value;

/// Submits `args` (after `submit`) to the group under an idempotency key; the job's id.
fn submit(group: &Group, addrs: &str, name: &str, args: &[&str]) -> String {
    let mut all = vec!["submit"];
    all.extend_from_slice(args);
    all.extend(["--idempotency-key", name, "--json", "--coordinator", addrs]);
    let output = group
        .cli_json(&all)
        .unwrap_or_else(|| panic!("submission {name} acknowledged"));
    output["job_id"].as_str().expect("a job id").to_owned()
}

fn field(view: &Value, name: &str) -> u64 {
    view[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {view}"))
}

#[test]
fn delayed_and_dependent_jobs_keep_their_order_across_a_sigkilled_leader() {
    let mut group = Group::local("jobs-in-order");
    group.start_all();
    let (leader, term) = group.wait_for_leader(&[], 0);
    let addrs = group.client_addrs();
    let sleep = ["sleep", "--milliseconds", "200"];
    let delayed: Vec<String> = (0..4)
        .map(|k| {
            let delay = format!("{}ms", 2_000 + 500 * k);
            let args = [&sleep[..], &["--delay", &delay]].concat();
            submit(&group, &addrs, &format!("delayed-{k}"), &args)
        })
        .collect();
    let a = submit(&group, &addrs, "chain-a", &sleep);
    let b = submit(
        &group,
        &addrs,
        "chain-b",
        &[&sleep[..], &["--after", &a]].concat(),
    );
    let c = submit(
        &group,
        &addrs,
        "chain-c",
        &[&sleep[..], &["--after", &b]].concat(),
    );
    let parents: Vec<String> = (0..10)
        .map(|k| submit(&group, &addrs, &format!("parent-{k}"), &sleep))
        .collect();
    let fan_in = submit(
        &group,
        &addrs,
        "fan-in",
        &[&sleep[..], &["--after", &parents.join(",")]].concat(),
    );
    let broken = submit(
        &group,
        &addrs,
        "broken",
        &["fail", "--fail-until-attempt", "9", "--max-attempts", "1"],
    );
    let doomed = submit(
        &group,
        &addrs,
        "doomed",
        &[&sleep[..], &["--after", &broken]].concat(),
    );
    let first = group.status(&[], &delayed[0]).expect("a view");
    assert_eq!(first["state"], "SCHEDULED", "{first}");
    assert_eq!(group.status(&[], &c).expect("a view")["state"], "BLOCKED");

    // The leader dies before any worker has run anything: the next leader holds every
    // scheduled and blocked job, and their times and order, from the replicated rows.
    group.kill(leader);
    group.wait_for_leader(&[leader], term);
    group.start_worker("w1", 4);

    for job in &delayed {
        let view = group.wait_terminal(&[leader], job);
        assert_eq!(view["state"], "COMPLETED", "{view}");
        let started = field(&view["history"][0], "started_at_unix_ms");
        assert!(
            started >= field(&view, "run_at_unix_ms"),
            "started before its time: {view}"
        );
    }
    let views: Vec<Value> = [&a, &b, &c]
        .iter()
        .map(|job| group.wait_terminal(&[leader], job))
        .collect();
    for pair in views.windows(2) {
        assert_eq!(pair[1]["state"], "COMPLETED", "{}", pair[1]);
        assert!(
            field(&pair[1]["history"][0], "started_at_unix_ms")
                >= field(&pair[0], "finished_at_unix_ms"),
            "out of order: {} then {}",
            pair[0],
            pair[1]
        );
    }
    let fan_in = group.wait_terminal(&[leader], &fan_in);
    assert_eq!(fan_in["state"], "COMPLETED", "{fan_in}");
    for parent in &parents {
        let parent = group.wait_terminal(&[leader], parent);
        assert_eq!(parent["state"], "COMPLETED");
        assert!(
            field(&fan_in["history"][0], "started_at_unix_ms")
                >= field(&parent, "finished_at_unix_ms")
        );
        assert!(
            parent["result"].is_object(),
            "a parent's result is readable: {parent}"
        );
    }
    let doomed = group.wait_terminal(&[leader], &doomed);
    assert_eq!(doomed["state"], "CANCELLED", "{doomed}");
    assert!(
        doomed["history"].as_array().is_none_or(Vec::is_empty),
        "{doomed}"
    );
    assert!(
        doomed["error"]
            .as_str()
            .is_some_and(|e| e.contains(&broken)),
        "{doomed}"
    );
}
