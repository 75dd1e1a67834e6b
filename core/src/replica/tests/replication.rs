//! Replication and commitment (paper 5.3, 5.4.2).

use super::*;

#[test]
fn an_entry_commits_once_a_majority_holds_it_durably_and_not_before() {
    // Paper 5.3 and figure 2: a follower acknowledges an entry once it is on its disk; the
    // leader commits when a majority (itself included) acknowledged it.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(50);
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    for &f in &followers {
        net.hold_disk.insert(f);
    }
    let proposal = net.propose(leader, 7);
    net.deliver();
    assert!(
        net.r(leader).committed_index() < proposal.index,
        "followers' disks held"
    );
    net.release_disk(followers[0]);
    net.deliver();
    assert_eq!(net.r(leader).committed_index(), proposal.index);
    assert!(net.applied[leader]
        .iter()
        .any(|e| e.index == proposal.index));
}

#[test]
fn a_leader_counts_itself_only_for_what_is_on_its_own_disk() {
    // Dissertation 10.2.1: the leader may send entries before writing them, but it counts
    // itself towards a majority only once they are durable.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(50);
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    net.hold_disk.insert(leader);
    net.hold_disk.insert(followers[1]);
    let proposal = net.propose(leader, 8);
    net.deliver();
    assert!(
        net.r(leader).committed_index() < proposal.index,
        "only one follower has it durably"
    );
    net.release_disk(leader);
    net.deliver();
    assert_eq!(net.r(leader).committed_index(), proposal.index);
}

#[test]
fn entries_of_an_earlier_term_commit_only_with_one_of_the_current_term() {
    // Paper 5.4.2 and figure 8: a leader never commits an entry of an earlier term by counting
    // replicas; it commits its own first entry, and everything before it with it.
    let logs = vec![
        vec![entry(1, 1), entry(2, 2)],
        vec![entry(1, 1), entry(2, 2)],
        vec![entry(1, 1)],
    ];
    let mut net = Net::with_logs(logs);
    // Node 0 wins term 3 (its log is as up to date as any), but its own disk is held, so its
    // term-3 no-op at index 3 is durable on node 1 only.
    net.hold_disk.insert(0);
    net.cut.insert((0, 2));
    net.fire_election_timer(0);
    net.deliver();
    // The vote request is held until its own vote is durable.
    net.release_disk(0);
    net.hold_disk.insert(0);
    net.deliver();
    assert!(net.r(0).is_leader());
    assert_eq!(net.r(0).term(), Term(3));
    net.run(30);
    // Entry 2 (term 2) is on nodes 0 and 1: a majority, but it must not be committed alone.
    assert!(net.r(0).committed_index() < LogIndex(2));
    net.release_disk(0);
    net.deliver();
    net.run(30);
    assert_eq!(
        net.r(0).committed_index(),
        LogIndex(3),
        "the term-3 entry on a majority commits entries 2 and 3"
    );
}

#[test]
fn a_follower_gives_up_a_conflicting_suffix_for_the_leaders_entries() {
    // Paper 5.3: on a conflict the follower deletes the existing entry and all that follow it.
    let logs = vec![
        vec![entry(1, 1), entry(2, 2)],
        vec![entry(1, 1), entry(2, 2)],
        vec![entry(1, 1), entry(2, 1), entry(3, 1), entry(4, 1)],
    ];
    let mut net = Net::with_logs(logs);
    // Node 2's log has a higher last index but a lower last term: it cannot win.
    net.cut.insert((2, 0));
    net.cut.insert((2, 1));
    let leader = net.elect();
    assert_ne!(leader, 2);
    net.heal();
    net.run(200);
    // Compare what both still hold in memory (each compacts what it applied).
    let from = net
        .r(2)
        .log()
        .base_index()
        .max(net.r(leader).log().base_index());
    let terms = |r: &Replica| -> Vec<Option<Term>> {
        (from.0 + 1..=r.last_index().0)
            .map(|i| r.term_at(LogIndex(i)))
            .collect()
    };
    assert_eq!(net.r(2).last_index(), net.r(leader).last_index());
    assert_eq!(terms(net.r(2)), terms(net.r(leader)));
    assert!(net.disks[2]
        .log
        .values()
        .all(|e| e.term != Term(1) || e.index == LogIndex(1)));
}

#[test]
fn a_rejection_skips_back_a_whole_conflicting_term() {
    // Paper 5.3 (the optimization at the end): the follower names the first index of the
    // conflicting term, so the leader skips all of it in one round trip.
    let mut stale = vec![entry(1, 1)];
    stale.extend((2..=60).map(|i| entry(i, 2)));
    let logs = vec![
        vec![entry(1, 1), entry(2, 3)],
        vec![entry(1, 1), entry(2, 3)],
        stale,
    ];
    let mut net = Net::with_logs(logs);
    net.cut.insert((2, 0));
    net.cut.insert((2, 1));
    let leader = net.elect();
    net.heal();
    let before = net.sent.len();
    net.run(200);
    let rejections = net.sent[before..]
        .iter()
        .filter(|(from, _, m)| {
            *from == 2 && matches!(m, PeerMessage::AppendReply { success: false, .. })
        })
        .count();
    assert!(
        rejections <= 2,
        "{rejections} rejections to skip 59 entries of one term"
    );
    assert_eq!(net.r(2).last_index(), net.r(leader).last_index());
}

#[test]
fn an_append_acknowledgement_waits_for_the_followers_disk() {
    // Paper figure 2: a follower replies to AppendEntries only after the entries are stored.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(50);
    let follower = (leader + 1) % 3;
    net.hold_disk.insert(follower);
    let before = net.sent.len();
    let proposal = net.propose(leader, 9);
    net.deliver();
    let acked = |net: &Net, from: usize| {
        net.sent[before..].iter().any(|(f, _, m)| {
            *f == from
                && matches!(m, PeerMessage::AppendReply { success: true, index, .. } if *index >= proposal.index)
        })
    };
    assert!(!acked(&net, follower));
    net.release_disk(follower);
    net.deliver();
    assert!(acked(&net, follower));
}
