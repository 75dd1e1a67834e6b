//! Property tests for the wire protocol: every message of every link survives the frame codec,
//! carries the right `type` tag, and is refused cleanly (never with a panic) when it arrives on
//! the wrong link. A handful of fixed examples pin the exact JSON wire form, so renaming a wire
//! field or tag breaks a test rather than a deployed peer.

use std::fmt::Debug;

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

use herder_core::ids::{Attempt, Incarnation, JobId, LeaseId, NodeId, RequestId, Term, WorkerId};
use herder_core::job::JobState;
use herder_core::limits::{FRAME_BYTES_MAX_DEFAULT, FRAME_HEADER_BYTES};
use herder_core::protocol::codec::{
    decode_message, encode_frame, FrameDecoder, FrameError, WireMessage,
};
use herder_core::protocol::{
    AttemptOutcome, CancelReason, ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode,
    JobView, LeaderHint, PeerMessage, RegisterRejection, RunningAttempt, WorkerToCoordinator,
    WorkerView,
};
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
    prop_oneof![
        any::<u64>().prop_map(|milliseconds| TaskSpec::Sleep { milliseconds }),
        text().prop_map(|text| TaskSpec::WordCount { text }),
        text().prop_map(|text| TaskSpec::Sha256 { text }),
        any::<u64>().prop_map(|limit| TaskSpec::PrimeCount { limit }),
        any::<u32>().prop_map(|fail_until_attempt| TaskSpec::Fail { fail_until_attempt }),
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
    ]
}

fn attempt_outcome() -> impl Strategy<Value = AttemptOutcome> {
    prop_oneof![
        task_output().prop_map(|output| AttemptOutcome::Succeeded { output }),
        text().prop_map(|error| AttemptOutcome::Failed { error }),
        Just(AttemptOutcome::Cancelled {}),
    ]
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
    )
        .prop_map(
            |(
                (id, state, attempt, max_attempts),
                (worker, lease_id),
                task,
                result,
                error,
                idempotency_key,
            )| {
                JobView {
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
                    partition_of: None,
                    partitions: None,
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
                id,
                incarnation: Incarnation(incarnation),
                alive,
                capacity,
                running,
                last_heartbeat_millis_ago,
            },
        )
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
    let running = proptest::collection::vec(
        (job_id(), lease_id()).prop_map(|(job_id, lease_id)| RunningAttempt { job_id, lease_id }),
        0..4,
    );
    prop_oneof![
        (worker_id(), any::<u64>(), any::<u32>(), running).prop_map(
            |(worker_id, incarnation, capacity, running)| WorkerToCoordinator::Register {
                worker_id,
                incarnation: Incarnation(incarnation),
                capacity,
                running,
                finished: Vec::new(),
            }
        ),
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
        (any::<u64>(), any::<u64>()).prop_map(
            |(heartbeat_interval_millis, heartbeat_timeout_millis)| {
                CoordinatorToWorker::Registered {
                    term: Term(1),
                    members: Vec::new(),
                    heartbeat_interval_millis,
                    heartbeat_timeout_millis,
                }
            }
        ),
        (register_rejection(), text()).prop_map(|(reason, message)| {
            CoordinatorToWorker::RegisterRejected { reason, message }
        }),
        Just(CoordinatorToWorker::HeartbeatAck { term: Term(1) }),
        (
            job_id(),
            lease_id(),
            any::<u32>(),
            any::<u32>(),
            task_spec(),
            any::<u64>()
        )
            .prop_map(
                |(job_id, lease_id, attempt, max_attempts, task, timeout_millis)| {
                    CoordinatorToWorker::TaskAssign {
                        term: Term(1),
                        job_id,
                        lease_id,
                        attempt: Attempt(attempt),
                        max_attempts,
                        task,
                        timeout_millis,
                    }
                }
            ),
        (job_id(), lease_id(), cancel_reason()).prop_map(|(job_id, lease_id, reason)| {
            CoordinatorToWorker::TaskCancel {
                term: Term(1),
                job_id,
                lease_id,
                reason,
            }
        }),
        (job_id(), lease_id(), any::<bool>()).prop_map(|(job_id, lease_id, accepted)| {
            CoordinatorToWorker::ResultAck {
                term: Term(1),
                job_id,
                lease_id,
                accepted,
            }
        }),
        leader_hint().prop_map(|leader| CoordinatorToWorker::NotLeader {
            leader,
            members: Vec::new()
        }),
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
        )
            .prop_map(|(request_id, task, max_attempts, idempotency_key)| {
                ClientRequest::Submit {
                    partitions: None,
                    request_id,
                    task,
                    max_attempts,
                    idempotency_key,
                }
            }),
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
        )
            .prop_map(|(request_id, state, limit)| ClientRequest::List {
                request_id,
                state,
                limit,
            }),
        request_id().prop_map(|request_id| ClientRequest::Workers { request_id }),
    ]
}

fn client_reply() -> impl Strategy<Value = ClientReply> {
    prop_oneof![
        (request_id(), job_id(), any::<bool>()).prop_map(|(request_id, job_id, existing)| {
            ClientReply::SubmitAccepted {
                term: Term(1),
                request_id,
                job_id,
                existing,
            }
        }),
        (
            request_id(),
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            text()
        )
            .prop_map(
                |(request_id, retryable, active_jobs, max_active_jobs, message)| {
                    ClientReply::SubmitRejected {
                        request_id,
                        retryable,
                        active_jobs,
                        max_active_jobs,
                        message,
                    }
                }
            ),
        (request_id(), job_view())
            .prop_map(|(request_id, job)| ClientReply::Job { request_id, job }),
        (request_id(), job_view(), any::<bool>()).prop_map(|(request_id, job, timed_out)| {
            ClientReply::WaitResult {
                request_id,
                job,
                timed_out,
            }
        }),
        (request_id(), job_view(), any::<bool>()).prop_map(|(request_id, job, cancelled)| {
            ClientReply::CancelResult {
                term: Term(1),
                request_id,
                job,
                cancelled,
            }
        }),
        (request_id(), proptest::collection::vec(job_view(), 0..4))
            .prop_map(|(request_id, jobs)| ClientReply::JobList { request_id, jobs }),
        (request_id(), proptest::collection::vec(worker_view(), 0..4)).prop_map(
            |(request_id, workers)| ClientReply::WorkerList {
                request_id,
                workers
            }
        ),
        (request_id(), leader_hint()).prop_map(|(request_id, leader)| ClientReply::NotLeader {
            request_id,
            leader,
            uncertain: false,
            members: Vec::new()
        }),
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
    node_id().prop_map(|node_id| PeerMessage::Hello {
        node_id,
        client_address: "127.0.0.1:7071".into(),
        worker_address: "127.0.0.1:7070".into(),
    })
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
    // Tags are SCREAMING_SNAKE_CASE ASCII, as SPEC 2.3 and every peer expect.
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
const REQUEST_TAGS: [&str; 6] = ["SUBMIT", "STATUS", "WAIT", "CANCEL", "LIST", "WORKERS"];
const REPLY_TAGS: [&str; 9] = [
    "SUBMIT_ACCEPTED",
    "SUBMIT_REJECTED",
    "JOB",
    "WAIT_RESULT",
    "CANCEL_RESULT",
    "JOB_LIST",
    "WORKER_LIST",
    "NOT_LEADER",
    "ERROR",
];
const PEER_TAGS: [&str; 1] = ["HELLO"];

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
    fn a_submitted_spec_in_wire_form_parses_back_to_itself(spec in task_spec()) {
        // `to_json` is documented as identical to the derived `Serialize`.
        prop_assert_eq!(spec.to_json(), serde_json::to_value(&spec).expect("specs serialize"));
        // And a valid spec is accepted back by the strict parser unchanged.
        if spec.validate().is_ok() {
            prop_assert_eq!(TaskSpec::from_json(&spec.to_json()), Ok(spec));
        }
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
        CoordinatorToWorker::HeartbeatAck { term: Term(1) },
        json!({"type": "HEARTBEAT_ACK"}),
    );
}

#[test]
fn register_wire_form_and_running_defaults_to_empty() {
    assert_wire_form(
        WorkerToCoordinator::Register {
            worker_id: WorkerId("worker-1".into()),
            incarnation: Incarnation(7),
            capacity: 4,
            running: vec![RunningAttempt {
                job_id: job(),
                lease_id: lease(),
            }],
            finished: Vec::new(),
        },
        json!({
            "type": "REGISTER",
            "worker_id": "worker-1",
            "incarnation": "0000000000000007",
            "capacity": 4,
            "running": [{"job_id": JOB, "lease_id": LEASE}],
            "finished": [],
        }),
    );
    // An older worker may leave `running` out.
    let text =
        br#"{"type":"REGISTER","worker_id":"w","incarnation":"00000000000000ff","capacity":2}"#;
    assert_eq!(
        decode_message::<WorkerToCoordinator>(text),
        Ok(WorkerToCoordinator::Register {
            worker_id: WorkerId("w".into()),
            incarnation: Incarnation(255),
            capacity: 2,
            running: vec![],
            finished: Vec::new(),
        })
    );
}

#[test]
fn incarnations_travel_as_sixteen_hex_digits() {
    // A random 64-bit number does not survive JSON parsers that read numbers as doubles.
    assert_wire_form(
        WorkerToCoordinator::Register {
            worker_id: WorkerId("w".into()),
            incarnation: Incarnation(u64::MAX),
            capacity: 1,
            running: vec![],
            finished: Vec::new(),
        },
        json!({
            "type": "REGISTER",
            "worker_id": "w",
            "incarnation": "ffffffffffffffff",
            "capacity": 1,
            "running": [],
            "finished": [],
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
            term: Term(1),
            job_id: job(),
            lease_id: lease(),
            attempt: Attempt(2),
            max_attempts: 3,
            task: TaskSpec::Sha256 { text: "abc".into() },
            timeout_millis: 600_000,
        },
        json!({
            "type": "TASK_ASSIGN",
            "job_id": JOB,
            "lease_id": LEASE,
            "attempt": 2,
            "max_attempts": 3,
            "task": {"kind": "sha256", "text": "abc"},
            "timeout_millis": 600_000,
        }),
    );
    assert_wire_form(
        CoordinatorToWorker::Registered {
            term: Term(1),
            members: Vec::new(),
            heartbeat_interval_millis: 2_000,
            heartbeat_timeout_millis: 6_000,
        },
        json!({"type": "REGISTERED", "heartbeat_interval_millis": 2000, "heartbeat_timeout_millis": 6000}),
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
            term: Term(1),
            job_id: job(),
            lease_id: lease(),
            reason: CancelReason::DeadlineExpired,
        },
        json!({"type": "TASK_CANCEL", "job_id": JOB, "lease_id": LEASE, "reason": "DEADLINE_EXPIRED"}),
    );
    assert_wire_form(
        CoordinatorToWorker::ResultAck {
            term: Term(1),
            job_id: job(),
            lease_id: lease(),
            accepted: false,
        },
        json!({"type": "RESULT_ACK", "job_id": JOB, "lease_id": LEASE, "accepted": false}),
    );
    assert_wire_form(
        CoordinatorToWorker::NotLeader {
            leader: Some(LeaderHint {
                node_id: NodeId("c2".into()),
                address: "10.0.0.2:7070".into(),
            }),
        },
        json!({"type": "NOT_LEADER", "leader": {"node_id": "c2", "address": "10.0.0.2:7070"}}),
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
            partitions: None,
            request_id: RequestId(5),
            task: TaskSpec::Sleep { milliseconds: 250 }.to_json(),
            max_attempts: Some(4),
            idempotency_key: Some("order-17".into()),
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
            partitions: None,
            request_id: RequestId(6),
            task: TaskSpec::Fail {
                fail_until_attempt: 2,
            }
            .to_json(),
            max_attempts: None,
            idempotency_key: None,
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
            term: Term(1),
            request_id: RequestId(5),
            job_id: job(),
            existing: false,
        },
        json!({"type": "SUBMIT_ACCEPTED", "request_id": 5, "job_id": JOB, "existing": false}),
    );
    assert_wire_form(
        ClientReply::SubmitRejected {
            request_id: RequestId(6),
            retryable: true,
            active_jobs: 10,
            max_active_jobs: 10,
            message: "full".into(),
        },
        json!({
            "type": "SUBMIT_REJECTED",
            "request_id": 6,
            "retryable": true,
            "active_jobs": 10,
            "max_active_jobs": 10,
            "message": "full",
        }),
    );
    assert_wire_form(
        ClientReply::Job {
            request_id: RequestId(7),
            job: JobView {
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
            },
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
            },
        }),
    );
    assert_wire_form(
        ClientReply::WorkerList {
            request_id: RequestId(8),
            workers: vec![WorkerView {
                id: WorkerId("worker-2".into()),
                incarnation: Incarnation(9),
                alive: true,
                capacity: 4,
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
                "running": 1,
                "last_heartbeat_millis_ago": 12,
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
    assert_wire_form(
        ClientReply::NotLeader {
            request_id: RequestId(9),
            leader: None,
            uncertain: false,
            members: Vec::new(),
        },
        json!({"type": "NOT_LEADER", "request_id": 9, "leader": null}),
    );
}

#[test]
fn peer_hello_wire_form() {
    assert_wire_form(
        PeerMessage::Hello {
            node_id: NodeId("coordinator-1".into()),
        },
        json!({"type": "HELLO", "node_id": "coordinator-1"}),
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
