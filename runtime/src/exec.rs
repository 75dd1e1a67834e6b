//! `exec` tasks: run a command on the worker, without a shell, if the worker's allow-list
//! admits the program.
//!
//! - **Refused before it runs**: a program no `--allow-exec` pattern matches fails its job at
//!   once (permanently), and nothing is started.
//! - **Controlled**: the command starts in the worker's exec directory (or the task's `cwd`
//!   inside it) with a clean environment: `PATH`, `HERDER_JOB_ID`, `HERDER_ATTEMPT`, and what
//!   the task sets. Stdin is empty.
//! - **Bounded**: the first [`EXEC_OUTPUT_BYTES_MAX`] bytes of stdout and of stderr are kept;
//!   the rest is read and dropped, and the result says so.
//! - **Hard cancellation**: the command runs in a process group of its own. On a cancel, at its
//!   deadline, or when a drain hands it back, the whole group gets SIGTERM, then SIGKILL once
//!   the grace period has passed. When the command exits, anything it left running in its
//!   group is killed too, so nothing outlives its attempt.
//! - Exit code 0 succeeds; any other exit, or death by a signal, is a retryable failure whose
//!   message carries the code and the end of stderr.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use herder_core::limits::{ATTEMPT_ERROR_BYTES_MAX, EXEC_OUTPUT_BYTES_MAX};
use herder_core::tasks::{TaskFailure, TaskOutput, TaskSpec};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::handlers::{Handler, HandlerFuture, TaskContext};

/// How long a cancelled command gets between SIGTERM and SIGKILL, unless told otherwise.
pub const EXEC_GRACE_DEFAULT: Duration = Duration::from_secs(5);

/// Which programs a worker runs, and how.
#[derive(Clone, Debug)]
pub struct ExecPolicy {
    /// Patterns a task's program (`argv[0]`, exactly as given) must match: `*` stands for any
    /// run of characters other than `/`, everything else for itself.
    pub allow: Vec<String>,
    /// Where commands run (a task's `cwd` is taken inside it).
    pub dir: PathBuf,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

impl ExecPolicy {
    pub fn new(allow: Vec<String>) -> ExecPolicy {
        ExecPolicy {
            allow,
            dir: PathBuf::from("."),
            grace: EXEC_GRACE_DEFAULT,
        }
    }

    /// Whether `program` may run.
    pub fn admits(&self, program: &str) -> bool {
        self.allow
            .iter()
            .any(|pattern| glob_matches(pattern.as_bytes(), program.as_bytes()))
    }
}

/// `*` matches any run of bytes other than `/`; every other byte matches itself.
fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => {
            // Try every split point up to the next `/`.
            let mut end = 0;
            loop {
                if glob_matches(rest, &text[end..]) {
                    return true;
                }
                if end == text.len() || text[end] == b'/' {
                    return false;
                }
                end += 1;
            }
        }
        Some((first, rest)) => text
            .split_first()
            .is_some_and(|(t, text)| t == first && glob_matches(rest, text)),
    }
}

/// The `exec` handler.
pub struct Exec {
    policy: ExecPolicy,
}

impl Exec {
    pub fn new(policy: ExecPolicy) -> Exec {
        Exec { policy }
    }
}

impl Handler for Exec {
    fn start(&self, task: TaskSpec, context: TaskContext) -> HandlerFuture {
        let TaskSpec::Exec { argv, cwd, env } = task else {
            let kind = task.kind().to_owned();
            return Box::pin(std::future::ready(Err(TaskFailure::permanent(format!(
                "the exec handler was given a {kind:?} task"
            )))));
        };
        let program = argv.first().cloned().unwrap_or_default();
        if !self.policy.admits(&program) {
            let message = format!(
                "exec refused: program {program:?} matches no --allow-exec pattern of this worker (allowed: {}); nothing was run",
                self.policy.allow.join(", ")
            );
            return Box::pin(std::future::ready(Err(TaskFailure::permanent(message))));
        }
        let dir = match &cwd {
            Some(cwd) => self.policy.dir.join(cwd),
            None => self.policy.dir.clone(),
        };
        let grace = self.policy.grace;
        Box::pin(async move { run(&argv, &dir, &env, grace, &context).await })
    }
}

async fn run(
    argv: &[String],
    dir: &Path,
    env: &BTreeMap<String, String>,
    grace: Duration,
    context: &TaskContext,
) -> Result<TaskOutput, TaskFailure> {
    let mut command = tokio::process::Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .current_dir(dir)
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()),
        )
        .env("HERDER_JOB_ID", context.job_id.to_string())
        .env("HERDER_ATTEMPT", context.attempt.to_string())
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|error| {
        // A missing program or directory will be missing on the next attempt too.
        TaskFailure::permanent(format!(
            "cannot start {:?} in {}: {error}",
            argv[0],
            dir.display()
        ))
    })?;
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    let stdout = tokio::spawn(read_bounded(child.stdout.take()));
    let stderr = tokio::spawn(read_bounded(child.stderr.take()));
    let status = tokio::select! {
        status = child.wait() => status,
        _ = context.cancelled.cancelled() => {
            signal_group(group, libc::SIGTERM);
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    signal_group(group, libc::SIGKILL);
                    child.wait().await
                }
            }
        }
    };
    // Whatever the command left behind in its group goes with it (and lets the pipes close).
    signal_group(group, libc::SIGKILL);
    let (stdout, stdout_truncated) = stdout.await.unwrap_or_default();
    let (stderr, stderr_truncated) = stderr.await.unwrap_or_default();
    let status = status
        .map_err(|error| TaskFailure::new(format!("cannot wait for the command: {error}")))?;
    if context.cancelled.is_cancelled() {
        return Err(TaskFailure::new("stopped: the command was killed"));
    }
    if status.success() {
        let mut output = TaskOutput::Exec {
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
        };
        fit_result(&mut output);
        return Ok(output);
    }
    use std::os::unix::process::ExitStatusExt;
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended abnormally".to_string(),
    };
    let tail = tail_of(&stderr, ATTEMPT_ERROR_BYTES_MAX / 2);
    Err(TaskFailure::new(if tail.is_empty() {
        format!("the command {how}")
    } else {
        format!("the command {how}; stderr ends: {tail}")
    }))
}

fn signal_group(group: Option<i32>, signal: i32) {
    if let Some(pgid) = group.filter(|&pgid| pgid > 0) {
        // SAFETY: `kill` takes plain integers and touches no memory of ours; a group that is
        // already gone only makes it return ESRCH.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Reads a pipe to its end, keeping the first [`EXEC_OUTPUT_BYTES_MAX`] bytes.
async fn read_bounded<R: AsyncRead + Unpin>(pipe: Option<R>) -> (String, bool) {
    let Some(mut pipe) = pipe else {
        return (String::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buffer = [0u8; 8192];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = EXEC_OUTPUT_BYTES_MAX - kept.len();
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buffer[..n.min(room)]);
            }
        }
    }
    (String::from_utf8_lossy(&kept).into_owned(), truncated)
}

/// Cuts the longer stream until the result fits the result bound (control bytes escape to six
/// characters each in JSON, so raw bytes alone do not bound it).
fn fit_result(output: &mut TaskOutput) {
    while output.oversize().is_some() {
        let TaskOutput::Exec {
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
        } = output
        else {
            return;
        };
        let (text, flag) = if stdout.len() >= stderr.len() {
            (stdout, stdout_truncated)
        } else {
            (stderr, stderr_truncated)
        };
        let mut keep = text.len() / 2;
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        text.truncate(keep);
        *flag = true;
    }
}

/// The last `max` bytes of `text` (at a character boundary).
fn tail_of(text: &str, max: usize) -> &str {
    let text = text.trim_end();
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_matches_within_one_path_segment() {
        let policy = ExecPolicy::new(vec![
            "/opt/jobs/*".into(),
            "true".into(),
            "/bin/ec*o".into(),
        ]);
        assert!(policy.admits("/opt/jobs/resize"));
        assert!(policy.admits("/opt/jobs/"));
        assert!(!policy.admits("/opt/jobs/sub/resize"));
        assert!(!policy.admits("/opt/jobs/../../bin/sh"));
        assert!(policy.admits("true"));
        assert!(!policy.admits("/bin/true"));
        assert!(!policy.admits("truer"));
        assert!(policy.admits("/bin/echo"));
        assert!(policy.admits("/bin/eco"));
        assert!(!policy.admits("/bin/ec/o"));
        assert!(!ExecPolicy::new(Vec::new()).admits("true"));
    }

    #[test]
    fn an_oversized_output_is_cut_to_fit_and_says_so() {
        let mut output = TaskOutput::Exec {
            stdout: "\u{1}".repeat(EXEC_OUTPUT_BYTES_MAX),
            stderr: "\u{1}".repeat(EXEC_OUTPUT_BYTES_MAX),
            stdout_truncated: false,
            stderr_truncated: false,
        };
        assert!(output.oversize().is_some());
        fit_result(&mut output);
        assert!(output.oversize().is_none());
        let TaskOutput::Exec {
            stdout_truncated,
            stderr_truncated,
            ..
        } = output
        else {
            unreachable!()
        };
        assert!(stdout_truncated && stderr_truncated);
    }

    #[test]
    fn the_tail_is_cut_at_a_character_boundary() {
        assert_eq!(tail_of("aé\n", 2), "é");
        assert_eq!(tail_of("abc", 2), "bc");
    }
}
