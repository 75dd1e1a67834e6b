//! Credentials from the command line, against real processes on loopback: a port open beyond
//! the machine must check who connects, credential files are checked at start, and each
//! client verb presents its token and is held to its role.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{code, herder_within, start_announcing, stdout_json, temp_dir, Server, HERDER};

const WORKER_SECRET: &str = "worker-secret-for-cli-tests-0123456789";
const SUBMITTER: &str = "submitter-token-for-cli-tests-0123";
const READER: &str = "reader-token-for-cli-tests-01234567";

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a credential file");
    path.to_str().expect("utf-8").to_owned()
}

/// A fresh folder for a test, and the data folder inside it (not created).
fn scratch(name: &str) -> (std::path::PathBuf, String) {
    let dir = temp_dir(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let data = dir.join("data").to_str().expect("utf-8").to_owned();
    (dir, data)
}

fn coordinator_args<'a>(dir: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "coordinator",
        "--data-dir",
        dir,
        "--client-port",
        "127.0.0.1:0",
        "--http-port",
        "off",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn a_port_beyond_loopback_without_its_credential_refuses_to_start() {
    let (dir, data) = scratch("auth-exposed");
    let data = data.as_str();
    let output = herder_within(
        &coordinator_args(data, &["--worker-port", "0.0.0.0:0"]),
        Duration::from_secs(20),
    );
    assert_eq!(code(&output), 2, "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--worker-secret-file"), "{stderr}");
    assert!(
        !data_dir_used(data),
        "nothing was written before the refusal"
    );

    // With the credential it starts; with --insecure-no-auth it starts and says so.
    let secret = write(&dir, "worker.secret", WORKER_SECRET);
    for extra in [
        vec![
            "--worker-port",
            "0.0.0.0:0",
            "--worker-secret-file",
            &secret,
        ],
        vec!["--worker-port", "0.0.0.0:0", "--insecure-no-auth"],
    ] {
        let (child, _) = start_announcing(&coordinator_args(data, &extra), &["client_addr="]);
        drop(Server {
            child,
            client_addr: String::new(),
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn data_dir_used(path: &str) -> bool {
    Path::new(path).exists()
}

#[test]
fn a_bad_credential_file_is_refused_at_start_naming_its_line() {
    let (dir, data) = scratch("auth-bad-files");
    let data = data.as_str();
    let tokens = write(
        &dir,
        "tokens",
        &format!("# ops\nci submitter {SUBMITTER}\nshort reader tooshort\n"),
    );
    let secret = write(&dir, "short.secret", "tiny\n");
    for (extra, expected) in [
        (vec!["--client-tokens-file", tokens.as_str()], "line 3"),
        (vec!["--worker-secret-file", secret.as_str()], "at least 24"),
        (
            vec!["--peer-secret-file", "/nonexistent/peer.secret"],
            "/nonexistent/peer.secret",
        ),
    ] {
        let output = herder_within(&coordinator_args(data, &extra), Duration::from_secs(20));
        assert_eq!(code(&output), 2, "{extra:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `herder ARGS --json` with `HERDER_TOKEN` set to `token` (if any), killed (failing the
/// test) if it has not exited within 30 s.
fn client(args: &[&str], token: Option<&str>) -> Output {
    let mut command = Command::new(HERDER);
    command.args(args).arg("--json").env_remove("HERDER_TOKEN");
    if let Some(token) = token {
        command.env("HERDER_TOKEN", token);
    }
    common::cluster::run_bounded(command, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("herder {args:?} did not exit within 30 s"))
}

#[test]
fn each_client_verb_presents_its_token_and_is_held_to_its_role() {
    let (dir, data) = scratch("auth-verbs");
    let data = data.as_str();
    let tokens = write(
        &dir,
        "tokens",
        &format!("ci submitter {SUBMITTER}\ndash reader {READER}\n"),
    );
    let secret = write(&dir, "worker.secret", WORKER_SECRET);
    let submitter_file = write(&dir, "submitter.token", &format!("{SUBMITTER}\n"));
    let (coordinator, addresses) = start_announcing(
        &coordinator_args(
            data,
            &[
                "--worker-port",
                "127.0.0.1:0",
                "--client-tokens-file",
                &tokens,
                "--worker-secret-file",
                &secret,
            ],
        ),
        &["worker_addr=", "client_addr="],
    );
    let _coordinator = Server {
        child: coordinator,
        client_addr: addresses[1].clone(),
    };
    let worker = Command::new(HERDER)
        .args([
            "worker",
            "--id",
            "w1",
            "--coordinator",
            &addresses[0],
            "--worker-secret-file",
            &secret,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker");
    let _worker = Server {
        child: worker,
        client_addr: String::new(),
    };
    let at = ["--coordinator", addresses[1].as_str()];

    // No token: refused, typed.
    let output = client(&[&["workers"][..], &at].concat(), None);
    assert_eq!(
        stdout_json(&output)["error"]["code"],
        "UNAUTHENTICATED",
        "{output:?}"
    );

    // A submitter's token from a file submits and waits.
    let args = [
        &[
            "submit",
            "sha256",
            "--text",
            "abc",
            "--wait",
            "--token-file",
            &submitter_file,
        ][..],
        &at,
    ]
    .concat();
    let output = client(&args, None);
    assert_eq!(code(&output), 0, "{output:?}");
    assert_eq!(
        stdout_json(&output)["job"]["state"],
        "COMPLETED",
        "{output:?}"
    );

    // A reader's token from the environment reads, and may not submit.
    let output = client(&[&["list"][..], &at].concat(), Some(READER));
    assert_eq!(code(&output), 0, "{output:?}");
    let output = client(
        &[&["submit", "sha256", "--text", "x"][..], &at].concat(),
        Some(READER),
    );
    assert_ne!(code(&output), 0, "{output:?}");
    assert_eq!(
        stdout_json(&output)["error"]["code"],
        "FORBIDDEN",
        "{output:?}"
    );
    let output = client(&[&["list"][..], &at].concat(), Some(READER));
    assert_eq!(
        stdout_json(&output)["jobs"].as_array().map(Vec::len),
        Some(1),
        "the refused submission created nothing: {output:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_token_added_to_the_file_works_after_sighup() {
    let (dir, data) = scratch("auth-reload");
    let tokens = write(&dir, "tokens", &format!("dash reader {READER}\n"));
    let (coordinator, addresses) = start_announcing(
        &coordinator_args(
            &data,
            &[
                "--worker-port",
                "127.0.0.1:0",
                "--client-tokens-file",
                &tokens,
            ],
        ),
        &["client_addr="],
    );
    let pid = coordinator.id().to_string();
    let _coordinator = Server {
        child: coordinator,
        client_addr: addresses[0].clone(),
    };
    let at = ["--coordinator", addresses[0].as_str()];
    let workers = [&["workers"][..], &at].concat();
    let refused = client(&workers, Some(SUBMITTER));
    assert_eq!(
        stdout_json(&refused)["error"]["code"],
        "UNAUTHENTICATED",
        "{refused:?}"
    );

    let hang_up = || {
        let status = Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -HUP {pid}");
    };
    std::fs::write(
        &tokens,
        format!("dash reader {READER}\nci submitter {SUBMITTER}\n"),
    )
    .expect("write");
    hang_up();
    // The reload is asynchronous: bounded polling until the new token is taken.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let output = client(&workers, Some(SUBMITTER));
        if code(&output) == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the token added before SIGHUP was never accepted: {output:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The token that stayed in the file still works; one never in it still does not.
    assert_eq!(code(&client(&workers, Some(READER))), 0);
    let stranger = client(&workers, Some("never-in-the-file-0123456789abcdef"));
    assert_eq!(stdout_json(&stranger)["error"]["code"], "UNAUTHENTICATED");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A throwaway CA and a certificate for 127.0.0.1 in `dir`: (CA, certificate, key) paths.
fn gen_certs(dir: &Path) -> (String, String, String) {
    let out = dir.to_str().expect("utf-8");
    let generated = herder_within(
        &["gen-certs", "--out", out, "--host", "127.0.0.1"],
        Duration::from_secs(30),
    );
    assert_eq!(code(&generated), 0, "{generated:?}");
    let file = |name: &str| dir.join(name).to_str().expect("utf-8").to_owned();
    (file("ca.pem"), file("node.pem"), file("node-key.pem"))
}

#[test]
fn tls_from_the_command_line_encrypts_every_verb_and_reloads_on_sighup() {
    let (dir, data) = scratch("auth-tls");
    let (ca, cert, key) = gen_certs(&dir.join("tls"));
    let tokens = write(&dir, "tokens", &format!("ci submitter {SUBMITTER}\n"));
    let secret = write(&dir, "worker.secret", WORKER_SECRET);
    let (coordinator, addresses) = start_announcing(
        &coordinator_args(
            &data,
            &[
                "--worker-port",
                "127.0.0.1:0",
                "--client-tokens-file",
                &tokens,
                "--worker-secret-file",
                &secret,
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
            ],
        ),
        &["worker_addr=", "client_addr="],
    );
    let pid = coordinator.id().to_string();
    let _coordinator = Server {
        child: coordinator,
        client_addr: addresses[1].clone(),
    };
    let worker = Command::new(HERDER)
        .args(["worker", "--id", "w1", "--coordinator", &addresses[0]])
        .args(["--worker-secret-file", &secret, "--tls-ca", &ca])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a worker");
    let _worker = Server {
        child: worker,
        client_addr: String::new(),
    };
    let at = ["--coordinator", addresses[1].as_str()];
    fn trusting<'a>(ca: &'a str, verb: &[&'a str], at: &[&'a str]) -> Vec<&'a str> {
        [verb, at, &["--tls-ca", ca][..]].concat()
    }

    let output = client(
        &trusting(&ca, &["submit", "sha256", "--text", "abc", "--wait"], &at),
        Some(SUBMITTER),
    );
    assert_eq!(code(&output), 0, "{output:?}");
    assert_eq!(stdout_json(&output)["job"]["state"], "COMPLETED");

    // Without TLS the client is told what the port wants.
    let output = client(&[&["workers"][..], &at].concat(), Some(SUBMITTER));
    let error = &stdout_json(&output)["error"];
    assert_eq!(error["code"], "UNAUTHENTICATED", "{output:?}");
    assert!(
        error["message"].as_str().unwrap_or("").contains("TLS"),
        "{output:?}"
    );

    // New certificates from a new CA, swapped in place and taken on SIGHUP.
    let (new_ca, next_cert, next_key) = gen_certs(&dir.join("next"));
    std::fs::copy(&next_cert, &cert).expect("swap the certificate");
    std::fs::copy(&next_key, &key).expect("swap the key");
    let status = Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -HUP {pid}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let output = client(&trusting(&new_ca, &["workers"], &at), Some(SUBMITTER));
        if code(&output) == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new certificate was never served: {output:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let stale = client(&trusting(&ca, &["workers"], &at), Some(SUBMITTER));
    assert_eq!(
        stdout_json(&stale)["error"]["code"],
        "UNAUTHENTICATED",
        "{stale:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
