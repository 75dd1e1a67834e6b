//! # herder-core
//!
//! Everything Herder decides, as deterministic state machines with no I/O: the coordinator (job
//! table, scheduler, leases, retries, admission, idempotency, recovery), the worker and the
//! client, the wire protocol and its frame codec, the job lifecycle and the built-in tasks.
//!
//! ```text
//!            inputs: (now, message | connection event | timer | "batch durable")
//!                                     │
//!                                     v
//!   ┌──────────────┐  ┌──────────────────────────┐  ┌──────────────┐
//!   │ worker::     │  │ coordinator::Coordinator │  │ client::     │
//!   │ Worker       │  │  (command log -> apply   │  │ Client       │
//!   │              │  │   -> job table)          │  │              │
//!   └──────────────┘  └──────────────────────────┘  └──────────────┘
//!                                     │
//!                                     v
//!     outputs: send / close / connect / persist records / start or cancel a task / event
//! ```
//!
//! The rules that make the simulator possible (docs/ARCHITECTURE.md, "The shape of a state
//! machine"):
//!
//! - No sockets, files, threads, clocks, environment or OS randomness. Time arrives as a
//!   [`time::Instant`] argument; randomness comes from a `ChaCha8Rng` seeded by the driver.
//! - Each machine is fed with `handle_*` calls and drained with `poll_output` (and asked
//!   `poll_timeout` for its next timer). The exact calling order is in each machine's module doc.
//! - Same seed, same inputs: byte-identical outputs.
//! - Durability before visibility: see [`coordinator`].

pub mod auth;
pub mod client;
pub mod command;
pub mod coordinator;
pub mod dataparallel;
mod dial;
pub mod ids;
pub mod job;
pub mod limits;
pub mod protocol;
pub mod queues;
pub mod replica;
pub mod storage;
pub mod table;
pub mod tasks;
pub mod testing;
pub mod text;
pub mod time;
pub mod worker;
