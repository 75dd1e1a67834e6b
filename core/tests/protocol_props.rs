//! Property tests for the wire protocol: every message of every link survives the frame codec,
//! carries the right `type` tag, and is refused cleanly (never with a panic) when it arrives on
//! the wrong link. A handful of fixed examples pin the exact JSON wire form, so renaming a wire
//! field or tag breaks a test rather than a deployed peer.

use std::fmt::Debug;

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

use herder_core::command::{Command, LogEntry};
use herder_core::ids::{
    Attempt, Incarnation, JobId, LeaseId, LogIndex, NodeId, RequestId, Term, WorkerId,
};
use herder_core::job::{JobState, Lease, PartitionOf};
use herder_core::limits::{FRAME_BYTES_MAX_DEFAULT, FRAME_HEADER_BYTES};
use herder_core::protocol::codec::{
    decode_binary_message, decode_message, encode_binary_frame, encode_frame, FrameDecoder,
    FrameError, WireMessage,
};
use herder_core::protocol::{
    AttemptOutcome, CancelReason, ChunkBytes, ClientReply, ClientRequest, ClusterView,
    CoordinatorToWorker, ErrorCode, JobView, LeaderHint, MemberView, PartitionView, Partitions,
    PartitionsView, PeerMessage, RegisterRejection, RunningAttempt, WorkerToCoordinator,
    WorkerView,
};
use herder_core::replica::log::encoded_bytes;
use herder_core::tasks::{TaskOutput, TaskSpec};

// ---------------------------------------------------------------------------------------------
// Strategies: leaves
// ---------------------------------------------------------------------------------------------

/// Text as peers might send it: arbitrary Unicode (control characters, quotes, backslashes and
/// astral-plane characters included), plus a few hand-picked awkward strings.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<String>(),
        2 => "[a-z0-9 ._-]{0,12}",
        1 => proptest::sample::select(vec![
            String::new(),
            "é".to_owned(),
            "日本語のテキスト".to_owned(),
            "🦀 crab \u{1F980}".to_owned(),
            "quote \" backslash \\ nul \u{0} tab \t newline \n".to_owned(),
            "\u{FEFF}bom and \u{200B}zero width".to_owned(),
            "{\"type\":\"HEARTBEAT\"}".to_owned(),
        ]),
    ]
}

fn job_id() -> impl Strategy<Value = JobId> {
    any::<u128>().prop_map(|n| JobId(uuid::Uuid::from_u128(n)))
}

fn lease_id() -> impl Strategy<Value = LeaseId> {
    any::<u128>().prop_map(|n| LeaseId(uuid::Uuid::from_u128(n)))
}

fn worker_id() -> impl Strategy<Value = WorkerId> {
    // The wire type is any string; validation happens in the coordinator, not the codec.
    text().prop_map(WorkerId)
}

fn node_id() -> impl Strategy<Value = NodeId> {
    text().prop_map(NodeId)
}

fn request_id() -> impl Strategy<Value = RequestId> {
    any::<u64>().prop_map(RequestId)
}

fn term() -> impl Strategy<Value = Term> {
    any::<u64>().prop_map(Term)
}

fn log_index() -> impl Strategy<Value = LogIndex> {
    any::<u64>().prop_map(LogIndex)
}

fn incarnation() -> impl Strategy<Value = Incarnation> {
    any::<u64>().prop_map(Incarnation)
}

/// Member addresses as `members` lists carry them (any text: the codec does not parse them).
fn members() -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(text(), 0..5)
}

fn job_state() -> impl Strategy<Value = JobState> {
    proptest::sample::select(JobState::ALL.to_vec())
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    proptest::sample::select(vec![
        ErrorCode::FrameTooLarge,
        ErrorCode::EmptyFrame,
        ErrorCode::InvalidUtf8,
        ErrorCode::InvalidJson,
        ErrorCode::MissingType,
        ErrorCode::UnknownType,
        ErrorCode::InvalidMessage,
        ErrorCode::InvalidTask,
        ErrorCode::InvalidRequest,
        ErrorCode::JobNotFound,
        ErrorCode::IdempotencyConflict,
        ErrorCode::NotRegistered,
        ErrorCode::TooManyWaiters,
        ErrorCode::ReplyTooLarge,
    ])
}

fn register_rejection() -> impl Strategy<Value = RegisterRejection> {
    proptest::sample::select(vec![
        RegisterRejection::DuplicateWorkerId,
        RegisterRejection::InvalidRegistration,
        RegisterRejection::TooManyWorkers,
    ])
}

fn cancel_reason() -> impl Strategy<Value = CancelReason> {
    proptest::sample::select(vec![
        CancelReason::JobCancelled,
        CancelReason::DeadlineExpired,
        CancelReason::LeaseNotCurrent,
    ])
}

fn leader_hint() -> impl Strategy<Value = Option<LeaderHint>> {
    proptest::option::of(
        (node_id(), text()).prop_map(|(node_id, address)| LeaderHint { node_id, address }),
    )
}

// ---------------------------------------------------------------------------------------------
// Strategies: nested structures
// ---------------------------------------------------------------------------------------------

/// Every task kind, with values anywhere in their types' range (the derived `Deserialize` only
/// checks shape, so out-of-bounds values must still travel).
fn task_spec() -> impl Strategy<Value = TaskSpec> {
    let numbers = || proptest::collection::vec(any::<i64>(), 0..6);
    prop_oneof![
        any::<u64>().prop_map(|milliseconds| TaskSpec::Sleep { milliseconds }),
        text().prop_map(|text| TaskSpec::WordCount { text }),
        text().prop_map(|text| TaskSpec::Sha256 { text }),
        any::<u64>().prop_map(|limit| TaskSpec::PrimeCount { limit }),
        any::<u32>().prop_map(|fail_until_attempt| TaskSpec::Fail { fail_until_attempt }),
        numbers().prop_map(|numbers| TaskSpec::Max { numbers }),
        numbers().prop_map(|numbers| TaskSpec::PrimeCountList { numbers }),
        (any::<i64>(), any::<i64>()).prop_map(|(start, end)| TaskSpec::PrimeSum { start, end }),
    ]
}

fn task_output() -> impl Strategy<Value = TaskOutput> {
    prop_oneof![
        any::<u64>().prop_map(|milliseconds| TaskOutput::Slept { milliseconds }),
        any::<u64>().prop_map(|words| TaskOutput::WordCount { words }),
        text().prop_map(|hex| TaskOutput::Sha256 { hex }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(limit, count)| TaskOutput::PrimeCount { limit, count }),
        any::<u32>().prop_map(|attempt| TaskOutput::Succeeded { attempt }),
        any::<i64>().prop_map(|max| TaskOutput::Max { max }),
        any::<u64>().prop_map(|count| TaskOutput::PrimeCountList { count }),
        (any::<u64>(), any::<u128>()).prop_map(|(count, sum)| TaskOutput::PrimeSum { count, sum }),
    ]
}

fn attempt_outcome() -> impl Strategy<Value = AttemptOutcome> {
    prop_oneof![
        task_output().prop_map(|output| AttemptOutcome::Succeeded { output }),
        text().prop_map(|error| AttemptOutcome::Failed {
            permanent: false,
            error
        }),
        Just(AttemptOutcome::Cancelled {}),
    ]
}

fn partition_view() -> impl Strategy<Value = PartitionView> {
    (
        any::<u32>(),
        job_id(),
        job_state(),
        any::<u32>(),
        proptest::option::of(worker_id()),
        proptest::option::of(task_output()),
    )
        .prop_map(
            |(index, job_id, state, attempt, worker, result)| PartitionView {
                index,
                job_id,
                state,
                attempt,
                worker,
                result,
            },
        )
}

fn partitions_view() -> impl Strategy<Value = PartitionsView> {
    (
        any::<u32>(),
        any::<u32>(),
        proptest::collection::vec(partition_view(), 0..3),
    )
        .prop_map(|(done, total, pieces)| PartitionsView {
            done,
            total,
            pieces,
        })
}

fn job_view() -> impl Strategy<Value = JobView> {
    (
        (job_id(), job_state(), any::<u32>(), any::<u32>()),
        (
            proptest::option::of(worker_id()),
            proptest::option::of(lease_id()),
        ),
        task_spec(),
        proptest::option::of(task_output()),
        proptest::option::of(text()),
        proptest::option::of(text()),
        (
            proptest::option::of(
                (job_id(), any::<u32>()).prop_map(|(parent, index)| PartitionOf { parent, index }),
            ),
            proptest::option::of(partitions_view()),
        ),
    )
        .prop_map(
            |(
                (id, state, attempt, max_attempts),
                (worker, lease_id),
                task,
                result,
                error,
                idempotency_key,
                (partition_of, partitions),
            )| {
                JobView {
                    progress: None,
                    timeout_millis: None,
                    unserved: false,
                    id,
                    state,
                    attempt,
                    max_attempts,
                    worker,
                    lease_id,
                    task,
                    result,
                    error,
                    idempotency_key,
                    partition_of,
                    partitions,
                    created_at_unix_ms: None,
                    finished_at_unix_ms: None,
                    first_started_at_unix_ms: None,
                    history: Vec::new(),
                    history_dropped: 0,
                    submitted_by: None,
                    fairness_key: None,
                    priority: 0,
                    queue: herder_core::queues::default_queue(),
                    run_at_unix_ms: None,
                    retry_of: None,
                    after: Vec::new(),
                    after_any_outcome: false,
                    waited_on_by: Vec::new(),
                }
            },
        )
}

fn worker_view() -> impl Strategy<Value = WorkerView> {
    (
        worker_id(),
        any::<u64>(),
        any::<bool>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(
            |(id, incarnation, alive, capacity, running, last_heartbeat_millis_ago)| WorkerView {
                draining: false,
                tasks: herder_core::protocol::builtin_task_names(),
                id,
                incarnation: Incarnation(incarnation),
                alive,
                capacity,
                prefetch: capacity / 2,
                running,
                last_heartbeat_millis_ago,
            },
        )
}

fn member_view() -> impl Strategy<Value = MemberView> {
    (
        node_id(),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(log_index()),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(
            |(node_id, client_address, worker_address, matched_index, last_heard_millis_ago)| {
                MemberView {
                    node_id,
                    client_address,
                    worker_address,
                    matched_index,
                    last_heard_millis_ago,
                }
            },
        )
}

fn cluster_view() -> impl Strategy<Value = ClusterView> {
    (
        node_id(),
        // The role is a string on the wire; any text must travel, not only the four roles.
        prop_oneof![
            3 => proptest::sample::select(vec!["leader", "follower", "pre-candidate", "candidate"])
                .prop_map(str::to_owned),
            1 => text(),
        ],
        term(),
        proptest::option::of(node_id()),
        (log_index(), log_index(), log_index()),
        proptest::collection::vec(member_view(), 0..5),
    )
        .prop_map(
            |(node_id, role, term, leader, (last_index, commit_index, applied_index), members)| {
                ClusterView {
                    node_id,
                    role,
                    term,
                    leader,
                    last_index,
                    commit_index,
                    applied_index,
                    members,
                }
            },
        )
}

/// A partition count as a client may ask for it.
fn partitions_request() -> impl Strategy<Value = Partitions> {
    prop_oneof![
        Just(Partitions::Auto),
        any::<u32>().prop_map(Partitions::Count),
    ]
}

/// Every log command, with arbitrary fields.
fn command() -> impl Strategy<Value = Command> {
    let lease =
        (lease_id(), worker_id(), incarnation()).prop_map(|(id, worker, incarnation)| Lease {
            id,
            worker,
            incarnation,
        });
    prop_oneof![
        (
            job_id(),
            task_spec(),
            any::<u32>(),
            proptest::option::of(text()),
            any::<u64>(),
            proptest::collection::vec(job_id(), 0..4),
            proptest::option::of(partitions_request()),
        )
            .prop_map(
                |(
                    job_id,
                    task,
                    max_attempts,
                    idempotency_key,
                    max_active_jobs,
                    partitions,
                    partitions_asked,
                )| {
                    Command::Submit {
                        timeout_millis: None,
                        job_id,
                        task,
                        max_attempts,
                        idempotency_key,
                        max_active_jobs,
                        partitions,
                        partitions_asked,
                        submitted_by: None,
                        fairness_key: None,
                        priority: 0,
                        queue: herder_core::queues::default_queue(),
                        run_at: None,
                        retry_of: None,
                        after: Vec::new(),
                        after_any_outcome: false,
                    }
                }
            ),
        (job_id(), lease).prop_map(|(job_id, lease)| Command::Assign {
            job_id,
            lease,
            as_of: LogIndex(0),
        }),
        (job_id(), lease_id(), task_output()).prop_map(|(job_id, lease_id, output)| {
            Command::Complete {
                job_id,
                lease_id,
                output,
            }
        }),
        (job_id(), lease_id(), text(), any::<u64>()).prop_map(
            |(job_id, lease_id, cause, retry_delay_millis)| Command::AttemptFailed {
                permanent: false,
                job_id,
                lease_id,
                cause,
                retry_delay_millis,
                kind: Default::default(),
            }
        ),
        job_id().prop_map(|job_id| Command::Requeue { job_id }),
        job_id().prop_map(|job_id| Command::Cancel { job_id }),
        (job_id(), lease_id()).prop_map(|(job_id, lease_id)| Command::Abandon { job_id, lease_id }),
        node_id().prop_map(|leader| Command::NewLeader { leader }),
        proptest::collection::vec(job_id(), 0..4).prop_map(|job_ids| Command::Purge { job_ids }),
    ]
}

fn log_entry() -> impl Strategy<Value = LogEntry> {
    (log_index(), term(), any::<u64>(), command()).prop_map(|(index, term, at, command)| LogEntry {
        index,
        term,
        at: herder_core::time::UnixMillis(at),
        command,
    })
}

/// What a `SNAPSHOT` chunk's `data` may hold: real base64, or any text (the codec does not
/// check it; the follower does).
fn snapshot_data() -> impl Strategy<Value = ChunkBytes> {
    proptest::collection::vec(any::<u8>(), 0..64).prop_map(ChunkBytes)
}

/// Arbitrary JSON. Floats are limited to eighths of an `i32`, which print and parse exactly, so
/// equality after a round trip is a fair test (serde_json is built without `float_roundtrip`).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i32>().prop_map(|n| Value::from(f64::from(n) / 8.0)),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(text(), inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// What a client may put in `SUBMIT.task`: mostly real specs in their wire form, sometimes junk.
fn submit_task() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => task_spec().prop_map(|spec| spec.to_json()),
        1 => json_value(),
    ]
}

// ---------------------------------------------------------------------------------------------
// Strategies: one per link direction, covering every variant
// ---------------------------------------------------------------------------------------------

fn worker_to_coordinator() -> impl Strategy<Value = WorkerToCoordinator> {
    let attempts = || {
        proptest::collection::vec(
            (job_id(), lease_id())
                .prop_map(|(job_id, lease_id)| RunningAttempt { job_id, lease_id }),
            0..4,
        )
    };
    prop_oneof![
        (
            worker_id(),
            incarnation(),
            any::<u32>(),
            attempts(),
            attempts()
        )
            .prop_map(|(worker_id, incarnation, capacity, running, finished)| {
                WorkerToCoordinator::Register {
                    draining: false,
                    tasks: herder_core::protocol::builtin_task_names(),
                    worker_id,
                    incarnation,
                    capacity,
                    prefetch: capacity / 2,
                    running,
                    finished,
                    queues: None,
                }
            }),
        Just(WorkerToCoordinator::Heartbeat {}),
        (job_id(), lease_id(), attempt_outcome()).prop_map(|(job_id, lease_id, outcome)| {
            WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome,
            }
        }),
    ]
}

fn coordinator_to_worker() -> impl Strategy<Value = CoordinatorToWorker> {
    prop_oneof![
        (term(), any::<u64>(), any::<u64>(), members()).prop_map(
            |(term, heartbeat_interval_millis, heartbeat_timeout_millis, members)| {
                CoordinatorToWorker::Registered {
                    term,
                    heartbeat_interval_millis,
                    heartbeat_timeout_millis,
                    members,
                }
            }
        ),
        (register_rejection(), text()).prop_map(|(reason, message)| {
            CoordinatorToWorker::RegisterRejected { reason, message }
        }),
        term().prop_map(|term| CoordinatorToWorker::HeartbeatAck { term }),
        (
            term(),
            job_id(),
            lease_id(),
            any::<u32>(),
            any::<u32>(),
            task_spec(),
            any::<u64>()
        )
            .prop_map(
                |(term, job_id, lease_id, attempt, max_attempts, task, timeout_millis)| {
                    CoordinatorToWorker::TaskAssign {
                        term,
                        job_id,
                        lease_id,
                        attempt: Attempt(attempt),
                        max_attempts,
                        task,
                        timeout_millis,
                    }
                }
            ),
        (term(), job_id(), lease_id(), cancel_reason()).prop_map(
            |(term, job_id, lease_id, reason)| CoordinatorToWorker::TaskCancel {
                term,
                job_id,
                lease_id,
                reason,
            }
        ),
        (term(), job_id(), lease_id(), any::<bool>()).prop_map(
            |(term, job_id, lease_id, accepted)| CoordinatorToWorker::ResultAck {
                term,
                job_id,
                lease_id,
                accepted,
            }
        ),
        (leader_hint(), members())
            .prop_map(|(leader, members)| CoordinatorToWorker::NotLeader { leader, members }),
        (error_code(), text())
            .prop_map(|(code, message)| CoordinatorToWorker::Error { code, message }),
    ]
}

fn client_request() -> impl Strategy<Value = ClientRequest> {
    prop_oneof![
        (
            request_id(),
            submit_task(),
            proptest::option::of(any::<u32>()),
            proptest::option::of(text()),
            proptest::option::of(partitions_request()),
        )
            .prop_map(
                |(request_id, task, max_attempts, idempotency_key, partitions)| {
                    ClientRequest::Submit {
                        timeout_millis: None,
                        request_id,
                        task,
                        max_attempts,
                        idempotency_key,
                        partitions,
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
            ),
        (request_id(), job_id())
            .prop_map(|(request_id, job_id)| ClientRequest::Status { request_id, job_id }),
        (request_id(), job_id(), proptest::option::of(any::<u64>())).prop_map(
            |(request_id, job_id, timeout_millis)| ClientRequest::Wait {
                request_id,
                job_id,
                timeout_millis,
            }
        ),
        (request_id(), job_id())
            .prop_map(|(request_id, job_id)| ClientRequest::Cancel { request_id, job_id }),
        (
            request_id(),
            proptest::option::of(job_state()),
            proptest::option::of(any::<u32>()),
            proptest::option::of(job_id()),
        )
            .prop_map(|(request_id, state, limit, before)| ClientRequest::List {
                request_id,
                state,
                limit,
                before,
            }),
        request_id().prop_map(|request_id| ClientRequest::Workers { request_id }),
        request_id().prop_map(|request_id| ClientRequest::Cluster { request_id }),
        (request_id(), proptest::option::of(node_id()))
            .prop_map(|(request_id, to)| ClientRequest::TransferLeader { request_id, to }),
    ]
}

fn client_reply() -> impl Strategy<Value = ClientReply> {
    prop_oneof![
        (request_id(), term(), job_id(), any::<bool>()).prop_map(
            |(request_id, term, job_id, existing)| ClientReply::SubmitAccepted {
                request_id,
                term,
                job_id,
                existing,
            }
        ),
        (
            request_id(),
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            proptest::option::of(text()),
            text()
        )
            .prop_map(
                |(
                    request_id,
                    retryable,
                    active_jobs,
                    admitting_jobs,
                    max_active_jobs,
                    queue,
                    message,
                )| {
                    ClientReply::SubmitRejected {
                        request_id,
                        retryable,
                        active_jobs,
                        admitting_jobs,
                        max_active_jobs,
                        queue,
                        message,
                    }
                }
            ),
        (request_id(), job_view()).prop_map(|(request_id, job)| ClientReply::Job {
            request_id,
            job: Box::new(job),
        }),
        (request_id(), job_view(), any::<bool>()).prop_map(|(request_id, job, timed_out)| {
            ClientReply::WaitResult {
                request_id,
                job: Box::new(job),
                timed_out,
            }
        }),
        (request_id(), term(), job_view(), any::<bool>()).prop_map(
            |(request_id, term, job, cancelled)| ClientReply::CancelResult {
                request_id,
                term,
                job: Box::new(job),
                cancelled,
            }
        ),
        (request_id(), proptest::collection::vec(job_view(), 0..4))
            .prop_map(|(request_id, jobs)| ClientReply::JobList { request_id, jobs }),
        (request_id(), proptest::collection::vec(worker_view(), 0..4)).prop_map(
            |(request_id, workers)| ClientReply::WorkerList {
                request_id,
                workers
            }
        ),
        (request_id(), leader_hint(), any::<bool>(), members()).prop_map(
            |(request_id, leader, uncertain, members)| ClientReply::NotLeader {
                request_id,
                leader,
                uncertain,
                members,
            }
        ),
        (request_id(), cluster_view()).prop_map(|(request_id, cluster)| ClientReply::Cluster {
            request_id,
            cluster
        }),
        (request_id(), node_id())
            .prop_map(|(request_id, to)| ClientReply::TransferStarted { request_id, to }),
        (proptest::option::of(request_id()), error_code(), text()).prop_map(
            |(request_id, code, message)| ClientReply::Error {
                request_id,
                code,
                message,
            }
        ),
    ]
}

fn peer_message() -> impl Strategy<Value = PeerMessage> {
    prop_oneof![
        (node_id(), text(), text()).prop_map(|(node_id, client_address, worker_address)| {
            PeerMessage::Hello {
                node_id,
                client_address,
                worker_address,
            }
        }),
        (term(), log_index(), term()).prop_map(|(term, last_index, last_term)| {
            PeerMessage::PreVote {
                term,
                last_index,
                last_term,
            }
        }),
        (term(), any::<bool>(), log_index()).prop_map(|(term, granted, last_index)| {
            PeerMessage::PreVoteReply {
                term,
                granted,
                last_index,
            }
        }),
        (term(), log_index(), term(), any::<bool>()).prop_map(
            |(term, last_index, last_term, transfer)| PeerMessage::Vote {
                term,
                last_index,
                last_term,
                transfer,
            }
        ),
        (term(), any::<bool>())
            .prop_map(|(term, granted)| PeerMessage::VoteReply { term, granted }),
        (
            term(),
            log_index(),
            term(),
            proptest::collection::vec(log_entry(), 0..4),
            log_index(),
            any::<u64>(),
        )
            .prop_map(|(term, prev_index, prev_term, entries, commit, seq)| {
                PeerMessage::Append {
                    term,
                    prev_index,
                    prev_term,
                    entries,
                    commit,
                    seq,
                }
            }),
        (
            term(),
            any::<bool>(),
            log_index(),
            proptest::option::of(term()),
            any::<u64>(),
            any::<bool>(),
        )
            .prop_map(|(term, success, index, conflict_term, seq, abstaining)| {
                PeerMessage::AppendReply {
                    term,
                    success,
                    index,
                    conflict_term,
                    seq,
                    abstaining,
                }
            }),
        (
            term(),
            log_index(),
            term(),
            any::<u64>(),
            any::<u64>(),
            snapshot_data(),
            any::<u64>(),
        )
            .prop_map(|(term, index, index_term, offset, total, data, seq)| {
                PeerMessage::Snapshot {
                    term,
                    index,
                    index_term,
                    offset,
                    total,
                    data,
                    seq,
                }
            }),
        (
            term(),
            log_index(),
            any::<u64>(),
            any::<u64>(),
            any::<bool>()
        )
            .prop_map(|(term, index, received, seq, abstaining)| {
                PeerMessage::SnapshotReply {
                    term,
                    index,
                    received,
                    seq,
                    abstaining,
                }
            }),
        term().prop_map(|term| PeerMessage::TimeoutNow { term }),
    ]
}

/// A message of any link, tagged with which enum it belongs to.
#[derive(Clone, Debug)]
enum AnyMessage {
    WorkerToCoordinator(WorkerToCoordinator),
    CoordinatorToWorker(CoordinatorToWorker),
    ClientRequest(ClientRequest),
    ClientReply(ClientReply),
    Peer(PeerMessage),
}

fn any_message() -> impl Strategy<Value = AnyMessage> {
    prop_oneof![
        worker_to_coordinator().prop_map(AnyMessage::WorkerToCoordinator),
        coordinator_to_worker().prop_map(AnyMessage::CoordinatorToWorker),
        client_request().prop_map(AnyMessage::ClientRequest),
        client_reply().prop_map(AnyMessage::ClientReply),
        peer_message().prop_map(AnyMessage::Peer),
    ]
}

// ---------------------------------------------------------------------------------------------
// Checks shared by the properties
// ---------------------------------------------------------------------------------------------

/// `bytes` cut at the given points (sorted; repeats give empty pieces, which must be harmless).
fn split<'a>(bytes: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
    points.push(bytes.len());
    points.sort_unstable();
    let mut pieces = Vec::with_capacity(points.len());
    let mut from = 0;
    for to in points {
        pieces.push(&bytes[from..to]);
        from = to;
    }
    pieces
}

/// Encodes `messages` back to back, feeds the bytes to a decoder in the pieces `cuts` makes, and
/// checks the decoder hands back exactly the same messages and nothing else.
fn round_trip_all<M>(messages: &[M], cuts: &[Index]) -> Result<(), TestCaseError>
where
    M: WireMessage + PartialEq + Debug + Clone,
{
    let mut wire = Vec::new();
    for message in messages {
        let before = wire.len();
        encode_frame(message, FRAME_BYTES_MAX_DEFAULT, &mut wire)
            .map_err(|error| TestCaseError::fail(format!("encode failed: {error}")))?;
        // The header announces exactly the JSON that follows it.
        let header: [u8; 4] = wire[before..before + FRAME_HEADER_BYTES]
            .try_into()
            .expect("four header bytes were written");
        let announced = u32::from_be_bytes(header) as usize;
        prop_assert_eq!(announced, wire.len() - before - FRAME_HEADER_BYTES);
        // And the same payload decodes on its own.
        let payload = &wire[before + FRAME_HEADER_BYTES..];
        prop_assert_eq!(&decode_message::<M>(payload), &Ok(message.clone()));
    }
    let mut decoder = FrameDecoder::default();
    let mut got: Vec<M> = Vec::new();
    for piece in split(&wire, cuts) {
        decoder.extend(piece);
        loop {
            match decoder.next_message::<M>() {
                Ok(Some(message)) => got.push(message),
                Ok(None) => break,
                Err(error) => {
                    return Err(TestCaseError::fail(format!(
                        "a well-formed stream failed to decode: {error}"
                    )))
                }
            }
        }
    }
    prop_assert_eq!(got.len(), messages.len());
    for (got, sent) in got.iter().zip(messages) {
        prop_assert_eq!(got, sent);
    }
    prop_assert_eq!(decoder.buffered_len(), 0);
    Ok(())
}

/// The JSON object `message` is sent as must carry `"type": message.type_name()`, and that tag
/// must be one its enum recognises.
fn check_type_tag<M: WireMessage>(message: &M) -> Result<(), TestCaseError> {
    let mut wire = Vec::new();
    encode_frame(message, FRAME_BYTES_MAX_DEFAULT, &mut wire)
        .map_err(|error| TestCaseError::fail(format!("encode failed: {error}")))?;
    let value: Value = serde_json::from_slice(&wire[FRAME_HEADER_BYTES..])
        .map_err(|error| TestCaseError::fail(format!("payload is not JSON: {error}")))?;
    let object = value
        .as_object()
        .ok_or_else(|| TestCaseError::fail("payload is not a JSON object"))?;
    let tag = object.get("type").and_then(Value::as_str);
    prop_assert_eq!(tag, Some(message.type_name()));
    prop_assert!(M::is_known_type(message.type_name()));
    // Tags are SCREAMING_SNAKE_CASE ASCII, as docs/PROTOCOL.md and every peer expect.
    prop_assert!(message
        .type_name()
        .bytes()
        .all(|b| b.is_ascii_uppercase() || b == b'_'));
    Ok(())
}

/// Decoding a message of one link as another link's enum `B`: a tag `B` does not know is
/// `UnknownType` naming that tag; a tag `B` knows either decodes to a `B` with that same tag or
/// is `InvalidMessage` naming it. Both the one-shot and the streaming decoder must agree, and a
/// streaming decoder that refused the frame stays refused.
fn check_cross_decode<A, B>(message: &A) -> Result<(), TestCaseError>
where
    A: WireMessage,
    B: WireMessage + Debug + PartialEq,
{
    let tag = message.type_name();
    let mut wire = Vec::new();
    encode_frame(message, FRAME_BYTES_MAX_DEFAULT, &mut wire)
        .map_err(|error| TestCaseError::fail(format!("encode failed: {error}")))?;
    let direct = decode_message::<B>(&wire[FRAME_HEADER_BYTES..]);
    match &direct {
        Ok(decoded) => {
            prop_assert!(
                B::is_known_type(tag),
                "decoded a tag {} that B does not know",
                tag
            );
            prop_assert_eq!(decoded.type_name(), tag);
        }
        Err(FrameError::UnknownType { type_name }) => {
            prop_assert!(!B::is_known_type(tag));
            prop_assert_eq!(type_name.as_str(), tag);
        }
        Err(FrameError::InvalidMessage { type_name, .. }) => {
            prop_assert!(B::is_known_type(tag));
            prop_assert_eq!(type_name.as_str(), tag);
        }
        Err(other) => {
            return Err(TestCaseError::fail(format!(
                "a well-formed {tag} frame on the wrong link gave {other:?}"
            )))
        }
    }
    let mut decoder = FrameDecoder::default();
    decoder.extend(&wire);
    let streamed = decoder.next_message::<B>();
    match (&direct, &streamed) {
        (Ok(a), Ok(Some(b))) => prop_assert_eq!(a, b),
        (Err(a), Err(b)) => {
            prop_assert_eq!(a, b);
            // Sticky: the decoder refuses even a valid frame afterwards.
            decoder.extend(&wire);
            prop_assert_eq!(decoder.buffered_len(), 0);
            prop_assert_eq!(&decoder.next_message::<B>(), &Err(a.clone()));
        }
        _ => {
            return Err(TestCaseError::fail(format!(
                "one-shot decode gave {direct:?} but the stream gave {streamed:?}"
            )))
        }
    }
    Ok(())
}

/// Runs `check_cross_decode` for `message` against every link's enum (its own included, where it
/// must decode back to itself).
fn check_against_every_link<A>(message: &A) -> Result<(), TestCaseError>
where
    A: WireMessage + Debug,
{
    check_cross_decode::<A, WorkerToCoordinator>(message)?;
    check_cross_decode::<A, CoordinatorToWorker>(message)?;
    check_cross_decode::<A, ClientRequest>(message)?;
    check_cross_decode::<A, ClientReply>(message)?;
    check_cross_decode::<A, PeerMessage>(message)?;
    Ok(())
}

/// Tags each enum knows; used to make sure the strategies really reach every variant's tag and
/// that the cross-link expectations below are grounded.
const WORKER_TAGS: [&str; 3] = ["REGISTER", "HEARTBEAT", "TASK_RESULT"];
const COORDINATOR_TAGS: [&str; 8] = [
    "REGISTERED",
    "REGISTER_REJECTED",
    "HEARTBEAT_ACK",
    "TASK_ASSIGN",
    "TASK_CANCEL",
    "RESULT_ACK",
    "NOT_LEADER",
    "ERROR",
];
const REQUEST_TAGS: [&str; 8] = [
    "SUBMIT",
    "STATUS",
    "WAIT",
    "CANCEL",
    "LIST",
    "WORKERS",
    "CLUSTER",
    "TRANSFER_LEADER",
];
const REPLY_TAGS: [&str; 11] = [
    "SUBMIT_ACCEPTED",
    "SUBMIT_REJECTED",
    "JOB",
    "WAIT_RESULT",
    "CANCEL_RESULT",
    "JOB_LIST",
    "WORKER_LIST",
    "NOT_LEADER",
    "CLUSTER",
    "TRANSFER_STARTED",
    "ERROR",
];
const PEER_TAGS: [&str; 10] = [
    "HELLO",
    "PRE_VOTE",
    "PRE_VOTE_REPLY",
    "VOTE",
    "VOTE_REPLY",
    "APPEND",
    "APPEND_REPLY",
    "SNAPSHOT",
    "SNAPSHOT_REPLY",
    "TIMEOUT_NOW",
];

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn worker_messages_round_trip_through_any_split(
        messages in proptest::collection::vec(worker_to_coordinator(), 1..6),
        cuts in proptest::collection::vec(any::<Index>(), 0..12),
    ) {
        round_trip_all(&messages, &cuts)?;
    }

    #[test]
    fn coordinator_messages_round_trip_through_any_split(
        messages in proptest::collection::vec(coordinator_to_worker(), 1..6),
        cuts in proptest::collection::vec(any::<Index>(), 0..12),
    ) {
        round_trip_all(&messages, &cuts)?;
    }

    #[test]
    fn client_requests_round_trip_through_any_split(
        messages in proptest::collection::vec(client_request(), 1..6),
        cuts in proptest::collection::vec(any::<Index>(), 0..12),
    ) {
        round_trip_all(&messages, &cuts)?;
    }

    #[test]
    fn client_replies_round_trip_through_any_split(
        messages in proptest::collection::vec(client_reply(), 1..6),
        cuts in proptest::collection::vec(any::<Index>(), 0..12),
    ) {
        round_trip_all(&messages, &cuts)?;
    }

    #[test]
    fn peer_messages_round_trip_through_binary_frames_split_anywhere(
        messages in proptest::collection::vec(peer_message(), 1..6),
        cuts in proptest::collection::vec(any::<Index>(), 0..12),
    ) {
        let mut wire = Vec::new();
        for message in &messages {
            let before = wire.len();
            encode_binary_frame(message, FRAME_BYTES_MAX_DEFAULT, &mut wire)
                .map_err(|error| TestCaseError::fail(format!("encode failed: {error}")))?;
            let payload = &wire[before + FRAME_HEADER_BYTES..];
            // The entries of an APPEND are sized by what they take in this very encoding.
            if let PeerMessage::Append { entries, .. } = message {
                let counted: usize = entries.iter().map(encoded_bytes).sum();
                prop_assert!(counted < payload.len());
            }
            prop_assert_eq!(&decode_binary_message::<PeerMessage>(payload), &Ok(message.clone()));
        }
        let mut decoder = FrameDecoder::default();
        let mut got = Vec::new();
        for piece in split(&wire, &cuts) {
            decoder.extend(piece);
            while let Some(message) = decoder
                .next_binary_message::<PeerMessage>()
                .map_err(|error| TestCaseError::fail(format!("a well-formed stream failed: {error}")))?
            {
                got.push(message);
            }
        }
        prop_assert_eq!(got, messages);
        prop_assert_eq!(decoder.buffered_len(), 0);
    }

    #[test]
    fn a_binary_payload_with_bytes_after_its_message_is_refused(message in peer_message(), extra in 1u8..=255) {
        let mut wire = Vec::new();
        encode_binary_frame(&message, FRAME_BYTES_MAX_DEFAULT, &mut wire).expect("encodes");
        let mut payload = wire[FRAME_HEADER_BYTES..].to_vec();
        payload.push(extra);
        let refused = matches!(
            decode_binary_message::<PeerMessage>(&payload),
            Err(FrameError::InvalidBinary { .. })
        );
        prop_assert!(refused);
    }

    #[test]
    fn peer_messages_round_trip_through_any_split(
        messages in proptest::collection::vec(peer_message(), 1..6),
        cuts in proptest::collection::vec(any::<Index>(), 0..12),
    ) {
        round_trip_all(&messages, &cuts)?;
    }

    #[test]
    fn every_message_carries_its_type_tag(message in any_message()) {
        match &message {
            AnyMessage::WorkerToCoordinator(m) => {
                check_type_tag(m)?;
                prop_assert!(WORKER_TAGS.contains(&m.type_name()));
            }
            AnyMessage::CoordinatorToWorker(m) => {
                check_type_tag(m)?;
                prop_assert!(COORDINATOR_TAGS.contains(&m.type_name()));
            }
            AnyMessage::ClientRequest(m) => {
                check_type_tag(m)?;
                prop_assert!(REQUEST_TAGS.contains(&m.type_name()));
            }
            AnyMessage::ClientReply(m) => {
                check_type_tag(m)?;
                prop_assert!(REPLY_TAGS.contains(&m.type_name()));
            }
            AnyMessage::Peer(m) => {
                check_type_tag(m)?;
                prop_assert!(PEER_TAGS.contains(&m.type_name()));
            }
        }
    }

    #[test]
    fn a_message_on_the_wrong_link_is_refused_cleanly(message in any_message()) {
        match &message {
            AnyMessage::WorkerToCoordinator(m) => check_against_every_link(m)?,
            AnyMessage::CoordinatorToWorker(m) => check_against_every_link(m)?,
            AnyMessage::ClientRequest(m) => check_against_every_link(m)?,
            AnyMessage::ClientReply(m) => check_against_every_link(m)?,
            AnyMessage::Peer(m) => check_against_every_link(m)?,
        }
    }

    #[test]
    fn the_term_of_a_message_is_the_term_on_the_wire(
        worker in coordinator_to_worker(),
        peer in peer_message(),
    ) {
        let wire_term = |value: Value| value.get("term").and_then(Value::as_u64);
        let value = serde_json::to_value(&worker).expect("messages serialize");
        prop_assert_eq!(worker.term().map(|t| t.0), wire_term(value));
        let value = serde_json::to_value(&peer).expect("messages serialize");
        prop_assert_eq!(peer.term().map(|t| t.0), wire_term(value));
    }

    #[test]
    fn a_submitted_spec_in_wire_form_parses_back_to_itself(spec in task_spec()) {
        // `to_json` is documented as identical to the derived `Serialize`.
        prop_assert_eq!(spec.to_json(), serde_json::to_value(&spec).expect("specs serialize"));
        // And a valid spec is accepted back by the strict parser unchanged.
        if spec.validate().is_ok() {
            prop_assert_eq!(TaskSpec::from_json(&spec.to_json()), Ok(spec));
        }
    }
}

/// The strategies above are only as good as what they reach: every tag of every enum, and every
/// log command inside an `APPEND`, must come up in a few thousand draws.
#[test]
fn the_strategies_reach_every_tag_and_every_command() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use std::collections::BTreeSet;

    let mut runner = TestRunner::deterministic();
    let mut tags: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut commands: BTreeSet<String> = BTreeSet::new();
    for _ in 0..5_000 {
        let message = any_message()
            .new_tree(&mut runner)
            .expect("a value")
            .current();
        match &message {
            AnyMessage::WorkerToCoordinator(m) => tags.insert(("worker", m.type_name())),
            AnyMessage::CoordinatorToWorker(m) => tags.insert(("coordinator", m.type_name())),
            AnyMessage::ClientRequest(m) => tags.insert(("request", m.type_name())),
            AnyMessage::ClientReply(m) => tags.insert(("reply", m.type_name())),
            AnyMessage::Peer(m) => {
                if let PeerMessage::Append { entries, .. } = m {
                    for entry in entries {
                        let value = serde_json::to_value(&entry.command).expect("serializes");
                        if let Some(kind) = value.get("command").and_then(Value::as_str) {
                            commands.insert(kind.to_owned());
                        }
                    }
                }
                tags.insert(("peer", m.type_name()))
            }
        };
    }
    let lists: [(&str, &[&str]); 5] = [
        ("worker", &WORKER_TAGS),
        ("coordinator", &COORDINATOR_TAGS),
        ("request", &REQUEST_TAGS),
        ("reply", &REPLY_TAGS),
        ("peer", &PEER_TAGS),
    ];
    for (link, list) in lists {
        for tag in list {
            assert!(
                tags.contains(&(link, *tag)),
                "{link} {tag} is never generated"
            );
        }
    }
    for kind in [
        "submit",
        "assign",
        "complete",
        "attempt_failed",
        "requeue",
        "cancel",
        "abandon",
        "new_leader",
    ] {
        assert!(
            commands.contains(kind),
            "log command {kind} is never generated"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed examples of the exact wire form
// ---------------------------------------------------------------------------------------------

const JOB: &str = "6f1c6c1e-3b2a-4d5e-8f90-0123456789ab";
const LEASE: &str = "0a1b2c3d-4e5f-4a6b-9c7d-8e9fa0b1c2d3";

fn job() -> JobId {
    JOB.parse().expect("a valid UUID")
}

fn lease() -> LeaseId {
    LEASE.parse().expect("a valid UUID")
}

/// Encodes `message`, checks its payload is exactly `expected` (as JSON, so key order is free),
/// and checks `expected` decodes back to `message`.
fn assert_wire_form<M>(message: M, expected: Value)
where
    M: WireMessage + PartialEq + Debug,
{
    let mut wire = Vec::new();
    encode_frame(&message, FRAME_BYTES_MAX_DEFAULT, &mut wire).expect("encodes");
    let payload: Value =
        serde_json::from_slice(&wire[FRAME_HEADER_BYTES..]).expect("payload is JSON");
    assert_eq!(payload, expected, "wire form of {}", message.type_name());
    let text = serde_json::to_vec(&expected).expect("json");
    assert_eq!(decode_message::<M>(&text), Ok(message));
}

#[test]
fn heartbeat_wire_form() {
    assert_wire_form(
        WorkerToCoordinator::Heartbeat {},
        json!({"type": "HEARTBEAT"}),
    );
    assert_wire_form(
        CoordinatorToWorker::HeartbeatAck { term: Term(7) },
        json!({"type": "HEARTBEAT_ACK", "term": 7}),
    );
}

#[test]
fn register_wire_form_and_running_defaults_to_empty() {
    assert_wire_form(
        WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: WorkerId("worker-1".into()),
            incarnation: Incarnation(7),
            capacity: 4,
            prefetch: 0,
            running: vec![RunningAttempt {
                job_id: job(),
                lease_id: lease(),
            }],
            finished: Vec::new(),
            queues: None,
        },
        json!({
            "type": "REGISTER",
            "worker_id": "worker-1",
            "incarnation": "0000000000000007",
            "capacity": 4,
            "running": [{"job_id": JOB, "lease_id": LEASE}],
            "finished": [],
            "tasks": herder_core::protocol::builtin_task_names(),
        }),
    );
    // An older worker may leave `running` out (and `tasks`: it serves the built-in kinds).
    let text =
        br#"{"type":"REGISTER","worker_id":"w","incarnation":"00000000000000ff","capacity":2}"#;
    assert_eq!(
        decode_message::<WorkerToCoordinator>(text),
        Ok(WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: WorkerId("w".into()),
            incarnation: Incarnation(255),
            capacity: 2,
            prefetch: 0,
            running: vec![],
            finished: Vec::new(),
            queues: None,
        })
    );
}

#[test]
fn incarnations_travel_as_sixteen_hex_digits() {
    // A random 64-bit number does not survive JSON parsers that read numbers as doubles.
    assert_wire_form(
        WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: WorkerId("w".into()),
            incarnation: Incarnation(u64::MAX),
            capacity: 1,
            prefetch: 0,
            running: vec![],
            finished: Vec::new(),
            queues: None,
        },
        json!({
            "type": "REGISTER",
            "worker_id": "w",
            "incarnation": "ffffffffffffffff",
            "capacity": 1,
            "running": [],
            "finished": [],
            "tasks": herder_core::protocol::builtin_task_names(),
        }),
    );
    let as_number = br#"{"type":"REGISTER","worker_id":"w","incarnation":7,"capacity":1}"#;
    assert!(matches!(
        decode_message::<WorkerToCoordinator>(as_number),
        Err(FrameError::InvalidMessage { .. })
    ));
    let too_short = br#"{"type":"REGISTER","worker_id":"w","incarnation":"7","capacity":1}"#;
    assert!(matches!(
        decode_message::<WorkerToCoordinator>(too_short),
        Err(FrameError::InvalidMessage { .. })
    ));
}

#[test]
fn task_result_wire_form_for_each_outcome() {
    assert_wire_form(
        WorkerToCoordinator::TaskResult {
            job_id: job(),
            lease_id: lease(),
            outcome: AttemptOutcome::Succeeded {
                output: TaskOutput::PrimeCount {
                    limit: 10,
                    count: 4,
                },
            },
        },
        json!({
            "type": "TASK_RESULT",
            "job_id": JOB,
            "lease_id": LEASE,
            "outcome": {"status": "succeeded", "output": {"kind": "prime-count", "limit": 10, "count": 4}},
        }),
    );
    assert_wire_form(
        WorkerToCoordinator::TaskResult {
            job_id: job(),
            lease_id: lease(),
            outcome: AttemptOutcome::Failed {
                permanent: false,
                error: "boom".into(),
            },
        },
        json!({
            "type": "TASK_RESULT",
            "job_id": JOB,
            "lease_id": LEASE,
            "outcome": {"status": "failed", "error": "boom"},
        }),
    );
    assert_wire_form(
        WorkerToCoordinator::TaskResult {
            job_id: job(),
            lease_id: lease(),
            outcome: AttemptOutcome::Cancelled {},
        },
        json!({
            "type": "TASK_RESULT",
            "job_id": JOB,
            "lease_id": LEASE,
            "outcome": {"status": "cancelled"},
        }),
    );
}

#[test]
fn coordinator_to_worker_wire_forms() {
    assert_wire_form(
        CoordinatorToWorker::TaskAssign {
            term: Term(3),
            job_id: job(),
            lease_id: lease(),
            attempt: Attempt(2),
            max_attempts: 3,
            task: TaskSpec::Sha256 { text: "abc".into() },
            timeout_millis: 600_000,
        },
        json!({
            "type": "TASK_ASSIGN",
            "term": 3,
            "job_id": JOB,
            "lease_id": LEASE,
            "attempt": 2,
            "max_attempts": 3,
            "task": {"kind": "sha256", "text": "abc"},
            "timeout_millis": 600_000,
        }),
    );
    // Empty `members` are left out; a list is sent as one.
    assert_wire_form(
        CoordinatorToWorker::Registered {
            term: Term(1),
            members: Vec::new(),
            heartbeat_interval_millis: 2_000,
            heartbeat_timeout_millis: 6_000,
        },
        json!({"type": "REGISTERED", "term": 1, "heartbeat_interval_millis": 2000, "heartbeat_timeout_millis": 6000}),
    );
    assert_wire_form(
        CoordinatorToWorker::Registered {
            term: Term(9),
            members: vec!["c1:7070".into(), "c2:7070".into()],
            heartbeat_interval_millis: 2_000,
            heartbeat_timeout_millis: 6_000,
        },
        json!({
            "type": "REGISTERED",
            "term": 9,
            "heartbeat_interval_millis": 2000,
            "heartbeat_timeout_millis": 6000,
            "members": ["c1:7070", "c2:7070"],
        }),
    );
    assert_wire_form(
        CoordinatorToWorker::RegisterRejected {
            reason: RegisterRejection::DuplicateWorkerId,
            message: "taken".into(),
        },
        json!({"type": "REGISTER_REJECTED", "reason": "DUPLICATE_WORKER_ID", "message": "taken"}),
    );
    assert_wire_form(
        CoordinatorToWorker::TaskCancel {
            term: Term(4),
            job_id: job(),
            lease_id: lease(),
            reason: CancelReason::DeadlineExpired,
        },
        json!({"type": "TASK_CANCEL", "term": 4, "job_id": JOB, "lease_id": LEASE, "reason": "DEADLINE_EXPIRED"}),
    );
    assert_wire_form(
        CoordinatorToWorker::ResultAck {
            term: Term(5),
            job_id: job(),
            lease_id: lease(),
            accepted: false,
        },
        json!({"type": "RESULT_ACK", "term": 5, "job_id": JOB, "lease_id": LEASE, "accepted": false}),
    );
    assert_wire_form(
        CoordinatorToWorker::NotLeader {
            leader: Some(LeaderHint {
                node_id: NodeId("c2".into()),
                address: "10.0.0.2:7070".into(),
            }),
            members: Vec::new(),
        },
        json!({"type": "NOT_LEADER", "leader": {"node_id": "c2", "address": "10.0.0.2:7070"}}),
    );
    assert_wire_form(
        CoordinatorToWorker::NotLeader {
            leader: None,
            members: vec!["10.0.0.1:7070".into(), "10.0.0.2:7070".into()],
        },
        json!({"type": "NOT_LEADER", "leader": null, "members": ["10.0.0.1:7070", "10.0.0.2:7070"]}),
    );
    assert_wire_form(
        CoordinatorToWorker::Error {
            code: ErrorCode::NotRegistered,
            message: "register first".into(),
        },
        json!({"type": "ERROR", "code": "NOT_REGISTERED", "message": "register first"}),
    );
}

#[test]
fn submit_wire_form_with_and_without_optional_fields() {
    assert_wire_form(
        ClientRequest::Submit {
            timeout_millis: None,
            partitions: None,
            request_id: RequestId(5),
            task: TaskSpec::Sleep { milliseconds: 250 }.to_json(),
            max_attempts: Some(4),
            idempotency_key: Some("order-17".into()),
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        },
        json!({
            "type": "SUBMIT",
            "request_id": 5,
            "task": {"kind": "sleep", "milliseconds": 250},
            "max_attempts": 4,
            "idempotency_key": "order-17",
        }),
    );
    // Absent options are left out entirely, not sent as null.
    assert_wire_form(
        ClientRequest::Submit {
            timeout_millis: None,
            partitions: None,
            request_id: RequestId(6),
            task: TaskSpec::Fail {
                fail_until_attempt: 2,
            }
            .to_json(),
            max_attempts: None,
            idempotency_key: None,
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        },
        json!({"type": "SUBMIT", "request_id": 6, "task": {"kind": "fail", "fail_until_attempt": 2}}),
    );
}

#[test]
fn other_client_request_wire_forms() {
    assert_wire_form(
        ClientRequest::Status {
            request_id: RequestId(1),
            job_id: job(),
        },
        json!({"type": "STATUS", "request_id": 1, "job_id": JOB}),
    );
    assert_wire_form(
        ClientRequest::Wait {
            request_id: RequestId(2),
            job_id: job(),
            timeout_millis: Some(1_500),
        },
        json!({"type": "WAIT", "request_id": 2, "job_id": JOB, "timeout_millis": 1500}),
    );
    assert_wire_form(
        ClientRequest::Cancel {
            request_id: RequestId(3),
            job_id: job(),
        },
        json!({"type": "CANCEL", "request_id": 3, "job_id": JOB}),
    );
    assert_wire_form(
        ClientRequest::List {
            request_id: RequestId(4),
            state: Some(JobState::RetryWait),
            limit: Some(10),
            before: None,
        },
        json!({"type": "LIST", "request_id": 4, "state": "RETRY_WAIT", "limit": 10}),
    );
    assert_wire_form(
        ClientRequest::Workers {
            request_id: RequestId(5),
        },
        json!({"type": "WORKERS", "request_id": 5}),
    );
}

#[test]
fn client_reply_wire_forms() {
    assert_wire_form(
        ClientReply::SubmitAccepted {
            request_id: RequestId(5),
            term: Term(12),
            job_id: job(),
            existing: false,
        },
        json!({"type": "SUBMIT_ACCEPTED", "request_id": 5, "term": 12, "job_id": JOB, "existing": false}),
    );
    assert_wire_form(
        ClientReply::SubmitRejected {
            request_id: RequestId(6),
            retryable: true,
            active_jobs: 8,
            admitting_jobs: 2,
            max_active_jobs: 10,
            queue: None,
            message: "full".into(),
        },
        json!({
            "type": "SUBMIT_REJECTED",
            "request_id": 6,
            "retryable": true,
            "active_jobs": 8,
            "admitting_jobs": 2,
            "max_active_jobs": 10,
            "message": "full",
        }),
    );
    assert_wire_form(
        ClientReply::SubmitRejected {
            request_id: RequestId(6),
            retryable: true,
            active_jobs: 4,
            admitting_jobs: 0,
            max_active_jobs: 4,
            queue: Some("reports".into()),
            message: "queue full".into(),
        },
        json!({
            "type": "SUBMIT_REJECTED",
            "request_id": 6,
            "retryable": true,
            "active_jobs": 4,
            "admitting_jobs": 0,
            "max_active_jobs": 4,
            "queue": "reports",
            "message": "queue full",
        }),
    );
    assert_wire_form(
        ClientReply::Job {
            request_id: RequestId(7),
            job: Box::new(JobView {
                progress: None,
                timeout_millis: None,
                unserved: false,
                id: job(),
                state: JobState::Completed,
                attempt: 1,
                max_attempts: 3,
                worker: Some(WorkerId("worker-1".into())),
                lease_id: None,
                task: TaskSpec::WordCount { text: "a b".into() },
                result: Some(TaskOutput::WordCount { words: 2 }),
                error: None,
                idempotency_key: None,
                partition_of: None,
                partitions: None,
                created_at_unix_ms: None,
                finished_at_unix_ms: None,
                first_started_at_unix_ms: None,
                history: Vec::new(),
                history_dropped: 0,
                submitted_by: None,
                fairness_key: None,
                priority: 0,
                queue: herder_core::queues::default_queue(),
                run_at_unix_ms: None,
                retry_of: None,
                after: Vec::new(),
                after_any_outcome: false,
                waited_on_by: Vec::new(),
            }),
        },
        json!({
            "type": "JOB",
            "request_id": 7,
            "job": {
                "id": JOB,
                "state": "COMPLETED",
                "attempt": 1,
                "max_attempts": 3,
                "worker": "worker-1",
                "lease_id": null,
                "task": {"kind": "word-count", "text": "a b"},
                "result": {"kind": "word-count", "words": 2},
                "error": null,
                "idempotency_key": null,
                "queue": "default",
                "priority": 0,
            },
        }),
    );
    assert_wire_form(
        ClientReply::WorkerList {
            request_id: RequestId(8),
            workers: vec![WorkerView {
                draining: true,
                tasks: vec!["resize".into(), "sha256".into()],
                id: WorkerId("worker-2".into()),
                incarnation: Incarnation(9),
                alive: true,
                capacity: 4,
                prefetch: 2,
                running: 1,
                last_heartbeat_millis_ago: 12,
            }],
        },
        json!({
            "type": "WORKER_LIST",
            "request_id": 8,
            "workers": [{
                "id": "worker-2",
                "incarnation": "0000000000000009",
                "alive": true,
                "capacity": 4,
                "prefetch": 2,
                "running": 1,
                "last_heartbeat_millis_ago": 12,
                "tasks": ["resize", "sha256"],
                "draining": true,
            }],
        }),
    );
    assert_wire_form(
        ClientReply::Error {
            request_id: None,
            code: ErrorCode::InvalidJson,
            message: "bad".into(),
        },
        json!({"type": "ERROR", "code": "INVALID_JSON", "message": "bad"}),
    );
    // `uncertain` is left out when false, `members` when empty.
    assert_wire_form(
        ClientReply::NotLeader {
            request_id: RequestId(9),
            leader: None,
            uncertain: false,
            members: Vec::new(),
        },
        json!({"type": "NOT_LEADER", "request_id": 9, "leader": null}),
    );
    assert_wire_form(
        ClientReply::NotLeader {
            request_id: RequestId(10),
            leader: Some(LeaderHint {
                node_id: NodeId("c3".into()),
                address: "10.0.0.3:7071".into(),
            }),
            uncertain: true,
            members: vec!["10.0.0.1:7071".into(), "10.0.0.3:7071".into()],
        },
        json!({
            "type": "NOT_LEADER",
            "request_id": 10,
            "leader": {"node_id": "c3", "address": "10.0.0.3:7071"},
            "uncertain": true,
            "members": ["10.0.0.1:7071", "10.0.0.3:7071"],
        }),
    );
    assert_wire_form(
        ClientReply::CancelResult {
            request_id: RequestId(11),
            term: Term(2),
            job: Box::new(JobView {
                progress: None,
                timeout_millis: None,
                unserved: false,
                id: job(),
                state: JobState::Cancelled,
                attempt: 0,
                max_attempts: 3,
                worker: None,
                lease_id: None,
                task: TaskSpec::Sleep { milliseconds: 5 },
                result: None,
                error: Some("cancelled by client".into()),
                idempotency_key: None,
                partition_of: None,
                partitions: None,
                created_at_unix_ms: None,
                finished_at_unix_ms: None,
                first_started_at_unix_ms: None,
                history: Vec::new(),
                history_dropped: 0,
                submitted_by: None,
                fairness_key: None,
                priority: 0,
                queue: herder_core::queues::default_queue(),
                run_at_unix_ms: None,
                retry_of: None,
                after: Vec::new(),
                after_any_outcome: false,
                waited_on_by: Vec::new(),
            }),
            cancelled: true,
        },
        json!({
            "type": "CANCEL_RESULT",
            "request_id": 11,
            "term": 2,
            "job": {
                "id": JOB,
                "state": "CANCELLED",
                "attempt": 0,
                "max_attempts": 3,
                "worker": null,
                "lease_id": null,
                "task": {"kind": "sleep", "milliseconds": 5},
                "result": null,
                "error": "cancelled by client",
                "idempotency_key": null,
                "queue": "default",
                "priority": 0,
            },
            "cancelled": true,
        }),
    );
    assert_wire_form(
        ClientReply::Cluster {
            request_id: RequestId(12),
            cluster: ClusterView {
                node_id: NodeId("c1".into()),
                role: "leader".into(),
                term: Term(4),
                leader: Some(NodeId("c1".into())),
                last_index: LogIndex(30),
                commit_index: LogIndex(29),
                applied_index: LogIndex(29),
                members: vec![
                    MemberView {
                        node_id: NodeId("c1".into()),
                        client_address: Some("10.0.0.1:7071".into()),
                        worker_address: Some("10.0.0.1:7070".into()),
                        matched_index: Some(LogIndex(30)),
                        last_heard_millis_ago: Some(0),
                    },
                    MemberView {
                        node_id: NodeId("c2".into()),
                        client_address: None,
                        worker_address: None,
                        matched_index: None,
                        last_heard_millis_ago: None,
                    },
                ],
            },
        },
        json!({
            "type": "CLUSTER",
            "request_id": 12,
            "cluster": {
                "node_id": "c1",
                "role": "leader",
                "term": 4,
                "leader": "c1",
                "last_index": 30,
                "commit_index": 29,
                "applied_index": 29,
                "members": [
                    {
                        "node_id": "c1",
                        "client_address": "10.0.0.1:7071",
                        "worker_address": "10.0.0.1:7070",
                        "matched_index": 30,
                        "last_heard_millis_ago": 0,
                    },
                    // Unknown addresses are null; the leader-only fields are left out.
                    {"node_id": "c2", "client_address": null, "worker_address": null},
                ],
            },
        }),
    );
    assert_wire_form(
        ClientReply::TransferStarted {
            request_id: RequestId(13),
            to: NodeId("c2".into()),
        },
        json!({"type": "TRANSFER_STARTED", "request_id": 13, "to": "c2"}),
    );
}

#[test]
fn group_request_wire_forms() {
    assert_wire_form(
        ClientRequest::Cluster {
            request_id: RequestId(1),
        },
        json!({"type": "CLUSTER", "request_id": 1}),
    );
    assert_wire_form(
        ClientRequest::TransferLeader {
            request_id: RequestId(2),
            to: Some(NodeId("c3".into())),
        },
        json!({"type": "TRANSFER_LEADER", "request_id": 2, "to": "c3"}),
    );
    // Without a target the field is left out: the leader picks the most up-to-date member.
    assert_wire_form(
        ClientRequest::TransferLeader {
            request_id: RequestId(3),
            to: None,
        },
        json!({"type": "TRANSFER_LEADER", "request_id": 3}),
    );
}

#[test]
fn a_snapshot_chunk_of_any_bytes_crosses_the_binary_link_whole() {
    // Bytes that are not UTF-8 and not base64: they must come back as they went, not be read
    // as text because the message is decoded through serde's buffer for tagged enums.
    let message = PeerMessage::Snapshot {
        term: Term(2),
        index: LogIndex(9),
        index_term: Term(1),
        offset: 0,
        total: 4,
        data: ChunkBytes(vec![0xff, 0x00, 0xc3, 0x28]),
        seq: 1,
    };
    let mut frame = Vec::new();
    encode_binary_frame(&message, FRAME_BYTES_MAX_DEFAULT, &mut frame).expect("encodes");
    assert_eq!(
        decode_binary_message::<PeerMessage>(&frame[FRAME_HEADER_BYTES..]),
        Ok(message)
    );
}

#[test]
fn peer_hello_wire_form() {
    assert_wire_form(
        PeerMessage::Hello {
            node_id: NodeId("coordinator-1".into()),
            client_address: "10.0.0.1:7071".into(),
            worker_address: "10.0.0.1:7070".into(),
        },
        json!({
            "type": "HELLO",
            "node_id": "coordinator-1",
            "client_address": "10.0.0.1:7071",
            "worker_address": "10.0.0.1:7070",
        }),
    );
}

#[test]
fn peer_consensus_wire_forms() {
    assert_wire_form(
        PeerMessage::PreVote {
            term: Term(5),
            last_index: LogIndex(20),
            last_term: Term(4),
        },
        json!({"type": "PRE_VOTE", "term": 5, "last_index": 20, "last_term": 4}),
    );
    assert_wire_form(
        PeerMessage::PreVoteReply {
            term: Term(5),
            granted: true,
            last_index: LogIndex(18),
        },
        json!({"type": "PRE_VOTE_REPLY", "term": 5, "granted": true, "last_index": 18}),
    );
    assert_wire_form(
        PeerMessage::Vote {
            term: Term(5),
            last_index: LogIndex(20),
            last_term: Term(4),
            transfer: true,
        },
        json!({"type": "VOTE", "term": 5, "last_index": 20, "last_term": 4, "transfer": true}),
    );
    assert_wire_form(
        PeerMessage::VoteReply {
            term: Term(5),
            granted: false,
        },
        json!({"type": "VOTE_REPLY", "term": 5, "granted": false}),
    );
    assert_wire_form(
        PeerMessage::Append {
            term: Term(5),
            prev_index: LogIndex(20),
            prev_term: Term(4),
            entries: vec![
                LogEntry {
                    index: LogIndex(21),
                    term: Term(5),
                    at: herder_core::time::UnixMillis::UNSTAMPED,
                    command: Command::NewLeader {
                        leader: NodeId("c1".into()),
                    },
                },
                LogEntry {
                    index: LogIndex(22),
                    term: Term(5),
                    at: herder_core::time::UnixMillis::UNSTAMPED,
                    command: Command::Cancel { job_id: job() },
                },
            ],
            commit: LogIndex(20),
            seq: 3,
        },
        json!({
            "type": "APPEND",
            "term": 5,
            "prev_index": 20,
            "prev_term": 4,
            "entries": [
                {"index": 21, "term": 5, "command": {"command": "new_leader", "leader": "c1"}},
                {"index": 22, "term": 5, "command": {"command": "cancel", "job_id": JOB}},
            ],
            "commit": 20,
            "seq": 3,
        }),
    );
    // A rejection names the conflicting term; a success leaves it out.
    assert_wire_form(
        PeerMessage::AppendReply {
            term: Term(5),
            success: false,
            index: LogIndex(17),
            conflict_term: Some(Term(3)),
            seq: 3,
            abstaining: false,
        },
        json!({"type": "APPEND_REPLY", "term": 5, "success": false, "index": 17, "conflict_term": 3, "seq": 3}),
    );
    assert_wire_form(
        PeerMessage::AppendReply {
            term: Term(5),
            success: true,
            index: LogIndex(22),
            conflict_term: None,
            seq: 3,
            abstaining: false,
        },
        json!({"type": "APPEND_REPLY", "term": 5, "success": true, "index": 22, "seq": 3}),
    );
    // A member on an empty disk that has not rejoined says so (and is counted by nobody).
    assert_wire_form(
        PeerMessage::AppendReply {
            term: Term(5),
            success: true,
            index: LogIndex(22),
            conflict_term: None,
            seq: 3,
            abstaining: true,
        },
        json!({"type": "APPEND_REPLY", "term": 5, "success": true, "index": 22, "seq": 3, "abstaining": true}),
    );
    assert_wire_form(
        PeerMessage::Snapshot {
            term: Term(5),
            index: LogIndex(20),
            index_term: Term(4),
            offset: 0,
            total: 2,
            data: ChunkBytes(b"[]".to_vec()),
            seq: 3,
        },
        json!({
            "type": "SNAPSHOT",
            "term": 5,
            "index": 20,
            "index_term": 4,
            "offset": 0,
            "total": 2,
            "data": "W10=",
            "seq": 3,
        }),
    );
    assert_wire_form(
        PeerMessage::SnapshotReply {
            term: Term(5),
            index: LogIndex(20),
            received: 2,
            seq: 3,
            abstaining: false,
        },
        json!({"type": "SNAPSHOT_REPLY", "term": 5, "index": 20, "received": 2, "seq": 3}),
    );
    assert_wire_form(
        PeerMessage::TimeoutNow { term: Term(5) },
        json!({"type": "TIMEOUT_NOW", "term": 5}),
    );
}

#[test]
fn shared_tags_cross_links_as_documented() {
    // Both server-to-peer enums have ERROR and NOT_LEADER; a worker's ERROR read as a client
    // reply is a valid connection-level error (no request id), which is the intended overlap.
    let worker_error = CoordinatorToWorker::Error {
        code: ErrorCode::UnknownType,
        message: "no".into(),
    };
    let mut wire = Vec::new();
    encode_frame(&worker_error, FRAME_BYTES_MAX_DEFAULT, &mut wire).expect("encodes");
    assert_eq!(
        decode_message::<ClientReply>(&wire[FRAME_HEADER_BYTES..]),
        Ok(ClientReply::Error {
            request_id: None,
            code: ErrorCode::UnknownType,
            message: "no".into(),
        })
    );
    // CLUSTER is both a request and its reply; each is invalid (not unknown) as the other.
    let mut wire = Vec::new();
    encode_frame(
        &ClientRequest::Cluster {
            request_id: RequestId(1),
        },
        FRAME_BYTES_MAX_DEFAULT,
        &mut wire,
    )
    .expect("encodes");
    assert!(matches!(
        decode_message::<ClientReply>(&wire[FRAME_HEADER_BYTES..]),
        Err(FrameError::InvalidMessage { type_name, .. }) if type_name == "CLUSTER"
    ));
    // A worker's HEARTBEAT on the client port is an unknown type there.
    let mut wire = Vec::new();
    encode_frame(
        &WorkerToCoordinator::Heartbeat {},
        FRAME_BYTES_MAX_DEFAULT,
        &mut wire,
    )
    .expect("encodes");
    assert_eq!(
        decode_message::<ClientRequest>(&wire[FRAME_HEADER_BYTES..]),
        Err(FrameError::UnknownType {
            type_name: "HEARTBEAT".into()
        })
    );
    // A client's CANCEL on the worker port likewise.
    let mut wire = Vec::new();
    encode_frame(
        &ClientRequest::Cancel {
            request_id: RequestId(1),
            job_id: job(),
        },
        FRAME_BYTES_MAX_DEFAULT,
        &mut wire,
    )
    .expect("encodes");
    assert_eq!(
        decode_message::<WorkerToCoordinator>(&wire[FRAME_HEADER_BYTES..]),
        Err(FrameError::UnknownType {
            type_name: "CANCEL".into()
        })
    );
    // Every enum's tag list is what the tests above assume.
    for tag in WORKER_TAGS {
        assert!(WorkerToCoordinator::is_known_type(tag), "{tag}");
    }
    for tag in COORDINATOR_TAGS {
        assert!(CoordinatorToWorker::is_known_type(tag), "{tag}");
    }
    for tag in REQUEST_TAGS {
        assert!(ClientRequest::is_known_type(tag), "{tag}");
    }
    for tag in REPLY_TAGS {
        assert!(ClientReply::is_known_type(tag), "{tag}");
    }
    for tag in PEER_TAGS {
        assert!(PeerMessage::is_known_type(tag), "{tag}");
    }
    assert!(
        !ClientRequest::is_known_type("submit"),
        "tags are case-sensitive"
    );
}
