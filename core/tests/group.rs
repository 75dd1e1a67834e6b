//! Coordinator groups driven by hand: three coordinators, their disks and the messages between
//! them, on virtual time. These pin down what a member answers while it does not lead, while it
//! catches up, and when it stops leading (the simulator explores the same under faults).

use std::collections::VecDeque;
use std::time::Duration;

use herder_core::coordinator::{Coordinator, CoordinatorConfig, Output};
use herder_core::ids::{ConnectionId, Incarnation, NodeId, RequestId, WorkerId};
use herder_core::protocol::{
    ClientReply, ClientRequest, CoordinatorToWorker, PeerMessage, WorkerToCoordinator,
};
use herder_core::testing::Driver;
use herder_core::time::Instant;
use serde_json::json;

const N: usize = 3;
const CLIENT: ConnectionId = ConnectionId(1);
const WORKER: ConnectionId = ConnectionId(2);

fn id(i: usize) -> NodeId {
    NodeId(format!("c{i}"))
}

fn config(i: usize) -> CoordinatorConfig {
    CoordinatorConfig {
        node_id: id(i),
        peers: (0..N).filter(|&j| j != i).map(id).collect(),
        election_timeout_min: Duration::from_millis(100),
        election_timeout_max: Duration::from_millis(200),
        replication_heartbeat: Duration::from_millis(20),
        client_address: format!("c{i}:7071"),
        worker_address: format!("c{i}:7070"),
        ..CoordinatorConfig::default()
    }
}

struct Group {
    /// Each member through the shared test driver (its disk, batches held back while its disk
    /// is slow, the invariants checked after every output); every member's clock reads `now`.
    m: Vec<Driver>,
    now: Instant,
    /// Peer messages in flight: (from, to, message).
    wire: VecDeque<(usize, usize, PeerMessage)>,
    /// Members whose links are cut (everything to and from them is lost).
    isolated: Vec<usize>,
    replies: Vec<(usize, ClientReply)>,
    to_worker: Vec<(usize, CoordinatorToWorker)>,
    next_request: u64,
}

impl Group {
    fn new() -> Group {
        Group::with(config)
    }

    fn with(config: impl Fn(usize) -> CoordinatorConfig) -> Group {
        let mut g = Group {
            m: (0..N)
                .map(|i| {
                    let c = Coordinator::new(config(i), 7 + i as u64).expect("valid config");
                    Driver::around(c, Instant::ZERO)
                })
                .collect(),
            now: Instant::ZERO,
            wire: VecDeque::new(),
            isolated: Vec::new(),
            replies: Vec::new(),
            to_worker: Vec::new(),
            next_request: 0,
        };
        for i in 0..N {
            for j in 0..N {
                if i != j {
                    let hello = PeerMessage::Hello {
                        node_id: id(j),
                        client_address: format!("c{j}:7071"),
                        worker_address: format!("c{j}:7070"),
                    };
                    g.m[i].c.handle_peer_message(Instant::ZERO, &id(j), hello);
                }
            }
        }
        g
    }

    /// Drains member `i` in the calling order, routing what it sends.
    fn drain(&mut self, i: usize) {
        self.m[i].now = self.now;
        while let Some(output) = self.m[i].next_output() {
            match output {
                Output::ToPeer { to, message } => {
                    let j: usize = to.0[1..].parse().expect("member id");
                    self.wire.push_back((i, j, message));
                }
                Output::ToClient { message, .. } => self.replies.push((i, message)),
                Output::ToWorker { message, .. } => self.to_worker.push((i, message)),
                _ => {}
            }
        }
    }

    /// Member `i`'s disk holds every batch back from now on.
    fn hold_disk(&mut self, i: usize) {
        self.m[i].hold_writes = true;
    }

    fn release_disk(&mut self, i: usize) {
        self.m[i].now = self.now;
        self.m[i].hold_writes = false;
        let held = self.m[i].held.len();
        self.m[i].land_held(held);
        self.drain(i);
    }

    /// Delivers every message in flight (and what it causes), then fires due timers, for
    /// `millis` of virtual time.
    fn run(&mut self, millis: u64) {
        let end = self.now.saturating_add(Duration::from_millis(millis));
        while self.now < end {
            self.now = self.now.saturating_add(Duration::from_millis(1)).min(end);
            for i in 0..N {
                self.m[i].now = self.now;
                while self.m[i].fire_next_timer(self.now) {
                    self.drain(i);
                }
                self.drain(i);
            }
            while let Some((from, to, message)) = self.wire.pop_front() {
                if self.isolated.contains(&from) || self.isolated.contains(&to) {
                    continue;
                }
                self.m[to]
                    .c
                    .handle_peer_message(self.now, &id(from), message);
                self.drain(to);
            }
        }
    }

    fn acting_leader(&self) -> Option<usize> {
        (0..N).find(|&i| self.m[i].c.is_acting_leader() && !self.isolated.contains(&i))
    }

    fn elect(&mut self) -> usize {
        for _ in 0..40 {
            self.run(50);
            if let Some(leader) = self.acting_leader() {
                return leader;
            }
        }
        panic!("no leader within 2 s")
    }

    fn ask(&mut self, i: usize, request: impl FnOnce(RequestId) -> ClientRequest) -> RequestId {
        self.next_request += 1;
        let request_id = RequestId(self.next_request);
        self.m[i].c.handle_client_message(
            self.now,
            CLIENT,
            &herder_core::auth::Caller::anonymous(),
            request(request_id),
        );
        self.drain(i);
        request_id
    }

    /// A worker with one slot registers with member `i` on `WORKER`.
    fn register_worker(&mut self, i: usize) {
        let register = WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: WorkerId::parse("w1").expect("valid id"),
            incarnation: Incarnation(1),
            capacity: 1,
            prefetch: 0,
            running: Vec::new(),
            finished: Vec::new(),
            queues: None,
        };
        self.m[i]
            .c
            .handle_worker_message(self.now, WORKER, register);
        self.drain(i);
    }

    /// `millis` of `run`, the worker heartbeating member `i` every 20 ms.
    fn run_with_worker(&mut self, millis: u64, i: usize) {
        for _ in 0..millis / 20 {
            let beat = WorkerToCoordinator::Heartbeat {};
            self.m[i].c.handle_worker_message(self.now, WORKER, beat);
            self.drain(i);
            self.run(20);
        }
    }

    fn assigned(&self) -> bool {
        self.to_worker
            .iter()
            .any(|(_, m)| matches!(m, CoordinatorToWorker::TaskAssign { .. }))
    }

    fn reply(&self, request_id: RequestId) -> Option<&(usize, ClientReply)> {
        self.replies
            .iter()
            .find(|(_, r)| r.request_id() == Some(request_id))
    }
}

fn submit(key: Option<&str>) -> impl FnOnce(RequestId) -> ClientRequest + '_ {
    move |request_id| ClientRequest::Submit {
        timeout_millis: None,
        request_id,
        task: json!({"kind": "sha256", "text": "x"}),
        max_attempts: None,
        idempotency_key: key.map(str::to_owned),
        partitions: None,
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    }
}

#[test]
fn a_follower_redirects_to_the_leader_it_knows_and_names_every_member() {
    let mut g = Group::new();
    let leader = g.elect();
    g.run(50);
    let follower = (leader + 1) % N;
    let asked = g.ask(follower, |request_id| ClientRequest::Status {
        request_id,
        job_id: "00000000-0000-4000-8000-000000000001"
            .parse()
            .expect("uuid"),
    });
    match g.reply(asked) {
        Some((
            _,
            ClientReply::NotLeader {
                leader: Some(hint),
                uncertain: false,
                members,
                ..
            },
        )) => {
            assert_eq!(hint.node_id, id(leader));
            assert_eq!(hint.address, format!("c{leader}:7071"));
            assert_eq!(
                members.len(),
                N,
                "every member's client address: {members:?}"
            );
        }
        other => panic!("expected a redirect, got {other:?}"),
    }
}

#[test]
fn a_submission_through_the_leader_is_acknowledged_once_a_majority_holds_it() {
    let mut g = Group::new();
    let leader = g.elect();
    g.run(50);
    let others: Vec<usize> = (0..N).filter(|&i| i != leader).collect();
    for &i in &others {
        g.hold_disk(i);
    }
    let asked = g.ask(leader, submit(None));
    g.run(30);
    assert!(g.reply(asked).is_none(), "only the leader's disk holds it");
    g.release_disk(others[0]);
    g.run(30);
    assert!(
        matches!(
            g.reply(asked),
            Some((_, ClientReply::SubmitAccepted { .. }))
        ),
        "{:?}",
        g.reply(asked)
    );
}

#[test]
fn a_leader_that_loses_its_majority_answers_what_it_owed_as_uncertain() {
    // Raft dissertation 6.2 (CheckQuorum) and the coordinator's step-down rule: a submission
    // still being made durable may yet commit under the next leader, so its client is told
    // the outcome is unknown (it resends only with an idempotency key).
    let mut g = Group::new();
    let leader = g.elect();
    g.run(50);
    g.isolated.push(leader);
    let asked = g.ask(leader, submit(None));
    // A batch still being written is owed the same answer, once for the whole batch.
    let batch = g.ask(leader, |request_id| ClientRequest::SubmitBatch {
        request_id,
        jobs: (0..3)
            .map(|i| herder_core::protocol::JobSubmission {
                task: serde_json::json!({"kind": "sha256", "text": format!("batch {i}")}),
                max_attempts: None,
                idempotency_key: None,
                partitions: None,
                timeout_millis: None,
                fairness_key: None,
                priority: None,
                queue: None,
                delay_millis: None,
                run_at_unix_ms: None,
                retry_of: None,
                after: Vec::new(),
                after_any_outcome: false,
            })
            .collect(),
    });
    g.run(400);
    match g.reply(asked) {
        Some((
            who,
            ClientReply::NotLeader {
                uncertain: true, ..
            },
        )) => assert_eq!(*who, leader),
        other => panic!("expected an uncertain NOT_LEADER, got {other:?}"),
    }
    match g.reply(batch) {
        Some((
            who,
            ClientReply::NotLeader {
                uncertain: true, ..
            },
        )) => assert_eq!(*who, leader),
        other => panic!("expected an uncertain NOT_LEADER for the batch, got {other:?}"),
    }
    // A read at the deposed leader is never answered from its table.
    let read = g.ask(leader, |request_id| ClientRequest::List {
        request_id,
        state: None,
        limit: None,
        before: None,
    });
    g.run(100);
    assert!(
        matches!(g.reply(read), Some((_, ClientReply::NotLeader { .. }))),
        "{:?}",
        g.reply(read)
    );
}

#[test]
fn a_transfer_asked_of_a_leader_still_catching_up_is_handled_not_replayed() {
    // The request arrives after the election is won but before the leader's first entry is
    // applied (its disk holds the entry back). It used to be held and replayed into the
    // leader state, which has no answer for it.
    let mut g = Group::new();
    for i in 0..N {
        g.hold_disk(i);
    }
    let mut leader = None;
    for _ in 0..400 {
        g.run(5);
        for i in 0..N {
            // Votes need durable disks: let every disk through except the winner's last batch.
            if g.m[i].c.replica().is_leader() && !g.m[i].c.is_acting_leader() {
                leader = Some(i);
            }
        }
        if leader.is_some() {
            break;
        }
        for i in 0..N {
            g.release_disk(i);
            g.hold_disk(i);
        }
    }
    let leader = leader.expect("a member won an election");
    let asked = g.ask(leader, |request_id| ClientRequest::TransferLeader {
        request_id,
        to: None,
    });
    assert!(
        matches!(
            g.reply(asked),
            Some((_, ClientReply::TransferStarted { .. }))
        ),
        "{:?}",
        g.reply(asked)
    );
    for i in 0..N {
        g.release_disk(i);
    }
    g.run(500);
    let new_leader = g.acting_leader().expect("a leader after the hand-over");
    assert_ne!(new_leader, leader, "leadership moved");
}

#[test]
fn a_keyed_submission_resent_after_an_uncertain_answer_maps_to_one_job() {
    let mut g = Group::new();
    let leader = g.elect();
    g.run(50);
    g.isolated.push(leader);
    let first = g.ask(leader, submit(Some("order-7")));
    g.run(400);
    assert!(matches!(
        g.reply(first),
        Some((
            _,
            ClientReply::NotLeader {
                uncertain: true,
                ..
            }
        ))
    ));
    g.isolated.clear();
    let next = g.elect();
    let again = g.ask(next, submit(Some("order-7")));
    g.run(100);
    let job = match g.reply(again) {
        Some((_, ClientReply::SubmitAccepted { job_id, .. })) => *job_id,
        other => panic!("expected acceptance, got {other:?}"),
    };
    let third = g.ask(next, submit(Some("order-7")));
    g.run(100);
    match g.reply(third) {
        Some((
            _,
            ClientReply::SubmitAccepted {
                job_id,
                existing: true,
                ..
            },
        )) => assert_eq!(*job_id, job),
        other => panic!("expected the same job, got {other:?}"),
    }
}

#[test]
fn a_leader_that_wakes_past_its_quorum_check_with_a_worker_timer_due_steps_down_quietly() {
    // Its quorum check (which ends its leadership) and a worker's heartbeat check come due in
    // one `handle_timeout`, as they do when a leader's process was paused: the worker timer
    // must not run on leader state whose term has ended (it once proposed, was refused, and
    // the process panicked).
    let mut g = Group::new();
    let leader = g.elect();
    g.register_worker(leader);
    g.ask(leader, submit(None));
    g.run_with_worker(60, leader);
    assert!(g.assigned(), "the job went to the worker");
    g.isolated.push(leader);
    g.run_with_worker(100, leader);
    assert!(
        g.m[leader].c.is_acting_leader(),
        "still leading just before the pause"
    );
    let woke = g.now.saturating_add(Duration::from_secs(1));
    g.m[leader].c.handle_timeout(woke);
    g.drain(leader);
    assert!(
        !g.m[leader].c.is_acting_leader(),
        "it noticed it lost its majority"
    );
}

#[test]
fn a_rotation_that_completes_while_entries_apply_leaves_no_leader_state_acting() {
    // With rotation after every job, applying the submission hands leadership over. When the
    // leader's own disk is the last to finish, the entry applies inside `handle_persisted`,
    // and the hand-over can end this member's leadership at once: the leader state must not
    // go on to schedule the job (that proposal would be refused, which once panicked).
    let mut g = Group::with(|i| CoordinatorConfig {
        rotate_leader_after_jobs: Some(1),
        ..config(i)
    });
    let leader = g.elect();
    g.register_worker(leader);
    g.hold_disk(leader);
    let request = g.ask(leader, submit(None));
    g.run_with_worker(20, leader);
    let replica = g.m[leader].c.replica();
    assert!(
        replica.committed_index() >= replica.last_index(),
        "committed on the followers' disks"
    );
    g.release_disk(leader);
    assert!(matches!(
        g.reply(request),
        Some((_, ClientReply::SubmitAccepted { .. }))
    ));
    g.run(1_000);
    let now_leading = g.acting_leader().expect("a leader after the hand-over");
    assert_ne!(now_leading, leader, "leadership rotated");
}

#[test]
fn a_batch_its_queues_admission_limit_partly_refuses_is_answered_after_leadership_is_confirmed() {
    let mut g = Group::new();
    let leader = g.elect();
    g.run(50);
    let set = g.ask(leader, |request_id| {
        let change = herder_core::queues::QueueChange {
            max_active_jobs: Some(1),
            ..herder_core::queues::QueueChange::default()
        };
        ClientRequest::set_queue(request_id, "imports".to_owned(), change)
    });
    g.run(50);
    assert!(
        matches!(g.reply(set), Some((_, ClientReply::QueueSet { .. }))),
        "{:?}",
        g.reply(set)
    );
    let job = |text: &str| herder_core::protocol::JobSubmission {
        task: json!({"kind": "sha256", "text": text}),
        queue: Some("imports".to_owned()),
        ..herder_core::protocol::JobSubmission::default()
    };
    let batch = g.ask(leader, |request_id| ClientRequest::SubmitBatch {
        request_id,
        jobs: vec![job("a"), job("b")],
    });
    g.run(100);
    match g.reply(batch) {
        Some((_, ClientReply::SubmitBatchResult { results, .. })) => {
            assert!(
                matches!(
                    results[0],
                    herder_core::protocol::SubmitResult::Accepted { .. }
                ),
                "{results:?}"
            );
            assert!(
                matches!(
                    &results[1],
                    herder_core::protocol::SubmitResult::Rejected { queue: Some(queue), .. } if queue == "imports"
                ),
                "{results:?}"
            );
        }
        other => panic!("expected the batch's results, got {other:?}"),
    }
}
