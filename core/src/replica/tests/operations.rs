//! Reads, snapshots, leadership transfer (dissertation 6.4, paper 7, dissertation 3.10).

use super::*;

#[test]
fn a_read_is_confirmed_only_after_a_majority_heard_the_leader() {
    // Dissertation 6.4 (ReadIndex): the leader answers a read only after a round of heartbeats
    // shows it still leads; a leader cut off from its majority never confirms one.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(50);
    net.rm(leader).request_read(1).expect("leads");
    let ready = |net: &Net, id: u64| {
        net.events.iter().any(|(i, e)| {
            *i == leader && matches!(e, ReplicaEvent::ReadReady { id: r, .. } if *r == id)
        })
    };
    net.settle(leader);
    assert!(!ready(&net, 1), "not before anyone answered");
    net.deliver();
    assert!(ready(&net, 1));

    net.isolate(leader);
    net.rm(leader)
        .request_read(2)
        .expect("still believes it leads");
    net.run(300);
    assert!(!ready(&net, 2), "a deposed leader never confirms a read");
}

#[test]
fn a_member_that_lost_its_disk_catches_up_through_a_snapshot() {
    // Paper 7: a follower that needs entries the leader has compacted away receives the leader's
    // state machine instead, then the entries after it.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(50);
    let wiped = (leader + 1) % 3;
    net.crash(wiped);
    for n in 0..(crate::limits::LOG_RETAINED_ENTRIES_MAX as u128 + 50) {
        net.propose(leader, n);
        if n % 64 == 0 {
            net.deliver();
        }
    }
    net.run(100);
    assert!(
        net.r(leader).log().base_index() > LogIndex(0),
        "the leader compacted"
    );
    net.disks[wiped] = Disk::default();
    net.start(wiped);
    net.run(500);
    assert!(net.sent.iter().any(|(from, to, m)| *from == leader
        && *to == wiped
        && matches!(m, PeerMessage::Snapshot { .. })));
    assert_eq!(net.r(wiped).last_index(), net.r(leader).last_index());
    assert_eq!(
        net.r(wiped).committed_index(),
        net.r(leader).committed_index()
    );
}

#[test]
fn leadership_moves_to_the_chosen_member() {
    // Dissertation 3.10: the leader brings the target up to date, sends TIMEOUT_NOW and steps
    // down; the target wins the next term at once.
    let mut net = Net::new(3);
    let leader = net.elect();
    net.run(50);
    let target = (leader + 2) % 3;
    let chosen = net.rm(leader).transfer_leadership(Some(id(target)));
    assert_eq!(chosen, Ok(id(target)));
    net.settle(leader);
    net.run(100);
    assert_eq!(net.leader(), target);
    assert!(net.events.iter().any(|(i, e)| *i == leader
        && matches!(
            e,
            ReplicaEvent::SteppedDown {
                reason: StepDownReason::Transferred { .. },
                ..
            }
        )));
}

#[test]
fn messages_from_outside_the_group_change_nothing() {
    let mut net = Net::new(3);
    let leader = net.elect();
    let term = net.r(leader).term();
    let now = net.now;
    net.rm(leader).handle_message(
        now,
        &NodeId("intruder".into()),
        PeerMessage::Append {
            term: Term(term.0 + 5),
            prev_index: LogIndex(0),
            prev_term: Term(0),
            entries: Vec::new(),
            commit: LogIndex(0),
            seq: 0,
        },
    );
    net.settle(leader);
    assert!(net.r(leader).is_leader());
    assert_eq!(net.r(leader).term(), term);
}
