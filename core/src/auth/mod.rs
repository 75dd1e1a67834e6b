//! Who may speak to a coordinator, decided without I/O.
//!
//! Every port has a credential of its own, so a leaked worker secret lets nobody submit jobs or
//! join the group:
//!
//! | port | credential | proven by |
//! |---|---|---|
//! | peers (the consensus link) | the peer secret, shared by the members | challenge-response |
//! | workers | the worker secret, shared by the workers | challenge-response |
//! | clients (and the HTTP API) | a bearer token naming an identity with a [`Role`] | the token |
//!
//! A shared secret never crosses the wire. The side that opens the connection (the initiator)
//! and the side that accepted it (the acceptor) each contribute a fresh 32-byte nonce, and each
//! proves it knows the secret with an HMAC-SHA256 over both nonces, the link and which side it
//! is. So a recorded handshake is worthless on a new connection (the acceptor's nonce differs),
//! a proof cannot be reflected back at its sender (the side is in it), and a proof for the
//! worker port says nothing on the peer port. Both proofs are checked in constant time.
//!
//! ```text
//!   initiator                                   acceptor
//!   AUTH_HELLO {link, nonce_i}          ───>
//!                                       <───    AUTH_CHALLENGE {nonce_a, proof_a}
//!   checks proof_a (the acceptor knows the secret)
//!   AUTH_PROOF {proof_i}                ───>
//!                                       <───    AUTH_OK | AUTH_ERROR (and close)
//!
//!   AUTH_TOKEN {token}                  ───>    (client port)
//!                                       <───    AUTH_OK {name, role} | AUTH_ERROR (and close)
//! ```
//!
//! A bearer token does cross the wire: on a network anyone can read, the client port needs TLS
//! around it. Tokens are looked up by their SHA-256 digest, compared in constant time against
//! every entry of the table.
//!
//! [`Acceptor`] and [`Initiator`] are the two sides as state machines: each message in, at most
//! one message out, and a verdict. Drivers supply the nonces (the runtime from the operating
//! system's random source, the simulator from its seed) and move the frames.

mod credentials;
mod handshake;

pub use credentials::{Caller, CredentialError, Role, Secret, SecretLink, TokenTable, TokensError};
pub use handshake::{
    AcceptPolicy, Acceptor, AcceptorStep, AuthError, AuthReply, AuthRequest, ClientToken,
    Credential, Initiator, InitiatorStep, Nonce, Proof,
};
