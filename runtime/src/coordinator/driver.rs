//! The driver: the only code that touches the `Coordinator`. It feeds inputs, timers and
//! durability reports in, and performs every output.

use std::collections::HashMap;
use std::sync::Arc;

use herder_core::coordinator::{BatchId, Coordinator, Event, Link, Output, PersistBatch};
use herder_core::ids::ConnectionId;
use herder_core::job::JobState;
use herder_core::protocol::codec::FrameError;
use herder_core::protocol::{ClientReply, CoordinatorToWorker, ErrorCode};
use tokio::sync::{mpsc, watch};

use super::{CoordinatorError, Input};
use crate::clock::{sleep_until, Clock};
use crate::metrics::{Metrics, Observation, WorkerObservation};
use crate::net::{Inbound, Outbound, SendError, Unanswered};
use crate::peer::PeerLinks;

/// Encoded log-entry bytes waiting for the disk beyond which the driver stops taking client
/// requests (workers' results and heartbeats, and other members' messages, keep flowing)
/// until the store catches up.
const UNWRITTEN_BYTES_MAX: u64 = 32 * 1024 * 1024;
/// Inputs the driver takes in one go before draining outputs and running due timers.
const INPUT_BURST_MAX: usize = 512;
/// How often the wall clock is read (see `Coordinator::handle_wall_clock`).
const WALL_CLOCK_READ_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) struct Driver {
    pub(super) coordinator: Coordinator,
    pub(super) clock: Clock,
    pub(super) conns: HashMap<ConnectionId, Outbound>,
    /// Requests read from each client connection and not yet answered.
    pub(super) unanswered: HashMap<ConnectionId, Unanswered>,
    /// Connections with messages corked in this drain: each gets one write at its end.
    pub(super) to_flush: Vec<ConnectionId>,
    pub(super) batches: std::sync::mpsc::Sender<PersistBatch>,
    pub(super) peers: PeerLinks,
    pub(super) metrics: Arc<Metrics>,
}

impl Driver {
    pub(super) async fn run(
        mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut clients: mpsc::Receiver<Input>,
        mut durable: mpsc::UnboundedReceiver<Result<BatchId, String>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), CoordinatorError> {
        self.drain()?;
        // The wall clock is read once a second, so a step (an operator's or NTP's) reaches the
        // coordinator within one: it takes steps of a second or more and ignores drift.
        let mut wall_reads = tokio::time::interval(WALL_CLOCK_READ_INTERVAL);
        wall_reads.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Timers first, whatever the input rate: each turn of the loop takes at most one
            // burst of inputs, so heartbeat loss, lease deadlines, retries and waits are never
            // held back by a flood.
            let timer = self
                .coordinator
                .poll_timeout()
                .map(|at| self.clock.deadline(at));
            if timer.is_some_and(|at| at <= tokio::time::Instant::now()) {
                self.coordinator.handle_timeout(self.clock.now());
                self.drain()?;
                continue;
            }
            // While the disk is behind, client requests wait in their queue (and then in TCP).
            let taking_clients = self.coordinator.unwritten_bytes() < UNWRITTEN_BYTES_MAX;
            tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    tracing::info!("Coordinator shutting down");
                    return Ok(());
                }
                report = durable.recv() => match report {
                    Some(Ok(batch)) => self.coordinator.handle_persisted(self.clock.now(), batch),
                    Some(Err(error)) => {
                        tracing::error!(%error, "Durable write failed; stopping so no unwritten state is ever acknowledged");
                        return Err(CoordinatorError::StoreThread(error));
                    }
                    None => return Err(CoordinatorError::StoreThread("store thread exited".into())),
                },
                input = inputs.recv() => {
                    let Some(input) = input else { return Ok(()) };
                    self.handle(input);
                    self.take_burst(&mut inputs, false);
                }
                input = clients.recv(), if taking_clients => {
                    let Some(input) = input else { return Ok(()) };
                    self.handle(input);
                    self.take_burst(&mut clients, true);
                }
                _ = sleep_until(timer) => self.coordinator.handle_timeout(self.clock.now()),
                _ = wall_reads.tick() => {
                    self.coordinator.handle_wall_clock(self.clock.now(), crate::clock::read_wall_clock());
                }
            }
            self.drain()?;
        }
    }

    /// Handles what else is queued on `queue`, up to a burst (and, for the client queue, only
    /// while the disk keeps up).
    fn take_burst(&mut self, queue: &mut mpsc::Receiver<Input>, clients: bool) {
        for _ in 1..INPUT_BURST_MAX {
            if clients && self.coordinator.unwritten_bytes() >= UNWRITTEN_BYTES_MAX {
                break;
            }
            match queue.try_recv() {
                Ok(input) => self.handle(input),
                Err(_) => break,
            }
        }
    }

    fn handle(&mut self, input: Input) {
        let now = self.clock.now();
        match input {
            Input::Opened(conn, outbound, unanswered) => {
                self.conns.insert(conn, outbound);
                if let Some(unanswered) = unanswered {
                    self.unanswered.insert(conn, unanswered);
                }
            }
            // The frame's budget is given back once its message is handled (`_bytes` drops).
            Input::Worker(conn, Inbound::Message(message), _bytes) => {
                self.coordinator.handle_worker_message(now, conn, message)
            }
            Input::Client(conn, caller, Inbound::Message(message), _bytes) => self
                .coordinator
                .handle_client_message(now, conn, &caller, message),
            Input::Worker(conn, Inbound::Malformed(error), _) => {
                self.malformed(conn, Link::Worker, &error)
            }
            Input::Client(conn, _, Inbound::Malformed(error), _) => {
                self.malformed(conn, Link::Client, &error)
            }
            Input::Worker(conn, Inbound::Closed(_), _)
            | Input::Client(conn, _, Inbound::Closed(_), _) => {
                self.conns.remove(&conn);
                self.unanswered.remove(&conn);
                self.coordinator.handle_closed(now, conn);
            }
            Input::Peer(from, message) => self.coordinator.handle_peer_message(now, &from, message),
            Input::Observe(answer) => {
                let _ = answer.send(self.observe());
            }
        }
    }

    /// The gauges a scrape reports, read now.
    fn observe(&self) -> Observation {
        let now = self.clock.now();
        let mut jobs_by_state = [0u64; JobState::ALL.len()];
        for job in self.coordinator.table().jobs() {
            if let Some(slot) = JobState::ALL.iter().position(|s| *s == job.state) {
                jobs_by_state[slot] += 1;
            }
        }
        let replica = self.coordinator.replica();
        let wall = self.clock.wall_at_epoch().at(now);
        Observation {
            queues: self.coordinator.table().queue_views(wall),
            jobs_by_state,
            term: replica.term().0,
            last_index: replica.last_index().0,
            commit_index: replica.committed_index().0,
            applied_index: replica.applied_index().0,
            is_leader: self.coordinator.is_acting_leader(),
            leader: replica.leader().map(|id| id.0.clone()),
            workers: self
                .coordinator
                .workers()
                .map(|w| WorkerObservation {
                    id: w.id.0.clone(),
                    alive: w.alive,
                    capacity: w.capacity,
                    running: u32::try_from(w.leases.len()).unwrap_or(u32::MAX),
                    heartbeat_age: now.saturating_since(w.last_heartbeat),
                })
                .collect(),
        }
    }

    fn malformed(&mut self, conn: ConnectionId, link: Link, error: &FrameError) {
        self.coordinator
            .handle_malformed(self.clock.now(), conn, link, error);
    }

    /// Performs every pending output; the messages for each connection leave together in one
    /// write at the end.
    fn drain(&mut self) -> Result<(), CoordinatorError> {
        let drained = self.drain_outputs();
        for conn in std::mem::take(&mut self.to_flush) {
            let Some(outbound) = self.conns.get(&conn) else {
                continue;
            };
            if let Err(error) = outbound.flush() {
                tracing::warn!(%conn, %error, "dropping connection");
                self.close_after_send_failure(conn);
            }
        }
        drained
    }

    fn drain_outputs(&mut self) -> Result<(), CoordinatorError> {
        while let Some(output) = self.coordinator.poll_output() {
            match output {
                Output::ToWorker { conn, message } => self.send_worker(conn, &message),
                Output::ToClient { conn, message } => self.send_client(conn, &message),
                Output::Close { conn } => {
                    if let Some(outbound) = self.conns.remove(&conn) {
                        outbound.close();
                    }
                }
                Output::Persist(batch) => {
                    if self.batches.send(batch).is_err() {
                        return Err(CoordinatorError::StoreThread("store thread exited".into()));
                    }
                }
                Output::Event(event) => {
                    self.metrics.event(&event);
                    log_event(&event);
                }
                Output::ToPeer { to, message } => self.peers.send(&to, message),
            }
        }
        Ok(())
    }

    fn send_worker(&mut self, conn: ConnectionId, message: &CoordinatorToWorker) {
        if let Err(error) = self.cork(conn, message) {
            tracing::warn!(%conn, %error, "dropping worker connection");
            self.close_after_send_failure(conn);
        }
    }

    fn send_client(&mut self, conn: ConnectionId, message: &ClientReply) {
        if !self.conns.contains_key(&conn) {
            return;
        }
        if message.request_id().is_some() {
            if let Some(unanswered) = self.unanswered.get(&conn) {
                unanswered.answered();
            }
        }
        match self.cork(conn, message) {
            Ok(()) => {}
            Err(SendError::Encode(error)) => {
                // A reply too large for one frame (e.g. a huge LIST): answer with a typed error.
                let fallback = ClientReply::Error {
                    request_id: message.request_id(),
                    code: ErrorCode::ReplyTooLarge,
                    message: format!("the reply does not fit in one frame ({error}); ask for less, e.g. a smaller --limit"),
                };
                if self.cork(conn, &fallback).is_err() {
                    self.close_after_send_failure(conn);
                }
            }
            Err(error) => {
                tracing::warn!(%conn, %error, "dropping client connection");
                self.close_after_send_failure(conn);
            }
        }
    }

    /// Corks `message` on `conn` (nothing if it is gone), which then gets its write at the end
    /// of the drain.
    fn cork<M: serde::Serialize>(
        &mut self,
        conn: ConnectionId,
        message: &M,
    ) -> Result<(), SendError> {
        let Some(outbound) = self.conns.get(&conn) else {
            return Ok(());
        };
        if outbound.send_corked(message)? {
            self.to_flush.push(conn);
        }
        Ok(())
    }

    fn close_after_send_failure(&mut self, conn: ConnectionId) {
        if let Some(outbound) = self.conns.remove(&conn) {
            outbound.close();
        }
    }
}

/// Events become log lines; their `Display` already tells the story in plain words.
fn log_event(event: &Event) {
    match event {
        Event::StaleResultRejected { .. }
        | Event::WorkerLost { .. }
        | Event::WorkerRejected { .. }
        | Event::MalformedFrame { .. }
        | Event::JobFailed { .. }
        | Event::LeaseExpired { .. }
        | Event::SnapshotRefused { .. }
        | Event::FollowerLostEntries { .. }
        | Event::PeerIgnored { .. }
        | Event::PeerProtocolViolation { .. } => {
            tracing::warn!("{event}")
        }
        // A member cut off from the others pre-votes every election timeout; only real
        // elections are news.
        Event::ElectionStarted { pre_vote: true, .. } | Event::SubmitRejected { .. } => {
            tracing::debug!("{event}")
        }
        // Everything else, leader elected, took over, stepped down, elections, transfers and
        // snapshots included, is the story an operator follows.
        _ => tracing::info!("{event}"),
    }
}
