//! Settings from a file and the environment, against the real `herder` binary: the precedence
//! flag > environment > file > default as `--print-config` reports it, a mistake in the file
//! named with its line, and the annotated examples in `deploy/` read as they are.

mod common;

use std::process::{Command, Output, Stdio};

use common::{code, temp_dir, HERDER};

fn herder_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(HERDER);
    command
        .args(args)
        .stdin(Stdio::null())
        .env_remove("HERDER_CONFIG");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run herder")
}

/// The `KEY = VALUE  # SOURCE` line `--print-config` printed for `key`.
fn setting<'a>(printed: &'a str, key: &str) -> Option<(&'a str, &'a str)> {
    printed.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(" = ")?;
        let (value, source) = rest.rsplit_once("  # ")?;
        Some((value, source))
    })
}

#[test]
fn a_flag_beats_its_variable_which_beats_the_file_which_beats_the_default() {
    let dir = temp_dir("config-precedence");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("coordinator.toml");
    std::fs::write(
        &file,
        "max-attempts = 7\nmax_active_jobs = 50\nretry-base-millis = 20\nclient-port = \"127.0.0.1:7371\"\n",
    )
    .expect("write");
    let output = herder_env(
        &[
            "coordinator",
            "--config",
            file.to_str().expect("utf-8"),
            "--max-attempts",
            "9",
            "--print-config",
        ],
        &[
            ("HERDER_MAX_ACTIVE_JOBS", "60"),
            ("HERDER_MAX_ATTEMPTS", "8"),
        ],
    );
    assert_eq!(code(&output), 0, "{output:?}");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        setting(&printed, "max-attempts"),
        Some(("9", "flag")),
        "{printed}"
    );
    assert_eq!(
        setting(&printed, "max-active-jobs"),
        Some(("60", "environment"))
    );
    assert_eq!(setting(&printed, "retry-base-millis"), Some(("20", "file")));
    assert_eq!(
        setting(&printed, "client-port"),
        Some(("\"127.0.0.1:7371\"", "file"))
    );
    assert_eq!(
        setting(&printed, "retry-max-millis"),
        Some(("60000", "default"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_mistake_in_the_file_stops_the_process_naming_the_key_and_its_line() {
    let dir = temp_dir("config-mistake");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let file = dir.join("worker.toml");
    std::fs::write(
        &file,
        "# a worker\nid = \"w1\"\ncapacity = 2\nprefech = 4\n",
    )
    .expect("write");
    let output = herder_env(&["worker", "--config", file.to_str().expect("utf-8")], &[]);
    assert_eq!(code(&output), 2, "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("worker.toml:4: unknown setting \"prefech\""),
        "{stderr}"
    );

    // A value clap refuses is refused just as on the command line.
    std::fs::write(&file, "id = \"w1\"\ncapacity = \"many\"\n").expect("write");
    let output = herder_env(&["worker", "--config", file.to_str().expect("utf-8")], &[]);
    assert_eq!(code(&output), 2, "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("many"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_annotated_examples_are_read_as_they_are() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
    for (verb, file, key, expected) in [
        (
            "coordinator",
            "coordinator.toml",
            "client-tokens-file",
            "\"/etc/herder/tokens\"",
        ),
        ("worker", "worker.toml", "capacity", "4"),
    ] {
        let path = format!("{root}/{file}");
        let output = herder_env(&[verb, "--config", &path, "--print-config"], &[]);
        assert_eq!(code(&output), 0, "{file}: {output:?}");
        let printed = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            setting(&printed, key),
            Some((expected, "file")),
            "{file}: {printed}"
        );
    }
}
