//! A coordinator group of real `herder` processes, for the failover and partition tests: three
//! coordinators (each with its own data dir and log file per run), workers, and the client
//! verbs, every one a separate process. Members can be SIGKILLed, SIGSTOPped, restarted on
//! their data dir or wiped; every process started here is killed when the group is dropped.
//!
//! Members and clients may each run in a network namespace (`ip netns exec NS herder ...`).
//! Every wait is a poll of a condition with a deadline, and on a timeout the members' logs are
//! printed before the test fails.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::HERDER;

/// Timeouts short enough for tests: elections after 150-300 ms of silence, workers declared
/// lost after 500 ms.
pub const FAST_TIMEOUTS: [&str; 6] = [
    "--election-timeout-millis",
    "150",
    "--heartbeat-interval-millis",
    "100",
    "--heartbeat-timeout-millis",
    "500",
];

/// Bound on any one wait of these tests (elections, catch-up, a job finishing).
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

const POLL_EVERY: Duration = Duration::from_millis(50);

/// Ports handed out so far in this test process, so that two tests running at once never get
/// the same one.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// `n` ports that were free a moment ago and were never handed out before in this process (the
/// processes under test bind them by number, since every member must know the others' peer
/// ports before it starts, and a restarted member binds the same ones again).
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        if handed_out.insert(port) {
            ports.push(port);
        }
        held.push(listener);
    }
    ports
}

/// Where one member listens, and the namespace it runs in.
#[derive(Clone, Debug)]
pub struct MemberSpec {
    pub id: String,
    pub host: String,
    pub worker_port: u16,
    pub client_port: u16,
    pub peer_port: u16,
    pub netns: Option<String>,
}

impl MemberSpec {
    pub fn client_addr(&self) -> String {
        format!("{}:{}", self.host, self.client_port)
    }
    pub fn worker_addr(&self) -> String {
        format!("{}:{}", self.host, self.worker_port)
    }
    pub fn peer_addr(&self) -> String {
        format!("{}:{}", self.host, self.peer_port)
    }
}

pub struct Member {
    pub spec: MemberSpec,
    pub data_dir: PathBuf,
    pub child: Option<Child>,
    /// How many times it was started (its log of run N is `<id>.run<N>.log`).
    pub runs: u32,
    pub stopped: bool,
}

pub struct Group {
    pub root: PathBuf,
    pub members: Vec<Member>,
    pub workers: Vec<(String, Child)>,
    /// Where client verbs and workers run.
    pub client_netns: Option<String>,
    /// Extra coordinator flags (the fast timeouts unless told otherwise).
    pub coordinator_flags: Vec<String>,
    peers: String,
}

/// Every group's members prove this peer secret to each other, its workers this worker secret,
/// and its clients present this admin token (in `HERDER_TOKEN`): the groups of these tests run
/// with every port checking its credential, as a deployment across machines must.
pub const GROUP_PEER_SECRET: &str = "group-peer-secret-for-tests-0123456789";
pub const GROUP_WORKER_SECRET: &str = "group-worker-secret-for-tests-012345";
pub const GROUP_TOKEN: &str = "group-admin-token-for-tests-0123456789";

/// The TLS material every group of a test process uses: one throwaway CA and one certificate,
/// valid for loopback and the addresses the partition tests give their members. Every port
/// of these groups speaks TLS, the peer link mutual TLS, as a deployment across machines
/// should.
pub fn group_tls() -> &'static herder_runtime::tls::TlsFiles {
    static FILES: std::sync::OnceLock<herder_runtime::tls::TlsFiles> = std::sync::OnceLock::new();
    FILES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("herder-group-tls-{}", std::process::id()));
        let hosts: Vec<String> = ["localhost", "127.0.0.1"]
            .into_iter()
            .map(String::from)
            .chain((1..=40).map(|n| format!("10.77.0.{n}")))
            .collect();
        herder_runtime::tls::throwaway::write(&dir, &hosts)
            .expect("generate the group's certificates")
    })
}

fn group_ca() -> &'static str {
    group_tls()
        .ca
        .as_deref()
        .and_then(|p| p.to_str())
        .expect("a CA path in UTF-8")
}

/// `herder ARGS` as a command, inside `netns` if given, presenting the group's admin token and
/// trusting its CA.
pub fn herder_command(netns: Option<&str>, args: &[&str]) -> Command {
    let mut command = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, HERDER]);
            c
        }
        None => Command::new(HERDER),
    };
    command
        .args(args)
        .env("HERDER_TOKEN", GROUP_TOKEN)
        .env("HERDER_TLS_CA", group_ca())
        .stdin(Stdio::null());
    command
}

/// Runs `command` to its end or until `limit`, whichever is first (then it is killed and
/// `None` is returned).
pub fn run_bounded(mut command: Command, limit: Duration) -> Option<Output> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start herder");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The one JSON object a `--json` verb printed, if it exited 0.
fn json_of(output: &Output) -> Option<Value> {
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    serde_json::from_str(line).ok()
}

pub fn is_terminal(state: &Value) -> bool {
    matches!(state.as_str(), Some("COMPLETED" | "FAILED" | "CANCELLED"))
}

impl Group {
    /// Three members on 127.0.0.1, on ports free a moment ago, data under a fresh temp dir.
    pub fn local(name: &str) -> Group {
        let ports = free_ports(9);
        let specs = (0..3)
            .map(|i| MemberSpec {
                id: format!("c{i}"),
                host: "127.0.0.1".to_owned(),
                worker_port: ports[3 * i],
                client_port: ports[3 * i + 1],
                peer_port: ports[3 * i + 2],
                netns: None,
            })
            .collect();
        Group::new(name, specs, None)
    }

    pub fn new(name: &str, specs: Vec<MemberSpec>, client_netns: Option<String>) -> Group {
        let root = std::env::temp_dir().join(format!("herder-group-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create the test's temp dir");
        let credential = |name: &str, text: &str| {
            let path = root.join(name);
            std::fs::write(&path, text).expect("write a credential file");
            path.to_str().expect("utf-8").to_owned()
        };
        let credentials = vec![
            "--peer-secret-file".to_owned(),
            credential("peer.secret", GROUP_PEER_SECRET),
            "--worker-secret-file".to_owned(),
            credential("worker.secret", GROUP_WORKER_SECRET),
            "--client-tokens-file".to_owned(),
            credential("tokens", &format!("tests admin {GROUP_TOKEN}\n")),
        ]
        .into_iter()
        .chain(
            [
                ("--tls-cert", &group_tls().cert),
                ("--tls-key", &group_tls().key),
                ("--tls-ca", group_tls().ca.as_ref().expect("a CA")),
            ]
            .into_iter()
            .flat_map(|(flag, path)| [flag.to_owned(), path.display().to_string()]),
        )
        .collect::<Vec<_>>();
        let peers = specs
            .iter()
            .map(|s| format!("{}={}", s.id, s.peer_addr()))
            .collect::<Vec<_>>()
            .join(",");
        let members = specs
            .into_iter()
            .map(|spec| Member {
                data_dir: root.join(&spec.id),
                spec,
                child: None,
                runs: 0,
                stopped: false,
            })
            .collect();
        Group {
            root,
            members,
            workers: Vec::new(),
            client_netns,
            coordinator_flags: FAST_TIMEOUTS
                .iter()
                .map(|s| (*s).to_owned())
                .chain(credentials)
                .collect(),
            peers,
        }
    }

    /// Sets a coordinator flag (e.g. `--heartbeat-timeout-millis`) for every later start.
    pub fn set_flag(&mut self, flag: &str, value: &str) {
        match self.coordinator_flags.iter().position(|f| f == flag) {
            Some(at) => self.coordinator_flags[at + 1] = value.to_owned(),
            None => self
                .coordinator_flags
                .extend([flag.to_owned(), value.to_owned()]),
        }
    }

    /// The index of the member with this id.
    pub fn index(&self, id: &str) -> usize {
        self.members
            .iter()
            .position(|m| m.spec.id == id)
            .unwrap_or_else(|| panic!("no member {id}"))
    }

    pub fn id(&self, i: usize) -> &str {
        &self.members[i].spec.id
    }

    pub fn start_all(&mut self) {
        for i in 0..self.members.len() {
            self.start(i);
        }
    }

    /// Starts member `i` on its data dir (it must not be running).
    pub fn start(&mut self, i: usize) {
        let peers = self.peers.clone();
        let flags = self.coordinator_flags.clone();
        let member = &mut self.members[i];
        assert!(
            member.child.is_none(),
            "{} is already running",
            member.spec.id
        );
        member.runs += 1;
        let log = self
            .root
            .join(format!("{}.run{}.log", member.spec.id, member.runs));
        let (worker_port, client_port) = (member.spec.worker_addr(), member.spec.client_addr());
        let data_dir = member.data_dir.to_str().expect("utf-8").to_owned();
        let mut args = vec![
            "coordinator",
            "--id",
            &member.spec.id,
            "--data-dir",
            &data_dir,
            "--worker-port",
            &worker_port,
            "--client-port",
            &client_port,
            "--peers",
            &peers,
        ];
        args.extend(flags.iter().map(String::as_str));
        let child = herder_command(member.spec.netns.as_deref(), &args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("create log"))
            .spawn()
            .expect("start coordinator");
        member.child = Some(child);
        member.stopped = false;
    }

    /// SIGKILL member `i` and reap it.
    pub fn kill(&mut self, i: usize) {
        let member = &mut self.members[i];
        let mut child = member.child.take().expect("the member runs");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        member.stopped = false;
    }

    /// Sends `signal` (e.g. `-STOP`) to member `i`'s process, by its pid.
    fn signal(&self, i: usize, signal: &str) -> bool {
        let Some(child) = self.members[i].child.as_ref() else {
            return false;
        };
        Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// SIGSTOP member `i`: it stays connected but says nothing until `resume`.
    pub fn pause(&mut self, i: usize) {
        assert!(self.signal(i, "-STOP"), "SIGSTOP {}", self.id(i));
        self.members[i].stopped = true;
    }

    pub fn resume(&mut self, i: usize) {
        assert!(self.signal(i, "-CONT"), "SIGCONT {}", self.id(i));
        self.members[i].stopped = false;
    }

    /// Deletes member `i`'s data dir (it must not be running).
    pub fn wipe(&mut self, i: usize) {
        assert!(self.members[i].child.is_none());
        std::fs::remove_dir_all(&self.members[i].data_dir).expect("delete the data dir");
    }

    /// The log of member `i`'s latest run.
    pub fn log(&self, i: usize) -> String {
        let member = &self.members[i];
        std::fs::read_to_string(
            self.root
                .join(format!("{}.run{}.log", member.spec.id, member.runs)),
        )
        .unwrap_or_default()
    }

    /// Waits until a line of member `i`'s latest log contains every one of `needles` (logs
    /// are written by a background thread, so a line can trail the state it reports).
    pub fn wait_for_log(&self, i: usize, needles: &[&str]) {
        let what = format!("{} to log {needles:?}", self.id(i));
        self.poll(&what, || {
            self.log(i)
                .lines()
                .any(|line| needles.iter().all(|n| line.contains(n)))
                .then_some(())
        });
    }

    /// Client addresses of the members not in `except`, comma-separated.
    pub fn client_addrs_except(&self, except: &[usize]) -> String {
        (0..self.members.len())
            .filter(|i| !except.contains(i))
            .map(|i| self.members[i].spec.client_addr())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn client_addrs(&self) -> String {
        self.client_addrs_except(&[])
    }

    pub fn worker_addrs(&self) -> String {
        self.members
            .iter()
            .map(|m| m.spec.worker_addr())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs a client verb (where the clients run), bounded by `WAIT_LIMIT`.
    pub fn cli(&self, args: &[&str]) -> Option<Output> {
        run_bounded(
            herder_command(self.client_netns.as_deref(), args),
            WAIT_LIMIT,
        )
    }

    /// A client verb's JSON answer, if it exited 0 in time.
    pub fn cli_json(&self, args: &[&str]) -> Option<Value> {
        self.cli(args).as_ref().and_then(json_of)
    }

    /// Starts a worker with `capacity` slots, connected to every member's worker port.
    pub fn start_worker(&mut self, id: &str, capacity: u32) {
        let log = self.root.join(format!("worker-{id}.log"));
        let capacity = capacity.to_string();
        let addrs = self.worker_addrs();
        let worker_secret = self.root.join("worker.secret");
        let worker_secret = worker_secret.to_str().expect("utf-8");
        let child = herder_command(
            self.client_netns.as_deref(),
            &[
                "worker",
                "--id",
                id,
                "--capacity",
                &capacity,
                "--coordinator",
                &addrs,
                "--worker-secret-file",
                worker_secret,
            ],
        )
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(File::create(log).expect("create log"))
        .spawn()
        .expect("start worker");
        self.workers.push((id.to_owned(), child));
    }

    /// Polls `probe` every 50 ms until it gives a value, for at most `WAIT_LIMIT`; on a timeout
    /// prints every log and fails the test naming `what`.
    pub fn poll<T>(&self, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
        self.poll_showing(what, || probe().ok_or_else(String::new))
    }

    /// `poll` for a probe that says what it saw when the condition does not hold yet (the
    /// last of which is shown on a timeout).
    pub fn poll_showing<T>(&self, what: &str, mut probe: impl FnMut() -> Result<T, String>) -> T {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            let seen = match probe() {
                Ok(value) => return value,
                Err(seen) => seen,
            };
            if Instant::now() >= deadline {
                self.print_logs();
                panic!("timed out after {WAIT_LIMIT:?} waiting for {what}; last seen: {seen}");
            }
            std::thread::sleep(POLL_EVERY);
        }
    }

    pub fn print_logs(&self) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let mut logs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        logs.sort();
        for path in logs {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("----- {} (last 40 lines)", path.display());
            for line in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("{line}");
            }
        }
    }

    /// `herder cluster --json`, asked through the members not in `except`.
    pub fn cluster(&self, except: &[usize]) -> Option<Value> {
        let addrs = self.client_addrs_except(except);
        self.cli_json(&["cluster", "--json", "--coordinator", &addrs])
    }

    /// Member `i`'s own view of the group (its CLUSTER answer), if it answers within a second.
    /// Asked of that member alone, so a paused member elsewhere costs nothing.
    pub fn view(&self, i: usize) -> Option<Value> {
        let address = self.members[i].spec.client_addr();
        if self.client_netns.is_some() {
            // The test process cannot reach into the namespaces; ask through the CLI there.
            let view = self.cli_json(&["cluster", "--json", "--coordinator", &address])?;
            return view["members"]
                .as_array()?
                .iter()
                .find(|m| m["node_id"] == self.id(i))
                .cloned();
        }
        probe_view(&address)
    }

    /// The leader and its term, as the members not in `except` see it: the member among them
    /// that says it leads, in the highest term.
    pub fn leader_among(&self, except: &[usize]) -> Option<(usize, u64)> {
        (0..self.members.len())
            .filter(|i| !except.contains(i) && self.members[*i].child.is_some())
            .filter_map(|i| Some((i, self.view(i)?)))
            .filter(|(_, v)| v["role"] == "leader")
            .map(|(i, v)| (i, v["term"].as_u64().unwrap_or(0)))
            .max_by_key(|(_, term)| *term)
    }

    /// Waits until member `i`, which no longer leads, follows the leader the others elected, in
    /// that leader's term; `why` names the wait in the timeout message.
    pub fn wait_follows_new_leader(&self, i: usize, why: &str) {
        self.poll(&format!("{} to {why}", self.id(i)), || {
            let (current, current_term) = self.leader_among(&[i])?;
            let view = self.view(i)?;
            (view["role"] == "follower"
                && view["term"].as_u64() == Some(current_term)
                && view["leader"] == self.id(current))
            .then_some(())
        });
    }

    /// Waits until one of the running members not in `except` leads in a term above `above`,
    /// and every one of them names it leader in that term.
    pub fn wait_for_leader(&self, except: &[usize], above: u64) -> (usize, u64) {
        let running: Vec<usize> = (0..self.members.len())
            .filter(|i| !except.contains(i) && self.members[*i].child.is_some())
            .collect();
        self.poll_showing(&format!("a leader in a term above {above}"), || {
            let views: Vec<(usize, Option<Value>)> =
                running.iter().map(|&i| (i, self.view(i))).collect();
            let seen = || {
                views
                    .iter()
                    .map(|(i, v)| match v {
                        Some(v) => format!(
                            "{}: {} term {} leader {}",
                            self.id(*i),
                            v["role"],
                            v["term"],
                            v["leader"]
                        ),
                        None => format!("{}: no answer", self.id(*i)),
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            let leader = views
                .iter()
                .filter_map(|(i, v)| Some((*i, v.as_ref()?)))
                .filter(|(_, v)| v["role"] == "leader")
                .map(|(i, v)| (i, v["term"].as_u64().unwrap_or(0)))
                .max_by_key(|(_, term)| *term);
            match leader {
                Some((leader, term))
                    if term > above
                        && views.iter().all(|(_, v)| {
                            v.as_ref().is_some_and(|v| {
                                v["term"].as_u64() == Some(term) && v["leader"] == self.id(leader)
                            })
                        }) =>
                {
                    Ok((leader, term))
                }
                _ => Err(seen()),
            }
        })
    }

    pub fn wait_for_worker(&self, id: &str) {
        let addrs = self.client_addrs();
        self.poll(&format!("worker {id} to be alive"), || {
            let view = self.cli_json(&["workers", "--json", "--coordinator", &addrs])?;
            view["workers"]
                .as_array()?
                .iter()
                .any(|w| w["id"] == id && w["alive"] == true)
                .then_some(())
        });
    }

    /// `herder submit TASK... --json` through the members not in `except`; the job id if it
    /// was acknowledged.
    pub fn submit(&self, except: &[usize], task: &[&str], key: Option<&str>) -> Option<String> {
        submit_via(
            self.client_netns.as_deref(),
            &self.client_addrs_except(except),
            task,
            key,
        )
    }

    /// `submit` that must be acknowledged.
    pub fn submit_ok(&self, except: &[usize], task: &[&str], key: Option<&str>) -> String {
        match self.submit(except, task, key) {
            Some(id) => id,
            None => {
                self.print_logs();
                panic!("submission {task:?} was not acknowledged");
            }
        }
    }

    /// `herder status JOB --json` through the members not in `except`.
    pub fn status(&self, except: &[usize], job: &str) -> Option<Value> {
        let addrs = self.client_addrs_except(except);
        self.cli_json(&["status", job, "--json", "--coordinator", &addrs])
    }

    /// Waits until `job` is terminal and returns its view.
    pub fn wait_terminal(&self, except: &[usize], job: &str) -> Value {
        self.poll(&format!("job {job} to end"), || {
            self.status(except, job)
                .filter(|v| is_terminal(&v["state"]))
        })
    }

    /// Waits until every job in `jobs` has ended and asserts each COMPLETED.
    pub fn assert_all_complete(&self, except: &[usize], jobs: &[String]) {
        for job in jobs {
            let view = self.wait_terminal(except, job);
            assert_eq!(view["state"], "COMPLETED", "acknowledged job {job}: {view}");
        }
    }
}

/// `herder submit TASK... --json --coordinator ADDRS` (inside `netns` if given), bounded by
/// `WAIT_LIMIT`; the job id if it was acknowledged. Usable from another thread.
pub fn submit_via(
    netns: Option<&str>,
    addrs: &str,
    task: &[&str],
    key: Option<&str>,
) -> Option<String> {
    let mut args = vec!["submit"];
    args.extend_from_slice(task);
    args.extend_from_slice(&["--json", "--coordinator", addrs]);
    if let Some(key) = key {
        args.extend_from_slice(&["--idempotency-key", key]);
    }
    let output = run_bounded(herder_command(netns, &args), WAIT_LIMIT)?;
    let view = json_of(&output)?;
    view["job_id"].as_str().map(str::to_owned)
}

/// One member's CLUSTER answer through the client library, with a short timeout.
fn probe_view(address: &str) -> Option<Value> {
    use herder_core::client::ClientConfig;
    use herder_runtime::client::HerderClient;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let mut config = ClientConfig::new(vec![address.to_owned()]);
        config.connect_rounds = 1;
        config.connect_timeout = Duration::from_millis(500);
        config.request_timeout = Duration::from_millis(1_000);
        config.max_resends = 0;
        let token = herder_core::auth::ClientToken::from_text(GROUP_TOKEN).ok();
        let tls = herder_runtime::tls::ClientTls::with_ca_file(Path::new(group_ca())).ok();
        let client = HerderClient::secured(
            config,
            herder_core::limits::FRAME_BYTES_MAX_DEFAULT,
            token.map(std::sync::Arc::new),
            tls,
        );
        let view = tokio::time::timeout(Duration::from_millis(2_000), client.cluster())
            .await
            .ok()?
            .ok()?;
        serde_json::to_value(view).ok()
    })
}

impl Drop for Group {
    fn drop(&mut self) {
        for (_, child) in &mut self.workers {
            let _ = child.kill();
            let _ = child.wait();
        }
        for i in 0..self.members.len() {
            if self.members[i].stopped {
                let _ = self.signal(i, "-CONT");
            }
            if let Some(mut child) = self.members[i].child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "(the group's data and logs are kept in {})",
                self.root.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}
