//! Credentials over real TCP: every port refuses a connection that does not prove its
//! credential, with a typed error, and nothing a refused connection sends changes any state;
//! a token's role bounds what its holder may ask.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use herder_core::auth::{
    AuthReply, AuthRequest, ClientToken, Nonce, Proof, Secret, SecretLink, TokenTable,
};
use herder_core::client::ClientError;
use herder_core::ids::{Incarnation, NodeId, WorkerId};
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::protocol::{
    ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode, PeerMessage, WorkerToCoordinator,
};
use herder_core::tasks::TaskSpec;
use herder_core::worker::WorkerConfig;
use herder_runtime::auth::{ServerCredentials, Tokens};
use herder_runtime::client::CallError;
use herder_runtime::coordinator::CoordinatorHandle;
use herder_runtime::worker::{self, WorkerHandle, WorkerOptions};
use herder_runtime::HerderClient;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const WORKER_SECRET: &str = "worker-secret-for-tests-0123456789";
const PEER_SECRET: &str = "peer-secret-for-tests-0123456789ab";
const ADMIN: &str = "admin-token-for-tests-0123456789";
const SUBMITTER: &str = "submitter-token-for-tests-01234567";
const READER: &str = "reader-token-for-tests-0123456789a";

fn secret(text: &str) -> Arc<Secret> {
    Arc::new(Secret::from_text(text).expect("a valid secret"))
}

fn credentials() -> ServerCredentials {
    let table = TokenTable::parse(&format!(
        "ops admin {ADMIN}\nci submitter {SUBMITTER}\ndash reader {READER}\n"
    ))
    .expect("a valid tokens file");
    ServerCredentials {
        worker_secret: Some(secret(WORKER_SECRET)),
        peer_secret: Some(secret(PEER_SECRET)),
        client_tokens: Some(Tokens::new(table)),
        tls: None,
    }
}

async fn start(dir: &TestDir, credentials: ServerCredentials) -> CoordinatorHandle {
    start_checking(fast_config(), dir.path(), credentials).await
}

fn client_with(addr: SocketAddr, token: Option<&str>) -> HerderClient {
    let token = token.map(|t| Arc::new(ClientToken::from_text(t).expect("a valid token")));
    HerderClient::with_token(client_config(addr), FRAME_BYTES_MAX_DEFAULT, token)
        .with_call_timeout(SHORT)
}

fn worker_with(id: &str, addr: SocketAddr, secret_text: Option<&str>) -> WorkerHandle {
    let mut config = WorkerConfig::new(worker_id(id), 2, vec![addr.to_string()]);
    config.reconnect_base = Duration::from_millis(20);
    config.reconnect_max = Duration::from_millis(200);
    worker::start(WorkerOptions {
        secret: secret_text.map(secret),
        ..WorkerOptions::new(config)
    })
    .expect("worker starts")
}

fn server_code(error: &CallError) -> Option<ErrorCode> {
    match error {
        CallError::Client(ClientError::Server { code, .. }) => Some(*code),
        _ => None,
    }
}

#[tokio::test]
async fn each_role_does_what_it_may_and_is_refused_the_rest() {
    let dir = TestDir::new("auth-roles");
    let coordinator = start(&dir, credentials()).await;
    let worker = worker_with("w1", coordinator.worker_addr(), Some(WORKER_SECRET));
    let submitter = client_with(coordinator.client_addr(), Some(SUBMITTER));
    let reader = client_with(coordinator.client_addr(), Some(READER));

    let job = submit(&submitter, TaskSpec::Sha256 { text: "abc".into() }).await;
    let done = wait_terminal(&reader, job).await;
    assert_eq!(done.state, herder_core::job::JobState::Completed);

    // A reader reads, and is refused anything that writes; nothing is created.
    let refused = reader
        .submit(&TaskSpec::Sha256 { text: "x".into() }, Default::default())
        .await
        .expect_err("a reader may not submit");
    assert_eq!(
        server_code(&refused),
        Some(ErrorCode::Forbidden),
        "{refused}"
    );
    let refused = reader
        .cancel(job)
        .await
        .expect_err("a reader may not cancel");
    assert_eq!(
        server_code(&refused),
        Some(ErrorCode::Forbidden),
        "{refused}"
    );
    // The same connection keeps working after a refusal.
    let listed = reader.list(None, Some(100)).await.expect("a reader lists");
    assert_eq!(listed.len(), 1, "the refused submission created nothing");

    // Purging needs an admin.
    let refused = submitter
        .purge(None, Duration::ZERO)
        .await
        .expect_err("a submitter may not purge");
    assert_eq!(
        server_code(&refused),
        Some(ErrorCode::Forbidden),
        "{refused}"
    );
    let admin = client_with(coordinator.client_addr(), Some(ADMIN));
    let (purged, _) = admin
        .purge(None, Duration::ZERO)
        .await
        .expect("an admin purges");
    assert_eq!(purged, 1);

    worker.drain().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn a_client_without_a_valid_token_is_refused_at_once() {
    let dir = TestDir::new("auth-clients");
    let coordinator = start(&dir, credentials()).await;
    for token in [None, Some("not-a-token-of-this-group-0123456789")] {
        let client = client_with(coordinator.client_addr(), token);
        let refused = client.workers().await.expect_err("refused");
        assert_eq!(
            server_code(&refused),
            Some(ErrorCode::Unauthenticated),
            "token {token:?}: {refused}"
        );
    }

    // On the wire: a request without a handshake is answered in the client protocol, then
    // the connection is closed.
    let mut stream = TcpStream::connect(coordinator.client_addr())
        .await
        .expect("connects");
    let workers = ClientRequest::Workers {
        request_id: herder_core::ids::RequestId(1),
    };
    stream.write_all(&frame(&workers)).await.expect("writes");
    match read_one::<ClientReply>(&mut stream, SHORT).await {
        Some(ClientReply::Error { code, message, .. }) => {
            assert_eq!(code, ErrorCode::Unauthenticated);
            assert!(message.contains("AUTH_TOKEN"), "{message}");
        }
        other => panic!("expected ERROR UNAUTHENTICATED, got {other:?}"),
    }
    expect_eof(&mut stream, SHORT, "refused client").await;
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn an_impostor_worker_gets_no_work_and_changes_nothing() {
    let dir = TestDir::new("auth-workers");
    let coordinator = start(&dir, credentials()).await;
    let admin = client_with(coordinator.client_addr(), Some(ADMIN));

    // A worker holding the wrong secret never registers (it finds the coordinator unproven).
    let impostor = worker_with(
        "impostor",
        coordinator.worker_addr(),
        Some("a-wrong-secret-0123456789abcdef"),
    );
    // A worker with no secret at all sends REGISTER straight away: refused in the worker
    // protocol, and closed.
    let mut stream = TcpStream::connect(coordinator.worker_addr())
        .await
        .expect("connects");
    let register = WorkerToCoordinator::Register {
        worker_id: WorkerId("bare".into()),
        incarnation: Incarnation(7),
        capacity: 4,
        running: Vec::new(),
        finished: Vec::new(),
        tasks: Vec::new(),
        draining: false,
        prefetch: 0,
        queues: None,
    };
    stream.write_all(&frame(&register)).await.expect("writes");
    match read_one::<CoordinatorToWorker>(&mut stream, SHORT).await {
        Some(CoordinatorToWorker::Error { code, .. }) => {
            assert_eq!(code, ErrorCode::Unauthenticated)
        }
        other => panic!("expected ERROR UNAUTHENTICATED, got {other:?}"),
    }
    expect_eof(&mut stream, SHORT, "refused worker").await;

    // One that guesses a proof is refused too.
    let mut stream = TcpStream::connect(coordinator.worker_addr())
        .await
        .expect("connects");
    let hello = AuthRequest::AuthHello {
        link: SecretLink::Worker,
        nonce: Nonce([9; 32]),
    };
    stream.write_all(&frame(&hello)).await.expect("writes");
    assert!(matches!(
        read_one::<AuthReply>(&mut stream, SHORT).await,
        Some(AuthReply::AuthChallenge { .. })
    ));
    let guess = AuthRequest::AuthProof {
        proof: Proof([1; 32]),
    };
    stream.write_all(&frame(&guess)).await.expect("writes");
    assert!(matches!(
        read_one::<AuthReply>(&mut stream, SHORT).await,
        Some(AuthReply::AuthError {
            code: ErrorCode::Unauthenticated,
            ..
        })
    ));
    expect_eof(&mut stream, SHORT, "guessing worker").await;

    // The impostor worker has been refused too (the two raw connections, and it at least once)
    // and nothing registered; a job submitted meanwhile waits for a real worker.
    eventually("three refusals on the worker port", SHORT, || async {
        let seen = auth_refusals(&coordinator, "worker").await;
        if seen >= 3 {
            Ok(())
        } else {
            Err(format!("{seen} so far"))
        }
    })
    .await;
    let job = submit(&admin, TaskSpec::Sha256 { text: "abc".into() }).await;
    assert!(admin.workers().await.expect("lists workers").is_empty());
    assert_eq!(
        status(&admin, job).await.state,
        herder_core::job::JobState::Queued
    );
    let honest = worker_with("honest", coordinator.worker_addr(), Some(WORKER_SECRET));
    assert_eq!(
        wait_terminal(&admin, job).await.state,
        herder_core::job::JobState::Completed
    );

    impostor.drain().await;
    honest.drain().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn the_peer_port_refuses_a_stranger_before_its_hello() {
    let dir = TestDir::new("auth-peers");
    let coordinator = start(&dir, credentials()).await;
    let peer_addr = coordinator.peer_addr().expect("a peer port");
    let mut stream = TcpStream::connect(peer_addr).await.expect("connects");
    let hello = PeerMessage::Hello {
        node_id: NodeId("c9".into()),
        client_address: "127.0.0.1:1".into(),
        worker_address: "127.0.0.1:2".into(),
    };
    let mut bytes = Vec::new();
    herder_core::protocol::codec::encode_binary_frame(&hello, 4096, &mut bytes).expect("frames");
    stream.write_all(&bytes).await.expect("writes");
    // The binary HELLO is no handshake message: refused with a typed error, then closed.
    match read_one::<AuthReply>(&mut stream, SHORT).await {
        Some(AuthReply::AuthError { code, .. }) => assert_eq!(code, ErrorCode::Unauthenticated),
        other => panic!("expected AUTH_ERROR, got {other:?}"),
    }
    expect_eof(&mut stream, SHORT, "refused peer").await;
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn a_coordinator_that_checks_nothing_is_not_trusted_by_a_side_with_a_credential() {
    let dir = TestDir::new("auth-unchecked");
    let coordinator = start(&dir, ServerCredentials::default()).await;
    // It cannot prove it holds the worker secret, so a worker will not work for it...
    let mut stream = TcpStream::connect(coordinator.worker_addr())
        .await
        .expect("connects");
    let credential = herder_core::auth::Credential::Secret {
        link: SecretLink::Worker,
        secret: secret(WORKER_SECRET),
    };
    match herder_runtime::auth::initiate(&mut stream, credential).await {
        Err(herder_runtime::auth::InitiateFailure::Refused(error)) => {
            assert!(
                error.to_string().contains("checks no credentials"),
                "{error}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // ...and a client's token is not sent into the void: the call fails, typed.
    let careful = client_with(coordinator.client_addr(), Some(SUBMITTER));
    let refused = careful.workers().await.expect_err("refused");
    assert_eq!(
        server_code(&refused),
        Some(ErrorCode::Unauthenticated),
        "{refused}"
    );
    coordinator.shutdown().await.expect("clean shutdown");
}
