//! Black-box tests of coordinator groups through the `herder` command: separate coordinator
//! processes joined by `--peers`, `--peer-port` for a group of one, and `herder dev` with three
//! coordinators.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{code, herder, start_announcing, stdout_json, temp_dir, Server, HERDER};

/// Bound for a group to elect a leader and register its workers.
const GROUP_READY: Duration = Duration::from_secs(30);

/// `n` ports that were free a moment ago (the processes under test bind them by number, since
/// every member must know the others' peer ports before it starts).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// Runs `herder ARGS` until it exits 0 with output `accept` takes, at most `GROUP_READY`.
fn poll_herder(args: &[&str], what: &str, accept: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + GROUP_READY;
    loop {
        let output = herder(args);
        let last = if code(&output) == 0 {
            let value = stdout_json(&output);
            if accept(&value) {
                return;
            }
            value.to_string()
        } else {
            String::from_utf8_lossy(&output.stdout).into_owned()
        };
        assert!(
            Instant::now() < deadline,
            "{what} never held within {GROUP_READY:?}; last: {last}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_peer_port_alone_is_a_group_of_one() {
    let dir = temp_dir("peer-port-alone");
    let (child, addresses) = start_announcing(
        &[
            "coordinator",
            "--data-dir",
            dir.to_str().expect("utf-8"),
            "--worker-port",
            "127.0.0.1:0",
            "--client-port",
            "127.0.0.1:0",
            "--peer-port",
            "127.0.0.1:0",
        ],
        &["client_addr=", "peer_addr="],
    );
    let server = Server {
        child,
        client_addr: addresses[0].clone(),
    };
    assert!(addresses[1].starts_with("127.0.0.1:"), "{addresses:?}");
    let output = herder(&["workers", "--json", "--coordinator", &server.client_addr]);
    assert_eq!(code(&output), 0);
    assert_eq!(stdout_json(&output)["workers"], serde_json::json!([]));
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn three_coordinator_processes_form_a_group_that_serves_through_any_member() {
    let ports = free_ports(9);
    let (worker_ports, rest) = ports.split_at(3);
    let (client_ports, peer_ports) = rest.split_at(3);
    let peers = (0..3)
        .map(|i| format!("c{}=127.0.0.1:{}", i + 1, peer_ports[i]))
        .collect::<Vec<_>>()
        .join(",");
    let root = temp_dir("group-processes");
    let mut servers = Vec::new();
    for i in 0..3 {
        let id = format!("c{}", i + 1);
        let data_dir = root.join(&id);
        let worker_port = format!("127.0.0.1:{}", worker_ports[i]);
        let client_port = format!("127.0.0.1:{}", client_ports[i]);
        let (child, addresses) = start_announcing(
            &[
                "coordinator",
                "--id",
                &id,
                "--data-dir",
                data_dir.to_str().expect("utf-8"),
                "--worker-port",
                &worker_port,
                "--client-port",
                &client_port,
                "--peers",
                &peers,
                "--election-timeout-millis",
                "150",
            ],
            &["client_addr="],
        );
        servers.push(Server {
            child,
            client_addr: addresses[0].clone(),
        });
    }
    let workers_at = worker_ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let worker = Command::new(HERDER)
        .args(["worker", "--id", "w1", "--coordinator", &workers_at])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start worker");
    let _worker = Server {
        child: worker,
        client_addr: String::new(),
    };
    let every_member = servers
        .iter()
        .map(|s| s.client_addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    poll_herder(
        &["workers", "--json", "--coordinator", &every_member],
        "the group's leader lists w1 alive",
        |value| {
            value["workers"]
                .as_array()
                .is_some_and(|ws| ws.iter().any(|w| w["id"] == "w1" && w["alive"] == true))
        },
    );

    // Through each member's address alone: a follower redirects to the leader, whose address
    // it learned from the leader's HELLO (the host of its --peers entry, its client port).
    for server in &servers {
        let output = herder(&[
            "submit",
            "sha256",
            "--text",
            "abc",
            "--wait",
            "--json",
            "--coordinator",
            &server.client_addr,
        ]);
        assert_eq!(
            code(&output),
            0,
            "via {}: {}",
            server.client_addr,
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(stdout_json(&output)["job"]["state"], "COMPLETED");
    }

    // herder cluster: asked through one member, it finds the others and they agree.
    let output = herder(&[
        "cluster",
        "--json",
        "--coordinator",
        &servers[0].client_addr,
    ]);
    assert_eq!(code(&output), 0);
    let view = stdout_json(&output);
    let members = view["members"].as_array().expect("members");
    assert_eq!(members.len(), 3, "{view}");
    let leader = view["leader"].as_str().expect("a leader").to_owned();
    assert!(
        members.iter().all(|m| m["leader"] == leader.as_str()),
        "{view}"
    );
    let text =
        String::from_utf8_lossy(&herder(&["cluster", "--coordinator", &every_member]).stdout)
            .into_owned();
    assert!(text.contains(&format!("Leader {leader}")), "{text}");

    // transfer-leader, through any member: the named member takes over.
    let target = if leader == "c1" { "c2" } else { "c1" };
    let output = herder(&[
        "cluster",
        "transfer-leader",
        "--to",
        target,
        "--json",
        "--coordinator",
        &every_member,
    ]);
    assert_eq!(
        code(&output),
        0,
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(stdout_json(&output)["to"], target);
    poll_herder(
        &["cluster", "--json", "--coordinator", &every_member],
        "the target leads",
        |value| value["leader"] == target,
    );
    let output = herder(&[
        "cluster",
        "transfer-leader",
        "--to",
        "nobody",
        "--coordinator",
        &every_member,
    ]);
    assert_eq!(code(&output), 5);
    drop(servers);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn dev_with_three_coordinators_runs_the_demo() {
    let dir = temp_dir("dev-three");
    let output = herder(&[
        "dev",
        "--coordinators",
        "3",
        "--demo",
        "--data-dir",
        dir.to_str().expect("utf-8"),
        "--worker-port",
        "127.0.0.1:0",
        "--client-port",
        "127.0.0.1:0",
        "--peer-port",
        "127.0.0.1:0",
    ]);
    assert_eq!(
        code(&output),
        0,
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("All demo jobs COMPLETED"));
    for member in ["c1", "c2", "c3"] {
        assert!(
            dir.join(member).join("herder.sqlite3").is_file(),
            "{member} keeps its data in its own folder"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dev_refuses_a_group_size_it_cannot_run() {
    let output = herder(&["dev", "--coordinators", "2"]);
    assert_eq!(code(&output), 2);
    assert!(String::from_utf8_lossy(&output.stderr).contains("1, 3 or 5 coordinators"));
}
