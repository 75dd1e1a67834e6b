//! Where log lines go: a shared buffer in memory that one background thread writes out.
//!
//! A busy coordinator logs several lines per job, tens of thousands a second. Writing each one
//! to stderr as it is made would cost a system call per line and let a slow terminal stall the
//! driver; handing each line to a thread one by one costs an allocation and a thread wake-up
//! per line. Here a line is appended to one buffer under a lock, and the writer thread takes
//! the whole buffer at once: it wakes when the first line arrives, waits [`FLUSH_INTERVAL`] for
//! more (or until [`WAKE_BYTES`] wait), and writes them in one go. So a line reaches stderr
//! within about that interval, and a burst of thousands costs a handful of writes.
//!
//! Lines are never dropped while stderr takes them: beyond [`BUFFER_MAX_BYTES`] a logging
//! thread waits for the writer. A write stderr refuses loses the lines it held; once stderr is
//! gone for good (a closed pipe), later lines are discarded instead of stalling the process. At
//! exit the guard waits at most [`SHUTDOWN_WAIT`] for the last write, so a stderr that nobody
//! reads cannot keep the process from exiting; lines logged after that are discarded.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How long the writer gathers lines after the first one before writing them.
const FLUSH_INTERVAL: Duration = Duration::from_millis(20);
/// Waiting bytes that wake the writer before the interval is over.
const WAKE_BYTES: usize = 64 * 1024;
/// Waiting bytes beyond which a thread that logs waits for the writer to catch up: some
/// 100,000 lines, seconds of a busy coordinator's logging, so a stderr that stalls briefly
/// does not stall the process.
const BUFFER_MAX_BYTES: usize = 16 * 1024 * 1024;
/// How long the guard waits at exit for the writer's last write.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

struct State {
    lines: Vec<u8>,
    /// The guard was dropped: write what is left and stop.
    closed: bool,
    /// The output is gone for good (a closed pipe); lines are discarded from then on.
    broken: bool,
    /// The writer thread wrote its last lines and stopped.
    finished: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer: the first line arrived, enough is waiting, or the guard was dropped.
    wake: Condvar,
    /// Wakes threads waiting for room once the writer took the buffer, and the guard once the
    /// writer has finished.
    drained: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A thread that panicked while appending left at worst a partial line.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The `MakeWriter` handed to the subscriber.
#[derive(Clone)]
pub struct BufferedStderr {
    shared: Arc<Shared>,
}

/// Writes what is left when dropped, and stops the writer thread.
pub struct FlushGuard {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
}

/// Starts the writer thread on `out` (stderr, or anything else for tests).
pub fn start(out: impl Write + Send + 'static) -> std::io::Result<(BufferedStderr, FlushGuard)> {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            lines: Vec::with_capacity(WAKE_BYTES),
            closed: false,
            broken: false,
            finished: false,
        }),
        wake: Condvar::new(),
        drained: Condvar::new(),
    });
    let for_writer = shared.clone();
    let writer = std::thread::Builder::new()
        .name("herder-log".into())
        .spawn(move || write_loop(&for_writer, out))?;
    Ok((
        BufferedStderr {
            shared: shared.clone(),
        },
        FlushGuard {
            shared,
            writer: Some(writer),
        },
    ))
}

fn write_loop(shared: &Shared, mut out: impl Write) {
    let mut taken = Vec::with_capacity(WAKE_BYTES);
    loop {
        let closed = {
            let mut state = shared.lock();
            while state.lines.is_empty() && !state.closed {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            // Gather for the interval unless enough is already waiting.
            let until = Instant::now() + FLUSH_INTERVAL;
            while !state.closed && state.lines.len() < WAKE_BYTES {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                state = shared
                    .wake
                    .wait_timeout(state, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            std::mem::swap(&mut state.lines, &mut taken);
            shared.drained.notify_all();
            state.closed
        };
        if !taken.is_empty() {
            // A refused write loses its lines; only a closed pipe stops logging for good
            // (a full disk or an interrupted write may pass).
            if let Err(error) = out.write_all(&taken).and_then(|()| out.flush()) {
                if error.kind() == std::io::ErrorKind::BrokenPipe {
                    shared.lock().broken = true;
                    shared.drained.notify_all();
                }
            }
            taken.clear();
        }
        if closed {
            shared.lock().finished = true;
            shared.drained.notify_all();
            return;
        }
    }
}

impl Write for &BufferedStderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let shared = &self.shared;
        let mut state = shared.lock();
        while state.lines.len() >= BUFFER_MAX_BYTES && !state.broken && !state.closed {
            state = shared
                .drained
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        // Nobody will write lines logged once the writer has stopped, and at exit nobody waits
        // for room.
        if state.broken || state.finished || state.lines.len() >= BUFFER_MAX_BYTES {
            return Ok(bytes.len());
        }
        let before = state.lines.len();
        state.lines.extend_from_slice(bytes);
        // Only the first line of a batch, and the one that fills it, wake the writer.
        if before == 0 || (before < WAKE_BYTES && state.lines.len() >= WAKE_BYTES) {
            shared.wake.notify_one();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BufferedStderr {
    type Writer = &'a BufferedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        let shared = &self.shared;
        let mut state = shared.lock();
        state.closed = true;
        shared.wake.notify_one();
        shared.drained.notify_all();
        // Bounded: a writer stuck on a stderr nobody reads is left behind, not waited for.
        let (state, _) = shared
            .drained
            .wait_timeout_while(state, SHUTDOWN_WAIT, |state| !state.finished)
            .unwrap_or_else(PoisonError::into_inner);
        let finished = state.finished;
        drop(state);
        if let Some(writer) = self.writer.take() {
            if finished {
                let _ = writer.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output that keeps what it was given, or refuses every write.
    #[derive(Clone, Default)]
    struct Capture {
        bytes: Arc<Mutex<Vec<u8>>>,
        refuse: bool,
    }

    impl Write for Capture {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if self.refuse {
                return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
            }
            self.bytes.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_from_every_thread_is_written_whole_and_in_each_threads_order() {
        let capture = Capture::default();
        let (writer, guard) = start(capture.clone()).unwrap();
        // Enough to pass the wake threshold and the bound several times over.
        let lines_per_thread = 20_000;
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..lines_per_thread {
                        let line = format!("thread {t} line {i} {}\n", "x".repeat(40));
                        (&writer).write_all(line.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        drop(guard);
        let written = String::from_utf8(capture.bytes.lock().unwrap().clone()).unwrap();
        let mut next = [0usize; 4];
        for line in written.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            let t: usize = words[1].parse().unwrap();
            assert_eq!(words[3].parse::<usize>().unwrap(), next[t], "{line}");
            next[t] += 1;
        }
        assert_eq!(next, [lines_per_thread; 4]);
    }

    #[test]
    fn a_closed_pipe_discards_lines_instead_of_stalling_the_logger() {
        let capture = Capture {
            refuse: true,
            ..Capture::default()
        };
        let (writer, guard) = start(capture.clone()).unwrap();
        // More than the bound: without the broken flag the second half would wait forever.
        let line = [b'y'; 1024];
        for _ in 0..(3 * BUFFER_MAX_BYTES / line.len()) {
            (&writer).write_all(&line).unwrap();
        }
        drop(guard);
        assert!(capture.bytes.lock().unwrap().is_empty());
    }

    /// An output whose every write blocks until the test ends, like a pipe nobody reads.
    struct Stuck(std::sync::mpsc::Receiver<()>);

    impl Write for Stuck {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_output_does_not_keep_the_guard_from_returning() {
        let (release, stuck) = std::sync::mpsc::channel();
        let (writer, guard) = start(Stuck(stuck)).unwrap();
        (&writer).write_all(b"a line nobody reads\n").unwrap();
        // Returns (after SHUTDOWN_WAIT) instead of joining the stuck writer forever.
        drop(guard);
        // The writer has not finished, so a late line still goes to the buffer, bounded.
        (&writer).write_all(b"after the end\n").unwrap();
        assert!(!writer.shared.lock().finished);
        drop(release);
    }

    #[test]
    fn a_failed_write_other_than_a_closed_pipe_loses_only_its_own_lines() {
        /// Refuses its first write (a full disk, say), then takes everything.
        #[derive(Clone, Default)]
        struct FailsOnce {
            bytes: Arc<Mutex<Vec<u8>>>,
            failed: Arc<Mutex<bool>>,
        }
        impl Write for FailsOnce {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                let mut failed = self.failed.lock().unwrap();
                if !*failed {
                    *failed = true;
                    return Err(std::io::Error::other("no space left"));
                }
                self.bytes.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let output = FailsOnce::default();
        let (writer, guard) = start(output.clone()).unwrap();
        (&writer).write_all(b"lost\n").unwrap();
        // Wait until the writer has tried (and failed) the first write.
        while !*output.failed.lock().unwrap() {
            std::thread::yield_now();
        }
        (&writer).write_all(b"kept\n").unwrap();
        drop(guard);
        assert_eq!(output.bytes.lock().unwrap().as_slice(), b"kept\n");
    }
}
