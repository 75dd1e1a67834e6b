//! Keeps `docs/PROTOCOL.md` honest.
//!
//! - Every ```` ```json ```` block is one whole message. It must decode with the real codec as
//!   at least one of the seven message enums (the five of the three links and the two of the
//!   authentication handshake), and encoding what was decoded must give back the same JSON,
//!   text for text as the encoder pretty-prints it (so the examples show exactly what Herder
//!   sends, field for field and in the encoder's field order).
//! - Every wire tag of every enum needs at least one such example, decoded as that enum, and so
//!   do a few shapes worth showing (an uncertain `NOT_LEADER`, a heartbeat `APPEND`, ...).
//! - Every ```` ```jsonc ```` block is a nested type (a task, an output, a job view, a log
//!   entry...). It must decode as one of them and encode back to the same JSON.
//! - Every task kind, task output kind, attempt outcome and log command has an example, every
//!   complete snapshot example decodes to job rows, and every value of the small wire enums
//!   (job states, error codes, roles, ...) is mentioned.
//! - The handshake example is one Herder computes, with the proofs built as the document says,
//!   and the requests each token role allows are those the document lists.
//!
//! Renaming a field or a tag, or deleting an example, makes this test fail until the document
//! is updated.

use std::collections::BTreeSet;
use std::sync::Arc;

use herder_core::auth::{
    AcceptPolicy, Acceptor, AcceptorStep, AuthReply, AuthRequest, Credential, Initiator,
    InitiatorStep, Nonce, Proof, Role, Secret, SecretLink,
};
use herder_core::command::{Command, LogEntry};
use herder_core::job::{Job, JobState};
use herder_core::limits::HANDSHAKE_FRAME_BYTES_MAX;
use herder_core::protocol::codec::{decode_message, FrameError, WireMessage};
use herder_core::protocol::{
    AttemptOutcome, CancelReason, ClientReply, ClientRequest, ClusterView, CoordinatorToWorker,
    ErrorCode, JobView, LeaderHint, MemberView, PeerMessage, RegisterRejection, RunningAttempt,
    WorkerToCoordinator, WorkerView,
};
use herder_core::replica::RoleKind;
use herder_core::table::decode_snapshot;
use herder_core::tasks::{check_task_name, TaskOutput, TaskSpec, EXEC_KIND, TASK_KINDS};
use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use sha2::Sha256;

const DOC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/PROTOCOL.md");

fn doc() -> String {
    std::fs::read_to_string(DOC_PATH)
        .unwrap_or_else(|error| panic!("cannot read {DOC_PATH}: {error}"))
}

// The wire tags, as listed in `core/src/protocol/messages.rs` (and, for the handshake, in
// `core/src/auth/handshake.rs`). When you add a message, add its
// tag here and an example to the document; the exhaustive `tag_of_*` functions below stop
// compiling until the new variant is named there too.
const WORKER_TO_COORDINATOR: &[&str] = &[
    "REGISTER",
    "HEARTBEAT",
    "DRAINING",
    "PROGRESS",
    "TASK_RESULT",
];
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
const CLIENT_REQUEST: &[&str] = &[
    "SUBMIT",
    "SUBMIT_BATCH",
    "STATUS",
    "WAIT",
    "CANCEL",
    "LIST",
    "WORKERS",
    "QUEUES",
    "SET_QUEUE",
    "CLUSTER",
    "TRANSFER_LEADER",
    "PURGE",
];
const CLIENT_REPLY: &[&str] = &[
    "SUBMIT_ACCEPTED",
    "SUBMIT_REJECTED",
    "SUBMIT_BATCH_RESULT",
    "JOB",
    "WAIT_RESULT",
    "CANCEL_RESULT",
    "JOB_LIST",
    "WORKER_LIST",
    "QUEUE_LIST",
    "QUEUE_SET",
    "NOT_LEADER",
    "CLUSTER",
    "TRANSFER_STARTED",
    "PURGED",
    "ERROR",
];
const PEER_MESSAGE: &[&str] = &[
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
const AUTH_REQUEST: &[&str] = &["AUTH_HELLO", "AUTH_PROOF", "AUTH_TOKEN"];
const AUTH_REPLY: &[&str] = &["AUTH_CHALLENGE", "AUTH_OK", "AUTH_ERROR"];

/// Task output kinds (`TaskOutput`'s wire names).
const OUTPUT_KINDS: [&str; 10] = [
    "value",
    "exec",
    "slept",
    "word-count",
    "sha256",
    "prime-count",
    "succeeded",
    "max",
    "prime-count-list",
    "prime-sum",
];

/// Log commands (`Command`'s wire names, the `"command"` tag of a log entry).
const COMMAND_KINDS: &[&str] = &[
    "submit",
    "assign",
    "complete",
    "attempt_failed",
    "requeue",
    "cancel",
    "abandon",
    "release",
    "new_leader",
    "purge",
    "set_queue",
];

/// Shapes of a message that are worth an example of their own, beyond one per tag.
const SHAPES: &[&str] = &[
    "REGISTERED with members",
    "worker NOT_LEADER with members",
    "client NOT_LEADER with members",
    "client NOT_LEADER uncertain",
    "TRANSFER_LEADER with to",
    "TRANSFER_LEADER without to",
    "PRE_VOTE_REPLY granted",
    "PRE_VOTE_REPLY refused",
    "APPEND with entries",
    "APPEND heartbeat",
    "APPEND_REPLY success",
    "APPEND_REPLY refusal with conflict_term",
    "APPEND_REPLY refusal without conflict_term",
    "AUTH_OK with name and role",
    "AUTH_OK without name and role",
];

const ERROR_CODES: [ErrorCode; 18] = [
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
    ErrorCode::TooManyConnections,
    ErrorCode::Unauthenticated,
    ErrorCode::Forbidden,
    ErrorCode::TooManyQueues,
];

/// The codes after which the connection is closed (`ErrorCode::closes_connection`): the
/// frame-level ones, `NOT_REGISTERED`, `TOO_MANY_CONNECTIONS` and `UNAUTHENTICATED`.
const CLOSING_CODES: [&str; 10] = [
    "FRAME_TOO_LARGE",
    "EMPTY_FRAME",
    "INVALID_UTF8",
    "INVALID_JSON",
    "MISSING_TYPE",
    "UNKNOWN_TYPE",
    "INVALID_MESSAGE",
    "NOT_REGISTERED",
    "TOO_MANY_CONNECTIONS",
    "UNAUTHENTICATED",
];

/// The least role each client request needs, as the table of section 1.1 lists them.
const ROLE_NEEDED: &[(&str, &str)] = &[
    ("STATUS", "reader"),
    ("WAIT", "reader"),
    ("LIST", "reader"),
    ("WORKERS", "reader"),
    ("CLUSTER", "reader"),
    ("QUEUES", "reader"),
    ("SUBMIT", "submitter"),
    ("SUBMIT_BATCH", "submitter"),
    ("CANCEL", "submitter"),
    ("PURGE", "admin"),
    ("TRANSFER_LEADER", "admin"),
    ("SET_QUEUE", "admin"),
];

/// The secret of the handshake example in section 1.1.
const EXAMPLE_SECRET: &str = "worker-secret-for-the-example-only";

fn tag_of_worker_to_coordinator(message: &WorkerToCoordinator) -> &'static str {
    match message {
        WorkerToCoordinator::Register { .. } => "REGISTER",
        WorkerToCoordinator::Heartbeat {} => "HEARTBEAT",
        WorkerToCoordinator::Draining {} => "DRAINING",
        WorkerToCoordinator::Progress { .. } => "PROGRESS",
        WorkerToCoordinator::TaskResult { .. } => "TASK_RESULT",
    }
}

fn tag_of_coordinator_to_worker(message: &CoordinatorToWorker) -> &'static str {
    match message {
        CoordinatorToWorker::Registered { .. } => "REGISTERED",
        CoordinatorToWorker::RegisterRejected { .. } => "REGISTER_REJECTED",
        CoordinatorToWorker::HeartbeatAck { .. } => "HEARTBEAT_ACK",
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
        ClientRequest::SubmitBatch { .. } => "SUBMIT_BATCH",
        ClientRequest::Status { .. } => "STATUS",
        ClientRequest::Wait { .. } => "WAIT",
        ClientRequest::Cancel { .. } => "CANCEL",
        ClientRequest::List { .. } => "LIST",
        ClientRequest::Workers { .. } => "WORKERS",
        ClientRequest::Queues { .. } => "QUEUES",
        ClientRequest::SetQueue { .. } => "SET_QUEUE",
        ClientRequest::Cluster { .. } => "CLUSTER",
        ClientRequest::TransferLeader { .. } => "TRANSFER_LEADER",
        ClientRequest::Purge { .. } => "PURGE",
    }
}

fn tag_of_client_reply(message: &ClientReply) -> &'static str {
    match message {
        ClientReply::SubmitAccepted { .. } => "SUBMIT_ACCEPTED",
        ClientReply::SubmitRejected { .. } => "SUBMIT_REJECTED",
        ClientReply::SubmitBatchResult { .. } => "SUBMIT_BATCH_RESULT",
        ClientReply::Job { .. } => "JOB",
        ClientReply::WaitResult { .. } => "WAIT_RESULT",
        ClientReply::CancelResult { .. } => "CANCEL_RESULT",
        ClientReply::JobList { .. } => "JOB_LIST",
        ClientReply::WorkerList { .. } => "WORKER_LIST",
        ClientReply::QueueList { .. } => "QUEUE_LIST",
        ClientReply::QueueSet { .. } => "QUEUE_SET",
        ClientReply::NotLeader { .. } => "NOT_LEADER",
        ClientReply::Cluster { .. } => "CLUSTER",
        ClientReply::TransferStarted { .. } => "TRANSFER_STARTED",
        ClientReply::Purged { .. } => "PURGED",
        ClientReply::Error { .. } => "ERROR",
    }
}

fn tag_of_peer_message(message: &PeerMessage) -> &'static str {
    match message {
        PeerMessage::Hello { .. } => "HELLO",
        PeerMessage::PreVote { .. } => "PRE_VOTE",
        PeerMessage::PreVoteReply { .. } => "PRE_VOTE_REPLY",
        PeerMessage::Vote { .. } => "VOTE",
        PeerMessage::VoteReply { .. } => "VOTE_REPLY",
        PeerMessage::Append { .. } => "APPEND",
        PeerMessage::AppendReply { .. } => "APPEND_REPLY",
        PeerMessage::Snapshot { .. } => "SNAPSHOT",
        PeerMessage::SnapshotReply { .. } => "SNAPSHOT_REPLY",
        PeerMessage::TimeoutNow { .. } => "TIMEOUT_NOW",
    }
}

fn tag_of_auth_request(message: &AuthRequest) -> &'static str {
    match message {
        AuthRequest::AuthHello { .. } => "AUTH_HELLO",
        AuthRequest::AuthProof { .. } => "AUTH_PROOF",
        AuthRequest::AuthToken { .. } => "AUTH_TOKEN",
    }
}

fn tag_of_auth_reply(message: &AuthReply) -> &'static str {
    match message {
        AuthReply::AuthChallenge { .. } => "AUTH_CHALLENGE",
        AuthReply::AuthOk { .. } => "AUTH_OK",
        AuthReply::AuthError { .. } => "AUTH_ERROR",
    }
}

fn kind_of_command(command: &Command) -> &'static str {
    match command {
        Command::Submit { .. } => "submit",
        Command::Assign { .. } => "assign",
        Command::Complete { .. } => "complete",
        Command::AttemptFailed { .. } => "attempt_failed",
        Command::Requeue { .. } => "requeue",
        Command::Cancel { .. } => "cancel",
        Command::Abandon { .. } => "abandon",
        Command::Release { .. } => "release",
        Command::NewLeader { .. } => "new_leader",
        Command::Purge { .. } => "purge",
        Command::SetQueue { .. } => "set_queue",
        Command::Due { .. } => "due",
    }
}

/// The shapes of `SHAPES` this message shows.
fn shapes_of(message: &Decoded) -> Vec<&'static str> {
    let mut shapes = Vec::new();
    match message {
        Decoded::CoordinatorToWorker(CoordinatorToWorker::Registered { members, .. })
            if !members.is_empty() =>
        {
            shapes.push("REGISTERED with members")
        }
        Decoded::CoordinatorToWorker(CoordinatorToWorker::NotLeader { members, .. })
            if !members.is_empty() =>
        {
            shapes.push("worker NOT_LEADER with members")
        }
        Decoded::ClientReply(ClientReply::NotLeader {
            uncertain, members, ..
        }) => {
            if !members.is_empty() {
                shapes.push("client NOT_LEADER with members");
            }
            if *uncertain {
                shapes.push("client NOT_LEADER uncertain");
            }
        }
        Decoded::ClientRequest(ClientRequest::TransferLeader { to, .. }) => {
            shapes.push(if to.is_some() {
                "TRANSFER_LEADER with to"
            } else {
                "TRANSFER_LEADER without to"
            })
        }
        Decoded::PeerMessage(PeerMessage::PreVoteReply { granted, .. }) => {
            shapes.push(if *granted {
                "PRE_VOTE_REPLY granted"
            } else {
                "PRE_VOTE_REPLY refused"
            })
        }
        Decoded::PeerMessage(PeerMessage::Append { entries, .. }) => {
            shapes.push(if entries.is_empty() {
                "APPEND heartbeat"
            } else {
                "APPEND with entries"
            })
        }
        Decoded::PeerMessage(PeerMessage::AppendReply {
            success,
            conflict_term,
            ..
        }) => shapes.push(match (success, conflict_term) {
            (true, _) => "APPEND_REPLY success",
            (false, Some(_)) => "APPEND_REPLY refusal with conflict_term",
            (false, None) => "APPEND_REPLY refusal without conflict_term",
        }),
        Decoded::AuthReply(AuthReply::AuthOk { name, role }) => shapes.push(match (name, role) {
            (Some(_), Some(_)) => "AUTH_OK with name and role",
            (None, None) => "AUTH_OK without name and role",
            _ => "AUTH_OK with only one of name and role",
        }),
        _ => {}
    }
    shapes
}

/// A `SNAPSHOT` example that holds a whole snapshot must decode to job rows of `total` bytes;
/// any other must carry bytes (base64 in the JSON shown) that fit within `total`.
fn check_snapshot(message: &PeerMessage) -> Result<(), String> {
    let PeerMessage::Snapshot {
        offset,
        total,
        data,
        ..
    } = message
    else {
        return Ok(());
    };
    let bytes = &data.0;
    let end = offset.saturating_add(bytes.len() as u64);
    if end > *total {
        return Err(format!(
            "SNAPSHOT chunk ends at byte {end}, past its total of {total}"
        ));
    }
    if *offset == 0 && end == *total {
        decode_snapshot(bytes)
            .map_err(|error| format!("SNAPSHOT data does not decode to job rows: {error}"))?;
    }
    Ok(())
}

fn status_of(outcome: &AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Succeeded { .. } => "succeeded",
        AttemptOutcome::Failed { .. } => "failed",
        AttemptOutcome::Cancelled {} => "cancelled",
        AttemptOutcome::Released {} => "released",
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
    AuthRequest(AuthRequest),
    AuthReply(AuthReply),
}

impl Decoded {
    fn enum_name(&self) -> &'static str {
        match self {
            Decoded::WorkerToCoordinator(_) => "WorkerToCoordinator",
            Decoded::CoordinatorToWorker(_) => "CoordinatorToWorker",
            Decoded::ClientRequest(_) => "ClientRequest",
            Decoded::ClientReply(_) => "ClientReply",
            Decoded::PeerMessage(_) => "PeerMessage",
            Decoded::AuthRequest(_) => "AuthRequest",
            Decoded::AuthReply(_) => "AuthReply",
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
            Decoded::AuthRequest(m) => tag_of_auth_request(m),
            Decoded::AuthReply(m) => tag_of_auth_reply(m),
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
            Decoded::AuthRequest(m) => m.type_name(),
            Decoded::AuthReply(m) => m.type_name(),
        }
    }
}

/// Decodes `text` as `M` with the real codec and checks that it encodes back to `value`, and
/// to `text` itself when pretty-printed (so fields appear in the order the encoder writes them).
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
    let written = serde_json::to_string_pretty(&message).map_err(|error| error.to_string())?;
    if written != text.trim_end() {
        return Err(format!(
            "decodes, but Herder writes its fields in another order or layout:\n{written}"
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
        (
            "AuthRequest",
            decode_as::<AuthRequest>(text, &value).map(Decoded::AuthRequest),
        ),
        (
            "AuthReply",
            decode_as::<AuthReply>(text, &value).map(Decoded::AuthReply),
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
    let mut shapes: BTreeSet<&'static str> = BTreeSet::new();
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
            shapes.extend(shapes_of(message));
            if let Decoded::WorkerToCoordinator(WorkerToCoordinator::TaskResult {
                outcome, ..
            }) = message
            {
                outcomes.insert(status_of(outcome));
            }
            if let Decoded::PeerMessage(peer) = message {
                if let Err(error) = check_snapshot(peer) {
                    problems.push(format!("{DOC_PATH}:{}: {error}", block.line));
                }
            }
        }
    }

    let lists = [
        ("WorkerToCoordinator", WORKER_TO_COORDINATOR),
        ("CoordinatorToWorker", COORDINATOR_TO_WORKER),
        ("ClientRequest", CLIENT_REQUEST),
        ("ClientReply", CLIENT_REPLY),
        ("PeerMessage", PEER_MESSAGE),
        ("AuthRequest", AUTH_REQUEST),
        ("AuthReply", AUTH_REPLY),
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
    for status in ["succeeded", "failed", "cancelled", "released"] {
        if !outcomes.contains(status) {
            problems.push(format!(
                "{DOC_PATH}: no TASK_RESULT example with outcome status {status:?}"
            ));
        }
    }
    for shape in SHAPES {
        if !shapes.contains(shape) {
            problems.push(format!("{DOC_PATH}: no ```json example of {shape}"));
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
    check::<AuthRequest>("AuthRequest", AUTH_REQUEST, &mut problems);
    check::<AuthReply>("AuthReply", AUTH_REPLY, &mut problems);
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn every_jsonc_block_is_a_nested_type_and_every_kind_has_one() {
    let blocks = fenced_blocks(&doc());
    let mut problems = Vec::new();
    let mut task_kinds = BTreeSet::new();
    let mut output_kinds = BTreeSet::new();
    let mut command_kinds: BTreeSet<&'static str> = BTreeSet::new();
    // Log entries shown inside `APPEND` examples count too.
    for block in blocks_tagged(&blocks, "json") {
        if let Ok(PeerMessage::Append { entries, .. }) =
            decode_message::<PeerMessage>(block.text.as_bytes())
        {
            command_kinds.extend(entries.iter().map(|entry| kind_of_command(&entry.command)));
        }
    }
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
                task_kinds.insert(spec.kind().to_owned());
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
        match nested_as::<LogEntry>(&value) {
            Ok(entry) => {
                command_kinds.insert(kind_of_command(&entry.command));
                matched = true;
            }
            Err(error) => errors.push(format!("  as LogEntry: {error}")),
        }
        let others = [
            ("AttemptOutcome", nested_as::<AttemptOutcome>(&value).err()),
            ("RunningAttempt", nested_as::<RunningAttempt>(&value).err()),
            ("JobView", nested_as::<JobView>(&value).err()),
            ("WorkerView", nested_as::<WorkerView>(&value).err()),
            ("LeaderHint", nested_as::<LeaderHint>(&value).err()),
            ("ClusterView", nested_as::<ClusterView>(&value).err()),
            ("MemberView", nested_as::<MemberView>(&value).err()),
            ("snapshot rows", nested_as::<Vec<Job>>(&value).err()),
            (
                "table rows",
                nested_as::<herder_core::storage::TableRows>(&value).err(),
            ),
            (
                "QueueView",
                nested_as::<herder_core::protocol::QueueView>(&value).err(),
            ),
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
    if !task_kinds.iter().any(|kind| check_task_name(kind).is_ok()) {
        problems.push(format!("{DOC_PATH}: no ```jsonc example of a user task"));
    }
    for kind in TASK_KINDS.iter().chain([&EXEC_KIND]) {
        if !task_kinds.contains(*kind) {
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
    for kind in COMMAND_KINDS {
        if !command_kinds.contains(kind) {
            problems.push(format!(
                "{DOC_PATH}: no example of a log entry with command {kind:?}"
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
    names.extend(
        [
            RoleKind::Leader,
            RoleKind::Follower,
            RoleKind::PreCandidate,
            RoleKind::Candidate,
        ]
        .iter()
        .map(ToString::to_string),
    );
    names.extend(Role::ALL.iter().map(wire_name));
    names.extend([SecretLink::Worker, SecretLink::Peer].iter().map(wire_name));
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
    assert_eq!(
        missing,
        Ok(CoordinatorToWorker::NotLeader {
            leader: None,
            members: Vec::new()
        })
    );
    assert_eq!(missing, null);
    // `members` and `uncertain` may be omitted (empty, false) but are never null.
    assert_eq!(
        decode_message::<ClientReply>(br#"{"type":"NOT_LEADER","request_id":1,"leader":null}"#),
        Ok(ClientReply::NotLeader {
            request_id: herder_core::ids::RequestId(1),
            leader: None,
            uncertain: false,
            members: Vec::new(),
        })
    );
    for payload in [
        &br#"{"type":"NOT_LEADER","request_id":1,"leader":null,"uncertain":null}"#[..],
        &br#"{"type":"NOT_LEADER","request_id":1,"leader":null,"members":null}"#[..],
    ] {
        assert!(matches!(
            decode_message::<ClientReply>(payload),
            Err(FrameError::InvalidMessage { .. })
        ));
    }
    // An explicit null `conflict_term` means absent too.
    assert!(decode_message::<PeerMessage>(
        br#"{"type":"APPEND_REPLY","term":3,"success":false,"index":9,"conflict_term":null,"seq":0}"#
    )
    .is_ok());
    // Section 3: log entries (like snapshot rows) ignore fields they do not define; messages
    // refuse them.
    let entry = br#"{"type":"APPEND","term":1,"prev_index":0,"prev_term":0,"entries":[{"index":1,"term":1,"later":true,"command":{"command":"new_leader","leader":"c1","later":true}}],"commit":0,"seq":0}"#;
    assert!(decode_message::<PeerMessage>(entry).is_ok());
    assert!(matches!(
        decode_message::<PeerMessage>(br#"{"type":"TIMEOUT_NOW","term":1,"later":true}"#),
        Err(FrameError::InvalidMessage { .. })
    ));
    // A worker-link message of a leader must carry its term.
    assert!(matches!(
        decode_message::<CoordinatorToWorker>(br#"{"type":"HEARTBEAT_ACK"}"#),
        Err(FrameError::InvalidMessage { .. })
    ));
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
    // Section 4.3: `closes_connection()` is true for exactly the seven frame-level codes,
    // `NOT_REGISTERED`, `TOO_MANY_CONNECTIONS` and `UNAUTHENTICATED`.
    for code in ERROR_CODES {
        let closes = CLOSING_CODES.contains(&wire_name(&code).as_str());
        assert_eq!(code.closes_connection(), closes, "{code:?}");
    }

    // Section 1.1: handshake frames are bounded at 4,096 bytes; nonces and proofs are exactly
    // 64 lowercase hex digits; `name` and `role` of `AUTH_OK` may be missing or null.
    assert_eq!(HANDSHAKE_FRAME_BYTES_MAX, 4096);
    let hello = |nonce: &str| {
        decode_message::<AuthRequest>(
            format!(r#"{{"type":"AUTH_HELLO","link":"worker","nonce":"{nonce}"}}"#).as_bytes(),
        )
    };
    assert!(hello(&"ab".repeat(32)).is_ok());
    for nonce in ["AB".repeat(32), "ab".repeat(31), "ab".repeat(33)] {
        assert!(
            matches!(hello(&nonce), Err(FrameError::InvalidMessage { .. })),
            "{nonce}"
        );
    }
    assert_eq!(
        decode_message::<AuthReply>(br#"{"type":"AUTH_OK","name":null,"role":null}"#),
        Ok(AuthReply::AuthOk {
            name: None,
            role: None
        })
    );
}

/// The proof of section 1.1, built from the document's description alone.
fn documented_proof(
    secret: &str,
    side: &[u8; 10],
    link: &str,
    initiator: &Nonce,
    acceptor: &Nonce,
) -> Proof {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("any key");
    mac.update(b"herder-auth-v1\0");
    mac.update(side);
    mac.update(link.as_bytes());
    mac.update(b"\0");
    mac.update(&initiator.0);
    mac.update(&acceptor.0);
    Proof(mac.finalize().into_bytes().into())
}

/// The handshake shown in section 1.1 is one Herder's two sides produce with the documented
/// secret, and its proofs are built exactly as the document describes.
#[test]
fn the_handshake_example_is_one_herder_computes() {
    let doc = doc();
    assert!(
        doc.contains(&format!("`{EXAMPLE_SECRET}`")),
        "{DOC_PATH} no longer names the example secret {EXAMPLE_SECRET:?}"
    );
    let blocks = fenced_blocks(&doc);
    let (mut hellos, mut challenges, mut proofs) = (Vec::new(), Vec::new(), Vec::new());
    for block in blocks_tagged(&blocks, "json") {
        match decode_message::<AuthRequest>(block.text.as_bytes()) {
            Ok(hello @ AuthRequest::AuthHello { .. }) => hellos.push(hello),
            Ok(proof @ AuthRequest::AuthProof { .. }) => proofs.push(proof),
            _ => {}
        }
        if let Ok(challenge @ AuthReply::AuthChallenge { .. }) =
            decode_message::<AuthReply>(block.text.as_bytes())
        {
            challenges.push(challenge);
        }
    }
    let (
        [hello @ AuthRequest::AuthHello {
            link,
            nonce: initiator_nonce,
        }],
        [challenge @ AuthReply::AuthChallenge {
            nonce: acceptor_nonce,
            proof: acceptor_proof,
        }],
        [proof @ AuthRequest::AuthProof {
            proof: initiator_proof,
        }],
    ) = (&hellos[..], &challenges[..], &proofs[..])
    else {
        panic!("{DOC_PATH} should show exactly one AUTH_HELLO, AUTH_CHALLENGE and AUTH_PROOF, one handshake: {hellos:?} {challenges:?} {proofs:?}");
    };

    // The document's construction, byte for byte.
    let link_name = wire_name(link);
    assert_eq!(
        documented_proof(
            EXAMPLE_SECRET,
            b"acceptor\0\0",
            &link_name,
            initiator_nonce,
            acceptor_nonce
        ),
        *acceptor_proof,
        "the acceptor's proof"
    );
    assert_eq!(
        documented_proof(
            EXAMPLE_SECRET,
            b"initiator\0",
            &link_name,
            initiator_nonce,
            acceptor_nonce
        ),
        *initiator_proof,
        "the initiator's proof"
    );

    // Herder's own two sides, given the same secret and nonces, say the same.
    let secret = Arc::new(Secret::from_text(EXAMPLE_SECRET).expect("a valid secret"));
    let (mut initiator, first) = Initiator::new(
        Credential::Secret {
            link: *link,
            secret: secret.clone(),
        },
        *initiator_nonce,
    );
    assert_eq!(first, *hello);
    let mut acceptor = Acceptor::new(
        AcceptPolicy::Secret {
            link: *link,
            secret,
        },
        *acceptor_nonce,
    );
    assert_eq!(
        acceptor.handle(first),
        AcceptorStep::Reply(challenge.clone())
    );
    assert_eq!(
        initiator.handle(challenge.clone()),
        InitiatorStep::Send(proof.clone())
    );
    let AcceptorStep::Accepted { reply, .. } = acceptor.handle(proof.clone()) else {
        panic!("the example's AUTH_PROOF is refused");
    };
    assert_eq!(
        reply,
        AuthReply::AuthOk {
            name: None,
            role: None
        }
    );
    assert_eq!(
        initiator.handle(reply),
        InitiatorStep::Done {
            name: None,
            role: None
        }
    );
}

/// Every client request needs the role the document says, as every example of it shows.
#[test]
fn the_roles_allow_what_the_document_says() {
    let mut problems = Vec::new();
    for tag in CLIENT_REQUEST {
        if !ROLE_NEEDED.iter().any(|(listed, _)| listed == tag) {
            problems.push(format!("ROLE_NEEDED does not list {tag}"));
        }
    }
    let blocks = fenced_blocks(&doc());
    for block in blocks_tagged(&blocks, "json") {
        let Ok(request) = decode_message::<ClientRequest>(block.text.as_bytes()) else {
            continue;
        };
        let tag = tag_of_client_request(&request);
        let needed = Role::needed_for(&request).as_str();
        match ROLE_NEEDED.iter().find(|(listed, _)| *listed == tag) {
            Some((_, documented)) if *documented == needed => {}
            Some((_, documented)) => problems.push(format!(
                "{DOC_PATH}:{}: {tag} needs the role {needed}, not {documented}",
                block.line
            )),
            None => {}
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}
