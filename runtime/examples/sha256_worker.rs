//! A worker serving `user-sha256`, the built-in `sha256` written as a user's own async handler
//! (payload `{"text": "..."}`), to measure what the handler path costs against the built-in.
//!
//! ```text
//! cargo run --release -p herder-runtime --example sha256_worker -- 127.0.0.1:7070 w1 4
//! herder bench --jobs 20000 --concurrency 4 --task-json '{"kind":"user-sha256","payload":{"text":"herder"}}'
//! ```

use herder_runtime::{TaskContext, TaskError, Worker};
use serde::Deserialize;

#[derive(Deserialize)]
struct Text {
    text: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let coordinator = args.next().unwrap_or_else(|| "127.0.0.1:7070".to_string());
    let id = args.next().unwrap_or_else(|| "sha256-worker-1".to_string());
    let capacity = args.next().and_then(|c| c.parse().ok()).unwrap_or(4);
    let worker = Worker::builder()
        .id(id)
        .coordinators([coordinator])
        .capacity(capacity)
        .task("user-sha256", |input: Text, _ctx: TaskContext| async move {
            Ok::<_, TaskError>(herder_core::tasks::sha256_hex(&input.text))
        })
        .start()?;
    herder_runtime::terminated().await;
    worker.drain().await;
    Ok(())
}
