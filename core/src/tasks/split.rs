//! Data-parallel tasks: which specs can be cut into partitions, how many items they cover,
//! how [`TaskSpec::split`] cuts them, and how [`aggregate`] combines the partitions' outputs
//! back into the answer the whole spec would have given.

use serde::{Deserialize, Serialize};

use super::{range_span, TaskOutput, TaskSpec};
use crate::dataparallel::{split_list, split_range};

/// How many partitions a data-parallel job asks for: a number, or `"auto"` (one per live
/// worker when the coordinator receives the submission).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value", into = "serde_json::Value")]
pub enum Partitions {
    Auto,
    Count(u32),
}

impl From<Partitions> for serde_json::Value {
    fn from(partitions: Partitions) -> serde_json::Value {
        match partitions {
            Partitions::Auto => serde_json::Value::from("auto"),
            Partitions::Count(n) => serde_json::Value::from(n),
        }
    }
}

impl TryFrom<serde_json::Value> for Partitions {
    type Error = String;

    fn try_from(value: serde_json::Value) -> Result<Partitions, String> {
        if value.as_str() == Some("auto") {
            return Ok(Partitions::Auto);
        }
        value
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Partitions::Count)
            .ok_or_else(|| {
                format!("partitions must be \"auto\" or a positive integer, found {value}")
            })
    }
}

impl std::str::FromStr for Partitions {
    type Err = String;

    fn from_str(raw: &str) -> Result<Partitions, String> {
        if raw == "auto" {
            return Ok(Partitions::Auto);
        }
        raw.parse()
            .map(Partitions::Count)
            .map_err(|_| format!("partitions must be \"auto\" or a positive integer, not {raw:?}"))
    }
}

impl TaskSpec {
    /// True for the data-parallel kinds (`max`, `prime-count-list`, `prime-sum`): a submission
    /// of one becomes a parent job split into partition jobs.
    pub fn is_data_parallel(&self) -> bool {
        matches!(
            self,
            TaskSpec::Max { .. } | TaskSpec::PrimeCountList { .. } | TaskSpec::PrimeSum { .. }
        )
    }

    /// How many items a data-parallel spec splits over (list elements, or range numbers,
    /// saturating); 1 for any other spec.
    pub fn items(&self) -> u64 {
        match self {
            TaskSpec::Max { numbers } | TaskSpec::PrimeCountList { numbers } => {
                numbers.len() as u64
            }
            TaskSpec::PrimeSum { start, end } if start <= end => {
                u64::try_from(range_span(*start, *end)).unwrap_or(u64::MAX)
            }
            TaskSpec::PrimeSum { .. } => 0,
            _ => 1,
        }
    }

    /// Splits a data-parallel spec into `min(partitions, items)` balanced contiguous pieces,
    /// in order (the first pieces take one extra item each when it does not divide evenly).
    /// Every item lands in exactly one piece. Any other spec is one piece: itself.
    pub fn split(&self, partitions: u32) -> Vec<TaskSpec> {
        let partitions = partitions.max(1);
        match self {
            TaskSpec::Max { numbers } => split_list(numbers.len(), partitions as usize)
                .into_iter()
                .map(|r| TaskSpec::Max {
                    numbers: numbers.get(r).unwrap_or_default().to_vec(),
                })
                .collect(),
            TaskSpec::PrimeCountList { numbers } => split_list(numbers.len(), partitions as usize)
                .into_iter()
                .map(|r| TaskSpec::PrimeCountList {
                    numbers: numbers.get(r).unwrap_or_default().to_vec(),
                })
                .collect(),
            TaskSpec::PrimeSum { start, end } => split_range(*start, *end, u64::from(partitions))
                .into_iter()
                .map(|(start, end)| TaskSpec::PrimeSum { start, end })
                .collect(),
            other => vec![other.clone()],
        }
    }
}

/// Combines the outputs of a data-parallel spec's pieces, in partition order, into the output
/// the whole spec would have given: the max of the maxima, the sum of the counts, the sum of the
/// sums (exact in `u128`). `Err` if a piece's output is of the wrong kind, or a `max` has no
/// pieces (a valid `max` always has at least one).
pub fn aggregate(spec: &TaskSpec, pieces: &[&TaskOutput]) -> Result<TaskOutput, String> {
    let wrong = |piece: &TaskOutput| {
        Err(format!(
            "a {} partition reported a {piece:?} result",
            spec.kind()
        ))
    };
    match spec {
        TaskSpec::Max { .. } => {
            let mut best: Option<i64> = None;
            for piece in pieces {
                match piece {
                    TaskOutput::Max { max } => best = Some(best.map_or(*max, |b| b.max(*max))),
                    other => return wrong(other),
                }
            }
            best.map(|max| TaskOutput::Max { max })
                .ok_or_else(|| "max over no partitions".to_string())
        }
        TaskSpec::PrimeCountList { .. } => {
            let mut total: u64 = 0;
            for piece in pieces {
                match piece {
                    TaskOutput::PrimeCountList { count } => total = total.saturating_add(*count),
                    other => return wrong(other),
                }
            }
            Ok(TaskOutput::PrimeCountList { count: total })
        }
        TaskSpec::PrimeSum { .. } => {
            let (mut count, mut sum): (u64, u128) = (0, 0);
            for piece in pieces {
                match piece {
                    TaskOutput::PrimeSum { count: c, sum: s } => {
                        count = count.saturating_add(*c);
                        sum = sum.saturating_add(*s);
                    }
                    other => return wrong(other),
                }
            }
            Ok(TaskOutput::PrimeSum { count, sum })
        }
        other => Err(format!("{} is not a data-parallel task", other.kind())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Attempt;
    use crate::tasks::execute;
    use proptest::prelude::*;

    fn data_parallel_spec() -> impl Strategy<Value = TaskSpec> {
        let numbers = || {
            proptest::collection::vec(
                prop_oneof![any::<i64>(), -50i64..200, Just(2_147_483_647i64)],
                0..60,
            )
        };
        prop_oneof![
            numbers()
                .prop_filter("max needs a number", |n| !n.is_empty())
                .prop_map(|numbers| TaskSpec::Max { numbers }),
            numbers().prop_map(|numbers| TaskSpec::PrimeCountList { numbers }),
            (-2_000i64..20_000, 0i64..5_000).prop_map(|(start, width)| TaskSpec::PrimeSum {
                start,
                end: start + width
            }),
            (0i64..3_000).prop_map(|width| TaskSpec::PrimeSum {
                start: i64::MAX - width,
                end: i64::MAX
            }),
        ]
    }

    proptest! {
        /// Split any valid input any number of ways, run every piece, aggregate: the answer is
        /// the sequential one, and the pieces are `min(P, items)` many.
        #[test]
        fn aggregating_the_pieces_gives_the_sequential_answer(
            spec in data_parallel_spec(),
            partitions in 1u32..12,
        ) {
            let whole = execute(&spec, Attempt(1));
            let pieces = spec.split(partitions);
            prop_assert_eq!(pieces.len() as u64, u64::from(partitions).min(spec.items()));
            let outputs: Vec<TaskOutput> = pieces
                .iter()
                .map(|piece| execute(piece, Attempt(1)))
                .collect::<Result<_, _>>()
                .map_err(|e| TestCaseError::fail(e.message))?;
            let refs: Vec<&TaskOutput> = outputs.iter().collect();
            match aggregate(&spec, &refs) {
                Ok(combined) => prop_assert_eq!(Ok(combined), whole),
                Err(error) => prop_assert!(false, "aggregate failed: {}", error),
            }
        }
    }
}
