//! The simulator's own tests: determinism, a batch of seeds, the checker catching planted
//! violations, and the regression seeds.

use std::collections::{BTreeMap, BTreeSet};

use herder_core::command::{Command, LogEntry};
use herder_core::coordinator::{Coordinator, CoordinatorConfig, Output, Record, WorkerEntry};
use herder_core::ids::{
    Attempt, ConnectionId, Incarnation, JobId, LeaseId, LogIndex, RequestId, Term, WorkerId,
};
use herder_core::job::{JobState, Lease};
use herder_core::protocol::{
    ClientReply, ClientRequest, ErrorCode, JobSubmission, Partitions, SubmitResult,
};
use herder_core::table::JobTable;
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_core::time::Instant;
use herder_sim::checker::{Checker, ConnOwner};
use herder_sim::model::Model;
use herder_sim::submission::{Rules, Subject};
use herder_sim::{run_scenario, run_seed, Scenario};

#[test]
fn a_seed_replays_to_the_same_trace_hash_and_seeds_differ() {
    for seed in [0, 7, 12345] {
        let first = run_seed(seed, false);
        let second = run_seed(seed, true);
        assert_eq!(
            first.hash, second.hash,
            "seed {seed}: tracing on or off, twice, must give one hash"
        );
        assert_eq!(first.steps, second.steps);
        assert!(!second.trace.is_empty());
    }
    let hashes: BTreeSet<u64> = (100..120).map(|seed| run_seed(seed, false).hash).collect();
    assert_eq!(hashes.len(), 20, "twenty seeds must give twenty hashes");
    let standard = run_scenario(5, Scenario::standard(5), false);
    assert_eq!(
        standard.hash,
        run_scenario(5, Scenario::standard(5), false).hash
    );
}

#[test]
fn five_hundred_seeds_pass_and_reach_the_interesting_cases() {
    let mut failures = Vec::new();
    let mut coverage: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in 1_000..1_500 {
        let report = run_seed(seed, false);
        for (what, n) in report.coverage {
            *coverage.entry(what).or_default() += n;
        }
        if let Some(failure) = report.failure {
            failures.push(format!(
                "seed {seed}: {failure}\n  replay: cargo run -p herder-sim -- replay --seed {seed} --trace"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The batch must exercise what the checker is there for, or a passing run means little.
    for what in [
        "coordinator: job completed",
        "coordinator: job failed",
        "coordinator: job cancelled",
        "coordinator: recovered",
        "coordinator: stale result rejected",
        "coordinator: attempt re-adopted",
        "coordinator: attempt abandoned",
        "coordinator: lease expired",
        "coordinator: submit rejected (admission)",
        "coordinator: worker reconnected",
        "fault: worker pause",
        "fault: worker crash",
        "fault: connection reset",
        "fault: task hangs past its lease",
        "fault: partition isolating one node",
        "fault: partition cutting a pair",
        "fault: one-way partition",
        "fault: partition splitting the nodes",
        "fault: segment lost, retransmitted",
        "fault: message sent twice",
        "net: delivery held by a partition",
        "net: connect lost in a partition",
        "net: data delivered after its connection closed",
        // Groups of coordinators and the faults aimed at consensus.
        "coordinator: leader elected",
        "coordinator: leader took over",
        "coordinator: leader stepped down",
        "coordinator: pre-vote started",
        "coordinator: following a leader",
        "coordinator: snapshot installed",
        "coordinator: a follower lost entries",
        "coordinator: rejoined after an empty start",
        "fault: coordinator restarts from an empty disk",
        "fault: partition isolating the leader",
        "fault: partition splitting the coordinators",
        "fault: one-way partition between coordinators",
        "fault: worker leaves for good",
        "net: peer message lost",
        "net: peer message sent twice",
        "net: peer message cut by a partition",
        // User tasks, task sets, drains and permanent failures.
        "task: user task started",
        "task: fails permanently",
        "fault: worker drains",
        "worker: draining",
        "worker: attempt handed back by a drain",
        "worker: stops once drained",
        "coordinator: worker draining",
        "coordinator: drained attempt released",
        "liveness: a job waits queued, no worker serves its kind",
        "client: a job shown unserved",
        // Submissions that fail the checks, conflicting keys, and batches large and small.
        "client: a batch of 5 to 64 jobs sent",
        "client: a batch holding a job that fails the checks sent",
        "client: a submission that fails the checks sent",
        "coordinator: a submission answered ERROR IDEMPOTENCY_CONFLICT",
        "coordinator: a submission answered ERROR INVALID_REQUEST",
        "coordinator: a submission answered ERROR INVALID_TASK",
        "coordinator: a job of a batch answered ERROR IDEMPOTENCY_CONFLICT",
        "coordinator: a batch failed whole, ERROR INVALID_REQUEST",
        "coordinator: a batch failed whole, ERROR INVALID_TASK",
    ] {
        assert!(
            coverage.get(what).copied().unwrap_or(0) > 0,
            "500 seeds never reached {what:?}: {coverage:?}"
        );
    }
}

#[test]
fn the_standard_scenarios_pass() {
    for seed in 0..50 {
        for scenario in [Scenario::standard(seed), Scenario::standard_group(seed)] {
            let coordinators = scenario.coordinators;
            let report = run_scenario(seed, scenario, false);
            assert!(
                report.failure.is_none(),
                "seed {seed} ({coordinators} coordinators): {:?}",
                report.failure
            );
        }
    }
}

fn worker() -> WorkerId {
    WorkerId::parse("w0").expect("valid id")
}

fn job_id(n: u8) -> JobId {
    format!("00000000-0000-4000-8000-0000000000{n:02x}")
        .parse()
        .expect("a uuid")
}

fn lease_id(n: u8) -> LeaseId {
    format!("11111111-0000-4000-8000-0000000000{n:02x}")
        .parse()
        .expect("a uuid")
}

/// The commands of one job that completed on attempt 1 with `output`, as log entries.
fn completed_log(spec: TaskSpec, output: TaskOutput) -> Vec<LogEntry> {
    let commands = vec![
        Command::Submit {
            timeout_millis: None,
            partitions: Vec::new(),
            partitions_asked: None,
            job_id: job_id(1),
            task: spec,
            max_attempts: 3,
            idempotency_key: None,
            max_active_jobs: 10,
            submitted_by: None,
            fairness_key: None,
            priority: 0,
            queue: herder_core::queues::default_queue(),
            run_at: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        },
        Command::Assign {
            job_id: job_id(1),
            lease: Lease {
                id: lease_id(1),
                worker: worker(),
                incarnation: Incarnation(1),
            },
            as_of: herder_core::ids::LogIndex(0),
        },
        Command::Complete {
            job_id: job_id(1),
            lease_id: lease_id(1),
            output,
        },
    ];
    commands
        .into_iter()
        .enumerate()
        .map(|(i, command)| LogEntry {
            index: LogIndex(i as u64 + 1),
            term: Term(1),
            at: herder_core::time::UnixMillis::UNSTAMPED,
            command,
        })
        .collect()
}

#[test]
fn the_checker_catches_a_double_assignment_and_a_reused_lease() {
    let mut checker = Checker::new(1);
    checker
        .observe_assign(job_id(1), lease_id(1), 1, 3, &worker())
        .expect("a first assignment is fine");
    let twice = checker
        .observe_assign(job_id(1), lease_id(2), 1, 3, &worker())
        .expect_err("the same attempt assigned twice");
    assert!(twice.contains("assigned twice"), "{twice}");
    let reused = checker
        .observe_assign(job_id(2), lease_id(1), 1, 3, &worker())
        .expect_err("a lease id sent twice");
    assert!(reused.contains("unique"), "{reused}");
}

#[test]
fn the_checker_catches_an_acknowledgement_that_runs_ahead_of_the_disk() {
    // A real coordinator proposes a submission; an acknowledgement of it, forged before the
    // batch is durable, is caught; after the batch lands and the entry applies, it passes.
    let mut c = Coordinator::new(CoordinatorConfig::default(), 1).expect("valid config");
    let mut checker = Checker::new(1);
    c.handle_client_message(
        Instant::ZERO,
        ConnectionId(2),
        &herder_core::auth::Caller::anonymous(),
        ClientRequest::Submit {
            timeout_millis: None,
            request_id: RequestId(1),
            task: serde_json::json!({"kind": "sha256", "text": "x"}),
            max_attempts: None,
            idempotency_key: None,
            partitions: None,
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        },
    );
    let mut batches = Vec::new();
    while let Some(output) = c.poll_output() {
        if let Output::Persist(batch) = output {
            batches.push(batch);
        }
    }
    let submitted = batches
        .iter()
        .flat_map(|b| &b.records)
        .find_map(|r| match r {
            Record::Log(entry) => match &entry.command {
                Command::Submit { job_id, .. } => Some(*job_id),
                _ => None,
            },
            _ => None,
        })
        .expect("the submission was proposed");
    let accepted = Output::ToClient {
        conn: ConnectionId(2),
        message: ClientReply::SubmitAccepted {
            term: Term(1),
            request_id: RequestId(1),
            job_id: submitted,
            existing: false,
        },
    };
    let early = checker
        .check_output(0, &c, &accepted, &ConnOwner::Client, None, 1)
        .expect_err("an acknowledgement that is not durable");
    assert!(early.contains("SUBMIT_ACCEPTED"), "{early}");
    for batch in &batches {
        checker
            .record_durable(0, &batch.records)
            .expect("an honest batch");
        c.handle_persisted(Instant::ZERO, batch.id);
    }
    checker.observe(0, &c).expect("a durable, applied entry");
    checker
        .check_output(0, &c, &accepted, &ConnOwner::Client, None, 1)
        .expect("a durable submission");
}

#[test]
fn the_model_refuses_a_wrong_result_and_a_table_that_disagrees() {
    // The right answer for sha256 "x" is not this.
    let spec = TaskSpec::Sha256 { text: "x".into() };
    let wrong = TaskOutput::Sha256 {
        hex: "00".repeat(32),
    };
    let mut model = Model::new();
    let log = completed_log(spec.clone(), wrong);
    model.apply(&log[0]).expect("submit");
    model.apply(&log[1]).expect("assign");
    let caught = model.apply(&log[2]).expect_err("a wrong result");
    assert!(caught.contains("but its task gives"), "{caught}");

    // The right result is accepted; a product row that shows anything else is not.
    let right = herder_core::tasks::execute(&spec, Attempt(1)).expect("sha256 succeeds");
    let mut model = Model::new();
    let mut table = JobTable::new();
    for entry in completed_log(spec, right) {
        model.apply(&entry).expect("a correct completion");
        table.apply(entry.index, entry.at, &entry.command);
    }
    let mut row = table.get(&job_id(1)).expect("the job").clone();
    model.matches(&row).expect("the product agrees");
    row.attempt = Attempt(2);
    let disagrees = model
        .matches(&row)
        .expect_err("a row the rules do not allow");
    assert!(disagrees.contains("the rules say"), "{disagrees}");
}

#[test]
fn the_checker_catches_a_worker_over_capacity() {
    let mut leases = BTreeMap::new();
    leases.insert(lease_id(1), job_id(1));
    leases.insert(lease_id(2), job_id(2));
    let entry = WorkerEntry {
        draining: false,
        tasks: herder_core::protocol::builtin_task_names()
            .into_iter()
            .collect(),
        id: worker(),
        incarnation: Incarnation(1),
        registration: 1,
        capacity: 1,
        prefetch: 0,
        conn: Some(ConnectionId(1)),
        alive: true,
        last_heartbeat: Instant::ZERO,
        leases,
        ends: BTreeMap::new(),
        overdue: std::collections::BTreeSet::new(),
        queues: None,
    };
    let mut checker = Checker::new(1);
    let over = checker
        .check_state(0, &JobTable::new(), [&entry].into_iter())
        .expect_err("two leases on one slot");
    assert!(over.contains("capacity 1"), "{over}");
}

/// (seed, standard scenario, strict) entries of `regression-seeds.txt`: (must pass, known failing).
/// (seed, scenario kind, strict): the kind is `standard`, `standard-group`, `single` or
/// `swarm` (the seed's own draw).
type Entry = (u64, &'static str, bool);

fn regression_seeds() -> (Vec<Entry>, Vec<Entry>) {
    let text = include_str!("../regression-seeds.txt");
    let (mut passing, mut known) = (Vec::new(), Vec::new());
    let mut in_known = false;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line == "[known-failing]" {
            in_known = true;
            continue;
        }
        let mut words = line.split_whitespace();
        let seed: u64 = words
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("bad line in regression-seeds.txt: {line:?}"));
        let flags: Vec<&str> = words.collect();
        let kind = ["standard-group", "standard", "single"]
            .into_iter()
            .find(|k| flags.contains(k))
            .unwrap_or("swarm");
        let entry = (seed, kind, flags.contains(&"strict"));
        if in_known {
            known.push(entry);
        } else {
            passing.push(entry);
        }
    }
    (passing, known)
}

fn replay(entry: Entry) -> Option<String> {
    let (seed, kind, strict) = entry;
    let scenario = match kind {
        "standard" => Scenario::standard(seed),
        "standard-group" => Scenario::standard_group(seed),
        "single" => Scenario::single(seed),
        _ => Scenario::draw(seed),
    };
    let report = run_scenario(seed, scenario, false);
    report.failure.or_else(|| {
        if strict {
            report.findings.first().cloned()
        } else {
            None
        }
    })
}

#[test]
fn the_regression_seeds_pass() {
    let (passing, known) = regression_seeds();
    for entry in passing {
        if let Some(failure) = replay(entry) {
            panic!("regression seed {entry:?} fails again: {failure}");
        }
    }
    // Known failures are skipped, but they must still reproduce: once one stops failing the
    // bug was fixed and the seed belongs above the marker.
    for entry in known {
        assert!(
            replay(entry).is_some(),
            "known-failing seed {entry:?} passes now: move it above [known-failing]"
        );
    }
}

/// A log of commands, one entry each, from index 1.
fn entries(commands: Vec<Command>) -> Vec<LogEntry> {
    commands
        .into_iter()
        .enumerate()
        .map(|(i, command)| LogEntry {
            index: LogIndex(i as u64 + 1),
            term: Term(1),
            at: herder_core::time::UnixMillis::UNSTAMPED,
            command,
        })
        .collect()
}

fn user_task(payload: serde_json::Value) -> TaskSpec {
    TaskSpec::User(herder_core::tasks::UserTask {
        name: "resize".into(),
        payload,
    })
}

fn submit(task: TaskSpec) -> Command {
    Command::Submit {
        timeout_millis: Some(700),
        partitions: Vec::new(),
        partitions_asked: None,
        job_id: job_id(1),
        task,
        max_attempts: 3,
        idempotency_key: None,
        max_active_jobs: 10,
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

fn assign(lease: u8) -> Command {
    Command::Assign {
        job_id: job_id(1),
        lease: Lease {
            id: lease_id(lease),
            worker: worker(),
            incarnation: Incarnation(1),
        },
        as_of: herder_core::ids::LogIndex(0),
    }
}

fn permanent_failure(lease: u8) -> Command {
    Command::AttemptFailed {
        job_id: job_id(1),
        lease_id: lease_id(lease),
        cause: "task failed permanently".into(),
        retry_delay_millis: 10,
        permanent: true,
        kind: Default::default(),
    }
}

#[test]
fn the_model_gives_a_released_attempt_back_only_when_a_worker_released_it() {
    let log = entries(vec![
        submit(user_task(serde_json::json!({"n": 3}))),
        assign(1),
        Command::Release {
            job_id: job_id(1),
            lease_id: lease_id(1),
        },
    ]);
    let mut model = Model::new();
    model.apply(&log[0]).expect("submit");
    model.apply(&log[1]).expect("assign");
    let mut unreported = model.clone();
    let caught = unreported
        .apply(&log[2])
        .expect_err("a release no worker reported");
    assert!(caught.contains("no worker reported"), "{caught}");
    model.reported_released.insert(lease_id(1));
    model.apply(&log[2]).expect("a reported release");
    let job = &model.jobs[&job_id(1)];
    assert_eq!(
        (job.state, job.attempt),
        (JobState::Queued, 0),
        "not charged"
    );
    assert!(model.released.contains(&lease_id(1)));
}

#[test]
fn the_model_ends_a_job_at_a_permanent_failure_only_when_its_task_gives_one() {
    // Attempt 1 fails permanently by its payload: the job fails at once, with attempts left.
    let log = entries(vec![
        submit(user_task(serde_json::json!({"n": 3, "permanent_at": 1}))),
        assign(1),
        permanent_failure(1),
    ]);
    let mut model = Model::new();
    for entry in &log[..2] {
        model.apply(entry).expect("submit and assign");
    }
    let mut unreported = model.clone();
    let caught = unreported
        .apply(&log[2])
        .expect_err("a permanent failure no worker reported");
    assert!(caught.contains("no worker reported"), "{caught}");
    model.reported_permanent.insert(lease_id(1));
    model.apply(&log[2]).expect("a reported permanent failure");
    assert_eq!(model.jobs[&job_id(1)].state, JobState::Failed);
    assert!(model.failed_permanently.contains_key(&job_id(1)));

    // A task whose payload succeeds on attempt 1 cannot fail permanently there.
    let log = entries(vec![
        submit(user_task(serde_json::json!({"n": 3}))),
        assign(1),
        permanent_failure(1),
    ]);
    let mut model = Model::new();
    model.reported_permanent.insert(lease_id(1));
    for entry in &log[..2] {
        model.apply(entry).expect("submit and assign");
    }
    let caught = model.apply(&log[2]).expect_err("not what the task gives");
    assert!(caught.contains("but its task gives"), "{caught}");
}

#[test]
fn the_model_knows_what_a_user_task_returns() {
    use herder_sim::model::{expected_outcome, Expected};
    let task = user_task(serde_json::json!({"n": 4, "fail_until": 2, "permanent_at": 3}));
    assert_eq!(
        expected_outcome(&task, 1),
        Expected::Fails { permanent: false }
    );
    assert_eq!(
        expected_outcome(&task, 2),
        Expected::Output(TaskOutput::Value {
            value: serde_json::json!({"task": "resize", "n": 4, "attempt": 2, "square": 16})
        })
    );
    assert_eq!(
        expected_outcome(&task, 3),
        Expected::Fails { permanent: true }
    );
}

#[test]
fn the_checker_catches_an_assignment_to_a_worker_that_does_not_serve_the_kind() {
    let log = entries(vec![
        submit(user_task(serde_json::json!({"n": 1}))),
        assign(1),
    ]);
    let mut checker = Checker::new(1);
    checker.worker_process(&worker(), Incarnation(1), &["sha256".to_string()]);
    checker.model.apply(&log[0]).expect("submit");
    let caught = checker
        .check_committed(&log[1])
        .expect_err("nobody serves resize");
    assert!(caught.contains("which no worker serves"), "{caught}");
    let other = WorkerId::parse("w1").expect("valid id");
    checker.worker_process(&other, Incarnation(7), &["resize".to_string()]);
    let caught = checker
        .check_committed(&log[1])
        .expect_err("w0 does not serve resize");
    assert!(caught.contains("which serves only"), "{caught}");
    checker.worker_process(
        &worker(),
        Incarnation(1),
        &["sha256".to_string(), "resize".to_string()],
    );
    checker
        .check_committed(&log[1])
        .expect("w0 serves resize now");
}

#[test]
fn the_checker_wants_a_job_no_worker_serves_shown_unserved() {
    let task = TaskSpec::User(herder_core::tasks::UserTask {
        name: "transcode".into(),
        payload: serde_json::json!({}),
    });
    let mut table = JobTable::new();
    let log = entries(vec![submit(task)]);
    table.apply(log[0].index, log[0].at, &log[0].command);
    let mut view = table.view(&job_id(1)).expect("the queued job");
    let c = Coordinator::new(CoordinatorConfig::default(), 1).expect("valid config");
    let mut checker = Checker::new(1);
    checker.model.apply(&log[0]).expect("submit");
    let reply = |view: &herder_core::protocol::JobView| Output::ToClient {
        conn: ConnectionId(2),
        message: ClientReply::Job {
            request_id: RequestId(1),
            job: Box::new(view.clone()),
        },
    };
    view.unserved = false;
    let caught = checker
        .check_output(0, &c, &reply(&view), &ConnOwner::Client, None, 1)
        .expect_err("a job nobody serves shown as served");
    assert!(caught.contains("without `unserved`"), "{caught}");
    view.unserved = true;
    checker
        .check_output(0, &c, &reply(&view), &ConnOwner::Client, None, 1)
        .expect("shown unserved");
    // Once some worker serves the kind, whether it shows unserved depends on who is live.
    checker.worker_process(&worker(), Incarnation(1), &["transcode".to_string()]);
    view.unserved = false;
    checker
        .check_output(0, &c, &reply(&view), &ConnOwner::Client, None, 1)
        .expect("a kind some worker serves");
}

/// A submission of `task` with the given options.
fn sent(task: serde_json::Value, max_attempts: Option<u32>, key: Option<&str>) -> JobSubmission {
    JobSubmission {
        task,
        max_attempts,
        idempotency_key: key.map(str::to_owned),
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
    }
}

fn error(code: ErrorCode, message: &str) -> ClientReply {
    ClientReply::Error {
        request_id: Some(RequestId(1)),
        code,
        message: message.to_owned(),
    }
}

#[test]
fn the_checker_judges_the_errors_a_submission_gets() {
    let mut checker = Checker::new(1);
    checker.set_rules(Rules {
        max_active_jobs: 4,
        default_max_attempts: 2,
        max_frame_bytes: 1024 * 1024,
    });
    // Key "k" is bound to a sleep of 10 ms with the default of 2 attempts.
    let sleep = TaskSpec::Sleep { milliseconds: 10 };
    let log = entries(vec![Command::Submit {
        job_id: job_id(1),
        task: sleep.clone(),
        max_attempts: 2,
        idempotency_key: Some("k".into()),
        max_active_jobs: 4,
        partitions: Vec::new(),
        partitions_asked: None,
        timeout_millis: None,
        submitted_by: None,
        fairness_key: None,
        priority: 0,
        queue: herder_core::queues::default_queue(),
        run_at: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    }]);
    checker.model.apply(&log[0]).expect("submit");
    let subject = Subject::Submit {
        conn: 2,
        request: RequestId(1),
    };
    let committed = LogIndex(1);
    let judge = |checker: &mut Checker, job: &JobSubmission, reply: &ClientReply| {
        checker.check_submit_reply(subject, job, committed, reply)
    };
    let conflict = error(ErrorCode::IdempotencyConflict, "bound to another job");
    // The same options (the default filled in) are the same job, not a conflict.
    let same = sent(sleep.to_json(), None, Some("k"));
    let caught = judge(&mut checker, &same, &conflict).expect_err("a conflict with itself");
    assert!(caught.contains("same task"), "{caught}");
    let accepted = ClientReply::SubmitAccepted {
        request_id: RequestId(1),
        term: Term(1),
        job_id: job_id(1),
        existing: true,
    };
    judge(&mut checker, &same, &accepted).expect("the same job");
    // Other attempts: a conflict, and never that job.
    let other = sent(sleep.to_json(), Some(3), Some("k"));
    judge(&mut checker, &other, &conflict).expect("a real conflict");
    let caught = judge(&mut checker, &other, &accepted).expect_err("accepted as another job");
    assert!(
        caught.contains("max attempts are 2 where this asks 3"),
        "{caught}"
    );
    // No key, or a key bound to nothing: no conflict.
    let unkeyed = sent(sleep.to_json(), Some(3), None);
    judge(&mut checker, &unkeyed, &conflict).expect_err("a conflict without a key");
    let unbound = sent(sleep.to_json(), Some(3), Some("free"));
    judge(&mut checker, &unbound, &conflict).expect_err("a conflict on a free key");
    // A field out of range gets that check's code, and only it.
    let zero = sent(sleep.to_json(), Some(0), Some("k"));
    judge(
        &mut checker,
        &zero,
        &error(ErrorCode::InvalidRequest, "max_attempts"),
    )
    .expect("fits");
    judge(&mut checker, &zero, &conflict).expect_err("checked before the key");
    judge(&mut checker, &zero, &accepted).expect_err("an invalid job accepted");
    let bad_task = sent(serde_json::json!({"kind": "sha256"}), None, None);
    judge(
        &mut checker,
        &bad_task,
        &error(ErrorCode::InvalidTask, "text"),
    )
    .expect("fits");
    let caught = judge(
        &mut checker,
        &bad_task,
        &error(ErrorCode::InvalidRequest, "?"),
    )
    .expect_err("the wrong code");
    assert!(caught.contains("INVALID_TASK"), "{caught}");
    // A valid job refused as invalid.
    let valid = sent(sleep.to_json(), None, None);
    judge(&mut checker, &valid, &error(ErrorCode::InvalidRequest, "?"))
        .expect_err("a valid job refused");
    judge(&mut checker, &valid, &error(ErrorCode::JobNotFound, "?"))
        .expect_err("a code no submission gets");
    // A data-parallel job that needs 6 slots under a limit of 4 can never be admitted.
    let mut wide = sent(
        serde_json::json!({"kind": "max", "numbers": [1, 2, 3, 4, 5, 6]}),
        None,
        None,
    );
    wide.partitions = Some(Partitions::Count(5));
    judge(
        &mut checker,
        &wide,
        &error(ErrorCode::InvalidRequest, "slots"),
    )
    .expect("fits");
    let rejected = ClientReply::SubmitRejected {
        queue: None,
        request_id: RequestId(1),
        retryable: true,
        active_jobs: 1,
        admitting_jobs: 0,
        max_active_jobs: 4,
        message: "full".into(),
    };
    judge(&mut checker, &wide, &rejected).expect_err("refused for room, not as invalid");

    // A batch is checked whole: one ERROR naming its first job that fails a check.
    let batch = (2, RequestId(1));
    let jobs = vec![valid.clone(), bad_task.clone(), zero.clone()];
    checker
        .check_batch_error(
            batch,
            &jobs,
            ErrorCode::InvalidTask,
            "job 1 of the batch: text",
        )
        .expect("the first job that fails");
    checker
        .check_batch_error(
            batch,
            &jobs,
            ErrorCode::InvalidRequest,
            "job 2 of the batch: ?",
        )
        .expect_err("a job after the first that fails");
    checker
        .check_batch_error(
            batch,
            &jobs,
            ErrorCode::InvalidTask,
            "job 0 of the batch: ?",
        )
        .expect_err("a job that passes");
    checker
        .check_batch_error(
            batch,
            &[valid.clone(), other.clone()],
            ErrorCode::InvalidRequest,
            "?",
        )
        .expect_err("a batch whose every job passes");
    // A batch's lines: only an idempotency conflict, and never for a batch that must fail.
    let c = Coordinator::new(CoordinatorConfig::default(), 1).expect("valid config");
    let line = |code| SubmitResult::Error {
        code,
        message: "?".into(),
    };
    let items = [(None, 1), (Some(("k", committed)), 1)];
    let result = |checker: &mut Checker, jobs: &[JobSubmission], results: &[SubmitResult]| {
        checker.check_batch_result(0, &c, batch, jobs, results, &items, (committed, committed))
    };
    let jobs = [valid.clone(), other.clone()];
    let conflicting = [
        line(ErrorCode::InvalidRequest),
        line(ErrorCode::IdempotencyConflict),
    ];
    let caught = result(&mut checker, &jobs, &conflicting).expect_err("an invalid line");
    assert!(caught.contains("fails the whole batch"), "{caught}");
    let same_line = [line(ErrorCode::IdempotencyConflict)];
    result(&mut checker, &jobs[1..], &same_line[..]).expect_err("counts differ");
    let jobs = [valid.clone(), same.clone()];
    let lines = [
        line(ErrorCode::IdempotencyConflict),
        line(ErrorCode::IdempotencyConflict),
    ];
    result(&mut checker, &jobs, &lines).expect_err("conflicts without a key and with itself");
    let jobs = [bad_task.clone(), other.clone()];
    let lines = [
        SubmitResult::Rejected {
            queue: None,
            retryable: true,
            active_jobs: 4,
            admitting_jobs: 0,
            max_active_jobs: 4,
            message: "full".into(),
        },
        line(ErrorCode::IdempotencyConflict),
    ];
    let caught = result(&mut checker, &jobs, &lines).expect_err("a batch holding an invalid job");
    assert!(caught.contains("INVALID_TASK"), "{caught}");
}
