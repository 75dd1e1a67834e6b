//! `exec` tasks against a real coordinator and a worker that allows commands: what runs, where
//! and with what environment; a refused program never starts; a failing command is retried;
//! a cancel or a deadline kills the command's whole process group, SIGTERM or not.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use herder_core::job::JobState;
use herder_core::protocol::JobView;
use herder_core::tasks::TaskOutput;
use herder_runtime::exec::ExecPolicy;
use herder_runtime::{HerderClient, SubmitOptions, Worker, WorkerHandle};
use serde_json::{json, Value};

struct Setup {
    _coordinator: herder_runtime::coordinator::CoordinatorHandle,
    client: HerderClient,
    worker: WorkerHandle,
}

async fn setup(dir: &TestDir, allow: &[&str]) -> Setup {
    let coordinator = start_coordinator(fast_config(), &dir.path().join("data")).await;
    let client = client(coordinator.client_addr());
    let exec_dir = dir.path().join("work");
    std::fs::create_dir_all(exec_dir.join("jobs")).expect("create the exec dir");
    let worker = Worker::builder()
        .id("runner-1")
        .coordinators([coordinator.worker_addr().to_string()])
        .capacity(2)
        .exec(ExecPolicy {
            allow: allow.iter().map(|p| p.to_string()).collect(),
            dir: exec_dir,
            grace: Duration::from_millis(300),
        })
        .start()
        .expect("the worker starts");
    let workers = wait_alive(&client, &["runner-1"]).await;
    assert!(workers[0].tasks.iter().any(|t| t == "exec"), "{workers:?}");
    Setup {
        _coordinator: coordinator,
        client,
        worker,
    }
}

async fn exec(client: &HerderClient, task: Value, options: SubmitOptions) -> JobView {
    let submitted = client.submit_json(task, options).await.expect("submitted");
    wait_terminal(client, submitted.job_id).await
}

fn attempts(n: u32) -> SubmitOptions {
    SubmitOptions {
        max_attempts: Some(n),
        ..SubmitOptions::default()
    }
}

/// True while `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

async fn read_pid(path: &Path) -> u32 {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never held a pid",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_dead(pid: u32, what: &str) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while alive(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} (pid {pid}) is still alive"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_command_runs_in_its_directory_with_only_the_environment_it_is_given() {
    let dir = TestDir::new("exec-runs");
    let s = setup(&dir, &["/bin/sh"]).await;
    let script = r#"pwd; echo "$GREETING attempt $HERDER_ATTEMPT"; echo "home=${HOME:-unset}"; echo oops >&2"#;
    let job = exec(
        &s.client,
        json!({"kind": "exec", "argv": ["/bin/sh", "-c", script], "cwd": "jobs", "env": {"GREETING": "hi"}}),
        attempts(1),
    )
    .await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    let Some(TaskOutput::Exec { stdout, stderr, .. }) = job.result else {
        panic!("expected an exec output: {job:?}");
    };
    let expected_dir = dir.path().join("work").join("jobs");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        std::fs::canonicalize(lines[0]).expect("pwd is a directory"),
        std::fs::canonicalize(expected_dir).expect("the exec dir exists")
    );
    assert_eq!(&lines[1..], ["hi attempt 1", "home=unset"]);
    assert_eq!(stderr, "oops\n");
    s.worker.drain().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_is_retried_and_says_how_it_ended() {
    let dir = TestDir::new("exec-fails");
    let s = setup(&dir, &["/bin/sh"]).await;
    let job = exec(
        &s.client,
        json!({"kind": "exec", "argv": ["/bin/sh", "-c", "echo bad input >&2; exit 3"]}),
        attempts(2),
    )
    .await;
    assert_eq!((job.state, job.attempt), (JobState::Failed, 2), "{job:?}");
    let error = job.error.unwrap_or_default();
    assert!(
        error.contains("exited with code 3") && error.contains("bad input"),
        "{error}"
    );
    s.worker.drain().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_no_pattern_admits_is_refused_before_anything_runs() {
    let dir = TestDir::new("exec-refused");
    let s = setup(&dir, &["/bin/true", "/opt/jobs/*"]).await;
    let marker = dir.path().join("work").join("touched");
    let job = exec(
        &s.client,
        json!({"kind": "exec", "argv": ["/usr/bin/touch", marker.to_str().expect("utf-8")]}),
        attempts(3),
    )
    .await;
    assert_eq!((job.state, job.attempt), (JobState::Failed, 1), "{job:?}");
    let error = job.error.unwrap_or_default();
    assert!(
        error.contains("exec refused") && error.contains("/opt/jobs/*"),
        "{error}"
    );
    assert!(!marker.exists(), "the refused command ran");
    // A working directory that leads out of the exec directory through a link is refused too.
    std::os::unix::fs::symlink("/", dir.path().join("work").join("escape")).expect("a symlink");
    let escaped = exec(
        &s.client,
        json!({"kind": "exec", "argv": ["/bin/true"], "cwd": "escape/tmp"}),
        attempts(3),
    )
    .await;
    assert_eq!(
        (escaped.state, escaped.attempt),
        (JobState::Failed, 1),
        "{escaped:?}"
    );
    assert!(escaped
        .error
        .unwrap_or_default()
        .contains("outside the worker's exec directory"));
    // An admitted one runs.
    let ok = exec(
        &s.client,
        json!({"kind": "exec", "argv": ["/bin/true"]}),
        attempts(1),
    )
    .await;
    assert_eq!(ok.state, JobState::Completed, "{ok:?}");
    s.worker.drain().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_kills_a_process_group_that_ignores_sigterm() {
    let dir = TestDir::new("exec-cancel");
    let s = setup(&dir, &["/bin/sh"]).await;
    let pids = dir.path().join("work").join("jobs");
    // Both the shell and its background child ignore SIGTERM; only SIGKILL ends them.
    let script = "trap '' TERM; echo $$ > shell.pid; sleep 600 & echo $! > child.pid; wait";
    let submitted = s
        .client
        .submit_json(
            json!({"kind": "exec", "argv": ["/bin/sh", "-c", script], "cwd": "jobs"}),
            attempts(3),
        )
        .await
        .expect("submitted");
    let shell = read_pid(&pids.join("shell.pid")).await;
    let child = read_pid(&pids.join("child.pid")).await;
    assert!(alive(shell) && alive(child));
    let (_, cancelled) = s.client.cancel(submitted.job_id).await.expect("cancel");
    assert!(cancelled);
    wait_dead(shell, "the shell that ignores SIGTERM").await;
    wait_dead(child, "its background child").await;
    let job = status(&s.client, submitted.job_id).await;
    assert_eq!(job.state, JobState::Cancelled);
    // The slot is free again: another command runs.
    let next = exec(
        &s.client,
        json!({"kind": "exec", "argv": ["/bin/sh", "-c", "true"]}),
        attempts(1),
    )
    .await;
    assert_eq!(next.state, JobState::Completed, "{next:?}");
    s.worker.drain().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_deadline_kills_the_command() {
    let dir = TestDir::new("exec-deadline");
    let s = setup(&dir, &["/bin/sh"]).await;
    let pids = dir.path().join("work").join("jobs");
    let options = SubmitOptions {
        max_attempts: Some(1),
        timeout_millis: Some(300),
        ..SubmitOptions::default()
    };
    let submitted = s
        .client
        .submit_json(
            json!({"kind": "exec", "argv": ["/bin/sh", "-c", "echo $$ > deadline.pid; exec sleep 600"], "cwd": "jobs"}),
            options,
        )
        .await
        .expect("submitted");
    let pid = read_pid(&pids.join("deadline.pid")).await;
    let job = wait_terminal(&s.client, submitted.job_id).await;
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    assert!(job.error.unwrap_or_default().contains("300 ms"));
    wait_dead(pid, "the command past its deadline").await;
    s.worker.drain().await;
}
