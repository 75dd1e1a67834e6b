//! Black-box tests of the `herder` command: exit codes, usage, `--json` shapes and bad input,
//! against real coordinator and dev-cluster processes on loopback ephemeral ports.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{code, herder, herder_within, start_server, stdout_json, temp_dir, Server};

/// A lone coordinator (no workers) on loopback ephemeral ports, its data in `data_dir`, with
/// `extra` flags.
fn lone_coordinator(data_dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec![
        "coordinator",
        "--data-dir",
        data_dir.to_str().expect("utf-8"),
        "--worker-port",
        "127.0.0.1:0",
        "--client-port",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    start_server(&args, "client_addr=")
}

fn dev_cluster(name: &str) -> (Server, PathBuf) {
    let dir = temp_dir(name);
    let server = start_server(
        &[
            "dev",
            "--workers",
            "2",
            "--data-dir",
            dir.to_str().expect("utf-8 path"),
            "--worker-port",
            "127.0.0.1:0",
            "--client-port",
            "127.0.0.1:0",
            "--retry-base-millis",
            "20",
            "--retry-max-millis",
            "50",
        ],
        "clients at ",
    );
    (server, dir)
}

#[test]
fn a_verb_without_its_arguments_prints_usage_and_exits_2() {
    for args in [
        &["submit"][..],
        &["status"],
        &["worker"],
        &["bench"],
        &["submit", "sleep"],
    ] {
        let output = herder(args);
        assert_eq!(code(&output), 2, "{args:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("Usage"),
            "{args:?} prints usage"
        );
    }
}

#[test]
fn bad_input_is_refused_before_anything_is_sent() {
    // No coordinator is running at this address; validation must come first.
    let nowhere = ["--coordinator", "127.0.0.1:1"];
    let cases: [&[&str]; 5] = [
        &["submit", "sleep", "--milliseconds", "-5"],
        &["submit", "prime-count", "--limit", "99999999999"],
        &["submit", "fail", "--fail-until-attempt", "0"],
        &["status", "not-a-job-id"],
        &["list", "--state", "sideways"],
    ];
    for case in cases {
        let args: Vec<&str> = case.iter().chain(nowhere.iter()).copied().collect();
        let output = herder(&args);
        assert_eq!(
            code(&output),
            2,
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let output = herder(&[
        "submit",
        "sleep",
        "--milliseconds",
        "-5",
        "--json",
        "--coordinator",
        "127.0.0.1:1",
    ]);
    let error = stdout_json(&output);
    assert_eq!(error["error"]["kind"], "usage");
    assert!(error["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("milliseconds")));
}

#[test]
fn bad_data_parallel_input_is_refused_with_its_position() {
    let nowhere = ["--coordinator", "127.0.0.1:1"];
    let dir = temp_dir("bad-numbers");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("numbers.csv");
    std::fs::write(&file, "value\n1, 2;3\n4 5 six\n").expect("write the file");
    let file = file.to_str().expect("utf-8 path").to_owned();
    let table = dir.join("table.csv");
    std::fs::write(&table, "id,value\n1,10\n2,x\n").expect("write the table");
    let table = table.to_str().expect("utf-8 path").to_owned();
    let cases: [(&[&str], &str); 11] = [
        (&["submit", "max", "--file", &file], "line 3, column 5"),
        // A table's id column is not data: a column must be chosen, and must exist.
        (
            &["submit", "max", "--file", &table],
            "choose one with --column",
        ),
        (
            &["submit", "max", "--file", &table, "--column", "price"],
            "no column \"price\"",
        ),
        (
            &["submit", "max", "--file", &table, "--column", "value"],
            "line 3, column 2",
        ),
        (
            &["submit", "prime-count", "--numbers", "2,x"],
            "line 1, column 3",
        ),
        (&["submit", "max", "--numbers", ""], "at least one number"),
        (&["submit", "max"], "--numbers or --file"),
        (
            &["submit", "prime-sum", "--start", "9", "--end", "2"],
            "start <= end",
        ),
        (
            &[
                "submit",
                "prime-sum",
                "--start",
                "1",
                "--end",
                "9",
                "--partitions",
                "zero",
            ],
            "partitions",
        ),
        (
            &["submit", "sha256", "--text", "a", "--partitions", "2"],
            "--partitions applies only",
        ),
        (
            &["submit", "max", "--file", "/nonexistent/numbers.csv"],
            "cannot read",
        ),
    ];
    for (case, expected) in cases {
        let args: Vec<&str> = case.iter().chain(nowhere.iter()).copied().collect();
        let output = herder(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(code(&output), 2, "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // The chosen column of a well-formed table passes validation (and then finds nobody).
    std::fs::write(dir.join("table.csv"), "id,value\n1,10\n2,20\n").expect("rewrite");
    let output = herder(&[
        "submit", "max", "--file", &table, "--column", "2", nowhere[0], nowhere[1],
    ]);
    assert_eq!(
        code(&output),
        4,
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreachable_coordinator_exits_4_without_hanging() {
    let output = herder(&[
        "status",
        "00000000-0000-4000-8000-000000000001",
        "--coordinator",
        "127.0.0.1:1,127.0.0.1:2",
        "--json",
    ]);
    assert_eq!(code(&output), 4);
    assert_eq!(stdout_json(&output)["error"]["kind"], "unreachable");
}

#[test]
fn bad_group_flags_are_refused_with_exit_2_and_what_is_wrong() {
    // Nothing is bound or written: every case is refused before the coordinator starts.
    let cases: [(&[&str], &str); 8] = [
        // Loopback by default, yet the group would send clients to 10.0.0.1.
        (
            &[
                "--id",
                "c1",
                "--peers",
                "c1=10.0.0.1:7072,c2=10.0.0.2:7072,c3=10.0.0.3:7072",
            ],
            "--worker-port listens on 127.0.0.1:7070, but the group sends clients and workers to 10.0.0.1",
        ),
        (
            &["--peers", "c2=127.0.0.1:7072,c3=127.0.0.1:7082"],
            "--id coordinator-1 is not in --peers (c2, c3)",
        ),
        (
            &[
                "--id",
                "c1",
                "--peers",
                "c1=127.0.0.1:7072,c1=127.0.0.1:7082",
            ],
            "--peers names member c1 twice",
        ),
        (
            &["--id", "c1", "--peers", "c1=127.0.0.1:7072,c2"],
            "--peers entry 2 (\"c2\") is not ID=HOST:PORT",
        ),
        (
            &["--id", "c1", "--peers", "c1=127.0.0.1:peer"],
            "\"peer\" is not a port",
        ),
        (
            &[
                "--id",
                "c1",
                "--peers",
                "c1=a:1,c2=b:2,c3=c:3,c4=d:4,c5=e:5,c6=f:6,c7=g:7,c8=h:8",
            ],
            "a group has 1 to 7 members",
        ),
        (
            &["--id", "c1", "--rotate-leader-after-jobs", "0"],
            "--rotate-leader-after-jobs must be at least 1",
        ),
        (
            &["--election-timeout-millis", "5"],
            "--election-timeout-millis",
        ),
    ];
    let dir = temp_dir("group-flags");
    for (flags, expected) in cases {
        let mut args = vec!["coordinator", "--data-dir", dir.to_str().expect("utf-8")];
        args.extend_from_slice(flags);
        let output = herder(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(code(&output), 2, "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
    assert!(!dir.exists(), "a refused coordinator created its data dir");
}

#[test]
fn a_corrupt_database_is_refused_and_left_alone() {
    let dir = temp_dir("corrupt");
    std::fs::create_dir_all(&dir).expect("dir");
    let garbage = vec![0xA5u8; 4096];
    std::fs::write(dir.join("herder.sqlite3"), &garbage).expect("garbage");
    let output = herder(&[
        "coordinator",
        "--data-dir",
        dir.to_str().expect("utf-8"),
        "--worker-port",
        "127.0.0.1:0",
        "--client-port",
        "127.0.0.1:0",
    ]);
    assert_eq!(code(&output), 5);
    assert!(String::from_utf8_lossy(&output.stderr).contains("not a readable Herder database"));
    assert_eq!(
        std::fs::read(dir.join("herder.sqlite3")).expect("kept"),
        garbage
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_port_in_use_is_reported() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").to_string();
    let dir = temp_dir("port");
    let output = herder(&[
        "coordinator",
        "--data-dir",
        dir.to_str().expect("utf-8"),
        "--worker-port",
        "127.0.0.1:0",
        "--client-port",
        &port,
    ]);
    assert_eq!(code(&output), 5);
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot listen"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_client_verbs_against_a_dev_cluster() {
    let (server, dir) = dev_cluster("verbs");
    let at = ["--coordinator", server.client_addr.as_str()];
    let run = |args: &[&str]| {
        let all: Vec<&str> = args.iter().chain(at.iter()).copied().collect();
        herder(&all)
    };

    // submit --wait --json: the job view with its fields (`JobView`, docs/PROTOCOL.md 8.5).
    let output = run(&["submit", "sha256", "--text", "abc", "--wait", "--json"]);
    assert_eq!(
        code(&output),
        0,
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let submitted = stdout_json(&output);
    let job = &submitted["job"];
    for field in [
        "id",
        "state",
        "attempt",
        "max_attempts",
        "worker",
        "result",
        "error",
        "task",
    ] {
        assert!(job.get(field).is_some(), "job view lacks {field}: {job}");
    }
    assert_eq!(job["state"], "COMPLETED");
    assert_eq!(
        job["result"]["hex"],
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let job_id = submitted["job_id"].as_str().expect("job id").to_owned();

    // status, people and JSON.
    let output = run(&["status", &job_id]);
    assert_eq!(code(&output), 0);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("State:    COMPLETED") && text.contains("Attempt:  1/3"),
        "{text}"
    );
    assert_eq!(
        stdout_json(&run(&["status", &job_id, "--json"]))["id"],
        job_id.as_str()
    );

    // A job that fails for good: exit 1 from submit --wait and from wait.
    let output = run(&[
        "submit",
        "fail",
        "--fail-until-attempt",
        "9",
        "--max-attempts",
        "2",
        "--wait",
        "--json",
    ]);
    assert_eq!(code(&output), 1);
    let failed = stdout_json(&output);
    assert_eq!(failed["job"]["state"], "FAILED");
    assert_eq!(failed["job"]["attempt"], 2);
    let failed_id = failed["job_id"].as_str().expect("id").to_owned();
    assert_eq!(code(&run(&["wait", &failed_id])), 1);

    // Cancel a long job: exit 0, then wait reports CANCELLED with exit 1.
    let output = run(&["submit", "sleep", "--milliseconds", "60000", "--json"]);
    let sleeper = stdout_json(&output)["job_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let output = run(&["cancel", &sleeper, "--json"]);
    assert_eq!(code(&output), 0);
    assert_eq!(stdout_json(&output)["cancelled"], true);
    assert_eq!(code(&run(&["wait", &sleeper])), 1);

    // Idempotency: the same key names the same job.
    let first = stdout_json(&run(&[
        "submit",
        "sha256",
        "--text",
        "k",
        "--idempotency-key",
        "order-42",
        "--json",
    ]));
    let again = stdout_json(&run(&[
        "submit",
        "sha256",
        "--text",
        "k",
        "--idempotency-key",
        "order-42",
        "--json",
    ]));
    assert_eq!(first["job_id"], again["job_id"]);
    assert_eq!(again["existing"], true);
    let conflict = run(&[
        "submit",
        "sha256",
        "--text",
        "other",
        "--idempotency-key",
        "order-42",
        "--json",
    ]);
    assert_eq!(code(&conflict), 5);
    assert_eq!(
        stdout_json(&conflict)["error"]["code"],
        "IDEMPOTENCY_CONFLICT"
    );

    // list and workers.
    let listed = stdout_json(&run(&["list", "--json", "--state", "cancelled"]));
    let ids: Vec<&str> = listed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(ids, vec![sleeper.as_str()]);
    let workers = stdout_json(&run(&["workers", "--json"]));
    assert_eq!(workers["workers"].as_array().map(Vec::len), Some(2));

    // An unknown job is a server-side "not found".
    let output = run(&["status", "00000000-0000-4000-8000-000000000009", "--json"]);
    assert_eq!(code(&output), 5);
    assert_eq!(stdout_json(&output)["error"]["code"], "JOB_NOT_FOUND");

    // bench: one JSON object with the agreed fields.
    let output = run(&["bench", "--jobs", "50", "--concurrency", "2", "--json"]);
    assert_eq!(code(&output), 0);
    let report = stdout_json(&output);
    assert_eq!(report["accepted"], 50);
    assert_eq!(report["completed"], 50);
    for field in [
        "throughput_jobs_per_second",
        "submit_ack_millis",
        "end_to_end_millis",
        "rejected",
    ] {
        assert!(report.get(field).is_some(), "bench report lacks {field}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn admission_rejections_exit_3() {
    let dir = temp_dir("admission");
    let server = lone_coordinator(&dir, &["--max-active-jobs", "1"]);
    let at = ["--coordinator", server.client_addr.as_str()];
    let submit = |extra: &[&str]| {
        let mut args = vec!["submit", "sleep", "--milliseconds", "1000"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&at);
        herder(&args)
    };
    assert_eq!(
        code(&submit(&[])),
        0,
        "the first job is admitted (no workers: it stays queued)"
    );
    let rejected = submit(&["--json"]);
    assert_eq!(code(&rejected), 3);
    let error = &stdout_json(&rejected)["error"];
    assert_eq!(error["kind"], "rejected");
    assert_eq!(error["code"], "SUBMIT_REJECTED");
    assert_eq!(error["retryable"], true);
    // A bench whose every submission is refused says so with exit 3.
    let bench = herder(&[
        "bench",
        "--jobs",
        "3",
        "--concurrency",
        "1",
        "--task",
        "sleep",
        "--json",
        "--coordinator",
        server.client_addr.as_str(),
    ]);
    assert_eq!(
        code(&bench),
        3,
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    assert_eq!(stdout_json(&bench)["rejected"], 3);
    // Opt-in retries still give up (nothing frees the slot) and report the rejection.
    assert_eq!(
        code(&submit(&[
            "--submit-retries",
            "2",
            "--submit-retry-base-millis",
            "10"
        ])),
        3
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bench_without_waits_counts_acknowledged_jobs_that_stay_queued() {
    // No worker ever connects, so a bench that waited would never end.
    let dir = temp_dir("bench-no-wait");
    let server = lone_coordinator(&dir, &[]);
    let at = server.client_addr.as_str();
    for extra in [&["--pipeline", "2"][..], &["--batch", "5"]] {
        let mut args = vec![
            "bench",
            "--no-wait",
            "--jobs",
            "10",
            "--concurrency",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--coordinator", at]);
        let output = herder_within(&args, Duration::from_secs(60));
        assert_eq!(
            code(&output),
            0,
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report = stdout_json(&output);
        assert_eq!(report["accepted"], 10, "{extra:?}: {report}");
        assert_eq!(report["waited"], false);
        assert_eq!(report["completed"], 0);
    }
    let listed = herder(&["list", "--state", "queued", "--json", "--coordinator", at]);
    assert_eq!(code(&listed), 0);
    let jobs = stdout_json(&listed)["jobs"]
        .as_array()
        .map_or(0, |jobs| jobs.len());
    assert_eq!(jobs, 20, "every acknowledged job is queued");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_errors_are_json_when_json_is_asked_for() {
    let output = herder(&["submit", "sleep", "--json"]);
    assert_eq!(code(&output), 2);
    let error = &stdout_json(&output)["error"];
    assert_eq!(error["kind"], "usage");
    assert_eq!(error["retryable"], false);
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("--milliseconds")),
        "{error}"
    );
}

#[test]
fn a_text_comes_from_a_file_or_standard_input_and_a_listing_says_when_it_stopped() {
    use std::io::Write;
    let (server, dir) = dev_cluster("text-file");
    let at = server.client_addr.as_str();
    let file = dir.join("words.txt");
    std::fs::write(&file, "one two three four").expect("write the text file");
    let from_file = herder(&[
        "submit",
        "--wait",
        "--json",
        "word-count",
        "--text-file",
        file.to_str().expect("utf-8"),
        "--coordinator",
        at,
    ]);
    assert_eq!(
        code(&from_file),
        0,
        "{}",
        String::from_utf8_lossy(&from_file.stderr)
    );
    assert_eq!(stdout_json(&from_file)["job"]["result"]["words"], 4);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_herder"))
        .args([
            "submit",
            "--wait",
            "--json",
            "word-count",
            "--text-file",
            "-",
        ])
        .args(["--coordinator", at])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn herder");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"a b")
        .expect("write stdin");
    let from_stdin = child.wait_with_output().expect("herder exits");
    assert_eq!(
        code(&from_stdin),
        0,
        "{}",
        String::from_utf8_lossy(&from_stdin.stderr)
    );
    assert_eq!(stdout_json(&from_stdin)["job"]["result"]["words"], 2);
    // --text and --text-file are one or the other.
    let both = herder(&["submit", "sha256", "--text", "x", "--text-file", "-"]);
    assert_eq!(code(&both), 2);
    // Two jobs exist: a listing limited to one says it stopped there; one of two does not.
    let one = herder(&["list", "--limit", "1", "--json", "--coordinator", at]);
    assert_eq!(stdout_json(&one)["truncated"], true);
    assert_eq!(stdout_json(&one)["jobs"].as_array().map(Vec::len), Some(1));
    let all = herder(&["list", "--limit", "2", "--json", "--coordinator", at]);
    assert_eq!(stdout_json(&all)["truncated"], false);
    let people = herder(&["list", "--limit", "1", "--coordinator", at]);
    assert!(String::from_utf8_lossy(&people.stderr).contains("stopped at the limit of 1"));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_coordinator_that_accepts_but_never_answers_is_given_up_on_with_what_was_awaited() {
    // A listener nobody serves: connections complete (the kernel's backlog) but no reply ever
    // comes, as with a paused coordinator.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = silent.local_addr().expect("addr").to_string();
    let job = "2b9e8a4e-41a7-4a53-9d5d-6c8e0c6b6f7d";
    let output = herder(&[
        "status",
        job,
        "--call-timeout-millis",
        "300",
        "--json",
        "--coordinator",
        &at,
    ]);
    assert_eq!(
        code(&output),
        4,
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let error = &stdout_json(&output)["error"];
    assert_eq!(error["kind"], "timeout");
    assert_eq!(error["retryable"], true);
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("waiting for the job's status")),
        "{error}"
    );
    drop(silent);
}

#[test]
fn purge_removes_terminal_jobs_for_good_and_a_restart_does_not_bring_them_back() {
    let (server, dir) = dev_cluster("purge");
    let at = ["--coordinator", server.client_addr.as_str()];
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&at);
        herder(&all)
    };
    let submitted = run(&[
        "submit",
        "sha256",
        "--text",
        "purge me",
        "--idempotency-key",
        "purge-key",
        "--wait",
        "--json",
    ]);
    assert_eq!(code(&submitted), 0);
    let answer = stdout_json(&submitted);
    let job = &answer["job"];
    let job_id = answer["job_id"].as_str().expect("an id").to_owned();
    assert!(
        job["finished_at_unix_ms"].as_u64() >= job["created_at_unix_ms"].as_u64(),
        "a finished job says when: {job}"
    );
    // A live state is refused before anything is sent.
    let refused = run(&["purge", "--state", "queued", "--older-than", "0"]);
    assert_eq!(code(&refused), 2);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not terminal"));
    // Not old enough: kept.
    let kept = run(&["purge", "--older-than", "1h", "--json"]);
    assert_eq!(stdout_json(&kept)["purged"], 0);
    assert_eq!(code(&run(&["status", &job_id])), 0);
    let purged = run(&[
        "purge",
        "--state",
        "completed",
        "--older-than",
        "0",
        "--json",
    ]);
    assert_eq!(
        code(&purged),
        0,
        "{}",
        String::from_utf8_lossy(&purged.stderr)
    );
    assert_eq!(stdout_json(&purged)["purged"], 1);
    let status = run(&["status", &job_id, "--json"]);
    assert_ne!(code(&status), 0);
    assert_eq!(stdout_json(&status)["error"]["code"], "JOB_NOT_FOUND");
    // The key went with the job: the same submission now makes a new one.
    let again = run(&[
        "submit",
        "sha256",
        "--text",
        "purge me",
        "--idempotency-key",
        "purge-key",
        "--json",
    ]);
    assert_eq!(code(&again), 0);
    assert_eq!(stdout_json(&again)["existing"], false);
    assert_ne!(
        stdout_json(&again)["job_id"].as_str(),
        Some(job_id.as_str())
    );
    drop(server);
    // Durable: a coordinator restarted on the same directory does not know the job.
    let restarted = lone_coordinator(&dir, &[]);
    let status = herder(&[
        "status",
        &job_id,
        "--json",
        "--coordinator",
        restarted.client_addr.as_str(),
    ]);
    assert_eq!(stdout_json(&status)["error"]["code"], "JOB_NOT_FOUND");
    drop(restarted);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connection_bounds_that_contradict_each_other_are_refused() {
    let dir = temp_dir("contradicting-bounds");
    let output = herder(&[
        "coordinator",
        "--data-dir",
        dir.to_str().expect("utf-8"),
        "--worker-port",
        "127.0.0.1:0",
        "--client-port",
        "127.0.0.1:0",
        "--max-requests-per-connection",
        "10",
        "--max-waits-per-connection",
        "10",
    ]);
    assert_eq!(code(&output), 2);
    assert!(String::from_utf8_lossy(&output.stderr).contains("must exceed"));
    assert!(!dir.join("herder.sqlite3").exists(), "nothing is created");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_batch_file_submits_every_line_and_a_bad_line_submits_nothing() {
    let dir = temp_dir("batch-file");
    let server = lone_coordinator(
        &dir.join("data"),
        &["--http-port", "off", "--max-active-jobs", "3"],
    );
    let at = ["--coordinator", server.client_addr.as_str()];
    let run = |args: &[&str]| {
        let all: Vec<&str> = args.iter().chain(at.iter()).copied().collect();
        herder(&all)
    };
    let lines_of = |output: &std::process::Output| -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line per job"))
            .collect()
    };
    let file = dir.join("jobs.jsonl");
    std::fs::write(
        &file,
        concat!(
            r#"{"task": {"kind": "sha256", "text": "a"}}"#,
            "\n\n",
            r#"{"task": {"kind": "sha256", "text": "b"}, "idempotency_key": "k-1"}"#,
            "\n",
            r#"{"task": {"kind": "sha256", "text": "b"}, "idempotency_key": "k-1"}"#,
            "\n",
        ),
    )
    .expect("write the batch file");
    let path = file.to_str().expect("utf-8");
    let output = run(&["submit", "--batch-file", path, "--json"]);
    assert_eq!(
        code(&output),
        0,
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results = lines_of(&output);
    assert_eq!(results.len(), 3, "one line per job: {results:?}");
    assert_eq!(
        results
            .iter()
            .map(|r| r["line"].as_u64())
            .collect::<Vec<_>>(),
        [Some(1), Some(3), Some(4)],
        "each result names its line"
    );
    assert!(results.iter().all(|r| r["outcome"] == "ACCEPTED"));
    assert_eq!(results[1]["existing"], false);
    assert_eq!(
        results[2]["existing"], true,
        "the key's second use names the first job"
    );
    assert_eq!(results[1]["job_id"], results[2]["job_id"]);

    // Two new jobs, one slot left: the second is refused, and the exit code says so.
    std::fs::write(
        &file,
        concat!(
            r#"{"task": {"kind": "sha256", "text": "c"}}"#,
            "\n",
            r#"{"task": {"kind": "sha256", "text": "d"}}"#,
            "\n",
        ),
    )
    .expect("write the batch file");
    let output = run(&["submit", "--batch-file", path, "--json"]);
    assert_eq!(code(&output), 3);
    let results = lines_of(&output);
    assert_eq!(results[0]["outcome"], "ACCEPTED");
    assert_eq!(results[1]["outcome"], "REJECTED");

    // A bad line stops everything before anything is sent.
    std::fs::write(
        &file,
        concat!(
            r#"{"task": {"kind": "sha256", "text": "e"}}"#,
            "\n",
            r#"{"task": {"kind": "sha256"}}"#,
            "\n",
        ),
    )
    .expect("write the batch file");
    let output = run(&["submit", "--batch-file", path]);
    assert_eq!(code(&output), 2);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("line 2"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed = run(&["list", "--json"]);
    assert_eq!(
        stdout_json(&listed)["jobs"].as_array().map(Vec::len),
        Some(3),
        "the first two files made three jobs, the bad one none"
    );
}

#[test]
fn a_worker_asking_more_prefetch_than_four_per_slot_is_refused_before_it_connects() {
    let output = herder(&[
        "worker",
        "--id",
        "w1",
        "--capacity",
        "2",
        "--prefetch",
        "9",
        "--coordinator",
        "127.0.0.1:1",
    ]);
    assert_eq!(code(&output), 2);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("prefetch may be at most 4 per slot (8 with capacity 2), got 9"),
        "{stderr}"
    );
}

#[test]
fn io_threads_out_of_range_are_a_usage_error_and_in_range_run_the_verb() {
    for bad in ["0", "65", "many"] {
        let output = herder(&[
            "workers",
            "--io-threads",
            bad,
            "--coordinator",
            "127.0.0.1:1",
        ]);
        assert_eq!(code(&output), 2, "--io-threads {bad}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--io-threads"), "{stderr}");
    }
    // Accepted, the verb runs: nothing listens there, so it cannot reach a coordinator.
    let output = herder(&[
        "workers",
        "--io-threads",
        "3",
        "--coordinator",
        "127.0.0.1:1",
        "--call-timeout-millis",
        "500",
    ]);
    assert_eq!(code(&output), 4);
}

#[test]
fn failed_and_cancelled_jobs_are_retried_once_as_new_jobs_linked_to_them() {
    let (server, dir) = dev_cluster("retry");
    let at = ["--coordinator", server.client_addr.as_str()];
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&at);
        herder(&all)
    };
    let id_of = |output: &std::process::Output| {
        stdout_json(output)["job_id"]
            .as_str()
            .expect("an id")
            .to_owned()
    };
    // Two jobs that fail for good, one that completes, one delayed and then cancelled.
    let mut failed = Vec::new();
    for _ in 0..2 {
        let job = run(&[
            "submit",
            "fail",
            "--fail-until-attempt",
            "9",
            "--max-attempts",
            "1",
            "--wait",
            "--json",
        ]);
        assert_eq!(code(&job), 1, "{}", String::from_utf8_lossy(&job.stderr));
        failed.push(id_of(&job));
    }
    let done = run(&["submit", "sha256", "--text", "fine", "--wait", "--json"]);
    assert_eq!(code(&done), 0);
    let done = id_of(&done);
    let later = run(&[
        "submit", "sha256", "--text", "later", "--delay", "1h", "--json",
    ]);
    assert_eq!(code(&later), 0);
    let later = id_of(&later);
    let waiting = stdout_json(&run(&["status", &later, "--json"]));
    assert_eq!(waiting["state"], "SCHEDULED", "{waiting}");
    assert!(waiting["run_at_unix_ms"].as_u64() > waiting["created_at_unix_ms"].as_u64());
    assert_eq!(code(&run(&["cancel", &later])), 0);

    let dry = run(&["retry", "--state", "failed", "--dry-run", "--json"]);
    assert_eq!(code(&dry), 0);
    let mut would: Vec<String> = stdout_json(&dry)["would_retry"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|id| id.as_str().expect("an id").to_owned())
        .collect();
    would.sort();
    let mut expected = failed.clone();
    expected.sort();
    assert_eq!(would, expected);

    let retried = run(&["retry", "--state", "failed", "--json"]);
    assert_eq!(
        code(&retried),
        0,
        "{}",
        String::from_utf8_lossy(&retried.stderr)
    );
    let first = stdout_json(&retried);
    let links: Vec<(String, String)> = first["retried"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            assert_eq!(r["existing"], false, "{r}");
            (
                r["retry_of"].as_str().expect("of").to_owned(),
                r["job_id"].as_str().expect("id").to_owned(),
            )
        })
        .collect();
    assert_eq!(links.len(), 2);
    for (of, new) in &links {
        assert!(failed.contains(of));
        let view = stdout_json(&run(&["status", new, "--json"]));
        assert_eq!(view["retry_of"].as_str(), Some(of.as_str()), "{view}");
        assert_eq!(view["task"]["kind"], "fail");
    }
    // The same retry again creates nothing new: each job is retried once.
    let again = stdout_json(&run(&["retry", "--state", "failed", "--json"]));
    let mut repeated: Vec<(String, String)> = again["retried"]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|r| failed.contains(&r["retry_of"].as_str().expect("of").to_owned()))
        .map(|r| {
            assert_eq!(r["existing"], true, "{r}");
            (
                r["retry_of"].as_str().expect("of").to_owned(),
                r["job_id"].as_str().expect("id").to_owned(),
            )
        })
        .collect();
    let mut links = links;
    links.sort();
    repeated.sort();
    assert_eq!(repeated, links);
    // A cancelled job by id; a completed one is refused.
    let by_id = run(&["retry", &later, "--json"]);
    assert_eq!(code(&by_id), 0);
    assert_eq!(
        stdout_json(&by_id)["retried"][0]["retry_of"],
        later.as_str()
    );
    let refused = run(&["retry", &done, "--json"]);
    assert_eq!(code(&refused), 5);
    assert!(stdout_json(&refused)["refused"][0]["error"]
        .as_str()
        .expect("why")
        .contains("COMPLETED"));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_batch_file_can_carry_a_graph_of_jobs_and_a_cycle_sends_nothing() {
    let (server, dir) = dev_cluster("batch-graph");
    let at = ["--coordinator", server.client_addr.as_str()];
    let file = dir.join("graph.jsonl");
    let cycle = dir.join("cycle.jsonl");
    std::fs::write(
        &file,
        concat!(
            r#"{"task": {"kind": "sha256", "text": "join"}, "ref": "join", "after_refs": ["left", "right"]}"#,
            "\n",
            r#"{"task": {"kind": "sha256", "text": "left"}, "ref": "left", "after_refs": ["root"]}"#,
            "\n",
            r#"{"task": {"kind": "sha256", "text": "right"}, "ref": "right", "after_refs": ["root"]}"#,
            "\n",
            r#"{"task": {"kind": "sha256", "text": "root"}, "ref": "root"}"#,
            "\n",
        ),
    )
    .expect("write the graph");
    std::fs::write(
        &cycle,
        concat!(
            r#"{"task": {"kind": "sha256", "text": "a"}, "ref": "a", "after_refs": ["b"]}"#,
            "\n",
            r#"{"task": {"kind": "sha256", "text": "b"}, "ref": "b", "after_refs": ["a"]}"#,
            "\n",
        ),
    )
    .expect("write the cycle");
    let refused = herder(
        &[
            &["submit", "--batch-file", cycle.to_str().expect("utf-8")],
            &at[..],
        ]
        .concat(),
    );
    assert_eq!(
        code(&refused),
        2,
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cycle"));
    let listed = stdout_json(&herder(&[&["list", "--json"], &at[..]].concat()));
    assert_eq!(
        listed["jobs"].as_array().map(Vec::len),
        Some(0),
        "nothing was sent: {listed}"
    );

    let sent = herder(
        &[
            &[
                "submit",
                "--batch-file",
                file.to_str().expect("utf-8"),
                "--json",
            ],
            &at[..],
        ]
        .concat(),
    );
    assert_eq!(code(&sent), 0, "{}", String::from_utf8_lossy(&sent.stderr));
    let mut ids = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&sent.stdout).lines() {
        let answer: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        ids.insert(
            answer["line"].as_u64().expect("a line"),
            answer["job_id"].as_str().expect("an id").to_owned(),
        );
    }
    assert_eq!(ids.len(), 4);
    let waited = herder(&[&["wait", &ids[&1], "--json"], &at[..]].concat());
    assert_eq!(
        code(&waited),
        0,
        "{}",
        String::from_utf8_lossy(&waited.stdout)
    );
    let join = &stdout_json(&herder(
        &[&["status", &ids[&1], "--json"], &at[..]].concat(),
    ));
    assert_eq!(join["state"], "COMPLETED", "{join}");
    let after: Vec<&str> = join["after"]
        .as_array()
        .expect("after")
        .iter()
        .map(|v| v.as_str().expect("id"))
        .collect();
    assert_eq!(after, vec![ids[&2].as_str(), ids[&3].as_str()]);
    let started =
        |job: &serde_json::Value| job["first_started_at_unix_ms"].as_u64().expect("started");
    for line in [2, 3] {
        let parent = stdout_json(&herder(
            &[&["status", &ids[&line], "--json"], &at[..]].concat(),
        ));
        assert_eq!(parent["state"], "COMPLETED");
        assert!(started(join) >= parent["finished_at_unix_ms"].as_u64().expect("finished"));
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
