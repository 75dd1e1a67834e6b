//! Answers about the group itself (`CLUSTER`, `WORKERS`, `TRANSFER_LEADER`), judged as
//! they leave a coordinator, beside the confirmation of the reads among them.

use std::collections::BTreeSet;

use herder_core::ids::NodeId;
use herder_core::protocol::{ClientReply, ErrorCode, WorkerView};

use super::World;
use crate::checker::Check;

impl World {
    /// Judges what member `c` answers on connection `conn` when it is about the group.
    pub(super) fn check_group_answer(
        &mut self,
        c: usize,
        conn: usize,
        reply: &ClientReply,
    ) -> Check {
        match reply {
            ClientReply::Cluster { cluster, .. } => {
                self.count("client: a CLUSTER answer judged");
                self.checker.check_cluster_view(c, cluster)
            }
            ClientReply::WorkerList { workers, .. } => {
                self.count("client: a WORKERS answer judged");
                self.check_worker_list(workers)
            }
            ClientReply::TransferStarted { request_id, to } => {
                self.transfers.remove(&(conn, *request_id));
                self.checker.check_transfer_started(c, to)
            }
            ClientReply::Error {
                request_id: Some(request_id),
                code,
                message,
            } => match self.transfers.remove(&(conn, *request_id)) {
                // Refused as invalid: only a hand-over to itself or to no member may be.
                Some(to) if *code == ErrorCode::InvalidRequest => {
                    let me = NodeId(super::nodes::coordinator_address(c));
                    // (Any member: refused too when every other member abstains.)
                    let valid = to.is_some_and(|to| {
                        to != me
                            && (0..self.coords.len())
                                .any(|d| to.0 == super::nodes::coordinator_address(d))
                    });
                    if valid && self.coords.len() > 1 {
                        return Err(format!(
                            "TRANSFER_LEADER to a valid member, asked of coord-{c}, refused as invalid: {message}"
                        ));
                    }
                    Ok(())
                }
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// A `WORKERS` answer describes worker processes that exist as they are: each one once,
    /// with the capacity, prefetch and task kinds that process registered, and no more
    /// attempts held than its slots and waiting room. (The list is the leader's live registry,
    /// which is not replicated: which workers it holds after a change of leader depends on
    /// which have reconnected, so it is judged for truth and for the read's confirmation, not
    /// against the log.)
    fn check_worker_list(&self, workers: &[WorkerView]) -> Check {
        let mut seen = BTreeSet::new();
        for view in workers {
            let node = view
                .id
                .as_str()
                .strip_prefix('w')
                .and_then(|w| w.parse::<usize>().ok())
                .and_then(|w| self.workers.get(w));
            let (Some(node), Some(tasks)) =
                (node, self.checker.worker_set(&view.id, view.incarnation))
            else {
                return Err(format!(
                    "WORKERS lists {} incarnation {}, a worker process that never started",
                    view.id, view.incarnation
                ));
            };
            let shown: BTreeSet<String> = view.tasks.iter().cloned().collect();
            let config = &node.config;
            if !seen.insert(view.id.clone())
                || view.capacity != config.capacity
                || view.prefetch != config.prefetch
                || shown != *tasks
                || view.running > config.capacity + config.prefetch
            {
                return Err(format!(
                    "WORKERS shows {view:?}, but that process registered capacity {}, prefetch {} and kinds {tasks:?} (or the worker is listed twice)",
                    config.capacity, config.prefetch
                ));
            }
        }
        Ok(())
    }
}
