//! The coordinator-to-coordinator link. Consensus tolerates loss, repeats and reordering, so
//! peer messages travel as independent datagrams: each takes its own latency (so they reorder),
//! may be lost or sent twice while faults are on, is dropped on a link a partition cuts, and
//! never reaches a process that started after it was sent (a restarted process is reached on
//! new connections). The `HELLO` greeting, which only tells a member where the others' clients
//! and workers connect, is handed over directly whenever a member starts.

use herder_core::ids::NodeId;
use herder_core::protocol::PeerMessage;

use super::through_codec;
use crate::checker::Check;
use crate::world::events::Ev;
use crate::world::nodes::coordinator_address;
use crate::world::{NodeRef, World};

/// How late a straggling peer message arrives (microseconds, beyond its latency): long
/// enough for elections to come and go meanwhile.
const STRAGGLE_US: (u64, u64) = (1_000_000, 6_000_000);

impl World {
    /// Coordinator `from` sends `message` to coordinator `to`.
    pub(in crate::world) fn send_peer(
        &mut self,
        from: usize,
        to: usize,
        message: PeerMessage,
    ) -> Check {
        if to >= self.coords.len() || to == from {
            return Err(format!(
                "coord-{from} sent a peer message to coord-{to}: {message:?}"
            ));
        }
        self.checker.peer_sent(from, to, &message)?;
        let crash_mid_consensus = self.scenario.faults.crash_mid_consensus;
        let critical = match &message {
            PeerMessage::VoteReply { granted: true, .. } => {
                Some("fault: a member crashes right after granting a vote")
            }
            PeerMessage::SnapshotReply { .. } => {
                Some("fault: a member crashes while it receives a snapshot")
            }
            _ => None,
        };
        if let Some(what) = critical {
            if self.faults_active
                && crash_mid_consensus > 0.0
                && self.fault_rng.chance(crash_mid_consensus)
            {
                let gen = self.coords[from].gen;
                self.push(
                    self.now,
                    Ev::CrashMidConsensus {
                        coord: from,
                        gen,
                        what,
                    },
                );
            }
        }
        let faults = self.faults_active;
        if faults && self.net.chance(self.scenario.faults.loss) {
            self.count("net: peer message lost");
            return Ok(());
        }
        let message = if self.scenario.codec {
            through_codec(message)?
        } else {
            message
        };
        let gen = self.coords[to].gen;
        let mut at = self.now + self.latency();
        let straggle = self.scenario.faults.peer_straggle;
        if faults && straggle > 0.0 && self.net.chance(straggle) {
            self.count("net: peer message arrives seconds late");
            at += self.net.range(STRAGGLE_US.0, STRAGGLE_US.1);
        }
        if faults && self.net.chance(self.scenario.faults.duplicate) {
            self.count("net: peer message sent twice");
            let mut again = at + self.net.range(0, 500_000);
            if straggle > 0.0 && self.net.chance(0.5) {
                self.count("net: a second copy of a peer message arrives seconds late");
                again += self.net.range(STRAGGLE_US.0, STRAGGLE_US.1);
            }
            self.push(
                again,
                Ev::Peer {
                    from,
                    to,
                    gen,
                    message: message.clone(),
                },
            );
        }
        self.push(
            at,
            Ev::Peer {
                from,
                to,
                gen,
                message,
            },
        );
        Ok(())
    }

    pub(in crate::world) fn deliver_peer(
        &mut self,
        from: usize,
        to: usize,
        gen: u64,
        message: PeerMessage,
    ) -> Check {
        if self.coords[to].gen != gen {
            return Ok(());
        }
        if self.is_cut(NodeRef::Coordinator(from), NodeRef::Coordinator(to)) {
            self.count("net: peer message cut by a partition");
            return Ok(());
        }
        if self.coords[to].machine.is_none() {
            return Ok(());
        }
        self.note(
            NodeRef::Coordinator(to),
            format_args!("<- coord-{from} {}", message_name(&message)),
        );
        self.checker.peer_delivered(to, from, &message);
        let node = &mut self.coords[to];
        let local = node.clock.local(self.now);
        let Some(machine) = &mut node.machine else {
            return Ok(());
        };
        let sender = NodeId(coordinator_address(from));
        if let PeerMessage::Vote {
            term,
            last_index,
            last_term,
            ..
        } = &message
        {
            let asked = (*last_index, *last_term);
            self.checker
                .vote_asked(to, &sender, *term, asked, machine.replica());
        }
        machine.handle_peer_message(local, &sender, message);
        self.drain_coord(to)?;
        self.checker.peer_handled(to);
        Ok(())
    }

    /// Coordinator `c` (re)started: it and every running member exchange `HELLO`s.
    pub(in crate::world) fn greet_peers(&mut self, c: usize) {
        let hello = |d: usize| PeerMessage::Hello {
            node_id: NodeId(coordinator_address(d)),
            client_address: coordinator_address(d),
            worker_address: coordinator_address(d),
        };
        for d in 0..self.coords.len() {
            if d == c || self.coords[d].machine.is_none() {
                continue;
            }
            for (from, to) in [(c, d), (d, c)] {
                let node = &mut self.coords[to];
                let local = node.clock.local(self.now);
                if let Some(machine) = &mut node.machine {
                    machine.handle_peer_message(
                        local,
                        &NodeId(coordinator_address(from)),
                        hello(from),
                    );
                }
            }
        }
    }
}

/// A short name for the trace (whole APPENDs would drown it).
fn message_name(message: &PeerMessage) -> String {
    match message {
        PeerMessage::Append {
            term,
            prev_index,
            entries,
            commit,
            ..
        } => format!(
            "APPEND t{} after {} +{} commit {}",
            term.0,
            prev_index,
            entries.len(),
            commit
        ),
        PeerMessage::AppendReply {
            term,
            success,
            index,
            ..
        } => format!(
            "APPEND_REPLY t{} {} {index}",
            term.0,
            if *success { "ok" } else { "no" }
        ),
        PeerMessage::Snapshot {
            index,
            offset,
            total,
            ..
        } => format!("SNAPSHOT at {index} bytes {offset}/{total}"),
        other => format!("{other:?}"),
    }
}
