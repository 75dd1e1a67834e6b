//! The command line (documented in README.md, "Command line"): every verb and flag, parsed
//! by clap.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use herder_core::queues::RateLimit;

#[derive(Parser, Debug)]
#[command(
    name = "herder",
    version,
    about = "A fault-tolerant distributed task processor",
    long_about = "Herder schedules jobs from clients onto workers through a coordinator that detects \
                  dead workers, revokes stale attempts with leases, retries lost work with backoff and \
                  keeps every transition durable in SQLite.\n\nStart with `herder dev --demo`."
)]
pub struct Cli {
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Threads that run the process's sockets, timers and protocol state machines. CPU-heavy
    /// built-in tasks, `exec` children and the coordinator's store and log writer have threads
    /// of their own, so one suffices on small machines and is the fastest measured there.
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=IO_THREADS_MAX))]
    pub io_threads: u16,
    /// A TOML file of settings, `flag-name = value` a line (default: the file HERDER_CONFIG
    /// names, if set). A flag on the command line wins over its HERDER_<FLAG> environment
    /// variable, which wins over the file.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// The most `--io-threads` a process may ask for.
pub const IO_THREADS_MAX: i64 = 64;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a coordinator.
    Coordinator(CoordinatorArgs),
    /// Run a worker.
    Worker(WorkerArgs),
    /// Submit a job.
    Submit(SubmitArgs),
    /// Show one job.
    Status(JobArgs),
    /// Wait until a job is terminal.
    Wait(WaitArgs),
    /// Cancel a job.
    Cancel(JobArgs),
    /// List jobs, newest first.
    List(ListArgs),
    /// List workers.
    Workers(ClientArgs),
    /// List queues: settings, jobs by state, how long the oldest queued job has waited.
    Queues(ClientArgs),
    /// Change a queue: its weight, its ageing bound, pause or resume it.
    Queue(QueueArgs),
    /// Remove terminal jobs that finished long enough ago (results and keys go with them).
    Purge(PurgeArgs),
    /// Resubmit failed or cancelled jobs as new jobs linked to them (`retry_of`): by id, or
    /// every one in a state, filtered. Retrying the same job twice creates one new job.
    Retry(RetryArgs),
    /// Show the coordinator group, or hand leadership to another member.
    Cluster(ClusterArgs),
    /// Load generator: submit N jobs over C connections and wait for all of them.
    Bench(BenchArgs),
    /// Embedded default: one coordinator (or a group of 3 or 5) and N workers in one process,
    /// SQLite in a local folder.
    Dev(DevArgs),
    /// Write a new throwaway CA and one certificate it issued (for the given hosts, as server
    /// and peer) into a folder, for trying TLS out: not for production, whose certificates
    /// come from the operator's own CA.
    GenCerts(GenCertsArgs),
}

#[derive(Args, Debug)]
pub struct GenCertsArgs {
    /// Folder for ca.pem, node.pem and node-key.pem (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// A DNS name or IP address the certificate is valid for; repeat for more.
    #[arg(long = "host", required = true)]
    pub hosts: Vec<String>,
}

#[derive(Args, Debug)]
pub struct CoordinatorArgs {
    /// This coordinator's id in its group.
    #[arg(long, default_value = "coordinator-1")]
    pub id: String,
    /// Where the SQLite database lives.
    #[arg(long, default_value = "./herder-data")]
    pub data_dir: PathBuf,
    /// Address to bind for workers (host part optional).
    #[arg(long, default_value = "7070")]
    pub worker_port: String,
    /// Address to bind for clients (host part optional).
    #[arg(long, default_value = "7071")]
    pub client_port: String,
    /// Address to bind for the other coordinators of the group (host part optional). Defaults
    /// to the port of this coordinator's own --peers entry; without --peers, no peer port is
    /// opened unless this flag is given.
    #[arg(long)]
    pub peer_port: Option<String>,
    /// Every member of the group, this one included, as ID=HOST:PORT (their peer ports),
    /// comma-separated; every member is given the same list. This member's clients and
    /// workers are sent to the host of its own entry, with its --client-port and
    /// --worker-port. Leave out for a group of one.
    #[arg(long)]
    pub peers: Option<String>,
    /// Address for the HTTP API, dashboard and /metrics (host part optional; loopback unless
    /// given), or `off`. Default 7080; if the default is taken, the coordinator runs without
    /// HTTP and says so.
    #[arg(long)]
    pub http_port: Option<String>,
    #[command(flatten)]
    pub auth: crate::credentials::ServerAuthArgs,
    #[command(flatten)]
    pub tuning: CoordinatorTuning,
    /// Print every setting with its value and where it came from (flag, environment, file or
    /// default), and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Args, Debug, Clone)]
pub struct CoordinatorTuning {
    /// Deadline of one attempt.
    #[arg(long, default_value_t = 600_000)]
    pub task_timeout_millis: u64,
    /// How often workers heartbeat.
    #[arg(long, default_value_t = 2_000)]
    pub heartbeat_interval_millis: u64,
    /// Silence after which a worker is declared lost.
    #[arg(long, default_value_t = 6_000)]
    pub heartbeat_timeout_millis: u64,
    /// Attempts a job gets unless its submission says otherwise.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Retry backoff base (full jitter, doubling per attempt).
    #[arg(long, default_value_t = 1_000)]
    pub retry_base_millis: u64,
    /// Retry backoff cap.
    #[arg(long, default_value_t = 60_000)]
    pub retry_max_millis: u64,
    /// Admission limit on non-terminal jobs.
    #[arg(long, default_value_t = 10_000)]
    pub max_active_jobs: u64,
    /// Largest frame accepted or sent.
    #[arg(long, default_value_t = 1_048_576)]
    pub max_frame_bytes: usize,
    /// A member that hears no leader for a time between this and twice this starts an
    /// election (a group of several only).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    pub election_timeout_millis: u64,
    /// Hand leadership to the next member after this many submissions in one term (off
    /// unless given).
    #[arg(long)]
    pub rotate_leader_after_jobs: Option<u64>,
    /// How long terminal jobs are kept: an age (7d), a count (100000), both (7d,100000: a job
    /// goes when either says so, longest finished first) or `forever`. A purged job's status,
    /// result and idempotency key are gone.
    #[arg(long, default_value = "7d,100000", value_parser = crate::retention::parse_retention)]
    pub retain_terminal: herder_core::coordinator::Retention,
    /// Open connections the worker port and the client port each accept; beyond it a new
    /// connection is told TOO_MANY_CONNECTIONS and closed.
    #[arg(long, default_value_t = 4096,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_connections_per_port: usize,
    /// A new connection that sends no whole message this long is closed.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub first_message_timeout_millis: u64,
    /// A write that a peer leaves unread this long closes its connection (its worker is then
    /// lost, its waits dropped).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub write_stall_timeout_millis: u64,
    /// Bytes queued for writing across every client connection; a send beyond it closes the
    /// connection it was for.
    #[arg(long, default_value_t = 256 * 1024 * 1024,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1_048_576..=68_719_476_736))]
    pub max_outbound_bytes: usize,
    /// Requests one client connection may have unanswered; beyond it the coordinator stops
    /// reading that connection until it answers one.
    #[arg(long, default_value_t = 4096,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_requests_per_connection: usize,
    /// WAITs one client connection may have parked; beyond it a WAIT is refused with
    /// TOO_MANY_WAITERS.
    #[arg(long, default_value_t = 1024)]
    pub max_waits_per_connection: usize,
}

impl CoordinatorTuning {
    /// What the flags together must satisfy beyond each one's own range.
    pub fn check(&self) -> Result<(), String> {
        if self.max_requests_per_connection <= self.max_waits_per_connection {
            return Err(format!(
                "--max-requests-per-connection ({}) must exceed --max-waits-per-connection ({}): parked waits count as requests in flight, and a connection must keep room to ask for anything else",
                self.max_requests_per_connection, self.max_waits_per_connection
            ));
        }
        Ok(())
    }

    /// The connection bounds these flags give.
    pub fn connection_limits(&self) -> herder_runtime::coordinator::ConnectionLimits {
        herder_runtime::coordinator::ConnectionLimits {
            per_port: self.max_connections_per_port,
            first_message_within: std::time::Duration::from_millis(
                self.first_message_timeout_millis,
            ),
            write_stall: std::time::Duration::from_millis(self.write_stall_timeout_millis),
            outbound_bytes: self.max_outbound_bytes,
            requests_in_flight: self.max_requests_per_connection,
        }
    }
}

#[derive(Args, Debug)]
pub struct PurgeArgs {
    /// Only jobs in this terminal state (completed, failed, cancelled); default: all three.
    #[arg(long)]
    pub state: Option<String>,
    /// Only jobs that finished at least this long ago (500ms, 30s, 15m, 12h, 7d; 0 for all).
    #[arg(long, value_parser = crate::retention::parse_duration)]
    pub older_than: std::time::Duration,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
#[command(arg_required_else_help = true)]
pub struct RetryArgs {
    /// The jobs to retry.
    #[arg(value_name = "JOB_ID", conflicts_with = "state")]
    pub job_ids: Vec<String>,
    /// Or every job in this state: failed or cancelled.
    #[arg(long, required_unless_present = "job_ids")]
    pub state: Option<String>,
    /// With --state: only jobs of this queue.
    #[arg(long, requires = "state")]
    pub queue: Option<String>,
    /// With --state: only jobs that finished at least this long ago (30s, 15m, 12h, 7d).
    #[arg(long, requires = "state", value_parser = crate::retention::parse_duration)]
    pub older_than: Option<std::time::Duration>,
    /// With --state: only jobs whose error contains this text.
    #[arg(long, requires = "state")]
    pub error_contains: Option<String>,
    /// With --state: at most this many jobs (newest first).
    #[arg(long, default_value_t = 1_000)]
    pub limit: usize,
    /// Print which jobs would be retried; submit nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// This worker's name (letters, digits, '.', '_', '-').
    #[arg(long)]
    pub id: String,
    /// Coordinator worker-port addresses, comma-separated.
    #[arg(long, default_value = "127.0.0.1:7070", value_delimiter = ',')]
    pub coordinator: Vec<String>,
    /// Task slots.
    #[arg(long, default_value_t = 4)]
    pub capacity: u32,
    /// Assignments a worker holds beyond its slots, waiting for one (at most 4 per slot). The
    /// next job is then already at the worker when a slot frees: worth it for many short jobs,
    /// not for long ones (a waiting job cannot move to a worker that frees up meanwhile).
    #[arg(long, default_value_t = 0)]
    pub prefetch: u32,
    /// Take work only from these queues, comma-separated (default: every queue).
    #[arg(long, value_delimiter = ',')]
    pub queues: Option<Vec<String>>,
    /// Largest frame accepted or sent.
    #[arg(long, default_value_t = 1_048_576)]
    pub max_frame_bytes: usize,
    /// On SIGTERM or Ctrl-C: how long running attempts get to finish before the rest are
    /// handed back (their jobs run elsewhere with no attempt charged).
    #[arg(long, default_value = "30s", value_parser = crate::retention::parse_duration)]
    pub drain_timeout: std::time::Duration,
    /// File holding the worker secret the coordinators check (their --worker-secret-file).
    #[arg(long, value_name = "FILE")]
    pub worker_secret_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub tls: crate::credentials::ClientTlsArgs,
    /// Print every setting with its value and where it came from, and exit.
    #[arg(long)]
    pub print_config: bool,
    #[command(flatten)]
    pub exec: ExecArgs,
}

/// Whether (and how) a worker runs `exec` tasks.
#[derive(Args, Debug, Clone)]
pub struct ExecArgs {
    /// Serve `exec` tasks whose program (argv[0], as given) matches this pattern; `*` stands
    /// for any run of characters other than `/`. Repeat for more. Without it, no command runs.
    #[arg(long = "allow-exec", value_name = "PATTERN")]
    pub allow_exec: Vec<String>,
    /// Where commands run (a task's --cwd is taken inside it).
    #[arg(long, default_value = ".")]
    pub exec_dir: std::path::PathBuf,
    /// How long a cancelled command gets between SIGTERM and SIGKILL (to its whole process
    /// group).
    #[arg(long, default_value = "5s", value_parser = crate::retention::parse_duration)]
    pub exec_grace: std::time::Duration,
}

impl ExecArgs {
    /// The handlers a worker started with these flags serves, or why the flags are wrong.
    pub fn handlers(&self) -> Result<herder_runtime::Handlers, String> {
        let mut handlers = herder_runtime::Handlers::builtin();
        if !self.allow_exec.is_empty() {
            let policy = herder_runtime::exec::ExecPolicy {
                allow: self.allow_exec.clone(),
                dir: self.exec_dir.clone(),
                grace: self.exec_grace,
            };
            handlers.insert(
                herder_core::tasks::EXEC_KIND,
                herder_runtime::exec::Exec::new(policy)?,
            );
        }
        Ok(handlers)
    }
}

#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// Coordinator client-port addresses, comma-separated; redirects and failover are automatic.
    #[arg(
        long,
        global = true,
        default_value = "127.0.0.1:7071",
        value_delimiter = ','
    )]
    pub coordinator: Vec<String>,
    /// Print exactly one JSON object on stdout.
    #[arg(long, global = true)]
    pub json: bool,
    /// Give up on a call unanswered for this long and say what it was waiting for (`wait`
    /// adds its own --timeout-millis; a `wait` without one is not bounded).
    #[arg(long, global = true, default_value_t = 30_000)]
    pub call_timeout_millis: u64,
    /// File holding this client's token, for coordinators that check tokens (default: the
    /// HERDER_TOKEN environment variable, if set).
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub tls: crate::credentials::ClientTlsArgs,
}

#[derive(Args, Debug)]
pub struct QueueArgs {
    #[command(subcommand)]
    pub action: QueueAction,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Subcommand, Debug)]
pub enum QueueAction {
    /// Change settings of a queue (created if new); settings not given stay as they are.
    Set {
        /// The queue.
        name: String,
        /// Its share of the workers against other busy queues (1 to 1000; new queues: 1).
        #[arg(long)]
        weight: Option<u32>,
        /// A queued job waiting this long goes before the younger jobs of its fairness key,
        /// whatever their priority (500ms, 30s, 15m, 12h; new queues: 60s).
        #[arg(long, value_parser = crate::retention::parse_duration)]
        aging: Option<std::time::Duration>,
        /// At most this many of its jobs run at once (0: no limit, the default).
        #[arg(long)]
        concurrency: Option<u32>,
        /// At most this many of its jobs with one fairness key run at once (0: no limit, the
        /// default; jobs without a key are not counted).
        #[arg(long)]
        key_concurrency: Option<u32>,
        /// At most N starts per period, as N/PERIOD (10/1s, 500/1m; 0 removes the limit).
        /// Bursts up to N; a new limit starts with a full bucket.
        #[arg(long, value_parser = parse_rate)]
        rate: Option<RateLimit>,
        /// At most N starts per period for each fairness key, as N/PERIOD (0 removes the
        /// limit; jobs without a key are not counted). A new limit fills every key's bucket.
        #[arg(long, value_parser = parse_rate)]
        key_rate: Option<RateLimit>,
        /// At most this many of its jobs unfinished at once; further submissions are refused,
        /// retryably, naming the queue (0: no limit, the default).
        #[arg(long)]
        max_active_jobs: Option<u64>,
    },
    /// Start nothing new from the queue: queued jobs stay, running ones finish.
    Pause {
        /// The queue.
        name: String,
    },
    /// Let a paused queue start jobs again.
    Resume {
        /// The queue.
        name: String,
    },
}

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub action: Option<ClusterAction>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Subcommand, Debug)]
pub enum ClusterAction {
    /// Ask the leader to hand leadership to another member.
    TransferLeader {
        /// The member to take over (default: the most up-to-date one).
        #[arg(long)]
        to: Option<String>,
    },
}

#[derive(Args, Debug)]
#[command(arg_required_else_help = true)]
pub struct SubmitArgs {
    #[command(subcommand)]
    pub task: Option<TaskCommand>,
    /// Or any other task name: a task a worker serves with a handler of its own, given its
    /// --payload (or --payload-file).
    #[arg(value_name = "TASK")]
    pub name: Option<String>,
    /// Submit every job of FILE instead (`-` reads standard input): one JSON object per line
    /// with the fields of a submission, `{"task": {...}, "idempotency_key": "...",
    /// "max_attempts": N, "timeout_millis": N, "partitions": N, "queue": "...", "priority": N,
    /// "fairness_key": "...", "delay_millis": N, "run_at_unix_ms": N}`, only `task` required.
    /// Sent in batches of up to 1,000 jobs, each one durable write; prints one line per job.
    /// --max-attempts, --timeout-millis, --queue, --priority and --fairness-key apply to lines
    /// that do not say.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["name", "wait", "idempotency_key", "partitions"])]
    pub batch_file: Option<std::path::PathBuf>,
    /// The task's payload as JSON (what its handler receives).
    #[arg(
        long,
        requires = "name",
        conflicts_with = "payload_file",
        allow_hyphen_values = true
    )]
    pub payload: Option<String>,
    /// A file holding the payload as JSON; `-` reads standard input.
    #[arg(long, requires = "name")]
    pub payload_file: Option<std::path::PathBuf>,
    /// Attempts before the job fails for good.
    #[arg(long, global = true)]
    pub max_attempts: Option<u32>,
    /// Each attempt's deadline (default: the coordinator's --task-timeout-millis).
    #[arg(long, global = true)]
    pub timeout_millis: Option<u64>,
    /// Makes resubmission (and resending after a connection failure) safe: the same key always
    /// names the same job.
    #[arg(long, global = true)]
    pub idempotency_key: Option<String>,
    /// The queue (created on first use; default: `default`).
    #[arg(long, global = true)]
    pub queue: Option<String>,
    /// 0 to 9, higher first within its queue and fairness key (default 0). A job queued
    /// longer than its queue's ageing bound goes first whatever its priority.
    #[arg(long, global = true)]
    pub priority: Option<u8>,
    /// Whom the job is fair to (a tenant, say): the keys of a queue share it equally, so one
    /// key with a large backlog does not hold up another's jobs.
    #[arg(long, global = true)]
    pub fairness_key: Option<String>,
    /// Queue the job only after this long (`90s`, `10m`, `2h`, `7d`; at most 366 days):
    /// it is SCHEDULED until then, by the leader's clock.
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        conflicts_with = "run_at"
    )]
    pub delay: Option<String>,
    /// Queue the job only at or after this time, in RFC 3339 (`2026-12-24T18:00:00Z`,
    /// `2026-12-24T19:00:00+01:00`; at most 366 days ahead): it is SCHEDULED until then.
    #[arg(long, global = true, value_name = "TIME")]
    pub run_at: Option<String>,
    /// Wait for these jobs (comma-separated ids, at most 64): the job is BLOCKED until all of
    /// them end, and cancelled if one fails or is cancelled (see --after-any-outcome).
    #[arg(long, global = true, value_name = "ID,...", value_delimiter = ',')]
    pub after: Vec<String>,
    /// With --after: run whatever the jobs waited for end as.
    #[arg(long, global = true, requires = "after")]
    pub after_any_outcome: bool,
    /// Retries of a retryable admission rejection (0 = one shot).
    #[arg(long, global = true, default_value_t = 0)]
    pub submit_retries: u32,
    #[arg(long, global = true, default_value_t = 200)]
    pub submit_retry_base_millis: u64,
    #[arg(long, global = true, default_value_t = 5_000)]
    pub submit_retry_max_millis: u64,
    /// Wait until the job is terminal and print it.
    #[arg(long, global = true)]
    pub wait: bool,
    /// For max, prime-count over a list and prime-sum: how many partition jobs to split the
    /// input into, or `auto` (one per live worker).
    #[arg(long, global = true)]
    pub partitions: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl SubmitArgs {
    /// The task's wire form: a built-in subcommand's, or a named task with its payload.
    pub fn task_json(&self) -> Result<serde_json::Value, String> {
        if let Some(task) = &self.task {
            return task.payload();
        }
        let Some(name) = &self.name else {
            return Err(
                "name a task: a built-in one (see `herder submit --help`) or one a worker serves, with --payload"
                    .to_string(),
            );
        };
        let (text, source) = match (&self.payload, &self.payload_file) {
            (Some(text), _) => (text.clone(), "--payload".to_string()),
            (None, Some(path)) if path.as_os_str() == "-" => {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(
                    |error| format!("cannot read the payload from standard input: {error}"),
                )?;
                (text, "the payload on standard input".to_string())
            }
            (None, Some(path)) => (
                std::fs::read_to_string(path)
                    .map_err(|error| format!("cannot read {}: {error}", path.display()))?,
                path.display().to_string(),
            ),
            (None, None) => ("null".to_string(), String::new()),
        };
        let payload: serde_json::Value = serde_json::from_str(&text)
            .map_err(|error| format!("{source} is not valid JSON: {error}"))?;
        Ok(serde_json::json!({ "kind": name, "payload": payload }))
    }
}

/// Built-in task types. Numbers are taken as signed so a negative value gets a clear error.
#[derive(Subcommand, Debug, Clone)]
pub enum TaskCommand {
    /// Sleep, then succeed.
    Sleep {
        #[arg(long, allow_negative_numbers = true)]
        milliseconds: i64,
    },
    /// Count whitespace-separated words (--text or --text-file).
    WordCount {
        #[command(flatten)]
        text: TextInput,
    },
    /// SHA-256 of the text, in hex (--text or --text-file).
    Sha256 {
        #[command(flatten)]
        text: TextInput,
    },
    /// Count primes up to --limit, or how many of a list of numbers are prime (--numbers or
    /// --file; split into partitions across workers).
    PrimeCount {
        #[arg(long, allow_negative_numbers = true, conflicts_with_all = ["numbers", "file"])]
        limit: Option<i64>,
        #[command(flatten)]
        list: NumberList,
    },
    /// The largest of a list of numbers (--numbers or --file; split across workers).
    Max {
        #[command(flatten)]
        list: NumberList,
    },
    /// Count and sum the primes p with start <= p <= end (split across workers).
    PrimeSum {
        #[arg(long, allow_negative_numbers = true)]
        start: i64,
        #[arg(long, allow_negative_numbers = true)]
        end: i64,
    },
    /// Fail every attempt before the given one (for watching retries).
    Fail {
        #[arg(long, allow_negative_numbers = true)]
        fail_until_attempt: i64,
    },
    /// Run a command (no shell) on a worker that allows it: `exec -- PROGRAM ARGS...`.
    Exec {
        /// Working directory, inside the worker's --exec-dir.
        #[arg(long)]
        cwd: Option<String>,
        /// An environment variable for the command; repeat for more.
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// The program and its arguments.
        #[arg(last = true, required = true, value_name = "PROGRAM")]
        argv: Vec<String>,
    },
}

/// A list of numbers, inline or from a file (header lines, `,` `;` and whitespace separators).
#[derive(Args, Debug, Clone)]
pub struct NumberList {
    /// Numbers separated by `,` `;` or spaces, e.g. `2,4,5,11`.
    #[arg(long, allow_hyphen_values = true, conflicts_with = "file")]
    pub numbers: Option<String>,
    /// A file of numbers (CSV-like: header lines, `,` `;` and whitespace separators).
    #[arg(long)]
    pub file: Option<std::path::PathBuf>,
    /// The column of --file that holds the numbers, by header name or 1-based position
    /// (required when the header names several columns).
    #[arg(long, requires = "file")]
    pub column: Option<herder_core::dataparallel::Column>,
}

/// A task's text, inline or from a file (a shell refuses long arguments well before the task
/// limit).
#[derive(Args, Debug, Clone)]
#[group(required = true, multiple = false)]
pub struct TextInput {
    /// The text itself.
    #[arg(long, allow_hyphen_values = true)]
    pub text: Option<String>,
    /// A UTF-8 file holding the text; `-` reads standard input.
    #[arg(long)]
    pub text_file: Option<std::path::PathBuf>,
}

impl TextInput {
    /// The text, or a message naming what could not be read.
    pub fn read(&self) -> Result<String, String> {
        match (&self.text, &self.text_file) {
            (Some(text), _) => Ok(text.clone()),
            (None, Some(path)) if path.as_os_str() == "-" => {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(
                    |error| format!("cannot read the text from standard input: {error}"),
                )?;
                Ok(text)
            }
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|error| format!("cannot read {}: {error}", path.display())),
            (None, None) => Err("give the text with --text or --text-file".to_string()),
        }
    }
}

/// `herder dev --coordinators`: a group that tolerates 0, 1 or 2 failures.
fn dev_group_size(raw: &str) -> Result<u32, String> {
    match raw.trim() {
        "1" => Ok(1),
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err(format!("{raw:?}: a dev group has 1, 3 or 5 coordinators")),
    }
}

impl NumberList {
    /// The numbers, or a message naming the file, line and column of the first bad token.
    /// `None` when neither flag was given.
    fn read(&self) -> Result<Option<Vec<i64>>, String> {
        let (text, source) = match (&self.numbers, &self.file) {
            (Some(text), _) => (text.clone(), "--numbers".to_string()),
            (None, Some(path)) => match std::fs::read_to_string(path) {
                Ok(text) => (text, path.display().to_string()),
                Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
            },
            (None, None) => return Ok(None),
        };
        let parsed = match &self.column {
            Some(column) => herder_core::dataparallel::parse_column(&text, column),
            None => herder_core::dataparallel::parse_numbers(&text),
        };
        parsed
            .map(Some)
            .map_err(|error| format!("{source}: {error}"))
    }
}

impl TaskCommand {
    /// The wire payload; the coordinator (and `TaskSpec::from_json` here) validates it. `Err`
    /// for input that cannot be read or parsed (a bad number names its line and column).
    pub fn payload(&self) -> Result<serde_json::Value, String> {
        use serde_json::json;
        Ok(match self {
            TaskCommand::Sleep { milliseconds } => {
                json!({"kind": "sleep", "milliseconds": milliseconds})
            }
            TaskCommand::WordCount { text } => json!({"kind": "word-count", "text": text.read()?}),
            TaskCommand::Sha256 { text } => json!({"kind": "sha256", "text": text.read()?}),
            TaskCommand::PrimeCount { limit, list } => match (limit, list.read()?) {
                (Some(limit), _) => json!({"kind": "prime-count", "limit": limit}),
                (None, Some(numbers)) => json!({"kind": "prime-count-list", "numbers": numbers}),
                (None, None) => {
                    return Err("prime-count needs --limit, --numbers or --file".to_string())
                }
            },
            TaskCommand::Max { list } => match list.read()? {
                Some(numbers) => json!({"kind": "max", "numbers": numbers}),
                None => return Err("max needs --numbers or --file".to_string()),
            },
            TaskCommand::PrimeSum { start, end } => {
                json!({"kind": "prime-sum", "start": start, "end": end})
            }
            TaskCommand::Fail { fail_until_attempt } => {
                json!({"kind": "fail", "fail_until_attempt": fail_until_attempt})
            }
            TaskCommand::Exec { cwd, env, argv } => {
                let mut vars = serde_json::Map::new();
                for pair in env {
                    let Some((name, value)) = pair.split_once('=') else {
                        return Err(format!("--env {pair:?} must be NAME=VALUE"));
                    };
                    vars.insert(name.to_owned(), json!(value));
                }
                let mut task = json!({"kind": "exec", "argv": argv});
                if let Some(cwd) = cwd {
                    task["cwd"] = json!(cwd);
                }
                if !vars.is_empty() {
                    task["env"] = serde_json::Value::Object(vars);
                }
                task
            }
        })
    }
}

#[derive(Args, Debug)]
pub struct JobArgs {
    /// The job's id (as printed by `submit`).
    pub job_id: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct WaitArgs {
    pub job_id: String,
    /// Give up after this long (the job keeps running).
    #[arg(long)]
    pub timeout_millis: Option<u64>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only jobs in this state (queued, running, retry-wait, completed, failed, cancelled).
    #[arg(long)]
    pub state: Option<String>,
    #[arg(long)]
    pub limit: Option<u32>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Jobs to submit.
    #[arg(long)]
    pub jobs: u64,
    /// Independent client connections.
    #[arg(long)]
    pub concurrency: u32,
    /// Submissions in flight per connection (1 = one blocking client per connection).
    #[arg(long, default_value_t = 1)]
    pub pipeline: u32,
    /// Submit jobs N at a time in one `SUBMIT_BATCH` (1 = one `SUBMIT` per job), up to 1,000.
    /// Each connection sends one batch, waits for every job of it, then sends the next.
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// Submit at this many jobs per second in all (spread evenly over the connections),
    /// whatever the answers, instead of as fast as the pipeline allows: latency at a given
    /// load. One `SUBMIT` per job.
    #[arg(long, conflicts_with_all = ["batch", "pipeline"])]
    pub rate: Option<u32>,
    /// Measure submissions alone: count each job once it is acknowledged and never wait for
    /// it to finish (throughput is then accepted jobs per second, first submission to last
    /// acknowledgement). The jobs stay queued or run as usual.
    #[arg(long)]
    pub no_wait: bool,
    /// Task type for every job.
    #[arg(long, default_value = "sha256")]
    pub task: String,
    #[arg(long, default_value = "herder")]
    pub text: String,
    #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
    pub milliseconds: i64,
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true)]
    pub limit: i64,
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub fail_until_attempt: i64,
    /// Any task as its JSON wire form instead of --task (a user task, or `exec`), e.g.
    /// '{"kind":"exec","argv":["/bin/true"]}'.
    #[arg(long, conflicts_with = "task")]
    pub task_json: Option<String>,
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Spread the jobs round-robin over this many queues, `bench-0` to `bench-N-1` (0: every
    /// job in the default queue).
    #[arg(long, default_value_t = 0)]
    pub queues: u32,
    /// Give the jobs this many fairness keys round-robin, `tenant-0` to `tenant-N-1` (0: none).
    #[arg(long, default_value_t = 0)]
    pub fairness_keys: u32,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Args, Debug)]
pub struct DevArgs {
    /// Workers to run in the process.
    #[arg(long, default_value_t = 3)]
    pub workers: u32,
    /// Coordinators in the group: 1, 3 or 5. Member N listens 10 ports above member N-1 (for
    /// clients, workers and peers alike) and keeps its data in <data-dir>/cN; a single
    /// coordinator keeps it in <data-dir> itself.
    #[arg(long, default_value_t = 1, value_parser = dev_group_size)]
    pub coordinators: u32,
    /// Task slots per worker.
    #[arg(long, default_value_t = 4)]
    pub capacity: u32,
    /// Assignments a worker holds beyond its slots, waiting for one (at most 4 per slot). The
    /// next job is then already at the worker when a slot frees: worth it for many short jobs,
    /// not for long ones (a waiting job cannot move to a worker that frees up meanwhile).
    #[arg(long, default_value_t = 0)]
    pub prefetch: u32,
    /// Where the SQLite database lives.
    #[arg(long, default_value = "./herder-data")]
    pub data_dir: PathBuf,
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub worker_port: String,
    #[arg(long, default_value = "127.0.0.1:7071")]
    pub client_port: String,
    /// The first coordinator's peer port (a group of 3 or 5 only).
    #[arg(long, default_value = "127.0.0.1:7072")]
    pub peer_port: String,
    /// The HTTP API, dashboard and /metrics, or `off`. Default 127.0.0.1:7080; in a group,
    /// member N serves it 3 ports above its worker port (7073, 7083, 7093) unless this is
    /// given, then 10 ports above member N-1.
    #[arg(long)]
    pub http_port: Option<String>,
    /// Submit a demonstration set of jobs, print what happened, and exit.
    #[arg(long)]
    pub demo: bool,
    /// Speak TLS on every port, with a throwaway CA and certificate generated into
    /// DATA_DIR/tls (for trying TLS out; clients then pass --tls-ca DATA_DIR/tls/ca.pem).
    #[arg(long)]
    pub tls: bool,
    /// On Ctrl-C: how long running attempts get to finish before the rest are handed back
    /// (queued again, no attempt charged, run when workers next start).
    #[arg(long, default_value = "30s", value_parser = crate::retention::parse_duration)]
    pub drain_timeout: std::time::Duration,
    #[command(flatten)]
    pub exec: ExecArgs,
    #[command(flatten)]
    pub tuning: CoordinatorTuning,
}

/// `N/PERIOD` (`10/1s`, `500/1m`), or `0` to remove a rate limit.
pub fn parse_rate(text: &str) -> Result<RateLimit, String> {
    if text.trim() == "0" {
        return Ok(RateLimit {
            starts: 0,
            per_millis: 1000,
        });
    }
    let (starts, period) = text
        .split_once('/')
        .ok_or_else(|| format!("a rate is N/PERIOD, such as 10/1s (got {text:?})"))?;
    let starts: u32 = starts
        .trim()
        .parse()
        .map_err(|_| format!("the starts of a rate are a whole number (got {starts:?})"))?;
    let period = crate::retention::parse_duration(period.trim())?;
    let rate = RateLimit {
        starts,
        per_millis: u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
    };
    rate.check()?;
    Ok(rate)
}
