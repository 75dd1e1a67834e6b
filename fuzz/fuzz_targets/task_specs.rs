//! Arbitrary JSON as a task: validation may refuse it but never panics, and a task it accepts
//! survives its own encoding, and splits into at most the pieces asked for.

#![no_main]

use herder_core::tasks::TaskSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pieces, rest)) = data.split_first() else {
        return;
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(rest) else {
        return;
    };
    let Ok(task) = TaskSpec::from_json(&value) else {
        return;
    };
    let again = TaskSpec::from_json(&task.to_json()).expect("an accepted task is accepted again");
    assert_eq!(again, task);
    if task.is_data_parallel() && task.items() <= 100_000 {
        let asked = u32::from(pieces).max(1);
        assert!(task.split(asked).len() <= asked as usize);
    }
});
