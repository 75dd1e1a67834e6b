//! The floor under "one submission in flight per connection": how fast any server on this disk
//! and these cores can answer requests that must each be durable before their answer, when each
//! of N connections waits for its answer before sending the next. No job logic, no workers:
//! a request is a ~200-byte row, the server commits every request waiting into one SQLite
//! transaction (the store's settings: WAL, `synchronous=FULL`, exclusive locking) and answers
//! them straight from the committing thread. Plain threads and blocking sockets, so the only
//! hand-offs are the kernel's and one from a connection's thread to the committing thread.
//!
//! ```text
//! cargo run --release -p herder-runtime --example ack_floor -- server 127.0.0.1:27199 /tmp/floor &
//! cargo run --release -p herder-runtime --example ack_floor -- client 127.0.0.1:27199 4 20000
//! ```
//!
//! With `server ADDR DIR GATHER MICROS`, the server is an ideal one that knows its load: before
//! each commit it waits up to MICROS microseconds for GATHER requests (one from each connection
//! it expects), so that every commit carries every connection's request. No real server knows
//! how many requests are about to arrive; this bounds what any choice of when to commit could
//! reach.
//!
//! The client prints one JSON line: requests answered per second, and the median and p99 time
//! from sending a request to reading its answer. `scripts/bench-throughput.sh` runs both as
//! separate processes beside its one-in-flight target (`SUITE=targets`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection};

/// Bytes of one request and of the row it becomes: about a submission's log entry.
const REQUEST_BYTES: usize = 200;
/// Connections the server accepts before it stops listening.
const CONNECTIONS_MAX: usize = 64;

type Pending = Arc<(Mutex<Vec<(usize, u64)>>, Condvar)>;

/// How long a commit waits for company: up to `wait` for `requests` requests in all. The
/// default waits for nothing, as a server that cannot know its load must.
#[derive(Clone, Copy, Default)]
struct Gather {
    requests: usize,
    wait: Duration,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["server", addr, dir] => server(addr, dir, Gather::default()),
        ["server", addr, dir, requests, micros] => match (requests.parse(), micros.parse()) {
            (Ok(requests), Ok(micros)) => server(
                addr,
                dir,
                Gather {
                    requests,
                    wait: Duration::from_micros(micros),
                },
            ),
            _ => Err("GATHER and MICROS are whole numbers".into()),
        },
        ["client", addr, connections, requests] => match (connections.parse(), requests.parse()) {
            (Ok(connections), Ok(requests)) => client(addr, connections, requests),
            _ => Err("connections and requests are whole numbers".into()),
        },
        _ => Err(
            "usage: ack_floor server ADDR DIR [GATHER MICROS] | client ADDR CONNECTIONS REQUESTS"
                .into(),
        ),
    };
    if let Err(error) = result {
        eprintln!("ack_floor: {error}");
        std::process::exit(1);
    }
}

fn server(addr: &str, dir: &str, gather: Gather) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let db = Connection::open(std::path::Path::new(dir).join("ack-floor.sqlite3"))?;
    db.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    db.pragma_update(None, "journal_mode", "WAL")?;
    db.pragma_update(None, "synchronous", "FULL")?;
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS log (idx INTEGER PRIMARY KEY, entry BLOB NOT NULL)",
    )?;
    let listener = TcpListener::bind(addr)?;
    let pending: Pending = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
    let writers: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
    {
        let pending = pending.clone();
        let writers = writers.clone();
        std::thread::spawn(move || {
            if let Err(error) = commit_loop(db, &pending, &writers, gather) {
                eprintln!("ack_floor: commit: {error}");
                std::process::exit(1);
            }
        });
    }
    for (index, stream) in listener.incoming().take(CONNECTIONS_MAX).enumerate() {
        let stream = stream?;
        stream.set_nodelay(true)?;
        writers
            .lock()
            .map_err(|_| "poisoned")?
            .push(stream.try_clone()?);
        let pending = pending.clone();
        std::thread::spawn(move || read_loop(stream, index, &pending));
    }
    Ok(())
}

/// One connection: each request read is queued for the next commit.
fn read_loop(mut stream: TcpStream, index: usize, pending: &Pending) {
    let mut request = [0u8; REQUEST_BYTES];
    while stream.read_exact(&mut request).is_ok() {
        let tag = u64::from_le_bytes(request[..8].try_into().unwrap_or_default());
        let (queue, wake) = &**pending;
        let Ok(mut queue) = queue.lock() else { return };
        queue.push((index, tag));
        wake.notify_one();
    }
}

/// Commits every request waiting in one transaction, then answers each.
fn commit_loop(
    mut db: Connection,
    pending: &Pending,
    writers: &Mutex<Vec<TcpStream>>,
    gather: Gather,
) -> Result<(), Box<dyn std::error::Error>> {
    let (queue, wake) = &**pending;
    let row = [7u8; REQUEST_BYTES];
    let mut next_index: i64 = 0;
    loop {
        let group = {
            let mut queue = queue.lock().map_err(|_| "poisoned")?;
            while queue.is_empty() {
                queue = wake.wait(queue).map_err(|_| "poisoned")?;
            }
            let deadline = Instant::now() + gather.wait;
            while queue.len() < gather.requests {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                queue = wake.wait_timeout(queue, left).map_err(|_| "poisoned")?.0;
            }
            std::mem::take(&mut *queue)
        };
        let tx = db.transaction()?;
        {
            let mut put =
                tx.prepare_cached("INSERT OR REPLACE INTO log (idx, entry) VALUES (?1, ?2)")?;
            for _ in &group {
                next_index += 1;
                put.execute(params![next_index, &row[..]])?;
            }
        }
        tx.commit()?;
        let mut writers = writers.lock().map_err(|_| "poisoned")?;
        for (index, tag) in group {
            if let Some(stream) = writers.get_mut(index) {
                stream.write_all(&tag.to_le_bytes())?;
            }
        }
    }
}

fn client(addr: &str, connections: usize, requests: u64) -> Result<(), Box<dyn std::error::Error>> {
    let per_connection = requests / connections.max(1) as u64;
    let started = Instant::now();
    let threads: Vec<_> = (0..connections)
        .map(|_| {
            let addr = addr.to_owned();
            std::thread::spawn(move || -> Result<Vec<Duration>, String> {
                let mut stream = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                let mut request = [1u8; REQUEST_BYTES];
                let mut answer = [0u8; 8];
                let mut latencies = Vec::with_capacity(per_connection as usize);
                for tag in 0..per_connection {
                    request[..8].copy_from_slice(&tag.to_le_bytes());
                    let sent = Instant::now();
                    stream.write_all(&request).map_err(|e| e.to_string())?;
                    stream.read_exact(&mut answer).map_err(|e| e.to_string())?;
                    latencies.push(sent.elapsed());
                    if u64::from_le_bytes(answer) != tag {
                        return Err(format!("answer {answer:?} is not for request {tag}"));
                    }
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for thread in threads {
        latencies.extend(thread.join().map_err(|_| "client thread panicked")??);
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |q: f64| {
        let rank = ((latencies.len() as f64) * q) as usize;
        latencies
            .get(rank.min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "{{\"connections\": {connections}, \"answered\": {}, \"per_second\": {:.0}, \"millis_p50\": {:.3}, \"millis_p99\": {:.3}}}",
        latencies.len(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        at(0.5),
        at(0.99)
    );
    Ok(())
}
