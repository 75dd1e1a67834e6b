//! Pure building blocks for data-parallel jobs: MAX over a list, PRIME-COUNT over a list and
//! PRIME-SUM over a range `start..=end` of `i64`.
//!
//! A job's input is split into balanced contiguous pieces ([`partition`]), each piece is computed
//! independently (the max of a slice is `iter().max()`; primes come from [`primes`]), and the
//! partial results combine by max or by addition, so any split gives the same answer. Number
//! lists arrive as CSV-ish text and are parsed by [`numbers`].
//!
//! Like the rest of the crate this does no I/O and reads no clock: a long range is cancelled
//! through the `should_stop` callback of [`primes_in_range`], which the caller wires to its own
//! notion of time or cancellation.

pub mod numbers;
pub mod partition;
pub mod primes;

pub use numbers::{parse_column, parse_numbers, Column, NumbersError, NUMBERS_MAX};
pub use partition::{split_list, split_range};
pub use primes::{is_prime, primes_in_range, PrimeStats};
