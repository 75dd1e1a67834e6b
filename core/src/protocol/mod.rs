//! The wire protocol: message types per link, and the frame codec that carries them.
//!
//! Three links, each with its own pair of message enums, all framed the same way
//! (`codec`: 4-byte big-endian length, then one JSON object with a `type` tag):
//!
//! ```text
//!   worker  --WorkerToCoordinator-->   coordinator   <--ClientRequest--  client
//!   worker  <--CoordinatorToWorker--   coordinator   --ClientReply-->    client
//!                                      coordinator  <--PeerMessage-->   coordinator
//! ```
//!
//! Every schema is documented with an example in `docs/PROTOCOL.md`.

pub mod codec;
mod messages;

pub use messages::*;
