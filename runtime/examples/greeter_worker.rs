//! A worker program with tasks of its own, next to the built-in ones:
//!
//! - `greet` (async, typed payload `{"name": "...", "shout": false}`): answers with a
//!   greeting; an empty name is a permanent error, so the job fails at once.
//! - `count-down` (blocking, payload `{"millis": N}`): works for N milliseconds, a
//!   millisecond at a time, stopping early when the attempt is cancelled or handed back.
//!
//! Run it beside `herder dev` (or any coordinator) and submit to it:
//!
//! ```text
//! cargo run -p herder-runtime --example greeter_worker -- 127.0.0.1:7070 greeter-1
//! herder submit greet --payload '{"name":"Ada"}' --wait
//! ```
//!
//! SIGTERM or Ctrl-C drains it: running attempts get `HERDER_DRAIN_TIMEOUT_MILLIS` (default
//! 10 s) to finish, the rest are handed back and run elsewhere without costing an attempt.

use std::time::Duration;

use herder_runtime::{TaskContext, TaskError, Worker};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Greeting {
    name: String,
    #[serde(default)]
    shout: bool,
}

#[derive(Serialize)]
struct Greeted {
    text: String,
}

async fn greet(greeting: Greeting, ctx: TaskContext) -> Result<Greeted, TaskError> {
    let name = greeting.name.trim();
    if name.is_empty() {
        return Err(TaskError::permanent("the name is empty"));
    }
    ctx.progress(format_args!("greeting {name}"));
    let text = format!("Hello, {name}!");
    Ok(Greeted {
        text: if greeting.shout {
            text.to_uppercase()
        } else {
            text
        },
    })
}

#[derive(Deserialize)]
struct CountDown {
    millis: u64,
}

fn count_down(work: CountDown, ctx: TaskContext) -> Result<u64, TaskError> {
    for done in 0..work.millis {
        if ctx.is_cancelled() {
            return Err(TaskError::retry(format!("stopped after {done} ms")));
        }
        if done % 100 == 0 {
            ctx.progress(format_args!("{done} of {} ms", work.millis));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(work.millis)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let coordinator = args.next().unwrap_or_else(|| "127.0.0.1:7070".to_string());
    let id = args.next().unwrap_or_else(|| "greeter-1".to_string());
    let drain_millis = std::env::var("HERDER_DRAIN_TIMEOUT_MILLIS")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or(10_000);

    let worker = Worker::builder()
        .id(id)
        .coordinators([coordinator])
        .capacity(4)
        .drain_timeout(Duration::from_millis(drain_millis))
        .task("greet", greet)
        .blocking_task("count-down", count_down)
        .start()?;
    herder_runtime::terminated().await;
    worker.drain().await;
    Ok(())
}
