//! Findings of an adversarial review of the coordinator state machine.
//!
//! Each test drives a `Coordinator` through the public API with an explicit input sequence and
//! asserts what docs/ARCHITECTURE.md and the invariants of docs/SIMULATION.md require. Workers
//! are played by hand, following the rules of `core/src/worker/` that matter here:
//!
//! - a worker drops an unacknowledged result on *any* `RESULT_ACK` naming its lease (accepted or
//!   not) and re-sends the results it still holds after every registration;
//! - a worker ignores messages on a connection it has given up on (`ConnectAttempt` check), and
//!   ignores `TASK_CANCEL` for a lease it is not running (it sends nothing back).

use std::time::Duration;

use herder_core::coordinator::{CoordinatorConfig, Output};
use herder_core::ids::{ConnectionId, Incarnation, JobId, LeaseId, RequestId, WorkerId};
use herder_core::job::JobState;
use herder_core::protocol::{
    AttemptOutcome, ClientReply, ClientRequest, CoordinatorToWorker, RunningAttempt,
    WorkerToCoordinator,
};
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_core::testing::Driver;

const CLIENT: ConnectionId = ConnectionId(1);

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        task_timeout: Duration::from_millis(1_000),
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(300),
        retry_base: Duration::from_millis(50),
        retry_max: Duration::from_millis(400),
        ..CoordinatorConfig::default()
    }
}

/// The shared test driver (batches written at once unless held, timers fired in order, the
/// invariants checked after every output), with helpers that play workers and a client.
struct Harness {
    d: Driver,
    next_request: u64,
}

impl std::ops::Deref for Harness {
    type Target = Driver;

    fn deref(&self) -> &Driver {
        &self.d
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Driver {
        &mut self.d
    }
}

impl Harness {
    fn new() -> Harness {
        Harness {
            d: Driver::new(config(), 7).expect("valid config"),
            next_request: 0,
        }
    }

    /// The coordinator process dies; held (not yet durable) batches are lost. A new process
    /// recovers from the disk.
    fn crash_and_recover(&mut self) {
        self.d
            .crash_and_recover(config(), 8)
            .expect("the disk recovers");
    }

    fn worker(&mut self, conn: ConnectionId, message: WorkerToCoordinator) {
        self.d.c.handle_worker_message(self.d.now, conn, message);
        self.pump();
    }

    fn register(&mut self, conn: ConnectionId, capacity: u32, running: Vec<RunningAttempt>) {
        self.worker(
            conn,
            WorkerToCoordinator::Register {
                draining: false,
                tasks: herder_core::protocol::builtin_task_names(),
                worker_id: WorkerId::parse("w1").expect("valid id"),
                incarnation: Incarnation(1),
                capacity,
                prefetch: 0,
                running,
                finished: Vec::new(),
                queues: None,
            },
        );
    }

    fn submit(&mut self, max_attempts: u32) -> JobId {
        self.next_request += 1;
        let request_id = RequestId(self.next_request);
        self.d.c.handle_client_message(
            self.d.now,
            CLIENT,
            &herder_core::auth::Caller::anonymous(),
            ClientRequest::Submit {
                timeout_millis: None,
                partitions: None,
                request_id,
                task: TaskSpec::Sha256 { text: "x".into() }.to_json(),
                max_attempts: Some(max_attempts),
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
        );
        self.pump();
        self.sent
            .iter()
            .find_map(|o| match o {
                Output::ToClient {
                    message:
                        ClientReply::SubmitAccepted {
                            request_id: r,
                            job_id,
                            ..
                        },
                    ..
                } if *r == request_id => Some(*job_id),
                _ => None,
            })
            .expect("the submission is accepted")
    }

    fn cancel(&mut self, job_id: JobId) {
        self.next_request += 1;
        self.d.c.handle_client_message(
            self.d.now,
            CLIENT,
            &herder_core::auth::Caller::anonymous(),
            ClientRequest::Cancel {
                request_id: RequestId(self.next_request),
                job_id,
            },
        );
        self.pump();
    }

    /// Time passes in 50 ms steps; the worker on each of `beating` heartbeats at every step.
    fn advance_beating(&mut self, millis: u64, beating: &[ConnectionId]) {
        let mut left = millis;
        while left > 0 {
            let step = left.min(50);
            self.d.advance(Duration::from_millis(step));
            left -= step;
            for &conn in beating {
                self.worker(conn, WorkerToCoordinator::Heartbeat {});
            }
        }
    }

    /// `TASK_ASSIGN`s sent so far: (conn, job, lease).
    fn assigns(&self) -> Vec<(ConnectionId, JobId, LeaseId)> {
        self.sent
            .iter()
            .filter_map(|o| match o {
                Output::ToWorker {
                    conn,
                    message:
                        CoordinatorToWorker::TaskAssign {
                            job_id, lease_id, ..
                        },
                } => Some((*conn, *job_id, *lease_id)),
                _ => None,
            })
            .collect()
    }

    fn result_acks(&self, lease: LeaseId) -> Vec<(ConnectionId, bool)> {
        self.sent
            .iter()
            .filter_map(|o| match o {
                Output::ToWorker {
                    conn,
                    message:
                        CoordinatorToWorker::ResultAck {
                            lease_id, accepted, ..
                        },
                } if *lease_id == lease => Some((*conn, *accepted)),
                _ => None,
            })
            .collect()
    }

    fn cancels(&self, lease: LeaseId) -> Vec<ConnectionId> {
        self.sent
            .iter()
            .filter_map(|o| match o {
                Output::ToWorker {
                    conn,
                    message: CoordinatorToWorker::TaskCancel { lease_id, .. },
                } if *lease_id == lease => Some(*conn),
                _ => None,
            })
            .collect()
    }

    fn state(&self, job_id: JobId) -> JobState {
        self.d.c.job(&job_id).expect("the job exists").state
    }

    fn w1_leases(&self) -> usize {
        self.d
            .c
            .workers()
            .find(|w| w.id.as_str() == "w1")
            .map_or(0, |w| w.leases.len())
    }
}

fn success() -> AttemptOutcome {
    AttemptOutcome::Succeeded {
        output: TaskOutput::Sha256 {
            hex: "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881".into(),
        },
    }
}

/// Worker w1 (capacity 1) on `conn` runs one job; returns (job, lease).
fn one_running_job(h: &mut Harness, conn: ConnectionId, max_attempts: u32) -> (JobId, LeaseId) {
    h.register(conn, 1, Vec::new());
    let job_id = h.submit(max_attempts);
    let (to, job, lease) = *h.assigns().last().expect("the job is assigned");
    assert_eq!((to, job), (conn, job_id));
    (job_id, lease)
}

// ---------------------------------------------------------------------------------------------
// Finding 1: a duplicate result is refused (`RESULT_ACK accepted=false`) while the `Complete` of
// the same result is still in flight, i.e. before the verdict is durable.
// ---------------------------------------------------------------------------------------------

/// Durability before visibility (docs/ARCHITECTURE.md): no result acknowledgement leaves before
/// the records it depends on are durable.
/// A worker reconnects (same process, new connection) and re-sends its unacknowledged result, as
/// `worker.rs` does after every registration, while the first copy's `Complete` is not durable.
#[test]
fn a_resent_result_gets_no_ack_before_the_complete_is_durable() {
    let mut h = Harness::new();
    let (job, lease) = one_running_job(&mut h, ConnectionId(10), 1);

    h.hold_writes = true;
    h.worker(
        ConnectionId(10),
        WorkerToCoordinator::TaskResult {
            job_id: job,
            lease_id: lease,
            outcome: success(),
        },
    );
    // Same process, new connection (the old one is half-open); it re-sends the result.
    h.register(ConnectionId(11), 1, Vec::new());
    h.worker(
        ConnectionId(11),
        WorkerToCoordinator::TaskResult {
            job_id: job,
            lease_id: lease,
            outcome: success(),
        },
    );
    assert!(
        !h.held.is_empty(),
        "the Complete is proposed and not yet durable"
    );
    assert_eq!(
        h.result_acks(lease),
        Vec::new(),
        "a RESULT_ACK for {lease} left while its settling Complete was not durable"
    );
}

/// The consequence: the worker drops its result on that refusal; the coordinator then crashes
/// before the `Complete` is durable; after recovery no copy of the result exists, the attempt is
/// abandoned and, being the only one, the job ends FAILED although its task succeeded and its
/// result reached the coordinator twice. Without the early refusal the worker would have re-sent
/// the result after re-registering and the attempt would have been re-adopted and completed.
#[test]
fn a_successful_result_refused_early_is_lost_by_a_crash() {
    let mut h = Harness::new();
    let (job, lease) = one_running_job(&mut h, ConnectionId(10), 1);

    h.hold_writes = true;
    let result = WorkerToCoordinator::TaskResult {
        job_id: job,
        lease_id: lease,
        outcome: success(),
    };
    h.worker(ConnectionId(10), result.clone());
    h.register(ConnectionId(11), 1, Vec::new());
    h.worker(ConnectionId(11), result.clone());
    // worker.rs: any RESULT_ACK naming the lease removes the result from `unacked`.
    let worker_still_holds_result = h.result_acks(lease).is_empty();

    h.crash_and_recover();
    h.register(ConnectionId(12), 1, Vec::new());
    if worker_still_holds_result {
        h.worker(ConnectionId(12), result);
    }
    h.advance_beating(2_000, &[ConnectionId(12)]);

    assert_eq!(
        h.state(job),
        JobState::Completed,
        "the only attempt succeeded and its result was delivered, yet the job is {} (worker kept its result: {worker_still_holds_result})",
        h.state(job)
    );
}

/// Control for the test above (passes today): had the worker kept its result, i.e. had no early
/// refusal been sent, the same crash would have ended with the attempt re-adopted and COMPLETED.
#[test]
fn control_a_result_kept_across_the_crash_is_readopted_and_completes() {
    let mut h = Harness::new();
    let (job, lease) = one_running_job(&mut h, ConnectionId(10), 1);

    h.hold_writes = true;
    let result = WorkerToCoordinator::TaskResult {
        job_id: job,
        lease_id: lease,
        outcome: success(),
    };
    h.worker(ConnectionId(10), result.clone());
    h.crash_and_recover();
    h.register(ConnectionId(12), 1, Vec::new());
    h.worker(ConnectionId(12), result);
    h.advance_beating(2_000, &[ConnectionId(12)]);
    assert_eq!(h.state(job), JobState::Completed);
}

// ---------------------------------------------------------------------------------------------
// Finding 2: a TASK_ASSIGN lost with a replaced connection leaks the worker's slot forever.
// ---------------------------------------------------------------------------------------------

/// The worker gives up on connection 10 (e.g. its coordinator watchdog fired) and registers on
/// connection 11 before the coordinator has seen 10 close: a reconnect of the same process. The
/// `TASK_ASSIGN` written to 10 is never seen by the worker. The coordinator keeps the lease in the
/// worker's slots; after the deadline it revokes it and sends `TASK_CANCEL`, which the worker
/// ignores (it never ran that lease) and so never reports. The slot is never freed: with a
/// healthy, heartbeating capacity-1 worker the retried job stays QUEUED forever, against the
/// liveness promise (invariant 10).
#[test]
fn an_assignment_lost_with_a_replaced_connection_does_not_starve_the_job() {
    let mut h = Harness::new();
    let (job, first_lease) = one_running_job(&mut h, ConnectionId(10), 3);

    // The worker never saw the TASK_ASSIGN on 10; it reconnects on 11 reporting nothing running.
    h.register(ConnectionId(11), 1, Vec::new());
    h.d.c.handle_closed(h.d.now, ConnectionId(10));
    h.pump();

    h.advance_beating(30_000, &[ConnectionId(11)]);

    let reassigned = h
        .assigns()
        .iter()
        .any(|&(conn, j, _)| conn == ConnectionId(11) && j == job);
    assert!(
        reassigned,
        "after 30 s with a healthy heartbeating worker the job is {} and never reached it; \
         w1 still counts {} lease(s) (first lease {first_lease}), cancels sent for it: {:?}",
        h.state(job),
        h.w1_leases(),
        h.cancels(first_lease)
    );
}

// ---------------------------------------------------------------------------------------------
// Finding 3: a TASK_CANCEL lost with a replaced connection is never repeated.
// ---------------------------------------------------------------------------------------------

/// The job is cancelled while running; the `TASK_CANCEL` goes to connection 10, which the worker
/// has already given up on. The worker re-registers on 11 reporting the attempt as still running.
/// `reconcile_reported` sees the lease already in the worker's slots and says nothing, so the
/// cancelled task keeps running (and holding the slot) until it ends by itself.
#[test]
fn a_cancel_lost_with_a_replaced_connection_is_repeated_on_the_new_one() {
    let mut h = Harness::new();
    let (job, lease) = one_running_job(&mut h, ConnectionId(10), 3);
    h.cancel(job);
    assert_eq!(h.state(job), JobState::Cancelled);
    assert_eq!(h.cancels(lease), vec![ConnectionId(10)]);

    h.register(
        ConnectionId(11),
        1,
        vec![RunningAttempt {
            job_id: job,
            lease_id: lease,
        }],
    );
    h.d.c.handle_closed(h.d.now, ConnectionId(10));
    h.pump();
    h.advance_beating(5_000, &[ConnectionId(11)]);

    assert!(
        h.cancels(lease).contains(&ConnectionId(11)),
        "the worker reported the cancelled attempt {lease} as running on its new connection and \
         was never told to stop it (cancels sent on: {:?}); it still holds {} slot(s)",
        h.cancels(lease),
        h.w1_leases()
    );
}

// ---------------------------------------------------------------------------------------------
// Finding 4: REGISTER's `running` list grows the worker's slot map without bound.
// ---------------------------------------------------------------------------------------------

/// A peer registers with capacity 1 and keeps re-registering on the same connection, each time
/// reporting running attempts with fresh lease ids. Every reported lease is inserted into the
/// worker's slot map and kept until the peer reports it finished, so the map (and the
/// `TASK_CANCEL` burst per REGISTER) is bounded only by how many frames the peer sends
/// (limits.rs: "a queue ... without a named limit is a bug").
#[test]
fn reported_running_attempts_cannot_grow_a_worker_beyond_its_capacity() {
    let mut h = Harness::new();
    let mut next = 1u128;
    for _ in 0..20 {
        let running = (0..50)
            .map(|_| {
                next += 1;
                RunningAttempt {
                    job_id: JobId(uuid::Uuid::from_u128(next)),
                    lease_id: LeaseId(uuid::Uuid::from_u128(1 << 64 | next)),
                }
            })
            .collect();
        h.register(ConnectionId(10), 1, running);
    }
    assert!(
        h.w1_leases() <= 1,
        "a capacity-1 worker entry holds {} leases",
        h.w1_leases()
    );
}
