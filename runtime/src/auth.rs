//! Drives core's handshake machines (`herder_core::auth`) over a freshly opened TCP stream,
//! before the connection is handed to its owner: an accepted connection that does not prove
//! its credential never reaches the coordinator's driver, and a dialed one is handed over only
//! once the coordinator has proven itself (secret links) and accepted the credential.
//!
//! During the handshake frames are read exactly (header, then body), never beyond the last
//! handshake frame, and no frame may exceed [`HANDSHAKE_FRAME_BYTES_MAX`]; the whole handshake
//! must finish within a deadline. So a stranger costs the server one bounded buffer, one HMAC
//! and one connection slot for at most that long.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use herder_core::auth::{
    AcceptPolicy, Acceptor, AcceptorStep, AuthError, AuthReply, AuthRequest, Caller, Credential,
    Initiator, InitiatorStep, Nonce, Secret, SecretLink, TokenTable,
};
use herder_core::limits::HANDSHAKE_FRAME_BYTES_MAX;
use herder_core::protocol::codec::{decode_message, encode_frame, FrameError};
use herder_core::protocol::{ClientReply, CoordinatorToWorker, ErrorCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::tls::{ServerTls, Stream, TlsPort};

use crate::metrics::Metrics;

/// How long a dialing side waits for the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A refused handshake is logged at most once per remote address in this time.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);
/// Remote addresses the refusal log remembers; beyond it, addresses not heard from within
/// [`REFUSAL_LOG_EVERY`] are forgotten, and while it stays full new ones are counted, not logged.
pub const REFUSAL_LOG_ADDRESSES_MAX: usize = 4096;

/// The client tokens a coordinator checks, replaceable while it runs (a reload on SIGHUP):
/// connections that authenticate after a replacement are checked against the new table. Each
/// replacement raises a generation number, so whoever keeps something per token (the HTTP
/// server's clients) can tell it is stale.
#[derive(Clone, Debug)]
pub struct Tokens(Arc<RwLock<(u64, Arc<TokenTable>)>>);

impl Tokens {
    pub fn new(table: TokenTable) -> Tokens {
        Tokens(Arc::new(RwLock::new((0, Arc::new(table)))))
    }

    pub fn current(&self) -> Arc<TokenTable> {
        self.read().1
    }

    /// How many times the table has been replaced.
    pub fn generation(&self) -> u64 {
        self.read().0
    }

    fn read(&self) -> (u64, Arc<TokenTable>) {
        match self.0.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn replace(&self, table: TokenTable) {
        let table = Arc::new(table);
        let mut current = match self.0.write() {
            Ok(current) => current,
            Err(poisoned) => poisoned.into_inner(),
        };
        *current = (current.0 + 1, table);
    }
}

/// What a coordinator's ports check. A port with nothing configured checks nothing.
#[derive(Clone, Debug, Default)]
pub struct ServerCredentials {
    pub worker_secret: Option<Arc<Secret>>,
    pub peer_secret: Option<Arc<Secret>>,
    pub client_tokens: Option<Tokens>,
    /// TLS on every port (mutual on the peer link), if configured.
    pub tls: Option<ServerTls>,
}

impl ServerCredentials {
    /// What the port for `port` asks of a new connection, if anything.
    pub fn policy(&self, port: Port) -> Option<AcceptPolicy> {
        match port {
            Port::Worker => self
                .worker_secret
                .clone()
                .map(|secret| AcceptPolicy::Secret {
                    link: SecretLink::Worker,
                    secret,
                }),
            Port::Peer => self.peer_secret.clone().map(|secret| AcceptPolicy::Secret {
                link: SecretLink::Peer,
                secret,
            }),
            Port::Client => self
                .client_tokens
                .as_ref()
                .map(|tokens| AcceptPolicy::Tokens(tokens.current())),
        }
    }
}

/// The three kinds of port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Port {
    Worker,
    Client,
    Peer,
}

impl Port {
    pub fn as_str(self) -> &'static str {
        match self {
            Port::Worker => "worker",
            Port::Client => "client",
            Port::Peer => "peer",
        }
    }
}

/// Why an accepted connection was not handed over.
#[derive(Debug, thiserror::Error)]
pub enum AcceptFailure {
    /// The connection presented no valid credential; it was told why.
    #[error("{0}")]
    Refused(AuthError),
    #[error("no complete handshake within {0:?}")]
    TimedOut(Duration),
    /// The TLS handshake failed (no client certificate on the peer link, one the CA did not
    /// issue, a protocol mismatch).
    #[error("TLS: {0}")]
    Tls(String),
    #[error("{0}")]
    Broken(String),
}

/// A fresh nonce from the operating system's random source.
pub fn fresh_nonce() -> Result<Nonce, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness from the OS: {e}"))?;
    Ok(Nonce(bytes))
}

/// Runs what `port` asks of a freshly accepted connection, within `within`: TLS if the
/// coordinator speaks it, then the credential's handshake if the port checks one. A client
/// that speaks plain text to a TLS port is told so in its own protocol.
pub async fn admit(
    tcp: TcpStream,
    port: Port,
    credentials: &ServerCredentials,
    within: Duration,
) -> Result<(Stream, Caller), AcceptFailure> {
    let mut stream = match &credentials.tls {
        None => Stream::Plain(tcp),
        Some(tls) => {
            let kind = match port {
                Port::Peer => TlsPort::Mutual,
                Port::Worker | Port::Client => TlsPort::ServerOnly,
            };
            let acceptor = tls
                .acceptor(kind)
                .map_err(|e| AcceptFailure::Broken(e.to_string()))?;
            let handshake = async {
                match crate::tls::opens_with_tls(&tcp).await {
                    Ok(true) => {}
                    Ok(false) => {
                        let mut tcp = tcp;
                        let error = AuthError::Required {
                            expected:
                                "a TLS handshake (this port speaks TLS: give the client --tls-ca)",
                            found: "plain text".to_owned(),
                        };
                        let _ =
                            write_frame(&mut tcp, &refusal_in_link_language(port, &error)).await;
                        return Err(AcceptFailure::Refused(error));
                    }
                    Err(error) => return Err(AcceptFailure::Broken(error.to_string())),
                }
                acceptor
                    .accept(tcp)
                    .await
                    .map(|tls| Stream::Tls(Box::new(tls.into())))
                    .map_err(|error| AcceptFailure::Tls(error.to_string()))
            };
            tokio::time::timeout(within, handshake)
                .await
                .unwrap_or(Err(AcceptFailure::TimedOut(within)))?
        }
    };
    let caller = match credentials.policy(port) {
        None => Caller::anonymous(),
        Some(policy) => accept(&mut stream, port, policy, within).await?,
    };
    Ok((stream, caller))
}

/// Runs the acceptor's side on `stream` under `policy`, answering every step, within `within`.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    port: Port,
    policy: AcceptPolicy,
    within: Duration,
) -> Result<Caller, AcceptFailure> {
    let nonce = fresh_nonce().map_err(AcceptFailure::Broken)?;
    let mut acceptor = Acceptor::new(policy, nonce);
    let outcome = tokio::time::timeout(within, async {
        loop {
            let payload = read_frame(stream).await.map_err(AcceptFailure::Broken)?;
            let step = match decode_message::<AuthRequest>(&payload) {
                Ok(request) => acceptor.handle(request),
                Err(FrameError::UnknownType { type_name }) => {
                    // Not a handshake at all (a client or worker without credentials): say so
                    // in the link's own language, which it can read.
                    let error = acceptor.handle_other(&type_name);
                    let _ = write_frame(stream, &refusal_in_link_language(port, &error)).await;
                    return Err(AcceptFailure::Refused(error));
                }
                Err(error) => {
                    let error = AuthError::Required {
                        expected: "a handshake message",
                        found: error.to_string(),
                    };
                    let _ = write_frame(stream, &refusal_in_link_language(port, &error)).await;
                    return Err(AcceptFailure::Refused(error));
                }
            };
            match step {
                AcceptorStep::Reply(reply) => write_frame(stream, &encode(&reply))
                    .await
                    .map_err(AcceptFailure::Broken)?,
                AcceptorStep::Accepted { reply, caller } => {
                    write_frame(stream, &encode(&reply))
                        .await
                        .map_err(AcceptFailure::Broken)?;
                    return Ok(caller);
                }
                AcceptorStep::Refused { reply, error } => {
                    let _ = write_frame(stream, &encode(&reply)).await;
                    return Err(AcceptFailure::Refused(error));
                }
            }
        }
    })
    .await;
    outcome.unwrap_or(Err(AcceptFailure::TimedOut(within)))
}

/// Why a dialed connection could not be authenticated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InitiateFailure {
    /// The coordinator refused the credential, or could not prove its own: final until the
    /// configuration changes.
    #[error("{0}")]
    Refused(AuthError),
    /// The connection failed or timed out mid-handshake: worth another try.
    #[error("handshake failed: {0}")]
    Broken(String),
}

/// Runs the initiator's side on `stream` with `credential`, within [`HANDSHAKE_TIMEOUT`].
pub async fn initiate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    credential: Credential,
) -> Result<(), InitiateFailure> {
    let nonce = fresh_nonce().map_err(InitiateFailure::Broken)?;
    let (mut initiator, first) = Initiator::new(credential, nonce);
    let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut request = first;
        loop {
            write_frame(stream, &encode(&request))
                .await
                .map_err(InitiateFailure::Broken)?;
            let payload = read_frame(stream).await.map_err(InitiateFailure::Broken)?;
            let reply = match decode_message::<AuthReply>(&payload) {
                Ok(reply) => reply,
                Err(error) => return Err(unexpected_reply(&payload, &error)),
            };
            match initiator.handle(reply) {
                InitiatorStep::Send(next) => request = next,
                InitiatorStep::Done { .. } => return Ok(()),
                InitiatorStep::Failed(error) => return Err(InitiateFailure::Refused(error)),
            }
        }
    })
    .await;
    outcome.unwrap_or_else(|_| {
        Err(InitiateFailure::Broken(format!(
            "no answer to the handshake within {HANDSHAKE_TIMEOUT:?}"
        )))
    })
}

/// A coordinator that checks no credentials does not know the handshake: it answers with its
/// link's `ERROR UNKNOWN_TYPE`.
fn unexpected_reply(payload: &[u8], error: &FrameError) -> InitiateFailure {
    let told = decode_message::<ClientReply>(payload)
        .ok()
        .and_then(|reply| match reply {
            ClientReply::Error { code, message, .. } => Some((code, message)),
            _ => None,
        })
        .or_else(|| {
            decode_message::<CoordinatorToWorker>(payload)
                .ok()
                .and_then(|reply| match reply {
                    CoordinatorToWorker::Error { code, message } => Some((code, message)),
                    _ => None,
                })
        });
    match told {
        Some((ErrorCode::UnknownType, _)) => InitiateFailure::Refused(AuthError::Refused {
            code: ErrorCode::Unauthenticated,
            message: "this coordinator checks no credentials on this port, so it cannot prove it holds the secret; start it with the same credential, or drop this side's".to_owned(),
        }),
        Some((code, message)) => InitiateFailure::Refused(AuthError::Refused { code, message }),
        None => InitiateFailure::Broken(format!("unexpected answer to the handshake: {error}")),
    }
}

fn encode<M: serde::Serialize>(message: &M) -> Vec<u8> {
    let mut frame = Vec::new();
    // Handshake messages are a few hundred bytes; the bound cannot be hit by what we send.
    if let Err(error) = encode_frame(message, HANDSHAKE_FRAME_BYTES_MAX, &mut frame) {
        tracing::error!(%error, "a handshake message does not fit its frame");
    }
    frame
}

fn refusal_in_link_language(port: Port, error: &AuthError) -> Vec<u8> {
    let (code, message) = (error.code(), error.to_string());
    match port {
        Port::Worker => encode(&CoordinatorToWorker::Error { code, message }),
        Port::Client => encode(&ClientReply::Error {
            request_id: None,
            code,
            message,
        }),
        Port::Peer => encode(&AuthReply::AuthError { code, message }),
    }
}

/// Reads one whole frame, and not a byte more.
async fn read_frame<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Vec<u8>, String> {
    let mut header = [0u8; 4];
    stream
        .read_exact(&mut header)
        .await
        .map_err(|e| format!("reading a handshake frame: {e}"))?;
    let length = u32::from_be_bytes(header) as usize;
    if length == 0 || length > HANDSHAKE_FRAME_BYTES_MAX {
        return Err(format!(
            "a handshake frame of {length} bytes (at most {HANDSHAKE_FRAME_BYTES_MAX})"
        ));
    }
    let mut payload = vec![0u8; length];
    stream
        .read_exact(&mut payload)
        .await
        .map_err(|e| format!("reading a handshake frame: {e}"))?;
    Ok(payload)
}

async fn write_frame<S: AsyncWrite + Unpin>(stream: &mut S, frame: &[u8]) -> Result<(), String> {
    // A TLS session holds what it is given until flushed.
    async {
        stream.write_all(frame).await?;
        stream.flush().await
    }
    .await
    .map_err(|e| format!("writing a handshake frame: {e}"))
}

/// Logs refused handshakes at most once per remote address per [`REFUSAL_LOG_EVERY`], so a
/// flood of bad connections cannot flood the log; every refusal is still counted in metrics.
#[derive(Clone)]
pub struct RefusalLog {
    inner: Arc<Mutex<RefusalLogInner>>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct RefusalLogInner {
    last_logged: HashMap<IpAddr, Instant>,
    /// Refusals not logged since the last line, per address.
    suppressed: HashMap<IpAddr, u64>,
}

impl RefusalLog {
    /// A log that also counts every refusal in `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> RefusalLog {
        RefusalLog {
            inner: Arc::default(),
            metrics,
        }
    }

    pub fn refused(&self, port: Port, remote: SocketAddr, failure: &AcceptFailure) {
        self.metrics.auth_refused(port);
        let now = Instant::now();
        let ip = remote.ip();
        let mut inner = match self.inner.lock() {
            Ok(inner) => inner,
            Err(poisoned) => poisoned.into_inner(),
        };
        let recent = inner
            .last_logged
            .get(&ip)
            .is_some_and(|at| now.duration_since(*at) < REFUSAL_LOG_EVERY);
        if recent {
            *inner.suppressed.entry(ip).or_default() += 1;
            return;
        }
        if inner.last_logged.len() >= REFUSAL_LOG_ADDRESSES_MAX {
            inner
                .last_logged
                .retain(|_, at| now.duration_since(*at) < REFUSAL_LOG_EVERY);
            let RefusalLogInner {
                last_logged,
                suppressed,
            } = &mut *inner;
            suppressed.retain(|ip, _| last_logged.contains_key(ip));
            if inner.last_logged.len() >= REFUSAL_LOG_ADDRESSES_MAX {
                return;
            }
        }
        inner.last_logged.insert(ip, now);
        let earlier = inner.suppressed.remove(&ip).unwrap_or(0);
        tracing::warn!(
            port = port.as_str(),
            %remote,
            refused_since_last_line = earlier,
            reason = %failure,
            "Connection refused: no valid credential"
        );
    }
}
