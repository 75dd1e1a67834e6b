//! The HTTP API against real coordinators and workers on loopback: every endpoint, its typed
//! errors for bad input, and a follower's answers (it relays to the leader).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use herder_core::coordinator::CoordinatorConfig;
use herder_core::ids::{NodeId, WorkerId};
use herder_core::worker::WorkerConfig;
use herder_http::{HttpOptions, HttpServer};
use herder_runtime::auth::ServerCredentials;
use herder_runtime::coordinator::{self, CoordinatorOptions};
use herder_runtime::testing::{LocalGroup, TestDir};
use herder_runtime::tls::{throwaway, ClientTls, ServerTls, Stream, TlsFiles};
use herder_runtime::worker::{self, WorkerHandle, WorkerOptions};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest any one exchange in these tests may take before the test fails.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(20);

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn config(id: &str, peers: Vec<NodeId>) -> CoordinatorConfig {
    CoordinatorConfig {
        node_id: NodeId(id.to_owned()),
        peers,
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(1_000),
        retry_base: Duration::from_millis(10),
        retry_max: Duration::from_millis(50),
        election_timeout_min: Duration::from_millis(150),
        election_timeout_max: Duration::from_millis(300),
        replication_heartbeat: Duration::from_millis(30),
        ..CoordinatorConfig::default()
    }
}

/// A group of `size` coordinators (one is a group of one), each with its HTTP server, and one
/// worker serving the built-in tasks.
struct Cluster {
    /// The coordinators, started by the shared in-process launcher.
    _group: LocalGroup,
    /// Each member's HTTP server.
    members: Vec<HttpServer>,
    /// How a caller verifies the HTTPS ports, when the group speaks TLS.
    tls: Option<ClientTls>,
    _worker: WorkerHandle,
}

impl Cluster {
    async fn start(size: usize) -> Cluster {
        Cluster::start_with(size, None).await
    }

    /// With `tls`, every member serves it on every port (mutual on the peer link), and the
    /// worker and the test's requests verify it.
    async fn start_with(size: usize, tls: Option<TlsFiles>) -> Cluster {
        let server_tls = tls
            .clone()
            .map(|files| ServerTls::load(files).expect("the TLS files load"));
        let client_tls = tls.as_ref().map(|files| {
            ClientTls::with_ca_file(files.ca.as_deref().expect("a CA")).expect("the CA loads")
        });
        let credentials = ServerCredentials {
            tls: server_tls.clone(),
            ..Default::default()
        };
        let group = LocalGroup::start(size, |id, peers| config(&id.0, peers), credentials)
            .await
            .expect("the group starts");
        let client_addrs = group.client_addrs();
        let worker_addrs = group.worker_addrs();
        let mut members = Vec::new();
        for (n, member) in group.members.iter().enumerate() {
            let handle = member.handle.as_ref().expect("a member just started");
            let dial = herder_http::own_first(&client_addrs, n);
            let listener = herder_http::bind(any_port()).await.expect("http bind");
            let server = herder_http::serve(
                listener,
                HttpOptions {
                    node_id: member.id.clone(),
                    coordinators: dial,
                    observer: Some(handle.observer()),
                    max_body_bytes: 64 * 1024,
                    tokens: None,
                    tls: server_tls.clone(),
                },
            )
            .expect("http serves");
            members.push(server);
        }
        let worker = worker::start(WorkerOptions {
            tls: client_tls.clone(),
            ..WorkerOptions::new(WorkerConfig::new(
                WorkerId("worker-1".into()),
                2,
                worker_addrs,
            ))
        })
        .expect("worker starts");
        let cluster = Cluster {
            _group: group,
            members,
            tls: client_tls,
            _worker: worker,
        };
        cluster.until_a_worker_is_alive().await;
        cluster
    }

    fn http(&self, n: usize) -> SocketAddr {
        self.members[n].local_addr()
    }

    async fn until_a_worker_is_alive(&self) {
        let deadline = tokio::time::Instant::now() + EXCHANGE_TIMEOUT;
        loop {
            let answer = self.request(0, "GET", "/api/v1/workers", None).await;
            let alive = answer.status == 200
                && answer.json["workers"]
                    .as_array()
                    .is_some_and(|w| w.iter().any(|w| w["alive"] == json!(true)));
            if alive {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no worker registered: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Cluster {
    /// One exchange with member `n`'s HTTP port, over TLS if the group speaks it.
    async fn request(&self, n: usize, method: &str, path: &str, body: Option<&str>) -> Answer {
        exchange(
            self.http(n),
            self.tls.as_ref(),
            method,
            path,
            body,
            "application/json",
        )
        .await
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: String,
    json: Value,
    body: String,
}

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`, so the answer ends at EOF).
async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Answer {
    request_with_type(addr, method, path, body, "application/json").await
}

async fn request_with_type(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    content_type: &str,
) -> Answer {
    exchange(addr, None, method, path, body, content_type).await
}

async fn exchange(
    addr: SocketAddr,
    tls: Option<&ClientTls>,
    method: &str,
    path: &str,
    body: Option<&str>,
    content_type: &str,
) -> Answer {
    let exchange = async {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let mut stream = match tls {
            None => Stream::Plain(tcp),
            Some(tls) => tls
                .connect(&addr.to_string(), tcp)
                .await
                .expect("the TLS handshake succeeds"),
        };
        let body = body.unwrap_or("");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        stream.write_all(body.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("read");
        String::from_utf8_lossy(&raw).into_owned()
    };
    let raw = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer"));
    let (headers, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Answer {
        status,
        headers: headers.to_ascii_lowercase(),
        json: serde_json::from_str(body).unwrap_or(Value::Null),
        body: body.to_owned(),
    }
}

fn job_id_of(answer: &Answer) -> String {
    answer.json["job_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no job id in {answer:?}"))
        .to_owned()
}

async fn submit(addr: SocketAddr, task: Value) -> String {
    let answer = request(
        addr,
        "POST",
        "/api/v1/jobs",
        Some(&json!({ "task": task }).to_string()),
    )
    .await;
    assert_eq!(answer.status, 201, "{answer:?}");
    job_id_of(&answer)
}

/// Long-polls until `id` is terminal; it must have completed.
async fn wait_completed(addr: SocketAddr, id: &str) -> Answer {
    let path = format!("/api/v1/jobs/{id}/wait?timeout_millis=20000");
    let waited = request(addr, "GET", &path, None).await;
    assert_eq!(waited.status, 200, "{waited:?}");
    assert_eq!(waited.json["state"], json!("COMPLETED"), "{waited:?}");
    waited
}

fn error_code(answer: &Answer) -> &str {
    answer.json["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_answered_job_by_job_and_a_bad_one_creates_nothing() {
    // A batch: one result per job, in order, the key answered as by a single submission; a
    // bad job fails the whole batch and creates nothing.
    let cluster = Cluster::start(1).await;
    let http = cluster.http(0);
    let keyed = json!({"task": {"kind": "sha256", "text": "abc"}, "idempotency_key": "k1", "max_attempts": 2});
    let first = request(http, "POST", "/api/v1/jobs", Some(&keyed.to_string())).await;
    let id = job_id_of(&first);
    let batch = json!({"jobs": [
        {"task": {"kind": "sha256", "text": "batch"}},
        {"task": {"kind": "sha256", "text": "abc"}, "idempotency_key": "k1", "max_attempts": 2},
    ]});
    let answer = request(http, "POST", "/api/v1/jobs/batch", Some(&batch.to_string())).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let results = answer.json["results"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(results.len(), 2, "{answer:?}");
    assert_eq!(results[0]["outcome"], json!("ACCEPTED"));
    assert_eq!(results[0]["existing"], json!(false));
    assert_eq!(results[1]["existing"], json!(true));
    assert_eq!(results[1]["job_id"], json!(id));
    let batched = results[0]["job_id"].as_str().unwrap_or_default().to_owned();
    wait_completed(http, &batched).await;
    let bad = json!({"jobs": [{"task": {"kind": "sha256", "text": "fine"}}, {"task": {"kind": "sha256"}}]});
    let refused = request(http, "POST", "/api/v1/jobs/batch", Some(&bad.to_string())).await;
    assert_eq!(
        (refused.status, error_code(&refused)),
        (400, "INVALID_TASK"),
        "{refused:?}"
    );
    let listed = request(http, "GET", "/api/v1/jobs", None).await;
    assert_eq!(
        listed.json["jobs"].as_array().map(Vec::len),
        Some(2),
        "the bad batch created nothing: {listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_with_the_cli_views() {
    let cluster = Cluster::start(1).await;
    let http = cluster.http(0);

    // Submit, with the new job's place in the Location header; a keyed resend is 200.
    let keyed = json!({"task": {"kind": "sha256", "text": "abc"}, "idempotency_key": "k1", "max_attempts": 2});
    let first = request(http, "POST", "/api/v1/jobs", Some(&keyed.to_string())).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.json["existing"], json!(false));
    let id = job_id_of(&first);
    assert!(first
        .headers
        .contains(&format!("location: /api/v1/jobs/{id}")));
    assert!(first.headers.contains("x-herder-node: c1"));
    let again = request(http, "POST", "/api/v1/jobs", Some(&keyed.to_string())).await;
    assert_eq!((again.status, job_id_of(&again)), (200, id.clone()));
    assert_eq!(again.json["existing"], json!(true));

    // Wait (long-poll) until it is done, then its status, with its history.
    let waited = wait_completed(http, &id).await;
    assert_eq!(waited.json["timed_out"], json!(false));
    let status = request(http, "GET", &format!("/api/v1/jobs/{id}"), None).await;
    assert_eq!(status.status, 200);
    let history = status.json["history"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(history.len(), 1, "{status:?}");
    assert_eq!(history[0]["outcome"], json!("completed"));
    assert_eq!(history[0]["worker"], json!("worker-1"));
    let created = status.json["created_at_unix_ms"].as_u64().unwrap_or(0);
    let started = status.json["first_started_at_unix_ms"]
        .as_u64()
        .unwrap_or(0);
    let finished = status.json["finished_at_unix_ms"].as_u64().unwrap_or(0);
    assert!(
        created > 0 && created <= started && started <= finished,
        "{status:?}"
    );
    assert_eq!(
        status.json["result"]["hex"],
        json!("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    );

    // Cancel a job that would run for ten minutes, then once more (already terminal).
    let long = submit(http, json!({"kind": "sleep", "milliseconds": 600_000})).await;
    let cancel = request(http, "POST", &format!("/api/v1/jobs/{long}/cancel"), None).await;
    assert_eq!(cancel.status, 200, "{cancel:?}");
    assert_eq!(cancel.json["cancelled"], json!(true));
    assert_eq!(cancel.json["job"]["state"], json!("CANCELLED"));
    let twice = request(http, "POST", &format!("/api/v1/jobs/{long}/cancel"), None).await;
    assert_eq!(twice.json["cancelled"], json!(false));

    // Retry the cancelled job as a new one; a completed job cannot be retried.
    let retry = request(http, "POST", &format!("/api/v1/jobs/{long}/retry"), None).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(retry.json["retry_of"], json!(long));
    let copy = job_id_of(&retry);
    assert_ne!(copy, long);
    let copy_view = request(http, "GET", &format!("/api/v1/jobs/{copy}"), None).await;
    assert_eq!(
        copy_view.json["task"],
        json!({"kind": "sleep", "milliseconds": 600_000})
    );
    let refused = request(http, "POST", &format!("/api/v1/jobs/{id}/retry"), None).await;
    assert_eq!(
        (refused.status, error_code(&refused)),
        (409, "NOT_RETRYABLE")
    );
    request(http, "POST", &format!("/api/v1/jobs/{copy}/cancel"), None).await;

    // List: newest first, filtered by state, paged with next_before.
    let all = request(http, "GET", "/api/v1/jobs", None).await;
    let ids: Vec<&str> = all.json["jobs"]
        .as_array()
        .map(|jobs| jobs.iter().filter_map(|j| j["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec![copy.as_str(), long.as_str(), id.as_str()]);
    assert_eq!(all.json["truncated"], json!(false));
    let page = request(http, "GET", "/api/v1/jobs?limit=2", None).await;
    assert_eq!(page.json["truncated"], json!(true));
    assert_eq!(page.json["next_before"], json!(long));
    let next = request(
        http,
        "GET",
        &format!("/api/v1/jobs?limit=2&before={long}"),
        None,
    )
    .await;
    assert_eq!(next.json["jobs"][0]["id"], json!(id));
    assert_eq!(next.json["truncated"], json!(false));
    let cancelled = request(http, "GET", "/api/v1/jobs?state=cancelled", None).await;
    assert_eq!(cancelled.json["jobs"].as_array().map(Vec::len), Some(2));

    // Workers and the cluster.
    let workers = request(http, "GET", "/api/v1/workers", None).await;
    assert_eq!(workers.json["workers"][0]["id"], json!("worker-1"));
    assert!(workers.json["workers"][0]["tasks"]
        .as_array()
        .is_some_and(|t| t.contains(&json!("sha256"))));
    let group = request(http, "GET", "/api/v1/cluster", None).await;
    assert_eq!(group.json["leader"], json!("c1"));
    assert_eq!(group.json["members"][0]["role"], json!("leader"));

    // Metrics count what happened.
    let metrics = request(http, "GET", "/metrics", None).await;
    assert_eq!(metrics.status, 200);
    assert!(metrics
        .headers
        .contains("content-type: application/openmetrics-text; version=1.0.0"));
    // The sha256 job and the long sleep ran; the copy may have started before its cancel.
    let assignments: u64 = metrics
        .body
        .lines()
        .find_map(|l| l.strip_prefix("herder_assignments_total "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!((2..=3).contains(&assignments), "{}", metrics.body);
    assert!(metrics.body.contains("herder_jobs{state=\"CANCELLED\"} 2"));
    assert!(metrics
        .body
        .contains("herder_submissions_total{result=\"accepted\"} 3"));

    // Purge every terminal job: all three go.
    let purge = request(
        http,
        "POST",
        "/api/v1/purge",
        Some(r#"{"older_than_millis": 0}"#),
    )
    .await;
    assert_eq!(purge.status, 200, "{purge:?}");
    assert_eq!(
        (
            purge.json["purged"].clone(),
            purge.json["remaining"].clone()
        ),
        (json!(3), json!(0))
    );
    let gone = request(http, "GET", &format!("/api/v1/jobs/{id}"), None).await;
    assert_eq!((gone.status, error_code(&gone)), (404, "JOB_NOT_FOUND"));

    // The dashboard's files are served from the binary.
    let page = request(http, "GET", "/", None).await;
    assert!(page.status == 200 && page.headers.contains("text/html"));
    let script = request(http, "GET", "/assets/app.js", None).await;
    assert!(script.status == 200 && script.headers.contains("javascript"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_typed_errors_and_change_nothing() {
    let cluster = Cluster::start(1).await;
    let http = cluster.http(0);
    let unknown = "00000000-0000-4000-8000-000000000001";
    let cases: Vec<(&str, String, Option<&str>, u16, &str)> = vec![
        (
            "POST",
            "/api/v1/jobs".into(),
            Some("{not json"),
            400,
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/api/v1/jobs".into(),
            Some(r#"{"task": {"kind": "sha256", "text": "a"}, "colour": 1}"#),
            400,
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/api/v1/jobs".into(),
            Some(r#"{"task": {"kind": "sha256"}}"#),
            400,
            "INVALID_TASK",
        ),
        (
            "POST",
            "/api/v1/jobs".into(),
            Some(r#"{"task": {"kind": "sleep", "milliseconds": 1}, "max_attempts": 0}"#),
            400,
            "INVALID_REQUEST",
        ),
        (
            "GET",
            "/api/v1/jobs/not-a-uuid".into(),
            None,
            400,
            "INVALID_REQUEST",
        ),
        (
            "GET",
            format!("/api/v1/jobs/{unknown}"),
            None,
            404,
            "JOB_NOT_FOUND",
        ),
        (
            "POST",
            format!("/api/v1/jobs/{unknown}/cancel"),
            None,
            404,
            "JOB_NOT_FOUND",
        ),
        (
            "POST",
            format!("/api/v1/jobs/{unknown}/retry"),
            None,
            404,
            "JOB_NOT_FOUND",
        ),
        (
            "GET",
            format!("/api/v1/jobs/{unknown}/wait?timeout_millis=60001"),
            None,
            400,
            "INVALID_REQUEST",
        ),
        (
            "GET",
            format!("/api/v1/jobs/{unknown}/wait?timeout_millis=soon"),
            None,
            400,
            "INVALID_REQUEST",
        ),
        (
            "GET",
            "/api/v1/jobs?state=done".into(),
            None,
            400,
            "INVALID_REQUEST",
        ),
        (
            "GET",
            "/api/v1/jobs?limit=0".into(),
            None,
            400,
            "INVALID_REQUEST",
        ),
        (
            "GET",
            "/api/v1/jobs?limit=1001".into(),
            None,
            400,
            "INVALID_REQUEST",
        ),
        (
            "GET",
            format!("/api/v1/jobs?before={unknown}"),
            None,
            404,
            "JOB_NOT_FOUND",
        ),
        (
            "GET",
            "/api/v1/jobs?page=2".into(),
            None,
            400,
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/api/v1/purge".into(),
            Some(r#"{"state": "RUNNING", "older_than_millis": 0}"#),
            400,
            "INVALID_REQUEST",
        ),
        (
            "POST",
            "/api/v1/purge".into(),
            Some("{}"),
            400,
            "INVALID_REQUEST",
        ),
        ("GET", "/api/v2/jobs".into(), None, 404, "NOT_FOUND"),
        (
            "DELETE",
            "/api/v1/jobs".into(),
            None,
            405,
            "METHOD_NOT_ALLOWED",
        ),
        ("GET", "/assets/secrets.txt".into(), None, 404, "NOT_FOUND"),
    ];
    for (method, path, body, status, code) in cases {
        let answer = request(http, method, &path, body).await;
        assert_eq!(
            (answer.status, error_code(&answer)),
            (status, code),
            "{method} {path} {body:?}: {answer:?}"
        );
        assert!(
            answer.json["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{method} {path}: the error says why: {answer:?}"
        );
    }
    // A body larger than the limit, and one that is not JSON at all.
    let big = json!({"task": {"kind": "sha256", "text": "x".repeat(100 * 1024)}}).to_string();
    let answer = request(http, "POST", "/api/v1/jobs", Some(&big)).await;
    assert_eq!(
        (answer.status, error_code(&answer)),
        (413, "PAYLOAD_TOO_LARGE")
    );
    let answer =
        request_with_type(http, "POST", "/api/v1/jobs", Some("task=1"), "text/plain").await;
    assert_eq!(
        (answer.status, error_code(&answer)),
        (415, "INVALID_REQUEST")
    );
    // Nothing was created by any of it.
    let list = request(http, "GET", "/api/v1/jobs", None).await;
    assert_eq!(list.json["jobs"], json!([]), "{list:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_relays_to_the_leader() {
    let cluster = Cluster::start(3).await;
    // Find a follower by asking each member's own view.
    let mut follower = None;
    for n in 0..3 {
        let view = request(cluster.http(n), "GET", "/api/v1/cluster", None).await;
        if view.json["members"][0]["role"] == json!("follower") && !view.json["leader"].is_null() {
            follower = Some(n);
            break;
        }
    }
    let n = follower.expect("a follower that knows the leader");
    let http = cluster.http(n);
    let id = submit(http, json!({"kind": "word-count", "text": "one two three"})).await;
    let waited = wait_completed(http, &id).await;
    assert_eq!(waited.json["result"]["words"], json!(3));
    assert!(waited
        .headers
        .contains(&format!("x-herder-node: c{}", n + 1)));
    // The cluster view comes from every member, the follower's own first.
    let group = request(http, "GET", "/api/v1/cluster", None).await;
    assert_eq!(
        group.json["members"].as_array().map(Vec::len),
        Some(3),
        "{group:?}"
    );
    assert_eq!(
        group.json["members"][0]["node_id"],
        json!(format!("c{}", n + 1))
    );
    // Metrics describe this member: a follower, in the leader's term, with the entries applied.
    let metrics = request(http, "GET", "/metrics", None).await;
    assert!(
        metrics.body.contains("herder_is_leader 0"),
        "{}",
        metrics.body
    );
    assert!(!metrics.body.contains("herder_applied_index 0\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_over_tls_elects_a_leader_and_serves_https_from_any_member() {
    let dir = TestDir::new("https");
    let files = throwaway::write(dir.path(), &["127.0.0.1".to_owned()]).expect("certificates");
    // Election and replication run over mutual TLS; the worker and the HTTP servers' own
    // calls verify the members; the answers arrive over HTTPS from every member.
    let cluster = Cluster::start_with(3, Some(files)).await;
    let id = submit_over(&cluster, 2, json!({"kind": "word-count", "text": "a b"})).await;
    let path = format!("/api/v1/jobs/{id}/wait?timeout_millis=20000");
    let waited = cluster.request(1, "GET", &path, None).await;
    assert_eq!(waited.json["state"], json!("COMPLETED"), "{waited:?}");
    assert_eq!(waited.json["result"]["words"], json!(2));

    // The probes answer over HTTPS without a token: alive, and ready once a leader is known.
    for n in 0..3 {
        let alive = cluster.request(n, "GET", "/healthz", None).await;
        assert_eq!(alive.json["status"], json!("alive"), "{alive:?}");
        let ready = cluster.request(n, "GET", "/readyz", None).await;
        assert_eq!(ready.json["status"], json!("ready"), "{ready:?}");
    }

    // Plain HTTP to the HTTPS port is answered in plain HTTP, saying what is wanted.
    let plain = request(cluster.http(0), "GET", "/api/v1/cluster", None).await;
    assert_eq!(plain.status, 400, "{plain:?}");
    assert!(plain.body.contains("HTTPS"), "{plain:?}");
}

async fn submit_over(cluster: &Cluster, n: usize, task: Value) -> String {
    let body = json!({ "task": task }).to_string();
    let answer = cluster
        .request(n, "POST", "/api/v1/jobs", Some(&body))
        .await;
    assert_eq!(answer.status, 201, "{answer:?}");
    job_id_of(&answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_need_no_token_and_readiness_waits_for_a_leader() {
    // One member of a group of three whose others never start: alive, but never ready.
    let dir = TestDir::new("probes");
    let others: BTreeMap<NodeId, String> = [("c2", "127.0.0.1:9"), ("c3", "127.0.0.1:9")]
        .into_iter()
        .map(|(id, addr)| (NodeId(id.to_owned()), addr.to_owned()))
        .collect();
    let token = "probe-test-admin-token-0123456789";
    let tokens = herder_runtime::auth::Tokens::new(
        herder_core::auth::TokenTable::parse(&format!("ops admin {token}\n")).expect("tokens"),
    );
    let options = CoordinatorOptions {
        config: config("c1", others.keys().cloned().collect()),
        data_dir: dir.path().to_owned(),
        worker_addr: any_port(),
        client_addr: any_port(),
        peer_addr: Some(any_port()),
        peers: others,
        seed: None,
        limits: Default::default(),
        credentials: ServerCredentials {
            client_tokens: Some(tokens.clone()),
            ..Default::default()
        },
    };
    let handle = coordinator::start(options)
        .await
        .expect("coordinator starts");
    let listener = herder_http::bind(any_port()).await.expect("http bind");
    let server = herder_http::serve(
        listener,
        HttpOptions {
            node_id: NodeId("c1".into()),
            coordinators: vec![handle.client_addr().to_string()],
            observer: Some(handle.observer()),
            max_body_bytes: 64 * 1024,
            tokens: Some(tokens),
            tls: None,
        },
    )
    .expect("http serves");
    let http = server.local_addr();
    let alive = request(http, "GET", "/healthz", None).await;
    assert_eq!(alive.status, 200, "{alive:?}");
    let ready = request(http, "GET", "/readyz", None).await;
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(error_code(&ready), "UNAVAILABLE", "{ready:?}");
    // The API itself still wants the token.
    let jobs = request(http, "GET", "/api/v1/jobs", None).await;
    assert_eq!(jobs.status, 401, "{jobs:?}");
    server.shutdown();
    handle.shutdown().await.expect("clean shutdown");
}
