//! Primality and prime statistics over `i64` ranges, for the PRIME-COUNT and PRIME-SUM jobs.
//!
//! [`is_prime`] answers for any single `i64` with a deterministic Miller–Rabin test;
//! [`primes_in_range`] counts and sums the primes of a range with a segmented sieve in bounded
//! memory, asking its caller between segments whether to stop. The `_trial_division` functions
//! are the slow, obviously correct references the tests and the benchmark compare against.

/// Small primes tried by division before Miller–Rabin, and also its bases: these twelve bases
/// decide every `n < 3.18 * 10^23` (Sorenson and Webster, 2015), which covers all 64-bit values.
const SMALL_PRIMES: [u64; 12] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37];

/// 64-bit words in one sieve segment: 32 KiB, so a segment stays in a typical L1 data cache.
const SEGMENT_WORDS: usize = 4096;

/// Odd numbers one segment covers, one bit each (524,288 integers).
const SEGMENT_ODDS: u64 = SEGMENT_WORDS as u64 * 64;

/// Largest sieving prime. A range ending above its square (2^44, about 1.8 * 10^13) is sieved by
/// the primes up to here and the survivors above 2^44 are confirmed with [`is_prime`], so memory
/// stays bounded (about 3.5 MB of sieving primes and offsets) however large the numbers.
const SIEVE_PRIME_BOUND: u64 = 1 << 22;

/// Number and sum of the primes in a range.
///
/// The sum of all primes below `2^63` is below `2^126`, so `sum` never overflows for stats of a
/// real range; [`PrimeStats::checked_add`] guards the combination of partial results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrimeStats {
    /// How many primes.
    pub count: u64,
    /// Their sum.
    pub sum: u128,
}

impl PrimeStats {
    /// The stats of two disjoint ranges together, or `None` on overflow (which stats of real,
    /// disjoint `i64` ranges never reach).
    pub fn checked_add(self, other: PrimeStats) -> Option<PrimeStats> {
        Some(PrimeStats {
            count: self.count.checked_add(other.count)?,
            sum: self.sum.checked_add(other.sum)?,
        })
    }

    fn add_prime(&mut self, p: u64) {
        self.count += 1;
        self.sum += u128::from(p);
    }
}

/// Whether `n` is prime: `false` below 2, otherwise exact for every `i64`.
///
/// Trial division by the primes up to 37 settles most numbers; the rest get a strong probable
/// prime test to each of those twelve bases, which no 64-bit composite passes. Most composites
/// fail the first base; a prime near 10^18 costs twelve modular exponentiations (microseconds).
pub fn is_prime(n: i64) -> bool {
    // Negative numbers fail `try_from` and are not prime.
    u64::try_from(n).is_ok_and(is_prime_u64)
}

fn is_prime_u64(n: u64) -> bool {
    for p in SMALL_PRIMES {
        if n % p == 0 {
            return n == p;
        }
    }
    if n < 41 * 41 {
        // No prime factor up to 37, so none up to sqrt(n) either (except for 0 and 1).
        return n >= 2;
    }
    let shift = (n - 1).trailing_zeros();
    let odd = (n - 1) >> shift;
    SMALL_PRIMES
        .iter()
        .all(|&base| is_strong_probable_prime(n, base, odd, shift))
}

/// The strong probable prime test to `base` for odd `n = odd * 2^shift + 1 > base`.
fn is_strong_probable_prime(n: u64, base: u64, odd: u64, shift: u32) -> bool {
    let mut x = pow_mod(base, odd, n);
    if x == 1 || x == n - 1 {
        return true;
    }
    for _ in 1..shift {
        x = mul_mod(x, x, n);
        if x == n - 1 {
            return true;
        }
    }
    false
}

fn mul_mod(a: u64, b: u64, modulus: u64) -> u64 {
    // The remainder is below `modulus`, so narrowing back to u64 loses nothing.
    (u128::from(a) * u128::from(b) % u128::from(modulus)) as u64
}

fn pow_mod(mut base: u64, mut exponent: u64, modulus: u64) -> u64 {
    let mut result = 1;
    base %= modulus;
    while exponent > 0 {
        if exponent & 1 == 1 {
            result = mul_mod(result, base, modulus);
        }
        base = mul_mod(base, base, modulus);
        exponent >>= 1;
    }
    result
}

/// Whether `n` is prime, by trying every odd divisor up to `sqrt(n)`: the reference for
/// [`is_prime`]. Up to about 1.5 * 10^9 divisions for `n` near `i64::MAX`.
pub fn is_prime_trial_division(n: i64) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n % 2 == 0 {
        return false;
    }
    let mut d = 3;
    // `d <= n / d` rather than `d * d <= n`, which would overflow near i64::MAX.
    while d <= n / d {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

/// Count and sum of the primes `p` with `start <= p <= end`.
///
/// An empty range (`start > end`) and the negative part of a range hold no primes. Returns
/// `None` as soon as `should_stop` returns `true`; it is called before each segment of 524,288
/// integers, so a worker can cancel a long range cooperatively. A segment is well under a
/// millisecond of work below 2^44 and under a tenth of a second even near `i64::MAX`, where
/// its survivors need confirming.
///
/// Odd numbers only are sieved, one bit each, in 32 KiB segments, by the odd primes up to
/// `min(sqrt(end), 2^22)`. When `sqrt(end)` is larger, the survivors above `2^44` are confirmed
/// with [`is_prime`]. Memory: one segment plus the sieving primes (at most 295,946 of them, with
/// a 2 MB byte sieve to find them), for any range.
pub fn primes_in_range(
    start: i64,
    end: i64,
    should_stop: &mut dyn FnMut() -> bool,
) -> Option<PrimeStats> {
    let mut stats = PrimeStats::default();
    // A negative end leaves no primes; otherwise both bounds are non-negative from here on.
    let (Ok(low), Ok(high)) = (u64::try_from(start.max(2)), u64::try_from(end)) else {
        return Some(stats);
    };
    if low > high {
        return Some(stats);
    }
    if low == 2 {
        stats.add_prime(2);
    }
    // The odd numbers in the range: `first..=last`, both odd. None of this overflows: every
    // value stays below `high + 2^23 < 2^64`.
    let first = low.max(3) | 1;
    let last = if high % 2 == 1 { high } else { high - 1 };
    if first > last {
        return Some(stats);
    }

    let root = high.isqrt();
    let bound = root.min(SIEVE_PRIME_BOUND);
    // Without every prime up to sqrt(high), a survivor above bound^2 may be a product of
    // larger primes.
    let confirm_above = if bound == root {
        u64::MAX
    } else {
        bound * bound
    };
    let primes = odd_primes_up_to(bound);
    // For each sieving prime, its next odd multiple still to cross off. Multiples below p^2
    // have a smaller prime factor and are crossed off by it; p itself must survive.
    let mut next: Vec<u64> = primes
        .iter()
        .map(|&p| {
            let p = u64::from(p);
            let mut multiple = (p * p).max(first.div_ceil(p) * p);
            if multiple % 2 == 0 {
                multiple += p;
            }
            multiple
        })
        .collect();

    let mut segment = vec![0u64; SEGMENT_WORDS];
    let mut base = first; // the odd number bit 0 stands for
    while base <= last {
        if should_stop() {
            return None;
        }
        let len = ((last - base) / 2 + 1).min(SEGMENT_ODDS); // bits in use
        let top = base + 2 * (len - 1);
        segment.fill(0);
        // Only primes whose square is at most `top` have multiples to cross off yet.
        let active = primes.partition_point(|&p| u64::from(p) * u64::from(p) <= top);
        for (&p, next) in primes[..active].iter().zip(next.iter_mut()) {
            // Consecutive odd multiples are 2p apart: p bits.
            let mut bit = (*next - base) / 2;
            while bit < len {
                segment[(bit / 64) as usize] |= 1 << (bit % 64);
                bit += u64::from(p);
            }
            *next = base + 2 * bit;
        }
        for (index, &word) in segment.iter().enumerate().take(len.div_ceil(64) as usize) {
            let used = len - index as u64 * 64;
            let mut open = if used < 64 {
                !word & ((1 << used) - 1)
            } else {
                !word
            };
            while open != 0 {
                let n = base + 2 * (index as u64 * 64 + u64::from(open.trailing_zeros()));
                open &= open - 1;
                if n <= confirm_above || is_prime_u64(n) {
                    stats.add_prime(n);
                }
            }
        }
        base = top + 2;
    }
    Some(stats)
}

/// The odd primes `p <= limit`, by a plain odd-only sieve (`limit` is at most 2^22 here).
fn odd_primes_up_to(limit: u64) -> Vec<u32> {
    let Ok(limit) = usize::try_from(limit) else {
        return Vec::new();
    };
    if limit < 3 {
        return Vec::new();
    }
    // Index i stands for the odd number 2i + 1; index 0 (the number 1) is never reported.
    let last = (limit - 1) / 2;
    let mut composite = vec![false; last + 1];
    let mut primes = Vec::new();
    for i in 1..=last {
        if composite[i] {
            continue;
        }
        let p = 2 * i + 1;
        primes.extend(u32::try_from(p).ok());
        // Start at p * p, index 2i(i + 1); consecutive odd multiples are p indices apart.
        let mut j = 2 * i * (i + 1);
        while j <= last {
            composite[j] = true;
            j += p;
        }
    }
    primes
}

/// [`primes_in_range`] by [`is_prime_trial_division`] on every number: the reference.
pub fn primes_in_range_trial_division(start: i64, end: i64) -> PrimeStats {
    let mut stats = PrimeStats::default();
    // An inclusive range, so `end = i64::MAX` does not overflow.
    for n in start.max(2)..=end {
        if is_prime_trial_division(n) {
            stats.add_prime(n.unsigned_abs());
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stats(start: i64, end: i64) -> PrimeStats {
        primes_in_range(start, end, &mut || false).unwrap()
    }

    /// The reference for large numbers, where trial division is too slow.
    fn stats_by_is_prime(start: i64, end: i64) -> PrimeStats {
        let mut stats = PrimeStats::default();
        for n in start..=end {
            if is_prime(n) {
                stats.add_prime(n.unsigned_abs());
            }
        }
        stats
    }

    #[test]
    fn small_numbers() {
        let primes: Vec<i64> = (-10..60).filter(|&n| is_prime(n)).collect();
        assert_eq!(
            primes,
            [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]
        );
        let reference: Vec<i64> = (-10..60).filter(|&n| is_prime_trial_division(n)).collect();
        assert_eq!(primes, reference);
        assert!(!is_prime(i64::MIN));
        assert!(!is_prime_trial_division(i64::MIN));
        // Across the switch from trial division to Miller–Rabin at 41^2.
        for n in 0..5_000 {
            assert_eq!(is_prime(n), is_prime_trial_division(n), "{n}");
        }
    }

    #[test]
    fn big_primes_and_composites() {
        let primes = [
            2_147_483_647, // 2^31 - 1
            1_000_000_007,
            999_999_999_989,           // largest prime below 10^12
            2_305_843_009_213_693_951, // 2^61 - 1
            9_223_372_036_854_775_783, // 2^63 - 25, the largest prime below 2^63
        ];
        for p in primes {
            assert!(is_prime(p), "{p} is prime");
        }
        let composites = [
            561, // Carmichael numbers
            1_105,
            1_729,
            2_047,                         // strong pseudoprime to base 2
            3_215_031_751,                 // strong pseudoprime to bases 2, 3, 5 and 7
            3_825_123_056_546_413_051,     // strong pseudoprime to every base up to 23
            4_611_686_014_132_420_609,     // (2^31 - 1)^2
            2_147_483_647 * 2_147_483_629, // two large prime factors
            i64::MAX,                      // 7^2 * 73 * 127 * 337 * 92737 * 649657
            9_223_372_036_854_775_781,     // 2^63 - 27
        ];
        for n in composites {
            assert!(!is_prime(n), "{n} is composite");
        }
        // The reference agrees where it is quick enough.
        assert!(is_prime_trial_division(2_147_483_647));
        assert!(!is_prime_trial_division(3_215_031_751));
    }

    #[test]
    fn known_counts_and_sums() {
        assert_eq!(
            stats(0, 100_000),
            PrimeStats {
                count: 9_592,
                sum: 454_396_537
            }
        );
        assert_eq!(
            stats(1, 1_000_000),
            PrimeStats {
                count: 78_498,
                sum: 37_550_402_023
            }
        );
        assert_eq!(stats(i64::MIN, 10_000_000).count, 664_579);
        assert_eq!(stats(2, 2), PrimeStats { count: 1, sum: 2 });
        assert_eq!(stats(3, 4), PrimeStats { count: 1, sum: 3 });
        assert_eq!(stats(i64::MIN, 1), PrimeStats::default());
        assert_eq!(stats(10, 9), PrimeStats::default());
        assert_eq!(stats(i64::MAX, i64::MIN), PrimeStats::default());
    }

    #[test]
    fn the_top_of_the_range() {
        // 2^63 - 25 is the largest prime below 2^63.
        let top_prime = 9_223_372_036_854_775_783;
        assert_eq!(stats(top_prime + 1, i64::MAX), PrimeStats::default());
        assert_eq!(
            stats(top_prime, i64::MAX),
            PrimeStats {
                count: 1,
                sum: top_prime as u128
            }
        );
        assert_eq!(stats(i64::MAX, i64::MAX), PrimeStats::default());
        // More than two segments, all above the sieving bound.
        let start = i64::MAX - 1_100_000;
        assert_eq!(stats(start, i64::MAX), stats_by_is_prime(start, i64::MAX));
    }

    #[test]
    fn around_the_sieving_bound() {
        // Ranges whose square roots lie on either side of 2^22: complete sieve, then sieve plus
        // confirmation.
        let square = (SIEVE_PRIME_BOUND * SIEVE_PRIME_BOUND) as i64;
        for (start, end) in [
            (square - 20_000, square),
            (square - 20_000, square + 20_000),
            // (2^22 + 1)^2 = 2^44 + 2^23 + 1 is where confirmation starts.
            (square + (1 << 23) - 20_000, square + (1 << 23) + 20_000),
            (100_000_000_000_000, 100_000_000_100_000),
        ] {
            assert_eq!(
                stats(start, end),
                stats_by_is_prime(start, end),
                "{start}..={end}"
            );
        }
    }

    #[test]
    fn should_stop_cancels() {
        assert_eq!(primes_in_range(1, 100, &mut || true), None);
        // Four segments; stop before the third.
        let mut calls = 0;
        let result = primes_in_range(0, 4 * 2 * SEGMENT_ODDS as i64, &mut || {
            calls += 1;
            calls == 3
        });
        assert_eq!((result, calls), (None, 3));
        // Never asked to stop: asked once per segment.
        let mut calls = 0;
        let result = primes_in_range(1, 4 * 2 * SEGMENT_ODDS as i64, &mut || {
            calls += 1;
            false
        });
        assert_eq!((result.map(|s| s.count), calls), (Some(155_611), 4));
        // An empty range has no segments and nothing to cancel.
        assert_eq!(
            primes_in_range(-5, 1, &mut || true),
            Some(PrimeStats::default())
        );
    }

    #[test]
    fn checked_add_guards_overflow() {
        let a = PrimeStats { count: 1, sum: 2 };
        let b = PrimeStats { count: 2, sum: 8 };
        assert_eq!(a.checked_add(b), Some(PrimeStats { count: 3, sum: 10 }));
        let full = PrimeStats {
            count: u64::MAX,
            sum: 0,
        };
        assert_eq!(full.checked_add(a), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn is_prime_matches_trial_division(
            small in -1_000i64..2_000_000,
            large in 1_000_000_000i64..1_000_000_000_000,
        ) {
            prop_assert_eq!(is_prime(small), is_prime_trial_division(small));
            prop_assert_eq!(is_prime(large), is_prime_trial_division(large));
        }

        #[test]
        fn short_ranges_match_trial_division(start in -5_000i64..20_000_000, width in 0i64..3_000) {
            let end = start + width - 1;
            prop_assert_eq!(stats(start, end), primes_in_range_trial_division(start, end));
        }

        #[test]
        fn ranges_near_the_top_match_is_prime(from_top in 0i64..5_000_000, width in 0i64..3_000) {
            let end = i64::MAX - from_top;
            let start = end.saturating_sub(width - 1);
            prop_assert_eq!(stats(start, end), stats_by_is_prime(start, end));
        }

        #[test]
        fn split_ranges_add_up(
            start in prop_oneof![-2_000_000i64..2_000_000, i64::MAX - 300_000..=i64::MAX],
            width in 0i64..300_000,
            cut in 0i64..300_000,
        ) {
            let end = start.saturating_add(width);
            // `start..middle` and `middle..=end`; `middle - 1` cannot overflow, `middle + 1` could.
            let middle = start + cut % (end - start + 1);
            let whole = stats(start, end);
            let parts = stats(start, middle - 1).checked_add(stats(middle, end));
            prop_assert_eq!(Some(whole), parts);
        }
    }
}
