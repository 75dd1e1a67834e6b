//! A replicated coordinator group over real TCP on 127.0.0.1: elections, redirects through a
//! follower, failover after the leader stops, the group view every member gives, leadership
//! transfer, and what the peer port does with connections that are not a member's.
//!
//! Election timeouts are 150-300 ms, so every condition is polled up to a deadline; nothing
//! sleeps and hopes.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use herder_core::client::ClientConfig;
use herder_core::coordinator::CoordinatorConfig;
use herder_core::ids::{NodeId, RequestId, Term};
use herder_core::job::JobState;
use herder_core::protocol::{ClientReply, ClientRequest, ClusterView, PeerMessage};
use herder_core::tasks::TaskSpec;
use herder_core::worker::WorkerConfig;
use herder_runtime::client::HerderClient;
use herder_runtime::coordinator::{self, CoordinatorHandle, CoordinatorOptions};
use herder_runtime::peer::PEER_INBOUND_CONNECTIONS_MAX;
use herder_runtime::testing::{LocalGroup, LocalMember as Member};
use herder_runtime::worker::{self, WorkerHandle, WorkerOptions};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn localhost_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A member's configuration: fast worker timeouts and elections in 150-300 ms.
fn member_config(id: &NodeId, peers: Vec<NodeId>) -> CoordinatorConfig {
    CoordinatorConfig {
        node_id: id.clone(),
        peers,
        election_timeout_min: Duration::from_millis(150),
        election_timeout_max: Duration::from_millis(300),
        replication_heartbeat: Duration::from_millis(30),
        ..fast_config()
    }
}

/// A group started together by the shared in-process launcher.
struct Group {
    members: Vec<Member>,
}

impl Group {
    async fn start(size: usize) -> Group {
        let group = LocalGroup::start(size, member_config, Default::default())
            .await
            .unwrap_or_else(|e| panic!("the group failed to start: {e}"));
        Group {
            members: group.members,
        }
    }

    fn member(&self, id: &NodeId) -> &Member {
        self.members
            .iter()
            .find(|m| m.id == *id)
            .unwrap_or_else(|| panic!("no member {id}"))
    }

    fn running(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.handle.is_some())
    }

    fn client_addrs(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| m.client_addr.to_string())
            .collect()
    }

    fn worker_addrs(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| m.worker_addr.to_string())
            .collect()
    }

    /// A client that knows only `id`'s address (redirects take it to the leader).
    fn client_via(&self, id: &NodeId) -> HerderClient {
        HerderClient::new(ClientConfig::new(vec![self
            .member(id)
            .client_addr
            .to_string()]))
    }

    /// A real worker that knows every member's worker address.
    fn worker(&self, id: &str) -> WorkerHandle {
        let mut config = WorkerConfig::new(worker_id(id), 2, self.worker_addrs());
        config.reconnect_base = Duration::from_millis(20);
        config.reconnect_max = Duration::from_millis(200);
        config.connect_timeout = Duration::from_secs(2);
        worker::start(WorkerOptions::new(config))
            .unwrap_or_else(|e| panic!("worker {id} failed to start: {e}"))
    }

    async fn stop(&mut self, id: &NodeId) {
        let member = self
            .members
            .iter_mut()
            .find(|m| m.id == *id)
            .unwrap_or_else(|| panic!("no member {id}"));
        if let Some(handle) = member.handle.take() {
            handle
                .shutdown()
                .await
                .unwrap_or_else(|e| panic!("{id} did not shut down cleanly: {e}"));
        }
    }

    /// The view of every running member that answers `CLUSTER`.
    async fn views(&self) -> Vec<ClusterView> {
        let mut views = Vec::new();
        for member in self.running() {
            if let Some(view) = cluster_view(member.client_addr).await {
                views.push(view);
            }
        }
        views
    }

    /// Waits until every running member answers and all agree on one leader in one term, and
    /// that leader (alone) says it leads. At every observation, no two members claim to lead
    /// the same term.
    async fn agreed_leader(&self) -> (NodeId, Term) {
        let running = self.running().count();
        eventually(
            "every running member agrees on one leader",
            DEADLINE,
            || async {
                let views = self.views().await;
                let mut leaders_by_term: BTreeMap<Term, BTreeSet<NodeId>> = BTreeMap::new();
                for view in views.iter().filter(|v| v.role == "leader") {
                    leaders_by_term
                        .entry(view.term)
                        .or_default()
                        .insert(view.node_id.clone());
                }
                for (term, leaders) in &leaders_by_term {
                    assert!(
                        leaders.len() <= 1,
                        "two leaders in term {term:?}: {leaders:?}"
                    );
                }
                agreement(&views, running)
            },
        )
        .await
    }
}

impl Group {
    /// Like `agreed_leader`, and the leader has caught up with its term and answers requests
    /// itself (`CLUSTER` reports the consensus role, which comes first).
    async fn acting_leader(&self) -> (NodeId, Term) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let (leader, term) = self.agreed_leader().await;
            let request = ClientRequest::Workers {
                request_id: RequestId(1),
            };
            let reply = request_reply(self.member(&leader).client_addr, &request).await;
            if matches!(reply, Some(ClientReply::WorkerList { .. })) {
                return (leader, term);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{leader} never answered as leader: {reply:?}"
            );
        }
    }
}

/// `Ok((leader, term))` when `running` views agree on the leader and term and exactly the
/// leader says it leads.
fn agreement(views: &[ClusterView], running: usize) -> Result<(NodeId, Term), String> {
    let summary = || {
        views
            .iter()
            .map(|v| format!("{}:{}@{}->{:?}", v.node_id, v.role, v.term.0, v.leader))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if views.len() != running {
        return Err(format!(
            "{} of {running} answered: {}",
            views.len(),
            summary()
        ));
    }
    let first = &views[0];
    let (Some(leader), term) = (first.leader.clone(), first.term) else {
        return Err(summary());
    };
    let agree = views
        .iter()
        .all(|v| v.leader.as_ref() == Some(&leader) && v.term == term);
    let leading: Vec<&NodeId> = views
        .iter()
        .filter(|v| v.role == "leader")
        .map(|v| &v.node_id)
        .collect();
    if agree && leading == vec![&leader] {
        Ok((leader, term))
    } else {
        Err(summary())
    }
}

/// Asks the member at `addr` for its `CLUSTER` view over a fresh connection; `None` if it
/// cannot be reached.
async fn cluster_view(addr: SocketAddr) -> Option<ClusterView> {
    let request = ClientRequest::Cluster {
        request_id: RequestId(1),
    };
    match request_reply(addr, &request).await? {
        ClientReply::Cluster { cluster, .. } => Some(cluster),
        other => panic!("CLUSTER answered with {other:?}"),
    }
}

async fn request_reply(addr: SocketAddr, request: &ClientRequest) -> Option<ClientReply> {
    let connect = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr));
    let mut stream = connect.await.ok()?.ok()?;
    stream.write_all(&frame(request)).await.ok()?;
    read_one::<ClientReply>(&mut stream, SHORT).await
}

fn followers(group: &Group, leader: &NodeId) -> Vec<NodeId> {
    group
        .running()
        .map(|m| m.id.clone())
        .filter(|id| id != leader)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_one_leader_and_every_member_reports_the_same_group() {
    let group = Group::start(3).await;
    let (leader, term) = group.agreed_leader().await;
    assert!(term.0 >= 1);

    // Every member's view lists the whole group, with every member's client and worker
    // addresses once their HELLOs have arrived.
    let views = eventually("every member knows every address", DEADLINE, || async {
        let views = group.views().await;
        let complete = views.len() == 3
            && views.iter().all(|v| {
                v.members.len() == 3
                    && v.members.iter().all(|m| {
                        let member = group.member(&m.node_id);
                        m.client_address.as_deref() == Some(&member.client_addr.to_string())
                            && m.worker_address.as_deref() == Some(&member.worker_addr.to_string())
                    })
            });
        if complete {
            Ok(views)
        } else {
            Err(format!("{views:?}"))
        }
    })
    .await;
    for view in &views {
        assert_eq!(view.leader.as_ref(), Some(&leader), "{view:?}");
        assert_eq!(view.term, term, "{view:?}");
    }

    // Only the leader knows how recently it heard from each member.
    let leader_view = eventually(
        "the leader has heard from both followers",
        DEADLINE,
        || async {
            match cluster_view(group.member(&leader).client_addr).await {
                Some(view)
                    if view
                        .members
                        .iter()
                        .all(|m| m.last_heard_millis_ago.is_some()) =>
                {
                    Ok(view)
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(leader_view.role, "leader");
    for follower in followers(&group, &leader) {
        let view = cluster_view(group.member(&follower).client_addr)
            .await
            .expect("follower answers");
        assert_eq!(view.role, "follower");
        assert!(
            view.members
                .iter()
                .all(|m| m.last_heard_millis_ago.is_none()),
            "a follower does not track the others: {view:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_through_a_follower_completes_and_every_member_applies_it() {
    let group = Group::start(3).await;
    let (leader, _) = group.agreed_leader().await;
    let follower = followers(&group, &leader)[0].clone();
    let _worker = group.worker("w1");

    let client = group.client_via(&follower);
    let job_id = submit(
        &client,
        TaskSpec::Sha256 {
            text: "replicated".into(),
        },
    )
    .await;
    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(
        job.result,
        Some(herder_core::tasks::TaskOutput::Sha256 {
            hex: sha256_hex("replicated")
        })
    );

    // The completion is committed, so every member applies it.
    eventually(
        "every member applied what the leader applied",
        DEADLINE,
        || async {
            let views = group.views().await;
            let leader_applied = views
                .iter()
                .find(|v| v.node_id == leader)
                .map(|v| v.applied_index);
            match leader_applied {
                Some(applied)
                    if views.len() == 3 && views.iter().all(|v| v.applied_index == applied) =>
                {
                    Ok(())
                }
                _ => Err(format!(
                    "{:?}",
                    views
                        .iter()
                        .map(|v| (v.node_id.clone(), v.applied_index))
                        .collect::<Vec<_>>()
                )),
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_leader_stops_the_others_elect_a_new_one_and_work_goes_on() {
    let mut group = Group::start(3).await;
    let (first_leader, first_term) = group.agreed_leader().await;
    let _worker = group.worker("w1");
    let client = HerderClient::new(ClientConfig::new(group.client_addrs()));
    let before = submit(
        &client,
        TaskSpec::Sha256 {
            text: "before".into(),
        },
    )
    .await;
    assert_eq!(
        wait_terminal(&client, before).await.state,
        JobState::Completed
    );

    group.stop(&first_leader).await;
    let (second_leader, second_term) = group.agreed_leader().await;
    assert_ne!(second_leader, first_leader);
    assert!(
        second_term > first_term,
        "{second_term:?} after {first_term:?}"
    );

    // The job acknowledged before the failover survives it, and a new one completes on the
    // worker, which found the new leader by itself.
    let client = HerderClient::new(ClientConfig::new(group.client_addrs()));
    assert_eq!(status(&client, before).await.state, JobState::Completed);
    let after = submit(
        &client,
        TaskSpec::Sha256 {
            text: "after".into(),
        },
    )
    .await;
    let job = wait_terminal(&client, after).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("w1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfer_leader_hands_leadership_to_the_named_member() {
    let group = Group::start(3).await;
    // A TRANSFER_LEADER that reaches a leader before it has caught up with its term is held,
    // and replaying it once the leader acts panics in core (`LeaderState::answer_request`:
    // "group requests are answered before they reach the leader"); ask an acting leader.
    let (leader, term) = group.acting_leader().await;
    let target = followers(&group, &leader)[1].clone();

    let request = ClientRequest::TransferLeader {
        request_id: RequestId(7),
        to: Some(target.clone()),
    };
    match request_reply(group.member(&leader).client_addr, &request).await {
        Some(ClientReply::TransferStarted { request_id, to }) => {
            assert_eq!(request_id, RequestId(7));
            assert_eq!(to, target);
        }
        other => panic!("TRANSFER_LEADER to the leader answered {other:?}"),
    }
    let (new_leader, new_term) = eventually("the target leads", DEADLINE, || async {
        let views = group.views().await;
        match agreement(&views, 3) {
            Ok((leader, term)) if leader == target => Ok((leader, term)),
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(e),
        }
    })
    .await;
    assert_eq!(new_leader, target);
    assert!(new_term > term);

    // A follower does not start a transfer: it redirects to the leader.
    let follower = followers(&group, &target)[0].clone();
    let request = ClientRequest::TransferLeader {
        request_id: RequestId(8),
        to: None,
    };
    match request_reply(group.member(&follower).client_addr, &request).await {
        Some(ClientReply::NotLeader { leader, .. }) => {
            assert_eq!(leader.map(|l| l.node_id), Some(target));
        }
        other => panic!("TRANSFER_LEADER to a follower answered {other:?}"),
    }
}

/// A coordinator that listens on a peer port but has no other members: every slot is free.
async fn lone_member_with_a_peer_port(dir: &TestDir) -> CoordinatorHandle {
    coordinator::start(CoordinatorOptions {
        config: fast_config(),
        data_dir: dir.path().to_owned(),
        worker_addr: localhost_any(),
        client_addr: localhost_any(),
        peer_addr: Some(localhost_any()),
        peers: BTreeMap::new(),
        seed: None,
        limits: Default::default(),
        credentials: Default::default(),
    })
    .await
    .unwrap_or_else(|e| panic!("coordinator failed to start: {e}"))
}

/// `message` in a frame of the coordinators' own (binary) link.
fn peer_frame(message: &PeerMessage) -> Vec<u8> {
    let mut out = Vec::new();
    herder_core::protocol::codec::encode_binary_frame(message, usize::MAX, &mut out)
        .expect("a peer message encodes");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_closes_strangers_garbage_and_connections_over_its_bound() {
    let dir = TestDir::new("peer-port");
    let coordinator = lone_member_with_a_peer_port(&dir).await;
    let peer_addr = coordinator.peer_addr().expect("peer port");

    let cases: [(&str, Vec<u8>); 3] = [
        (
            "a HELLO from a node that is not a member",
            peer_frame(&PeerMessage::Hello {
                node_id: NodeId("intruder".into()),
                client_address: "127.0.0.1:1".into(),
                worker_address: "127.0.0.1:2".into(),
            }),
        ),
        (
            "a first frame that is not HELLO",
            peer_frame(&PeerMessage::TimeoutNow { term: Term(9) }),
        ),
        ("bytes that are not a frame", raw_frame(b"{not json")),
    ];
    for (what, bytes) in cases {
        let mut stream = TcpStream::connect(peer_addr).await.expect("connect");
        stream.write_all(&bytes).await.expect("write");
        expect_eof(&mut stream, SHORT, what).await;
    }

    // Fill every slot with a silent connection; the next one is closed at once (well before
    // the silent ones' HELLO deadline).
    let mut held = Vec::new();
    for _ in 0..PEER_INBOUND_CONNECTIONS_MAX {
        held.push(TcpStream::connect(peer_addr).await.expect("connect"));
    }
    let mut extra = TcpStream::connect(peer_addr).await.expect("connect");
    expect_eof(
        &mut extra,
        Duration::from_secs(2),
        "a connection over the bound",
    )
    .await;
    drop(held);

    // None of it disturbed the coordinator.
    let client = client(coordinator.client_addr());
    let job = submit(&client, TaskSpec::Sha256 { text: "ok".into() }).await;
    let _worker = start_worker("w1", 1, coordinator.worker_addr());
    assert_eq!(wait_terminal(&client, job).await.state, JobState::Completed);
    coordinator.shutdown().await.expect("clean shutdown");
}
