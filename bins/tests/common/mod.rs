//! Helpers shared by the black-box tests: run `herder`, start long-running `herder` processes and
//! read the addresses they announce.
#![allow(dead_code)]

pub mod cluster;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub const HERDER: &str = env!("CARGO_BIN_EXE_herder");

pub fn herder(args: &[&str]) -> Output {
    Command::new(HERDER)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run herder")
}

/// Runs `herder ARGS` like [`herder`], but kills it and fails the test if it has not exited
/// within `limit`: for a command whose bug would be to wait forever.
pub fn herder_within(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(HERDER)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run herder");
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().expect("poll herder").is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            panic!("herder {args:?} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect herder's output")
}

pub fn code(output: &Output) -> i32 {
    output.status.code().expect("exited normally")
}

pub fn stdout_json(output: &Output) -> Value {
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "--json prints exactly one line, got {text:?}"
    );
    serde_json::from_str(lines[0]).expect("stdout is one JSON object")
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("herder-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A server process that is killed when the test ends.
pub struct Server {
    pub child: Child,
    pub client_addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `herder ARGS` and waits (bounded) for the stderr line naming its client address.
pub fn start_server(args: &[&str], marker: &str) -> Server {
    let (child, mut addresses) = start_announcing(args, &[marker]);
    Server {
        child,
        client_addr: addresses.remove(0),
    }
}

/// Starts `herder ARGS` and waits (bounded) until its stderr has shown an address after each of
/// `markers` (e.g. `worker_addr=`); returns them in the order of `markers`.
pub fn start_announcing(args: &[&str], markers: &[&str]) -> (Child, Vec<String>) {
    let mut child = Command::new(HERDER)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start herder");
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    let markers: Vec<String> = markers.iter().map(|m| (*m).to_owned()).collect();
    let wanted = markers.len();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            for (i, marker) in markers.iter().enumerate() {
                if let Some(rest) = line.split(marker.as_str()).nth(1) {
                    let addr: String = rest
                        .trim_start_matches(['=', ' '])
                        .chars()
                        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                        .collect();
                    let _ = tx.send((i, addr));
                }
            }
        }
    });
    let mut found: Vec<Option<String>> = vec![None; wanted];
    while found.iter().any(Option::is_none) {
        let (i, addr) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the process announced its addresses");
        found[i].get_or_insert(addr);
    }
    (child, found.into_iter().flatten().collect())
}
