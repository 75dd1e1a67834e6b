//! A network partition of a three-coordinator group, with real processes in network
//! namespaces: each coordinator runs in its own namespace, joined by veth pairs to a bridge in a
//! hub namespace where the clients and the worker run (every namespace, link and address is
//! made by this test and deleted when it ends, however it ends).
//!
//! The leader is cut off from the two other members (blackhole routes on both sides; the hub
//! still reaches everyone), so the majority elects a new leader and accepts work while the old
//! leader, asked alone, acknowledges nothing; once healed, the old leader follows the new one.
//!
//! Needs root and `ip` (iproute2); without them the test says why and passes as skipped.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::cluster::{herder_command, run_bounded, Group, MemberSpec};

const SUBNET_PREFIX: &str = "10.77.0";
const HUB_ADDR: &str = "10.77.0.1";
/// Bound on one submission that must not be acknowledged (the client is killed after it).
const UNANSWERED_LIMIT: Duration = Duration::from_secs(15);

fn member_addr(i: usize) -> String {
    format!("{SUBNET_PREFIX}.{}", 10 + i)
}

/// Runs `ip ARGS`; `Err` with what it printed if it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Why namespaces cannot be used here, if they cannot.
fn namespaces_unavailable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !root {
        return Some("not running as root".to_owned());
    }
    if Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        return Some("`ip` (iproute2) is not installed".to_owned());
    }
    None
}

/// The namespaces of one test run: `herder-t<pid>-<n>-hub` and `...-c0..c2`. Deleting a
/// namespace deletes the links in it (the bridge, and both ends of each veth pair).
struct Namespaces {
    hub: String,
    members: Vec<String>,
    created: Vec<String>,
}

impl Namespaces {
    fn create() -> Result<Namespaces, String> {
        static RUN: AtomicU32 = AtomicU32::new(0);
        sweep_stale();
        let prefix = format!(
            "herder-t{}-{}",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        );
        let mut net = Namespaces {
            hub: format!("{prefix}-hub"),
            members: (0..3).map(|i| format!("{prefix}-c{i}")).collect(),
            created: Vec::new(),
        };
        net.add(&net.hub.clone())?;
        let hub = net.hub.clone();
        ip(&["-n", &hub, "link", "set", "lo", "up"])?;
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            &hub,
            "addr",
            "add",
            &format!("{HUB_ADDR}/24"),
            "dev",
            "br0",
        ])?;
        ip(&["-n", &hub, "link", "set", "br0", "up"])?;
        for (i, ns) in net.members.clone().iter().enumerate() {
            net.add(ns)?;
            let link = format!("c{i}");
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n", &hub, "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns",
                ns,
            ])?;
            ip(&["-n", &hub, "link", "set", &link, "master", "br0"])?;
            ip(&["-n", &hub, "link", "set", &link, "up"])?;
            let addr = format!("{}/24", member_addr(i));
            ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(net)
    }

    fn add(&mut self, name: &str) -> Result<(), String> {
        ip(&["netns", "add", name])?;
        self.created.push(name.to_owned());
        Ok(())
    }

    /// Member `i` and member `j` drop every packet to each other (the hub still reaches both).
    fn cut(&self, i: usize, j: usize) -> Result<(), String> {
        let (to_j, to_i) = (
            format!("{}/32", member_addr(j)),
            format!("{}/32", member_addr(i)),
        );
        ip(&["-n", &self.members[i], "route", "add", "blackhole", &to_j])?;
        ip(&["-n", &self.members[j], "route", "add", "blackhole", &to_i])
    }

    fn heal(&self, i: usize, j: usize) -> Result<(), String> {
        let (to_j, to_i) = (
            format!("{}/32", member_addr(j)),
            format!("{}/32", member_addr(i)),
        );
        ip(&["-n", &self.members[i], "route", "del", "blackhole", &to_j])?;
        ip(&["-n", &self.members[j], "route", "del", "blackhole", &to_i])
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in self.created.iter().rev() {
            if let Err(error) = ip(&["netns", "del", name]) {
                eprintln!("cleanup: {error}");
            }
        }
    }
}

/// Deletes namespaces left by an earlier run of these tests whose process is gone (killed
/// before its guard ran). Only names of the form `herder-t<pid>-...` are touched.
fn sweep_stale() {
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name
            .strip_prefix("herder-t")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

#[test]
fn a_leader_cut_off_from_the_group_is_replaced_acknowledges_nothing_and_rejoins() {
    if let Some(why) = namespaces_unavailable() {
        eprintln!("SKIPPED: the partition test needs network namespaces: {why}");
        return;
    }
    let net = match Namespaces::create() {
        Ok(net) => net,
        Err(error) => {
            eprintln!("SKIPPED: cannot create network namespaces here: {error}");
            return;
        }
    };
    let specs = (0..3)
        .map(|i| MemberSpec {
            id: format!("c{i}"),
            host: member_addr(i),
            worker_port: 7070,
            client_port: 7071,
            peer_port: 7072,
            netns: Some(net.members[i].clone()),
        })
        .collect();
    // Declared after `net`, so its processes are killed before the namespaces go.
    let mut group = Group::new("partition", specs, Some(net.hub.clone()));
    group.start_all();
    let (leader, term) = group.wait_for_leader(&[], 0);
    group.start_worker("w1", 2);
    group.wait_for_worker("w1");
    let mut acked = vec![group.submit_ok(&[], &["sha256", "--text", "before"], Some("before"))];

    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &other in &others {
        net.cut(leader, other).expect("cut the leader off");
    }
    // A client on the cut-off side (in the old leader's namespace, so it reaches no one else
    // even when told where the other members are) gets no acknowledgement: neither right after
    // the cut, while the old leader may still believe it leads, nor once the majority has
    // moved on.
    let minority = net.members[leader].clone();
    let old_alone = group.members[leader].spec.client_addr();
    let cut_off_submit = |text: &str| {
        let command = herder_command(
            Some(&minority),
            &[
                "submit",
                "sha256",
                "--text",
                text,
                "--json",
                "--coordinator",
                &old_alone,
            ],
        );
        match run_bounded(command, UNANSWERED_LIMIT) {
            Some(output) => {
                assert!(
                    !output.status.success(),
                    "the cut-off leader acknowledged {text:?}: {}",
                    String::from_utf8_lossy(&output.stdout)
                );
                eprintln!(
                    "{text}: not acknowledged ({}): {}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout).trim()
                );
            }
            None => eprintln!("{text}: no answer within {UNANSWERED_LIMIT:?}"),
        }
    };
    cut_off_submit("cut-off-early");

    let (new, new_term) = group.wait_for_leader(&[leader], term);
    assert_ne!(new, leader);
    assert!(new_term > term);
    let majority = group.submit_ok(
        &[leader],
        &["sha256", "--text", "majority"],
        Some("majority"),
    );
    let view = group.wait_terminal(&[leader], &majority);
    assert_eq!(view["state"], "COMPLETED", "{view}");
    acked.push(majority);

    cut_off_submit("cut-off-late");
    let old_view = group
        .view(leader)
        .expect("the cut-off member still answers the hub");
    assert!(
        old_view["role"] != "leader" || old_view["term"].as_u64() < Some(new_term),
        "{old_view}"
    );

    for &other in &others {
        net.heal(leader, other).expect("heal the cut");
    }
    group.wait_follows_new_leader(leader, "rejoin as a follower");

    // Nothing sent to the cut-off side got in; everything acknowledged is there.
    acked.push(group.submit_ok(&[], &["sha256", "--text", "healed"], Some("healed")));
    group.assert_all_complete(&[], &acked);
    let addrs = group.client_addrs();
    let list = group
        .cli_json(&["list", "--json", "--limit", "1000", "--coordinator", &addrs])
        .expect("herder list");
    let jobs = list["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), acked.len(), "{list}");
    assert!(
        jobs.iter().all(|j| !j["task"]["text"]
            .as_str()
            .unwrap_or("")
            .starts_with("cut-off")),
        "a submission to the cut-off leader was kept: {list}"
    );
    drop(group);
    drop(net);
}
