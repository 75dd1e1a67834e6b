//! `herder-sim`: run seeds, replay one, check determinism.
//!
//! ```text
//! herder-sim run --seeds A..B [--standard | --standard-group | --leader-crashes | --single] [--check-determinism]
//!                [--strict] [--threads N]
//! herder-sim replay --seed S [--standard | --standard-group | --leader-crashes | --single] [--trace]
//! ```
//!
//! Hidden flags, for both, plant a bug in one seed to show the harness copes:
//! `--sabotage-panic N` (seed N panics), `--sabotage-runaway N` (seed N loops without time
//! moving on), `--sabotage-flood N` (seed N's events multiply). Each such seed must fail with
//! its number while every other seed runs.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use herder_sim::{run_scenario_with, RunReport, Sabotage, Scenario};

const USAGE: &str = "usage:
  herder-sim run --seeds A..B [--standard | --standard-group | --leader-crashes | --single] [--check-determinism]
                 [--strict] [--threads N]
  herder-sim replay --seed S [--standard | --standard-group | --leader-crashes | --single] [--trace]

  (no flag)         each seed draws its own world (swarm), groups of 1, 3 or 5 coordinators
  --standard        the standard scenario: 1 coordinator, 3 workers x 2 slots, 2 clients x 20
                    operations, all faults, 10 simulated seconds
  --standard-group  the standard scenario with a group of 3 coordinators and the faults aimed
                    at consensus (leader crashes, pauses and isolation, splits, a lost disk)
  --leader-crashes  the group of --standard-group with coordinator crashes as the only fault
                    (to measure how long a clean leader crash leaves the group leaderless)
  --single          the seed's own draw, with one coordinator (how seeds found before groups
                    existed replay)
  --strict          findings (bugs that break none of the invariants in docs/SIMULATION.md,
                    e.g. a timer a driver would spin on) fail the seed too";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("replay") => replay(&args[1..]),
        _ => Err(USAGE.to_owned()),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::from(2)
        }
    }
}

fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn parse_seeds(raw: &str) -> Result<(u64, u64), String> {
    let bad = || format!("--seeds wants A..B (end exclusive), got {raw:?}\n{USAGE}");
    let (a, b) = raw.split_once("..").ok_or_else(bad)?;
    let a: u64 = a.parse().map_err(|_| bad())?;
    let b: u64 = b.parse().map_err(|_| bad())?;
    if b < a {
        return Err(bad());
    }
    Ok((a, b))
}

/// Which scenario each seed runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Swarm,
    Standard,
    StandardGroup,
    LeaderCrashes,
    Single,
}

impl Kind {
    fn from_args(args: &[String]) -> Kind {
        let has = |flag: &str| args.iter().any(|a| a == flag);
        if has("--standard-group") {
            Kind::StandardGroup
        } else if has("--leader-crashes") {
            Kind::LeaderCrashes
        } else if has("--standard") {
            Kind::Standard
        } else if has("--single") {
            Kind::Single
        } else {
            Kind::Swarm
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Kind::Swarm => "",
            Kind::Standard => " --standard",
            Kind::StandardGroup => " --standard-group",
            Kind::LeaderCrashes => " --leader-crashes",
            Kind::Single => " --single",
        }
    }
}

/// The seeds given a planted bug on purpose (`--sabotage-panic N` and the like).
#[derive(Clone, Copy, Debug, Default)]
struct Planted {
    panic: Option<u64>,
    runaway: Option<u64>,
    flood: Option<u64>,
}

impl Planted {
    fn from_args(args: &[String]) -> Result<Planted, String> {
        let seed = |flag: &str| -> Result<Option<u64>, String> {
            match value(args, flag) {
                None if args.iter().any(|a| a == flag) => Err(format!("{flag} wants a seed")),
                None => Ok(None),
                Some(raw) => raw
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("bad {flag} {raw:?}")),
            }
        };
        Ok(Planted {
            panic: seed("--sabotage-panic")?,
            runaway: seed("--sabotage-runaway")?,
            flood: seed("--sabotage-flood")?,
        })
    }

    fn for_seed(self, seed: u64) -> Sabotage {
        if self.panic == Some(seed) {
            Sabotage::Panic
        } else if self.runaway == Some(seed) {
            Sabotage::Runaway
        } else if self.flood == Some(seed) {
            Sabotage::Flood
        } else {
            Sabotage::None
        }
    }

    /// The flag that plants the same bug in `seed` again, for its replay command.
    fn flag(self, seed: u64) -> String {
        match self.for_seed(seed) {
            Sabotage::None => String::new(),
            Sabotage::Panic => format!(" --sabotage-panic {seed}"),
            Sabotage::Runaway => format!(" --sabotage-runaway {seed}"),
            Sabotage::Flood => format!(" --sabotage-flood {seed}"),
        }
    }
}

fn replay_command(seed: u64, standard: Kind, planted: Planted) -> String {
    let flag = standard.flag();
    let sabotage = planted.flag(seed);
    format!("cargo run -p herder-sim --release -- replay --seed {seed}{flag}{sabotage} --trace")
}

fn simulate(seed: u64, standard: Kind, trace: bool, planted: Planted) -> RunReport {
    let scenario = match standard {
        Kind::Standard => Scenario::standard(seed),
        Kind::StandardGroup => Scenario::standard_group(seed),
        Kind::LeaderCrashes => Scenario::leader_crashes(seed),
        Kind::Single => Scenario::single(seed),
        Kind::Swarm => Scenario::draw(seed),
    };
    run_scenario_with(seed, scenario, trace, planted.for_seed(seed))
}

/// The most of something any one seed used, and which seed.
#[derive(Default)]
struct Most(u64, u64);

impl Most {
    fn note(&mut self, value: u64, seed: u64) {
        if value > self.0 || (value == self.0 && seed < self.1) {
            *self = Most(value, seed);
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let (start, end) = parse_seeds(value(args, "--seeds").ok_or(USAGE)?)?;
    let determinism = args.iter().any(|a| a == "--check-determinism");
    let standard = Kind::from_args(args);
    let strict = args.iter().any(|a| a == "--strict");
    let planted = Planted::from_args(args)?;
    let with_findings = AtomicU64::new(0);
    let example: Mutex<Option<(u64, String)>> = Mutex::new(None);
    // What each seed reached: how often over all seeds, and in how many seeds.
    let coverage: Mutex<BTreeMap<&'static str, (u64, u64)>> = Mutex::new(BTreeMap::new());
    let threads: u64 = match value(args, "--threads") {
        Some(raw) => raw.parse().map_err(|_| format!("bad --threads {raw:?}"))?,
        None => std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
    };
    let next = AtomicU64::new(start);
    let failures: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let simulated = AtomicU64::new(0);
    let steps = AtomicU64::new(0);
    let slowest_call = Mutex::new((0u64, 0u64));
    // The most any one seed used of each budget, to judge the budgets by.
    let most: Mutex<[Most; 3]> = Mutex::new(Default::default());
    let failovers: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let done = AtomicU64::new(0);
    let total = end - start;
    let wall = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    break;
                }
                let report = simulate(seed, standard, false, planted);
                // Only honest seeds: one that failed may have stopped early or at a budget.
                if report.failure.is_none() {
                    let mut most = most.lock().expect("lock");
                    most[0].note(report.steps, seed);
                    most[1].note(report.peak_instant_steps, seed);
                    most[2].note(report.peak_in_flight as u64, seed);
                }
                simulated.fetch_add(report.simulated_us, Ordering::Relaxed);
                steps.fetch_add(report.steps, Ordering::Relaxed);
                failovers.lock().expect("lock").extend(&report.failovers_us);
                {
                    let mut slowest = slowest_call.lock().expect("lock");
                    if report.slowest_call_us > slowest.0 {
                        *slowest = (report.slowest_call_us, seed);
                    }
                }
                let mut failure = report.failure.clone();
                {
                    let mut coverage = coverage.lock().expect("lock");
                    for (what, n) in &report.coverage {
                        let (times, seeds) = coverage.entry(what).or_default();
                        *times += n;
                        *seeds += 1;
                    }
                }
                if let Some(first) = report.findings.first() {
                    with_findings.fetch_add(1, Ordering::Relaxed);
                    let mut example = example.lock().expect("lock");
                    if example.as_ref().is_none_or(|(s, _)| *s > seed) {
                        *example = Some((seed, first.clone()));
                    }
                    if strict && failure.is_none() {
                        failure = Some(format!("finding: {first}"));
                    }
                }
                if failure.is_none() && determinism {
                    let again: RunReport = simulate(seed, standard, false, planted);
                    if again.hash != report.hash {
                        failure = Some(format!(
                            "nondeterminism: trace hash {:#018x} then {:#018x}",
                            report.hash, again.hash
                        ));
                    }
                }
                if let Some(failure) = failure {
                    eprintln!(
                        "FAIL seed {seed}: {failure}\n  replay: {}",
                        replay_command(seed, standard, planted)
                    );
                    failures.lock().expect("lock").push((seed, failure));
                }
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                if finished % 1_000 == 0 {
                    eprintln!(
                        "progress: {finished}/{total} seeds, {:.1} s",
                        wall.elapsed().as_secs_f64()
                    );
                }
            });
        }
    });
    let elapsed = wall.elapsed().as_secs_f64().max(1e-9);
    let mut failures = failures.into_inner().expect("lock");
    failures.sort();
    let simulated_s = simulated.load(Ordering::Relaxed) as f64 / 1e6;
    let scenario = match standard {
        Kind::Standard => "standard (1 coordinator)",
        Kind::StandardGroup => "standard group (3 coordinators)",
        Kind::LeaderCrashes => "leader crashes (3 coordinators, no other fault)",
        Kind::Single => "swarm, one coordinator",
        Kind::Swarm => "swarm (each seed draws its own)",
    };
    println!("scenario:               {scenario}");
    // Counted as each seed ends: a seed that never ended would show here.
    let ran = done.load(Ordering::Relaxed);
    println!("seeds run:              {ran} of {total} ({start}..{end}), {threads} threads");
    println!("failures:               {}", failures.len());
    println!("wall time:              {elapsed:.2} s");
    println!("schedules per second:   {:.1}", total as f64 / elapsed);
    println!(
        "steps per second:       {:.0}",
        steps.load(Ordering::Relaxed) as f64 / elapsed
    );
    println!(
        "simulated/wall ratio:   {:.1} ({simulated_s:.0} simulated s)",
        simulated_s / elapsed
    );
    let (slowest_us, slowest_seed) = slowest_call.into_inner().expect("lock");
    println!(
        "slowest call after faults stopped: {:.3} s (seed {slowest_seed})",
        slowest_us as f64 / 1e6
    );
    let [steps_most, instant_most, in_flight_most] = most.into_inner().expect("lock");
    println!(
        "most used by one seed:  {} steps (seed {}), {} steps at one instant (seed {}), {} in flight at once (seed {})",
        steps_most.0, steps_most.1, instant_most.0, instant_most.1, in_flight_most.0, in_flight_most.1
    );
    let mut failovers = failovers.into_inner().expect("lock");
    if !failovers.is_empty() {
        failovers.sort_unstable();
        let at = |q: f64| {
            let i = ((failovers.len() - 1) as f64 * q).round() as usize;
            failovers[i] as f64 / 1e3
        };
        println!(
            "leader crash, every member up -> a leader again: {} failovers, median {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            failovers.len(),
            at(0.5),
            at(0.9),
            at(0.99),
            at(1.0)
        );
    }
    if determinism {
        println!("determinism:            every passing seed replayed twice with equal hashes");
    }
    println!("reached (times summed over the seeds, and the share of seeds that reached it):");
    for (what, (n, seeds)) in coverage.into_inner().expect("lock") {
        let share = 100.0 * seeds as f64 / total.max(1) as f64;
        println!("  {n:>10}  {share:>5.1}%  {what}");
    }
    println!(
        "seeds with findings:    {}",
        with_findings.load(Ordering::Relaxed)
    );
    if let Some((seed, finding)) = example.into_inner().expect("lock") {
        println!("  first: seed {seed}: {finding}");
        println!("  replay: {}", replay_command(seed, standard, planted));
    }
    for (seed, failure) in &failures {
        // The first line only: a livelock's or a panic's last events were shown as it failed.
        let headline = failure.lines().next().unwrap_or_default();
        println!("FAIL seed {seed}: {headline}");
        println!("  replay: {}", replay_command(*seed, standard, planted));
    }
    Ok(if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn replay(args: &[String]) -> Result<ExitCode, String> {
    let raw = value(args, "--seed").ok_or(USAGE)?;
    let seed: u64 = raw.parse().map_err(|_| format!("bad --seed {raw:?}"))?;
    let trace = args.iter().any(|a| a == "--trace");
    let standard = Kind::from_args(args);
    let planted = Planted::from_args(args)?;
    let report = simulate(seed, standard, trace, planted);
    for line in &report.trace {
        println!("{line}");
    }
    let again = simulate(seed, standard, false, planted);
    println!(
        "seed {seed}: {} steps, {:.3} simulated s, {} assignments, {} completions, {} acknowledged jobs",
        report.steps,
        report.simulated_us as f64 / 1e6,
        report.assignments,
        report.completions,
        report.acknowledged
    );
    println!("trace hash {:#018x}", report.hash);
    for finding in &report.findings {
        println!("finding: {finding}");
    }
    if again.hash != report.hash {
        println!(
            "NONDETERMINISM: a second run gave trace hash {:#018x}",
            again.hash
        );
        return Ok(ExitCode::FAILURE);
    }
    match report.failure {
        None => {
            println!("result: ok");
            Ok(ExitCode::SUCCESS)
        }
        Some(failure) => {
            println!("result: FAIL: {failure}");
            Ok(ExitCode::FAILURE)
        }
    }
}
