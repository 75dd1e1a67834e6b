use super::*;
use crate::limits::{ATTEMPTS_MAX, PRIME_COUNT_LIMIT_MAX, SLEEP_MILLIS_MAX};
use proptest::prelude::*;
use serde_json::json;
use std::sync::OnceLock;

// ---- sha256 ----

#[test]
fn sha256_known_vectors() {
    assert_eq!(
        sha256_hex(""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
    let output = execute(&TaskSpec::Sha256 { text: "abc".into() }, Attempt(1));
    assert_eq!(
        output,
        Ok(TaskOutput::Sha256 {
            hex: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into()
        })
    );
}

#[test]
fn sha256_hashes_utf8_bytes() {
    assert_eq!(
        sha256_hex("The quick brown fox jumps over the lazy dog"),
        "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592"
    );
    // "é" is the two UTF-8 bytes c3 a9.
    let expected: String = Sha256::digest([0xc3u8, 0xa9])
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(sha256_hex("é"), expected);
    assert_ne!(sha256_hex("é"), sha256_hex("e\u{301}"));
}

// ---- word count ----

#[test]
fn word_counts() {
    assert_eq!(count_words(""), 0);
    assert_eq!(count_words("   \t\n "), 0);
    assert_eq!(count_words("a b"), 2);
    assert_eq!(count_words("  hello,   world!  "), 2);
    assert_eq!(count_words("one\ttwo\nthree\r\nfour"), 4);
    // No-break space, em space, ideographic space, line separator are Unicode whitespace.
    assert_eq!(count_words("a\u{a0}b\u{2003}c\u{3000}d\u{2028}e"), 5);
    // A zero-width space is not whitespace, so it does not split words.
    assert_eq!(count_words("a\u{200b}b"), 1);
    assert_eq!(count_words("héllo wörld 日本語"), 3);
    assert_eq!(
        execute(
            &TaskSpec::WordCount {
                text: "the quick  brown".into()
            },
            Attempt(1)
        ),
        Ok(TaskOutput::WordCount { words: 3 })
    );
}

proptest! {
    #[test]
    fn word_count_matches_a_simple_scan(text in "[a b\t\u{a0}\u{3000}\u{200b}é]{0,40}") {
        let mut words = 0u64;
        let mut in_word = false;
        for c in text.chars() {
            if c.is_whitespace() {
                in_word = false;
            } else if !in_word {
                in_word = true;
                words += 1;
            }
        }
        prop_assert_eq!(count_words(&text), words);
    }
}

// ---- primes ----

fn is_prime_naive(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n % d == 0 {
            return false;
        }
        d += 1;
    }
    true
}

/// Odd numbers covered by one segment of the range sieve (32 KiB, one bit each).
const SEGMENT_BITS: u64 = 4096 * 64;

/// Prefix counts of primes for 0..=REFERENCE_MAX by a plain sieve over all integers.
const REFERENCE_MAX: usize = 2_000_000;
fn reference_counts() -> &'static [u32] {
    static COUNTS: OnceLock<Vec<u32>> = OnceLock::new();
    COUNTS.get_or_init(|| {
        let mut prime = vec![true; REFERENCE_MAX + 1];
        prime[0] = false;
        prime[1] = false;
        let mut n = 2;
        while n * n <= REFERENCE_MAX {
            if prime[n] {
                let mut m = n * n;
                while m <= REFERENCE_MAX {
                    prime[m] = false;
                    m += n;
                }
            }
            n += 1;
        }
        let mut running = 0u32;
        prime
            .iter()
            .map(|&p| {
                running += u32::from(p);
                running
            })
            .collect()
    })
}

#[test]
fn prime_counts_known_values() {
    let known = [
        (0, 0),
        (1, 0),
        (2, 1),
        (3, 2),
        (4, 2),
        (10, 4),
        (100, 25),
        (1_000, 168),
        (10_000, 1_229),
        (100_000, 9_592),
        (1_000_000, 78_498),
        (10_000_000, 664_579),
    ];
    for (limit, count) in known {
        assert_eq!(count_primes_up_to(limit), count, "limit {limit}");
    }
}

#[test]
fn prime_counts_match_naive_for_every_small_limit() {
    let mut expected = 0;
    for limit in 0..=5_000u64 {
        if is_prime_naive(limit) {
            expected += 1;
        }
        assert_eq!(count_primes_up_to(limit), expected, "limit {limit}");
    }
}

#[test]
fn prime_counts_at_segment_boundaries() {
    let counts = reference_counts();
    // The segment covers odd indexes [k * SEGMENT_BITS, (k + 1) * SEGMENT_BITS), i.e. numbers
    // up to 2 * (k + 1) * SEGMENT_BITS - 1.
    for k in 1..=3u64 {
        let edge = 2 * k * SEGMENT_BITS;
        for limit in edge - 70..=edge + 70 {
            assert_eq!(
                count_primes_up_to(limit),
                u64::from(counts[limit as usize]),
                "limit {limit}"
            );
        }
    }
}

#[test]
fn prime_count_task_output() {
    assert_eq!(
        execute(&TaskSpec::PrimeCount { limit: 100_000 }, Attempt(1)),
        Ok(TaskOutput::PrimeCount {
            limit: 100_000,
            count: 9_592
        })
    );
}

proptest! {
    #[test]
    fn prime_counts_match_reference_sieve(limit in 0..=REFERENCE_MAX as u64) {
        prop_assert_eq!(
            count_primes_up_to(limit),
            u64::from(reference_counts()[limit as usize])
        );
    }

    #[test]
    fn prime_counts_match_reference_sieve_near_segment_ends(
        segments in 1..=3u64,
        offset in 0..2_000u64,
    ) {
        // A final segment only a few bits long is where crossing-off bookkeeping goes wrong.
        let limit = 2 * segments * SEGMENT_BITS + offset - 1_000;
        prop_assert_eq!(
            count_primes_up_to(limit),
            u64::from(reference_counts()[limit as usize])
        );
    }
}

// ---- fail ----

#[test]
fn fail_fails_before_the_threshold_and_succeeds_from_it() {
    let spec = TaskSpec::Fail {
        fail_until_attempt: 3,
    };
    for attempt in 1..3 {
        let failure = execute(&spec, Attempt(attempt)).unwrap_err();
        assert_eq!(
            failure.message,
            format!("deliberate failure on attempt {attempt} of fail-until-attempt 3")
        );
    }
    assert_eq!(
        execute(&spec, Attempt(3)),
        Ok(TaskOutput::Succeeded { attempt: 3 })
    );
    assert_eq!(
        execute(&spec, Attempt(4)),
        Ok(TaskOutput::Succeeded { attempt: 4 })
    );
    let once = TaskSpec::Fail {
        fail_until_attempt: 1,
    };
    assert_eq!(
        execute(&once, Attempt(1)),
        Ok(TaskOutput::Succeeded { attempt: 1 })
    );
    assert_eq!(spec.plan(Attempt(1)), TaskPlan::Inline);
}

proptest! {
    #[test]
    fn fail_succeeds_exactly_from_the_threshold(
        until in 1..=ATTEMPTS_MAX,
        attempt in 1..=ATTEMPTS_MAX + 5,
    ) {
        let result = execute(&TaskSpec::Fail { fail_until_attempt: until }, Attempt(attempt));
        prop_assert_eq!(result.is_ok(), attempt >= until);
        if let Ok(output) = result {
            prop_assert_eq!(output, TaskOutput::Succeeded { attempt });
        }
    }
}

// ---- sleep and planning ----

#[test]
fn sleep_plans_a_wait_and_executes_without_one() {
    let spec = TaskSpec::Sleep {
        milliseconds: 20_000,
    };
    assert_eq!(
        spec.plan(Attempt(1)),
        TaskPlan::Sleep {
            duration: Duration::from_secs(20),
            then: Ok(TaskOutput::Slept {
                milliseconds: 20_000
            }),
        }
    );
    assert_eq!(
        execute(&spec, Attempt(2)),
        Ok(TaskOutput::Slept {
            milliseconds: 20_000
        })
    );
    assert_eq!(
        TaskSpec::WordCount { text: "x".into() }.plan(Attempt(1)),
        TaskPlan::Inline
    );
    let big_text = "x".repeat(INLINE_TEXT_BYTES_MAX + 1);
    assert_eq!(
        TaskSpec::Sha256 { text: big_text }.plan(Attempt(1)),
        TaskPlan::Compute
    );
    assert_eq!(
        TaskSpec::PrimeCount {
            limit: INLINE_PRIME_LIMIT_MAX + 1
        }
        .plan(Attempt(1)),
        TaskPlan::Compute
    );
    // Few numbers, but large ones are not cheap: they go to the blocking pool.
    let far = i64::MAX - 1_000;
    assert_eq!(
        TaskSpec::PrimeSum {
            start: far,
            end: far + 100
        }
        .plan(Attempt(1)),
        TaskPlan::Compute
    );
    assert_eq!(
        TaskSpec::PrimeSum {
            start: 2,
            end: 1_000
        }
        .plan(Attempt(1)),
        TaskPlan::Inline
    );
    assert_eq!(
        TaskSpec::PrimeCountList {
            numbers: vec![7, far]
        }
        .plan(Attempt(1)),
        TaskPlan::Compute
    );
    assert_eq!(
        TaskSpec::PrimeCountList {
            numbers: vec![7, 11, -3]
        }
        .plan(Attempt(1)),
        TaskPlan::Inline
    );
}

#[test]
fn invalid_specs_are_not_run() {
    let too_long = TaskSpec::Sleep {
        milliseconds: SLEEP_MILLIS_MAX + 1,
    };
    assert_eq!(too_long.plan(Attempt(1)), TaskPlan::Compute);
    let failure = execute(&too_long, Attempt(1)).unwrap_err();
    assert!(failure.message.starts_with("invalid task: "), "{failure}");
    let too_big = TaskSpec::PrimeCount {
        limit: PRIME_COUNT_LIMIT_MAX + 1,
    };
    assert!(execute(&too_big, Attempt(1)).is_err());
    let zero = TaskSpec::Fail {
        fail_until_attempt: 0,
    };
    assert!(execute(&zero, Attempt(1)).is_err());
}

// ---- output text ----

#[test]
fn outputs_display_as_human_text() {
    let cases = [
        (
            TaskOutput::Slept {
                milliseconds: 20_000,
            },
            "slept 20000 ms",
        ),
        (TaskOutput::WordCount { words: 3 }, "3 words"),
        (TaskOutput::WordCount { words: 1 }, "1 word"),
        (TaskOutput::WordCount { words: 0 }, "0 words"),
        (
            TaskOutput::Sha256 {
                hex: sha256_hex("abc"),
            },
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
        (
            TaskOutput::PrimeCount {
                limit: 100_000,
                count: 9_592,
            },
            "9592 primes <= 100000",
        ),
        (
            TaskOutput::PrimeCount { limit: 2, count: 1 },
            "1 prime <= 2",
        ),
        (
            TaskOutput::Succeeded { attempt: 3 },
            "succeeded on attempt 3",
        ),
    ];
    for (output, text) in cases {
        assert_eq!(output.to_string(), text);
    }
}

#[test]
fn outputs_have_tagged_wire_form() {
    let cases = [
        (
            TaskOutput::Slept { milliseconds: 5 },
            json!({"kind":"slept","milliseconds":5}),
        ),
        (
            TaskOutput::WordCount { words: 2 },
            json!({"kind":"word-count","words":2}),
        ),
        (
            TaskOutput::Sha256 { hex: "ab".into() },
            json!({"kind":"sha256","hex":"ab"}),
        ),
        (
            TaskOutput::PrimeCount {
                limit: 10,
                count: 4,
            },
            json!({"kind":"prime-count","limit":10,"count":4}),
        ),
        (
            TaskOutput::Succeeded { attempt: 3 },
            json!({"kind":"succeeded","attempt":3}),
        ),
    ];
    for (output, wire) in cases {
        assert_eq!(serde_json::to_value(&output).unwrap(), wire);
        assert_eq!(serde_json::from_value::<TaskOutput>(wire).unwrap(), output);
    }
    let failure = TaskFailure::new("boom");
    assert_eq!(failure.to_string(), "boom");
    assert_eq!(
        serde_json::to_value(&failure).unwrap(),
        json!({"message":"boom"})
    );
}

// ---- data-parallel kinds ----

#[test]
fn data_parallel_known_answers() {
    let run = |spec: TaskSpec| execute(&spec, Attempt(1));
    assert_eq!(
        run(TaskSpec::PrimeSum {
            start: 1,
            end: 100_000
        }),
        Ok(TaskOutput::PrimeSum {
            count: 9_592,
            sum: 454_396_537
        })
    );
    assert_eq!(
        run(TaskSpec::Max {
            numbers: vec![2, 4, 5, 11, -3]
        }),
        Ok(TaskOutput::Max { max: 11 })
    );
    assert_eq!(
        run(TaskSpec::PrimeCountList {
            numbers: vec![2, 4, 5, 11, -3, 1, 0]
        }),
        Ok(TaskOutput::PrimeCountList { count: 3 })
    );
}

#[test]
fn a_prime_sum_output_carries_its_sum_as_a_decimal_string() {
    let output = TaskOutput::PrimeSum {
        count: 1,
        sum: u128::from(u64::MAX) + 1,
    };
    let json = serde_json::to_value(&output).unwrap();
    assert_eq!(
        json,
        json!({"kind":"prime-sum","count":1,"sum":"18446744073709551616"})
    );
    assert_eq!(serde_json::from_value::<TaskOutput>(json).unwrap(), output);
    for bad in [json!(12), json!("-1"), json!("1e3"), json!("")] {
        let value = json!({"kind":"prime-sum","count":1,"sum":bad});
        assert!(serde_json::from_value::<TaskOutput>(value).is_err());
    }
}
