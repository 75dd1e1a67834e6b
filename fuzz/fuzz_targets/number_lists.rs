//! Arbitrary text through the number-list and column parsers: nothing may panic, and a list
//! that parses, written back one number per line, parses to the same numbers.

#![no_main]

use herder_core::dataparallel::{parse_column, parse_numbers, Column};
use libfuzzer_sys::fuzz_target;

fn check_back(numbers: &[i64]) {
    let text: String = numbers.iter().map(|n| format!("{n}\n")).collect();
    assert_eq!(parse_numbers(&text).as_deref(), Ok(numbers));
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    if let Ok(numbers) = parse_numbers(&text) {
        check_back(&numbers);
    }
    let column = match pick % 5 {
        0 => Column::Named("value".into()),
        n => Column::Position(usize::from(n)),
    };
    if let Ok(numbers) = parse_column(&text, &column) {
        check_back(&numbers);
    }
});
