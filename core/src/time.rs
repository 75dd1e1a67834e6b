//! Core's own notion of time.
//!
//! Nothing in `core` reads a clock. Every input carries `now: Instant`, supplied by the driver:
//! the runtime maps its monotonic clock onto microseconds since it started, the simulator hands
//! out virtual time. An `Instant` is only comparable with instants from the same driver process;
//! that is why nothing durable ever stores one (see `coordinator` recovery).

use std::fmt;
use std::time::Duration;

/// A point on a driver's monotonic clock, in microseconds since the driver's epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The driver's epoch.
    pub const ZERO: Instant = Instant(0);

    pub const fn from_micros(micros: u64) -> Instant {
        Instant(micros)
    }

    pub const fn from_millis(millis: u64) -> Instant {
        Instant(millis.saturating_mul(1_000))
    }

    pub const fn as_micros(self) -> u64 {
        self.0
    }

    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000
    }

    /// `self + duration`, saturating at the end of time instead of overflowing.
    pub fn saturating_add(self, duration: Duration) -> Instant {
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(micros))
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}s", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

/// A wall-clock time: milliseconds since the Unix epoch, as a leader's clock read it.
///
/// Core reads no clock, wall or monotonic. A leader stamps each entry it proposes with the
/// wall time its driver says it is (the driver's epoch in wall time plus the monotonic time
/// since), so the stamp travels in the log and every member sees the same one. Stamps are for
/// people (when a job was created or finished) and for retention by age; nothing that decides
/// safety reads them.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// No stamp (an entry written before entries carried one, or one that changes no job).
    pub const UNSTAMPED: UnixMillis = UnixMillis(0);

    pub fn is_unstamped(&self) -> bool {
        *self == UnixMillis::UNSTAMPED
    }

    /// The wall time `now` falls on, for a driver whose epoch was at wall time `self`.
    pub fn at(self, now: Instant) -> UnixMillis {
        UnixMillis(self.0.saturating_add(now.as_millis()))
    }

    /// `self - age`, or `None` if that is before the Unix epoch (nothing is that old).
    pub fn checked_sub(self, age: Duration) -> Option<UnixMillis> {
        self.0.checked_sub(as_millis_u64(age)).map(UnixMillis)
    }
}

/// Milliseconds as carried on the wire and in configuration.
pub fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A duration in whole milliseconds, saturating, for the wire.
pub fn as_millis_u64(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        let late = Instant::from_micros(u64::MAX - 1);
        assert_eq!(
            late.saturating_add(Duration::from_secs(1)),
            Instant::from_micros(u64::MAX)
        );
        assert_eq!(Instant::ZERO.saturating_since(late), Duration::ZERO);
        assert_eq!(
            Instant::from_millis(5).saturating_since(Instant::from_millis(2)),
            millis(3)
        );
    }
}
