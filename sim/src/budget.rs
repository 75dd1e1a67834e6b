//! What one seed may use, and how a panic inside a seed is caught.
//!
//! A bug can make a seed run forever: a leader and a follower that trade appends and
//! rejections at once, or events that each schedule two more. Without a bound such a seed
//! never ends, eats memory, and the seeds after it never run. So every seed runs under the
//! budgets below; a seed that exceeds one fails with `livelock: ...`, and the run goes on.
//! In the same way a panic inside a seed (a core assertion, an index out of range) fails that
//! seed with `panic at FILE:LINE: MESSAGE` instead of ending the whole process.
//!
//! Each budget is set about ten times above the most any honest seed was measured to use, so
//! no honest seed trips one. Simulated time needs no budget of its own: the run loop already
//! ends a seed at its scenario's deadline (fault span + liveness span). What can run past
//! every bound is a loop in which time stands still or the work in flight keeps growing;
//! these budgets catch both.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

// The maxima below were measured over about 49,000 honest seeds: swarm seeds 0..25000,
// `--standard` 0..5000, `--standard-group` 0..10000, `--leader-crashes` 0..3000 and
// `--single` 0..3000. `herder-sim run` prints the most any one seed used of each budget
// ("most used by one seed"), so they are easy to measure again when the scenarios grow.

/// Steps (events handled plus timers fired) one seed may take.
///
/// Measured: at most 25,449 (swarm seed 19272); a typical seed takes 5,000 to 15,000. This
/// catches a loop in which time moves on, but too slowly for the deadline to end it soon.
/// A seed that reaches it has run for about a second.
pub const STEPS_MAX: u64 = 300_000;

/// Steps one seed may take at one instant of virtual time.
///
/// Measured: at most 29 (`--single` seed 2771). When a partition heals, everything it held on
/// a connection is delivered at one instant, so an honest seed could take as many steps at
/// once as it has work in flight; the limit is about ten times that measured maximum, not
/// ten times 29. This catches a loop in which time stands still, such as an event that
/// schedules itself again with no delay.
pub const STEPS_AT_ONE_INSTANT_MAX: u64 = 2_000;

/// Work in flight at once: events queued, messages held on connections by partitions, events
/// waiting at paused nodes, and disk batches not yet durable.
///
/// This is the proxy for memory. Almost everything a seed holds beyond its fixed set of
/// nodes is one of these, and counting them costs a few additions, where measuring bytes
/// would cost a walk over every message. Measured: at most 162 (swarm seed 7652). This
/// catches work that multiplies, such as each rejected append answered by two more.
pub const IN_FLIGHT_MAX: usize = 2_000;

/// How often (in steps) the whole of the work in flight is counted. The queue alone is
/// checked every step, as that costs one comparison; the rest means a walk over every
/// connection and node, so it is counted only every so many steps. Held messages and paused
/// nodes' inboxes grow by at most a few per step, so the budget is overshot by little.
pub const IN_FLIGHT_EVERY: u64 = 64;

/// Trace lines shown with a livelock or a panic: the last events before it.
pub const TAIL_LINES: usize = 20;

/// The most trace lines a traced run keeps; past this the oldest are dropped. An honest seed
/// writes far fewer (37,110 for the seed with the most steps), but a seed that runs away
/// while traced could write many more before a budget stops it.
pub const TRACE_LINES_MAX: usize = 1_000_000;

/// A bug planted in one seed on purpose, to show that the budgets and the panic catch work:
/// the seed must fail with its number and the run must go on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sabotage {
    #[default]
    None,
    /// Panics inside the world halfway through the fault span.
    Panic,
    /// From halfway through the fault span, an event schedules itself again at the same
    /// instant, forever: time stands still and the budget of steps at one instant trips.
    Runaway,
    /// From halfway through the fault span, an event schedules two more a millisecond later,
    /// forever: the work in flight doubles every millisecond and its budget trips.
    Flood,
}

thread_local! {
    /// How many `catch` calls this thread is inside: a panic there is a seed's failure.
    static IN_SEED: Cell<u32> = const { Cell::new(0) };
    /// Where the last panic inside a seed struck, and what it said.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Runs `f` (one seed's simulation), turning a panic into `Err("at FILE:LINE: MESSAGE")`.
///
/// A panic inside a seed prints nothing: a run of thousands of seeds reports it once, as the
/// seed's failure. A panic anywhere else (on another thread, or outside `catch`) still goes
/// to the hook that was there before.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if IN_SEED.try_with(Cell::get).unwrap_or(0) == 0 {
                previous(info);
                return;
            }
            let place = info.location().map_or_else(
                || "an unknown place".to_owned(),
                |l| format!("{}:{}", l.file(), l.line()),
            );
            let text = format!("at {place}: {}", message(info.payload()));
            let _ = LAST_PANIC.try_with(|last| *last.borrow_mut() = Some(text));
        }));
    });
    IN_SEED.with(|depth| depth.set(depth.get() + 1));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    IN_SEED.with(|depth| depth.set(depth.get().saturating_sub(1)));
    result.map_err(|payload| {
        LAST_PANIC
            .with(|last| last.borrow_mut().take())
            .unwrap_or_else(|| format!("at an unknown place: {}", message(&*payload)))
    })
}

/// The text a panic was given (`panic!` with a literal or with a format).
fn message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(a panic without a message)"
    }
}
