use super::*;
use proptest::prelude::*;
use serde_json::json;

fn parse(value: Value) -> Result<TaskSpec, TaskError> {
    TaskSpec::from_json(&value)
}

// ---- parsing: accepted forms ----

#[test]
fn parses_every_documented_example() {
    let cases = [
        (
            json!({"kind":"sleep","milliseconds":1000}),
            TaskSpec::Sleep { milliseconds: 1000 },
        ),
        (
            json!({"kind":"word-count","text":"a b"}),
            TaskSpec::WordCount { text: "a b".into() },
        ),
        (
            json!({"kind":"sha256","text":"abc"}),
            TaskSpec::Sha256 { text: "abc".into() },
        ),
        (
            json!({"kind":"prime-count","limit":100000}),
            TaskSpec::PrimeCount { limit: 100_000 },
        ),
        (
            json!({"kind":"fail","fail_until_attempt":3}),
            TaskSpec::Fail {
                fail_until_attempt: 3,
            },
        ),
    ];
    for (wire, spec) in cases {
        assert_eq!(parse(wire.clone()), Ok(spec.clone()));
        assert_eq!(spec.to_json(), wire);
        assert_eq!(serde_json::to_value(&spec).unwrap(), wire);
        assert_eq!(serde_json::from_value::<TaskSpec>(wire).unwrap(), spec);
    }
}

#[test]
fn accepts_the_bounds_themselves() {
    assert!(parse(json!({"kind":"sleep","milliseconds":0})).is_ok());
    assert!(parse(json!({"kind":"sleep","milliseconds":SLEEP_MILLIS_MAX})).is_ok());
    assert!(parse(json!({"kind":"prime-count","limit":PRIME_COUNT_LIMIT_MAX})).is_ok());
    assert!(parse(json!({"kind":"fail","fail_until_attempt":1})).is_ok());
    assert!(parse(json!({"kind":"fail","fail_until_attempt":ATTEMPTS_MAX})).is_ok());
    let longest = "x".repeat(TASK_TEXT_BYTES_MAX);
    assert!(parse(json!({"kind":"sha256","text":longest})).is_ok());
    assert!(parse(json!({"kind":"word-count","text":""})).is_ok());
}

#[test]
fn kinds_are_named() {
    let specs = [
        TaskSpec::Sleep { milliseconds: 1 },
        TaskSpec::WordCount { text: "".into() },
        TaskSpec::Sha256 { text: "".into() },
        TaskSpec::PrimeCount { limit: 1 },
        TaskSpec::Fail {
            fail_until_attempt: 1,
        },
        TaskSpec::Max { numbers: vec![1] },
        TaskSpec::PrimeCountList { numbers: vec![] },
        TaskSpec::PrimeSum { start: 1, end: 2 },
    ];
    let kinds: Vec<&str> = specs.iter().map(TaskSpec::kind).collect();
    assert_eq!(kinds, TASK_KINDS);
    for name in TASK_KINDS {
        assert_eq!(Kind::from_name(name).map(Kind::name), Some(name));
    }
}

// ---- parsing: every error variant ----

#[test]
fn not_an_object() {
    assert_eq!(
        parse(json!([1, 2])),
        Err(TaskError::NotAnObject { found: "an array" })
    );
    assert_eq!(
        parse(json!("sleep")),
        Err(TaskError::NotAnObject { found: "a string" })
    );
    assert_eq!(
        parse(Value::Null),
        Err(TaskError::NotAnObject { found: "null" })
    );
}

#[test]
fn missing_kind() {
    let error = parse(json!({"milliseconds":5})).unwrap_err();
    assert_eq!(error, TaskError::MissingKind);
    assert!(error
        .to_string()
        .contains("sleep, word-count, sha256, prime-count, fail"));
}

#[test]
fn kind_not_a_string() {
    assert_eq!(
        parse(json!({"kind":7})),
        Err(TaskError::KindNotString { found: "a number" })
    );
}

#[test]
fn a_kind_that_is_not_built_in_names_a_user_task() {
    let task = parse(json!({"kind":"resize","payload":{"width":1.5,"path":"a.png"}})).unwrap();
    let TaskSpec::User(user) = &task else {
        panic!("expected a user task, got {task:?}");
    };
    assert_eq!(user.name, "resize");
    assert_eq!(user.payload, json!({"width":1.5,"path":"a.png"}));
    assert_eq!(task.kind(), "resize");
    assert!(!task.is_data_parallel());
    // The wire form round-trips through both the strict parser and serde.
    let wire = task.to_json();
    assert_eq!(
        wire,
        json!({"kind":"resize","payload":{"width":1.5,"path":"a.png"}})
    );
    assert_eq!(parse(wire.clone()).unwrap(), task);
    assert_eq!(serde_json::from_value::<TaskSpec>(wire).unwrap(), task);
    // No payload is a null payload.
    assert_eq!(
        parse(json!({"kind":"tick"})).unwrap().to_json(),
        json!({"kind":"tick","payload":null})
    );
}

#[test]
fn a_user_task_takes_only_kind_and_payload() {
    // A misspelt built-in kind with its field is a user task with a stray field: refused.
    assert_eq!(
        parse(json!({"kind":"word_count","text":""})),
        Err(TaskError::UserTaskField {
            name: "word_count".into(),
            field: "text".into()
        })
    );
}

#[test]
fn bad_task_names_are_refused_with_the_rule() {
    for (name, reason) in [
        ("", "it is empty"),
        ("-x", "it must start with a letter or a digit"),
        (
            "a b",
            "only ASCII letters, digits and - _ . : / are allowed",
        ),
        (
            "résumé",
            "only ASCII letters, digits and - _ . : / are allowed",
        ),
    ] {
        match parse(json!({ "kind": name })) {
            Err(TaskError::BadTaskName { reason: got, .. }) => assert_eq!(got, reason, "{name:?}"),
            other => panic!("{name:?}: unexpected {other:?}"),
        }
    }
    let error = parse(json!({"kind":"a b"})).unwrap_err().to_string();
    assert!(
        error.contains("known kinds") || error.contains("built-in task kind"),
        "{error}"
    );
    assert!(
        error.contains("sha256"),
        "the message lists the built-in kinds: {error}"
    );
    // A huge name is not echoed back in full.
    let huge = "é".repeat(1000);
    match parse(json!({ "kind": huge })) {
        Err(TaskError::BadTaskName { name, .. }) => assert!(name.len() <= ECHO_BYTES_MAX + 3),
        other => panic!("unexpected {other:?}"),
    }
    // A built-in name is never a user task, even when built by hand.
    let forged = TaskSpec::User(crate::tasks::UserTask {
        name: "sha256".into(),
        payload: json!(null),
    });
    assert!(matches!(
        forged.validate(),
        Err(TaskError::BadTaskName { .. })
    ));
}

#[test]
fn a_payload_over_the_bound_is_refused_with_its_size() {
    use crate::limits::TASK_PAYLOAD_BYTES_MAX;
    // `"` + text + `"`: exactly at the bound is fine, one byte more is not.
    let fits = "x".repeat(TASK_PAYLOAD_BYTES_MAX - 2);
    assert!(parse(json!({"kind":"big","payload":fits})).is_ok());
    let over = "x".repeat(TASK_PAYLOAD_BYTES_MAX - 1);
    assert_eq!(
        parse(json!({"kind":"big","payload":over})),
        Err(TaskError::PayloadTooLarge {
            name: "big".into(),
            bytes: TASK_PAYLOAD_BYTES_MAX + 1,
            max: TASK_PAYLOAD_BYTES_MAX
        })
    );
}

#[test]
fn missing_field() {
    let error = parse(json!({"kind":"sleep"})).unwrap_err();
    assert_eq!(
        error,
        TaskError::MissingField {
            kind: "sleep",
            field: "milliseconds"
        }
    );
    assert_eq!(
        error.to_string(),
        "sleep task is missing the field \"milliseconds\", which must be an integer in 0..=86400000"
    );
    assert_eq!(
        parse(json!({"kind":"sha256"})),
        Err(TaskError::MissingField {
            kind: "sha256",
            field: "text"
        })
    );
}

#[test]
fn wrong_type() {
    let error = parse(json!({"kind":"sleep","milliseconds":"5"})).unwrap_err();
    assert_eq!(
        error,
        TaskError::WrongType {
            kind: "sleep",
            field: "milliseconds",
            expected: "integer",
            found: "a string"
        }
    );
    assert_eq!(
        error.to_string(),
        "sleep task field \"milliseconds\" must be an integer in 0..=86400000, found a string"
    );
    assert_eq!(
        parse(json!({"kind":"word-count","text":12})),
        Err(TaskError::WrongType {
            kind: "word-count",
            field: "text",
            expected: "string",
            found: "a number"
        })
    );
    assert_eq!(
        parse(json!({"kind":"fail","fail_until_attempt":null})),
        Err(TaskError::WrongType {
            kind: "fail",
            field: "fail_until_attempt",
            expected: "integer",
            found: "null"
        })
    );
}

#[test]
fn negative() {
    let error = parse(json!({"kind":"sleep","milliseconds":-5})).unwrap_err();
    assert_eq!(
        error,
        TaskError::Negative {
            kind: "sleep",
            field: "milliseconds",
            value: "-5".into()
        }
    );
    assert_eq!(
        error.to_string(),
        "sleep task field \"milliseconds\" is -5, but it must be an integer in 0..=86400000"
    );
    assert!(matches!(
        parse(json!({"kind":"prime-count","limit":-2.5})),
        Err(TaskError::Negative { .. })
    ));
}

#[test]
fn not_an_integer() {
    let error = parse(json!({"kind":"sleep","milliseconds":1.5})).unwrap_err();
    assert_eq!(
        error,
        TaskError::NotInteger {
            kind: "sleep",
            field: "milliseconds",
            value: "1.5".into()
        }
    );
    assert!(error.to_string().contains("not a plain integer"));
    // A whole number in floating-point form is not accepted either (nor is it by serde);
    // serde_json also reads "-0" as the float -0.0.
    let five: Value = serde_json::from_str(r#"{"kind":"prime-count","limit":5.0}"#).unwrap();
    assert!(matches!(
        TaskSpec::from_json(&five),
        Err(TaskError::NotInteger { .. })
    ));
    assert!(serde_json::from_value::<TaskSpec>(five).is_err());
    for text in ["1e3", "-0", "-0.0", "0.5"] {
        let wire = format!(r#"{{"kind":"sleep","milliseconds":{text}}}"#);
        let value: Value = serde_json::from_str(&wire).unwrap();
        let result = TaskSpec::from_json(&value);
        assert!(
            matches!(result, Err(TaskError::NotInteger { .. })),
            "{text}: {result:?}"
        );
    }
}

#[test]
fn out_of_range() {
    let error = parse(json!({"kind":"prime-count","limit":2000000000u64})).unwrap_err();
    assert_eq!(
        error,
        TaskError::OutOfRange {
            kind: "prime-count",
            field: "limit",
            value: "2000000000".into(),
            min: 0,
            max: PRIME_COUNT_LIMIT_MAX
        }
    );
    assert_eq!(
        error.to_string(),
        "prime-count task field \"limit\" is 2000000000, outside the allowed range 0..=1000000000"
    );
    assert_eq!(
        parse(json!({"kind":"sleep","milliseconds":SLEEP_MILLIS_MAX + 1})),
        Err(TaskError::OutOfRange {
            kind: "sleep",
            field: "milliseconds",
            value: (SLEEP_MILLIS_MAX + 1).to_string(),
            min: 0,
            max: SLEEP_MILLIS_MAX
        })
    );
    assert_eq!(
        parse(json!({"kind":"fail","fail_until_attempt":0})),
        Err(TaskError::OutOfRange {
            kind: "fail",
            field: "fail_until_attempt",
            value: "0".into(),
            min: 1,
            max: 100
        })
    );
    // Larger than u32 (the field's Rust type) is still just out of range.
    assert!(matches!(
        parse(json!({"kind":"fail","fail_until_attempt":5_000_000_000u64})),
        Err(TaskError::OutOfRange { .. })
    ));
    // Larger than u64: serde_json holds it as a float, and it is still out of range.
    let huge: Value =
        serde_json::from_str(r#"{"kind":"sleep","milliseconds":100000000000000000000}"#).unwrap();
    assert!(matches!(
        TaskSpec::from_json(&huge),
        Err(TaskError::OutOfRange { .. })
    ));
}

#[test]
fn text_too_long() {
    let text = "é".repeat(TASK_TEXT_BYTES_MAX / 2 + 1);
    let error = parse(json!({"kind":"word-count","text":text})).unwrap_err();
    assert_eq!(
        error,
        TaskError::TextTooLong {
            kind: "word-count",
            bytes: TASK_TEXT_BYTES_MAX + 2,
            max: TASK_TEXT_BYTES_MAX
        }
    );
    assert_eq!(
        error.to_string(),
        "word-count task field \"text\" is 262146 bytes long; at most 262144 bytes are allowed"
    );
}

#[test]
fn unexpected_field() {
    let error = parse(json!({"kind":"sleep","milliseconds":5,"x":1})).unwrap_err();
    assert_eq!(
        error,
        TaskError::UnexpectedField {
            kind: "sleep",
            field: "x".into(),
            allowed: "milliseconds"
        }
    );
    assert_eq!(
        error.to_string(),
        "sleep task has an unexpected field \"x\"; it takes only \"kind\" and \"milliseconds\""
    );
    // A misspelt field is reported as unexpected rather than as the real one missing.
    assert!(matches!(
        parse(json!({"kind":"sleep","millis":5})),
        Err(TaskError::UnexpectedField { .. })
    ));
    // The derived Deserialize is strict in the same way.
    assert!(
        serde_json::from_value::<TaskSpec>(json!({"kind":"sleep","milliseconds":5,"x":1})).is_err()
    );
}

// ---- properties ----

fn valid_spec() -> impl Strategy<Value = TaskSpec> {
    prop_oneof![
        (0..=SLEEP_MILLIS_MAX).prop_map(|milliseconds| TaskSpec::Sleep { milliseconds }),
        any::<String>().prop_map(|text| TaskSpec::WordCount { text }),
        any::<String>().prop_map(|text| TaskSpec::Sha256 { text }),
        (0..=PRIME_COUNT_LIMIT_MAX).prop_map(|limit| TaskSpec::PrimeCount { limit }),
        (1..=ATTEMPTS_MAX).prop_map(|fail_until_attempt| TaskSpec::Fail { fail_until_attempt }),
    ]
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(vec![
            "sleep",
            "word-count",
            "sha256",
            "prime-count",
            "fail",
            ""
        ])
        .prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        let key = prop::sample::select(vec![
            "kind",
            "milliseconds",
            "text",
            "limit",
            "fail_until_attempt",
            "x",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(key.prop_map(String::from), inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn valid_specs_round_trip(spec in valid_spec()) {
        prop_assert_eq!(spec.validate(), Ok(()));
        let wire = spec.to_json();
        prop_assert_eq!(&wire, &serde_json::to_value(&spec).unwrap());
        prop_assert_eq!(TaskSpec::from_json(&wire), Ok(spec.clone()));
        // And through text, as it travels.
        let text = serde_json::to_string(&wire).unwrap();
        let reparsed: Value = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(TaskSpec::from_json(&reparsed), Ok(spec));
    }

    #[test]
    fn parsing_never_panics_and_agrees_with_validate(value in any_json()) {
        if let Ok(spec) = TaskSpec::from_json(&value) {
            prop_assert_eq!(spec.validate(), Ok(()));
            // Exactly what was parsed, with one default filled in: a user task given no payload
            // has the payload null.
            let mut expected = value.clone();
            if let (TaskSpec::User(_), Value::Object(fields)) = (&spec, &mut expected) {
                fields.entry("payload").or_insert(Value::Null);
            }
            prop_assert_eq!(spec.to_json(), expected);
        }
    }

    #[test]
    fn out_of_range_numbers_are_rejected(
        ms in SLEEP_MILLIS_MAX + 1..,
        limit in PRIME_COUNT_LIMIT_MAX + 1..,
        until in ATTEMPTS_MAX + 1..,
    ) {
        let is_out_of_range = |r: Result<TaskSpec, TaskError>| {
            matches!(r, Err(TaskError::OutOfRange { .. }))
        };
        let sleep = parse(json!({"kind":"sleep","milliseconds":ms}));
        let prime_count = parse(json!({"kind":"prime-count","limit":limit}));
        let fail = parse(json!({"kind":"fail","fail_until_attempt":until}));
        prop_assert!(is_out_of_range(sleep));
        prop_assert!(is_out_of_range(prime_count));
        prop_assert!(is_out_of_range(fail));
    }
}

// ---- data-parallel kinds ----

#[test]
fn data_parallel_validation_follows_seed_b() {
    assert_eq!(
        parse(json!({"kind":"max","numbers":[]})),
        Err(TaskError::EmptyList)
    );
    assert_eq!(
        parse(json!({"kind":"prime-count-list","numbers":[]})),
        Ok(TaskSpec::PrimeCountList { numbers: vec![] })
    );
    assert_eq!(
        parse(json!({"kind":"prime-sum","start":5,"end":4})),
        Err(TaskError::EmptyRange { start: 5, end: 4 })
    );
    assert_eq!(
        parse(json!({"kind":"prime-sum","start":-3,"end":-3})),
        Ok(TaskSpec::PrimeSum { start: -3, end: -3 })
    );
    let wide = parse(json!({"kind":"prime-sum","start":0,"end":PRIME_SUM_SPAN_MAX}));
    assert!(
        matches!(wide, Err(TaskError::RangeTooWide { .. })),
        "{wide:?}"
    );
    let edge = PRIME_SUM_SPAN_MAX as i64 - 1;
    assert!(parse(json!({"kind":"prime-sum","start":0,"end":edge})).is_ok());
    assert_eq!(
        parse(json!({"kind":"max","numbers":[1, "2"]})),
        Err(TaskError::BadNumber {
            kind: "max",
            index: 1,
            found: "a string".into()
        })
    );
    assert!(matches!(
        parse(json!({"kind":"max","numbers":[1, 1.5]})),
        Err(TaskError::BadNumber { index: 1, .. })
    ));
    assert!(matches!(
        parse(json!({"kind":"max","numbers":[18446744073709551615u64]})),
        Err(TaskError::BadNumber { index: 0, .. })
    ));
    assert!(matches!(
        parse(json!({"kind":"prime-sum","start":"1","end":2})),
        Err(TaskError::NotI64 { field: "start", .. })
    ));
    assert!(matches!(
        parse(json!({"kind":"prime-sum","start":1})),
        Err(TaskError::MissingField { field: "end", .. })
    ));
    let extra = parse(json!({"kind":"prime-sum","start":1,"end":2,"step":1})).unwrap_err();
    assert_eq!(
        extra.to_string(),
        "prime-sum task has an unexpected field \"step\"; it takes only \"kind\" and \"start\" and \"end\""
    );
}

// ---- exec ----

#[test]
fn an_exec_task_round_trips_and_its_optional_fields_stay_out_when_empty() {
    let wire = json!({"kind":"exec","argv":["/bin/echo","hi"],"cwd":"jobs/1","env":{"A_B":"c"}});
    let task = parse(wire.clone()).unwrap();
    assert_eq!(task.kind(), "exec");
    assert_eq!(task.to_json(), wire);
    assert_eq!(serde_json::to_value(&task).unwrap(), wire);
    let bare = parse(json!({"kind":"exec","argv":["true"]})).unwrap();
    assert_eq!(bare.to_json(), json!({"kind":"exec","argv":["true"]}));
    assert_eq!(serde_json::to_value(&bare).unwrap(), bare.to_json());
}

#[test]
fn bad_exec_tasks_are_refused_naming_the_field() {
    use crate::limits::{EXEC_ARGS_MAX, EXEC_ENV_MAX, EXEC_STRING_BYTES_MAX};
    let many: Vec<String> = (0..=EXEC_ARGS_MAX).map(|i| i.to_string()).collect();
    let env: serde_json::Map<String, Value> = (0..=EXEC_ENV_MAX)
        .map(|i| (format!("V{i}"), json!("x")))
        .collect();
    let cases = [
        (json!({"kind":"exec"}), "argv"),
        (json!({"kind":"exec","argv":"true"}), "argv"),
        (json!({"kind":"exec","argv":[]}), "argv"),
        (json!({"kind":"exec","argv":[""]}), "argv"),
        (json!({"kind":"exec","argv":["a", 1]}), "argv"),
        (json!({"kind":"exec","argv":["a\u{0}b"]}), "argv"),
        (
            json!({"kind":"exec","argv":["x".repeat(EXEC_STRING_BYTES_MAX + 1)]}),
            "argv",
        ),
        (json!({"kind":"exec","argv": many}), "argv"),
        (json!({"kind":"exec","argv":["true"],"cwd":"/etc"}), "cwd"),
        (
            json!({"kind":"exec","argv":["true"],"cwd":"a/../.."}),
            "cwd",
        ),
        (json!({"kind":"exec","argv":["true"],"cwd":7}), "cwd"),
        (
            json!({"kind":"exec","argv":["true"],"env":{"1X":"y"}}),
            "env",
        ),
        (json!({"kind":"exec","argv":["true"],"env":{"X":1}}), "env"),
        (json!({"kind":"exec","argv":["true"],"env": env}), "env"),
        (json!({"kind":"exec","argv":["true"],"shell":true}), "shell"),
        (json!({"kind":"exec","argv":["bin/tool"]}), "argv"),
        (
            json!({"kind":"exec","argv":["convert"],"env":{"PATH":"."}}),
            "env",
        ),
        (
            json!({"kind":"exec","argv":["/bin/true"],"env":{"LD_PRELOAD":"x.so"}}),
            "env",
        ),
        (
            json!({"kind":"exec","argv":["/bin/true"],"env":{"HERDER_JOB_ID":"x"}}),
            "env",
        ),
    ];
    for (wire, field) in cases {
        match parse(wire.clone()) {
            Err(TaskError::BadExec { field: got, .. }) => assert_eq!(got, field, "{wire}"),
            other => panic!("{wire}: unexpected {other:?}"),
        }
    }
}

#[test]
fn exec_is_built_in_but_not_served_by_default() {
    assert!(crate::tasks::check_task_name("exec").is_err());
    assert!(crate::tasks::check_served_name("exec").is_ok());
    assert!(!TASK_KINDS.contains(&"exec"));
    // A worker that does not run commands says so, whoever asks.
    let task = parse(json!({"kind":"exec","argv":["true"]})).unwrap();
    let failure = crate::tasks::execute(&task, crate::ids::Attempt(1)).unwrap_err();
    assert!(failure.permanent && failure.message.contains("--allow-exec"));
}
