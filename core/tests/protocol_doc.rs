//! Keeps `docs/PROTOCOL.md` honest.
//!
//! - Every ```` ```json ```` block is one whole message. It must decode with the real codec as
//!   at least one of the five message enums, and encoding what was decoded must give back the
//!   same JSON (so the examples show exactly what Herder sends, field for field).
//! - Every wire tag of every enum needs at least one such example, decoded as that enum.
//! - Every ```` ```jsonc ```` block is a nested type (a task, an output, a job view...). It must
//!   decode as one of them and encode back to the same JSON.
//! - Every task kind, task output kind and attempt outcome has an example, and every value of
//!   the small wire enums (job states, error codes, ...) is mentioned.
//!
//! Renaming a field or a tag, or deleting an example, makes this test fail until the document
//! is updated.

use std::collections::BTreeSet;

use herder_core::job::JobState;
use herder_core::protocol::codec::{decode_message, FrameError, WireMessage};
use herder_core::protocol::{
    AttemptOutcome, CancelReason, ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode,
    JobView, LeaderHint, PeerMessage, RegisterRejection, RunningAttempt, WorkerToCoordinator,
    WorkerView,
};
use herder_core::tasks::{TaskOutput, TaskSpec, TASK_KINDS};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md");

fn doc() -> String {
    std::fs::read_to_string(DOC_PATH)
        .unwrap_or_else(|error| panic!("cannot read {DOC_PATH}: {error}"))
}

// The wire tags, as listed in `core/src/protocol/messages.rs`. When you add a message, add its
// tag here and an example to the document; the exhaustive `tag_of_*` functions below stop
// compiling until the new variant is named there too.
const WORKER_TO_COORDINATOR: &[&str] = &["REGISTER", "HEARTBEAT", "TASK_RESULT"];
const COORDINATOR_TO_WORKER: &[&str] = &[
    "REGISTERED",
    "REGISTER_REJECTED",
    "HEARTBEAT_ACK",
    "TASK_ASSIGN",
    "TASK_CANCEL",
    "RESULT_ACK",
    "NOT_LEADER",
    "ERROR",
];
const CLIENT_REQUEST: &[&str] = &["SUBMIT", "STATUS", "WAIT", "CANCEL", "LIST", "WORKERS"];
const CLIENT_REPLY: &[&str] = &[
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
const PEER_MESSAGE: &[&str] = &["HELLO"];

/// Task output kinds (`TaskOutput`'s wire names).
const OUTPUT_KINDS: [&str; 5] = ["slept", "word-count", "sha256", "prime-count", "succeeded"];

const ERROR_CODES: [ErrorCode; 14] = [
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
];

/// The codes after which the connection is closed (`ErrorCode::closes_connection`): the
/// frame-level ones, and `NOT_REGISTERED`.
const FRAME_LEVEL_CODES: [&str; 8] = [
    "FRAME_TOO_LARGE",
    "EMPTY_FRAME",
    "INVALID_UTF8",
    "INVALID_JSON",
    "MISSING_TYPE",
    "UNKNOWN_TYPE",
    "INVALID_MESSAGE",
    "NOT_REGISTERED",
];

fn tag_of_worker_to_coordinator(message: &WorkerToCoordinator) -> &'static str {
    match message {
        WorkerToCoordinator::Register { .. } => "REGISTER",
        WorkerToCoordinator::Heartbeat {} => "HEARTBEAT",
        WorkerToCoordinator::TaskResult { .. } => "TASK_RESULT",
    }
}

fn tag_of_coordinator_to_worker(message: &CoordinatorToWorker) -> &'static str {
    match message {
        CoordinatorToWorker::Registered { .. } => "REGISTERED",
        CoordinatorToWorker::RegisterRejected { .. } => "REGISTER_REJECTED",
        CoordinatorToWorker::HeartbeatAck { term: Term(1) } => "HEARTBEAT_ACK",
        CoordinatorToWorker::TaskAssign { .. } => "TASK_ASSIGN",
        CoordinatorToWorker::TaskCancel { .. } => "TASK_CANCEL",
        CoordinatorToWorker::ResultAck { .. } => "RESULT_ACK",
        CoordinatorToWorker::NotLeader { .. } => "NOT_LEADER",
        CoordinatorToWorker::Error { .. } => "ERROR",
    }
}

fn tag_of_client_request(message: &ClientRequest) -> &'static str {
    match message {
        ClientRequest::Submit { .. } => "SUBMIT",
        ClientRequest::Status { .. } => "STATUS",
        ClientRequest::Wait { .. } => "WAIT",
        ClientRequest::Cancel { .. } => "CANCEL",
        ClientRequest::List { .. } => "LIST",
        ClientRequest::Workers { .. } => "WORKERS",
    }
}

fn tag_of_client_reply(message: &ClientReply) -> &'static str {
    match message {
        ClientReply::SubmitAccepted { .. } => "SUBMIT_ACCEPTED",
        ClientReply::SubmitRejected { .. } => "SUBMIT_REJECTED",
        ClientReply::Job { .. } => "JOB",
        ClientReply::WaitResult { .. } => "WAIT_RESULT",
        ClientReply::CancelResult { .. } => "CANCEL_RESULT",
        ClientReply::JobList { .. } => "JOB_LIST",
        ClientReply::WorkerList { .. } => "WORKER_LIST",
        ClientReply::NotLeader { .. } => "NOT_LEADER",
        ClientReply::Error { .. } => "ERROR",
    }
}

fn tag_of_peer_message(message: &PeerMessage) -> &'static str {
    match message {
        PeerMessage::Hello { .. } => "HELLO",
    }
}

fn status_of(outcome: &AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Succeeded { .. } => "succeeded",
        AttemptOutcome::Failed { .. } => "failed",
        AttemptOutcome::Cancelled {} => "cancelled",
    }
}

/// One fenced code block of the document.
struct Block {
    /// 1-based line of the opening fence.
    line: usize,
    /// The fence's info string, e.g. `json`.
    info: String,
    text: String,
}

fn fenced_blocks(doc: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (index, line) in doc.lines().enumerate() {
        let trimmed = line.trim();
        match open.as_mut() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some(Block {
                        line: index + 1,
                        info: info.trim().to_owned(),
                        text: String::new(),
                    });
                }
            }
            Some(block) => {
                if trimmed == "```" {
                    blocks.extend(open.take());
                } else {
                    block.text.push_str(line);
                    block.text.push('\n');
                }
            }
        }
    }
    if let Some(block) = open {
        panic!("{DOC_PATH}:{}: code block is never closed", block.line);
    }
    blocks
}

fn blocks_tagged<'a>(blocks: &'a [Block], info: &str) -> Vec<&'a Block> {
    blocks.iter().filter(|block| block.info == info).collect()
}

/// A message as decoded from one example.
enum Decoded {
    WorkerToCoordinator(WorkerToCoordinator),
    CoordinatorToWorker(CoordinatorToWorker),
    ClientRequest(ClientRequest),
    ClientReply(ClientReply),
    PeerMessage(PeerMessage),
}

impl Decoded {
    fn enum_name(&self) -> &'static str {
        match self {
            Decoded::WorkerToCoordinator(_) => "WorkerToCoordinator",
            Decoded::CoordinatorToWorker(_) => "CoordinatorToWorker",
            Decoded::ClientRequest(_) => "ClientRequest",
            Decoded::ClientReply(_) => "ClientReply",
            Decoded::PeerMessage(_) => "PeerMessage",
        }
    }

    /// The tag according to the exhaustive matches above.
    fn listed_tag(&self) -> &'static str {
        match self {
            Decoded::WorkerToCoordinator(m) => tag_of_worker_to_coordinator(m),
            Decoded::CoordinatorToWorker(m) => tag_of_coordinator_to_worker(m),
            Decoded::ClientRequest(m) => tag_of_client_request(m),
            Decoded::ClientReply(m) => tag_of_client_reply(m),
            Decoded::PeerMessage(m) => tag_of_peer_message(m),
        }
    }

    /// The tag according to the codec.
    fn wire_tag(&self) -> &'static str {
        match self {
            Decoded::WorkerToCoordinator(m) => m.type_name(),
            Decoded::CoordinatorToWorker(m) => m.type_name(),
            Decoded::ClientRequest(m) => m.type_name(),
            Decoded::ClientReply(m) => m.type_name(),
            Decoded::PeerMessage(m) => m.type_name(),
        }
    }
}

/// Decodes `text` as `M` with the real codec and checks that it encodes back to `value`.
fn decode_as<M: WireMessage>(text: &str, value: &Value) -> Result<M, String> {
    let message = decode_message::<M>(text.as_bytes())
        .map_err(|error: FrameError| format!("{} ({error})", error.code()))?;
    let encoded = serde_json::to_value(&message).map_err(|error| error.to_string())?;
    if encoded != *value {
        return Err(format!(
            "decodes, but Herder would send it differently:\n{}",
            pretty(&encoded)
        ));
    }
    Ok(message)
}

/// Decodes `value` as the nested type `T` and checks that it encodes back unchanged.
fn nested_as<T: Serialize + DeserializeOwned>(value: &Value) -> Result<T, String> {
    let decoded: T = serde_json::from_value(value.clone()).map_err(|error| error.to_string())?;
    let encoded = serde_json::to_value(&decoded).map_err(|error| error.to_string())?;
    if encoded != *value {
        return Err(format!("encodes differently:\n{}", pretty(&encoded)));
    }
    Ok(decoded)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// Every way `text` decodes as a whole message, or why it decodes as none.
fn decode_block(text: &str) -> Result<Vec<Decoded>, String> {
    let value: Value =
        serde_json::from_str(text).map_err(|error| format!("not one JSON value: {error}"))?;
    if !value.get("type").is_some_and(Value::is_string) {
        return Err("not an object with a string \"type\"".to_owned());
    }
    let attempts = [
        (
            "WorkerToCoordinator",
            decode_as::<WorkerToCoordinator>(text, &value).map(Decoded::WorkerToCoordinator),
        ),
        (
            "CoordinatorToWorker",
            decode_as::<CoordinatorToWorker>(text, &value).map(Decoded::CoordinatorToWorker),
        ),
        (
            "ClientRequest",
            decode_as::<ClientRequest>(text, &value).map(Decoded::ClientRequest),
        ),
        (
            "ClientReply",
            decode_as::<ClientReply>(text, &value).map(Decoded::ClientReply),
        ),
        (
            "PeerMessage",
            decode_as::<PeerMessage>(text, &value).map(Decoded::PeerMessage),
        ),
    ];
    let mut decoded = Vec::new();
    let mut errors = Vec::new();
    for (name, attempt) in attempts {
        match attempt {
            Ok(message) => decoded.push(message),
            Err(error) => errors.push(format!("  as {name}: {error}")),
        }
    }
    if decoded.is_empty() {
        return Err(format!(
            "decodes as no message enum:\n{}",
            errors.join("\n")
        ));
    }
    Ok(decoded)
}

#[test]
fn every_json_block_is_a_message_herder_sends_and_every_tag_has_one() {
    let blocks = fenced_blocks(&doc());
    let json = blocks_tagged(&blocks, "json");
    assert!(!json.is_empty(), "{DOC_PATH} has no ```json blocks");

    let mut problems = Vec::new();
    let mut covered: BTreeSet<(&'static str, &'static str)> = BTreeSet::new();
    let mut outcomes: BTreeSet<&'static str> = BTreeSet::new();
    for block in &json {
        let decoded = match decode_block(&block.text) {
            Ok(decoded) => decoded,
            Err(error) => {
                problems.push(format!("{DOC_PATH}:{}: {error}", block.line));
                continue;
            }
        };
        for message in &decoded {
            if message.listed_tag() != message.wire_tag() {
                problems.push(format!(
                    "{DOC_PATH}:{}: {} variant is tagged {:?} on the wire but {:?} in this test",
                    block.line,
                    message.enum_name(),
                    message.wire_tag(),
                    message.listed_tag()
                ));
            }
            covered.insert((message.enum_name(), message.wire_tag()));
            if let Decoded::WorkerToCoordinator(WorkerToCoordinator::TaskResult {
                outcome, ..
            }) = message
            {
                outcomes.insert(status_of(outcome));
            }
        }
    }

    let lists = [
        ("WorkerToCoordinator", WORKER_TO_COORDINATOR),
        ("CoordinatorToWorker", COORDINATOR_TO_WORKER),
        ("ClientRequest", CLIENT_REQUEST),
        ("ClientReply", CLIENT_REPLY),
        ("PeerMessage", PEER_MESSAGE),
    ];
    for (enum_name, tags) in lists {
        for &tag in tags {
            if !covered.contains(&(enum_name, tag)) {
                problems.push(format!(
                    "{DOC_PATH}: no ```json example of {enum_name} {tag}"
                ));
            }
        }
    }
    for status in ["succeeded", "failed", "cancelled"] {
        if !outcomes.contains(status) {
            problems.push(format!(
                "{DOC_PATH}: no TASK_RESULT example with outcome status {status:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n\n"));
}

#[test]
fn the_tag_lists_match_the_codec() {
    fn check<M: WireMessage>(name: &str, tags: &[&str], problems: &mut Vec<String>) {
        for tag in tags {
            if !M::is_known_type(tag) {
                problems.push(format!("{name} does not accept the tag {tag:?}"));
            }
        }
    }
    let mut problems = Vec::new();
    check::<WorkerToCoordinator>("WorkerToCoordinator", WORKER_TO_COORDINATOR, &mut problems);
    check::<CoordinatorToWorker>("CoordinatorToWorker", COORDINATOR_TO_WORKER, &mut problems);
    check::<ClientRequest>("ClientRequest", CLIENT_REQUEST, &mut problems);
    check::<ClientReply>("ClientReply", CLIENT_REPLY, &mut problems);
    check::<PeerMessage>("PeerMessage", PEER_MESSAGE, &mut problems);
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn every_jsonc_block_is_a_nested_type_and_every_kind_has_one() {
    let blocks = fenced_blocks(&doc());
    let mut problems = Vec::new();
    let mut task_kinds = BTreeSet::new();
    let mut output_kinds = BTreeSet::new();
    for block in blocks_tagged(&blocks, "jsonc") {
        let value: Value = match serde_json::from_str(&block.text) {
            Ok(value) => value,
            Err(error) => {
                problems.push(format!(
                    "{DOC_PATH}:{}: not one plain JSON value (no comments, please): {error}",
                    block.line
                ));
                continue;
            }
        };
        let mut errors = Vec::new();
        let mut matched = false;
        // Tasks go through the coordinator's strict parser, bounds included.
        match TaskSpec::from_json(&value) {
            Ok(spec) if spec.to_json() == value => {
                task_kinds.insert(spec.kind());
                matched = true;
            }
            Ok(spec) => errors.push(format!(
                "  as TaskSpec: encodes differently:\n{}",
                pretty(&spec.to_json())
            )),
            Err(error) => errors.push(format!("  as TaskSpec: {error}")),
        }
        match nested_as::<TaskOutput>(&value) {
            Ok(_) => {
                if let Some(kind) = value.get("kind").and_then(Value::as_str) {
                    output_kinds.insert(kind.to_owned());
                }
                matched = true;
            }
            Err(error) => errors.push(format!("  as TaskOutput: {error}")),
        }
        let others = [
            ("AttemptOutcome", nested_as::<AttemptOutcome>(&value).err()),
            ("RunningAttempt", nested_as::<RunningAttempt>(&value).err()),
            ("JobView", nested_as::<JobView>(&value).err()),
            ("WorkerView", nested_as::<WorkerView>(&value).err()),
            ("LeaderHint", nested_as::<LeaderHint>(&value).err()),
        ];
        for (name, error) in others {
            match error {
                None => matched = true,
                Some(error) => errors.push(format!("  as {name}: {error}")),
            }
        }
        if !matched {
            problems.push(format!(
                "{DOC_PATH}:{}: decodes as no nested type:\n{}",
                block.line,
                errors.join("\n")
            ));
        }
    }
    for kind in TASK_KINDS {
        if !task_kinds.contains(kind) {
            problems.push(format!(
                "{DOC_PATH}: no ```jsonc example of a {kind:?} task"
            ));
        }
    }
    for kind in OUTPUT_KINDS {
        if !output_kinds.contains(kind) {
            problems.push(format!(
                "{DOC_PATH}: no ```jsonc example of a {kind:?} task output"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n\n"));
}

/// The wire spelling of a unit enum value, e.g. `RETRY_WAIT`.
fn wire_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        other => panic!("not a string on the wire: {other:?}"),
    }
}

#[test]
fn every_enum_value_is_documented() {
    let mut names: Vec<String> = Vec::new();
    names.extend(JobState::ALL.iter().map(wire_name));
    names.extend(ERROR_CODES.iter().map(wire_name));
    names.extend(
        [
            RegisterRejection::DuplicateWorkerId,
            RegisterRejection::InvalidRegistration,
            RegisterRejection::TooManyWorkers,
        ]
        .iter()
        .map(wire_name),
    );
    names.extend(
        [
            CancelReason::JobCancelled,
            CancelReason::DeadlineExpired,
            CancelReason::LeaseNotCurrent,
        ]
        .iter()
        .map(wire_name),
    );
    let doc = doc();
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "{DOC_PATH} never mentions these wire values: {missing:?}"
    );
}

/// Claims of the "Encoding conventions" and "Errors" sections that are easy to get wrong.
#[test]
fn documented_conventions_hold() {
    // A missing optional field and an explicit null both mean "absent".
    let missing = decode_message::<CoordinatorToWorker>(br#"{"type":"NOT_LEADER"}"#);
    let null = decode_message::<CoordinatorToWorker>(br#"{"type":"NOT_LEADER","leader":null}"#);
    assert_eq!(missing, Ok(CoordinatorToWorker::NotLeader { leader: None }));
    assert_eq!(missing, null);
    let wait = br#"{"type":"WAIT","request_id":1,"job_id":"3b445e59-8733-4c0c-b6a3-1540e701c710","timeout_millis":null}"#;
    assert!(decode_message::<ClientRequest>(wait).is_ok());
    // `running` may be omitted from REGISTER.
    let register =
        br#"{"type":"REGISTER","worker_id":"worker-1","incarnation":"669ab30533a7dd85","capacity":4}"#;
    assert!(matches!(
        decode_message::<WorkerToCoordinator>(register),
        Ok(WorkerToCoordinator::Register { running, .. }) if running.is_empty()
    ));

    let code = |payload: &[u8]| decode_message::<ClientRequest>(payload).map_err(|e| e.code());
    // Integers: no fraction, no exponent, no sign, no quotes.
    for number in ["1.0", "1e3", "-1", "\"5\""] {
        let payload = format!(r#"{{"type":"WORKERS","request_id":{number}}}"#);
        assert_eq!(code(payload.as_bytes()), Err("INVALID_MESSAGE"), "{number}");
    }
    // Unknown fields are refused.
    assert_eq!(
        code(br#"{"type":"WORKERS","request_id":1,"verbose":true}"#),
        Err("INVALID_MESSAGE")
    );
    // A type from another link is unknown here.
    assert_eq!(code(br#"{"type":"HEARTBEAT"}"#), Err("UNKNOWN_TYPE"));
    assert_eq!(code(br#"{"type":7}"#), Err("MISSING_TYPE"));
    assert_eq!(
        code(br#"[{"type":"WORKERS","request_id":1}]"#),
        Err("INVALID_JSON")
    );
    assert_eq!(
        code(b"{\"type\":\"WORKERS\",\"x\":\"\xff\"}"),
        Err("INVALID_UTF8")
    );
    // SUBMIT's task is free-form at this stage (checked later, as INVALID_TASK).
    assert!(
        decode_message::<ClientRequest>(br#"{"type":"SUBMIT","request_id":1,"task":42}"#).is_ok()
    );
    // Integers use the full u64 range exactly.
    let big =
        br#"{"type":"REGISTER","worker_id":"w","incarnation":"ffffffffffffffff","capacity":1}"#;
    assert!(matches!(
        decode_message::<WorkerToCoordinator>(big),
        Ok(WorkerToCoordinator::Register { incarnation, .. }) if incarnation.0 == u64::MAX
    ));
    // Section 4.3: `closes_connection()` is true for exactly the seven frame-level codes.
    // (The coordinator also closes after NOT_REGISTERED; the document says so separately.)
    for code in ERROR_CODES {
        let frame_level = FRAME_LEVEL_CODES.contains(&wire_name(&code).as_str());
        assert_eq!(code.closes_connection(), frame_level, "{code:?}");
    }
}
