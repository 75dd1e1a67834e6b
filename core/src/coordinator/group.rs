//! Being one member of a group: what arrives from the other members, what consensus tells the
//! coordinator (elections, step-downs, confirmed reads, snapshots), and what a member answers
//! clients and workers while it does not lead.
//!
//! ```text
//!   follower ──────────────────── client/worker message ──> NOT_LEADER (the leader it knows)
//!   leader, not caught up ──────── client/worker message ──> parked (bounded)
//!   leader, first entry applied ── take over: LeaderState built, parked messages replayed
//!   leader stops leading ───────── LeaderState dropped: all it owed answered NOT_LEADER
//! ```

use std::collections::VecDeque;

use super::leader::{LeaderState, Takeover};
use super::{Coordinator, Event, Link, Output};
use crate::ids::{ConnectionId, LogIndex, NodeId, Term};
use crate::limits::PARKED_INPUTS_MAX;
use crate::protocol::{
    ClientReply, ClientRequest, ClusterView, CoordinatorToWorker, ErrorCode, MemberView,
    PeerMessage, WorkerToCoordinator,
};
use crate::replica::{ReplicaEvent, SnapshotSource, TransferError};
use crate::table::{decode_snapshot, encode_snapshot, JobTable};

/// A client or worker message held by a leader that has not caught up yet.
#[derive(Debug)]
enum Held {
    Client(ClientRequest),
    Worker(WorkerToCoordinator),
}

#[derive(Debug, Default)]
pub(super) struct Parked {
    held: VecDeque<(ConnectionId, Held)>,
}

impl Parked {
    /// Drops what a closed connection had waiting.
    pub(super) fn forget(&mut self, conn: ConnectionId) {
        self.held.retain(|(c, _)| *c != conn);
    }
}

impl SnapshotSource for JobTable {
    fn snapshot(&self) -> (LogIndex, Vec<u8>) {
        (self.applied_index(), encode_snapshot(self))
    }
}

impl Coordinator {
    /// Acts on what consensus reported (role changes first), until it reports nothing new.
    pub(super) fn settle_role(&mut self) {
        while self.handle_replica_events() {}
    }

    /// After every input: apply what committed, act on what consensus reports, replicate.
    pub(super) fn settle(&mut self) {
        // Role changes first: a member that learned of a newer term drops its leader state
        // before it applies anything else, so it never acts for a term that has ended.
        self.settle_role();
        loop {
            self.apply_committed();
            if self.handle_replica_events() {
                continue;
            }
            // Applying is done: a rotation it asked for may start now.
            let rotated = match self.leader.as_mut() {
                Some(leader) => leader.start_rotation_if_due(&mut self.member),
                None => false,
            };
            if !rotated {
                break;
            }
        }
        let m = &mut self.member;
        m.take_replica_records();
        m.replica.flush(&m.table);
        while let Some((to, message)) = m.replica.poll_message() {
            m.outputs.push_back(Output::ToPeer { to, message });
        }
        m.replica.compact();
    }

    /// Acts on every event consensus queued; false when there was none.
    fn handle_replica_events(&mut self) -> bool {
        let mut any = false;
        while let Some(event) = self.member.replica.poll_event() {
            any = true;
            match event {
                ReplicaEvent::BecameLeader { term } => {
                    self.member.event(Event::LeaderElected { term })
                }
                ReplicaEvent::SteppedDown { term, reason } => {
                    self.member.event(Event::SteppedDown {
                        term,
                        reason: reason.to_string(),
                    })
                }
                ReplicaEvent::ElectionStarted { term, pre_vote } => {
                    self.member.event(Event::ElectionStarted { term, pre_vote })
                }
                ReplicaEvent::LeaderKnown { term, leader } => {
                    self.member.event(Event::LeaderKnown { term, leader })
                }
                ReplicaEvent::ReadReady { id, index } => {
                    // Only a member that still leads acts on a confirmation: the same reply
                    // that confirmed a read may have finished a hand-over, and a read that
                    // proposes (a cancel, a purge) cannot be proposed by a follower. Its reader
                    // is told `NOT_LEADER` as the leader state steps down just after.
                    let replica = &self.member.replica;
                    let (leads, term) = (replica.is_leader(), replica.term());
                    if let Some(leader) = self
                        .leader
                        .as_mut()
                        .filter(|leader| leads && leader.term() == term)
                    {
                        leader.read_confirmed(&mut self.member, id, index);
                    }
                }
                ReplicaEvent::SnapshotReceived { index, term, data } => {
                    self.install_snapshot(index, term, &data)
                }
                ReplicaEvent::StrangerIgnored { from } => {
                    self.member.event(Event::PeerIgnored { from })
                }
                ReplicaEvent::Rejoined { term } => self.member.event(Event::Rejoined { term }),
                ReplicaEvent::FollowerLostEntries {
                    follower,
                    acknowledged,
                    holds,
                } => self.member.event(Event::FollowerLostEntries {
                    follower,
                    acknowledged,
                    holds,
                }),
                ReplicaEvent::ProtocolViolation { from, what } => self
                    .member
                    .event(Event::PeerProtocolViolation { from, what }),
            }
        }
        any |= self.sync_role();
        any
    }

    /// Keeps `LeaderState` in step with consensus: dropped when this member no longer leads the
    /// term it was built in, built once the member leads and its first entry is applied.
    fn sync_role(&mut self) -> bool {
        let replica = &self.member.replica;
        let leads = replica.is_leader();
        let term = replica.term();
        let mut changed = false;
        if self
            .leader
            .as_ref()
            .is_some_and(|leader| !leads || leader.term() != term)
        {
            if let Some(leader) = self.leader.take() {
                leader.step_down(&mut self.member);
            }
            changed = true;
        }
        if !leads && !self.parked.held.is_empty() {
            self.answer_parked_not_leader();
        }
        let caught_up = self
            .member
            .replica
            .leader_since()
            .is_some_and(|since| self.member.table.applied_index() >= since);
        if self.leader.is_none() && caught_up {
            let leader = LeaderState::take_over(&mut self.member, Takeover::Elected);
            self.leader = Some(leader);
            changed = true;
        }
        // What waited for the take-over (or for a hand-over that was abandoned) is handled now.
        let handing_over = self.member.replica.transferring_to().is_some();
        if let (Some(leader), false) = (self.leader.as_mut(), handing_over) {
            if !self.parked.held.is_empty() {
                for (conn, held) in std::mem::take(&mut self.parked.held) {
                    match held {
                        Held::Client(request) => {
                            leader.handle_client_message(&mut self.member, conn, request)
                        }
                        Held::Worker(message) => {
                            leader.handle_worker_message(&mut self.member, conn, message)
                        }
                    }
                }
                leader.schedule(&mut self.member);
                changed = true;
            }
        }
        changed
    }

    fn answer_parked_not_leader(&mut self) {
        for (conn, held) in std::mem::take(&mut self.parked.held) {
            match held {
                Held::Client(request) => self.client_not_leader(conn, request.request_id()),
                Held::Worker(_) => self.worker_not_leader(conn),
            }
        }
    }

    fn client_not_leader(&mut self, conn: ConnectionId, request_id: crate::ids::RequestId) {
        let m = &mut self.member;
        let reply = ClientReply::NotLeader {
            request_id,
            leader: m.leader_hint(Link::Client),
            uncertain: false,
            members: m.member_addresses(Link::Client),
        };
        m.send_client(conn, reply);
    }

    fn worker_not_leader(&mut self, conn: ConnectionId) {
        let m = &mut self.member;
        let reply = CoordinatorToWorker::NotLeader {
            leader: m.leader_hint(Link::Worker),
            members: m.member_addresses(Link::Worker),
        };
        m.send_worker(conn, reply);
        m.close(conn);
    }

    pub(super) fn worker_message_without_leader(
        &mut self,
        conn: ConnectionId,
        message: WorkerToCoordinator,
    ) {
        if self.member.replica.is_leader() && self.parked.held.len() < PARKED_INPUTS_MAX {
            self.parked.held.push_back((conn, Held::Worker(message)));
        } else {
            self.worker_not_leader(conn);
        }
    }

    /// Any client request: the group-wide ones are answered by any member, the rest by the
    /// acting leader (or held, or redirected).
    pub(super) fn client_message(&mut self, conn: ConnectionId, message: ClientRequest) {
        match message {
            ClientRequest::Cluster { request_id } => {
                let cluster = self.cluster_view();
                self.member.send_client(
                    conn,
                    ClientReply::Cluster {
                        request_id,
                        cluster,
                    },
                );
            }
            // Consensus decides a hand-over, whether or not this leader has caught up yet.
            ClientRequest::TransferLeader { request_id, to } => {
                self.transfer_leader(conn, request_id, to)
            }
            message => {
                // Handing over: new work waits (bounded) and is answered with the new leader's
                // name once this member steps down, or handled here if the hand-over is
                // abandoned. A leader still catching up holds it the same way.
                let handing_over = self.member.replica.transferring_to().is_some();
                if let (Some(leader), false) = (self.leader.as_mut(), handing_over) {
                    return leader.handle_client_message(&mut self.member, conn, message);
                }
                if self.member.replica.is_leader() && self.parked.held.len() < PARKED_INPUTS_MAX {
                    self.parked.held.push_back((conn, Held::Client(message)));
                } else {
                    self.client_not_leader(conn, message.request_id());
                }
            }
        }
    }

    fn transfer_leader(
        &mut self,
        conn: ConnectionId,
        request_id: crate::ids::RequestId,
        to: Option<NodeId>,
    ) {
        match self.member.replica.transfer_leadership(to) {
            Ok(to) => {
                self.member.event(Event::TransferStarted { to: to.clone() });
                self.member
                    .send_client(conn, ClientReply::TransferStarted { request_id, to });
            }
            Err(TransferError::NotLeader(_)) => self.client_not_leader(conn, request_id),
            Err(error) => self.member.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                error.to_string(),
            ),
        }
    }

    pub(super) fn peer_message(&mut self, from: &NodeId, message: PeerMessage) {
        if let PeerMessage::Hello {
            node_id,
            client_address,
            worker_address,
        } = message
        {
            let member = self.member.config.peers.contains(&node_id);
            if node_id != *from || !member {
                return self.member.event(Event::PeerIgnored { from: node_id });
            }
            let now = self.member.now;
            self.member.replica.peer_connected(now, &node_id);
            self.member.addresses.insert(
                node_id,
                super::MemberAddresses {
                    client: client_address,
                    worker: worker_address,
                },
            );
            return;
        }
        let now = self.member.now;
        self.member.replica.handle_message(now, from, message);
    }

    /// The leader sent its whole table: decode it, check it like rows read from disk, and
    /// replace ours with it.
    fn install_snapshot(&mut self, index: LogIndex, term: Term, data: &[u8]) {
        let decoded = decode_snapshot(data).and_then(|rows| {
            JobTable::from_rows(rows.clone(), index)
                .map(|table| (rows, table))
                .map_err(|e| e.to_string())
        });
        let m = &mut self.member;
        match decoded {
            Ok((rows, table)) => {
                assert!(self.leader.is_none(), "a leader never installs a snapshot");
                let jobs = rows.jobs.len();
                m.table = table;
                m.persistence.snapshot_installed(index);
                m.replica.install_snapshot(index, term, rows);
                m.event(Event::SnapshotInstalled { index, jobs });
            }
            Err(error) => {
                m.replica.refuse_snapshot(index);
                m.event(Event::SnapshotRefused { index, error });
            }
        }
    }

    /// The group as this member sees it.
    pub(super) fn cluster_view(&self) -> ClusterView {
        let m = &self.member;
        let replica = &m.replica;
        let followers = replica.followers();
        let members = m
            .config
            .members()
            .into_iter()
            .map(|id| {
                let addresses = m.addresses.get(&id);
                let progress = followers.iter().find(|f| f.id == id);
                let (matched_index, last_heard_millis_ago) = if id == m.config.node_id {
                    if replica.is_leader() {
                        (Some(replica.durable_index()), Some(0))
                    } else {
                        (None, None)
                    }
                } else {
                    (
                        progress.map(|p| p.matched),
                        progress.and_then(|p| p.last_heard_millis_ago),
                    )
                };
                MemberView {
                    node_id: id,
                    client_address: addresses
                        .map(|a| a.client.clone())
                        .filter(|a| !a.is_empty()),
                    worker_address: addresses
                        .map(|a| a.worker.clone())
                        .filter(|a| !a.is_empty()),
                    matched_index,
                    last_heard_millis_ago,
                }
            })
            .collect();
        ClusterView {
            node_id: m.config.node_id.clone(),
            role: replica.role_kind().to_string(),
            term: replica.term(),
            leader: replica.leader().cloned(),
            last_index: replica.last_index(),
            commit_index: replica.committed_index(),
            applied_index: m.table.applied_index(),
            members,
        }
    }
}
