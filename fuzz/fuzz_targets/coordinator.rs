//! A coordinator driven by an arbitrary sequence of client and worker messages (decoded from
//! the input as the wire would), connection closes, time passing and disk writes landing. After
//! every step its job table must hold its invariants and no worker may hold more attempts than
//! its capacity. Bad input must never panic it.
//!
//! The input is a sequence of steps, each one byte of kind followed by its arguments:
//!
//! | kind % 6 | step |
//! |---|---|
//! | 0 | a client frame: connection byte, 2-byte length, that many bytes of JSON |
//! | 1 | a worker frame: connection byte, 2-byte length, that many bytes of JSON |
//! | 2 | time passes: one byte, times 25 ms |
//! | 3 | every held disk write lands |
//! | 4 | a connection closes: connection byte |
//! | 5 | a malformed frame on a connection: connection byte |

#![no_main]

use std::time::Duration;

use herder_core::coordinator::{Coordinator, CoordinatorConfig, Link, Output, PersistBatch};
use herder_core::ids::ConnectionId;
use herder_core::protocol::codec::{decode_message, FrameError};
use herder_core::protocol::{ClientRequest, WorkerToCoordinator};
use herder_core::time::Instant;
use libfuzzer_sys::fuzz_target;

const CLIENT_CONNS: u64 = 4;
const WORKER_CONNS: u64 = 4;

struct Harness {
    c: Coordinator,
    now: Instant,
    held: Vec<PersistBatch>,
}

impl Harness {
    fn pump(&mut self) {
        while let Some(output) = self.c.poll_output() {
            if let Output::Persist(batch) = output {
                self.held.push(batch);
            }
        }
        if let Err(broken) = self.c.table().check_invariants() {
            panic!("job table invariant broken: {broken}");
        }
        for worker in self.c.workers() {
            assert!(
                worker.leases.len() <= worker.capacity as usize,
                "worker {} holds {} attempts with capacity {}",
                worker.id,
                worker.leases.len(),
                worker.capacity
            );
        }
    }

    fn land_writes(&mut self) {
        for batch in std::mem::take(&mut self.held) {
            self.c.handle_persisted(self.now, batch.id);
            self.pump();
        }
    }
}

fn conn(link: Link, byte: u8) -> ConnectionId {
    match link {
        Link::Client => ConnectionId(1 + u64::from(byte) % CLIENT_CONNS),
        Link::Worker => ConnectionId(100 + u64::from(byte) % WORKER_CONNS),
    }
}

fuzz_target!(|data: &[u8]| {
    let config = CoordinatorConfig {
        max_active_jobs: 8,
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(300),
        task_timeout: Duration::from_millis(2_000),
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(100),
        ..CoordinatorConfig::default()
    };
    let Ok(c) = Coordinator::new(config, 7) else {
        return;
    };
    let mut h = Harness {
        c,
        now: Instant::ZERO,
        held: Vec::new(),
    };
    h.pump();
    h.land_writes();
    let mut rest = data;
    while let Some((&kind, after)) = rest.split_first() {
        rest = after;
        match kind % 6 {
            kind @ (0 | 1) => {
                let [c, hi, lo, tail @ ..] = rest else {
                    break;
                };
                let len = (usize::from(*hi) << 8 | usize::from(*lo)).min(tail.len());
                let (payload, tail) = tail.split_at(len);
                rest = tail;
                if kind == 0 {
                    if let Ok(message) = decode_message::<ClientRequest>(payload) {
                        h.c.handle_client_message(h.now, conn(Link::Client, *c), &herder_core::auth::Caller::anonymous(), message);
                    }
                } else if let Ok(message) = decode_message::<WorkerToCoordinator>(payload) {
                    h.c.handle_worker_message(h.now, conn(Link::Worker, *c), message);
                }
            }
            2 => {
                let Some((&ticks, tail)) = rest.split_first() else {
                    break;
                };
                rest = tail;
                h.now = h
                    .now
                    .saturating_add(Duration::from_millis(25 * u64::from(ticks)));
                h.c.handle_timeout(h.now);
            }
            3 => h.land_writes(),
            4 => {
                let Some((&c, tail)) = rest.split_first() else {
                    break;
                };
                rest = tail;
                let link = if c % 2 == 0 {
                    Link::Client
                } else {
                    Link::Worker
                };
                h.c.handle_closed(h.now, conn(link, c));
            }
            _ => {
                let Some((&c, tail)) = rest.split_first() else {
                    break;
                };
                rest = tail;
                let link = if c % 2 == 0 {
                    Link::Client
                } else {
                    Link::Worker
                };
                h.c.handle_malformed(h.now, conn(link, c), link, &FrameError::EmptyFrame);
            }
        }
        h.pump();
    }
    h.land_writes();
});
