//! The real clock, mapped onto core's `Instant` (microseconds since this process's epoch).

use std::time::Duration;

use herder_core::time::{Instant, UnixMillis};

/// A monotonic clock anchored when the process (or test) created it.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: tokio::time::Instant,
    /// The wall time at `epoch`, in milliseconds since the Unix epoch.
    wall_at_epoch: u64,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            epoch: tokio::time::Instant::now(),
            wall_at_epoch: read_wall_clock().0,
        }
    }

    /// The wall time at this clock's epoch: a coordinator stamps entries with it plus the
    /// monotonic time since, so a wall-clock step while it runs moves no stamp.
    pub fn wall_at_epoch(&self) -> UnixMillis {
        UnixMillis(self.wall_at_epoch)
    }

    pub fn now(&self) -> Instant {
        Instant::from_micros(u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    /// The tokio instant at which core's `at` falls due.
    pub fn deadline(&self, at: Instant) -> tokio::time::Instant {
        self.epoch + Duration::from_micros(at.as_micros())
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

/// The system's wall clock now (0 if it reads before 1970).
pub fn read_wall_clock() -> UnixMillis {
    UnixMillis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            }),
    )
}

/// A seed for a state machine's RNG from the OS (the runtime may use OS randomness; core may not).
/// Every process start draws a new one, so ids never repeat across restarts.
pub fn os_seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Sleeps until `deadline`, or forever when there is none (a machine with no timer armed).
pub async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
