//! Failover of a three-coordinator group, with real processes on 127.0.0.1: every coordinator,
//! worker and client is a separate `herder` process, coordinators keep their data in their own
//! dirs, and failures are real signals (SIGKILL, SIGSTOP/SIGCONT) or a deleted data dir.
//!
//! What each test checks is an outcome (who leads, in which term, what state each acknowledged
//! job ends in), never how long something took; every wait polls a condition with a deadline.

mod common;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use common::cluster::{submit_via, Group};
use serde_json::Value;

fn sha256(text: &str) -> [&str; 3] {
    ["sha256", "--text", text]
}

/// Submits `n` keyed sha256 jobs named `prefix-k` through the members not in `except`; each must
/// be acknowledged.
fn submit_batch(group: &Group, except: &[usize], prefix: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|k| {
            let name = format!("{prefix}-{k}");
            group.submit_ok(except, &sha256(&name), Some(&name))
        })
        .collect()
}

/// Waits for every job to end COMPLETED and returns their results.
fn completed_results(group: &Group, except: &[usize], jobs: &[String]) -> BTreeMap<String, Value> {
    jobs.iter()
        .map(|job| {
            let view = group.wait_terminal(except, job);
            assert_eq!(view["state"], "COMPLETED", "job {job}: {view}");
            assert!(!view["result"].is_null(), "job {job} has a result: {view}");
            (job.clone(), view["result"].clone())
        })
        .collect()
}

/// A member other than `i`.
fn other_than(i: usize) -> usize {
    (i + 1) % 3
}

/// Waits until member `i` and the leader agree on the commit index (and `i` has applied it),
/// with `i` a follower of that leader in its term; returns the leader's index and term.
fn wait_caught_up(group: &Group, i: usize) -> (usize, u64) {
    let id = group.id(i).to_owned();
    group.poll_showing(&format!("{id} to catch up with the leader"), || {
        let view = group.cluster(&[]).ok_or("no cluster view")?;
        let seen = || view.to_string();
        let leader = view["leader"].as_str().ok_or_else(seen)?.to_owned();
        let term = view["term"].as_u64().ok_or_else(seen)?;
        let members = view["members"].as_array().ok_or_else(seen)?;
        let of = |who: &str| members.iter().find(|m| m["node_id"] == who);
        let (mine, leaders) = (of(&id).ok_or_else(seen)?, of(&leader).ok_or_else(seen)?);
        let caught_up = leader != id
            && mine["role"] == "follower"
            && mine["term"].as_u64() == Some(term)
            && mine["leader"] == leader.as_str()
            && mine["commit_index"] == leaders["commit_index"]
            && mine["applied_index"] == leaders["commit_index"];
        if caught_up {
            Ok((group.index(&leader), term))
        } else {
            Err(seen())
        }
    })
}

#[test]
fn a_sigkilled_leader_is_replaced_and_its_running_job_is_readopted() {
    let mut group = Group::local("leader-kill");
    // A new leader keeps a running attempt for its worker for one heartbeat timeout after it
    // takes over. While the group has no leader the workers back off between reconnects (full
    // jitter, doubling), which on a loaded machine can outlast 500 ms; then the attempt is
    // re-run rather than re-adopted. A longer timeout keeps this test about re-adoption.
    group.set_flag("--heartbeat-timeout-millis", "3000");
    group.start_all();
    let (leader, term) = group.wait_for_leader(&[], 0);
    group.start_worker("w1", 2);
    group.start_worker("w2", 2);
    group.wait_for_worker("w1");
    group.wait_for_worker("w2");

    let long = group.submit_ok(&[], &["sleep", "--milliseconds", "5000"], Some("long"));
    let running = group.poll("the long job to start", || {
        group.status(&[], &long).filter(|v| v["state"] == "RUNNING")
    });
    assert_eq!(running["attempt"], 1, "{running}");
    let mut acked = submit_batch(&group, &[], "before", 5);

    // Keyed submissions from another thread while the leader dies: each is resent safely if
    // its answer is lost with the leader, and each acknowledged one must complete.
    let (acks_tx, acks) = mpsc::channel();
    let addrs = group.client_addrs();
    let stream = std::thread::spawn(move || {
        for k in 0..20 {
            let name = format!("during-{k}");
            if let Some(job) = submit_via(None, &addrs, &sha256(&name), Some(&name)) {
                let _ = acks_tx.send(job);
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    });
    for _ in 0..3 {
        acked.push(
            acks.recv_timeout(Duration::from_secs(30))
                .expect("stream acks"),
        );
    }

    let old_id = group.id(leader).to_owned();
    group.kill(leader);
    let (new, new_term) = group.wait_for_leader(&[leader], term);
    assert_ne!(group.id(new), old_id);
    assert!(new_term > term, "term {new_term} after {term}");
    acked.push(group.submit_ok(&[leader], &sha256("after"), Some("after")));

    stream.join().expect("the submitting thread");
    acked.extend(acks.try_iter());

    let done = group.wait_terminal(&[leader], &long);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    assert_eq!(done["attempt"], 1, "re-adopted, not re-run: {done}");
    assert_eq!(done["worker"], running["worker"], "{done}");
    group.wait_for_log(new, &["Attempt re-adopted", &long]);
    completed_results(&group, &[leader], &acked);
}

#[test]
fn a_sigkilled_follower_restarts_on_its_data_and_catches_up() {
    let mut group = Group::local("follower-kill");
    group.start_all();
    let (leader, _) = group.wait_for_leader(&[], 0);
    group.start_worker("w1", 4);
    group.wait_for_worker("w1");
    let mut acked = submit_batch(&group, &[], "before", 3);
    completed_results(&group, &[], &acked);

    let follower = other_than(leader);
    group.kill(follower);
    // Two of three still make a majority: submissions keep completing.
    let during = submit_batch(&group, &[follower], "during", 5);
    completed_results(&group, &[follower], &during);
    acked.extend(during);

    group.start(follower);
    wait_caught_up(&group, follower);
    // What it replayed is what the others hold: every job is there, asked through it alone
    // (it redirects to the leader, but only after it has answered the cluster view above).
    let through_it: Vec<usize> = (0..3).filter(|&i| i != follower).collect();
    completed_results(&group, &through_it, &acked);
}

#[test]
fn a_paused_leader_is_replaced_and_steps_down_when_it_resumes() {
    let mut group = Group::local("leader-pause");
    group.start_all();
    let (leader, term) = group.wait_for_leader(&[], 0);
    group.start_worker("w1", 2);
    group.wait_for_worker("w1");
    let mut acked = submit_batch(&group, &[], "before", 3);
    completed_results(&group, &[], &acked);

    // SIGSTOP: its sockets stay open but it says nothing, past any election timeout.
    group.pause(leader);
    let (new, new_term) = group.wait_for_leader(&[leader], term);
    assert_ne!(new, leader);
    assert!(new_term > term);
    let during = group.submit_ok(&[leader], &sha256("during-pause"), Some("during-pause"));
    completed_results(&group, &[leader], std::slice::from_ref(&during));
    acked.push(during);

    group.resume(leader);
    group.wait_follows_new_leader(leader, "follow the new leader");
    group.wait_for_log(leader, &["Stepped down"]);
    acked.push(group.submit_ok(&[], &sha256("after-resume"), Some("after-resume")));
    completed_results(&group, &[], &acked);
}

#[test]
fn a_whole_group_sigkilled_and_restarted_keeps_every_job() {
    let mut group = Group::local("full-restart");
    group.start_all();
    let (_, term) = group.wait_for_leader(&[], 0);
    group.start_worker("w1", 2);
    group.wait_for_worker("w1");
    let jobs = submit_batch(&group, &[], "done", 4);
    let results = completed_results(&group, &[], &jobs);
    let long = group.submit_ok(&[], &["sleep", "--milliseconds", "4000"], Some("long"));
    group.poll("the long job to start", || {
        group.status(&[], &long).filter(|v| v["state"] == "RUNNING")
    });

    for i in 0..3 {
        group.kill(i);
    }
    group.start_all();
    group.wait_for_leader(&[], term);

    for (job, result) in &results {
        let view = group
            .status(&[], job)
            .unwrap_or_else(|| panic!("job {job} is still known"));
        assert_eq!(view["state"], "COMPLETED", "{view}");
        assert_eq!(&view["result"], result, "job {job} kept its result");
    }
    let done = group.wait_terminal(&[], &long);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    assert_eq!(done["result"]["kind"], "slept", "{done}");
    eprintln!("the long job completed on attempt {}", done["attempt"]);
}

#[test]
fn a_member_with_a_wiped_data_dir_rejoins_and_a_later_failover_loses_nothing() {
    let mut group = Group::local("wiped-member");
    group.start_all();
    let (leader, _) = group.wait_for_leader(&[], 0);
    group.start_worker("w1", 4);
    group.wait_for_worker("w1");
    let mut jobs = submit_batch(&group, &[], "before", 3);
    completed_results(&group, &[], &jobs);

    let wiped = other_than(leader);
    group.kill(wiped);
    let while_down = submit_batch(&group, &[wiped], "while-down", 3);
    completed_results(&group, &[wiped], &while_down);
    jobs.extend(while_down);

    group.wipe(wiped);
    group.start(wiped);
    let (leader, term) = wait_caught_up(&group, wiped);
    // It started empty, so it abstains from elections until it has heard every member (and
    // caught up). Whether it has rejoined yet is not waited for: that may take until the
    // leader is gone (see below).
    group.wait_for_log(wiped, &["abstaining from elections"]);
    let results = completed_results(&group, &[], &jobs);
    let rejoined_before = group.log(wiped).contains("Rejoined the group");

    // Now the member that lost its disk is one of the two that must elect the next leader:
    // neither can be elected without the other's vote, so a new leader means it rejoined.
    group.kill(leader);
    let (_, new_term) = group.wait_for_leader(&[leader], term);
    assert!(new_term > term);
    group.wait_for_log(wiped, &["Rejoined the group"]);
    eprintln!(
        "the wiped member rejoined the elections {} the leader was killed",
        if rejoined_before { "before" } else { "after" }
    );
    for (job, result) in &results {
        let view = group
            .status(&[leader], job)
            .unwrap_or_else(|| panic!("job {job} is still known"));
        assert_eq!(view["state"], "COMPLETED", "{view}");
        assert_eq!(&view["result"], result, "job {job} kept its result");
    }
    let after = group.submit_ok(&[leader], &sha256("after"), Some("after"));
    completed_results(&group, &[leader], &[after]);
}
