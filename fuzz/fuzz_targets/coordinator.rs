//! A coordinator driven by an arbitrary sequence of client and worker messages (decoded from
//! the input as the wire would), connection closes, time passing and disk writes landing. After
//! every output it produces, the shared test driver checks its invariants (the job table's, and
//! that no worker holds more attempts than its capacity and prefetch allow). Bad input must never
//! panic it.
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

use herder_core::coordinator::{CoordinatorConfig, Link};
use herder_core::ids::ConnectionId;
use herder_core::protocol::codec::{decode_message, FrameError};
use herder_core::protocol::{ClientRequest, WorkerToCoordinator};
use herder_core::testing::Driver;
use libfuzzer_sys::fuzz_target;

const CLIENT_CONNS: u64 = 4;
const WORKER_CONNS: u64 = 4;

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
    // The shared test driver checks the invariants after every output; writes are held until
    // a step lands them.
    let Ok(mut h) = Driver::new(config, 7) else {
        return;
    };
    h.release_writes();
    h.hold_writes = true;
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
                h.advance(Duration::from_millis(25 * u64::from(ticks)));
            }
            3 => {
                h.release_writes();
                h.hold_writes = true;
            }
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
        h.sent.clear();
    }
    h.release_writes();
});
