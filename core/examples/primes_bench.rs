//! Herder's prime arithmetic against plain trial division (the original prime counter's method),
//! one method per process so each can be timed as a whole process, or all of them with
//! in-process timings:
//!
//! ```sh
//! cargo run --release -p herder-core --example primes_bench -- all
//! cargo run --release -p herder-core --example primes_bench -- sieve-range 100000000
//! cargo run --release -p herder-core --example primes_bench -- trial-range 100000000
//! cargo run --release -p herder-core --example primes_bench -- miller-rabin-list 10000
//! cargo run --release -p herder-core --example primes_bench -- trial-list 2000
//! ```
//!
//! Lists are `n` pseudo-random numbers in 10^12..10^18 from a fixed-seed generator, so every run
//! tests the same numbers. Each mode prints its answer, so two methods can be seen to agree.

use std::time::Instant;

use herder_core::dataparallel::primes::{
    is_prime, is_prime_trial_division, primes_in_range, primes_in_range_trial_division,
};

/// splitmix64: a fixed, documented generator, so the list never depends on a library version.
fn numbers(n: usize) -> Vec<i64> {
    let mut state: u64 = 0x5eed_b0b5_0000_0001;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (1_000_000_000_000 + z % 999_000_000_000_000_000) as i64
        })
        .collect()
}

fn run(mode: &str, n: u64) -> Result<String, String> {
    Ok(match mode {
        "sieve-range" => {
            let stats = primes_in_range(1, n as i64, &mut || false).ok_or("stopped")?;
            format!(
                "primes in 1..={n}: {} summing to {}",
                stats.count, stats.sum
            )
        }
        "trial-range" => {
            let stats = primes_in_range_trial_division(1, n as i64);
            format!(
                "primes in 1..={n}: {} summing to {}",
                stats.count, stats.sum
            )
        }
        "miller-rabin-list" => {
            let count = numbers(n as usize)
                .into_iter()
                .filter(|&x| is_prime(x))
                .count();
            format!("{count} primes among {n} numbers in 10^12..10^18")
        }
        "trial-list" => {
            let count = numbers(n as usize)
                .into_iter()
                .filter(|&x| is_prime_trial_division(x))
                .count();
            format!("{count} primes among {n} numbers in 10^12..10^18")
        }
        other => return Err(format!("unknown mode {other:?}")),
    })
}

fn timed(mode: &str, n: u64) -> Result<f64, String> {
    let start = Instant::now();
    let answer = run(mode, n)?;
    let seconds = start.elapsed().as_secs_f64();
    println!("{mode:>18} {n:>12}: {seconds:>9.4} s  {answer}");
    Ok(seconds)
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [all] if all == "all" => {
            for n in [10_000_000, 100_000_000] {
                let fast = timed("sieve-range", n)?;
                let slow = timed("trial-range", n)?;
                println!("{:>31}  trial division / sieve = {:.0}x", "", slow / fast);
            }
            timed("sieve-range", 1_000_000_000)?;
            let fast = timed("miller-rabin-list", 2_000)?;
            let slow = timed("trial-list", 2_000)?;
            println!("{:>31}  trial division / Miller-Rabin = {:.0}x", "", slow / fast);
            timed("miller-rabin-list", 1_000_000)?;
            Ok(())
        }
        [mode, n] => {
            let n: u64 = n.parse().map_err(|_| format!("not a count: {n:?}"))?;
            println!("{}", run(mode, n)?);
            Ok(())
        }
        _ => Err("usage: primes_bench all | MODE N (modes: sieve-range, trial-range, miller-rabin-list, trial-list)".into()),
    }
}
