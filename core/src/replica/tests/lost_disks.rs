//! Members that lose their disk: abstaining until it is safe to vote again, and a leader
//! that forgets what an earlier process of a member acknowledged (see `rejoin.rs`).

use super::*;

#[test]
fn a_member_that_lost_its_disk_abstains_until_it_heard_everyone_and_caught_up() {
    // See `rejoin`: an empty member of an established group may have voted and acknowledged in
    // an earlier life; it votes again only once that cannot matter.
    let mut net = Net::new(3);
    let leader = net.elect();
    for n in 0..5 {
        net.propose(leader, n);
    }
    net.run(100);
    let wiped = (leader + 1) % 3;
    net.crash(wiped);
    net.disks[wiped] = Disk::default();
    net.start(wiped);
    assert!(
        net.r(wiped).is_abstaining(),
        "an empty member starts abstaining"
    );
    net.run(600);
    assert!(
        !net.r(wiped).is_abstaining(),
        "it heard everyone and caught up"
    );
    let term = net.r(wiped).term();
    assert!(
        net.events
            .iter()
            .any(|(i, e)| *i == wiped
                && matches!(e, ReplicaEvent::Rejoined { term: t } if *t == term))
    );
    assert_eq!(
        net.r(wiped).voted_for(),
        Some(&id(wiped)),
        "no second vote in this term"
    );
    assert_eq!(net.r(wiped).last_index(), net.r(leader).last_index());
}

#[test]
fn an_entry_committed_with_a_lost_copy_survives_because_the_empty_member_abstains() {
    // The entry is committed on the leader and one follower only; that follower loses its disk
    // and the leader crashes. The third member, which lacks the entry, must not be elected
    // with the empty member's vote.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(50);
    let (holder, lacking) = ((leader + 1) % 3, (leader + 2) % 3);
    net.cut.insert((leader, lacking));
    let proposal = net.propose(leader, 42);
    net.run(50);
    assert!(net.r(leader).committed_index() >= proposal.index);
    net.crash(leader);
    net.crash(holder);
    net.disks[holder] = Disk::default();
    net.start(holder);
    net.heal();
    net.run(2_000);
    assert!(
        net.leaders().is_empty(),
        "a leader without the committed entry was elected: {:?}",
        net.leaders()
    );
    net.start(leader);
    let new_leader = net.elect();
    net.run(300);
    for i in [new_leader, holder, lacking] {
        let r = net.r(i);
        assert!(
            r.committed_index() >= proposal.index,
            "n{i} has not committed it"
        );
        let held = r.term_at(proposal.index);
        assert!(
            held == Some(proposal.term) || r.log().base_index() >= proposal.index,
            "n{i} holds {held:?} at the committed index {}",
            proposal.index
        );
    }
    let applied = net.applied[new_leader]
        .iter()
        .chain(&net.applied[lacking])
        .any(|e| e.index == proposal.index && e.term == proposal.term);
    assert!(applied, "the committed entry was applied");
}

/// A member that learned it is caught up from a leader's commit index of an earlier term could
/// rejoin holding nothing: a leader that has just restarted starts with its commit index at its
/// base, below entries its predecessor committed. Here X is committed by A and C; C loses its
/// disk, A restarts and leads again while its appends to B and C's answers are lost, so A's
/// heartbeats carry commit 0. C must keep abstaining, so that B (which lacks X) cannot be
/// elected with C's vote once A crashes again.
#[test]
fn a_commit_index_of_an_earlier_term_does_not_end_abstention() {
    let mut net = Net::new(3);
    let a = net.elect();
    net.run(100);
    let (b, c) = ((a + 1) % 3, (a + 2) % 3);
    net.cut.insert((a, b));
    let x = net.propose(a, 42);
    net.run(40);
    assert!(net.applied_ever[a].contains_key(&x.index), "A applied X");
    assert!(net.r(b).last_index() < x.index, "B lacks X");
    net.heal();

    net.wipe(c);
    net.crash(a);
    net.start(c);
    net.start(a);
    assert!(net.r(c).is_abstaining());
    let lossy = &mut |from: usize, to: usize, m: &PeerMessage| {
        (from == a && to == b && matches!(m, PeerMessage::Append { .. }))
            || (from == c && to == a && matches!(m, PeerMessage::AppendReply { .. }))
    };
    net.fire_election_timer(a);
    net.deliver_with(lossy);
    assert!(net.r(a).is_leader(), "A leads again, with B's vote");
    net.run_with(90, &[a, c], lossy);
    assert!(
        net.r(c).is_abstaining(),
        "a commit index A has not reached in its own term proves nothing"
    );

    // With A down, B alone cannot win: C still abstains.
    net.crash(a);
    net.run(1_500);
    assert!(net.leaders().is_empty(), "B was elected without X");
    // A returns; the group elects a member holding X, and X stays where it was committed.
    net.start(a);
    net.run(1_000);
    assert_eq!(net.leaders().len(), 1);
    for i in 0..3 {
        let applied = net.applied_ever[i].get(&x.index).map(|e| e.term);
        assert_eq!(applied, Some(x.term), "n{i} applied X at its index");
    }
    net.check_applied_agree();
}

/// An acknowledgement sent by a member's previous process, still in flight when that member
/// comes back with an empty disk, must not count towards a commit: the copy it speaks of is
/// gone. The leader forgets what a member acknowledged before its newest connection.
#[test]
fn an_acknowledgement_from_before_a_lost_disk_counts_for_nothing() {
    let mut net = Net::new(3);
    let a = net.elect();
    net.run(100);
    let (b, c) = ((a + 1) % 3, (a + 2) % 3);
    net.cut.insert((a, b));
    let e = net.propose(a, 7);
    // C stores E and acknowledges it; the acknowledgement is held up in the network.
    let mut late = Vec::new();
    net.deliver_with(&mut |from, to, m| {
        let held = from == c
            && to == a
            && matches!(m, PeerMessage::AppendReply { success: true, index, .. } if *index >= e.index);
        if held {
            late.push(m.clone());
        }
        held
    });
    assert_eq!(late.len(), 1, "C acknowledged E");
    assert!(net.r(a).committed_index() < e.index);

    // C's disk is lost and a new process starts; the leader hears its HELLO.
    net.wipe(c);
    net.start(c);
    net.run_with(50, &[a, c], &mut |from, to, m| {
        from == a
            && to == c
            && matches!(m, PeerMessage::Append { entries, .. } if entries.iter().any(|x| x.index >= e.index))
    });
    assert!(
        net.events.iter().any(|(i, ev)| *i == a
            && matches!(ev, ReplicaEvent::FollowerLostEntries { follower, .. } if *follower == id(c))),
        "the leader noticed that C lost what it had acknowledged"
    );
    // The old acknowledgement finally arrives.
    let gen = net.gens[a];
    net.queue.push_back((c, a, gen, late.remove(0)));
    net.deliver();
    assert!(
        net.r(a).committed_index() < e.index,
        "E was committed on a copy that no longer exists"
    );
    assert!(!net.applied_ever[a].contains_key(&e.index));

    // A crashes; whatever B and C elect, nothing applied is ever contradicted.
    net.crash(a);
    net.heal();
    net.run(1_500);
    net.start(a);
    net.run(1_000);
    net.check_applied_agree();
}

/// A new group whose early messages were lost must still elect a leader once the network
/// is healthy. What an abstaining member knows of the others' logs comes from what they say
/// of them (the last index in their pre-votes and answers), never from their terms, which rise
/// in a new group through elections nobody wins.
#[test]
fn a_new_group_elects_a_leader_after_early_losses() {
    for seed in 0..200u64 {
        let n = if seed % 2 == 0 { 3 } else { 5 };
        let mut net = Net::new(n);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        net.run_with(400, &(0..n).collect::<Vec<_>>(), &mut |_, _, _| {
            rng.next_u64() % 2 == 0
        });
        net.run(3_000);
        assert_eq!(
            net.leaders().len(),
            1,
            "seed {seed}: no single leader after 3 s of a healthy network (terms {:?}, abstaining {:?})",
            (0..n).map(|i| net.r(i).term().0).collect::<Vec<_>>(),
            (0..n).map(|i| net.r(i).is_abstaining()).collect::<Vec<_>>()
        );
    }
}

/// A rejection that arrives late (a duplicate of one the leader already acted on) is no sign
/// of a lost disk, and must not lower what the leader counts the follower as holding.
#[test]
fn a_late_rejection_does_not_lower_what_a_follower_holds() {
    let mut net = Net::new(3);
    let a = net.elect();
    net.run(100);
    let f = (a + 1) % 3;
    net.crash(f);
    for n in 0..3 {
        net.propose(a, n);
    }
    net.run(30);
    net.start(f);
    let sent_before = net.sent.len();
    net.propose(a, 99);
    net.run(200);
    let rejection = net.sent[sent_before..]
        .iter()
        .find(|(from, to, m)| {
            *from == f && *to == a && matches!(m, PeerMessage::AppendReply { success: false, .. })
        })
        .map(|(_, _, m)| m.clone())
        .expect("F refused a probe while catching up");
    assert_eq!(net.r(f).last_index(), net.r(a).last_index(), "F caught up");
    let matched = |net: &Net| {
        net.r(a)
            .followers()
            .into_iter()
            .find(|p| p.id == id(f))
            .map(|p| p.matched)
    };
    let before = matched(&net);
    let gen = net.gens[a];
    net.queue.push_back((f, a, gen, rejection));
    net.deliver();
    assert_eq!(
        matched(&net),
        before,
        "the late refusal lowered F's matched index"
    );
    assert!(
        !net.events
            .iter()
            .any(|(i, e)| *i == a && matches!(e, ReplicaEvent::FollowerLostEntries { .. })),
        "a healthy follower was reported as having lost its disk"
    );
}

/// The schedule that once left a new group without a leader for good: a few early losses let
/// one member rejoin while the other two took a refused pre-vote in a term above 0 for a sign
/// of data, and each waited to be caught up by a leader that could only be elected with one of
/// their votes.
#[test]
fn a_new_group_is_not_mistaken_for_one_with_data() {
    let mut net = Net::new(3);
    let (a, b, c) = (0, 1, 2);
    let kind = |m: &PeerMessage| match m {
        PeerMessage::PreVote { .. } => "pre-vote",
        PeerMessage::PreVoteReply { .. } => "pre-vote-reply",
        PeerMessage::Vote { .. } => "vote",
        PeerMessage::VoteReply { .. } => "vote-reply",
        _ => "other",
    };
    // Member `i`'s timer fires; then what follows is delivered, but for the `lost` messages.
    let step = |net: &mut Net, i: usize, lost: &[(usize, usize, &str)]| {
        net.fire_election_timer(i);
        net.settle(i);
        net.deliver_with(&mut |from, to, m| {
            lost.iter()
                .any(|&(f, t, k)| f == from && t == to && (k == "any" || k == kind(m)))
        });
    };
    step(&mut net, c, &[(c, b, "pre-vote"), (a, c, "pre-vote-reply")]);
    step(&mut net, b, &[(b, c, "pre-vote"), (a, b, "pre-vote-reply")]);
    step(&mut net, a, &[(a, c, "any")]);
    step(&mut net, c, &[(c, b, "pre-vote")]);
    step(&mut net, a, &[(a, b, "vote")]);
    step(&mut net, b, &[]);
    net.run(3_000);
    assert_eq!(
        net.leaders().len(),
        1,
        "no leader after 3 s of a healthy network (terms {:?}, abstaining {:?})",
        (0..3).map(|i| net.r(i).term().0).collect::<Vec<_>>(),
        (0..3).map(|i| net.r(i).is_abstaining()).collect::<Vec<_>>()
    );
}

/// A leader is cut off (its timers stopped: a paused process) with an entry `doomed` nobody
/// else has; the other two elect a new leader, which commits past that index with the third
/// member. That member then loses its disk and restarts; the new leader is cut off, and only
/// the deposed leader can reach the empty member. Returns (deposed, new leader, empty member,
/// doomed entry).
fn depose_then_wipe_its_successors_follower(net: &mut Net) -> (usize, usize, usize, Proposal) {
    let old = net.elect();
    net.run(50);
    let (next, third) = ((old + 1) % 3, (old + 2) % 3);
    net.isolate(old);
    let doomed = net.propose(old, 7);
    let mut new_leader = None;
    for _ in 0..40 {
        net.run_with(50, &[next, third], &mut |_, _, _| false);
        new_leader = [next, third].into_iter().find(|&i| net.r(i).is_leader());
        if new_leader.is_some_and(|l| net.r(l).committed_index() >= doomed.index) {
            break;
        }
    }
    let new_leader = new_leader.expect("the two elect a leader");
    assert!(
        net.r(new_leader).committed_index() >= doomed.index,
        "the new leader committed past the deposed leader's entry"
    );
    let other = if new_leader == next { third } else { next };
    net.wipe(other);
    net.isolate(new_leader);
    net.cut
        .retain(|&(a, b)| !((a == old && b == other) || (a == other && b == old)));
    net.start(other);
    assert!(net.r(other).is_abstaining());
    net.run_with(300, &[old], &mut |_, _, _| false);
    (old, new_leader, other, doomed)
}

#[test]
fn a_deposed_leader_cannot_commit_with_the_acknowledgements_of_a_member_that_lost_its_disk() {
    // The empty member stores the deposed leader's entry, but its acknowledgement must not give
    // that leader a majority for it.
    let mut net = Net::new(3);
    let (old, _, _, doomed) = depose_then_wipe_its_successors_follower(&mut net);
    assert!(
        net.r(old).committed_index() < doomed.index,
        "the deposed leader committed entry {} with an empty member's acknowledgement",
        doomed.index
    );
    // Once everyone is back, the group converges on the new term's entries.
    net.heal();
    net.run(2_000);
    net.check_applied_agree();
}

#[test]
fn an_empty_member_does_not_count_a_deposed_leader_as_proof_it_caught_up() {
    // The empty member first hears the deposed leader, whose commit index is an entry of its
    // own term: that proves nothing, since a later leader committed other entries with this
    // member's earlier self. It then learns the later term (from the new leader's answers to
    // its probes, while the new leader's appends do not get through) and the new leader
    // crashes: it must keep abstaining, or it would elect the deposed leader and the new
    // leader's committed entries would be overwritten.
    let mut net = Net::new(3);
    let (old, new_leader, other, _) = depose_then_wipe_its_successors_follower(&mut net);
    assert!(net.r(other).is_abstaining());
    net.heal();
    let appends_blocked = &mut |from: usize, to: usize, m: &PeerMessage| {
        from == new_leader
            && to == other
            && matches!(m, PeerMessage::Append { .. } | PeerMessage::Snapshot { .. })
    };
    net.run_with(600, &[other], appends_blocked);
    assert!(
        net.r(other).is_abstaining(),
        "caught up only with a deposed leader, it must not rejoin"
    );
    assert!(
        net.r(other).term() > net.r(old).log().last_term(),
        "it heard the later term"
    );
    net.crash(new_leader);
    net.run(2_000);
    assert!(
        net.leaders().is_empty(),
        "a leader without the new leader's committed entries was elected: {:?}",
        net.leaders()
    );
    net.start(new_leader);
    net.run(2_000);
    assert_eq!(net.leaders().len(), 1);
    net.check_applied_agree();
}
