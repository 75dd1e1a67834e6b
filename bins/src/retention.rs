//! Spellings of durations and of the retention policy on the command line.

use std::time::Duration;

use herder_core::coordinator::Retention;

/// A duration as people write it: a whole number and a unit (`500ms`, `30s`, `15m`, `12h`,
/// `7d`), or `0`.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let text = raw.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{raw:?} needs a unit: ms, s, m, h or d (e.g. 7d)"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{raw:?} is not a whole number followed by a unit (e.g. 7d)"))?;
    let unit_millis: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {raw:?}; use ms, s, m, h or d"
            ))
        }
    };
    number
        .checked_mul(unit_millis)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{raw:?} is too long"))
}

/// The retention policy: `forever`, or a comma-separated age (`7d`) and/or count (`100000`):
/// terminal jobs go once they are older than the age or beyond the count, longest finished
/// first.
pub fn parse_retention(raw: &str) -> Result<Retention, String> {
    if raw.trim().eq_ignore_ascii_case("forever") {
        return Ok(Retention::FOREVER);
    }
    let mut retention = Retention::FOREVER;
    for part in raw.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(format!(
                "{raw:?}: an empty item; give an age (7d), a count (100000) or both (7d,100000)"
            ));
        }
        if part.bytes().all(|b| b.is_ascii_digit()) {
            let count: u64 = part
                .parse()
                .map_err(|_| format!("{part:?} is too large a count"))?;
            if count == 0 {
                return Err("a count of 0 would keep no terminal job at all; give at least 1 (or `forever`)".into());
            }
            if retention.max_count.replace(count).is_some() {
                return Err(format!("{raw:?} gives two counts"));
            }
        } else {
            let age = parse_duration(part)?;
            if retention.max_age.replace(age).is_some() {
                return Err(format!("{raw:?} gives two ages"));
            }
        }
    }
    Ok(retention)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("7").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("7w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn a_policy_is_an_age_a_count_or_both() {
        let both = parse_retention("7d,100000").expect("both");
        assert_eq!(both.max_age, Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(both.max_count, Some(100_000));
        assert_eq!(
            parse_retention("1000").expect("a count").max_age,
            None,
            "a count alone keeps any age"
        );
        assert_eq!(parse_retention("forever"), Ok(Retention::FOREVER));
        assert!(parse_retention("0")
            .unwrap_err()
            .contains("keep no terminal job"));
        assert!(parse_retention("1d,2d").unwrap_err().contains("two ages"));
        assert!(parse_retention("5,6").unwrap_err().contains("two counts"));
        assert!(parse_retention("7d,").is_err());
    }
}
