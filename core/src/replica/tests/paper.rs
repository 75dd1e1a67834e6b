//! The rules of the Raft paper's figure 2 that the other modules do not already name, one test
//! each, driven by hand through the same test network. Together with `elections`,
//! `replication`, `operations` and `lost_disks` they cover every rule of figure 2 and the
//! safety arguments of sections 5.2 to 5.4:
//!
//! - all servers, a higher term makes a member a follower (5.1), and nothing it decided in
//!   the older term leaves afterwards: here;
//! - followers and candidates: elections (5.2) in `elections`; a candidate's first steps: here;
//! - leaders: heartbeats and the commit rule (5.3, 5.4.2) in `replication`;
//! - RequestVote receiver: an older term refused, one grant per term (here), the election
//!   restriction (5.4.1) in `elections`;
//! - AppendEntries receiver: an older term and a missing previous entry refused, the commit
//!   index bounded by the last new entry (here), conflicting suffixes given up in
//!   `replication`;
//! - persistent state before answering: votes and acknowledgements in `elections` and
//!   `replication`, a candidate's own term and vote here;
//! - leader append-only (5.3): here; log matching and state machine safety over random
//!   schedules in `random`.
//!
//! The same safety arguments are also staged in the simulator's whole world, with workers,
//! clients and the checker judging every step (`sim/tests/paper.rs`).
//!
//! Section 6 (membership changes) does not apply: a group's members are fixed when it starts.
//! A member that lost its disk rejoins as the same member, by the rules `lost_disks` checks.

use super::*;

/// The last message `from` sent to `to`.
fn last_sent(net: &Net, from: usize, to: usize) -> PeerMessage {
    net.sent
        .iter()
        .rev()
        .find(|(f, t, _)| *f == from && *t == to)
        .map(|(_, _, message)| message.clone())
        .expect("a message was sent")
}

/// An `APPEND` of `term` carrying `entries` after `prev` (index, term).
fn append(
    term: Term,
    prev: (LogIndex, Term),
    entries: Vec<LogEntry>,
    commit: LogIndex,
) -> PeerMessage {
    PeerMessage::Append {
        term,
        prev_index: prev.0,
        prev_term: prev.1,
        entries,
        commit,
        seq: 1,
    }
}

/// Delivers `message` from `from` to `to` at once, and lets `to` act on it.
fn inject(net: &mut Net, from: usize, to: usize, message: PeerMessage) {
    let now = net.now;
    net.rm(to).handle_message(now, &id(from), message);
    net.settle(to);
}

#[test]
fn a_reply_with_a_higher_term_makes_a_leader_follow() {
    // Figure 2, all servers (5.1): a response whose term is higher than ours makes us a
    // follower of that term, on disk before anything else is said.
    let mut net = Net::new(3);
    let leader = net.elect();
    let follower = (leader + 1) % 3;
    let term = net.r(leader).term();
    let higher = Term(term.0 + 1);
    inject(
        &mut net,
        follower,
        leader,
        PeerMessage::AppendReply {
            term: higher,
            success: false,
            index: LogIndex(0),
            conflict_term: None,
            seq: 0,
            abstaining: false,
        },
    );
    assert!(
        !net.r(leader).is_leader(),
        "a higher term deposes the leader"
    );
    assert_eq!(net.r(leader).term(), higher);
    assert_eq!(
        net.disks[leader].hard_state.term, higher,
        "and it is on disk"
    );
}

#[test]
fn a_request_for_votes_of_an_older_term_is_refused_with_the_current_term() {
    // Figure 2, RequestVote receiver 1: reply false if the candidate's term is older.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(300);
    let (voter, candidate) = ((leader + 1) % 3, (leader + 2) % 3);
    let term = net.r(voter).term();
    inject(
        &mut net,
        candidate,
        voter,
        PeerMessage::Vote {
            term: Term(term.0 - 1),
            last_index: LogIndex(1_000),
            last_term: term,
            transfer: true,
        },
    );
    assert_eq!(
        last_sent(&net, voter, candidate),
        PeerMessage::VoteReply {
            term,
            granted: false
        }
    );
}

#[test]
fn a_voter_grants_one_candidate_per_term_and_remembers_it_across_a_restart() {
    // Figure 2, RequestVote receiver 2, and persistent state: votedFor survives a restart,
    // so a second candidate of the same term is refused, while the first may ask again.
    // Members that hold data (an empty one abstains from elections until it rejoins).
    let mut net = Net::with_logs(vec![vec![entry(1, 1)]; 3]);
    let ask = |term| PeerMessage::Vote {
        term: Term(term),
        last_index: LogIndex(1),
        last_term: Term(1),
        transfer: true,
    };
    inject(&mut net, 1, 0, ask(5));
    assert_eq!(
        last_sent(&net, 0, 1),
        PeerMessage::VoteReply {
            term: Term(5),
            granted: true
        }
    );
    net.crash(0);
    net.start(0);
    inject(&mut net, 2, 0, ask(5));
    assert_eq!(
        last_sent(&net, 0, 2),
        PeerMessage::VoteReply {
            term: Term(5),
            granted: false
        },
        "another candidate of term 5, after a restart"
    );
    inject(&mut net, 1, 0, ask(5));
    assert_eq!(
        last_sent(&net, 0, 1),
        PeerMessage::VoteReply {
            term: Term(5),
            granted: true
        },
        "the same candidate asking again"
    );
}

#[test]
fn an_append_of_an_older_term_is_refused_with_the_current_term() {
    // Figure 2, AppendEntries receiver 1: a deposed leader learns the newer term.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(100);
    let (follower, stale) = ((leader + 1) % 3, (leader + 2) % 3);
    let term = net.r(follower).term();
    let last = net.r(follower).last_index();
    inject(
        &mut net,
        stale,
        follower,
        append(
            Term(term.0 - 1),
            (LogIndex(0), Term(0)),
            vec![entry(1, term.0 - 1)],
            LogIndex(1),
        ),
    );
    match last_sent(&net, follower, stale) {
        PeerMessage::AppendReply {
            term: replied,
            success,
            seq,
            ..
        } => {
            assert_eq!(replied, term);
            assert!(!success);
            // It answers no round of a current leader (dissertation 6.4: a read confirmed by
            // it would not be): the sender may lead a later term by now.
            assert_eq!(seq, 0, "no sequence number echoed");
        }
        other => panic!("expected an APPEND_REPLY, got {other:?}"),
    }
    assert_eq!(net.r(follower).last_index(), last, "its log is untouched");
}

#[test]
fn an_append_whose_previous_entry_is_missing_is_refused() {
    // Figure 2, AppendEntries receiver 2 (the consistency check of 5.3).
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(100);
    let follower = (leader + 1) % 3;
    let term = net.r(leader).term();
    let last = net.r(follower).last_index();
    let beyond = last.0 + 10;
    inject(
        &mut net,
        leader,
        follower,
        append(
            term,
            (LogIndex(beyond), term),
            vec![entry(beyond + 1, term.0)],
            LogIndex(0),
        ),
    );
    match last_sent(&net, follower, leader) {
        PeerMessage::AppendReply { success, .. } => assert!(!success),
        other => panic!("expected an APPEND_REPLY, got {other:?}"),
    }
    assert_eq!(net.r(follower).last_index(), last, "nothing appended");
}

#[test]
fn a_follower_commits_no_further_than_the_last_entry_the_append_carried() {
    // Figure 2, AppendEntries receiver 5: commitIndex = min(leaderCommit, last new entry).
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(100);
    let follower = (leader + 1) % 3;
    let term = net.r(leader).term();
    let (last, last_term) = (net.r(follower).last_index(), net.r(follower).last_term());
    let new = last.0 + 1;
    inject(
        &mut net,
        leader,
        follower,
        append(
            term,
            (last, last_term),
            vec![entry(new, term.0)],
            LogIndex(new + 50),
        ),
    );
    assert_eq!(net.r(follower).committed_index(), LogIndex(new));
}

#[test]
fn a_candidate_asks_for_votes_only_once_its_new_term_and_own_vote_are_on_disk() {
    // Figure 2, candidates (5.2): on conversion, increment the term and vote for self; and
    // persistent state is updated before anything that depends on it is sent.
    let mut net = Net::with_logs(vec![vec![entry(1, 1)]; 3]);
    net.hold_disk.insert(0);
    net.fire_election_timer(0);
    net.deliver();
    let asked = |net: &Net| {
        net.sent
            .iter()
            .any(|(from, _, m)| *from == 0 && matches!(m, PeerMessage::Vote { .. }))
    };
    assert!(
        !asked(&net),
        "no request for votes before the disk holds the vote"
    );
    assert_eq!(net.r(0).term(), Term(2), "the candidate entered term 2");
    net.release_disk(0);
    assert!(asked(&net), "asked once durable");
    assert_eq!(net.disks[0].hard_state.term, Term(2));
    assert_eq!(net.disks[0].hard_state.voted_for, Some(id(0)));
}

#[test]
fn a_request_for_votes_held_for_the_disk_is_dropped_once_a_higher_term_is_known() {
    // Figure 2, all servers (5.1): a member told of a higher term converts to follower of it.
    // A request for votes it decided in the older term, still waiting for its disk, must not
    // leave afterwards: it would speak for a term the member has left.
    let mut net = Net::with_logs(vec![vec![entry(1, 1)]; 3]);
    net.hold_disk.insert(0);
    net.fire_election_timer(0);
    net.deliver();
    assert_eq!(net.r(0).term(), Term(2), "the candidate entered term 2");
    let later = append(Term(3), (LogIndex(1), Term(1)), Vec::new(), LogIndex(0));
    inject(&mut net, 1, 0, later);
    assert_eq!(net.r(0).term(), Term(3), "it follows term 3");
    net.release_disk(0);
    let stale = net.sent.iter().any(|(from, _, m)| {
        *from == 0 && matches!(m, PeerMessage::Vote { term, .. } if *term == Term(2))
    });
    assert!(
        !stale,
        "a request for votes of term 2 left after term 3 was known"
    );
}

#[test]
fn a_leader_never_overwrites_its_own_entries() {
    // Leader append-only (5.3, figure 3): an APPEND of the leader's own term from anyone else
    // is a broken peer; the leader's log stays as it was.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(100);
    let other = (leader + 1) % 3;
    let term = net.r(leader).term();
    let before: Vec<Option<Term>> = (1..=net.r(leader).last_index().0)
        .map(|i| net.r(leader).term_at(LogIndex(i)))
        .collect();
    let first = net.r(leader).log().get(LogIndex(1)).cloned();
    let mut forged = entry(1, term.0);
    forged.command = requeue(424_242);
    inject(
        &mut net,
        other,
        leader,
        append(term, (LogIndex(0), Term(0)), vec![forged], LogIndex(0)),
    );
    assert!(net.r(leader).is_leader());
    let after: Vec<Option<Term>> = (1..=net.r(leader).last_index().0)
        .map(|i| net.r(leader).term_at(LogIndex(i)))
        .collect();
    assert_eq!(before, after);
    assert_eq!(net.r(leader).log().get(LogIndex(1)).cloned(), first);
}
