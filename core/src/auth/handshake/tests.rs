use std::sync::Arc;

use proptest::prelude::*;

use super::*;

const WORKER_SECRET: &str = "worker-secret-0123456789abcdef";
const PEER_SECRET: &str = "peer-secret-0123456789abcdefgh";

fn secret(text: &str) -> Arc<Secret> {
    Arc::new(Secret::from_text(text).expect("a valid secret"))
}

fn worker_port(text: &str, nonce: u8) -> Acceptor {
    Acceptor::new(
        AcceptPolicy::Secret {
            link: SecretLink::Worker,
            secret: secret(text),
        },
        Nonce([nonce; 32]),
    )
}

fn worker(text: &str, nonce: u8) -> (Initiator, AuthRequest) {
    Initiator::new(
        Credential::Secret {
            link: SecretLink::Worker,
            secret: secret(text),
        },
        Nonce([nonce; 32]),
    )
}

/// Runs a whole handshake; returns what each side concluded and every request sent.
fn run(
    acceptor: &mut Acceptor,
    initiator: &mut Initiator,
    first: AuthRequest,
) -> (
    Option<AcceptorStep>,
    Option<InitiatorStep>,
    Vec<AuthRequest>,
) {
    let mut sent = vec![first.clone()];
    let mut request = first;
    for _ in 0..4 {
        let reply = match acceptor.handle(request) {
            AcceptorStep::Reply(reply) => reply,
            done => {
                let reply = match &done {
                    AcceptorStep::Accepted { reply, .. } | AcceptorStep::Refused { reply, .. } => {
                        reply.clone()
                    }
                    AcceptorStep::Reply(_) => unreachable!(),
                };
                return (Some(done), Some(initiator.handle(reply)), sent);
            }
        };
        match initiator.handle(reply) {
            InitiatorStep::Send(next) => {
                sent.push(next.clone());
                request = next;
            }
            other => return (None, Some(other), sent),
        }
    }
    panic!("the handshake did not end in four round trips");
}

#[test]
fn both_sides_holding_the_secret_authenticate_each_other() {
    let mut acceptor = worker_port(WORKER_SECRET, 1);
    let (mut initiator, first) = worker(WORKER_SECRET, 2);
    let (accepted, done, _) = run(&mut acceptor, &mut initiator, first);
    assert!(
        matches!(accepted, Some(AcceptorStep::Accepted { ref caller, .. }) if *caller == Caller::anonymous())
    );
    assert_eq!(
        done,
        Some(InitiatorStep::Done {
            name: None,
            role: None
        })
    );
}

#[test]
fn a_worker_with_the_wrong_secret_learns_the_coordinator_is_unproven_and_sends_no_proof() {
    let mut acceptor = worker_port(WORKER_SECRET, 1);
    let (mut initiator, first) = worker("another-secret-0123456789abcdef", 2);
    let (accepted, done, sent) = run(&mut acceptor, &mut initiator, first);
    assert_eq!(accepted, None);
    assert_eq!(
        done,
        Some(InitiatorStep::Failed(AuthError::AcceptorUnproven {
            link: "worker"
        }))
    );
    assert_eq!(
        sent.len(),
        1,
        "no proof leaves a side that doubts the other"
    );
}

#[test]
fn an_impostor_that_guesses_a_proof_is_refused() {
    let mut acceptor = worker_port(WORKER_SECRET, 1);
    let hello = AuthRequest::AuthHello {
        link: SecretLink::Worker,
        nonce: Nonce([2; 32]),
    };
    assert!(matches!(
        acceptor.handle(hello),
        AcceptorStep::Reply(AuthReply::AuthChallenge { .. })
    ));
    let step = acceptor.handle(AuthRequest::AuthProof {
        proof: Proof([7; 32]),
    });
    assert!(
        matches!(
            step,
            AcceptorStep::Refused {
                error: AuthError::BadProof,
                reply: AuthReply::AuthError {
                    code: ErrorCode::Unauthenticated,
                    ..
                }
            }
        ),
        "{step:?}"
    );
    // Nothing more is taken on this connection.
    let again = acceptor.handle(AuthRequest::AuthProof {
        proof: Proof([7; 32]),
    });
    assert!(matches!(
        again,
        AcceptorStep::Refused {
            error: AuthError::OutOfOrder { .. },
            ..
        }
    ));
}

#[test]
fn a_recorded_handshake_replayed_on_a_new_connection_is_refused() {
    let mut acceptor = worker_port(WORKER_SECRET, 1);
    let (mut initiator, first) = worker(WORKER_SECRET, 2);
    let (_, _, recorded) = run(&mut acceptor, &mut initiator, first);
    assert_eq!(recorded.len(), 2);
    // The eavesdropper replays both messages to a connection with a fresh acceptor nonce.
    let mut fresh = worker_port(WORKER_SECRET, 3);
    assert!(matches!(
        fresh.handle(recorded[0].clone()),
        AcceptorStep::Reply(_)
    ));
    assert!(matches!(
        fresh.handle(recorded[1].clone()),
        AcceptorStep::Refused {
            error: AuthError::BadProof,
            ..
        }
    ));
}

#[test]
fn the_acceptors_own_proof_reflected_back_is_refused() {
    let mut acceptor = worker_port(WORKER_SECRET, 1);
    let hello = AuthRequest::AuthHello {
        link: SecretLink::Worker,
        nonce: Nonce([2; 32]),
    };
    let AcceptorStep::Reply(AuthReply::AuthChallenge { proof, .. }) = acceptor.handle(hello) else {
        panic!("a challenge");
    };
    assert!(matches!(
        acceptor.handle(AuthRequest::AuthProof { proof }),
        AcceptorStep::Refused {
            error: AuthError::BadProof,
            ..
        }
    ));
}

#[test]
fn a_proof_for_one_link_is_no_credential_on_another() {
    // Even with the same secret on both ports, a worker's handshake does not open the peer port.
    let mut peer_port = Acceptor::new(
        AcceptPolicy::Secret {
            link: SecretLink::Peer,
            secret: secret(PEER_SECRET),
        },
        Nonce([1; 32]),
    );
    let (_, hello) = worker(PEER_SECRET, 2);
    assert!(matches!(
        peer_port.handle(hello),
        AcceptorStep::Refused {
            error: AuthError::WrongLink {
                port: "peer",
                offered: "worker"
            },
            ..
        }
    ));
}

#[test]
fn a_token_names_its_caller_and_an_unknown_one_is_refused() {
    let table =
        Arc::new(TokenTable::parse("ci submitter ci-token-0123456789abcdefghij\n").expect("valid"));
    let port = || Acceptor::new(AcceptPolicy::Tokens(table.clone()), Nonce([0; 32]));
    let token = |text: &str| {
        Initiator::new(
            Credential::Token(Arc::new(ClientToken::from_text(text).expect("valid"))),
            Nonce([0; 32]),
        )
    };

    let (mut initiator, first) = token("ci-token-0123456789abcdefghij");
    let (accepted, done, _) = run(&mut port(), &mut initiator, first);
    let expected = Caller {
        name: Some("ci".into()),
        role: Role::Submitter,
    };
    assert!(
        matches!(accepted, Some(AcceptorStep::Accepted { ref caller, .. }) if *caller == expected)
    );
    assert_eq!(
        done,
        Some(InitiatorStep::Done {
            name: Some("ci".into()),
            role: Some(Role::Submitter)
        })
    );

    let (mut initiator, first) = token("not-a-token-0123456789abcdefgh");
    let (refused, done, _) = run(&mut port(), &mut initiator, first);
    assert!(matches!(
        refused,
        Some(AcceptorStep::Refused {
            error: AuthError::UnknownToken,
            ..
        })
    ));
    assert!(matches!(
        done,
        Some(InitiatorStep::Failed(AuthError::Refused {
            code: ErrorCode::Unauthenticated,
            ..
        }))
    ));

    // A worker's handshake on the client port, and a token on the worker port.
    let (_, hello) = worker(WORKER_SECRET, 2);
    assert!(matches!(
        port().handle(hello),
        AcceptorStep::Refused {
            error: AuthError::WrongLink { .. },
            ..
        }
    ));
    let (_, presented) = token("ci-token-0123456789abcdefghij");
    assert!(matches!(
        worker_port(WORKER_SECRET, 1).handle(presented),
        AcceptorStep::Refused {
            error: AuthError::Required { .. },
            ..
        }
    ));
}

#[test]
fn a_connection_that_skips_the_handshake_is_told_what_to_send() {
    let mut acceptor = worker_port(WORKER_SECRET, 1);
    let error = acceptor.handle_other("REGISTER");
    assert_eq!(error.code(), ErrorCode::Unauthenticated);
    assert!(error.to_string().contains("AUTH_HELLO"), "{error}");
    assert!(matches!(
        acceptor.handle(AuthRequest::AuthHello {
            link: SecretLink::Worker,
            nonce: Nonce([2; 32])
        }),
        AcceptorStep::Refused {
            error: AuthError::OutOfOrder { .. },
            ..
        }
    ));
}

#[test]
fn nonces_and_proofs_travel_as_hex_and_nothing_else_decodes() {
    let hello = AuthRequest::AuthHello {
        link: SecretLink::Peer,
        nonce: Nonce([0xab; 32]),
    };
    let json = serde_json::to_string(&hello).expect("encodes");
    assert_eq!(
        json,
        format!(
            r#"{{"type":"AUTH_HELLO","link":"peer","nonce":"{}"}}"#,
            "ab".repeat(32)
        )
    );
    assert_eq!(serde_json::from_str::<AuthRequest>(&json).ok(), Some(hello));
    for bad in [
        "AB".repeat(32),
        "ab".repeat(31),
        "zz".repeat(32),
        "ab".repeat(33),
    ] {
        let text = format!(r#"{{"type":"AUTH_PROOF","proof":"{bad}"}}"#);
        assert!(serde_json::from_str::<AuthRequest>(&text).is_err(), "{bad}");
    }
}

proptest! {
    /// Whatever the secret and the nonces, honest sides agree, and a proof with any one bit
    /// changed is refused.
    #[test]
    fn honest_sides_agree_and_any_flipped_bit_is_refused(
        secret_text in "[!-~]{24,64}",
        acceptor_nonce in any::<[u8; 32]>(),
        initiator_nonce in any::<[u8; 32]>(),
        bit in 0usize..256,
    ) {
        let policy = AcceptPolicy::Secret { link: SecretLink::Peer, secret: secret(&secret_text) };
        let credential = Credential::Secret { link: SecretLink::Peer, secret: secret(&secret_text) };

        let mut acceptor = Acceptor::new(policy.clone(), Nonce(acceptor_nonce));
        let (mut initiator, first) = Initiator::new(credential.clone(), Nonce(initiator_nonce));
        let (accepted, done, _) = run(&mut acceptor, &mut initiator, first);
        let accepted = matches!(accepted, Some(AcceptorStep::Accepted { .. }));
        prop_assert!(accepted);
        prop_assert_eq!(done, Some(InitiatorStep::Done { name: None, role: None }));

        let mut acceptor = Acceptor::new(policy, Nonce(acceptor_nonce));
        let (mut initiator, first) = Initiator::new(credential, Nonce(initiator_nonce));
        let AcceptorStep::Reply(challenge) = acceptor.handle(first) else {
            panic!("a challenge");
        };
        let InitiatorStep::Send(AuthRequest::AuthProof { mut proof }) = initiator.handle(challenge) else {
            panic!("a proof");
        };
        proof.0[bit / 8] ^= 1 << (bit % 8);
        let refused = matches!(
            acceptor.handle(AuthRequest::AuthProof { proof }),
            AcceptorStep::Refused { error: AuthError::BadProof, .. }
        );
        prop_assert!(refused);
    }
}
