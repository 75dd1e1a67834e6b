//! TLS over real TCP: jobs run end to end with every port encrypted; each refusal of the
//! credentials tests holds inside TLS too; a side that speaks the wrong protocol, or trusts the
//! wrong CA, is refused with a typed error; the peer link wants a certificate of the group's
//! CA; a reload takes new certificates without a restart.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use herder_core::auth::{ClientToken, Secret, TokenTable};
use herder_core::client::ClientError;
use herder_core::ids::RequestId;
use herder_core::job::JobState;
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::protocol::{ClientReply, ClientRequest, ErrorCode};
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_core::worker::WorkerConfig;
use herder_runtime::auth::{ServerCredentials, Tokens};
use herder_runtime::client::CallError;
use herder_runtime::coordinator::CoordinatorHandle;
use herder_runtime::tls::{throwaway, ClientTls, ServerTls, TlsFiles};
use herder_runtime::worker::{self, WorkerHandle, WorkerOptions};
use herder_runtime::HerderClient;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const WORKER_SECRET: &str = "worker-secret-for-tls-tests-012345";
const PEER_SECRET: &str = "peer-secret-for-tls-tests-0123456789";
const SUBMITTER: &str = "submitter-token-for-tls-tests-0123";
const READER: &str = "reader-token-for-tls-tests-01234567";

fn hosts() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into()]
}

fn secret(text: &str) -> Arc<Secret> {
    Arc::new(Secret::from_text(text).expect("a valid secret"))
}

fn credentials(tls: &TlsFiles) -> ServerCredentials {
    let table = TokenTable::parse(&format!("ci submitter {SUBMITTER}\ndash reader {READER}\n"))
        .expect("a valid tokens file");
    ServerCredentials {
        worker_secret: Some(secret(WORKER_SECRET)),
        peer_secret: Some(secret(PEER_SECRET)),
        client_tokens: Some(Tokens::new(table)),
        tls: Some(ServerTls::load(tls.clone()).expect("the files load")),
    }
}

fn trusting(files: &TlsFiles) -> ClientTls {
    ClientTls::with_ca_file(files.ca.as_deref().expect("a CA")).expect("the CA loads")
}

fn client_with(addr: SocketAddr, token: &str, tls: Option<ClientTls>) -> HerderClient {
    let token = Arc::new(ClientToken::from_text(token).expect("a valid token"));
    HerderClient::secured(
        client_config(addr),
        FRAME_BYTES_MAX_DEFAULT,
        Some(token),
        tls,
    )
    .with_call_timeout(SHORT)
}

fn worker_with(id: &str, addr: SocketAddr, secret_text: &str, tls: ClientTls) -> WorkerHandle {
    let mut config = WorkerConfig::new(worker_id(id), 2, vec![addr.to_string()]);
    config.reconnect_base = Duration::from_millis(20);
    config.reconnect_max = Duration::from_millis(200);
    worker::start(WorkerOptions {
        secret: Some(secret(secret_text)),
        tls: Some(tls),
        ..WorkerOptions::new(config)
    })
    .expect("worker starts")
}

fn server_code(error: &CallError) -> Option<(ErrorCode, String)> {
    match error {
        CallError::Client(ClientError::Server { code, message, .. }) => {
            Some((*code, message.clone()))
        }
        _ => None,
    }
}

async fn start(dir: &Path, files: &TlsFiles) -> CoordinatorHandle {
    start_checking(fast_config(), dir, credentials(files)).await
}

#[tokio::test]
async fn jobs_run_end_to_end_with_every_port_encrypted_and_roles_still_hold() {
    let dir = TestDir::new("tls-e2e");
    let files = throwaway::write(&dir.path().join("tls"), &hosts()).expect("certificates");
    let coordinator = start(dir.path(), &files).await;
    let worker = worker_with(
        "w1",
        coordinator.worker_addr(),
        WORKER_SECRET,
        trusting(&files),
    );
    let submitter = client_with(coordinator.client_addr(), SUBMITTER, Some(trusting(&files)));
    let reader = client_with(coordinator.client_addr(), READER, Some(trusting(&files)));

    let text = "over TLS";
    let job = submit(&submitter, TaskSpec::Sha256 { text: text.into() }).await;
    let done = wait_terminal(&reader, job).await;
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(
        done.result,
        Some(TaskOutput::Sha256 {
            hex: sha256_hex(text)
        })
    );

    // A reader is still refused what writes, inside TLS as outside.
    let refused = reader
        .submit(&TaskSpec::Sha256 { text: "x".into() }, Default::default())
        .await
        .expect_err("a reader may not submit");
    assert_eq!(
        server_code(&refused).map(|(code, _)| code),
        Some(ErrorCode::Forbidden),
        "{refused}"
    );
    // A worker with the wrong secret gets through TLS but not the handshake.
    let impostor = worker_with(
        "w-impostor",
        coordinator.worker_addr(),
        "not-the-worker-secret-0123456789abc",
        trusting(&files),
    );
    eventually("the impostor is refused", SHORT, || async {
        let refused = auth_refusals(&coordinator, "worker").await;
        if refused > 0 {
            Ok(())
        } else {
            Err(format!("{refused} refusals"))
        }
    })
    .await;
    let workers = reader.workers().await.expect("a reader lists workers");
    assert!(
        workers.iter().all(|w| w.id.as_str() != "w-impostor"),
        "the impostor never registered: {workers:?}"
    );
    impostor.drain().await;
    worker.drain().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn a_side_that_speaks_the_wrong_protocol_or_trusts_another_ca_is_refused_typed() {
    let dir = TestDir::new("tls-mismatch");
    let files = throwaway::write(&dir.path().join("tls"), &hosts()).expect("certificates");
    let other = throwaway::write(&dir.path().join("other"), &hosts()).expect("certificates");
    let coordinator = start(dir.path(), &files).await;

    // Plain text to a TLS port: answered in the client protocol, saying what is wanted.
    let mut stream = TcpStream::connect(coordinator.client_addr())
        .await
        .expect("connects");
    let workers = ClientRequest::Workers {
        request_id: RequestId(1),
    };
    stream.write_all(&frame(&workers)).await.expect("writes");
    match read_one::<ClientReply>(&mut stream, SHORT).await {
        Some(ClientReply::Error { code, message, .. }) => {
            assert_eq!(code, ErrorCode::Unauthenticated);
            assert!(message.contains("TLS"), "{message}");
        }
        other => panic!("expected ERROR UNAUTHENTICATED, got {other:?}"),
    }
    expect_eof(&mut stream, SHORT, "plain-text client").await;
    // The client library without TLS gets the same typed refusal.
    let plain = client_with(coordinator.client_addr(), SUBMITTER, None);
    let refused = plain.workers().await.expect_err("plain text is refused");
    let (code, message) = server_code(&refused).expect("a typed refusal");
    assert_eq!(code, ErrorCode::Unauthenticated);
    assert!(message.contains("TLS"), "{message}");

    // A client that trusts another CA does not accept this coordinator's certificate.
    let doubtful = client_with(coordinator.client_addr(), SUBMITTER, Some(trusting(&other)));
    let refused = doubtful.workers().await.expect_err("an unknown issuer");
    let (code, message) = server_code(&refused).expect("a typed refusal");
    assert_eq!(code, ErrorCode::Unauthenticated);
    assert!(message.contains("TLS"), "{message}");

    // A TLS client to a coordinator that speaks plain text is told so, not left waiting.
    let plain_dir = TestDir::new("tls-mismatch-plain");
    let plain_coordinator = start_coordinator(fast_config(), plain_dir.path()).await;
    let eager = client_with(
        plain_coordinator.client_addr(),
        SUBMITTER,
        Some(trusting(&files)),
    );
    let refused = eager.workers().await.expect_err("no TLS there");
    let (code, message) = server_code(&refused).expect("a typed refusal");
    assert_eq!(code, ErrorCode::Unauthenticated);
    assert!(message.contains("does not speak TLS"), "{message}");

    plain_coordinator.shutdown().await.expect("clean shutdown");
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn the_peer_link_wants_a_certificate_of_the_groups_ca() {
    let dir = TestDir::new("tls-peer");
    let files = throwaway::write(&dir.path().join("tls"), &hosts()).expect("certificates");
    let other = throwaway::write(&dir.path().join("other"), &hosts()).expect("certificates");
    let coordinator = start(dir.path(), &files).await;
    let peer_addr = coordinator.peer_addr().expect("a peer port");

    // Verifying the server but presenting no certificate: the server refuses the handshake.
    let no_certificate = trusting(&files);
    // A certificate of another CA, presented to a server it trusts.
    let stranger = ServerTls::load(TlsFiles {
        ca: files.ca.clone(),
        ..other.clone()
    })
    .expect("loads")
    .peer_client()
    .expect("a peer client");
    let before = auth_refusals(&coordinator, "peer").await;
    for (what, tls) in [
        ("no client certificate", no_certificate),
        ("a certificate of another CA", stranger),
    ] {
        let stream = TcpStream::connect(peer_addr).await.expect("connects");
        // TLS 1.3 finishes the client's side before the server has checked its certificate:
        // the refusal arrives as an alert on the first read.
        let outcome = match tls.connect(&peer_addr.to_string(), stream).await {
            Err(error) => Err(format!("{error:?}")),
            Ok(mut stream) => {
                use tokio::io::AsyncReadExt;
                let mut byte = [0u8; 1];
                match tokio::time::timeout(SHORT, stream.read(&mut byte)).await {
                    Ok(Ok(0)) => Err("closed".to_owned()),
                    Ok(Err(error)) => Err(error.to_string()),
                    Ok(Ok(_)) => Ok(()),
                    Err(_) => panic!("{what}: neither refused nor closed within {SHORT:?}"),
                }
            }
        };
        assert!(outcome.is_err(), "{what}: the peer port let it in");
    }
    let after = eventually("both refusals are counted", SHORT, || async {
        let now = auth_refusals(&coordinator, "peer").await;
        if now >= before + 2 {
            Ok(now)
        } else {
            Err(format!("{now} refusals, {before} before"))
        }
    })
    .await;
    assert_eq!(after, before + 2);
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn a_reload_serves_new_certificates_to_new_connections_without_a_restart() {
    let dir = TestDir::new("tls-reload");
    let live = dir.path().join("live");
    let files = throwaway::write(&live, &hosts()).expect("certificates");
    let first_ca = ClientTls::with_ca_file(files.ca.as_deref().expect("a CA")).expect("loads");
    let credentials = credentials(&files);
    let tls = credentials.tls.clone().expect("TLS");
    let coordinator = start_checking(fast_config(), dir.path(), credentials).await;
    let before = client_with(coordinator.client_addr(), READER, Some(first_ca.clone()));
    before.workers().await.expect("the first CA is trusted");

    // New material from a new CA replaces the files in place.
    let next = throwaway::write(&dir.path().join("next"), &hosts()).expect("certificates");
    for (from, to) in [
        (&next.cert, &files.cert),
        (&next.key, &files.key),
        (
            next.ca.as_ref().expect("CA"),
            files.ca.as_ref().expect("CA"),
        ),
    ] {
        std::fs::copy(from, to).expect("replace a file");
    }
    tls.reload().expect("the new files load");
    let second_ca = ClientTls::with_ca_file(files.ca.as_deref().expect("a CA")).expect("loads");
    let after = client_with(coordinator.client_addr(), READER, Some(second_ca));
    after
        .workers()
        .await
        .expect("the new certificate is served");
    let stale = client_with(coordinator.client_addr(), READER, Some(first_ca));
    let refused = stale
        .workers()
        .await
        .expect_err("the old CA no longer verifies");
    assert_eq!(
        server_code(&refused).map(|(code, _)| code),
        Some(ErrorCode::Unauthenticated)
    );

    // A broken file is refused whole; what was loaded stays in force.
    std::fs::write(&files.cert, "not a certificate").expect("break the file");
    assert!(tls.reload().is_err());
    let still = client_with(
        coordinator.client_addr(),
        READER,
        Some(ClientTls::with_ca_file(next.ca.as_deref().expect("CA")).expect("loads")),
    );
    still
        .workers()
        .await
        .expect("the last good certificate is still served");
    coordinator.shutdown().await.expect("clean shutdown");
}
