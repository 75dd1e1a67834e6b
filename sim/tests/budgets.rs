//! A seed that runs away or panics fails on its own, with its number, and the run goes on.
//!
//! Bugs are planted on purpose with the hidden `--sabotage-*` flags, so the failures go
//! through the real budget and panic paths of the world.

use std::process::Command;

use herder_sim::{run_scenario_with, Sabotage, Scenario};

const SIM: &str = env!("CARGO_BIN_EXE_herder-sim");

#[test]
fn a_runaway_and_a_panicking_seed_fail_alone_and_the_run_completes() {
    let out = Command::new(SIM)
        .args([
            "run",
            "--seeds",
            "0..8",
            "--standard",
            "--threads",
            "2",
            "--sabotage-panic",
            "2",
            "--sabotage-runaway",
            "4",
            "--sabotage-flood",
            "5",
        ])
        .output()
        .expect("herder-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n{stderr}");
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed seed fails the run:\n{all}"
    );
    // No panic message escapes a seed: each is reported once, as its seed's failure.
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stdout.contains("FAIL seed 2: panic at sim/src/world/mod.rs:"),
        "{all}"
    );
    assert!(
        stdout.contains("sabotage: a panic planted in seed 2"),
        "{all}"
    );
    assert!(
        stdout.contains("FAIL seed 4: livelock: budget exceeded: steps at one instant"),
        "{all}"
    );
    assert!(
        stdout.contains("FAIL seed 5: livelock: budget exceeded: work in flight"),
        "{all}"
    );
    // The last events come with the failure, as the seed fails.
    assert!(stderr.contains("  last events:\n"), "{stderr}");
    // Every seed ran; only the three planted ones failed.
    assert!(
        stdout.contains("seeds run:              8 of 8 (0..8)"),
        "{all}"
    );
    assert!(stdout.contains("failures:               3\n"), "{all}");
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("FAIL seed "))
        .collect();
    assert_eq!(failed.len(), 3, "{all}");
}

#[test]
fn replay_reports_a_planted_panic_and_exits_with_failure() {
    let out = Command::new(SIM)
        .args([
            "replay",
            "--seed",
            "3",
            "--standard",
            "--sabotage-panic",
            "3",
        ])
        .output()
        .expect("herder-sim runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("result: FAIL: panic at "), "{stdout}");
    assert!(!stdout.contains("NONDETERMINISM"), "{stdout}");
}

#[test]
fn a_livelock_or_a_panic_is_an_outcome_like_any_other() {
    for sabotage in [Sabotage::Panic, Sabotage::Runaway, Sabotage::Flood] {
        let first = run_scenario_with(6, Scenario::standard(6), false, sabotage);
        let traced = run_scenario_with(6, Scenario::standard(6), true, sabotage);
        let failure = first.failure.clone().unwrap_or_default();
        let expected = match sabotage {
            Sabotage::Panic => "panic at ",
            _ => "livelock: budget exceeded: ",
        };
        assert!(failure.starts_with(expected), "{sabotage:?}: {failure}");
        // The same failure, last events included, and the same hash, traced or not.
        assert_eq!(traced.failure.as_deref(), Some(failure.as_str()));
        assert_eq!(first.hash, traced.hash, "{sabotage:?}");
        assert!(failure.contains("\n  last events:\n    "), "{failure}");
    }
    let honest = run_scenario_with(6, Scenario::standard(6), false, Sabotage::None);
    assert_eq!(honest.failure, None);
}
