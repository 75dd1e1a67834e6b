//! A member whose disk is empty in a group of several: a new group forming, or a member whose
//! disk was lost or wiped (or that was started late, after the group formed without it). Raft
//! assumes a member never forgets what it acknowledged or whom it voted for, and with a fixed
//! membership an empty disk breaks both promises: the member's earlier self may have helped
//! commit entries it no longer holds, and may have voted in terms it no longer knows. So an empty
//! member **abstains**: it stores and acknowledges what a leader sends (durably, as always), but
//! every acknowledgement says it abstains and counts towards no majority, and it grants no vote
//! or pre-vote and starts no election, until it has heard the current term of every other
//! member. (Its acknowledgements must not count: a deposed leader that wakes up may reach it
//! before the member hears of the later term its earlier self took part in, and the two would
//! make a majority for entries that a later leader has already replaced.) Then:
//!
//! - if its own log is empty and every other member has shown an empty log, nothing was ever
//!   committed (an entry is committed on a majority, and at most a minority can have lost its
//!   disk), so the group is new and nothing can be lost;
//! - otherwise it first catches up: it waits for an `APPEND` from a leader of the highest term
//!   it heard, whose commit index is an entry of that leader's own term and within what this
//!   member now holds. Such a leader has committed in its own term, so its commit index covers
//!   every entry committed before it; and no term after it can have seen the earlier self, so
//!   that covers the ones the earlier self helped commit. (A commit index alone is only a lower
//!   bound: a leader that just restarted or was just elected may not yet know what was
//!   committed. A leader of an older term proves nothing: it may have been deposed by one the
//!   earlier self helped commit other entries.)
//! - either way it marks the highest term it heard as already voted in: its earlier self can
//!   only have voted for another member in a term that member still remembers, so no term
//!   beyond the highest one heard can have been voted in by it.
//!
//! What it hears must come from after it started: a restarted process is reached on new
//! connections, so nothing sent to its earlier self reaches it. Abstaining is written with the
//! term and vote, so a member that restarts before it has rejoined keeps abstaining. A leader,
//! for its part, forgets what a member acknowledged before that member reconnected (see
//! `Leading`), so an acknowledgement still in flight from the earlier self counts for nothing.
//!
//! ```text
//!   started empty ──heard every member: every log empty──────────────────────────> takes part
//!        └─────────heard every member: some log holds entries ──caught up──> voted in the highest term
//! ```

use std::collections::BTreeMap;

use super::{Replica, ReplicaEvent};
use crate::ids::{LogIndex, NodeId, Term};
use crate::protocol::PeerMessage;

/// What an abstaining member has learned of another member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Heard {
    term: Term,
    /// Whether its log holds entries: unknown until a message shows it. Once an entry was
    /// seen it stays seen (a member does not forget entries without losing its disk, and then
    /// it is another process that abstains itself).
    holds_entries: Option<bool>,
}

/// What an abstaining member has learned so far.
#[derive(Debug, Default)]
pub(super) struct Abstaining {
    heard: BTreeMap<NodeId, Heard>,
    /// The highest term whose leader showed a commit index of its own term that this
    /// member's log holds.
    caught_up_in: Option<Term>,
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
        heard.holds_entries = match (heard.holds_entries, said.holds_entries) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (known, None) => known,
            (_, Some(false)) => Some(false),
        };
        self.finish_abstaining_if_safe();
    }

    /// A leader of `term` sent an `APPEND` that was accepted: the log now matches the leader's
    /// through `last_new`, and the leader had committed up to `leader_commit`.
    pub(super) fn note_caught_up(
        &mut self,
        last_new: LogIndex,
        leader_commit: LogIndex,
        term: Term,
    ) {
        let proves = leader_commit <= last_new && self.log.term_at(leader_commit) == Some(term);
        if let Some(abstaining) = self.abstaining.as_mut() {
            if proves {
                abstaining.caught_up_in = abstaining.caught_up_in.max(Some(term));
            }
        }
        self.finish_abstaining_if_safe();
    }

    /// Ends abstention once the conditions of the module documentation hold.
    pub(super) fn finish_abstaining_if_safe(&mut self) {
        let peers = self.config.members.len() - 1;
        let Some(abstaining) = &self.abstaining else {
            return;
        };
        if abstaining.heard.len() < peers {
            return;
        }
        let new_group = self.log.last_index() == LogIndex(0)
            && abstaining
                .heard
                .values()
                .all(|h| h.holds_entries == Some(false));
        let highest_heard = abstaining
            .heard
            .values()
            .map(|h| h.term)
            .max()
            .unwrap_or_default();
        let caught_up = abstaining
            .caught_up_in
            .is_some_and(|term| term >= highest_heard);
        if !new_group && !caught_up {
            return;
        }
        let highest = highest_heard.max(self.term);
        self.abstaining = None;
        if highest > self.term {
            // A leader it followed belongs to an earlier term.
            self.term = highest;
            self.voted_for = None;
            self.leader = None;
            self.leader_contact = None;
        }
        // No vote in this term: the earlier self may have cast one.
        if self.voted_for.is_none() {
            self.voted_for = Some(self.config.id.clone());
        }
        self.save_hard_state();
        self.events
            .push_back(ReplicaEvent::Rejoined { term: self.term });
    }

    /// An abstaining member's election timer: it asks every member whose term or log it does
    /// not know yet (a pre-vote changes nobody's state, and the answer carries the member's
    /// term and last index).
    pub(super) fn probe_terms(&mut self) {
        let Some(abstaining) = &self.abstaining else {
            return;
        };
        let unknown: Vec<NodeId> = self
            .peers()
            .into_iter()
            .filter(|p| {
                abstaining
                    .heard
                    .get(p)
                    .is_none_or(|h| h.holds_entries.is_none())
            })
            .collect();
        let message = PeerMessage::PreVote {
            term: Term(self.term.0 + 1),
            last_index: self.log.last_index(),
            last_term: self.log.last_term(),
        };
        for peer in unknown {
            self.send(peer, message.clone());
        }
        self.reset_election_deadline();
    }
}

/// What a message says of its sender's term and log, if anything.
fn what_it_says(message: &PeerMessage) -> Option<Heard> {
    let heard = |term: Term, holds_entries: Option<bool>| {
        Some(Heard {
            term,
            holds_entries,
        })
    };
    match message {
        PeerMessage::Hello { .. } => None,
        // A pre-vote asks about the term after the sender's own.
        PeerMessage::PreVote {
            term, last_index, ..
        } => heard(
            Term(term.0.saturating_sub(1)),
            Some(*last_index > LogIndex(0)),
        ),
        PeerMessage::Vote {
            term, last_index, ..
        } => heard(*term, Some(*last_index > LogIndex(0))),
        // Granted, it was below the term asked about (counting it as one below is an upper
        // bound, which only makes the term marked as voted in higher); refused, it names its
        // own term.
        PeerMessage::PreVoteReply {
            term,
            granted,
            last_index,
        } => {
            let term = if *granted {
                Term(term.0.saturating_sub(1))
            } else {
                *term
            };
            heard(term, Some(*last_index > LogIndex(0)))
        }
        PeerMessage::VoteReply { term, .. } => heard(*term, None),
        // A leader exists, and its first act was to append an entry.
        PeerMessage::Append { term, .. }
        | PeerMessage::Snapshot { term, .. }
        | PeerMessage::TimeoutNow { term } => heard(*term, Some(true)),
        PeerMessage::AppendReply { term, .. } | PeerMessage::SnapshotReply { term, .. } => {
            heard(*term, None)
        }
    }
}
