//! Balanced contiguous splits of a list or an inclusive `i64` range into partitions.
//!
//! The rule, for `n` items and `P` partitions: `k = min(P, n)` pieces (`P = 0` counts as 1), in
//! order, each of `n / k` items, the first `n % k` of them one item larger. So sizes differ by at
//! most one, no piece is empty, and the same inputs always give the same pieces.

use std::ops::Range;

/// Splits the indices `0..len` into `min(partitions, len)` contiguous pieces (see the module
/// documentation for the rule). `len == 0` gives no pieces.
pub fn split_list(len: usize, partitions: usize) -> Vec<Range<usize>> {
    let pieces = partitions.max(1).min(len);
    if pieces == 0 {
        return Vec::new();
    }
    let (size, larger) = (len / pieces, len % pieces);
    let mut start = 0;
    (0..pieces)
        .map(|piece| {
            let end = start + size + usize::from(piece < larger);
            let range = start..end;
            start = end;
            range
        })
        .collect()
}

/// Splits `start..=end` into `min(partitions, end - start + 1)` contiguous inclusive pieces (see
/// the module documentation for the rule). `start > end` gives no pieces.
///
/// Counts are computed in 128 bits: `i64::MIN..=i64::MAX` has 2^64 items. The result holds one
/// pair per piece, so callers bound `partitions`.
pub fn split_range(start: i64, end: i64, partitions: u64) -> Vec<(i64, i64)> {
    if start > end {
        return Vec::new();
    }
    let items = (i128::from(end) - i128::from(start) + 1).unsigned_abs();
    // At most `partitions`, so the piece count fits u64.
    let pieces = u128::from(partitions.max(1)).min(items) as u64;
    let (size, larger) = (items / u128::from(pieces), items % u128::from(pieces));
    let mut first = i128::from(start);
    (0..pieces)
        .map(|piece| {
            let next = first + (size + u128::from(u128::from(piece) < larger)) as i128;
            // Both ends lie within start..=end, so they fit i64.
            let range = (first as i64, (next - 1) as i64);
            first = next;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lists() {
        assert_eq!(split_list(10, 3), [0..4, 4..7, 7..10]);
        assert_eq!(split_list(9, 3), [0..3, 3..6, 6..9]);
        assert_eq!(split_list(2, 5), [0..1, 1..2]);
        assert_eq!(split_list(7, 0), vec![Range { start: 0, end: 7 }]);
        assert_eq!(split_list(0, 4), Vec::<Range<usize>>::new());
        assert_eq!(split_list(0, 0), Vec::<Range<usize>>::new());
        assert_eq!(
            split_list(usize::MAX, 2),
            [0..usize::MAX / 2 + 1, usize::MAX / 2 + 1..usize::MAX]
        );
    }

    #[test]
    fn ranges() {
        assert_eq!(split_range(1, 10, 3), [(1, 4), (5, 7), (8, 10)]);
        assert_eq!(split_range(-5, -4, 5), [(-5, -5), (-4, -4)]);
        assert_eq!(split_range(3, 3, 0), [(3, 3)]);
        assert_eq!(split_range(4, 3, 2), []);
        assert_eq!(split_range(i64::MAX, i64::MIN, 2), []);
        assert_eq!(split_range(i64::MAX, i64::MAX, 9), [(i64::MAX, i64::MAX)]);
        // 2^64 items: two halves of 2^63.
        assert_eq!(
            split_range(i64::MIN, i64::MAX, 2),
            [(i64::MIN, -1), (0, i64::MAX)]
        );
        // 2^64 = 3 * 6148914691236517205 + 1.
        assert_eq!(
            split_range(i64::MIN, i64::MAX, 3),
            [
                (i64::MIN, -3_074_457_345_618_258_603),
                (-3_074_457_345_618_258_602, 3_074_457_345_618_258_602),
                (3_074_457_345_618_258_603, i64::MAX),
            ]
        );
    }

    /// Checks the rule for `pieces` (as inclusive `(first, last)` in i128) over `start..=end`.
    fn check_pieces(
        pieces: &[(i128, i128)],
        start: i128,
        end: i128,
        partitions: u128,
    ) -> Result<(), TestCaseError> {
        let items = (end - start + 1).max(0);
        prop_assert_eq!(pieces.len() as i128, (partitions.max(1) as i128).min(items));
        let mut expected_first = start;
        let mut previous_size = i128::MAX;
        for &(first, last) in pieces {
            prop_assert_eq!(first, expected_first);
            let size = last - first + 1;
            prop_assert!(size >= 1 && size <= previous_size);
            prop_assert!(size >= items / pieces.len() as i128);
            prop_assert!(size <= items / pieces.len() as i128 + 1);
            previous_size = size;
            expected_first = last + 1;
        }
        if !pieces.is_empty() {
            prop_assert_eq!(expected_first, end + 1);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn lists_are_covered_exactly_once(len in 0usize..10_000, partitions in 0usize..200) {
            let pieces: Vec<(i128, i128)> = split_list(len, partitions)
                .into_iter()
                .map(|r| (r.start as i128, r.end as i128 - 1))
                .collect();
            check_pieces(&pieces, 0, len as i128 - 1, partitions as u128)?;
        }

        #[test]
        fn ranges_are_covered_exactly_once(
            start in prop_oneof![any::<i64>(), -100i64..100, Just(i64::MIN), Just(i64::MAX)],
            end in prop_oneof![any::<i64>(), -100i64..100, Just(i64::MIN), Just(i64::MAX)],
            partitions in prop_oneof![0u64..300, Just(u64::MAX)],
        ) {
            // A huge partition count is only affordable on a short range.
            let partitions = if partitions == u64::MAX && end.abs_diff(start) > 1_000 { 7 } else { partitions };
            let pieces: Vec<(i128, i128)> = split_range(start, end, partitions)
                .into_iter()
                .map(|(first, last)| (i128::from(first), i128::from(last)))
                .collect();
            check_pieces(&pieces, i128::from(start), i128::from(end), u128::from(partitions))?;
        }
    }
}
