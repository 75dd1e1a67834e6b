//! Bad input on the wire and at the library level gets a clear, typed error and changes
//! nothing: malformed frames on both ports, unknown jobs, invalid tasks, an unreachable
//! coordinator, a port in use, an unusable data dir, a corrupt or newer database.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use herder_core::client::{ClientError, Operation};
use herder_core::ids::JobId;
use herder_core::job::JobState;
use herder_core::protocol::{
    ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode, WorkerToCoordinator,
};
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_runtime::client::{CallError, HerderClient};
use herder_runtime::coordinator::{ConnectionLimits, CoordinatorError, CoordinatorOptions};
use herder_runtime::store::{StoreError, DATABASE_FILE};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Malformed inputs that every port must answer with a typed ERROR and a close.
fn malformed_inputs() -> Vec<(&'static str, Vec<u8>, ErrorCode)> {
    vec![
        (
            "garbage bytes in a frame",
            raw_frame(&[0xff, 0xfe, 0x00, 0x81, 0xc3, 0x28, 0xa0, 0xa1]),
            ErrorCode::InvalidUtf8,
        ),
        (
            "plain-text garbage",
            b"GET / HTTP/1.1\r\nHost: herder\r\n\r\n".to_vec(),
            ErrorCode::FrameTooLarge,
        ),
        (
            "an oversized length prefix",
            vec![0x7f, 0xff, 0xff, 0xff],
            ErrorCode::FrameTooLarge,
        ),
        (
            "just over the frame limit",
            (1024 * 1024 + 1u32).to_be_bytes().to_vec(),
            ErrorCode::FrameTooLarge,
        ),
        ("an empty frame", vec![0, 0, 0, 0], ErrorCode::EmptyFrame),
        (
            "an unknown type",
            raw_frame(br#"{"type":"LAUNCH_MISSILES","request_id":1}"#),
            ErrorCode::UnknownType,
        ),
        (
            "invalid JSON",
            raw_frame(br#"{"type": "STATUS", "#),
            ErrorCode::InvalidJson,
        ),
        (
            "JSON that is not an object",
            raw_frame(b"[1, 2, 3]"),
            ErrorCode::InvalidJson,
        ),
        (
            "a message without a type",
            raw_frame(br#"{"request_id":1}"#),
            ErrorCode::MissingType,
        ),
    ]
}

async fn send_raw(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    stream
}

async fn expect_client_error(addr: SocketAddr, name: &str, bytes: &[u8], code: ErrorCode) {
    let mut stream = send_raw(addr, bytes).await;
    match read_one::<ClientReply>(&mut stream, SHORT).await {
        Some(ClientReply::Error {
            code: got,
            request_id,
            ..
        }) => {
            assert_eq!(got, code, "client port, {name}");
            assert_eq!(
                request_id, None,
                "client port, {name}: a frame-level error answers no request"
            );
        }
        other => panic!("client port, {name}: expected an ERROR frame, got {other:?}"),
    }
    expect_eof(&mut stream, SHORT, &format!("client port, {name}")).await;
}

async fn expect_worker_error(addr: SocketAddr, name: &str, bytes: &[u8], code: ErrorCode) {
    let mut stream = send_raw(addr, bytes).await;
    match read_one::<CoordinatorToWorker>(&mut stream, SHORT).await {
        Some(CoordinatorToWorker::Error { code: got, .. }) => {
            assert_eq!(got, code, "worker port, {name}")
        }
        other => panic!("worker port, {name}: expected an ERROR frame, got {other:?}"),
    }
    expect_eof(&mut stream, SHORT, &format!("worker port, {name}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bytes_on_either_port_get_a_typed_error_and_a_close() {
    let dir = TestDir::new("malformed");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let worker = start_worker("worker-1", 1, coordinator.worker_addr());
    let client = client(coordinator.client_addr());
    wait_alive(&client, &["worker-1"]).await;

    for (name, bytes, code) in malformed_inputs() {
        expect_client_error(coordinator.client_addr(), name, &bytes, code).await;
        expect_worker_error(coordinator.worker_addr(), name, &bytes, code).await;
    }
    // A message of the other link is an unknown type on this one.
    let heartbeat = frame(&WorkerToCoordinator::Heartbeat {});
    expect_client_error(
        coordinator.client_addr(),
        "a worker message",
        &heartbeat,
        ErrorCode::UnknownType,
    )
    .await;
    let workers_request = frame(&ClientRequest::Workers {
        request_id: herder_core::ids::RequestId(1),
    });
    expect_worker_error(
        coordinator.worker_addr(),
        "a client message",
        &workers_request,
        ErrorCode::UnknownType,
    )
    .await;
    // A known type whose fields do not fit.
    let bad_status = raw_frame(br#"{"type":"STATUS","request_id":1,"job_id":"not-a-uuid"}"#);
    expect_client_error(
        coordinator.client_addr(),
        "a bad STATUS",
        &bad_status,
        ErrorCode::InvalidMessage,
    )
    .await;
    let bad_register = raw_frame(br#"{"type":"REGISTER","worker_id":"w","capacity":"lots"}"#);
    expect_worker_error(
        coordinator.worker_addr(),
        "a bad REGISTER",
        &bad_register,
        ErrorCode::InvalidMessage,
    )
    .await;
    // Worker messages before REGISTER.
    expect_worker_error(
        coordinator.worker_addr(),
        "HEARTBEAT before REGISTER",
        &heartbeat,
        ErrorCode::NotRegistered,
    )
    .await;

    // A valid request split into single bytes is still one request.
    let mut stream = TcpStream::connect(coordinator.client_addr())
        .await
        .expect("connect");
    for byte in frame(&ClientRequest::Workers {
        request_id: herder_core::ids::RequestId(7),
    }) {
        stream.write_all(&[byte]).await.expect("write");
        stream.flush().await.expect("flush");
    }
    match read_one::<ClientReply>(&mut stream, SHORT).await {
        Some(ClientReply::WorkerList {
            request_id,
            workers,
        }) => {
            assert_eq!(request_id.0, 7);
            assert!(workers.iter().any(|w| w.id.as_str() == "worker-1"));
        }
        other => panic!("expected WORKER_LIST, got {other:?}"),
    }
    drop(stream);

    // The coordinator keeps serving, and the registered worker was not disturbed.
    let job_id = submit(
        &client,
        TaskSpec::Sha256 {
            text: "still here".into(),
        },
    )
    .await;
    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(
        job.result,
        Some(TaskOutput::Sha256 {
            hex: sha256_hex("still here")
        })
    );
    assert_eq!(job.attempt, 1);
    let workers = client.workers().await.expect("workers");
    assert_eq!(
        workers.len(),
        1,
        "no garbage connection became a worker: {workers:?}"
    );
    assert!(workers[0].alive);

    worker.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

fn server_error(result: Result<impl std::fmt::Debug, CallError>) -> ErrorCode {
    match result {
        Err(CallError::Client(ClientError::Server { code, message })) => {
            assert!(!message.is_empty(), "an error explains itself");
            code
        }
        other => panic!("expected a typed server error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_jobs_and_invalid_submissions_get_typed_errors_and_create_nothing() {
    let dir = TestDir::new("bad-requests");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let unknown: JobId = "00000000-0000-4000-8000-000000000001"
        .parse()
        .expect("uuid");

    assert_eq!(
        server_error(client.status(unknown).await),
        ErrorCode::JobNotFound
    );
    assert_eq!(
        server_error(client.wait(unknown, Some(100)).await),
        ErrorCode::JobNotFound
    );
    assert_eq!(
        server_error(client.cancel(unknown).await),
        ErrorCode::JobNotFound
    );

    let invalid_tasks = [
        serde_json::json!({"kind": "launch missiles"}),
        serde_json::json!({"kind": "launch-missiles", "target": "moon"}),
        serde_json::json!({"kind": "exec", "argv": []}),
        serde_json::json!({"kind": "exec", "argv": ["true"], "cwd": "../etc"}),
        serde_json::json!({"kind": "sleep"}),
        serde_json::json!({"kind": "sleep", "milliseconds": -5}),
        serde_json::json!({"kind": "prime-count", "limit": "many"}),
        serde_json::json!({"kind": "sha256", "text": "x", "extra": 1}),
        serde_json::json!(["sha256"]),
    ];
    for task in invalid_tasks {
        let op = Operation::Submit(herder_core::protocol::JobSubmission {
            timeout_millis: None,
            partitions: None,
            task: task.clone(),
            max_attempts: None,
            idempotency_key: None,
            ..Default::default()
        });
        assert_eq!(
            server_error(client.call(op).await),
            ErrorCode::InvalidTask,
            "task {task}"
        );
    }
    let bad_attempts = Operation::Submit(herder_core::protocol::JobSubmission {
        timeout_millis: None,
        partitions: None,
        task: TaskSpec::Sha256 { text: "x".into() }.to_json(),
        max_attempts: Some(0),
        idempotency_key: None,
        ..Default::default()
    });
    assert_eq!(
        server_error(client.call(bad_attempts).await),
        ErrorCode::InvalidRequest
    );
    assert!(
        client.list(None, None).await.expect("list").is_empty(),
        "nothing was created"
    );

    // The connection survived every request-level error.
    let job_id = submit(
        &client,
        TaskSpec::Sha256 {
            text: "fine".into(),
        },
    )
    .await;
    assert_eq!(status(&client, job_id).await.state, JobState::Queued);

    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_aimed_at_a_closed_port_reports_unreachable() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let mut config = client_config(SocketAddr::from(([127, 0, 0, 1], port)));
    config.connect_timeout = Duration::from_secs(1);
    let client = HerderClient::new(config);
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        client.status(
            "00000000-0000-4000-8000-000000000002"
                .parse()
                .expect("uuid"),
        ),
    )
    .await
    .expect("the client gives up instead of hanging");
    match result {
        Err(CallError::Client(ClientError::Unreachable { tried, .. })) => {
            assert!(
                tried.contains(&port.to_string()),
                "names the address: {tried}"
            )
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_coordinator_on_a_port_in_use_fails_to_bind() {
    let dir = TestDir::new("port-in-use-a");
    let other_dir = TestDir::new("port-in-use-b");
    let running = start_coordinator(fast_config(), dir.path()).await;
    let any = SocketAddr::from(([127, 0, 0, 1], 0));

    match try_start_coordinator(fast_config(), other_dir.path(), running.worker_addr(), any).await {
        Err(CoordinatorError::Bind { addr, what, .. }) => {
            assert_eq!(addr, running.worker_addr());
            assert_eq!(what, "workers");
        }
        Err(e) => panic!("expected a bind error, got {e}"),
        Ok(_) => panic!("a second coordinator bound the worker port in use"),
    }
    match try_start_coordinator(fast_config(), other_dir.path(), any, running.client_addr()).await {
        Err(CoordinatorError::Bind { addr, what, .. }) => {
            assert_eq!(addr, running.client_addr());
            assert_eq!(what, "clients");
        }
        Err(e) => panic!("expected a bind error, got {e}"),
        Ok(_) => panic!("a second coordinator bound the client port in use"),
    }

    // The first one is unaffected.
    let client = client(running.client_addr());
    let job_id = submit(&client, TaskSpec::Sha256 { text: "x".into() }).await;
    assert_eq!(status(&client, job_id).await.state, JobState::Queued);
    running.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_that_is_a_file_is_refused() {
    let file = TestDir::new("data-dir-file");
    std::fs::write(file.path(), b"not a directory").expect("write file");
    match try_start_coordinator(
        fast_config(),
        file.path(),
        "127.0.0.1:0".parse().expect("addr"),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    {
        Err(CoordinatorError::Store(StoreError::CreateDir { path, .. }))
        | Err(CoordinatorError::Store(StoreError::NotWritable { path, .. })) => {
            assert_eq!(path, file.path())
        }
        Err(e) => panic!("expected a data-dir error, got {e}"),
        Ok(_) => panic!("a coordinator started on a file as data dir"),
    }
    assert_eq!(
        std::fs::read(file.path()).expect("still there"),
        b"not a directory"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_database_is_refused_and_left_untouched() {
    let dir = TestDir::new("corrupt-db");
    std::fs::create_dir_all(dir.path()).expect("dir");
    // Deterministic pseudo-random bytes (xorshift), several pages' worth.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let garbage: Vec<u8> = (0..16 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    let db = dir.path().join(DATABASE_FILE);
    std::fs::write(&db, &garbage).expect("write garbage");

    match try_start_coordinator(
        fast_config(),
        dir.path(),
        "127.0.0.1:0".parse().expect("addr"),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    {
        Err(CoordinatorError::Store(StoreError::Corrupt { path, .. })) => assert_eq!(path, db),
        Err(e) => panic!("expected a corruption refusal, got {e}"),
        Ok(_) => panic!("a coordinator started on a corrupt database"),
    }
    assert_eq!(
        std::fs::read(&db).expect("still there"),
        garbage,
        "never reset or rewritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_from_a_newer_version_is_refused() {
    let dir = TestDir::new("newer-db");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let job_id = submit(
        &client,
        TaskSpec::Sha256 {
            text: "keep me".into(),
        },
    )
    .await;
    coordinator.shutdown().await.expect("clean shutdown");

    let db = dir.path().join(DATABASE_FILE);
    {
        let conn = rusqlite::Connection::open(&db).expect("open");
        conn.pragma_update(None, "user_version", 99)
            .expect("bump schema version");
    }
    match try_start_coordinator(
        fast_config(),
        dir.path(),
        "127.0.0.1:0".parse().expect("addr"),
        "127.0.0.1:0".parse().expect("addr"),
    )
    .await
    {
        Err(CoordinatorError::Store(StoreError::NewerSchema { found, .. })) => {
            assert_eq!(found, 99)
        }
        Err(e) => panic!("expected a newer-schema refusal, got {e}"),
        Ok(_) => panic!("a coordinator started on a newer database"),
    }

    // Put the version back: the data is intact.
    {
        let conn = rusqlite::Connection::open(&db).expect("open");
        conn.pragma_update(None, "user_version", herder_runtime::store::SCHEMA_VERSION)
            .expect("restore schema version");
    }
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client =
        herder_runtime::client::HerderClient::new(client_config(coordinator.client_addr()));
    let job = status(&client, job_id).await;
    assert_eq!(
        job.task,
        TaskSpec::Sha256 {
            text: "keep me".into()
        }
    );
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_request_parameters_are_refused_with_typed_errors() {
    let dir = TestDir::new("bad-params");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let sha = TaskSpec::Sha256 { text: "x".into() };

    let submit_op = |max_attempts: Option<u32>, key: Option<String>| {
        Operation::Submit(herder_core::protocol::JobSubmission {
            timeout_millis: None,
            partitions: None,
            task: sha.to_json(),
            max_attempts,
            idempotency_key: key,
            ..Default::default()
        })
    };
    assert_eq!(
        server_error(client.call(submit_op(Some(101), None)).await),
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        server_error(client.call(submit_op(None, Some(String::new()))).await),
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        server_error(client.call(submit_op(None, Some("k".repeat(257)))).await),
        ErrorCode::InvalidRequest
    );
    // Text beyond the task limit (but within a frame) is an invalid task.
    let long = TaskSpec::Sha256 {
        text: "a".repeat(300 * 1024),
    };
    let op = Operation::Submit(herder_core::protocol::JobSubmission {
        timeout_millis: None,
        partitions: None,
        task: long.to_json(),
        max_attempts: None,
        idempotency_key: None,
        ..Default::default()
    });
    assert_eq!(server_error(client.call(op).await), ErrorCode::InvalidTask);
    assert!(
        client.list(None, None).await.expect("list").is_empty(),
        "nothing was created"
    );

    let job_id = submit(&client, sha.clone()).await;
    assert_eq!(
        server_error(client.wait(job_id, Some(u64::MAX)).await),
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        server_error(client.list(None, Some(1_000_000)).await),
        ErrorCode::InvalidRequest
    );
    assert_eq!(status(&client, job_id).await.state, JobState::Queued);

    coordinator.shutdown().await.expect("clean shutdown");
}

/// A request too large for one frame fails alone with a typed error: it is never reported as
/// ambiguous, never resent, nothing is created and the connection stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_larger_than_a_frame_fails_alone() {
    let dir = TestDir::new("unsendable");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let huge = TaskSpec::Sha256 {
        text: "a".repeat(2 * 1024 * 1024),
    };

    for key in [None, Some("huge-1".to_owned())] {
        let options = herder_runtime::client::SubmitOptions {
            timeout_millis: None,
            partitions: None,
            max_attempts: None,
            idempotency_key: key.clone(),
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        };
        let result = tokio::time::timeout(SHORT, client.submit(&huge, options))
            .await
            .unwrap_or_else(|_| {
                panic!("an unframeable submission (key {key:?}) must fail, not hang")
            });
        match result {
            Err(CallError::Client(ClientError::Unsendable { .. })) => {}
            other => panic!("expected Unsendable for key {key:?}, got {other:?}"),
        }
    }
    assert!(client
        .list(None, None)
        .await
        .expect("same connection still works")
        .is_empty());

    coordinator.shutdown().await.expect("clean shutdown");
}

/// A reply that cannot fit in one frame is answered with a typed REPLY_TOO_LARGE on the same,
/// still usable connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_too_large_for_a_frame_is_a_typed_error() {
    let dir = TestDir::new("reply-too-large");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let text = "word ".repeat(50 * 1024);
    for _ in 0..6 {
        submit(&client, TaskSpec::WordCount { text: text.clone() }).await;
    }
    assert_eq!(
        server_error(client.list(None, None).await),
        ErrorCode::ReplyTooLarge
    );
    let one = client
        .list(None, Some(1))
        .await
        .expect("a smaller list fits");
    assert_eq!(one.len(), 1);

    coordinator.shutdown().await.expect("clean shutdown");
}

/// Registrations the coordinator cannot accept are refused with a typed reason and a close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_registrations_are_refused() {
    let dir = TestDir::new("bad-register");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());

    let cases = [
        ("zero-capacity", 0, "capacity 0"),
        ("huge-capacity", 1_000_000, "capacity 1000000"),
        ("bad id!", 1, "an id with a space and '!'"),
        ("", 1, "an empty id"),
    ];
    for (id, capacity, what) in cases {
        let mut stream = TcpStream::connect(coordinator.worker_addr())
            .await
            .expect("connect");
        let register = WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: herder_core::ids::WorkerId(id.to_owned()),
            incarnation: fresh_incarnation(),
            capacity,
            prefetch: 0,
            running: Vec::new(),
            finished: Vec::new(),
            queues: None,
        };
        stream.write_all(&frame(&register)).await.expect("write");
        match read_one::<CoordinatorToWorker>(&mut stream, SHORT).await {
            Some(CoordinatorToWorker::RegisterRejected { reason, message }) => {
                assert_eq!(
                    reason,
                    herder_core::protocol::RegisterRejection::InvalidRegistration,
                    "{what}"
                );
                assert!(!message.is_empty());
            }
            other => panic!("{what}: expected REGISTER_REJECTED, got {other:?}"),
        }
        expect_eof(&mut stream, SHORT, what).await;
    }
    assert!(
        client.workers().await.expect("workers").is_empty(),
        "nobody was registered"
    );

    coordinator.shutdown().await.expect("clean shutdown");
}

/// A coordinator configured with a smaller frame limit than the client refuses an oversized
/// request frame. The client must surface an error for that request and stay usable; it must
/// not resend the same oversized frame forever (a keyed submission is "safe to resend", which
/// makes this a trap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_coordinators_frame_limit_fails_instead_of_being_resent_forever() {
    let dir = TestDir::new("small-frames");
    let config = herder_core::coordinator::CoordinatorConfig {
        max_frame_bytes: 64 * 1024,
        ..fast_config()
    };
    let coordinator = start_coordinator(config, dir.path()).await;
    let client = client(coordinator.client_addr());
    // A valid task (under the task text limit) whose frame exceeds the coordinator's limit.
    let task = TaskSpec::Sha256 {
        text: "a".repeat(100 * 1024),
    };

    for key in [None, Some("big-but-keyed".to_owned())] {
        let options = herder_runtime::client::SubmitOptions {
            timeout_millis: None,
            partitions: None,
            max_attempts: None,
            idempotency_key: key.clone(),
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        };
        let result = tokio::time::timeout(SHORT, client.submit(&task, options))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "a submission (key {key:?}) over the coordinator's frame limit got no answer within {SHORT:?}: \
                     the client keeps reconnecting and resending it"
                )
            });
        assert!(result.is_err(), "key {key:?}: {result:?}");
    }
    let jobs = tokio::time::timeout(SHORT, client.list(None, None))
        .await
        .expect("the client is still usable")
        .expect("list");
    assert!(jobs.is_empty(), "nothing was created: {jobs:?}");

    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_beyond_the_ports_bound_is_told_why_and_a_closed_one_frees_its_place() {
    let dir = TestDir::new("connection-bound");
    let coordinator = herder_runtime::coordinator::start(CoordinatorOptions {
        config: fast_config(),
        data_dir: dir.path().to_owned(),
        worker_addr: "127.0.0.1:0".parse().expect("an address"),
        client_addr: "127.0.0.1:0".parse().expect("an address"),
        peer_addr: None,
        peers: Default::default(),
        seed: None,
        limits: ConnectionLimits {
            per_port: 2,
            ..ConnectionLimits::default()
        },
        credentials: Default::default(),
    })
    .await
    .expect("coordinator starts");
    let (client_addr, worker_addr) = (coordinator.client_addr(), coordinator.worker_addr());
    // Two idle connections fill each port.
    let first = TcpStream::connect(client_addr).await.expect("connect");
    let _second = TcpStream::connect(client_addr).await.expect("connect");
    let _workers = [
        TcpStream::connect(worker_addr).await.expect("connect"),
        TcpStream::connect(worker_addr).await.expect("connect"),
    ];
    // A third gets a typed error, then the close, on either port.
    let mut refused = TcpStream::connect(client_addr).await.expect("connect");
    match read_one::<ClientReply>(&mut refused, SHORT).await {
        Some(ClientReply::Error {
            code, request_id, ..
        }) => {
            assert_eq!(code, ErrorCode::TooManyConnections);
            assert_eq!(request_id, None);
        }
        other => panic!("expected TOO_MANY_CONNECTIONS, got {other:?}"),
    }
    expect_eof(&mut refused, SHORT, "a refused client connection").await;
    let mut refused = TcpStream::connect(worker_addr).await.expect("connect");
    match read_one::<CoordinatorToWorker>(&mut refused, SHORT).await {
        Some(CoordinatorToWorker::Error { code, .. }) => {
            assert_eq!(code, ErrorCode::TooManyConnections)
        }
        other => panic!("expected TOO_MANY_CONNECTIONS, got {other:?}"),
    }
    expect_eof(&mut refused, SHORT, "a refused worker connection").await;
    // The client library reports it as the coordinator's refusal, not as silence.
    let unknown: JobId = "00000000-0000-4000-8000-000000000001"
        .parse()
        .expect("uuid");
    let refused_call = client(client_addr).status(unknown).await;
    assert!(
        format!("{refused_call:?}").contains("TooManyConnections"),
        "{refused_call:?}"
    );
    // Closing one frees its place for the next client (the coordinator learns of the close
    // asynchronously, so this asks again, a bounded number of times).
    drop(first);
    let mut answered = None;
    for _ in 0..100 {
        answered = Some(client(client_addr).status(unknown).await);
        if let Some(Err(CallError::Client(ClientError::Server {
            code: ErrorCode::JobNotFound,
            ..
        }))) = &answered
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        matches!(
            answered,
            Some(Err(CallError::Client(ClientError::Server {
                code: ErrorCode::JobNotFound,
                ..
            })))
        ),
        "a freed place serves the next client: {answered:?}"
    );
    coordinator.shutdown().await.expect("clean shutdown");
}
