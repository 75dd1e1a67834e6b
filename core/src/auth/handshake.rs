//! The handshake at the start of every connection to a port that checks credentials: its wire
//! messages and its two sides as state machines.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;

use super::credentials::{Caller, Role, Secret, SecretLink, TokenTable};
use crate::protocol::codec::WireMessage;
use crate::protocol::ErrorCode;

/// 32 bytes a side draws fresh for each connection; hex on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Nonce(pub [u8; 32]);

/// An HMAC-SHA256 that proves knowledge of a shared secret; hex on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Proof(pub [u8; 32]);

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", hex(&self.0))
    }
}

impl fmt::Debug for Proof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Proof({})", hex(&self.0))
    }
}

fn hex(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let digits = text.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = value(pair[0])? << 4 | value(pair[1])?;
    }
    Some(out)
}

macro_rules! hex_serde {
    ($name:ident) => {
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&hex(&self.0))
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<$name, D::Error> {
                let text = String::deserialize(deserializer)?;
                unhex(&text).map($name).ok_or_else(|| {
                    serde::de::Error::custom("expected 64 lowercase hexadecimal digits")
                })
            }
        }
    };
}
hex_serde!(Nonce);
hex_serde!(Proof);

/// What the side that opened a connection sends while authenticating. Its `Debug` shows a
/// token's length, never the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum AuthRequest {
    /// Opens a challenge-response for the worker or peer secret.
    AuthHello { link: SecretLink, nonce: Nonce },
    /// Proves the initiator knows the secret, over both nonces.
    AuthProof { proof: Proof },
    /// Presents a client token (the client port's only handshake message).
    AuthToken { token: String },
}

impl fmt::Debug for AuthRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthRequest::AuthHello { link, nonce } => f
                .debug_struct("AuthHello")
                .field("link", link)
                .field("nonce", nonce)
                .finish(),
            AuthRequest::AuthProof { proof } => {
                f.debug_struct("AuthProof").field("proof", proof).finish()
            }
            AuthRequest::AuthToken { token } => write!(f, "AuthToken({} bytes)", token.len()),
        }
    }
}

impl WireMessage for AuthRequest {
    fn is_known_type(tag: &str) -> bool {
        matches!(tag, "AUTH_HELLO" | "AUTH_PROOF" | "AUTH_TOKEN")
    }
    fn type_name(&self) -> &'static str {
        match self {
            AuthRequest::AuthHello { .. } => "AUTH_HELLO",
            AuthRequest::AuthProof { .. } => "AUTH_PROOF",
            AuthRequest::AuthToken { .. } => "AUTH_TOKEN",
        }
    }
}

/// What the side that accepted a connection answers while authenticating.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum AuthReply {
    /// The acceptor's nonce and its proof that it knows the secret too.
    AuthChallenge { nonce: Nonce, proof: Proof },
    /// Authenticated: the connection now speaks its link's protocol. A token's name and role
    /// are echoed; a secret link has neither.
    AuthOk {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<Role>,
    },
    /// Refused; the acceptor closes the connection after it.
    AuthError { code: ErrorCode, message: String },
}

impl WireMessage for AuthReply {
    fn is_known_type(tag: &str) -> bool {
        matches!(tag, "AUTH_CHALLENGE" | "AUTH_OK" | "AUTH_ERROR")
    }
    fn type_name(&self) -> &'static str {
        match self {
            AuthReply::AuthChallenge { .. } => "AUTH_CHALLENGE",
            AuthReply::AuthOk { .. } => "AUTH_OK",
            AuthReply::AuthError { .. } => "AUTH_ERROR",
        }
    }
}

/// Why a handshake failed. Every one of them ends the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The first message was not a handshake message on a port that requires one.
    #[error(
        "this port requires authentication; the connection must open with {expected}, not {found}"
    )]
    Required {
        expected: &'static str,
        found: String,
    },
    #[error("this is the {port} port; a {offered} secret is no credential here")]
    WrongLink {
        port: &'static str,
        offered: &'static str,
    },
    #[error("the proof does not match this port's secret")]
    BadProof,
    #[error("unknown token")]
    UnknownToken,
    #[error("{found} is out of order in the handshake")]
    OutOfOrder { found: &'static str },
    /// The acceptor could not prove it knows the secret: it is not the coordinator it claims
    /// to be, or the two sides hold different secrets.
    #[error("the coordinator could not prove it knows the {link} secret (the secrets differ, or it is not a Herder coordinator of this group)")]
    AcceptorUnproven { link: &'static str },
    /// The acceptor refused, with its own code and words.
    #[error("refused by the coordinator: {message}")]
    Refused { code: ErrorCode, message: String },
}

impl AuthError {
    pub fn code(&self) -> ErrorCode {
        match self {
            AuthError::Refused { code, .. } => *code,
            _ => ErrorCode::Unauthenticated,
        }
    }

    fn reply(&self) -> AuthReply {
        AuthReply::AuthError {
            code: self.code(),
            message: self.to_string(),
        }
    }
}

/// Which side a proof is made by: part of what it covers, so one side's proof is never valid
/// as the other's.
#[derive(Clone, Copy)]
enum Side {
    Initiator,
    Acceptor,
}

fn proof(
    secret: &Secret,
    side: Side,
    link: SecretLink,
    initiator: &Nonce,
    acceptor: &Nonce,
) -> Proof {
    Proof(
        proof_mac(secret, side, link, initiator, acceptor)
            .finalize()
            .into_bytes()
            .into(),
    )
}

fn proof_mac(
    secret: &Secret,
    side: Side,
    link: SecretLink,
    initiator: &Nonce,
    acceptor: &Nonce,
) -> Hmac<Sha256> {
    // `new_from_slice` takes a key of any length for HMAC.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(b"herder-auth-v1\0");
    mac.update(match side {
        Side::Initiator => b"initiator\0",
        Side::Acceptor => b"acceptor\0\0",
    });
    mac.update(link.as_str().as_bytes());
    mac.update(b"\0");
    mac.update(&initiator.0);
    mac.update(&acceptor.0);
    mac
}

/// Checks `claimed` in constant time.
fn proof_holds(
    secret: &Secret,
    side: Side,
    link: SecretLink,
    initiator: &Nonce,
    acceptor: &Nonce,
    claimed: &Proof,
) -> bool {
    proof_mac(secret, side, link, initiator, acceptor)
        .verify_slice(&claimed.0)
        .is_ok()
}

// ---------------------------------------------------------------------------------------------
// The acceptor
// ---------------------------------------------------------------------------------------------

/// What a port that checks credentials asks of a new connection.
#[derive(Clone, Debug)]
pub enum AcceptPolicy {
    /// The worker or peer port: a challenge-response for its shared secret.
    Secret {
        link: SecretLink,
        secret: Arc<Secret>,
    },
    /// The client port: a token from this table.
    Tokens(Arc<TokenTable>),
}

impl AcceptPolicy {
    fn opening(&self) -> &'static str {
        match self {
            AcceptPolicy::Secret { .. } => "AUTH_HELLO",
            AcceptPolicy::Tokens(_) => "AUTH_TOKEN",
        }
    }
}

/// What the acceptor does after a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptorStep {
    /// Send this and wait for the next handshake message.
    Reply(AuthReply),
    /// Send this (`AUTH_OK`); the connection is authenticated as `caller` (the anonymous
    /// caller on a secret port: a worker or member has no identity beyond the secret).
    Accepted { reply: AuthReply, caller: Caller },
    /// Send this (`AUTH_ERROR`) and close.
    Refused { reply: AuthReply, error: AuthError },
}

#[derive(Debug)]
enum AcceptorState {
    AwaitOpening,
    AwaitProof { initiator: Nonce, link: SecretLink },
    Finished,
}

/// The side that accepted a connection. Fed every message the connection sends until it
/// returns `Accepted` or `Refused`; after that it refuses everything.
#[derive(Debug)]
pub struct Acceptor {
    policy: AcceptPolicy,
    nonce: Nonce,
    state: AcceptorState,
}

impl Acceptor {
    /// `nonce` must be fresh and unpredictable for every connection.
    pub fn new(policy: AcceptPolicy, nonce: Nonce) -> Acceptor {
        Acceptor {
            policy,
            nonce,
            state: AcceptorState::AwaitOpening,
        }
    }

    /// The connection sent a frame that is not a handshake message (`type_name` is its type):
    /// refused, with the error the link's own protocol should carry back.
    pub fn handle_other(&mut self, type_name: &str) -> AuthError {
        self.state = AcceptorState::Finished;
        AuthError::Required {
            expected: self.policy.opening(),
            found: type_name.chars().take(64).collect(),
        }
    }

    pub fn handle(&mut self, message: AuthRequest) -> AcceptorStep {
        let state = std::mem::replace(&mut self.state, AcceptorState::Finished);
        let outcome = match (state, message, &self.policy) {
            (
                AcceptorState::AwaitOpening,
                AuthRequest::AuthHello { link, nonce },
                AcceptPolicy::Secret { link: port, secret },
            ) => {
                if link != *port {
                    Err(AuthError::WrongLink {
                        port: port.as_str(),
                        offered: link.as_str(),
                    })
                } else {
                    let reply = AuthReply::AuthChallenge {
                        nonce: self.nonce,
                        proof: proof(secret, Side::Acceptor, link, &nonce, &self.nonce),
                    };
                    self.state = AcceptorState::AwaitProof {
                        initiator: nonce,
                        link,
                    };
                    return AcceptorStep::Reply(reply);
                }
            }
            (
                AcceptorState::AwaitProof { initiator, link },
                AuthRequest::AuthProof { proof },
                AcceptPolicy::Secret { secret, .. },
            ) => {
                if proof_holds(
                    secret,
                    Side::Initiator,
                    link,
                    &initiator,
                    &self.nonce,
                    &proof,
                ) {
                    Ok(Caller::anonymous())
                } else {
                    Err(AuthError::BadProof)
                }
            }
            (
                AcceptorState::AwaitOpening,
                AuthRequest::AuthToken { token },
                AcceptPolicy::Tokens(table),
            ) => table.lookup(&token).ok_or(AuthError::UnknownToken),
            (
                AcceptorState::AwaitOpening,
                AuthRequest::AuthHello { link, .. },
                AcceptPolicy::Tokens(_),
            ) => Err(AuthError::WrongLink {
                port: "client",
                offered: link.as_str(),
            }),
            (
                AcceptorState::AwaitOpening,
                AuthRequest::AuthToken { .. },
                AcceptPolicy::Secret { link, .. },
            ) => Err(AuthError::Required {
                expected: "AUTH_HELLO",
                found: format!("a client token on the {} port", link.as_str()),
            }),
            (_, message, _) => Err(AuthError::OutOfOrder {
                found: message.type_name(),
            }),
        };
        match outcome {
            Ok(caller) => AcceptorStep::Accepted {
                reply: AuthReply::AuthOk {
                    name: caller.name.clone(),
                    role: matches!(self.policy, AcceptPolicy::Tokens(_)).then_some(caller.role),
                },
                caller,
            },
            Err(error) => AcceptorStep::Refused {
                reply: error.reply(),
                error,
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The initiator
// ---------------------------------------------------------------------------------------------

/// What the side opening a connection proves.
#[derive(Clone, Debug)]
pub enum Credential {
    Secret {
        link: SecretLink,
        secret: Arc<Secret>,
    },
    /// A client token (its `Debug` is the token's length only).
    Token(Arc<ClientToken>),
}

/// A client token as a client holds it (no `==`, and a `Debug` that shows only its length).
#[derive(Clone)]
pub struct ClientToken(String);

impl ClientToken {
    pub fn from_text(text: &str) -> Result<ClientToken, super::CredentialError> {
        let token = text.trim();
        // The same shape rules as a secret.
        Secret::from_text(token)?;
        Ok(ClientToken(token.to_owned()))
    }
}

impl fmt::Debug for ClientToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientToken({} bytes)", self.0.len())
    }
}

/// What the initiator does after a reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitiatorStep {
    /// Send this and wait for the next reply.
    Send(AuthRequest),
    /// Authenticated; a token's name and role as the acceptor knows them.
    Done {
        name: Option<String>,
        role: Option<Role>,
    },
    /// The handshake failed; close.
    Failed(AuthError),
}

#[derive(Debug)]
enum InitiatorState {
    AwaitChallenge,
    AwaitOk,
    Finished,
}

/// The side that opened a connection.
#[derive(Debug)]
pub struct Initiator {
    credential: Credential,
    nonce: Nonce,
    state: InitiatorState,
}

impl Initiator {
    /// The initiator and the first message to send. `nonce` must be fresh for every connection.
    pub fn new(credential: Credential, nonce: Nonce) -> (Initiator, AuthRequest) {
        let (first, state) = match &credential {
            Credential::Secret { link, .. } => (
                AuthRequest::AuthHello { link: *link, nonce },
                InitiatorState::AwaitChallenge,
            ),
            Credential::Token(token) => (
                AuthRequest::AuthToken {
                    token: token.0.clone(),
                },
                InitiatorState::AwaitOk,
            ),
        };
        (
            Initiator {
                credential,
                nonce,
                state,
            },
            first,
        )
    }

    pub fn handle(&mut self, reply: AuthReply) -> InitiatorStep {
        let state = std::mem::replace(&mut self.state, InitiatorState::Finished);
        match (state, reply, &self.credential) {
            (_, AuthReply::AuthError { code, message }, _) => {
                InitiatorStep::Failed(AuthError::Refused {
                    code,
                    message: message.chars().take(512).collect(),
                })
            }
            (
                InitiatorState::AwaitChallenge,
                AuthReply::AuthChallenge {
                    nonce,
                    proof: theirs,
                },
                Credential::Secret { link, secret },
            ) => {
                if !proof_holds(secret, Side::Acceptor, *link, &self.nonce, &nonce, &theirs) {
                    return InitiatorStep::Failed(AuthError::AcceptorUnproven {
                        link: link.as_str(),
                    });
                }
                self.state = InitiatorState::AwaitOk;
                InitiatorStep::Send(AuthRequest::AuthProof {
                    proof: proof(secret, Side::Initiator, *link, &self.nonce, &nonce),
                })
            }
            (InitiatorState::AwaitOk, AuthReply::AuthOk { name, role }, _) => {
                InitiatorStep::Done { name, role }
            }
            (_, reply, _) => InitiatorStep::Failed(AuthError::OutOfOrder {
                found: reply.type_name(),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
