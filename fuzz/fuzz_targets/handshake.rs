//! The acceptor side of the connection handshake fed arbitrary frames, as a stranger would send
//! them: each must decode or be refused, never panic, and no sequence of them may be accepted
//! unless it proves the secret. The fuzzer knows no secret and cannot compute an HMAC, so any
//! acceptance on a secret port is a bug, and on the client port only the one known token may
//! be accepted.
//!
//! The input: one byte choosing the port (even: the worker secret, odd: the client tokens),
//! then frames, each a 2-byte length and that many bytes of JSON.

#![no_main]

use std::sync::Arc;

use herder_core::auth::{
    AcceptPolicy, Acceptor, AcceptorStep, AuthRequest, Nonce, Secret, SecretLink, TokenTable,
};
use herder_core::protocol::codec::{decode_message, FrameError};
use libfuzzer_sys::fuzz_target;

const SECRET: &str = "fuzz-worker-secret-0123456789abcdef";
const TOKEN: &str = "fuzz-known-token-0123456789abcdefgh";

fuzz_target!(|data: &[u8]| {
    let Some((&port, mut rest)) = data.split_first() else {
        return;
    };
    let secret_port = port % 2 == 0;
    let policy = if secret_port {
        let secret = Secret::from_text(SECRET).expect("a valid secret");
        AcceptPolicy::Secret {
            link: SecretLink::Worker,
            secret: Arc::new(secret),
        }
    } else {
        let table = TokenTable::parse(&format!("fuzz admin {TOKEN}\n")).expect("a valid table");
        AcceptPolicy::Tokens(Arc::new(table))
    };
    let mut acceptor = Acceptor::new(policy, Nonce([7; 32]));
    while rest.len() >= 2 {
        let length = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let end = (2 + length).min(rest.len());
        let payload = &rest[2..end];
        rest = &rest[end..];
        let step = match decode_message::<AuthRequest>(payload) {
            Ok(request) => {
                let presented = match &request {
                    AuthRequest::AuthToken { token } => Some(token.clone()),
                    _ => None,
                };
                let step = acceptor.handle(request);
                if let AcceptorStep::Accepted { .. } = &step {
                    assert!(
                        !secret_port && presented.as_deref() == Some(TOKEN),
                        "accepted without the credential: {step:?}"
                    );
                }
                step
            }
            Err(FrameError::UnknownType { type_name }) => {
                let _ = acceptor.handle_other(&type_name);
                return;
            }
            Err(_) => return,
        };
        if !matches!(step, AcceptorStep::Reply(_)) {
            return;
        }
    }
});
