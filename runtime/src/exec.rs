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
use crate::worker::DRAIN_STOP_WAIT;

/// After a command exits, how long its output pipes may stay open (held by something it
/// started outside its process group) before the attempt stops reading them.
const PIPE_DRAIN_WAIT: Duration = Duration::from_secs(1);

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

    /// Refuses patterns that could not mean what they seem: each must be a bare program name
    /// (looked up on the worker's `PATH`) or an absolute path, since a relative path would be
    /// resolved against a directory the task chooses.
    pub fn validate(&self) -> Result<(), String> {
        if self.allow.is_empty() {
            return Err("an exec policy needs at least one --allow-exec pattern".into());
        }
        for pattern in &self.allow {
            if pattern.is_empty() || (pattern.contains('/') && !pattern.starts_with('/')) {
                return Err(format!(
                    "--allow-exec {pattern:?}: a pattern is a bare program name or an absolute path"
                ));
            }
        }
        if self.grace >= DRAIN_STOP_WAIT {
            return Err(format!(
                "--exec-grace must be under {} s, so a drain kills what it hands back",
                DRAIN_STOP_WAIT.as_secs()
            ));
        }
        Ok(())
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
    /// The handler for `policy`; see [`ExecPolicy::validate`].
    pub fn new(policy: ExecPolicy) -> Result<Exec, String> {
        policy.validate()?;
        Ok(Exec { policy })
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
        let dir = match working_dir(&self.policy.dir, cwd.as_deref()) {
            Ok(dir) => dir,
            Err(message) => {
                return Box::pin(std::future::ready(Err(TaskFailure::permanent(message))))
            }
        };
        let grace = self.policy.grace;
        Box::pin(async move { run(&argv, &dir, &env, grace, &context).await })
    }
}

/// The task's working directory, which must resolve (symbolic links followed) inside the
/// worker's exec directory.
fn working_dir(base: &Path, cwd: Option<&str>) -> Result<PathBuf, String> {
    let base = std::fs::canonicalize(base).map_err(|error| {
        format!(
            "the worker's exec directory {} is unusable: {error}",
            base.display()
        )
    })?;
    let Some(cwd) = cwd else {
        return Ok(base);
    };
    let dir = std::fs::canonicalize(base.join(cwd))
        .map_err(|error| format!("cwd {cwd:?} cannot be used: {error}"))?;
    if !dir.starts_with(&base) {
        return Err(format!(
            "exec refused: cwd {cwd:?} resolves to {}, outside the worker's exec directory; nothing was run",
            dir.display()
        ));
    }
    Ok(dir)
}

/// The program to start: an absolute path as given, or a bare name looked up on the worker's
/// own `PATH` (never the task's).
fn resolve_program(program: &str) -> Result<PathBuf, TaskFailure> {
    if program.starts_with('/') {
        return Ok(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            TaskFailure::permanent(format!("program {program:?} is not on this worker's PATH"))
        })
}

/// SIGKILLs a command's process group when dropped, so a worker that exits (or an attempt
/// abandoned for any reason) leaves nothing of the command running.
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        signal_group(self.0, libc::SIGKILL);
    }
}

async fn run(
    argv: &[String],
    dir: &Path,
    env: &BTreeMap<String, String>,
    grace: Duration,
    context: &TaskContext,
) -> Result<TaskOutput, TaskFailure> {
    let program = resolve_program(&argv[0])?;
    let mut command = tokio::process::Command::new(&program);
    command
        .arg0(&argv[0])
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
        let message = format!("cannot start {:?} in {}: {error}", argv[0], dir.display());
        // A missing or forbidden program will be so on the next attempt too; running out of
        // processes or descriptors may pass.
        match error.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                TaskFailure::permanent(message)
            }
            _ => TaskFailure::new(message),
        }
    })?;
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    let _guard = GroupGuard(group);
    let stdout_buffer = Captured::default();
    let stderr_buffer = Captured::default();
    let mut stdout = tokio::spawn(read_bounded(child.stdout.take(), stdout_buffer.clone()));
    let mut stderr = tokio::spawn(read_bounded(child.stderr.take(), stderr_buffer.clone()));
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
    // Something it started outside the group may hold the pipes open: read what is there.
    let pipes_closed = tokio::time::timeout(PIPE_DRAIN_WAIT, async {
        let _ = (&mut stdout).await;
        let _ = (&mut stderr).await;
    })
    .await
    .is_ok();
    if !pipes_closed {
        stdout.abort();
        stderr.abort();
    }
    let (stdout, stdout_truncated) = stdout_buffer.take(!pipes_closed);
    let (stderr, stderr_truncated) = stderr_buffer.take(!pipes_closed);
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

/// What a pipe has given so far: at most [`EXEC_OUTPUT_BYTES_MAX`] bytes, and whether more
/// was dropped.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<(Vec<u8>, bool)>>);

impl Captured {
    fn keep(&self, bytes: &[u8]) {
        let mut captured = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        let room = EXEC_OUTPUT_BYTES_MAX - captured.0.len();
        if bytes.len() > room {
            captured.1 = true;
        }
        captured
            .0
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The text (invalid UTF-8 replaced) and whether it was cut; `unfinished` when reading
    /// stopped before the pipe's end.
    fn take(&self, unfinished: bool) -> (String, bool) {
        let captured = self.0.lock().unwrap_or_else(|poison| poison.into_inner());
        (
            String::from_utf8_lossy(&captured.0).into_owned(),
            captured.1 || unfinished,
        )
    }
}

/// Reads a pipe to its end into `into`.
async fn read_bounded<R: AsyncRead + Unpin>(pipe: Option<R>, into: Captured) {
    let Some(mut pipe) = pipe else {
        return;
    };
    let mut buffer = [0u8; 8192];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => into.keep(&buffer[..n]),
        }
    }
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
