//! One function per verb. Each returns the process exit code.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use herder_core::client::{ClientConfig, ClientError};
use herder_core::coordinator::CoordinatorConfig;
use herder_core::ids::{JobId, NodeId, WorkerId};
use herder_core::job::JobState;
use herder_core::limits::{
    DIAL_ADDRESSES_MAX, FRAME_BYTES_MAX_DEFAULT, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX,
};
use herder_core::protocol::{ClusterView, JobView, Partitions};
use herder_core::queues::QueueChange;
use herder_core::tasks::TaskSpec;
use herder_core::worker::WorkerConfig;
use herder_runtime::client::{CallError, HerderClient, SubmitOptions};
use herder_runtime::{coordinator, worker};
use serde_json::json;
use tokio::sync::watch;

use crate::cli::{
    ClientArgs, ClusterAction, ClusterArgs, CoordinatorArgs, CoordinatorTuning, JobArgs, ListArgs,
    PurgeArgs, QueueAction, QueueArgs, SubmitArgs, WaitArgs, WorkerArgs,
};
use crate::exit;
use crate::group::{parse_node_id, parse_peers};
use crate::output::{
    cluster_for_people, cluster_json, job_for_people, job_json, jobs_for_people, queues_for_people,
    report_error, report_error_as, usage_error, workers_for_people,
};

/// How long `herder cluster` waits for one member to accept a connection.
const CLUSTER_CONNECT_TIMEOUT: Duration = Duration::from_millis(2_000);
/// How long `herder cluster` waits for one member's answer.
const CLUSTER_REPLY_TIMEOUT: Duration = Duration::from_millis(5_000);

/// `7070` means port 7070 on `default_host`; `host:port` is taken as given.
pub fn parse_listen_addr(raw: &str, default_host: &str) -> Result<SocketAddr, String> {
    let text = if raw.chars().all(|c| c.is_ascii_digit()) {
        format!("{default_host}:{raw}")
    } else {
        raw.to_owned()
    };
    text.parse()
        .map_err(|_| format!("{raw:?} is not a port or an IP:port address"))
}

/// Where to listen for the other members when --peer-port is not given: the host of this
/// member's own --peers entry (an address, or a name resolved now), on its port.
fn own_peer_addr(host: &str, port: u16) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            format!("cannot resolve {host:?}, this member's own --peers host; give --peer-port HOST:PORT")
        })
}

/// Herder authenticates nobody yet: say so when a port is open beyond this machine.
/// The replication heartbeat for an election timeout: the default 50 ms, or a third of the
/// timeout when that is shorter (followers must hear several heartbeats per timeout).
fn replication_heartbeat(election_timeout_millis: u64) -> Duration {
    Duration::from_millis((election_timeout_millis / 3).clamp(1, 50))
}

pub fn coordinator_config(id: &str, tuning: &CoordinatorTuning) -> CoordinatorConfig {
    CoordinatorConfig {
        node_id: NodeId(id.to_owned()),
        task_timeout: Duration::from_millis(tuning.task_timeout_millis),
        heartbeat_interval: Duration::from_millis(tuning.heartbeat_interval_millis),
        heartbeat_timeout: Duration::from_millis(tuning.heartbeat_timeout_millis),
        default_max_attempts: tuning.max_attempts,
        retry_base: Duration::from_millis(tuning.retry_base_millis),
        retry_max: Duration::from_millis(tuning.retry_max_millis),
        max_active_jobs: tuning.max_active_jobs,
        readoption_window: None,
        max_frame_bytes: tuning.max_frame_bytes,
        election_timeout_min: Duration::from_millis(tuning.election_timeout_millis),
        election_timeout_max: Duration::from_millis(
            tuning.election_timeout_millis.saturating_mul(2),
        ),
        replication_heartbeat: replication_heartbeat(tuning.election_timeout_millis),
        rotate_leader_after_jobs: tuning.rotate_leader_after_jobs,
        retention: tuning.retain_terminal,
        max_waiters_per_connection: tuning.max_waits_per_connection,
        ..CoordinatorConfig::default()
    }
}

pub use herder_runtime::terminated;

/// On the first SIGINT or SIGTERM the workers drain; on a second they stop at once.
pub fn drain_on_signal(workers: Vec<worker::Stopper>) {
    tokio::spawn(async move {
        terminated().await;
        eprintln!("herder: draining (running attempts may finish; signal again to stop at once)");
        for worker in &workers {
            worker.drain();
        }
        terminated().await;
        for worker in &workers {
            worker.now();
        }
    });
}

/// Sends `true` on `stop` when the process is told to terminate.
pub fn stop_on_signal(stop: watch::Sender<bool>) {
    tokio::spawn(async move {
        terminated().await;
        let _ = stop.send(true);
    });
}

pub async fn coordinator(args: CoordinatorArgs) -> u8 {
    let id = match parse_node_id(&args.id, "--id") {
        Ok(id) => id,
        Err(error) => return usage_error(&error, false),
    };
    let group = match args.peers.as_deref().map(|raw| parse_peers(raw, &id)) {
        None => None,
        Some(Ok(group)) => Some(group),
        Some(Err(error)) => return usage_error(&error, false),
    };
    let mut config = coordinator_config(&args.id, &args.tuning);
    let others = group.as_ref().map_or(&[][..], |g| g.others.as_slice());
    config.peers = others.iter().map(|e| e.id.clone()).collect();
    if let Err(error) = config
        .validate()
        .map_err(|e| e.to_string())
        .and_then(|()| args.tuning.check())
    {
        return usage_error(&error, false);
    }
    let (worker_addr, client_addr) = match (
        // Loopback unless told otherwise: nothing authenticates a worker or a client yet.
        parse_listen_addr(&args.worker_port, "127.0.0.1"),
        parse_listen_addr(&args.client_port, "127.0.0.1"),
    ) {
        (Ok(w), Ok(c)) => (w, c),
        (Err(e), _) | (_, Err(e)) => return usage_error(&e, false),
    };
    // Others dial the port of this member's own --peers entry, so that is where it listens
    // unless told otherwise.
    let peer_addr = match (&args.peer_port, &group) {
        (Some(raw), _) => match parse_listen_addr(raw, "127.0.0.1") {
            Ok(addr) => Some(addr),
            Err(e) => return usage_error(&e, false),
        },
        // The address the others dial: this member's own --peers entry, resolved.
        (None, Some(group)) => match own_peer_addr(&group.me.host, group.me.port) {
            Ok(addr) => Some(addr),
            Err(e) => return usage_error(&e, false),
        },
        (None, None) => None,
    };
    if let Some(group) = &group {
        // Members send clients and workers to this member's --peers host: it must listen there.
        let advertised = own_peer_addr(&group.me.host, group.me.port)
            .ok()
            .map(|a| a.ip());
        for (addr, flag) in [
            (worker_addr, "--worker-port"),
            (client_addr, "--client-port"),
        ] {
            if advertised.is_some_and(|ip| !ip.is_loopback()) && addr.ip().is_loopback() {
                return usage_error(
                    &format!(
                        "{flag} listens on {addr}, but the group sends clients and workers to {}, this member's --peers host; give {flag} {}:{} (or 0.0.0.0:{})",
                        group.me.host,
                        group.me.host,
                        addr.port(),
                        addr.port()
                    ),
                    false,
                );
            }
        }
    }
    let http = match crate::web::HttpListen::parse(
        args.http_port.as_deref(),
        SocketAddr::from(([127, 0, 0, 1], herder_http::HTTP_PORT_DEFAULT)),
    ) {
        Ok(http) => http,
        Err(e) => return usage_error(&e, false),
    };
    let max_frame_bytes = config.max_frame_bytes;
    let node_id = config.node_id.clone();
    let credentials = match args.auth.load() {
        Ok(credentials) => credentials,
        Err(error) => return usage_error(&error, false),
    };
    let tokens_checked = credentials.client_tokens.is_some();
    if let Err(error) = args.auth.check_exposure(&[
        (
            "--worker-port",
            Some(worker_addr),
            credentials.worker_secret.is_some(),
        ),
        ("--client-port", Some(client_addr), tokens_checked),
        ("--peer-port", peer_addr, credentials.peer_secret.is_some()),
        ("--http-port", http.addr(), tokens_checked),
    ]) {
        return usage_error(&error, false);
    }
    let tokens_file = args
        .auth
        .client_tokens_file
        .clone()
        .zip(credentials.client_tokens.clone());
    crate::credentials::reload_on_hangup(tokens_file, credentials.tls.clone());
    let http_tokens = credentials.client_tokens.clone();
    let http_tls = credentials.tls.clone();
    let mut options = coordinator::CoordinatorOptions {
        config,
        data_dir: args.data_dir,
        worker_addr,
        client_addr,
        peer_addr,
        peers: others.iter().map(|e| (e.id.clone(), e.address())).collect(),
        seed: None,
        limits: args.tuning.connection_limits(),
        credentials,
    };
    let listeners = match coordinator::Listeners::bind(&options).await {
        Ok(listeners) => listeners,
        Err(error) => {
            eprintln!("herder: {error}");
            return exit::SERVER;
        }
    };
    if let Some(group) = &group {
        // Clients and workers reach this member on the host the others reach it on.
        let port = |addr: Option<SocketAddr>| addr.map_or(0, |a| a.port());
        options.config.client_address =
            format!("{}:{}", group.me.host, port(listeners.client_addr()));
        options.config.worker_address =
            format!("{}:{}", group.me.host, port(listeners.worker_addr()));
    }
    let own_client = options.config.client_address.clone();
    let handle = match coordinator::start_on(listeners, options).await {
        Ok(handle) => handle,
        Err(error) => {
            eprintln!("herder: {error}");
            return exit::SERVER;
        }
    };
    let own_client = if own_client.is_empty() {
        handle.client_addr().to_string()
    } else {
        own_client
    };
    // Redirects teach the HTTP server's client where the leader is.
    let _http = match crate::web::start(
        http,
        node_id,
        &handle,
        vec![own_client],
        max_frame_bytes,
        http_tokens,
        http_tls,
    )
    .await
    {
        Ok(server) => server,
        Err(error) => {
            eprintln!("herder: {error}");
            let _ = handle.shutdown().await;
            return exit::SERVER;
        }
    };
    stop_on_signal(handle.shutdown_sender());
    match handle.wait().await {
        Ok(()) => exit::OK,
        Err(error) => {
            eprintln!("herder: {error}");
            exit::SERVER
        }
    }
}

pub async fn worker(args: WorkerArgs) -> u8 {
    let id = match WorkerId::parse(&args.id) {
        Ok(id) => id,
        Err(error) => return usage_error(&error.to_string(), false),
    };
    let config = WorkerConfig {
        prefetch: args.prefetch,
        queues: args.queues.clone(),
        ..WorkerConfig::new(id, args.capacity, args.coordinator)
    };
    let handlers = match args.exec.handlers() {
        Ok(handlers) => handlers,
        Err(error) => return usage_error(&error, false),
    };
    let secret = match args
        .worker_secret_file
        .as_deref()
        .map(crate::credentials::read_secret)
        .transpose()
    {
        Ok(secret) => secret,
        Err(error) => return usage_error(&error, false),
    };
    let tls = match args.tls.load() {
        Ok(tls) => tls,
        Err(error) => return usage_error(&error, false),
    };
    let options = worker::WorkerOptions {
        max_frame_bytes: args.max_frame_bytes,
        drain_timeout: args.drain_timeout,
        handlers,
        secret,
        tls,
        ..worker::WorkerOptions::new(config)
    };
    let handle = match worker::start(options) {
        Ok(handle) => handle,
        Err(error) => return usage_error(&error.to_string(), false),
    };
    // SIGTERM or Ctrl-C drains: running attempts finish or are handed back uncharged. A
    // second one stops at once.
    drain_on_signal(vec![handle.stopper()]);
    handle.wait().await;
    exit::OK
}

pub fn client_for(args: &ClientArgs) -> HerderClient {
    new_client(args, ClientConfig::new(args.coordinator.clone()))
        .with_call_timeout(call_timeout(args))
}

/// A client with `config`, presenting the token `args` names (`--token-file` or
/// `HERDER_TOKEN`). A token that cannot be read ends the process as a usage error: no call
/// could succeed without it.
pub fn new_client(args: &ClientArgs, config: ClientConfig) -> HerderClient {
    let security = crate::credentials::client_token(args.token_file.as_deref())
        .and_then(|token| Ok((token, args.tls.load()?)));
    match security {
        Ok((token, tls)) => HerderClient::secured(config, FRAME_BYTES_MAX_DEFAULT, token, tls),
        Err(error) => std::process::exit(i32::from(usage_error(&error, args.json))),
    }
}

fn call_timeout(args: &ClientArgs) -> Duration {
    Duration::from_millis(args.call_timeout_millis.max(1))
}

fn parse_job_id(raw: &str, as_json: bool) -> Result<JobId, u8> {
    JobId::from_str(raw.trim()).map_err(|_| {
        usage_error(
            &format!("{raw:?} is not a job id (expected a UUID as printed by `submit`)"),
            as_json,
        )
    })
}

/// Exit code for a terminal job: 0 if it completed, 1 if it failed or was cancelled.
fn job_exit(job: &JobView) -> u8 {
    match job.state {
        JobState::Failed | JobState::Cancelled => exit::JOB_UNSUCCESSFUL,
        _ => exit::OK,
    }
}

pub async fn submit(args: SubmitArgs) -> u8 {
    let as_json = args.client.json;
    if let Some(path) = &args.batch_file {
        if args.task.is_some() {
            return usage_error(
                "--batch-file names its tasks in the file; give no task here",
                as_json,
            );
        }
        return crate::batch::submit_file(path, &args).await;
    }
    let payload = match args.task_json() {
        Ok(payload) => payload,
        Err(error) => return usage_error(&error, as_json),
    };
    // Validate here with the coordinator's own rules, so bad input never leaves the machine.
    let task = match TaskSpec::from_json(&payload) {
        Ok(task) => task,
        Err(error) => return usage_error(&error.to_string(), as_json),
    };
    let partitions = match args.partitions.as_deref().map(str::parse::<Partitions>) {
        None => None,
        Some(Ok(partitions)) => Some(partitions),
        Some(Err(error)) => return usage_error(&error, as_json),
    };
    if partitions.is_some() && !task.is_data_parallel() {
        return usage_error(
            "--partitions applies only to max, prime-count over a list, and prime-sum",
            as_json,
        );
    }
    let (delay_millis, run_at_unix_ms) = match when_to_run(&args) {
        Ok(when) => when,
        Err(error) => return usage_error(&error, as_json),
    };
    let after = match parse_after(&args.after) {
        Ok(after) => after,
        Err(error) => return usage_error(&error, as_json),
    };
    let mut config = ClientConfig::new(args.client.coordinator.clone());
    config.submit_retries = args.submit_retries;
    config.submit_retry_base = Duration::from_millis(args.submit_retry_base_millis.max(1));
    config.submit_retry_max = Duration::from_millis(
        args.submit_retry_max_millis
            .max(args.submit_retry_base_millis)
            .max(1),
    );
    let client = new_client(&args.client, config).with_call_timeout(call_timeout(&args.client));
    let options = SubmitOptions {
        partitions,
        max_attempts: args.max_attempts,
        idempotency_key: args.idempotency_key.clone(),
        timeout_millis: args.timeout_millis,
        fairness_key: args.fairness_key.clone(),
        priority: args.priority,
        queue: args.queue.clone(),
        delay_millis,
        run_at_unix_ms,
        retry_of: None,
        after,
        after_any_outcome: args.after_any_outcome,
    };
    let submitted = match client.submit(&task, options).await {
        Ok(submitted) => submitted,
        Err(error) => return report_error(&error, as_json),
    };
    if !args.wait {
        if as_json {
            println!("{}", herder_http::views::submitted(&submitted));
        } else if submitted.existing {
            println!("{} (existing job for idempotency key)", submitted.job_id);
        } else {
            println!("{}", submitted.job_id);
        }
        return exit::OK;
    }
    match client.wait(submitted.job_id, None).await {
        Ok((job, _)) => {
            if as_json {
                println!(
                    "{}",
                    json!({ "job_id": submitted.job_id, "existing": submitted.existing, "job": job_json(&job) })
                );
            } else {
                print!("{}", job_for_people(&job));
            }
            job_exit(&job)
        }
        Err(error) => report_error(&error, as_json),
    }
}

pub async fn status(args: JobArgs) -> u8 {
    let as_json = args.client.json;
    let job_id = match parse_job_id(&args.job_id, as_json) {
        Ok(id) => id,
        Err(code) => return code,
    };
    let client = client_for(&args.client);
    match client.status(job_id).await {
        Ok(job) => {
            if as_json {
                println!("{}", job_json(&job));
            } else {
                print!("{}", job_for_people(&job));
                print!("{}", waits_for_people(&client, &job).await);
            }
            exit::OK
        }
        Err(error) => report_error(&error, as_json),
    }
}

/// The jobs `job` waits for, each with where it is now (one `STATUS` each), and the jobs
/// waiting for it.
async fn waits_for_people(client: &HerderClient, job: &JobView) -> String {
    let mut out = String::new();
    if !job.waited_on_by.is_empty() {
        out += "  Awaited by:\n";
        for child in &job.waited_on_by {
            out += &format!("    {child}  BLOCKED\n");
        }
    }
    if job.after.is_empty() {
        return out;
    }
    out += if job.after_any_outcome {
        "  After:    (runs whatever these end as)\n"
    } else {
        "  After:    (runs once these completed; cancelled if one fails)\n"
    };
    for parent in &job.after {
        let state = match client.status(*parent).await {
            Ok(view) => view.state.to_string(),
            Err(error) => format!("not known ({error})"),
        };
        out += &format!("    {parent}  {state}\n");
    }
    out
}

pub async fn wait(args: WaitArgs) -> u8 {
    let as_json = args.client.json;
    let job_id = match parse_job_id(&args.job_id, as_json) {
        Ok(id) => id,
        Err(code) => return code,
    };
    let client = client_for(&args.client);
    // On a terminal, a line on stderr keeps saying what the job is doing while `wait` waits.
    let show_progress = !as_json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let waited = client.wait(job_id, args.timeout_millis);
    let answer = if show_progress {
        wait_showing_progress(&client, job_id, waited).await
    } else {
        waited.await
    };
    match answer {
        Ok((job, timed_out)) => {
            if as_json {
                println!("{}", herder_http::views::waited(&job, timed_out));
            } else {
                print!("{}", job_for_people(&job));
                if timed_out {
                    eprintln!("herder: timed out waiting; the job is still {}", job.state);
                }
            }
            if timed_out {
                exit::SERVER
            } else {
                job_exit(&job)
            }
        }
        Err(error) => report_error(&error, as_json),
    }
}

/// How often `wait` on a terminal asks how the job is doing.
const WAIT_PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Runs `waited`, rewriting one stderr line with the job's state every few seconds.
async fn wait_showing_progress<F>(
    client: &HerderClient,
    job_id: JobId,
    waited: F,
) -> Result<(JobView, bool), CallError>
where
    F: std::future::Future<Output = Result<(JobView, bool), CallError>>,
{
    use std::io::Write;
    let started = std::time::Instant::now();
    let mut waited = std::pin::pin!(waited);
    let mut tick = tokio::time::interval(WAIT_PROGRESS_EVERY);
    tick.tick().await;
    let mut shown = false;
    let answer = loop {
        tokio::select! {
            answer = &mut waited => break answer,
            _ = tick.tick() => {
                if let Ok(job) = client.status(job_id).await {
                    eprint!("\r\x1b[K{}", progress_line(&job, started.elapsed()));
                    let _ = std::io::stderr().flush();
                    shown = true;
                }
            }
        }
    };
    if shown {
        eprint!("\r\x1b[K");
    }
    answer
}

/// One line on how a job is doing, for `wait` on a terminal.
fn progress_line(job: &JobView, waited: Duration) -> String {
    let mut line = format!(
        "waiting {:>4} s: job {} {}",
        waited.as_secs(),
        job.id,
        job.state
    );
    if let Some(parts) = &job.partitions {
        line += &format!(", {} of {} partitions done", parts.done, parts.total);
    } else if job.attempt > 0 {
        line += &format!(", attempt {} of {}", job.attempt, job.max_attempts);
        if let Some(worker) = &job.worker {
            line += &format!(" on {worker}");
        }
    }
    line
}

pub async fn cancel(args: JobArgs) -> u8 {
    let as_json = args.client.json;
    let job_id = match parse_job_id(&args.job_id, as_json) {
        Ok(id) => id,
        Err(code) => return code,
    };
    match client_for(&args.client).cancel(job_id).await {
        Ok((job, cancelled)) => {
            if as_json {
                println!("{}", herder_http::views::cancelled(&job, cancelled));
            } else if cancelled {
                println!("Cancelled job {}", job.id);
            } else {
                println!(
                    "Job {} was already {}; nothing to cancel",
                    job.id, job.state
                );
            }
            exit::OK
        }
        Err(error) => report_error(&error, as_json),
    }
}

pub async fn list(args: ListArgs) -> u8 {
    let as_json = args.client.json;
    let state = match args.state.as_deref().map(|s| JobState::parse(s).ok_or(s)) {
        None => None,
        Some(Ok(state)) => Some(state),
        Some(Err(raw)) => {
            return usage_error(
                &format!("unknown state {raw:?}; use queued, running, retry-wait, completed, failed or cancelled"),
                as_json,
            )
        }
    };
    // One more than asked tells whether the listing stopped at the limit.
    let asked = args.limit.unwrap_or(LIST_LIMIT_DEFAULT).min(LIST_LIMIT_MAX);
    let fetch = (asked + 1).min(LIST_LIMIT_MAX);
    match client_for(&args.client).list(state, Some(fetch)).await {
        Ok(mut jobs) => {
            let more = jobs.len() > asked as usize;
            let maybe_more = !more && asked == LIST_LIMIT_MAX && jobs.len() == asked as usize;
            jobs.truncate(asked as usize);
            if as_json {
                println!(
                    "{}",
                    herder_http::views::job_list(&jobs, more || maybe_more)
                );
            } else {
                print!("{}", jobs_for_people(&jobs));
                if more || maybe_more {
                    eprintln!(
                        "herder: stopped at the limit of {asked} jobs; there may be more (--limit, at most {LIST_LIMIT_MAX}, or --state to narrow)"
                    );
                }
            }
            exit::OK
        }
        Err(error) => report_error(&error, as_json),
    }
}

/// Purges batch after batch until nothing more matches.
pub async fn purge(args: PurgeArgs) -> u8 {
    let as_json = args.client.json;
    let state = match args.state.as_deref().map(|s| JobState::parse(s).ok_or(s)) {
        None => None,
        Some(Ok(state)) if state.is_terminal() => Some(state),
        Some(Ok(state)) => {
            return usage_error(
                &format!("only terminal jobs can be purged; {state} is not terminal (use completed, failed or cancelled)"),
                as_json,
            )
        }
        Some(Err(raw)) => {
            return usage_error(
                &format!("unknown state {raw:?}; use completed, failed or cancelled"),
                as_json,
            )
        }
    };
    let client = client_for(&args.client);
    let mut purged_total = 0u64;
    // Every batch removes at least one job or the loop ends, and each request answers how
    // many remain; the bound is only a guard against a coordinator that says otherwise.
    for _ in 0..PURGE_BATCHES_MAX {
        match client.purge(state, args.older_than).await {
            Ok((purged, remaining)) => {
                purged_total += purged;
                if remaining == 0 || purged == 0 {
                    break;
                }
            }
            Err(error) => {
                if purged_total > 0 && !as_json {
                    eprintln!("herder: {purged_total} jobs were purged before this error");
                }
                return report_error(&error, as_json);
            }
        }
    }
    if as_json {
        println!("{}", json!({ "purged": purged_total }));
    } else {
        println!("Purged {purged_total} jobs");
    }
    exit::OK
}

/// Most purge requests one `herder purge` sends.
const PURGE_BATCHES_MAX: u32 = 1_000_000;

pub async fn workers(args: ClientArgs) -> u8 {
    match client_for(&args).workers().await {
        Ok(workers) => {
            if args.json {
                println!("{}", herder_http::views::workers(&workers));
            } else {
                print!("{}", workers_for_people(&workers));
            }
            exit::OK
        }
        Err(error) => report_error(&error, args.json),
    }
}

pub async fn queues(args: ClientArgs) -> u8 {
    match client_for(&args).queues().await {
        Ok(queues) => {
            if args.json {
                println!("{}", serde_json::json!({ "queues": queues }));
            } else {
                print!("{}", queues_for_people(&queues));
            }
            exit::OK
        }
        Err(error) => report_error(&error, args.json),
    }
}

/// `herder queue set|pause|resume NAME`.
pub async fn queue(args: QueueArgs) -> u8 {
    let (name, change) = match args.action {
        QueueAction::Set {
            name,
            weight,
            aging,
            concurrency,
            key_concurrency,
            rate,
            key_rate,
            max_active_jobs,
        } => {
            let aging_millis = aging.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            let change = QueueChange {
                weight,
                aging_millis,
                concurrency,
                key_concurrency,
                rate,
                key_rate,
                max_active_jobs,
                paused: None,
            };
            (name, change)
        }
        QueueAction::Pause { name } => (name, QueueChange::pause(true)),
        QueueAction::Resume { name } => (name, QueueChange::pause(false)),
    };
    if let Err(message) = herder_core::queues::check_queue_name(&name).and(change.check()) {
        return usage_error(&message, args.client.json);
    }
    match client_for(&args.client).set_queue(&name, change).await {
        Ok(queue) => {
            if args.client.json {
                println!("{}", serde_json::json!({ "queue": queue }));
            } else {
                print!("{}", queues_for_people(std::slice::from_ref(&queue)));
            }
            exit::OK
        }
        Err(error) => report_error(&error, args.client.json),
    }
}

/// `herder cluster` and `herder cluster transfer-leader`.
pub async fn cluster(args: ClusterArgs) -> u8 {
    match args.action {
        Some(ClusterAction::TransferLeader { to }) => transfer_leader(&args.client, to).await,
        None => cluster_view(&args.client).await,
    }
}

/// Asks every address given, and every member the answers list, for its view of the group.
async fn cluster_view(args: &ClientArgs) -> u8 {
    let mut asked: BTreeSet<String> = BTreeSet::new();
    let mut round: Vec<String> = args.coordinator.clone();
    let mut views: BTreeMap<NodeId, ClusterView> = BTreeMap::new();
    let mut unreachable: Vec<(String, CallError)> = Vec::new();
    while !round.is_empty() {
        let mut asking = tokio::task::JoinSet::new();
        for address in round.drain(..) {
            if asked.len() >= DIAL_ADDRESSES_MAX || !asked.insert(address.clone()) {
                continue;
            }
            let mut config = ClientConfig::new(vec![address.clone()]);
            config.connect_rounds = 1;
            config.connect_timeout = CLUSTER_CONNECT_TIMEOUT;
            config.request_timeout = CLUSTER_REPLY_TIMEOUT;
            let client = new_client(args, config);
            asking.spawn(async move { (address, client.cluster().await) });
        }
        while let Some(joined) = asking.join_next().await {
            let Ok((address, answer)) = joined else {
                continue;
            };
            match answer {
                Ok(view) => {
                    round.extend(view.members.iter().filter_map(|m| m.client_address.clone()));
                    views.entry(view.node_id.clone()).or_insert(view);
                }
                Err(error) => unreachable.push((address, error)),
            }
        }
    }
    if views.is_empty() {
        let error = unreachable
            .pop()
            .map(|(_, error)| error)
            .unwrap_or(CallError::Closed);
        return report_error(&error, args.json);
    }
    let views: Vec<ClusterView> = views.into_values().collect();
    let unreachable: Vec<(String, String)> = unreachable
        .into_iter()
        .map(|(address, error)| (address, error.to_string()))
        .collect();
    if args.json {
        println!("{}", cluster_json(&views, &unreachable));
    } else {
        print!("{}", cluster_for_people(&views, &unreachable));
    }
    exit::OK
}

async fn transfer_leader(args: &ClientArgs, to: Option<String>) -> u8 {
    let to = match to.as_deref().map(|raw| parse_node_id(raw, "--to")) {
        None => None,
        Some(Ok(id)) => Some(id),
        Some(Err(error)) => return usage_error(&error, args.json),
    };
    match client_for(args).transfer_leader(to).await {
        Ok(to) => {
            if args.json {
                println!("{}", json!({ "transfer_started": true, "to": to }));
            } else {
                println!("Leadership transfer to {to} started");
            }
            exit::OK
        }
        // The leader refused (an unknown member, or one that cannot take over now).
        Err(error @ CallError::Client(ClientError::Server { .. })) => {
            report_error_as(&error, args.json, "server", exit::SERVER)
        }
        Err(error) => report_error(&error, args.json),
    }
}

pub fn gen_certs(args: crate::cli::GenCertsArgs) -> u8 {
    match herder_runtime::tls::throwaway::write(&args.out, &args.hosts) {
        Ok(files) => {
            println!(
                "CA certificate:    {}",
                files.ca.as_deref().unwrap_or(&args.out).display()
            );
            println!("node certificate:  {}", files.cert.display());
            println!("node private key:  {}", files.key.display());
            exit::OK
        }
        Err(error) => usage_error(&error, false),
    }
}

/// `--after` as job ids.
pub fn parse_after(raw: &[String]) -> Result<Vec<JobId>, String> {
    raw.iter()
        .map(|id| {
            JobId::from_str(id.trim()).map_err(|_| format!("--after: {id:?} is not a job id"))
        })
        .collect()
}

/// `--delay` and `--run-at` as the wire carries them: `(delay_millis, run_at_unix_ms)`.
pub fn when_to_run(args: &SubmitArgs) -> Result<(Option<u64>, Option<u64>), String> {
    let delay = match &args.delay {
        None => None,
        Some(raw) => {
            let delay =
                crate::retention::parse_duration(raw).map_err(|e| format!("--delay: {e}"))?;
            Some(herder_core::time::as_millis_u64(delay))
        }
    };
    let run_at = match &args.run_at {
        None => None,
        Some(raw) => {
            let time = chrono::DateTime::parse_from_rfc3339(raw.trim()).map_err(|e| {
                format!(
                    "--run-at {raw:?} is not an RFC 3339 time such as 2026-12-24T18:00:00Z: {e}"
                )
            })?;
            let millis = u64::try_from(time.timestamp_millis())
                .map_err(|_| format!("--run-at {raw:?} is before 1970"))?;
            Some(millis)
        }
    };
    Ok((delay, run_at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use herder_core::protocol::PartitionsView;
    use herder_core::tasks::TaskSpec;

    fn view(state: JobState, attempt: u32) -> JobView {
        JobView {
            queue: herder_core::queues::default_queue(),
            priority: 0,
            fairness_key: None,
            progress: None,
            timeout_millis: None,
            unserved: false,
            id: JobId::from_str("2b9e8a4e-41a7-4a53-9d5d-6c8e0c6b6f7d").expect("an id"),
            state,
            attempt,
            max_attempts: 3,
            worker: (attempt > 0).then(|| WorkerId("worker-2".into())),
            lease_id: None,
            task: TaskSpec::Sleep { milliseconds: 5 },
            result: None,
            error: None,
            idempotency_key: None,
            partition_of: None,
            partitions: None,
            created_at_unix_ms: None,
            finished_at_unix_ms: None,
            first_started_at_unix_ms: None,
            history: Vec::new(),
            history_dropped: 0,
            submitted_by: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
            waited_on_by: Vec::new(),
        }
    }

    fn submit_args(args: &[&str]) -> SubmitArgs {
        let argv = ["herder", "submit", "sha256", "--text", "x"]
            .iter()
            .chain(args);
        match <crate::cli::Cli as clap::Parser>::try_parse_from(argv) {
            Ok(crate::cli::Cli {
                command: crate::cli::Command::Submit(args),
                ..
            }) => args,
            other => panic!("{args:?} does not parse as a submit: {other:?}"),
        }
    }

    #[test]
    fn delay_and_run_at_are_read_as_people_write_them() {
        assert_eq!(when_to_run(&submit_args(&[])), Ok((None, None)));
        assert_eq!(
            when_to_run(&submit_args(&["--delay", "90s"])),
            Ok((Some(90_000), None))
        );
        assert_eq!(
            when_to_run(&submit_args(&["--run-at", "2026-12-24T18:00:00Z"])),
            Ok((None, Some(1_798_135_200_000)))
        );
        assert_eq!(
            when_to_run(&submit_args(&["--run-at", "2026-12-24T19:00:00+01:00"])),
            Ok((None, Some(1_798_135_200_000)))
        );
        assert!(when_to_run(&submit_args(&["--run-at", "tomorrow"])).is_err());
        assert!(when_to_run(&submit_args(&["--delay", "5 minutes"])).is_err());
        let both = [
            "herder",
            "submit",
            "sha256",
            "--text",
            "x",
            "--delay",
            "1s",
            "--run-at",
            "2026-12-24T18:00:00Z",
        ];
        assert!(<crate::cli::Cli as clap::Parser>::try_parse_from(both).is_err());
    }

    #[test]
    fn the_progress_line_says_what_the_job_is_doing() {
        let queued = progress_line(&view(JobState::Queued, 0), Duration::from_secs(3));
        assert_eq!(
            queued,
            "waiting    3 s: job 2b9e8a4e-41a7-4a53-9d5d-6c8e0c6b6f7d QUEUED"
        );
        let running = progress_line(&view(JobState::Running, 2), Duration::from_secs(14));
        assert!(
            running.ends_with("RUNNING, attempt 2 of 3 on worker-2"),
            "{running}"
        );
        let mut parent = view(JobState::Running, 0);
        parent.partitions = Some(PartitionsView {
            done: 2,
            total: 5,
            pieces: Vec::new(),
        });
        assert!(progress_line(&parent, Duration::ZERO).ends_with("2 of 5 partitions done"));
    }
}
