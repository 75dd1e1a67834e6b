//! The far end of a link: the outcome of a connect attempt, a message or a close reaching the
//! machine it is addressed to, unless the process it was meant for has died since.

use herder_core::auth::{Caller, Role};
use herder_core::client::ConnectAttempt;
use herder_core::coordinator::Link;
use herder_core::ids::{ConnectionId, LogIndex, Term};
use herder_core::protocol::{
    CancelReason, ClientRequest, CoordinatorToWorker, WorkerToCoordinator,
};

use super::{Conn, Down, Peer, Up};
use crate::checker::{Check, Floor};
use crate::submission::fewest_slots;
use crate::world::answers::Asked;
use crate::world::{NodeRef, SubmittedBatch, World};
use herder_core::limits::LIST_LIMIT_DEFAULT;
use herder_core::protocol::codec::WireMessage;

impl World {
    pub(in crate::world) fn connect_done(
        &mut self,
        peer: Peer,
        gen: u64,
        attempt: ConnectAttempt,
        coord: usize,
        ok: bool,
    ) -> Check {
        let (current_gen, current_attempt) = match peer {
            Peer::Worker(w) => (self.workers[w].gen, self.workers[w].attempt),
            Peer::Client(c) => (0, self.clients[c].attempt),
        };
        if gen != current_gen || current_attempt != Some(attempt) {
            return Ok(());
        }
        let up = self.coords.get(coord).is_some_and(|c| c.machine.is_some());
        let there = NodeRef::Coordinator(coord);
        if self.is_cut(peer.node(), there) || self.is_cut(there, peer.node()) {
            // The handshake cannot cross: the attempt hangs until the peer's own connect
            // timeout gives up on it.
            self.count("net: connect lost in a partition");
            self.note(
                peer.node(),
                format_args!(
                    "connect to coord-{coord} lost in a partition (attempt {})",
                    attempt.0
                ),
            );
            return Ok(());
        }
        let conn = (ok && up).then(|| self.open_conn(coord, peer, gen, attempt));
        match conn {
            Some(conn) => self.note(
                peer.node(),
                format_args!(
                    "connected to coord-{coord} (conn {conn}, attempt {})",
                    attempt.0
                ),
            ),
            None => self.note(
                peer.node(),
                format_args!("connect to coord-{coord} failed (attempt {})", attempt.0),
            ),
        }
        let reason = if up {
            "connection refused (fault)"
        } else {
            "connection refused"
        };
        match peer {
            Peer::Worker(w) => {
                let node = &mut self.workers[w];
                node.conn = conn;
                let local = node.clock.local(self.now);
                if let Some(m) = &mut node.machine {
                    match conn {
                        Some(_) => m.handle_connected(local, attempt),
                        None => m.handle_connect_failed(local, attempt, reason),
                    }
                }
                self.drain_worker(w)
            }
            Peer::Client(c) => {
                let node = &mut self.clients[c];
                node.conn = conn;
                let local = node.clock.local(self.now);
                match conn {
                    Some(_) => node.machine.handle_connected(local, attempt),
                    None => node.machine.handle_connect_failed(local, attempt, reason),
                }
                self.drain_client(c)
            }
        }
    }

    pub(in crate::world) fn deliver_up(&mut self, conn: usize, msg: Up) -> Check {
        let Conn {
            coord,
            coord_gen,
            open,
            up_live,
            peer,
            ..
        } = self.conns[conn];
        // Data for a coordinator process that has since died died with it: the restarted
        // process never had this connection.
        if !up_live || self.coords[coord].gen != coord_gen {
            return Ok(());
        }
        if !open {
            self.count("net: data delivered after its connection closed");
        }
        self.note(
            NodeRef::Coordinator(coord),
            format_args!("<- {} (conn {conn}) {msg:?}", peer.node()),
        );
        let node = &mut self.coords[coord];
        let local = node.clock.local(self.now);
        let Some(machine) = &mut node.machine else {
            return Ok(());
        };
        let id = ConnectionId(conn as u64);
        match msg {
            Up::Worker(message) => {
                // A result for a lease that is not current when an acting leader gets it can
                // never count (leases never become current again): this process must never
                // acknowledge it as accepted (checked as its outputs leave), and the model
                // holds every table to "it changed nothing" (invariant 3).
                if let WorkerToCoordinator::TaskResult {
                    job_id, lease_id, ..
                } = &message
                {
                    if machine.is_acting_leader()
                        && !machine.table().is_current_lease(*job_id, *lease_id)
                    {
                        self.stale_results.insert((coord, coord_gen, *lease_id));
                    }
                }
                let says_draining = matches!(
                    message,
                    WorkerToCoordinator::Draining {}
                        | WorkerToCoordinator::Register { draining: true, .. }
                );
                let leading = machine.is_acting_leader();
                let (term, log_end) = (machine.replica().term(), machine.replica().last_index());
                machine.handle_worker_message(local, id, message);
                if says_draining && leading {
                    self.heard_draining(coord, conn, term, log_end)?;
                }
            }
            Up::Garbage(error) => {
                let link = match peer {
                    Peer::Worker(_) => Link::Worker,
                    Peer::Client(_) => Link::Client,
                };
                machine.handle_malformed(local, id, link, &error);
            }
            Up::Client(message) if is_reader(peer, &self.readers) && writes(&message) => {
                // A reader's write: handed over with the reader's caller, and judged as its
                // answer leaves (it must be FORBIDDEN); nothing of it is recorded as a
                // submission, since none may happen.
                self.reader_writes.insert((conn, message.request_id()));
                machine.handle_client_message(local, id, &reader(), message)
            }
            Up::Client(message) => {
                let caller = if is_reader(peer, &self.readers) {
                    reader()
                } else {
                    Caller::anonymous()
                };
                if let ClientRequest::Status { request_id, job_id }
                | ClientRequest::Wait {
                    request_id, job_id, ..
                }
                | ClientRequest::Cancel { request_id, job_id } = &message
                {
                    let floor = self.checker.read_floor(job_id);
                    self.read_floors
                        .insert((conn, *request_id), Floor::Job(floor));
                }
                let asked = match &message {
                    ClientRequest::Submit { .. } | ClientRequest::SubmitBatch { .. } => None,
                    ClientRequest::TransferLeader { to, .. } => Some(Asked::Transfer(to.clone())),
                    other => Some(Asked::Other(other.type_name())),
                };
                if let Some(asked) = asked {
                    self.asked.insert((conn, message.request_id()), asked);
                }
                if let ClientRequest::Status { request_id, .. }
                | ClientRequest::List { request_id, .. }
                | ClientRequest::Workers { request_id } = &message
                {
                    if let Some(mark) = self.checker.read_mark(coord) {
                        self.read_marks.insert((conn, *request_id), (coord, mark));
                    }
                }
                if let ClientRequest::List {
                    request_id,
                    state,
                    limit,
                    before,
                } = &message
                {
                    let limit = limit.unwrap_or(LIST_LIMIT_DEFAULT) as usize;
                    if let Some(floor) = self.checker.list_floor(limit, *state, *before) {
                        // (`self.count` would borrow the whole world, `node` is held.)
                        *self
                            .coverage
                            .entry("client: a listing judged against the committed log")
                            .or_default() += 1;
                        self.read_floors
                            .insert((conn, *request_id), Floor::List(floor));
                    }
                }
                if let Some((request_id, sent)) = matches!(message, ClientRequest::Submit { .. })
                    .then(|| message.clone().into_submission())
                    .flatten()
                {
                    let committed = self.checker.model.applied;
                    if let Some(key) = &sent.idempotency_key {
                        self.submit_keys
                            .insert((conn, request_id), (key.clone(), committed));
                    }
                    self.submit_dp.insert(
                        (conn, request_id),
                        fewest_slots(&sent.task, sent.partitions),
                    );
                    self.submit_jobs
                        .insert((conn, request_id), (sent, committed));
                }
                if let ClientRequest::SubmitBatch { request_id, jobs } = &message {
                    let committed = self.checker.model.applied;
                    let arrived = machine.table().applied_index();
                    let items = jobs
                        .iter()
                        .map(|job| {
                            let key = job.idempotency_key.clone().map(|k| (k, committed));
                            (key, fewest_slots(&job.task, job.partitions))
                        })
                        .collect();
                    let batch = SubmittedBatch {
                        arrived,
                        committed,
                        jobs: jobs.clone(),
                        items,
                    };
                    self.submit_batches.insert((conn, *request_id), batch);
                }
                machine.handle_client_message(local, id, &caller, message)
            }
        }
        self.drain_coord(coord)
    }

    /// An acting leader handled a worker's word that it drains. If its registry now holds that
    /// process on this connection, it must mark it draining, and assign it nothing from here.
    fn heard_draining(
        &mut self,
        coord: usize,
        conn: usize,
        term: Term,
        log_end: LogIndex,
    ) -> Check {
        let Peer::Worker(w) = self.conns[conn].peer else {
            return Ok(());
        };
        let Some(&incarnation) = self.incarnations.get(&(w, self.conns[conn].peer_gen)) else {
            return Ok(());
        };
        let worker = self.workers[w].config.worker_id.clone();
        let Some(machine) = &self.coords[coord].machine else {
            return Ok(());
        };
        let entry = machine.workers().find(|e| {
            e.id == worker
                && e.incarnation == incarnation
                && e.conn == Some(ConnectionId(conn as u64))
        });
        let Some(entry) = entry else {
            return Ok(());
        };
        if !entry.draining {
            return Err(format!(
                "drain: coord-{coord} registers {worker} (incarnation {}) on conn {conn} after it said it drains, but not as draining",
                incarnation.0
            ));
        }
        self.checker
            .drain_heard(coord, &worker, incarnation, term, log_end);
        Ok(())
    }

    pub(in crate::world) fn deliver_down(&mut self, conn: usize, msg: Down) -> Check {
        let Conn {
            open,
            down_live,
            peer,
            peer_gen,
            attempt,
            ..
        } = self.conns[conn];
        if !down_live {
            return Ok(());
        }
        if !open {
            self.count("net: data delivered after its connection closed");
        }
        self.note(peer.node(), format_args!("<- conn {conn} {msg:?}"));
        match (peer, msg) {
            (Peer::Worker(w), Down::Worker(message)) => {
                let node = &mut self.workers[w];
                if node.gen != peer_gen {
                    return Ok(());
                }
                let local = node.clock.local(self.now);
                let mut timed_out_waiting = false;
                if let Some(m) = &mut node.machine {
                    if let CoordinatorToWorker::TaskCancel {
                        lease_id,
                        reason: CancelReason::DeadlineExpired,
                        ..
                    } = &message
                    {
                        timed_out_waiting = m.waiting().any(|(lease, _)| lease == *lease_id);
                    }
                    m.handle_message(local, attempt, message);
                }
                if timed_out_waiting {
                    // Allowed (an attempt ahead overran its deadline) but worth seeing.
                    self.count("worker: a waiting attempt timed out before it started");
                }
                self.drain_worker(w)
            }
            (Peer::Client(c), Down::Client(reply)) => {
                let node = &mut self.clients[c];
                let local = node.clock.local(self.now);
                node.machine.handle_message(local, attempt, reply);
                self.drain_client(c)
            }
            (peer, msg) => Err(format!("simulator bug: {msg:?} routed to {}", peer.node())),
        }
    }

    pub(in crate::world) fn closed_at_coord(&mut self, conn: usize) -> Check {
        self.conns[conn].up_live = false;
        let Conn {
            coord, coord_gen, ..
        } = self.conns[conn];
        let node = &mut self.coords[coord];
        if node.gen != coord_gen {
            return Ok(());
        }
        let local = node.clock.local(self.now);
        if let Some(m) = &mut node.machine {
            m.handle_closed(local, ConnectionId(conn as u64));
        }
        self.note(
            NodeRef::Coordinator(coord),
            format_args!("conn {conn} closed"),
        );
        self.drain_coord(coord)
    }

    pub(in crate::world) fn closed_at_peer(&mut self, conn: usize) -> Check {
        self.conns[conn].down_live = false;
        let Conn {
            peer,
            peer_gen,
            attempt,
            ..
        } = self.conns[conn];
        self.note(peer.node(), format_args!("conn {conn} reset"));
        match peer {
            Peer::Worker(w) => {
                let node = &mut self.workers[w];
                if node.gen != peer_gen {
                    return Ok(());
                }
                if node.conn == Some(conn) {
                    node.conn = None;
                }
                let local = node.clock.local(self.now);
                if let Some(m) = &mut node.machine {
                    m.handle_disconnected(local, attempt, "connection reset");
                }
                self.drain_worker(w)
            }
            Peer::Client(c) => {
                let node = &mut self.clients[c];
                if node.conn == Some(conn) {
                    node.conn = None;
                }
                let local = node.clock.local(self.now);
                node.machine
                    .handle_disconnected(local, attempt, "connection reset");
                self.drain_client(c)
            }
        }
    }
}

/// Whether `peer` is a client holding a reader's token.
fn is_reader(peer: Peer, readers: &std::collections::BTreeSet<usize>) -> bool {
    matches!(peer, Peer::Client(c) if readers.contains(&c))
}

/// The caller a reader client's connection authenticated as.
fn reader() -> Caller {
    Caller {
        name: Some("reader".to_owned()),
        role: Role::Reader,
    }
}

/// Whether `request` changes anything, by the world's own list (not the coordinator's rule).
fn writes(request: &ClientRequest) -> bool {
    matches!(
        request,
        ClientRequest::Submit { .. }
            | ClientRequest::SubmitBatch { .. }
            | ClientRequest::Cancel { .. }
            | ClientRequest::Purge { .. }
            | ClientRequest::SetQueue { .. }
            | ClientRequest::TransferLeader { .. }
    )
}
