//! The event queue: everything that can happen at a point of virtual time, the order in which
//! the queue hands it out, and how an event reaches its handler. A delivery on a link a
//! partition cuts is held there; an event for a paused node waits at that node; anything else
//! goes to its handler at once.

use std::cmp::Ordering;

use herder_core::client::ConnectAttempt;
use herder_core::coordinator::BatchId;
use herder_core::ids::LeaseId;
use herder_core::protocol::PeerMessage;

use super::network::{Dir, Down, Peer, Up};
use super::{NodeRef, World};
use crate::checker::Check;

#[derive(Clone, Debug)]
pub(super) enum Ev {
    ConnectDone {
        peer: Peer,
        gen: u64,
        attempt: ConnectAttempt,
        coord: usize,
        ok: bool,
    },
    Up {
        conn: usize,
        msg: Up,
    },
    Down {
        conn: usize,
        msg: Down,
    },
    ClosedAtCoord {
        conn: usize,
    },
    ClosedAtPeer {
        conn: usize,
    },
    Durable {
        coord: usize,
        gen: u64,
        batch: BatchId,
    },
    TaskDone {
        worker: usize,
        gen: u64,
        lease: LeaseId,
        token: u64,
    },
    StartOp {
        client: usize,
    },
    /// Step `step` of the scenario's script comes due.
    Script {
        step: usize,
    },
    /// A few reads at once while leadership changes hands (`World::leadership_shaken`).
    ReadBurst {
        client: usize,
    },
    FaultTick,
    CoordRestart {
        coord: usize,
    },
    /// A member dies right after granting a vote or acknowledging a snapshot chunk (its
    /// process `gen`), and restarts soon: in the middle of an election or an install.
    CrashMidConsensus {
        coord: usize,
        gen: u64,
        what: &'static str,
    },
    WorkerRestart {
        worker: usize,
    },
    WorkerResume {
        worker: usize,
    },
    /// A draining worker's drain timeout ends: what still runs is handed back.
    DrainTimeout {
        worker: usize,
        gen: u64,
    },
    /// The driver of a draining worker looks whether it is drained (then the process stops).
    DrainCheck {
        worker: usize,
        gen: u64,
    },
    CoordResume {
        coord: usize,
    },
    /// The sender repeats a message (a duplicate the protocol allows).
    ResendUp {
        conn: usize,
        msg: Up,
    },
    Heal {
        id: u64,
    },
    /// Delivers the oldest message a healed partition held on one direction of a connection.
    Flush {
        conn: usize,
        dir: Dir,
    },
    FaultsEnd,
    /// The coordinator's driver gives up on a write its stalled reader never took.
    StalledOut {
        conn: usize,
    },
    /// A consensus message between coordinators, for process `gen` of `to`.
    Peer {
        from: usize,
        to: usize,
        gen: u64,
        message: PeerMessage,
    },
}

pub(super) struct Queued {
    pub(super) at: u64,
    seq: u64,
    pub(super) ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Queued) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Queued) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    // Reversed: `BinaryHeap` is a max-heap and the earliest (time, sequence) must come first.
    fn cmp(&self, other: &Queued) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl World {
    pub(super) fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// The paused node an event is addressed to, if any: it holds the event until it resumes.
    fn paused_target(&self, ev: &Ev) -> Option<NodeRef> {
        let node = match ev {
            Ev::ConnectDone {
                peer: Peer::Worker(w),
                ..
            } => NodeRef::Worker(*w),
            Ev::TaskDone { worker, .. }
            | Ev::DrainTimeout { worker, .. }
            | Ev::DrainCheck { worker, .. } => NodeRef::Worker(*worker),
            // A paused worker sends nothing, repeats included.
            Ev::ResendUp { conn, .. } => match self.conns[*conn].peer {
                Peer::Worker(w) => NodeRef::Worker(w),
                Peer::Client(_) => return None,
            },
            Ev::Down { conn, .. } | Ev::ClosedAtPeer { conn } => match self.conns[*conn].peer {
                Peer::Worker(w) => NodeRef::Worker(w),
                Peer::Client(_) => return None,
            },
            Ev::Up { conn, .. } | Ev::ClosedAtCoord { conn } => {
                NodeRef::Coordinator(self.conns[*conn].coord)
            }
            Ev::Durable { coord, .. } | Ev::Peer { to: coord, .. } => NodeRef::Coordinator(*coord),
            _ => return None,
        };
        let paused = match node {
            NodeRef::Worker(w) => self.workers[w].paused,
            NodeRef::Coordinator(c) => self.coords[c].paused,
            _ => false,
        };
        paused.then_some(node)
    }

    pub(super) fn process(&mut self, ev: Ev) -> (NodeRef, Check) {
        // A delivery across a partition, or behind one held there, waits for the heal.
        if let Some((conn, dir)) = Self::link_of(&ev) {
            if self.link_cut(conn, dir) || !self.conns[conn].held(dir).is_empty() {
                self.count("net: delivery held by a partition");
                self.note(
                    NodeRef::World,
                    format_args!("conn {conn} {dir:?}: held by a partition"),
                );
                self.conns[conn].held(dir).push_back(ev);
                return (NodeRef::World, Ok(()));
            }
        }
        self.dispatch(ev)
    }

    pub(super) fn dispatch(&mut self, ev: Ev) -> (NodeRef, Check) {
        match self.paused_target(&ev) {
            Some(NodeRef::Worker(w)) => {
                self.workers[w].stalled.push(ev);
                return (NodeRef::Worker(w), Ok(()));
            }
            Some(NodeRef::Coordinator(c)) => {
                self.coords[c].stalled.push(ev);
                return (NodeRef::Coordinator(c), Ok(()));
            }
            _ => {}
        }
        match ev {
            Ev::ConnectDone {
                peer,
                gen,
                attempt,
                coord,
                ok,
            } => (
                peer.node(),
                self.connect_done(peer, gen, attempt, coord, ok),
            ),
            Ev::Up { conn, msg } => {
                let coord = self.conns[conn].coord;
                (NodeRef::Coordinator(coord), self.deliver_up(conn, msg))
            }
            Ev::Down { conn, msg } => {
                let peer = self.conns[conn].peer;
                (peer.node(), self.deliver_down(conn, msg))
            }
            Ev::ClosedAtCoord { conn } => {
                let coord = self.conns[conn].coord;
                (NodeRef::Coordinator(coord), self.closed_at_coord(conn))
            }
            Ev::ClosedAtPeer { conn } => {
                let peer = self.conns[conn].peer;
                (peer.node(), self.closed_at_peer(conn))
            }
            Ev::Durable { coord, gen, batch } => {
                (NodeRef::Coordinator(coord), self.durable(coord, gen, batch))
            }
            Ev::TaskDone {
                worker,
                gen,
                lease,
                token,
            } => (
                NodeRef::Worker(worker),
                self.task_done(worker, gen, lease, token),
            ),
            Ev::StartOp { client } => (NodeRef::Client(client), self.start_op(client)),
            Ev::Script { step } => (NodeRef::World, self.run_script_step(step)),
            Ev::ReadBurst { client } => (NodeRef::Client(client), self.read_burst(client)),
            Ev::FaultTick => (NodeRef::World, self.fault_tick()),
            Ev::CoordRestart { coord } => {
                (NodeRef::Coordinator(coord), self.restart_coordinator(coord))
            }
            Ev::CrashMidConsensus { coord, gen, what } => (
                NodeRef::Coordinator(coord),
                self.crash_mid_consensus(coord, gen, what),
            ),
            Ev::WorkerRestart { worker } => (NodeRef::Worker(worker), self.restart_worker(worker)),
            Ev::WorkerResume { worker } => (NodeRef::Worker(worker), self.resume_worker(worker)),
            Ev::DrainTimeout { worker, gen } => {
                (NodeRef::Worker(worker), self.drain_timeout(worker, gen))
            }
            Ev::DrainCheck { worker, gen } => {
                (NodeRef::Worker(worker), self.drain_check(worker, gen))
            }
            Ev::CoordResume { coord } => {
                (NodeRef::Coordinator(coord), self.resume_coordinator(coord))
            }
            Ev::ResendUp { conn, msg } => {
                let peer = self.conns[conn].peer.node();
                self.note(peer, format_args!("-> again (conn {conn}) {msg:?}"));
                (peer, self.send_up(conn, msg, false))
            }
            Ev::Heal { id } => (NodeRef::World, self.heal(Some(id))),
            Ev::Flush { conn, dir } => self.flush(conn, dir),
            Ev::FaultsEnd => (NodeRef::World, self.faults_end()),
            Ev::StalledOut { conn } => (NodeRef::World, self.stalled_out(conn)),
            Ev::Peer {
                from,
                to,
                gen,
                message,
            } => (
                NodeRef::Coordinator(to),
                self.deliver_peer(from, to, gen, message),
            ),
        }
    }
}
