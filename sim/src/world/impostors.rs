//! Strangers at the door: the connection handshake's two machines (`herder_core::auth`), driven
//! with nonces from the seed, refusing every impostor and accepting the honest side drawn
//! beside it.
//!
//! The simulated connections open already authenticated (the runtime runs the handshake before
//! a connection reaches any machine the world drives), so a knock is a handshake played out
//! here, message by message, between an acceptor holding the port's secret and an initiator of
//! one of these kinds. The world judges each with its own rule of who knows the secret, not by
//! asking the machines: an initiator that does not hold the port's secret must never be
//! accepted, and one that does must always be.

use std::sync::Arc;

use herder_core::auth::{
    AcceptPolicy, Acceptor, AcceptorStep, AuthRequest, ClientToken, Credential, Initiator,
    InitiatorStep, Nonce, Proof, Secret, SecretLink,
};

use super::{NodeRef, World};
use crate::checker::Check;

/// The group's secrets in every simulated world, and one nobody in it holds.
const WORKER_SECRET: &str = "sim-worker-secret-0123456789abcdef";
const PEER_SECRET: &str = "sim-peer-secret-0123456789abcdefgh";
const WRONG_SECRET: &str = "sim-wrong-secret-0123456789abcdefg";

/// Messages a handshake may take before the world calls it stuck (an honest one takes two).
const HANDSHAKE_STEPS_MAX: usize = 4;

/// What knocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Knock {
    /// Holds the port's secret and plays by the rules: must be accepted.
    Honest,
    /// Holds another secret.
    WrongSecret,
    /// Sends a proof it made up.
    GuessedProof,
    /// Replays the last honest handshake the world recorded, word for word.
    Replay,
    /// Sends the acceptor's own proof back as its proof.
    Reflection,
    /// Holds the secret of the other secret port (worker for peer, or the reverse).
    OtherLink,
    /// Presents a client token on a secret port.
    Token,
}

const KNOCKS: [Knock; 7] = [
    Knock::Honest,
    Knock::WrongSecret,
    Knock::GuessedProof,
    Knock::Replay,
    Knock::Reflection,
    Knock::OtherLink,
    Knock::Token,
];

/// How a knock ended.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Accepted,
    Refused,
}

fn secret_of(link: SecretLink) -> Arc<Secret> {
    let text = match link {
        SecretLink::Worker => WORKER_SECRET,
        SecretLink::Peer => PEER_SECRET,
    };
    Arc::new(Secret::from_text(text).unwrap_or_else(|e| unreachable!("a constant secret: {e}")))
}

fn other(link: SecretLink) -> SecretLink {
    match link {
        SecretLink::Worker => SecretLink::Peer,
        SecretLink::Peer => SecretLink::Worker,
    }
}

impl World {
    fn nonce(&mut self) -> Nonce {
        let mut bytes = [0u8; 32];
        for chunk in bytes.chunks_exact_mut(8) {
            chunk.copy_from_slice(&self.fault_rng.next_u64().to_le_bytes());
        }
        Nonce(bytes)
    }

    /// A fault tick's knock: one stranger (or, as often, an honest side) at a secret port.
    pub(super) fn knock(&mut self) -> Check {
        let link = if self.fault_rng.chance(0.5) {
            SecretLink::Worker
        } else {
            SecretLink::Peer
        };
        let knock = *self.fault_rng.pick(&KNOCKS).unwrap_or(&Knock::Honest);
        if knock == Knock::Replay && self.last_handshake.is_none() {
            // Nothing recorded yet to replay: knock honestly, which records one.
            return self.play(link, Knock::Honest);
        }
        self.play(link, knock)
    }

    fn play(&mut self, link: SecretLink, knock: Knock) -> Check {
        let nonce = self.nonce();
        let mut acceptor = Acceptor::new(
            AcceptPolicy::Secret {
                link,
                secret: secret_of(link),
            },
            nonce,
        );
        let (verdict, sent) = match knock {
            Knock::Honest => self.converse(
                &mut acceptor,
                Credential::Secret {
                    link,
                    secret: secret_of(link),
                },
            )?,
            Knock::WrongSecret => {
                let wrong = Arc::new(
                    Secret::from_text(WRONG_SECRET)
                        .unwrap_or_else(|e| unreachable!("a constant secret: {e}")),
                );
                self.converse(
                    &mut acceptor,
                    Credential::Secret {
                        link,
                        secret: wrong,
                    },
                )?
            }
            Knock::OtherLink => self.converse(
                &mut acceptor,
                Credential::Secret {
                    link: other(link),
                    secret: secret_of(other(link)),
                },
            )?,
            Knock::Token => {
                let token = ClientToken::from_text(WORKER_SECRET)
                    .unwrap_or_else(|e| unreachable!("a constant token: {e}"));
                self.converse(&mut acceptor, Credential::Token(Arc::new(token)))?
            }
            Knock::GuessedProof => {
                let hello = AuthRequest::AuthHello {
                    link,
                    nonce: self.nonce(),
                };
                let guess = AuthRequest::AuthProof {
                    proof: Proof(self.nonce().0),
                };
                (self.feed(&mut acceptor, vec![hello, guess]), Vec::new())
            }
            Knock::Replay => {
                let recorded = self.last_handshake.clone().unwrap_or_default();
                (self.feed(&mut acceptor, recorded), Vec::new())
            }
            Knock::Reflection => {
                let hello = AuthRequest::AuthHello {
                    link,
                    nonce: self.nonce(),
                };
                match acceptor.handle(hello) {
                    AcceptorStep::Reply(herder_core::auth::AuthReply::AuthChallenge {
                        proof,
                        ..
                    }) => (
                        self.feed(&mut acceptor, vec![AuthRequest::AuthProof { proof }]),
                        Vec::new(),
                    ),
                    other => {
                        return Err(format!(
                            "handshake: an AUTH_HELLO for the {} port's own link was answered {other:?}, not a challenge",
                            link.as_str()
                        ))
                    }
                }
            }
        };
        let expected = if knock == Knock::Honest {
            Verdict::Accepted
        } else {
            Verdict::Refused
        };
        if verdict != expected {
            return Err(format!(
                "handshake: a {knock:?} knock on the {} port was {verdict:?}; the world's rule says {expected:?} (only a side holding the port's secret, proving it over this connection's nonces, is accepted)",
                link.as_str()
            ));
        }
        if knock == Knock::Honest {
            self.last_handshake = Some(sent);
        }
        self.count(match knock {
            Knock::Honest => "auth: an honest side accepted",
            Knock::WrongSecret => "auth: a wrong secret refused",
            Knock::GuessedProof => "auth: a guessed proof refused",
            Knock::Replay => "auth: a replayed handshake refused",
            Knock::Reflection => "auth: a reflected proof refused",
            Knock::OtherLink => "auth: another port's secret refused",
            Knock::Token => "auth: a token on a secret port refused",
        });
        self.note(
            NodeRef::World,
            format_args!("KNOCK {knock:?} on the {} port: {verdict:?}", link.as_str()),
        );
        Ok(())
    }

    /// Plays a whole handshake between `acceptor` and an initiator holding `credential`;
    /// returns how it ended and every message the initiator sent.
    fn converse(
        &mut self,
        acceptor: &mut Acceptor,
        credential: Credential,
    ) -> Result<(Verdict, Vec<AuthRequest>), String> {
        let nonce = self.nonce();
        let (mut initiator, first) = Initiator::new(credential, nonce);
        let mut sent = vec![first.clone()];
        let mut request = first;
        for _ in 0..HANDSHAKE_STEPS_MAX {
            let reply = match acceptor.handle(request) {
                AcceptorStep::Reply(reply) => reply,
                AcceptorStep::Accepted { reply, .. } => {
                    return match initiator.handle(reply) {
                        InitiatorStep::Done { .. } => Ok((Verdict::Accepted, sent)),
                        other => Err(format!(
                            "handshake: the acceptor accepted, but its initiator concluded {other:?}"
                        )),
                    };
                }
                AcceptorStep::Refused { .. } => return Ok((Verdict::Refused, sent)),
            };
            match initiator.handle(reply) {
                InitiatorStep::Send(next) => {
                    sent.push(next.clone());
                    request = next;
                }
                // The initiator gave up (it found the acceptor unproven): nothing more is sent,
                // and the acceptor accepted nobody.
                InitiatorStep::Failed(_) => return Ok((Verdict::Refused, sent)),
                InitiatorStep::Done { .. } => {
                    return Err(
                        "handshake: the initiator concluded before the acceptor accepted".into(),
                    )
                }
            }
        }
        Err(format!(
            "handshake: no verdict after {HANDSHAKE_STEPS_MAX} messages"
        ))
    }

    /// Feeds `messages` to `acceptor` as an impostor that ignores the replies would.
    fn feed(&mut self, acceptor: &mut Acceptor, messages: Vec<AuthRequest>) -> Verdict {
        for message in messages {
            match acceptor.handle(message) {
                AcceptorStep::Reply(_) => {}
                AcceptorStep::Accepted { .. } => return Verdict::Accepted,
                AcceptorStep::Refused { .. } => return Verdict::Refused,
            }
        }
        // It ran out of words before a verdict: the runtime's deadline closes it, unaccepted.
        Verdict::Refused
    }
}
