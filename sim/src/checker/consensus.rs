//! Raft's own rules, judged from what the world sees rather than from what a member says of
//! itself: every peer message as it leaves and as it is delivered, and every record as it
//! reaches a disk. Nothing here asks a replica for its role, term or log, so a replica that is
//! wrong about itself is still judged by what it did.
//!
//! - **Durable state moves forward.** A disk's term never falls, and a vote written for a term
//!   is never rewritten (nor cleared) while that disk lives, across any number of restarts.
//! - **One vote per term.** A member grants its vote in a term to one candidate only, across
//!   restarts, for as long as its disk lives (a lost disk is the fault that may forget it).
//! - **Durability before effect.** A request for votes leaves only once the candidate's disk
//!   holds its term and its vote for itself; a leader's message only once its disk holds its
//!   term; an append acknowledgement only once the disk holds the term it answers in.
//! - **Elections are won.** The first message a process sends as leader of a term follows the
//!   votes of a majority for that term, delivered to that very process (its own vote counts if
//!   its disk holds it); no two members ever send leaders' messages in one term; and the new
//!   leader's disk holds every entry committed in an earlier term.
//! - **Replies count only for their term.** A commit index a leader announces beyond what it
//!   knew is backed by a majority: its own disk, and acknowledgements of the leader's term from
//!   members taking part, delivered to it; the entry there is of the leader's term.
//! - **A higher term is acted on.** A process that has been told of a higher term sends no
//!   leader's message of a lower one.
//! - **Log matching.** An index and a term name one entry, wherever it is seen (in an `APPEND`,
//!   on any disk), and always the same predecessor term; terms never fall along a log.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use herder_core::command::LogEntry;
use herder_core::coordinator::Record;
use herder_core::ids::{LogIndex, NodeId, Term};
use herder_core::protocol::codec::WireMessage;
use herder_core::protocol::{ClusterView, PeerMessage};

use super::{Check, Checker};

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// What one member's current process has been told, by the messages delivered to it since it
/// started.
#[derive(Clone, Debug, Default)]
struct Heard {
    /// The highest term a handled message carried. Requests for votes are left out (a
    /// member that hears from a live leader may ignore them), and so are pre-votes and granted
    /// answers to them (they are about a term nobody is in yet); a refused pre-vote carries
    /// the refuser's own term and counts.
    term: Term,
    /// The term of the message being handled, known once it has been: a timer due at the
    /// same instant may have fired first, and what it sent was decided without the message.
    term_arriving: Term,
    /// Term -> the members whose granted vote in it was delivered.
    grants: BTreeMap<Term, BTreeSet<usize>>,
    /// Member -> what its replies to appends of the latest term it answered in said.
    acks: BTreeMap<usize, Ack>,
    /// The highest commit index this process knows honestly: its disk's at start, a leader's
    /// `APPEND`, a snapshot, or one it announced itself after it was judged.
    commit: LogIndex,
    /// The term whose leadership it has been judged to have won.
    led: Option<Term>,
    /// Snapshot index -> its size in bytes, as the chunks delivered said.
    snapshot_sizes: BTreeMap<LogIndex, u64>,
    /// The highest sequence number its `APPEND`s and `SNAPSHOT`s carried, in the term it leads.
    sent_seq: u64,
}

/// What a member's replies to appends in one term said.
#[derive(Clone, Copy, Debug, Default)]
struct Ack {
    term: Term,
    /// The highest index it acknowledged holding in that term.
    index: LogIndex,
    /// Whether a reply of that term said it takes part (it does not abstain, as a member on
    /// an empty disk that has not rejoined does). Until then it counts towards no majority;
    /// from then on, what it acknowledged before counts too: that was durable, and it now
    /// refuses a candidate that lacks it. (A leader may decide on a reply and announce the
    /// commit index later, after an older reply overtook it: once is enough.)
    took_part: bool,
    /// The highest sequence number its replies of that term echoed: how recent a round of the
    /// leader's it has answered (what confirms a read, once it takes part, as for commits).
    seq: u64,
}

/// What a leader had sent when a read reached it: its term, and the sequence number of its
/// latest round. The read may be answered only once a majority has answered a later round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadMark {
    pub term: Term,
    pub seq: u64,
}

/// The checker's own record of the consensus layer.
#[derive(Clone, Debug, Default)]
pub(super) struct Ledger {
    /// Each member's node id, by index.
    ids: Vec<NodeId>,
    heard: Vec<Heard>,
    /// Term -> the member whose messages claimed to lead it.
    leaders: BTreeMap<Term, usize>,
    /// (member, term) -> the candidate it granted its vote, since its disk was last lost.
    granted: HashMap<(usize, Term), NodeId>,
    /// (index, term) -> the entry every log holding that index of that term holds, and the term
    /// of the entry before it (once seen).
    entries: HashMap<(LogIndex, Term), (LogEntry, Option<Term>)>,
}

impl Heard {
    /// The round of this process's own term a reply in `term` echoing `seq` can answer: none
    /// (0) when it leads that term and sent no such round. A follower answering a message of an
    /// older term must not echo its number, since its sender may lead a later term by now.
    fn round_answered(&self, term: Term, seq: u64) -> u64 {
        if self.led == Some(term) && seq > self.sent_seq {
            0
        } else {
            seq
        }
    }
}

impl Ack {
    /// A reply in `term` to round `seq` acknowledged entries up to `index` (0: none).
    fn heard(&mut self, term: Term, index: LogIndex, abstaining: bool, seq: u64) {
        if term > self.term {
            *self = Ack {
                term,
                ..Ack::default()
            };
        }
        if term == self.term {
            self.index = self.index.max(index);
            self.took_part |= !abstaining;
            self.seq = self.seq.max(seq);
        }
    }
}

impl Ledger {
    /// `entry` seen at `place` (named only when something is wrong: this runs for every entry
    /// sent and written), after an entry of term `before` if known.
    fn see_entry(
        &mut self,
        entry: &LogEntry,
        before: Option<Term>,
        place: &dyn Fn() -> String,
    ) -> Check {
        if let Some(before) = before {
            ensure!(
                before <= entry.term,
                "log matching: {} holds entry {} of term {} after an entry of the later term {}",
                place(),
                entry.index,
                entry.term.0,
                before.0
            );
        }
        match self.entries.get_mut(&(entry.index, entry.term)) {
            Some((known, known_before)) => {
                ensure!(
                    known == entry,
                    "log matching: {} holds {entry:?} at index {} of term {}, but that index of that term is {known:?} elsewhere",
                    place(),
                    entry.index,
                    entry.term.0
                );
                match (before, *known_before) {
                    (Some(before), Some(known)) => ensure!(
                        before == known,
                        "log matching: {} holds entry {} of term {} after an entry of term {}, but elsewhere it follows one of term {}",
                        place(),
                        entry.index,
                        entry.term.0,
                        before.0,
                        known.0
                    ),
                    (Some(before), None) => *known_before = Some(before),
                    _ => {}
                }
            }
            None => {
                self.entries
                    .insert((entry.index, entry.term), (entry.clone(), before));
            }
        }
        Ok(())
    }
}

impl Checker {
    /// The members' node ids, by index: votes and acknowledgements name members by id.
    pub fn set_members(&mut self, ids: Vec<NodeId>) {
        self.ledger.heard = vec![Heard::default(); ids.len()];
        self.ledger.ids = ids;
    }

    /// A new process of member `c` started on a disk whose rows reflect entries up to
    /// `rows_applied`: it has been told nothing yet.
    pub(super) fn consensus_process_started(&mut self, c: usize, rows_applied: LogIndex) {
        if let Some(heard) = self.ledger.heard.get_mut(c) {
            *heard = Heard {
                commit: rows_applied.max(self.mirrors[c].snapshot),
                ..Heard::default()
            };
        }
    }

    /// Member `c`'s disk was lost: the votes it held are forgotten with it.
    pub(super) fn consensus_disk_lost(&mut self, c: usize) {
        self.ledger.granted.retain(|(member, _), _| *member != c);
    }

    /// Records about to become durable on member `c`'s disk, in order: each is judged against
    /// the disk as the records before it left it, then written to the mirror.
    pub(super) fn write_disk(&mut self, c: usize, records: &[Record]) -> Check {
        for record in records {
            let mirror = &self.mirrors[c];
            match record {
                Record::HardState(hard_state) => {
                    ensure!(
                        hard_state.term >= mirror.term,
                        "durable term: coord-{c} wrote term {} over the term {} its disk held",
                        hard_state.term.0,
                        mirror.term.0
                    );
                    if let Some(voted) = mirror.votes.get(&hard_state.term) {
                        ensure!(
                            hard_state.voted_for.as_ref() == Some(voted),
                            "durable vote: coord-{c} rewrote its vote in term {} from {voted} to {:?}",
                            hard_state.term.0,
                            hard_state.voted_for
                        );
                    }
                }
                Record::Log(entry) => {
                    let before = LogIndex(entry.index.0.saturating_sub(1));
                    let before_term = if before == mirror.snapshot {
                        Some(mirror.snapshot_term)
                    } else if before < mirror.snapshot {
                        None
                    } else {
                        mirror.log.get(&before).map(|e| e.term)
                    };
                    self.ledger
                        .see_entry(entry, before_term, &|| format!("coord-{c}'s disk"))?;
                }
                // Only a conflicting suffix is ever given up, and a committed entry conflicts
                // with no leader's log (leader completeness): a disk that drops one it held
                // (a stale append taken for a conflict, say) may be what a majority counted.
                Record::TruncateLogAfter(index) => {
                    for (at, held) in mirror.log.range(index.next()..) {
                        let committed = self.committed.get(at).map(|(entry, _)| entry);
                        ensure!(
                            committed != Some(held),
                            "a disk keeps what is committed: coord-{c} gave up its log after entry {index}, dropping committed entry {at} of term {}",
                            held.term.0
                        );
                    }
                }
                _ => {}
            }
            self.mirrors[c].write(std::slice::from_ref(record));
        }
        self.note_leader_progress(c);
        Ok(())
    }

    /// Member `c` sends `message` to member `to`.
    pub fn peer_sent(&mut self, c: usize, to: usize, message: &PeerMessage) -> Check {
        // A higher term is acted on: once told of one, a member says nothing in a lower term
        // (not even what it decided before and held back until its disk caught up).
        let told = self.ledger.heard[c].term;
        if let Some(term) = message.term() {
            ensure!(
                term >= told,
                "higher term ignored: coord-{c} sent {} in term {} after it was told of term {}",
                message.type_name(),
                term.0,
                told.0
            );
        }
        let mirror = &self.mirrors[c];
        match message {
            PeerMessage::Vote {
                term,
                last_index,
                last_term,
                ..
            } => {
                let own = &self.ledger.ids[c];
                ensure!(
                    *term <= mirror.term && mirror.votes.get(term) == Some(own),
                    "durability before effect: coord-{c} asked for votes in term {} while its disk held term {} and vote {:?} in it",
                    term.0,
                    mirror.term.0,
                    mirror.votes.get(term)
                );
                // The log it asks voters to compare theirs with must be one it will still hold
                // after a crash: a vote won on entries it could lose would elect a leader
                // missing what its voters were told it had.
                let on_disk = if *last_index == LogIndex(0) {
                    Some(Term(0))
                } else if *last_index == mirror.snapshot {
                    Some(mirror.snapshot_term)
                } else if *last_index <= mirror.contiguous {
                    mirror.log.get(last_index).map(|entry| entry.term)
                } else {
                    None
                };
                ensure!(
                    on_disk == Some(*last_term),
                    "durability before effect: coord-{c} asked for votes in term {} with its log ending at entry {last_index} of term {}, but its disk holds {:?} there (entries up to {}, snapshot at {})",
                    term.0,
                    last_term.0,
                    on_disk.map(|t| t.0),
                    mirror.contiguous,
                    mirror.snapshot
                );
            }
            PeerMessage::VoteReply {
                term,
                granted: true,
            } => {
                let candidate = &self.ledger.ids[to];
                match self.ledger.granted.get(&(c, *term)) {
                    Some(first) => ensure!(
                        first == candidate,
                        "one vote per term: coord-{c} granted its vote in term {} to {first}, then to {candidate}",
                        term.0
                    ),
                    None => {
                        self.ledger.granted.insert((c, *term), candidate.clone());
                    }
                }
            }
            PeerMessage::AppendReply {
                term,
                success: true,
                ..
            } => ensure!(
                *term <= mirror.term,
                "durability before effect: coord-{c} acknowledged appends in term {} while its disk held term {}",
                term.0,
                mirror.term.0
            ),
            PeerMessage::SnapshotReply {
                index, received, ..
            } => {
                let whole = self.ledger.heard[c].snapshot_sizes.get(index) == Some(received);
                ensure!(
                    !whole || mirror.contiguous >= *index,
                    "durability before effect: coord-{c} reported the snapshot at {index} installed while its disk held entries only up to {}",
                    mirror.contiguous
                );
            }
            PeerMessage::Append {
                term,
                prev_term,
                entries,
                commit,
                seq,
                ..
            } => {
                self.leader_message(c, *term)?;
                self.ledger.heard[c].sent_seq = self.ledger.heard[c].sent_seq.max(*seq);
                let mut before = *prev_term;
                let place = || format!("an APPEND of coord-{c} in term {}", term.0);
                for entry in entries {
                    ensure!(
                        entry.term <= *term,
                        "log matching: {} carries entry {} of the later term {}",
                        place(),
                        entry.index,
                        entry.term.0
                    );
                    self.ledger.see_entry(entry, Some(before), &place)?;
                    before = entry.term;
                }
                self.announced_commit(c, *term, *commit)?;
            }
            PeerMessage::Snapshot { term, seq, .. } => {
                self.leader_message(c, *term)?;
                self.ledger.heard[c].sent_seq = self.ledger.heard[c].sent_seq.max(*seq);
            }
            PeerMessage::TimeoutNow { term } => self.leader_message(c, *term)?,
            _ => {}
        }
        Ok(())
    }

    /// Member `c` sends a message only a leader of `term` sends.
    fn leader_message(&mut self, c: usize, term: Term) -> Check {
        let mirror = &self.mirrors[c];
        ensure!(
            term <= mirror.term,
            "durability before effect: coord-{c} sent a leader's message in term {} while its disk held term {}",
            term.0,
            mirror.term.0
        );
        let heard = &self.ledger.heard[c];
        ensure!(
            term >= heard.term,
            "higher term ignored: coord-{c} sent a leader's message in term {} after it was told of term {}",
            term.0,
            heard.term.0
        );
        if heard.led == Some(term) {
            return Ok(());
        }
        let own = &self.ledger.ids[c];
        let mut voters = heard.grants.get(&term).cloned().unwrap_or_default();
        if mirror.votes.get(&term) == Some(own) {
            voters.insert(c);
        }
        ensure!(
            voters.len() >= self.quorum,
            "election: coord-{c} acted as leader of term {} with the votes of {} only (a majority is {})",
            term.0,
            voters
                .iter()
                .map(|v| format!("coord-{v}"))
                .collect::<Vec<_>>()
                .join(", "),
            self.quorum
        );
        let first = *self.ledger.leaders.entry(term).or_insert(c);
        ensure!(
            first == c,
            "election safety: coord-{first} and coord-{c} both sent leaders' messages in term {}",
            term.0
        );
        // Leader completeness (paper 5.4), on the new leader's disk.
        for (index, (entry, seen_in)) in self.committed.range(mirror.snapshot.next()..) {
            if *seen_in >= term {
                continue;
            }
            ensure!(
                mirror.holds(entry),
                "leader completeness: coord-{c} leads term {} without committed entry {index} (term {}) on its disk",
                term.0,
                entry.term.0
            );
        }
        self.ledger.heard[c].led = Some(term);
        self.ledger.heard[c].sent_seq = 0;
        self.elections_judged += 1;
        Ok(())
    }

    /// Leader `c` of `term` announced commit index `commit`: beyond what it knew, a majority
    /// of this term must back it, and the entry there must be of this term.
    fn announced_commit(&mut self, c: usize, term: Term, commit: LogIndex) -> Check {
        let heard = &self.ledger.heard[c];
        if commit <= heard.commit {
            return Ok(());
        }
        let mirror = &self.mirrors[c];
        let own = usize::from(mirror.contiguous >= commit);
        let acked = heard
            .acks
            .values()
            .filter(|ack| ack.term == term && ack.took_part && ack.index >= commit)
            .count();
        ensure!(
            own + acked >= self.quorum,
            "commit: coord-{c}, leading term {}, announced commit index {commit} backed by {} of a majority of {} (its own disk holds up to {}; acknowledgements in its term: {:?})",
            term.0,
            own + acked,
            self.quorum,
            mirror.contiguous,
            heard.acks
        );
        if commit > mirror.snapshot {
            if let Some(entry) = mirror.log.get(&commit) {
                ensure!(
                    entry.term == term,
                    "commit: coord-{c}, leading term {}, moved its commit index to {commit}, an entry of term {} (paper 5.4.2)",
                    term.0,
                    entry.term.0
                );
            }
        }
        self.ledger.heard[c].commit = commit;
        Ok(())
    }

    /// What leader `c` may honestly hold committed now, leading the term it was judged to have
    /// won (and not yet told of a later one): the highest entry of that term that its own disk
    /// and the acknowledgements of that term from members taking part put on a majority. A
    /// leader may commit an index and step down before any message announces it; it still
    /// knows it is committed when it leads again.
    fn note_leader_progress(&mut self, c: usize) {
        let heard = &self.ledger.heard[c];
        let Some(term) = heard.led else {
            return;
        };
        if heard.term.max(heard.term_arriving) > term {
            return;
        }
        let mirror = &self.mirrors[c];
        let mut held: Vec<LogIndex> = heard
            .acks
            .values()
            .filter(|ack| ack.term == term && ack.took_part)
            .map(|ack| ack.index)
            .collect();
        held.push(mirror.contiguous);
        held.sort_unstable_by(|a, b| b.cmp(a));
        let Some(&on_majority) = held.get(self.quorum - 1) else {
            return;
        };
        let of_its_term = mirror
            .log
            .get(&on_majority)
            .is_some_and(|entry| entry.term == term);
        if of_its_term && on_majority > mirror.snapshot {
            let heard = &mut self.ledger.heard[c];
            heard.commit = heard.commit.max(on_majority);
        }
    }

    /// Each term some member was seen to lead (by its leaders' messages), with that member.
    pub fn leaders(&self) -> Vec<(u64, usize)> {
        self.ledger
            .leaders
            .iter()
            .map(|(term, &c)| (term.0, c))
            .collect()
    }

    /// A read reached member `c`: if it leads (as judged), what it had sent by then.
    pub fn read_mark(&self, c: usize) -> Option<ReadMark> {
        let heard = self.ledger.heard.get(c)?;
        Some(ReadMark {
            term: heard.led?,
            seq: heard.sent_seq,
        })
    }

    /// Leader `c` answers a read that reached it at `mark` (dissertation 6.4): a majority,
    /// itself included, must have answered a round it sent after the read arrived, in the same
    /// term; else a deposed leader could answer from a table the group has moved past.
    pub fn check_read_confirmed(&self, c: usize, mark: ReadMark, what: &str) -> Check {
        let Some(heard) = self.ledger.heard.get(c) else {
            return Ok(());
        };
        let confirmed = 1 + heard
            .acks
            .values()
            .filter(|ack| ack.term == mark.term && ack.took_part && ack.seq > mark.seq)
            .count();
        ensure!(
            confirmed >= self.quorum,
            "read confirmation: coord-{c} answered {what} in term {}, but only {confirmed} of a majority of {} answered a round it sent after the read arrived (round {})",
            mark.term.0,
            self.quorum,
            mark.seq
        );
        Ok(())
    }

    /// Member `c` describes itself in a `CLUSTER` answer. Any member answers from its own
    /// state, so the answer is not a linearizable read of the group; but what it says of itself
    /// must be true by what the checker saw: its term is no older than its disk's or any term it
    /// has been told of; a leader is the one judged to have won that term, and a follower names
    /// as leader only the member that sent leaders' messages in its term; its commit index is
    /// one it knows honestly (a leader's beyond that is judged as if announced); the indexes
    /// are ordered (applied <= commit <= last; applied on its disk, but for a snapshot being
    /// written, and a leader's own durable index too);
    /// and the members are the group's.
    pub fn check_cluster_view(&mut self, c: usize, view: &ClusterView) -> Check {
        let Some(heard) = self.ledger.heard.get(c) else {
            return Ok(());
        };
        let mirror = &self.mirrors[c];
        let me = &self.ledger.ids[c];
        let (term, commit) = (view.term, view.commit_index);
        ensure!(
            view.node_id == *me,
            "CLUSTER: coord-{c} answered as {}",
            view.node_id
        );
        ensure!(
            term >= mirror.term && term >= heard.term,
            "CLUSTER: coord-{c} says its term is {}, but its disk holds term {} and it has been told of term {}",
            term.0,
            mirror.term.0,
            heard.term.0
        );
        let on_disk = mirror.contiguous.max(mirror.snapshot);
        // (A snapshot being installed replaces the table at once, while it is written.)
        let installing = heard.snapshot_sizes.contains_key(&view.applied_index);
        ensure!(
            view.applied_index <= commit
                && commit <= view.last_index
                && (view.applied_index <= on_disk || installing),
            "CLUSTER: coord-{c} says applied {}, commit {}, last {}, with its disk holding up to {on_disk}",
            view.applied_index,
            commit,
            view.last_index
        );
        let mut names: Vec<&NodeId> = view.members.iter().map(|m| &m.node_id).collect();
        names.sort();
        let mut ids: Vec<&NodeId> = self.ledger.ids.iter().collect();
        ids.sort();
        ensure!(
            names == ids,
            "CLUSTER: coord-{c} lists the members {names:?}, but the group is {ids:?}"
        );
        let leader_of_term = self.ledger.leaders.get(&term).map(|&l| &self.ledger.ids[l]);
        if view.role == "leader" {
            ensure!(
                heard.led == Some(term) && view.leader.as_ref() == Some(me),
                "CLUSTER: coord-{c} says it leads term {} (leader {:?}), but the leader judged for that term is {leader_of_term:?}",
                term.0,
                view.leader
            );
            let own = view.members.iter().find(|m| m.node_id == *me);
            let matched = own.and_then(|m| m.matched_index);
            ensure!(
                matched.is_none_or(|matched| matched <= on_disk),
                "CLUSTER: leader coord-{c} says it holds up to {matched:?}, but its disk holds up to {on_disk}"
            );
            if commit > heard.commit {
                self.announced_commit(c, term, commit)?;
            }
        } else {
            if let Some(leader) = &view.leader {
                ensure!(
                    leader_of_term == Some(leader),
                    "CLUSTER: coord-{c}, a {} in term {}, names {leader} as leader, but the member that sent leaders' messages in that term is {leader_of_term:?}",
                    view.role,
                    term.0
                );
            }
            ensure!(
                commit <= heard.commit,
                "CLUSTER: coord-{c}, a {} in term {}, says its commit index is {commit}, but nothing told it more than {}",
                view.role,
                term.0,
                heard.commit
            );
        }
        Ok(())
    }

    /// Member `c` started a hand-over of leadership to `to`: only a member that won an
    /// election may, and only to another member of the group.
    pub fn check_transfer_started(&self, c: usize, to: &NodeId) -> Check {
        let Some(heard) = self.ledger.heard.get(c) else {
            return Ok(());
        };
        ensure!(
            heard.led.is_some(),
            "TRANSFER_STARTED from coord-{c}, which never won an election in this process"
        );
        ensure!(
            *to != self.ledger.ids[c] && self.ledger.ids.contains(to),
            "TRANSFER_STARTED from coord-{c} to {to}, which is itself or no member"
        );
        Ok(())
    }

    /// `message` from member `from` was delivered to member `to`'s current process.
    pub fn peer_delivered(&mut self, to: usize, from: usize, message: &PeerMessage) {
        let heard = &mut self.ledger.heard[to];
        heard.term_arriving = Term(0);
        let term = match message {
            PeerMessage::VoteReply { term, granted } => {
                if *granted {
                    heard.grants.entry(*term).or_default().insert(from);
                }
                *term
            }
            PeerMessage::Append { term, commit, .. } => {
                heard.commit = heard.commit.max(*commit);
                *term
            }
            PeerMessage::AppendReply {
                term,
                success,
                index,
                abstaining,
                seq,
                ..
            } => {
                let acked = if *success { *index } else { LogIndex(0) };
                let seq = heard.round_answered(*term, *seq);
                heard
                    .acks
                    .entry(from)
                    .or_default()
                    .heard(*term, acked, *abstaining, seq);
                *term
            }
            PeerMessage::Snapshot {
                term, index, total, ..
            } => {
                heard.snapshot_sizes.insert(*index, *total);
                heard.commit = heard.commit.max(*index);
                *term
            }
            PeerMessage::SnapshotReply {
                term,
                abstaining,
                seq,
                ..
            } => {
                let seq = heard.round_answered(*term, *seq);
                heard
                    .acks
                    .entry(from)
                    .or_default()
                    .heard(*term, LogIndex(0), *abstaining, seq);
                *term
            }
            PeerMessage::TimeoutNow { term }
            | PeerMessage::PreVoteReply {
                term,
                granted: false,
                ..
            } => *term,
            PeerMessage::Vote { .. }
            | PeerMessage::PreVote { .. }
            | PeerMessage::PreVoteReply { .. }
            | PeerMessage::Hello { .. } => return,
        };
        heard.term_arriving = term;
        if matches!(message, PeerMessage::AppendReply { success: true, .. }) {
            self.note_leader_progress(to);
        }
    }

    /// Member `to` has handled the message last delivered to it (and sent what it made it
    /// send): from now on it knows that message's term.
    pub fn peer_handled(&mut self, to: usize) {
        if let Some(heard) = self.ledger.heard.get_mut(to) {
            heard.term = heard.term.max(heard.term_arriving);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The judge itself, on hand-made histories: each rule fails on the smallest history that
    //! breaks it, and the honest version of that history passes.

    use herder_core::command::Command;
    use herder_core::storage::HardState;
    use herder_core::time::UnixMillis;

    use super::*;

    fn id(c: usize) -> NodeId {
        NodeId(format!("coord-{c}"))
    }

    fn three() -> Checker {
        let mut checker = Checker::new(3);
        checker.set_members((0..3).map(id).collect());
        checker
    }

    fn hard_state(term: u64, voted_for: Option<usize>) -> Record {
        Record::HardState(HardState {
            term: Term(term),
            voted_for: voted_for.map(id),
            abstaining: false,
        })
    }

    fn entry(index: u64, term: u64, leader: usize) -> LogEntry {
        LogEntry {
            index: LogIndex(index),
            term: Term(term),
            at: UnixMillis::UNSTAMPED,
            command: Command::NewLeader { leader: id(leader) },
        }
    }

    fn append(term: u64, prev: (u64, u64), entries: Vec<LogEntry>, commit: u64) -> PeerMessage {
        PeerMessage::Append {
            term: Term(term),
            prev_index: LogIndex(prev.0),
            prev_term: Term(prev.1),
            entries,
            commit: LogIndex(commit),
            seq: 1,
        }
    }

    fn grant(term: u64) -> PeerMessage {
        PeerMessage::VoteReply {
            term: Term(term),
            granted: true,
        }
    }

    fn ack(term: u64, index: u64) -> PeerMessage {
        PeerMessage::AppendReply {
            term: Term(term),
            success: true,
            index: LogIndex(index),
            conflict_term: None,
            seq: 1,
            abstaining: false,
        }
    }

    /// coord-0 votes for itself in `term` (durably) and is granted coord-1's vote.
    fn elected(checker: &mut Checker, term: u64) {
        checker
            .record_durable(0, &[hard_state(term, Some(0))])
            .expect("own vote");
        checker.peer_delivered(0, 1, &grant(term));
    }

    #[test]
    fn a_leader_needs_the_votes_of_a_majority_delivered_to_it() {
        let mut checker = three();
        checker
            .record_durable(0, &[hard_state(1, Some(0))])
            .expect("own vote");
        let error = checker
            .peer_sent(0, 1, &append(1, (0, 0), Vec::new(), 0))
            .expect_err("one vote of three");
        assert!(error.starts_with("election:"), "{error}");

        let mut checker = three();
        elected(&mut checker, 1);
        checker
            .peer_sent(0, 1, &append(1, (0, 0), Vec::new(), 0))
            .expect("two votes of three");
        assert_eq!(checker.elections_judged, 1);
    }

    #[test]
    fn a_vote_of_another_term_does_not_count() {
        let mut checker = three();
        checker
            .record_durable(0, &[hard_state(2, Some(0))])
            .expect("own vote");
        checker.peer_delivered(0, 1, &grant(1));
        let error = checker
            .peer_sent(0, 1, &append(2, (0, 0), Vec::new(), 0))
            .expect_err("a vote of term 1 elects nobody in term 2");
        assert!(error.starts_with("election:"), "{error}");
    }

    #[test]
    fn two_leaders_of_one_term_are_caught_by_their_messages() {
        let mut checker = three();
        elected(&mut checker, 1);
        checker
            .peer_sent(0, 2, &append(1, (0, 0), Vec::new(), 0))
            .expect("coord-0 leads");
        checker
            .record_durable(2, &[hard_state(1, Some(2))])
            .expect("own vote");
        checker.peer_delivered(2, 1, &grant(1));
        let error = checker
            .peer_sent(2, 0, &append(1, (0, 0), Vec::new(), 0))
            .expect_err("coord-2 also claims term 1");
        assert!(error.starts_with("election safety:"), "{error}");
    }

    #[test]
    fn a_vote_is_granted_once_per_term_across_restarts() {
        let mut checker = three();
        checker.peer_sent(1, 0, &grant(3)).expect("first vote");
        checker
            .peer_sent(1, 0, &grant(3))
            .expect("the same vote again");
        let error = checker
            .peer_sent(1, 2, &grant(3))
            .expect_err("a second candidate in the same term");
        assert!(error.starts_with("one vote per term:"), "{error}");
        // A lost disk is the fault that may forget a vote.
        checker.disk_lost(1);
        checker
            .peer_sent(1, 2, &grant(3))
            .expect("after the disk was lost");
    }

    #[test]
    fn a_disk_never_moves_its_term_back_nor_rewrites_a_vote() {
        let mut checker = three();
        checker
            .record_durable(1, &[hard_state(4, Some(0))])
            .expect("a vote");
        let error = checker
            .record_durable(1, &[hard_state(3, None)])
            .expect_err("term 4 then term 3");
        assert!(error.starts_with("durable term:"), "{error}");
        let error = checker
            .record_durable(1, &[hard_state(4, Some(2))])
            .expect_err("another vote in term 4");
        assert!(error.starts_with("durable vote:"), "{error}");
        checker
            .record_durable(1, &[hard_state(5, None)])
            .expect("a later term, no vote yet");
    }

    #[test]
    fn a_candidate_asks_for_votes_only_once_its_own_is_durable() {
        let mut checker = three();
        let vote = PeerMessage::Vote {
            term: Term(1),
            last_index: LogIndex(0),
            last_term: Term(0),
            transfer: false,
        };
        let error = checker.peer_sent(0, 1, &vote).expect_err("nothing durable");
        assert!(error.starts_with("durability before effect:"), "{error}");
        checker
            .record_durable(0, &[hard_state(1, Some(0))])
            .expect("own vote");
        checker.peer_sent(0, 1, &vote).expect("durable now");
    }

    #[test]
    fn a_commit_index_needs_acknowledgements_of_the_leaders_term() {
        let mut checker = three();
        elected(&mut checker, 2);
        checker
            .record_durable(0, &[Record::Log(Box::new(entry(1, 2, 0)))])
            .expect("the leader's first entry");
        checker
            .peer_sent(0, 1, &append(2, (0, 0), vec![entry(1, 2, 0)], 0))
            .expect("replicate");
        // An acknowledgement of term 1 proves nothing in term 2.
        checker.peer_delivered(0, 1, &ack(1, 1));
        let error = checker
            .peer_sent(0, 1, &append(2, (1, 2), Vec::new(), 1))
            .expect_err("only the leader holds entry 1 in term 2");
        assert!(error.starts_with("commit:"), "{error}");
        checker.peer_delivered(0, 1, &ack(2, 1));
        checker
            .peer_sent(0, 1, &append(2, (1, 2), Vec::new(), 1))
            .expect("a majority of term 2 holds it");
    }

    #[test]
    fn a_leader_told_of_a_higher_term_leads_no_more() {
        let mut checker = three();
        elected(&mut checker, 1);
        checker
            .peer_sent(0, 1, &append(1, (0, 0), Vec::new(), 0))
            .expect("leads term 1");
        checker.peer_delivered(
            0,
            2,
            &PeerMessage::AppendReply {
                term: Term(2),
                success: false,
                index: LogIndex(0),
                conflict_term: None,
                seq: 1,
                abstaining: false,
            },
        );
        // A heartbeat due at the same instant may leave before the reply is handled.
        checker
            .peer_sent(0, 1, &append(1, (0, 0), Vec::new(), 0))
            .expect("sent while the reply was being delivered");
        checker.peer_handled(0);
        let error = checker
            .peer_sent(0, 1, &append(1, (0, 0), Vec::new(), 0))
            .expect_err("term 2 was heard");
        assert!(error.starts_with("higher term ignored:"), "{error}");
    }

    #[test]
    fn a_read_waits_for_a_majority_to_answer_a_later_round() {
        let mut checker = three();
        elected(&mut checker, 1);
        let round = |seq| PeerMessage::Append {
            term: Term(1),
            prev_index: LogIndex(0),
            prev_term: Term(0),
            entries: Vec::new(),
            commit: LogIndex(0),
            seq,
        };
        let reply = |seq| PeerMessage::AppendReply {
            term: Term(1),
            success: true,
            index: LogIndex(0),
            conflict_term: None,
            seq,
            abstaining: false,
        };
        checker.peer_sent(0, 1, &round(1)).expect("round 1");
        checker.peer_delivered(0, 1, &reply(1));
        let mark = checker.read_mark(0).expect("coord-0 leads");
        let error = checker
            .check_read_confirmed(0, mark, "a STATUS")
            .expect_err("round 1 left before the read arrived");
        assert!(error.starts_with("read confirmation:"), "{error}");
        checker.peer_sent(0, 1, &round(2)).expect("round 2");
        checker.peer_delivered(0, 1, &reply(2));
        checker
            .check_read_confirmed(0, mark, "a STATUS")
            .expect("coord-1 answered round 2");
    }

    #[test]
    fn one_index_and_term_name_one_entry_everywhere() {
        let mut checker = three();
        checker
            .record_durable(1, &[Record::Log(Box::new(entry(1, 1, 0)))])
            .expect("an entry");
        let error = checker
            .record_durable(2, &[Record::Log(Box::new(entry(1, 1, 2)))])
            .expect_err("another entry at index 1 of term 1");
        assert!(error.starts_with("log matching:"), "{error}");
        checker
            .record_durable(1, &[Record::Log(Box::new(entry(2, 3, 0)))])
            .expect("entry 2 of term 3 after one of term 1");
        // Disk 2 holds another term at index 1: entry 2 of term 3 cannot follow it there.
        checker
            .record_durable(2, &[Record::Log(Box::new(entry(1, 2, 2)))])
            .expect("index 1 of term 2");
        let error = checker
            .record_durable(2, &[Record::Log(Box::new(entry(2, 3, 0)))])
            .expect_err("entry 2 of term 3 follows term 1 elsewhere");
        assert!(error.starts_with("log matching:"), "{error}");
    }
}
