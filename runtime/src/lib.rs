//! # herder-runtime
//!
//! Drives `herder-core`'s state machines for real: TCP listeners and connections carrying core's
//! frames, a monotonic clock, timers, the SQLite store, and task execution on workers. Each driver
//! is a thin loop — wait for the next input, the next timer or shutdown; feed it to the machine;
//! perform the outputs — with no decisions of its own.

//!
//! A program that runs its own tasks starts from [`Worker::builder`] and submits with
//! [`HerderClient`]:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use herder_runtime::{TaskContext, TaskError, Worker};
//!
//! let worker = Worker::builder()
//!     .coordinators(["127.0.0.1:7001"])
//!     .task("greet", |name: String, _ctx: TaskContext| async move {
//!         Ok::<_, TaskError>(format!("hello, {name}"))
//!     })
//!     .start()?;
//! herder_runtime::terminated().await; // SIGINT or SIGTERM
//! worker.drain().await; // finish or hand back what runs; no attempt is charged
//! # Ok(()) }
//! ```

pub mod auth;
pub mod client;
pub mod clock;
pub mod coordinator;
pub mod exec;
pub mod handlers;
pub mod metrics;
pub mod net;
pub mod peer;
pub mod store;
pub mod testing;
pub mod tls;
pub mod worker;

pub use client::{HerderClient, SubmitOptions, Submitted};
pub use handlers::{CancellationToken, Handler, Handlers, TaskContext, TaskError};
pub use worker::{Worker, WorkerBuilder, WorkerHandle};

/// The README's examples compile (they are checked as documentation tests).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

/// Resolves when the process is told to stop: SIGINT (Ctrl-C) or SIGTERM.
pub async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
