//! The CLI with users' own work: a named task with a payload that no worker serves waits and
//! says so; `exec` runs what `--allow-exec` admits and refuses the rest; Ctrl-C on `herder dev`
//! drains its workers, so a running job keeps its attempts.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{code, herder, start_server, stdout_json, temp_dir, Server};
use serde_json::Value;

fn dev(dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec![
        "dev",
        "--workers",
        "1",
        "--data-dir",
        dir.to_str().expect("utf-8 path"),
        "--worker-port",
        "127.0.0.1:0",
        "--client-port",
        "127.0.0.1:0",
        "--drain-timeout",
        "200ms",
    ];
    args.extend_from_slice(extra);
    start_server(&args, "clients at ")
}

/// `herder ARGS --coordinator <the server>`; the flag goes before a `--`, whose arguments are
/// the command's own.
fn run(server: &Server, args: &[&str]) -> std::process::Output {
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let mut all = args[..split].to_vec();
    all.extend_from_slice(&["--coordinator", server.client_addr.as_str()]);
    all.extend_from_slice(&args[split..]);
    herder(&all)
}

/// Polls `herder status --json` until `accept` holds (bounded).
fn status_until(
    server: &Server,
    job_id: &str,
    what: &str,
    accept: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run(server, &["status", job_id, "--json"]);
        let job = stdout_json(&out);
        if accept(&job) {
            return job;
        }
        assert!(Instant::now() < deadline, "{what} never held; last: {job}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_named_task_with_a_payload_waits_visibly_for_a_worker_that_serves_it() {
    let dir = temp_dir("own-named");
    let server = dev(&dir, &[]);
    let out = run(
        &server,
        &[
            "submit",
            "resize",
            "--payload",
            r#"{"width": 640}"#,
            "--json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let job_id = stdout_json(&out)["job_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let job = stdout_json(&run(&server, &["status", &job_id, "--json"]));
    assert_eq!(job["state"], "QUEUED");
    assert_eq!(job["unserved"], true);
    assert_eq!(job["task"]["payload"]["width"], 640);
    let people = run(&server, &["status", &job_id]);
    assert!(
        String::from_utf8_lossy(&people.stdout).contains("no live worker serves \"resize\""),
        "{}",
        String::from_utf8_lossy(&people.stdout)
    );
    // A payload that is not JSON, and a name that cannot be one, are refused before sending.
    let bad = run(&server, &["submit", "resize", "--payload", "{width"]);
    assert_eq!(code(&bad), 2);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not valid JSON"));
    let bad = run(&server, &["submit", "no-such/..", "--payload", "1"]);
    assert_eq!(code(&bad), 0, "a valid name is a user task, served or not");
}

#[test]
fn exec_runs_what_allow_exec_admits_and_refuses_the_rest() {
    let dir = temp_dir("own-exec");
    let server = dev(&dir, &["--allow-exec", "/bin/echo", "--exec-dir", "/"]);
    let out = run(
        &server,
        &[
            "submit",
            "exec",
            "--wait",
            "--json",
            "--",
            "/bin/echo",
            "hello",
            "world",
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let job = &stdout_json(&out)["job"];
    assert_eq!(job["state"], "COMPLETED");
    assert_eq!(job["result"]["stdout"], "hello world\n");
    let refused = run(
        &server,
        &[
            "submit",
            "exec",
            "--wait",
            "--max-attempts",
            "3",
            "--",
            "/bin/rm",
            "-rf",
            "/nonexistent",
        ],
    );
    assert_eq!(code(&refused), 1, "a failed job exits 1");
    let text = String::from_utf8_lossy(&refused.stdout);
    assert!(
        text.contains("exec refused") && text.contains("Attempt:  1/3"),
        "{text}"
    );
    let without = run(&server, &["submit", "exec"]);
    assert_eq!(code(&without), 2, "exec needs a program");
}

#[test]
fn ctrl_c_on_dev_drains_so_a_running_job_keeps_its_attempts() {
    let dir = temp_dir("own-drain");
    let mut server = dev(&dir, &[]);
    // One attempt: were the shutdown to charge it, the job would fail.
    let out = run(
        &server,
        &[
            "submit",
            "sleep",
            "--milliseconds",
            "600000",
            "--max-attempts",
            "1",
            "--json",
        ],
    );
    assert_eq!(code(&out), 0);
    let job_id = stdout_json(&out)["job_id"]
        .as_str()
        .expect("an id")
        .to_owned();
    status_until(&server, &job_id, "the job runs", |job| {
        job["state"] == "RUNNING"
    });
    let interrupted = Command::new("kill")
        .args(["-INT", &server.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(interrupted.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("poll the dev process") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "herder dev did not stop on Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "herder dev exited with {status}");
    drop(server);
    // The next run finds the job queued with its attempt given back, and starts it again.
    let server = dev(&dir, &[]);
    let job = status_until(&server, &job_id, "the job runs again", |job| {
        job["state"] == "RUNNING" || job["state"] == "FAILED"
    });
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert_eq!(job["attempt"], 1, "{job}");
}
