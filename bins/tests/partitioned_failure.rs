//! A partitioned job survives a worker killed mid-run, with real processes on loopback: one
//! coordinator, three workers of one slot each, a `prime-sum` over 1..=10^10 split three ways.
//! The worker running partition 0 is SIGKILLed while it computes; the coordinator notices the
//! dropped connection, retries that partition elsewhere, and the job still completes with the
//! exact answer, showing that partition 0 ran twice and the others once.

mod common;

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use common::{herder, start_announcing, stdout_json, temp_dir};
use serde_json::Value;

/// Primes up to 10^10: how many, and their sum (OEIS A006880 and A046731).
const PRIMES_UP_TO_1E10: u64 = 455_052_511;
const SUM_OF_PRIMES_UP_TO_1E10: &str = "2220822432581729238";

/// Processes killed when the test ends, however it ends.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn status(job: &str, client: &str) -> Value {
    stdout_json(&herder(&["status", job, "--coordinator", client, "--json"]))
}

/// Polls `status` until `done` holds, for at most `limit`.
fn poll_until(job: &str, client: &str, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let view = status(job, client);
        if done(&view) {
            return view;
        }
        assert!(
            start.elapsed() < limit,
            "gave up after {limit:?} waiting on job {job}: {view}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pieces(view: &Value) -> Vec<Value> {
    view["partitions"]["pieces"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_partitioned_prime_sum_completes_exactly_after_a_worker_is_killed_mid_run() {
    let dir = temp_dir("partitioned-failure");
    let (coordinator, addresses) = start_announcing(
        &[
            "coordinator",
            "--data-dir",
            dir.to_str().expect("utf-8 path"),
            "--worker-port",
            "127.0.0.1:0",
            "--client-port",
            "127.0.0.1:0",
            "--heartbeat-interval-millis",
            "200",
            "--heartbeat-timeout-millis",
            "1000",
            "--retry-base-millis",
            "20",
            "--retry-max-millis",
            "100",
        ],
        &["worker_addr=", "client_addr="],
    );
    let (worker_addr, client) = (addresses[0].clone(), addresses[1].clone());
    let mut processes = Processes(vec![coordinator]);
    let mut worker_index = BTreeMap::new();
    for id in ["w1", "w2", "w3"] {
        let (worker, _) = start_announcing(
            &[
                "worker",
                "--id",
                id,
                "--capacity",
                "1",
                "--coordinator",
                &worker_addr,
            ],
            &["Registered with coordinator"],
        );
        worker_index.insert(id.to_owned(), processes.0.len());
        processes.0.push(worker);
    }

    let submitted = stdout_json(&herder(&[
        "submit",
        "prime-sum",
        "--start",
        "1",
        "--end",
        "10000000000",
        "--partitions",
        "3",
        "--coordinator",
        &client,
        "--json",
    ]));
    let job = submitted["job_id"].as_str().expect("a job id").to_owned();

    // All three partitions computing, one per worker.
    let running = poll_until(&job, &client, Duration::from_secs(60), |view| {
        let pieces = pieces(view);
        pieces.len() == 3 && pieces.iter().all(|p| p["state"] == "RUNNING")
    });
    let running = pieces(&running);
    let victim = running[0]["worker"]
        .as_str()
        .expect("partition 0 has a worker")
        .to_owned();
    let mut workers: Vec<&str> = running
        .iter()
        .filter_map(|p| p["worker"].as_str())
        .collect();
    workers.sort_unstable();
    assert_eq!(workers, ["w1", "w2", "w3"], "one partition per worker");

    // SIGKILL (Child::kill) the worker computing partition 0.
    let index = worker_index[&victim];
    processes.0[index].kill().expect("kill the worker");
    processes.0[index].wait().expect("reap the worker");

    let done = stdout_json(&herder(&[
        "wait",
        &job,
        "--coordinator",
        &client,
        "--json",
        "--timeout-millis",
        "300000",
    ]));
    let view = &done;
    assert_eq!(view["state"], "COMPLETED", "{done}");
    assert_eq!(view["result"]["count"], PRIMES_UP_TO_1E10, "{done}");
    assert_eq!(view["result"]["sum"], SUM_OF_PRIMES_UP_TO_1E10, "{done}");
    let pieces = pieces(&done);
    assert_eq!(view["partitions"]["done"], 3);
    assert_eq!(pieces[0]["attempt"], 2, "partition 0 ran twice: {done}");
    assert_ne!(
        pieces[0]["worker"].as_str(),
        Some(victim.as_str()),
        "partition 0 finished on a surviving worker"
    );
    assert_eq!(pieces[1]["attempt"], 1, "partition 1 ran once");
    assert_eq!(pieces[2]["attempt"], 1, "partition 2 ran once");

    // People see the same story in `status`.
    let people = herder(&["status", &job, "--coordinator", &client]);
    let text = String::from_utf8_lossy(&people.stdout);
    println!("{text}");
    assert!(text.contains("Partitions: 3/3 done"), "{text}");
    assert!(text.contains("(ran again)"), "{text}");
    drop(processes);
    let _ = std::fs::remove_dir_all(&dir);
}
