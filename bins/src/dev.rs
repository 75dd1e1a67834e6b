//! `herder dev`: the embedded default — one coordinator (or a group of 3 or 5) and N workers in
//! one process, SQLite in a local folder. With `--demo` it also runs a small demonstration and
//! exits.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use herder_core::client::ClientConfig;
use herder_core::ids::{NodeId, WorkerId};
use herder_core::job::JobState;
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::tasks::TaskSpec;
use herder_core::worker::WorkerConfig;
use herder_runtime::auth::ServerCredentials;
use herder_runtime::client::{CallError, HerderClient, SubmitOptions};
use herder_runtime::coordinator::{self, CoordinatorHandle, CoordinatorOptions, Listeners};
use herder_runtime::tls::{throwaway, ClientTls, ServerTls};
use herder_runtime::worker;

use crate::cli::DevArgs;
use crate::exit;
use crate::output::{job_for_people, report_error, usage_error};
use crate::verbs::{coordinator_config, parse_listen_addr, terminated};
use crate::web::HttpListen;

/// Ports between one member of a dev group and the next (7071, 7081, 7091, ...).
const DEV_PORT_STRIDE: u16 = 10;
/// In a dev group, how far above its worker port each member serves HTTP by default.
const DEV_GROUP_HTTP_ABOVE_WORKERS: u16 = 3;
/// How long a dev group may take to elect a leader and register its workers.
const DEV_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between two looks at whether the dev group is ready.
const DEV_READY_POLL: Duration = Duration::from_millis(50);

pub async fn run(args: DevArgs) -> u8 {
    let members = match plan(&args) {
        Ok(members) => members,
        Err(error) => return usage_error(&error, false),
    };
    let http_plan: Vec<(NodeId, HttpListen)> =
        members.iter().map(|m| (m.id.clone(), m.http)).collect();
    let tls = match args.tls.then(|| throwaway_tls(&args)).transpose() {
        Ok(tls) => tls,
        Err(error) => return usage_error(&error, false),
    };
    let client_tls = tls.as_ref().and_then(ServerTls::client);
    let coordinators = match start_group(&args, members, tls.clone()).await {
        Ok(coordinators) => coordinators,
        Err(code) => return code,
    };
    let worker_addrs: Vec<String> = coordinators
        .iter()
        .map(|c| reachable(c.worker_addr()))
        .collect();
    let client_addrs: Vec<String> = coordinators
        .iter()
        .map(|c| reachable(c.client_addr()))
        .collect();
    let mut http_servers = Vec::new();
    for (n, ((node_id, listen), coordinator)) in
        http_plan.into_iter().zip(&coordinators).enumerate()
    {
        let dial = herder_http::own_first(&client_addrs, n);
        let max_frame = args.tuning.max_frame_bytes;
        let started = crate::web::start(
            listen,
            node_id,
            coordinator,
            dial,
            max_frame,
            None,
            tls.clone(),
        );
        match started.await {
            Ok(Some(server)) => http_servers.push(server),
            Ok(None) => {}
            Err(error) => {
                eprintln!("herder: {error}");
                for coordinator in coordinators {
                    let _ = coordinator.shutdown().await;
                }
                return exit::SERVER;
            }
        }
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let dashboards: Vec<String> = http_servers
        .iter()
        .map(|s| format!("{scheme}://{}/", reachable(s.local_addr())))
        .collect();
    let mut workers = Vec::new();
    for n in 1..=args.workers {
        let id = match WorkerId::parse(&format!("worker-{n}")) {
            Ok(id) => id,
            Err(error) => return usage_error(&error.to_string(), false),
        };
        let options = worker::WorkerOptions {
            max_frame_bytes: args.tuning.max_frame_bytes,
            drain_timeout: args.drain_timeout,
            handlers: match args.exec.handlers() {
                Ok(handlers) => handlers,
                Err(error) => return usage_error(&error, false),
            },
            tls: client_tls.clone(),
            ..worker::WorkerOptions::new(WorkerConfig {
                prefetch: args.prefetch,
                ..WorkerConfig::new(id, args.capacity, worker_addrs.clone())
            })
        };
        match worker::start(options) {
            Ok(handle) => workers.push(handle),
            Err(error) => return usage_error(&error.to_string(), false),
        }
    }
    let clients = client_addrs.join(",");
    let workers_at = worker_addrs.join(",");
    if coordinators.len() == 1 {
        eprintln!(
            "Herder dev cluster: {} workers x {} slots; clients at {clients}, workers at {workers_at}; data in {}",
            args.workers,
            args.capacity,
            args.data_dir.display()
        );
    } else {
        eprintln!(
            "Herder dev cluster: {} coordinators, {} workers x {} slots; clients at {clients}; workers at {workers_at}; data in {}/c1..c{}",
            coordinators.len(),
            args.workers,
            args.capacity,
            args.data_dir.display(),
            coordinators.len()
        );
    }
    if !dashboards.is_empty() {
        eprintln!("Dashboard and HTTP API at {}", dashboards.join(", "));
    }
    let tls_flag = match tls.as_ref().and_then(|tls| tls.files().ca.clone()) {
        Some(ca) => {
            eprintln!(
                "Every port speaks TLS, with a throwaway CA in {} (for trials only)",
                ca.parent().unwrap_or(&ca).display()
            );
            format!(" --tls-ca {}", ca.display())
        }
        None => String::new(),
    };
    let mut code = exit::OK;
    if coordinators.len() > 1 {
        code = ready(&client_addrs, args.workers, client_tls.clone()).await;
    }
    if code == exit::OK {
        code = if args.demo {
            demo(&client_addrs, client_tls.clone()).await
        } else {
            eprintln!("Try, in another terminal:  herder submit sha256 --text hello --wait --coordinator {clients}{tls_flag}");
            eprintln!("Press Ctrl-C to stop.");
            terminated().await;
            exit::OK
        };
    }
    // Workers drain before the coordinators stop, so what they run finishes or is handed
    // back, and no job is charged an attempt for the shutdown.
    let stoppers: Vec<_> = workers.iter().map(|handle| handle.stopper()).collect();
    let impatient = tokio::spawn(async move {
        // A second Ctrl-C during the drain stops the workers at once.
        terminated().await;
        for stopper in &stoppers {
            stopper.now();
        }
    });
    if !workers.is_empty() {
        eprintln!("Draining the workers (Ctrl-C again to stop at once)...");
    }
    let drains: Vec<_> = workers
        .into_iter()
        .map(|handle| tokio::spawn(handle.drain()))
        .collect();
    for drain in drains {
        let _ = drain.await;
    }
    impatient.abort();
    for server in http_servers {
        server.shutdown();
    }
    for coordinator in coordinators {
        if let Err(error) = coordinator.shutdown().await {
            eprintln!("herder: {error}");
            code = exit::SERVER;
        }
    }
    code
}

/// One member of the dev group, before it starts.
struct Planned {
    id: NodeId,
    data_dir: PathBuf,
    worker_addr: SocketAddr,
    client_addr: SocketAddr,
    peer_addr: Option<SocketAddr>,
    http: HttpListen,
}

/// Every member's id, data dir and listen addresses. A single coordinator is exactly the
/// long-standing dev layout: id `dev`, data in `--data-dir`, no peer port.
fn plan(args: &DevArgs) -> Result<Vec<Planned>, String> {
    let worker = parse_listen_addr(&args.worker_port, "127.0.0.1")?;
    let client = parse_listen_addr(&args.client_port, "127.0.0.1")?;
    let http_default = SocketAddr::from(([127, 0, 0, 1], herder_http::HTTP_PORT_DEFAULT));
    let http = HttpListen::parse(args.http_port.as_deref(), http_default)?;
    let peer = parse_listen_addr(&args.peer_port, "127.0.0.1")?;
    // `dev` checks no credentials, so it stays on this machine: a deployment across machines
    // runs `herder coordinator`, whose ports beyond loopback must check their credentials.
    for (flag, addr) in [
        ("--worker-port", Some(worker)),
        ("--client-port", Some(client)),
        ("--peer-port", Some(peer)),
        ("--http-port", http.addr()),
    ] {
        if let Some(addr) = addr.filter(|addr| !addr.ip().is_loopback()) {
            return Err(format!(
                "{flag} {addr} is beyond this machine, but `herder dev` checks no credentials and listens on loopback only; run `herder coordinator` with credentials to serve other machines"
            ));
        }
    }
    if args.coordinators <= 1 {
        return Ok(vec![Planned {
            id: NodeId("dev".to_owned()),
            data_dir: args.data_dir.clone(),
            worker_addr: worker,
            client_addr: client,
            peer_addr: None,
            http,
        }]);
    }
    // In a group the default 7080 is the second member's worker port: each member serves HTTP
    // just above its own ports instead.
    let member_http = |n: u32, worker_addr: SocketAddr| -> Result<HttpListen, String> {
        Ok(match http {
            HttpListen::Off => HttpListen::Off,
            HttpListen::Given(addr) => HttpListen::Given(offset(addr, n)?),
            HttpListen::Default(_) if worker_addr.port() == 0 => {
                HttpListen::Default(SocketAddr::new(worker_addr.ip(), 0))
            }
            HttpListen::Default(_) => HttpListen::Default(SocketAddr::new(
                worker_addr.ip(),
                worker_addr
                    .port()
                    .saturating_add(DEV_GROUP_HTTP_ABOVE_WORKERS),
            )),
        })
    };
    (0..args.coordinators)
        .map(|n| {
            Ok(Planned {
                id: NodeId(format!("c{}", n + 1)),
                data_dir: args.data_dir.join(format!("c{}", n + 1)),
                worker_addr: offset(worker, n)?,
                client_addr: offset(client, n)?,
                peer_addr: Some(offset(peer, n)?),
                http: member_http(n, offset(worker, n)?)?,
            })
        })
        .collect()
}

/// `addr` moved `n` strides up; port 0 (any free port) stays 0.
fn offset(addr: SocketAddr, n: u32) -> Result<SocketAddr, String> {
    if addr.port() == 0 {
        return Ok(addr);
    }
    let port = u16::try_from(n)
        .ok()
        .and_then(|n| n.checked_mul(DEV_PORT_STRIDE))
        .and_then(|up| addr.port().checked_add(up))
        .ok_or_else(|| format!("port {} leaves no room for member {}", addr.port(), n + 1))?;
    Ok(SocketAddr::new(addr.ip(), port))
}

/// Where a listener on `addr` is reached from this host.
fn reachable(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], addr.port())).to_string()
    } else {
        addr.to_string()
    }
}

/// A throwaway CA and certificate for this machine's loopback names, in DATA_DIR/tls (new at
/// every start: nothing outside the data directory is written, and nothing is reused).
fn throwaway_tls(args: &DevArgs) -> Result<ServerTls, String> {
    let hosts = ["localhost", "127.0.0.1", "::1"].map(String::from);
    let files = throwaway::write(&args.data_dir.join("tls"), &hosts)?;
    ServerTls::load(files).map_err(|e| e.to_string())
}

/// A client of the dev group, verifying it with `tls` if given.
fn dev_client(client_addrs: &[String], tls: Option<ClientTls>) -> HerderClient {
    let config = ClientConfig::new(client_addrs.to_vec());
    HerderClient::secured(config, FRAME_BYTES_MAX_DEFAULT, None, tls)
}

/// Binds every member's ports first, so each member is started knowing where the others are.
async fn start_group(
    args: &DevArgs,
    members: Vec<Planned>,
    tls: Option<ServerTls>,
) -> Result<Vec<CoordinatorHandle>, u8> {
    let mut bound = Vec::new();
    for member in members {
        let options = CoordinatorOptions {
            config: coordinator_config(&member.id.0, &args.tuning),
            data_dir: member.data_dir.clone(),
            worker_addr: member.worker_addr,
            client_addr: member.client_addr,
            peer_addr: member.peer_addr,
            peers: BTreeMap::new(),
            seed: None,
            limits: args.tuning.connection_limits(),
            credentials: ServerCredentials {
                tls: tls.clone(),
                ..Default::default()
            },
        };
        let valid = options.config.validate().map_err(|e| e.to_string());
        if let Err(error) = valid.and_then(|()| args.tuning.check()) {
            return Err(usage_error(&error, false));
        }
        match Listeners::bind(&options).await {
            Ok(listeners) => bound.push((options, listeners)),
            Err(error) => {
                eprintln!("herder: {error}");
                return Err(exit::SERVER);
            }
        }
    }
    let peer_addrs: BTreeMap<NodeId, String> = bound
        .iter()
        .filter_map(|(options, listeners)| {
            let addr = listeners.peer_addr()?;
            Some((options.config.node_id.clone(), reachable(addr)))
        })
        .collect();
    let mut handles = Vec::new();
    for (mut options, listeners) in bound {
        let me = options.config.node_id.clone();
        options.peers = peer_addrs
            .iter()
            .filter(|(id, _)| **id != me)
            .map(|(id, addr)| (id.clone(), addr.clone()))
            .collect();
        options.config.peers = options.peers.keys().cloned().collect();
        if let (Some(client), Some(worker)) = (listeners.client_addr(), listeners.worker_addr()) {
            options.config.client_address = reachable(client);
            options.config.worker_address = reachable(worker);
        }
        match coordinator::start_on(listeners, options).await {
            Ok(handle) => handles.push(handle),
            Err(error) => {
                eprintln!("herder: {error}");
                for handle in handles {
                    let _ = handle.shutdown().await;
                }
                return Err(exit::SERVER);
            }
        }
    }
    Ok(handles)
}

/// Waits until the group has a leader that answers and every worker has registered with it.
async fn ready(client_addrs: &[String], workers: u32, tls: Option<ClientTls>) -> u8 {
    let client = dev_client(client_addrs, tls);
    let deadline = tokio::time::Instant::now() + DEV_READY_TIMEOUT;
    loop {
        let last: Result<usize, CallError> = client
            .workers()
            .await
            .map(|list| list.iter().filter(|w| w.alive).count());
        match &last {
            Ok(alive) if *alive >= workers as usize => return exit::OK,
            _ if tokio::time::Instant::now() >= deadline => {
                return match last {
                    Err(error) => report_error(&error, false),
                    Ok(alive) => {
                        eprintln!("herder: only {alive} of {workers} workers registered within {DEV_READY_TIMEOUT:?}");
                        exit::SERVER
                    }
                };
            }
            _ => tokio::time::sleep(DEV_READY_POLL).await,
        }
    }
}

/// One job of each built-in kind, including one that fails before it succeeds and two split
/// across the workers, so the output shows scheduling, results, a retry and aggregation.
async fn demo(client_addrs: &[String], tls: Option<ClientTls>) -> u8 {
    let client = dev_client(client_addrs, tls);
    let tasks = [
        TaskSpec::Sha256 {
            text: "hello, herder".into(),
        },
        TaskSpec::WordCount {
            text: "the quick brown fox jumps over the lazy dog".into(),
        },
        TaskSpec::PrimeCount { limit: 100_000 },
        TaskSpec::Sleep { milliseconds: 500 },
        TaskSpec::Fail {
            fail_until_attempt: 2,
        },
        // Data-parallel: split into one partition per worker and aggregated.
        TaskSpec::PrimeSum {
            start: 1,
            end: 100_000,
        },
        TaskSpec::Max {
            numbers: vec![2, 4, 5, 11, -3, 7],
        },
    ];
    let mut submitted = Vec::new();
    for task in &tasks {
        match client.submit(task, SubmitOptions::default()).await {
            Ok(job) => {
                println!("Submitted {:<12} -> job {}", task.kind(), job.job_id);
                submitted.push(job.job_id);
            }
            Err(error) => {
                eprintln!("herder: demo submission failed: {error}");
                return exit::SERVER;
            }
        }
    }
    println!();
    let mut all_completed = true;
    for job_id in submitted {
        match client
            .wait(job_id, Some(Duration::from_secs(60).as_millis() as u64))
            .await
        {
            Ok((job, _)) => {
                all_completed &= job.state == JobState::Completed;
                println!("{}", job_for_people(&job));
            }
            Err(error) => {
                eprintln!("herder: waiting for {job_id} failed: {error}");
                return exit::SERVER;
            }
        }
    }
    if all_completed {
        println!(
            "All demo jobs COMPLETED. Run `herder dev` (without --demo) to keep a cluster running."
        );
        exit::OK
    } else {
        exit::JOB_UNSUCCESSFUL
    }
}
