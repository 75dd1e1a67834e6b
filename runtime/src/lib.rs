//! # herder-runtime
//!
//! Drives `herder-core`'s state machines for real: TCP listeners and connections carrying core's
//! frames, a monotonic clock, timers, the SQLite store, and task execution on workers. Each driver
//! is a thin loop — wait for the next input, the next timer or shutdown; feed it to the machine;
//! perform the outputs — with no decisions of its own.

pub mod client;
pub mod clock;
pub mod coordinator;
pub mod net;
pub mod peer;
pub mod store;
pub mod worker;
