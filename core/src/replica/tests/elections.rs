//! Elections (paper 5.2, 5.4.1; dissertation 9.6).

use super::*;

#[test]
fn a_leader_is_elected_and_everyone_follows_it_in_one_term() {
    // Paper 5.2: a candidate that wins a majority becomes leader; the others learn of it from
    // its first APPEND.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(100);
    let term = net.r(leader).term();
    for i in 0..3 {
        assert_eq!(net.r(i).term(), term);
        assert_eq!(net.r(i).leader(), Some(&id(leader)));
    }
    // Its first entry of the term (a no-op) commits everywhere.
    for i in 0..3 {
        assert_eq!(net.applied[i].len(), 1);
        assert!(matches!(
            net.applied[i][0].command,
            Command::NewLeader { .. }
        ));
    }
}

#[test]
fn a_group_of_one_leads_at_once_and_commits_on_its_own_disk() {
    let mut net = Net::new(1);
    assert_eq!(net.leaders(), vec![0]);
    net.hold_disk.insert(0);
    let proposal = net.propose(0, 1);
    assert_eq!(net.applied[0].len(), 0, "not durable yet");
    net.release_disk(0);
    assert_eq!(net.applied[0].len(), 1);
    assert_eq!(net.applied[0][0].index, proposal.index);
    assert!(net.sent.is_empty(), "a group of one sends nothing");
}

#[test]
fn a_vote_leaves_only_once_it_is_durable() {
    // Paper figure 2: currentTerm and votedFor are updated on stable storage before
    // responding. A voter whose disk is slow holds its reply. (Members with a log, so none
    // abstains as an empty member would.)
    let mut net = Net::with_logs(vec![vec![entry(1, 1)]; 3]);
    net.hold_disk.insert(1);
    net.hold_disk.insert(2);
    // Fire node 0's election timer directly, twice (pre-vote, then vote).
    net.fire_election_timer(0);
    net.deliver();
    let votes_sent = |net: &Net| {
        net.sent
            .iter()
            .filter(|(from, _, m)| *from != 0 && matches!(m, PeerMessage::VoteReply { .. }))
            .count()
    };
    assert_eq!(
        net.r(0).role_kind(),
        RoleKind::Candidate,
        "pre-vote granted"
    );
    assert_eq!(
        votes_sent(&net),
        0,
        "the voters' disks hold their votes back"
    );
    assert!(!net.r(0).is_leader());
    net.release_disk(1);
    net.deliver();
    assert_eq!(votes_sent(&net), 1);
    assert!(
        net.r(0).is_leader(),
        "one durable vote plus its own is a majority"
    );
}

#[test]
fn a_candidate_whose_log_is_behind_cannot_win() {
    // Paper 5.4.1: a voter refuses a candidate whose log is less up to date than its own.
    let logs = vec![
        vec![entry(1, 1)],
        vec![entry(1, 1), entry(2, 2)],
        vec![entry(1, 1), entry(2, 2)],
    ];
    let mut net = Net::with_logs(logs);
    net.fire_election_timer(0);
    net.deliver();
    assert!(!net.r(0).is_leader());
    assert_ne!(
        net.r(0).role_kind(),
        RoleKind::Candidate,
        "not even the pre-vote was granted"
    );
    let leader = net.elect();
    assert_ne!(leader, 0);
}

#[test]
fn pre_vote_keeps_a_member_that_was_cut_off_from_disrupting_the_group() {
    // Dissertation 9.6: while isolated, a member's elections fail at the pre-vote, so its term
    // does not grow; when it returns, the leader keeps leading.
    let mut net = Net::new(3);
    let leader = net.elect();
    let term = net.r(leader).term();
    let loner = (leader + 1) % 3;
    net.isolate(loner);
    net.run(2_000);
    assert_eq!(net.r(loner).term(), term, "no term was raised in isolation");
    assert!(net
        .events
        .iter()
        .any(|(i, e)| *i == loner
            && matches!(e, ReplicaEvent::ElectionStarted { pre_vote: true, .. })));
    net.heal();
    net.run(500);
    assert_eq!(net.leader(), leader);
    assert_eq!(net.r(leader).term(), term);
}

#[test]
fn a_leader_that_cannot_hear_a_majority_steps_down() {
    // Dissertation 6.2 (CheckQuorum): a leader cut off from its majority stops leading within
    // an election timeout, so it stops acting on stale knowledge.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.isolate(leader);
    net.run(350);
    assert!(!net.r(leader).is_leader());
    assert!(net.events.iter().any(|(i, e)| *i == leader
        && matches!(
            e,
            ReplicaEvent::SteppedDown {
                reason: StepDownReason::LostQuorum { .. },
                ..
            }
        )));
    // The majority side elected someone else in a later term.
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let new_leaders: Vec<usize> = net
        .leaders()
        .into_iter()
        .filter(|i| others.contains(i))
        .collect();
    assert_eq!(new_leaders.len(), 1);
}
