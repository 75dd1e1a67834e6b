//! Elections: PreVote (dissertation 9.6), RequestVote (paper 5.2, 5.4.1) and the leadership
//! hand-over that `TIMEOUT_NOW` starts (dissertation 3.10).
//!
//! ```text
//!   Follower ──election timeout──> PreCandidate ──majority would vote──> Candidate (term + 1)
//!      ^                               │ timeout: ask again                  │ majority voted
//!      └──── higher term / a leader ───┴─────────────────────────────────────┴──> Leader
//! ```

use std::collections::BTreeSet;

use super::leader::Leading;
use super::{Replica, ReplicaEvent, Role};
use crate::command::Command;
use crate::ids::{LogIndex, NodeId, Term};
use crate::protocol::PeerMessage;
use crate::time::UnixMillis;

impl Replica {
    /// The election timeout passed: ask the others whether they would vote, without raising
    /// this member's term, so that a member that was cut off cannot depose a healthy leader.
    pub(super) fn start_pre_vote(&mut self) {
        let mut granted = BTreeSet::new();
        granted.insert(self.config.id.clone());
        self.role = Role::PreCandidate { granted };
        self.leader = None;
        self.reset_election_deadline();
        let term = Term(self.term.0 + 1);
        self.events.push_back(ReplicaEvent::ElectionStarted {
            term,
            pre_vote: true,
        });
        let message = PeerMessage::PreVote {
            term,
            last_index: self.log.last_index(),
            last_term: self.log.last_term(),
        };
        for peer in self.peers() {
            self.send(peer, message.clone());
        }
    }

    /// A real election: raise the term, vote for itself, and ask for votes once that vote is
    /// durable (a member that forgot its vote could vote twice in one term).
    pub(super) fn start_election(&mut self, transfer: bool) {
        self.term = Term(self.term.0 + 1);
        self.voted_for = Some(self.config.id.clone());
        self.save_hard_state();
        let mut granted = BTreeSet::new();
        granted.insert(self.config.id.clone());
        self.role = Role::Candidate { granted };
        self.leader = None;
        self.reset_election_deadline();
        self.events.push_back(ReplicaEvent::ElectionStarted {
            term: self.term,
            pre_vote: false,
        });
        let message = PeerMessage::Vote {
            term: self.term,
            last_index: self.log.last_index(),
            last_term: self.log.last_term(),
            transfer,
        };
        for peer in self.peers() {
            self.send_when_durable(peer, message.clone());
        }
    }

    pub(super) fn peers(&self) -> Vec<NodeId> {
        self.config
            .members
            .iter()
            .filter(|m| **m != self.config.id)
            .cloned()
            .collect()
    }

    pub(super) fn on_pre_vote(
        &mut self,
        from: &NodeId,
        term: Term,
        last_index: LogIndex,
        last_term: Term,
    ) {
        // Grant only a term above ours, to a log at least as up to date as ours, and only if no
        // live leader is known: a leader that is still heard from needs no replacement. A member
        // that abstains would refuse the real vote, so it refuses the rehearsal too (granting
        // it would only let terms climb through elections that cannot be won).
        let granted = term > self.term
            && !self.is_abstaining()
            && self.log.candidate_up_to_date(last_index, last_term)
            && !self.hears_from_leader();
        let reply_term = if granted { term } else { self.term };
        self.send(
            from.clone(),
            PeerMessage::PreVoteReply {
                term: reply_term,
                granted,
                last_index: self.log.last_index(),
            },
        );
    }

    pub(super) fn on_pre_vote_reply(&mut self, from: &NodeId, term: Term, granted: bool) {
        let quorum = self.config.quorum();
        if self.is_abstaining() {
            return; // the reply to a probe for terms (see `rejoin`)
        }
        let Role::PreCandidate { granted: votes } = &mut self.role else {
            return;
        };
        if !granted || term != Term(self.term.0 + 1) {
            return;
        }
        votes.insert(from.clone());
        if votes.len() >= quorum {
            self.start_election(false);
        }
    }

    pub(super) fn on_vote(
        &mut self,
        from: &NodeId,
        term: Term,
        last_index: LogIndex,
        last_term: Term,
    ) {
        // A higher term was adopted by `handle_message` unless a live leader is known; then the
        // vote is refused without touching our term (dissertation 9.6).
        let free = self.voted_for.is_none() || self.voted_for.as_ref() == Some(from);
        let granted = term == self.term
            && free
            && !self.is_abstaining()
            && self.log.candidate_up_to_date(last_index, last_term);
        if granted {
            self.voted_for = Some(from.clone());
            self.save_hard_state();
            self.reset_election_deadline();
        }
        self.send_when_durable(
            from.clone(),
            PeerMessage::VoteReply {
                term: self.term,
                granted,
            },
        );
    }

    pub(super) fn on_vote_reply(&mut self, from: &NodeId, term: Term, granted: bool) {
        let quorum = self.config.quorum();
        if term != self.term {
            return;
        }
        let Role::Candidate { granted: votes } = &mut self.role else {
            return;
        };
        if !granted {
            return;
        }
        votes.insert(from.clone());
        if votes.len() >= quorum {
            self.become_leader();
        }
    }

    fn become_leader(&mut self) {
        assert_eq!(
            self.voted_for.as_ref(),
            Some(&self.config.id),
            "a leader voted for itself in its term"
        );
        let leading = Leading::new(&self.config, self.log.last_index().next(), self.now);
        self.role = Role::Leader(Box::new(leading));
        self.leader = Some(self.config.id.clone());
        self.events
            .push_back(ReplicaEvent::BecameLeader { term: self.term });
        // The first entry of the term: committing it commits everything before it (paper 5.4.2)
        // and tells the leader its commit index is current (dissertation 6.4).
        let leader = self.config.id.clone();
        // It changes no job, so it needs no wall time.
        self.append_own(Command::NewLeader { leader }, UnixMillis::UNSTAMPED);
    }

    pub(super) fn on_timeout_now(&mut self, from: &NodeId, term: Term) {
        if term != self.term
            || self.leader.as_ref() != Some(from)
            || self.is_leader()
            || self.is_abstaining()
        {
            return;
        }
        self.start_election(true);
    }
}
