//! `herder dev`: the embedded default — one coordinator and N workers in one process, SQLite in
//! a local folder. With `--demo` it also runs a small demonstration and exits.

use std::time::Duration;

use herder_core::client::ClientConfig;
use herder_core::ids::WorkerId;
use herder_core::job::JobState;
use herder_core::tasks::TaskSpec;
use herder_core::worker::WorkerConfig;
use herder_runtime::client::{HerderClient, SubmitOptions};
use herder_runtime::{coordinator, worker};

use crate::cli::DevArgs;
use crate::exit;
use crate::output::{job_for_people, usage_error};
use crate::verbs::{coordinator_config, parse_listen_addr, terminated};

pub async fn run(args: DevArgs) -> u8 {
    let config = coordinator_config("dev", &args.tuning);
    if let Err(error) = config.validate() {
        return usage_error(&error.to_string(), false);
    }
    let (worker_addr, client_addr) = match (
        parse_listen_addr(&args.worker_port, "127.0.0.1"),
        parse_listen_addr(&args.client_port, "127.0.0.1"),
    ) {
        (Ok(w), Ok(c)) => (w, c),
        (Err(e), _) | (_, Err(e)) => return usage_error(&e, false),
    };
    let options = coordinator::CoordinatorOptions {
        config,
        data_dir: args.data_dir.clone(),
        worker_addr,
        client_addr,
        peer_addr: None,
        peers: Default::default(),
        seed: None,
    };
    let coordinator = match coordinator::start(options).await {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("herder: {error}");
            return exit::SERVER;
        }
    };
    let worker_addr = coordinator.worker_addr();
    let client_addr = coordinator.client_addr();
    let mut workers = Vec::new();
    for n in 1..=args.workers {
        let id = match WorkerId::parse(&format!("worker-{n}")) {
            Ok(id) => id,
            Err(error) => return usage_error(&error.to_string(), false),
        };
        let options = worker::WorkerOptions {
            config: WorkerConfig::new(id, args.capacity, vec![worker_addr.to_string()]),
            max_frame_bytes: args.tuning.max_frame_bytes,
            seed: None,
        };
        match worker::start(options) {
            Ok(handle) => workers.push(handle),
            Err(error) => return usage_error(&error.to_string(), false),
        }
    }
    eprintln!(
        "Herder dev cluster: {} workers x {} slots; clients at {client_addr}, workers at {worker_addr}; data in {}",
        args.workers,
        args.capacity,
        args.data_dir.display()
    );
    let code = if args.demo {
        demo(&client_addr.to_string()).await
    } else {
        eprintln!("Try, in another terminal:  herder submit sha256 --text hello --wait --coordinator {client_addr}");
        eprintln!("Press Ctrl-C to stop.");
        terminated().await;
        exit::OK
    };
    for handle in workers {
        handle.shutdown().await;
    }
    if let Err(error) = coordinator.shutdown().await {
        eprintln!("herder: {error}");
        return exit::SERVER;
    }
    code
}

/// One job of each built-in kind, including one that fails before it succeeds and two split
/// across the workers, so the output shows scheduling, results, a retry and aggregation.
async fn demo(client_addr: &str) -> u8 {
    let client = HerderClient::new(ClientConfig::new(vec![client_addr.to_owned()]));
    let tasks = [
        TaskSpec::Sha256 {
            text: "hello, herder".into(),
        },
        TaskSpec::WordCount {
            text: "the quick brown fox jumps over the lazy dog".into(),
        },
        TaskSpec::PrimeCount { limit: 100_000 },
        TaskSpec::Sleep { milliseconds: 500 },
        TaskSpec::Fail {
            fail_until_attempt: 2,
        },
        // Data-parallel: split into one partition per worker and aggregated.
        TaskSpec::PrimeSum {
            start: 1,
            end: 100_000,
        },
        TaskSpec::Max {
            numbers: vec![2, 4, 5, 11, -3, 7],
        },
    ];
    let mut submitted = Vec::new();
    for task in &tasks {
        match client.submit(task, SubmitOptions::default()).await {
            Ok(job) => {
                println!("Submitted {:<12} -> job {}", task.kind(), job.job_id);
                submitted.push(job.job_id);
            }
            Err(error) => {
                eprintln!("herder: demo submission failed: {error}");
                return exit::SERVER;
            }
        }
    }
    println!();
    let mut all_completed = true;
    for job_id in submitted {
        match client
            .wait(job_id, Some(Duration::from_secs(60).as_millis() as u64))
            .await
        {
            Ok((job, _)) => {
                all_completed &= job.state == JobState::Completed;
                println!("{}", job_for_people(&job));
            }
            Err(error) => {
                eprintln!("herder: waiting for {job_id} failed: {error}");
                return exit::SERVER;
            }
        }
    }
    if all_completed {
        println!(
            "All demo jobs COMPLETED. Run `herder dev` (without --demo) to keep a cluster running."
        );
        exit::OK
    } else {
        exit::JOB_UNSUCCESSFUL
    }
}
