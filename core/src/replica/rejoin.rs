//! A member whose disk is empty in a group of several: a new group forming, or a member whose
//! disk was lost or wiped (or that was started late, after the group formed without it). Raft
//! assumes a member never forgets what it acknowledged or whom it voted for, and with a fixed
//! membership an empty disk breaks both promises: the member's earlier self may have helped
//! commit entries it no longer holds, and may have voted in terms it no longer knows. So an empty
//! member **abstains**: it stores and acknowledges what a leader sends (durably, as always) but
//! grants no vote and starts no election until it has heard the current term and log of every
//! other member. Then:
//!
//! - if no member holds an entry or has seen a leader, the group is new and nothing can be
//!   lost; otherwise it first waits until its log holds everything up to a leader's commit index
//!   (entries its earlier self helped commit are among those);
//! - either way it marks the highest term it heard as already voted in: its earlier self can
//!   only have voted for another member in a term that member still remembers, so no term
//!   beyond the highest one heard can have been voted in by it.
//!
//! What it hears must come from after it started: a restarted process is reached on new
//! connections, so nothing sent to its earlier self reaches it. Abstaining is written with the
//! term and vote, so a member that restarts before it has rejoined keeps abstaining.
//!
//! ```text
//!   started empty ──heard every member: all empty──────────────────────────────> takes part
//!        └─────────heard every member: some hold data ──caught up──> voted in the highest term
//! ```

use std::collections::BTreeMap;

use super::{Replica, ReplicaEvent};
use crate::ids::{LogIndex, NodeId, Term};
use crate::protocol::PeerMessage;

/// What an abstaining member has learned of another member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Heard {
    term: Term,
    /// Whether everything it said showed an empty log and no leader (it may have run
    /// elections that nobody won).
    empty: bool,
}

/// What an abstaining member has learned so far.
#[derive(Debug, Default)]
pub(super) struct Abstaining {
    heard: BTreeMap<NodeId, Heard>,
    /// Its log has held everything up to a leader's commit index.
    caught_up: bool,
}

impl Replica {
    /// Whether this member abstains from elections (see the module documentation).
    pub fn is_abstaining(&self) -> bool {
        self.abstaining.is_some()
    }

    /// Looks at a message before it is handled: an abstaining member notes what it says of
    /// its sender.
    pub(super) fn note_peer(&mut self, from: &NodeId, message: &PeerMessage) {
        let Some(abstaining) = self.abstaining.as_mut() else {
            return;
        };
        let Some(said) = what_it_says(message) else {
            return;
        };
        let heard = abstaining.heard.entry(from.clone()).or_insert(said);
        heard.term = heard.term.max(said.term);
        heard.empty &= said.empty;
        self.finish_abstaining_if_safe();
    }

    /// A leader's `APPEND` was accepted: the log now matches the leader's through `last_new`.
    pub(super) fn note_caught_up(&mut self, last_new: LogIndex, leader_commit: LogIndex) {
        if let Some(abstaining) = self.abstaining.as_mut() {
            if leader_commit <= last_new {
                abstaining.caught_up = true;
            }
        }
        self.finish_abstaining_if_safe();
    }

    /// Ends abstention once both conditions of the module documentation hold.
    pub(super) fn finish_abstaining_if_safe(&mut self) {
        let peers = self.config.members.len() - 1;
        let Some(abstaining) = &self.abstaining else {
            return;
        };
        if abstaining.heard.len() < peers {
            return;
        }
        // A new group (no member holds an entry, none has seen a leader) has nothing to lose;
        // otherwise this member first catches up with what was committed.
        let new_group = abstaining.heard.values().all(|h| h.empty);
        if !new_group && !abstaining.caught_up {
            return;
        }
        let highest = abstaining
            .heard
            .values()
            .map(|h| h.term)
            .max()
            .unwrap_or_default()
            .max(self.term);
        self.abstaining = None;
        if highest > self.term {
            self.term = highest;
            self.voted_for = None;
        }
        // No vote in this term: the earlier self may have cast one.
        if self.voted_for.is_none() {
            self.voted_for = Some(self.config.id.clone());
        }
        self.save_hard_state();
        self.events
            .push_back(ReplicaEvent::Rejoined { term: self.term });
    }

    /// An abstaining member's election timer: it asks every member it has not heard from
    /// (a pre-vote changes nobody's state, and the answer carries the member's term).
    pub(super) fn probe_terms(&mut self) {
        let Some(abstaining) = &self.abstaining else {
            return;
        };
        let unheard: Vec<NodeId> = self
            .peers()
            .into_iter()
            .filter(|p| !abstaining.heard.contains_key(p))
            .collect();
        let message = PeerMessage::PreVote {
            term: Term(self.term.0 + 1),
            last_index: self.log.last_index(),
            last_term: self.log.last_term(),
        };
        for peer in unheard {
            self.send(peer, message.clone());
        }
        self.reset_election_deadline();
    }
}

/// What a message says of its sender's term and log, if anything.
fn what_it_says(message: &PeerMessage) -> Option<Heard> {
    let heard = |term: Term, empty: bool| Some(Heard { term, empty });
    match message {
        PeerMessage::Hello { .. } => None,
        // A pre-vote asks about the term after the sender's own.
        PeerMessage::PreVote {
            term, last_index, ..
        } => heard(Term(term.0.saturating_sub(1)), *last_index == LogIndex(0)),
        PeerMessage::Vote {
            term, last_index, ..
        } => heard(*term, *last_index == LogIndex(0)),
        // Granted, it was below the term asked about, with a log no more up to date than ours
        // (empty while we abstain with an empty log); refused, it names its own term.
        PeerMessage::PreVoteReply {
            term,
            granted: true,
        } => heard(Term(term.0.saturating_sub(1)), true),
        // A refusal names the replier's term; an empty log cannot be told from it, so only a
        // refusal in term 0 (which cannot have seen a leader) counts as empty.
        PeerMessage::PreVoteReply {
            term,
            granted: false,
        }
        | PeerMessage::VoteReply { term, .. } => heard(*term, *term == Term(0)),
        // A leader exists.
        PeerMessage::Append { term, .. }
        | PeerMessage::Snapshot { term, .. }
        | PeerMessage::TimeoutNow { term } => heard(*term, false),
        PeerMessage::AppendReply { term, .. } | PeerMessage::SnapshotReply { term, .. } => {
            heard(*term, false)
        }
    }
}
