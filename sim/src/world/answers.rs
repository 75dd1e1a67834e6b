//! Answers to every request but submissions (which `Checker::check_submit_reply` and the
//! batch checks judge), as they leave a coordinator: what the group says of itself
//! (`CLUSTER`, `WORKERS`, `TRANSFER_STARTED`) must be true, and every `ERROR` (and every
//! refused worker registration) must be a refusal that fits what was asked. The reads among them are judged for their confirmation
//! and against the committed log elsewhere (`checker/reads.rs`).

use std::collections::BTreeSet;

use herder_core::ids::NodeId;
use herder_core::protocol::{
    ClientReply, CoordinatorToWorker, ErrorCode, RegisterRejection, WorkerView,
};

use super::network::Peer;
use super::World;
use crate::checker::Check;

/// A request other than a submission, as it reached a coordinator (to judge a refusal).
#[derive(Clone, Debug)]
pub(super) enum Asked {
    /// A hand-over of leadership, to the member named (none: any).
    Transfer(Option<NodeId>),
    /// Any other request, by its type.
    Other(&'static str),
}

impl World {
    /// Judges what member `c` answers on connection `conn` to a request that is not a
    /// submission.
    pub(super) fn check_request_answer(
        &mut self,
        c: usize,
        conn: usize,
        reply: &ClientReply,
    ) -> Check {
        let asked = reply
            .request_id()
            .and_then(|request| self.asked.remove(&(conn, request)));
        match reply {
            ClientReply::Cluster { cluster, .. } => {
                self.count("client: a CLUSTER answer judged");
                self.checker.check_cluster_view(c, cluster)
            }
            ClientReply::WorkerList { workers, .. } => {
                self.count("client: a WORKERS answer judged");
                self.check_worker_list(workers)
            }
            ClientReply::TransferStarted { to, .. } => self.checker.check_transfer_started(c, to),
            ClientReply::Error { code, message, .. } => match asked {
                // A submission, or a reader's write (judged where they are recorded).
                None => Ok(()),
                Some(asked) => self.check_refusal(c, &asked, *code, message),
            },
            _ => Ok(()),
        }
    }

    /// A registration refused on connection `conn` must deserve it. The workload's workers
    /// always register within every limit, and there are far fewer of them than the registry
    /// holds, so the only refusal that can fit is a worker id held by another live process;
    /// and that needs another process of that worker to have existed (a worker's only
    /// process, reconnecting, is the same incarnation and must be let back in).
    pub(super) fn check_worker_refusal(&self, conn: usize, message: &CoordinatorToWorker) -> Check {
        let CoordinatorToWorker::RegisterRejected { reason, message } = message else {
            return Ok(());
        };
        let Some(record) = self.conns.get(conn) else {
            return Ok(());
        };
        let Peer::Worker(w) = record.peer else {
            return Ok(());
        };
        let other_process = record.peer_gen > 0 || self.workers[w].gen > record.peer_gen;
        if *reason == RegisterRejection::DuplicateWorkerId && other_process {
            return Ok(());
        }
        Err(format!(
            "worker w{w} (process {}) refused registration {reason:?} ({message}); no other process of it ever ran, or the refusal cannot fit a worker of the workload",
            record.peer_gen
        ))
    }

    /// An `ERROR` answering `asked` must be the one refusal that fits it here: a job the
    /// request named and the coordinator does not hold (`JOB_NOT_FOUND`, judged against the
    /// committed log as the read it answers), or a hand-over to itself or to no member
    /// (`INVALID_REQUEST`). Nothing else the workload asks can be refused: its requests are
    /// well formed, within every limit, and its clients may make them.
    fn check_refusal(&mut self, c: usize, asked: &Asked, code: ErrorCode, message: &str) -> Check {
        match (asked, code) {
            (Asked::Other("STATUS" | "WAIT" | "CANCEL"), ErrorCode::JobNotFound) => Ok(()),
            (Asked::Transfer(to), ErrorCode::InvalidRequest) => {
                let me = NodeId(super::nodes::coordinator_address(c));
                // (Any member: refused too when every other member abstains.)
                let valid = to.as_ref().is_some_and(|to| {
                    *to != me
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
            (asked, code) => Err(format!(
                "coord-{c} refused {asked:?} with ERROR {code:?} ({message}), which no such request of the workload can deserve"
            )),
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
