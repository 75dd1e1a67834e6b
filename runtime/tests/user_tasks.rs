//! Users' own tasks end to end: the example worker program (`examples/greeter_worker.rs`), run
//! as a separate process against a real coordinator, serves typed async and blocking handlers
//! next to the built-in kinds; a permanent error fails its job at once; a job no worker serves
//! waits, visibly; SIGTERM drains the worker, and the attempt it hands back runs elsewhere
//! without costing the job an attempt.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use herder_core::job::JobState;
use herder_core::tasks::TaskOutput;
use herder_runtime::{SubmitOptions, TaskContext, TaskError, Worker};
use serde_json::json;

/// The example program, built next to this test by `cargo test`.
fn example_program() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test knows its own path");
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("tests live in <target>/<profile>/deps");
    let program = profile_dir.join("examples").join("greeter_worker");
    let built = std::fs::metadata(&program)
        .and_then(|meta| meta.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {REBUILD}", program.display()));
    // `cargo test --test user_tasks` alone does not rebuild examples: refuse a stale one
    // rather than test old code.
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for dir in ["src", "examples"] {
        for entry in std::fs::read_dir(crate_dir.join(dir)).expect("the crate's sources") {
            let path = entry.expect("a directory entry").path();
            let changed = std::fs::metadata(&path).and_then(|meta| meta.modified());
            if changed.is_ok_and(|changed| changed > built) {
                panic!(
                    "{} is older than {}: {REBUILD}",
                    program.display(),
                    path.display()
                );
            }
        }
    }
    program
}

const REBUILD: &str = "run the tests with `cargo test` (which builds examples), or `cargo build -p herder-runtime --example greeter_worker` first";

/// The example worker as a child process; killed if the test ends early.
struct ExampleWorker(Child);

impl ExampleWorker {
    fn start(worker_addr: std::net::SocketAddr, id: &str, drain_millis: u64) -> ExampleWorker {
        let child = Command::new(example_program())
            .arg(worker_addr.to_string())
            .arg(id)
            .env("HERDER_DRAIN_TIMEOUT_MILLIS", drain_millis.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("the example worker starts");
        ExampleWorker(child)
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits (bounded) for the process to exit by itself; its exit status.
    async fn exited(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.0.try_wait().expect("the child can be polled") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the example worker did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ExampleWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn with_attempts(n: u32) -> SubmitOptions {
    SubmitOptions {
        max_attempts: Some(n),
        ..SubmitOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_worker_serves_its_own_tasks_and_the_built_in_ones() {
    let dir = TestDir::new("user-tasks");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let _worker = ExampleWorker::start(coordinator.worker_addr(), "greeter-1", 1_000);
    let workers = wait_alive(&client, &["greeter-1"]).await;
    let served = &workers[0].tasks;
    for kind in ["greet", "count-down", "sha256", "sleep"] {
        assert!(served.iter().any(|t| t == kind), "{kind} not in {served:?}");
    }

    let hello = client
        .submit_task(
            "greet",
            &json!({"name": "Ada", "shout": true}),
            with_attempts(3),
        )
        .await
        .expect("submitted");
    let job = wait_terminal(&client, hello.job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(
        job.result,
        Some(TaskOutput::Value {
            value: json!({"text": "HELLO, ADA!"})
        })
    );

    // A permanent error, and a payload the handler cannot read, fail at once.
    for payload in [json!({"name": "  "}), json!({"nom": "Ada"})] {
        let bad = client
            .submit_task("greet", &payload, with_attempts(3))
            .await
            .expect("submitted");
        let job = wait_terminal(&client, bad.job_id).await;
        assert_eq!((job.state, job.attempt), (JobState::Failed, 1), "{job:?}");
        let error = job.error.unwrap_or_default();
        assert!(error.contains("permanently"), "{error}");
    }

    // Built-in kinds are ordinary handlers, registered by default.
    let sha = submit(
        &client,
        herder_core::tasks::TaskSpec::Sha256 { text: "abc".into() },
    )
    .await;
    let job = wait_terminal(&client, sha).await;
    assert_eq!(
        job.result,
        Some(TaskOutput::Sha256 {
            hex: sha256_hex("abc")
        })
    );

    // Nobody serves `resize`: the job waits, and says why.
    let orphan = client
        .submit_task("resize", &json!({"width": 10}), with_attempts(3))
        .await
        .expect("submitted");
    let job = status(&client, orphan.job_id).await;
    assert_eq!(
        (job.state, job.unserved),
        (JobState::Queued, true),
        "{job:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_example_worker_and_its_attempt_runs_elsewhere_uncharged() {
    let dir = TestDir::new("user-tasks-drain");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut example = ExampleWorker::start(coordinator.worker_addr(), "greeter-1", 200);
    wait_alive(&client, &["greeter-1"]).await;

    // One attempt only: were the drain to charge it, the job would fail.
    let long = client
        .submit_task("count-down", &json!({"millis": 600_000}), with_attempts(1))
        .await
        .expect("submitted");
    wait_running(&client, long.job_id, Some("greeter-1")).await;
    // The handler's progress notes reach the job's view while it runs.
    let reported = wait_job(&client, long.job_id, "a progress note", |job| {
        job.progress
            .as_deref()
            .is_some_and(|note| note.ends_with("of 600000 ms"))
    })
    .await;
    assert_eq!(reported.state, JobState::Running);
    example.terminate();
    let status_code = example.exited(SHORT).await;
    assert!(
        status_code.success(),
        "the drained worker exited with {status_code}"
    );
    let job = status(&client, long.job_id).await;
    assert_eq!((job.state, job.attempt), (JobState::Queued, 0), "{job:?}");
    let drained = wait_workers(&client, "greeter-1 shown draining", |workers| {
        workers
            .iter()
            .any(|w| w.id.as_str() == "greeter-1" && w.draining)
    })
    .await;
    assert!(!drained.is_empty());

    // Another worker serving the task picks it up, on its first attempt.
    let quick = Worker::builder()
        .id("quick-1")
        .coordinators([coordinator.worker_addr().to_string()])
        .capacity(1)
        .without_builtin_tasks()
        .task(
            "count-down",
            |payload: serde_json::Value, ctx: TaskContext| async move {
                assert_eq!(ctx.attempt, 1);
                Ok::<_, TaskError>(payload["millis"].clone())
            },
        )
        .start()
        .expect("the builder starts a worker");
    let job = wait_terminal(&client, long.job_id).await;
    assert_eq!(
        (job.state, job.attempt),
        (JobState::Completed, 1),
        "{job:?}"
    );
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("quick-1"));
    quick.drain().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builder_refuses_a_bad_task_name_before_anything_starts() {
    let refused = Worker::builder()
        .coordinators(["127.0.0.1:1"])
        .task(
            "no spaces",
            |_: serde_json::Value, _ctx: TaskContext| async move { Ok::<_, TaskError>(0) },
        )
        .start();
    match refused {
        Err(herder_runtime::worker::BuildError::TaskName { name, .. }) => {
            assert_eq!(name, "no spaces")
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a bad task name was accepted"),
    }
}
