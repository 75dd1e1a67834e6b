//! The store thread: group commit of persistence batches to SQLite, one transaction for
//! everything queued while the last one committed.

use herder_core::coordinator::{BatchId, PersistBatch};
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::store::Store;

pub(super) fn store_loop(
    mut store: Store,
    batches: std::sync::mpsc::Receiver<PersistBatch>,
    durable: mpsc::UnboundedSender<Result<BatchId, String>>,
    metrics: &Metrics,
) {
    while let Ok(first) = batches.recv() {
        // Group commit: everything queued while the last transaction was committing goes into
        // this one.
        let mut group = vec![first];
        while let Ok(next) = batches.try_recv() {
            group.push(next);
        }
        let last = group.last().map(|b| b.id);
        let records = group.iter().flat_map(|batch| batch.records.iter());
        let count = group.iter().map(|batch| batch.records.len()).sum();
        let started = std::time::Instant::now();
        let result = store.write(records).map_err(|e| e.to_string());
        metrics.storage_commit(started.elapsed(), count);
        let failed = result.is_err();
        let report = result.and_then(|()| last.ok_or_else(|| "empty group".to_owned()));
        if durable.send(report).is_err() || failed {
            return;
        }
    }
}
