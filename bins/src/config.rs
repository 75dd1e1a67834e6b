//! Settings from outside the command line: `HERDER_<FLAG>` environment variables and a TOML file
//! (`--config FILE`, or `HERDER_CONFIG`), merged into the arguments before clap parses them.
//! So every setting goes through the one parser that checks flags, and the precedence is the
//! order of the merge: a flag on the command line, else its environment variable, else its key
//! in the file, else its default.
//!
//! The file holds `flag-name = value` lines for the verb it is given to (`worker-port = 7070`,
//! `allow-exec = ["/usr/bin/convert", "/opt/jobs/*"]`, `insecure-no-auth = true`); a key may
//! use `_` for `-`. A key that names no flag of the verb is an error naming the key and its
//! line, and so is a table or a value of the wrong shape.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use clap::{ArgAction, CommandFactory};

use crate::cli::Cli;

/// The environment variable that names a configuration file when `--config` is not given.
pub const CONFIG_ENV: &str = "HERDER_CONFIG";
/// Largest configuration file read.
const CONFIG_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Flags that are not settings: they say how to read the others, or ask for help.
const NOT_SETTINGS: [&str; 4] = ["help", "version", "config", "print-config"];

/// Where a setting's value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File,
    Default,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::Env => "environment",
            Source::File => "file",
            Source::Default => "default",
        }
    }
}

/// The arguments with every setting from the environment and the file merged in, and where
/// each setting of the verb came from (for `--print-config`).
#[derive(Debug)]
pub struct Expanded {
    pub args: Vec<OsString>,
    pub sources: BTreeMap<String, Source>,
}

/// What a flag takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// A switch: present or not.
    Switch,
    /// One value.
    One,
    /// One value, which may list several separated by commas.
    Delimited,
    /// Repeatable: one value each time.
    Repeated,
}

/// Every flag `verb` takes (its own, and the global ones), by long name.
fn flags_of(verb: &str) -> Option<BTreeMap<String, Shape>> {
    let command = Cli::command();
    let mut flags = BTreeMap::new();
    let mut add = |arg: &clap::Arg| {
        let Some(long) = arg.get_long() else { return };
        if NOT_SETTINGS.contains(&long) {
            return;
        }
        let shape = match arg.get_action() {
            ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count => Shape::Switch,
            ArgAction::Append if arg.get_value_delimiter().is_some() => Shape::Delimited,
            ArgAction::Append => Shape::Repeated,
            _ if arg.get_value_delimiter().is_some() => Shape::Delimited,
            _ => Shape::One,
        };
        flags.insert(long.to_owned(), shape);
    };
    command.get_arguments().for_each(&mut add);
    command.find_subcommand(verb)?.get_arguments().for_each(add);
    Some(flags)
}

/// The verb of `args` (the first word that is not a flag or a global flag's value) and where
/// it stands.
fn verb_of(args: &[OsString]) -> Option<(usize, String)> {
    let mut skip_value = false;
    for (at, arg) in args.iter().enumerate().skip(1) {
        let text = arg.to_str()?;
        if skip_value {
            skip_value = false;
            continue;
        }
        if text == "--" {
            return None;
        }
        if let Some(flag) = text.strip_prefix("--") {
            // The global flags that take a value, given as two words.
            skip_value = matches!(flag, "log-format" | "io-threads" | "config");
            continue;
        }
        return Some((at, text.to_owned()));
    }
    None
}

/// The long flags given on the command line (up to a `--` that ends the flags).
fn given(args: &[OsString]) -> Vec<String> {
    args.iter()
        .skip(1)
        .map_while(|arg| arg.to_str().filter(|a| *a != "--"))
        .filter_map(|arg| arg.strip_prefix("--"))
        .map(|flag| flag.split('=').next().unwrap_or(flag).to_owned())
        .collect()
}

/// The value of `--config FILE` or `--config=FILE`, if given.
fn config_flag(args: &[OsString]) -> Option<OsString> {
    let mut words = args.iter().skip(1);
    while let Some(arg) = words.next() {
        match arg.to_str() {
            Some("--") => return None,
            Some("--config") => return words.next().cloned(),
            Some(text) => {
                if let Some(path) = text.strip_prefix("--config=") {
                    return Some(path.into());
                }
            }
            None => {}
        }
    }
    None
}

/// Merges the environment (read through `env`) and the configuration file into `args`.
pub fn expand(
    args: Vec<OsString>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Expanded, String> {
    let Some((verb_at, verb)) = verb_of(&args) else {
        return Ok(Expanded {
            args,
            sources: BTreeMap::new(),
        });
    };
    let Some(flags) = flags_of(&verb) else {
        // Not a verb: clap says so.
        return Ok(Expanded {
            args,
            sources: BTreeMap::new(),
        });
    };
    let on_line = given(&args);
    let file = match config_flag(&args).or_else(|| env(CONFIG_ENV).map(OsString::from)) {
        Some(path) => Some(read_file(Path::new(&path), &verb, &flags)?),
        None => None,
    };
    let mut sources = BTreeMap::new();
    let mut injected: Vec<OsString> = Vec::new();
    for (flag, shape) in &flags {
        if on_line.iter().any(|given| given == flag) {
            sources.insert(flag.clone(), Source::Flag);
            continue;
        }
        let variable = env_name(flag);
        if let Some(value) = env(&variable) {
            inject(&mut injected, flag, *shape, &[value], &variable)?;
            sources.insert(flag.clone(), Source::Env);
            continue;
        }
        if let Some(values) = file.as_ref().and_then(|file| file.get(flag)) {
            inject(&mut injected, flag, *shape, values, flag)?;
            sources.insert(flag.clone(), Source::File);
            continue;
        }
        sources.insert(flag.clone(), Source::Default);
    }
    let mut merged = args;
    // Right after the verb: before any `--` and the words after it.
    let tail = merged.split_off(verb_at + 1);
    merged.extend(injected);
    merged.extend(tail);
    Ok(Expanded {
        args: merged,
        sources,
    })
}

/// `HERDER_` and the flag's name in capitals, `-` as `_`.
fn env_name(flag: &str) -> String {
    format!("HERDER_{}", flag.to_ascii_uppercase().replace('-', "_"))
}

/// Adds `--flag` with `values` (as the file or a variable gave them) to `out`.
fn inject(
    out: &mut Vec<OsString>,
    flag: &str,
    shape: Shape,
    values: &[String],
    from: &str,
) -> Result<(), String> {
    match shape {
        Shape::Switch => {
            let on = match values {
                [one] => parse_switch(one).ok_or_else(|| {
                    format!("{from}: --{flag} is a switch; give true or false, not {one:?}")
                })?,
                _ => return Err(format!("{from}: --{flag} is a switch; give true or false")),
            };
            if on {
                out.push(format!("--{flag}").into());
            }
        }
        Shape::One => match values {
            [one] => out.extend([format!("--{flag}").into(), one.into()]),
            _ => return Err(format!("{from}: --{flag} takes one value, not a list")),
        },
        Shape::Delimited => out.extend([format!("--{flag}").into(), values.join(",").into()]),
        Shape::Repeated => {
            for value in values {
                out.extend([format!("--{flag}").into(), value.into()]);
            }
        }
    }
    Ok(())
}

fn parse_switch(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

/// A configuration file's settings for `verb`, as lists of values by flag name.
fn read_file(
    path: &Path,
    verb: &str,
    flags: &BTreeMap<String, Shape>,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    use std::io::Read;
    let name = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("{name}: {e}"))?;
    let mut text = String::new();
    file.take(CONFIG_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{name}: {e}"))?;
    if text.len() as u64 > CONFIG_FILE_BYTES_MAX {
        return Err(format!("{name}: larger than {CONFIG_FILE_BYTES_MAX} bytes"));
    }
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("{name}: {}", e.to_string().trim_end()))?;
    let mut settings = BTreeMap::new();
    for (key, value) in table {
        let line = line_of(&text, &key);
        let flag = key.replace('_', "-");
        if value.is_table() {
            let line = text
                .lines()
                .position(|l| l.trim() == format!("[{key}]"))
                .map_or(line, |at| at + 1);
            return Err(format!(
                "{name}:{line}: [{key}] is a table; the file holds plain `flag-name = value` settings for the verb it is given to"
            ));
        }
        let Some(shape) = flags.get(&flag) else {
            return Err(format!(
                "{name}:{line}: unknown setting {key:?}: `herder {verb}` has no --{flag} (see `herder {verb} --help`)"
            ));
        };
        let values = match (value, shape) {
            (toml::Value::Array(items), Shape::Delimited | Shape::Repeated) => items
                .into_iter()
                .map(|item| scalar(item).ok_or(()))
                .collect::<Result<Vec<_>, ()>>()
                .map_err(|()| {
                    format!("{name}:{line}: {key} must list plain values (strings or numbers)")
                })?,
            (toml::Value::Array(_), _) => {
                return Err(format!("{name}:{line}: {key} takes one value, not a list"))
            }
            (value, _) => vec![scalar(value).ok_or_else(|| {
                format!("{name}:{line}: {key} must be a string, a number or true/false")
            })?],
        };
        settings.insert(flag, values);
    }
    Ok(settings)
}

/// A plain value as a command line would spell it.
fn scalar(value: toml::Value) -> Option<String> {
    match value {
        toml::Value::String(text) => Some(text),
        toml::Value::Integer(n) => Some(n.to_string()),
        toml::Value::Float(x) => Some(x.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Datetime(_) | toml::Value::Array(_) | toml::Value::Table(_) => None,
    }
}

/// The line (from 1) on which `key` is set, or 0 if it cannot be found.
fn line_of(text: &str, key: &str) -> usize {
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            let bare = line.strip_prefix(key);
            let quoted = line
                .strip_prefix('"')
                .and_then(|l| l.strip_prefix(key))
                .and_then(|l| l.strip_prefix('"'));
            bare.or(quoted)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(0, |at| at + 1)
}

/// Prints every setting of the verb with its value and where it came from, as a file of
/// settings would hold them.
pub fn print(verb: &str, args: &[OsString], sources: &BTreeMap<String, Source>) {
    let command = Cli::command();
    let Some(sub) = command.find_subcommand(verb) else {
        return;
    };
    let values = values_on(args);
    println!("# herder {verb}: every setting, and where its value came from");
    let arguments = command.get_arguments().chain(sub.get_arguments());
    for arg in arguments {
        let Some(long) = arg.get_long() else { continue };
        let Some(source) = sources.get(long) else {
            continue;
        };
        let value = if matches!(arg.get_action(), ArgAction::SetTrue) {
            Some(values.contains_key(long).to_string())
        } else if *source == Source::Default {
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            (!defaults.is_empty()).then(|| quote(&defaults.join(",")))
        } else {
            values.get(long).map(|given| quote(&given.join(",")))
        };
        let Some(value) = value else {
            println!("# {long} is not set");
            continue;
        };
        println!("{long} = {value}  # {}", source.as_str());
    }
}

fn quote(text: &str) -> String {
    if text.parse::<i64>().is_ok() || text == "true" || text == "false" {
        text.to_owned()
    } else {
        format!("{text:?}")
    }
}

/// The values each long flag has in `args` (empty for a switch).
fn values_on(args: &[OsString]) -> BTreeMap<String, Vec<String>> {
    let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let words: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    let mut at = 1;
    while at < words.len() {
        let word = words[at];
        if word == "--" {
            break;
        }
        if let Some(flag) = word.strip_prefix("--") {
            if let Some((flag, value)) = flag.split_once('=') {
                values
                    .entry(flag.to_owned())
                    .or_default()
                    .push(value.to_owned());
            } else {
                let next = words.get(at + 1).filter(|next| !next.starts_with("--"));
                let entry = values.entry(flag.to_owned()).or_default();
                if let Some(next) = next {
                    entry.push((*next).to_owned());
                    at += 1;
                }
            }
        }
        at += 1;
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    fn words(expanded: &Expanded) -> Vec<String> {
        expanded
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn file(text: &str) -> tempfile_path::Path {
        tempfile_path::Path::with(text)
    }

    /// A file under the system's temporary folder, removed when dropped.
    mod tempfile_path {
        pub struct Path(pub std::path::PathBuf);
        impl Path {
            pub fn with(text: &str) -> Path {
                use std::sync::atomic::{AtomicU32, Ordering};
                static NEXT: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "herder-config-test-{}-{}.toml",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&path, text).expect("write a test file");
                Path(path)
            }
            pub fn arg(&self) -> &str {
                self.0.to_str().expect("utf-8")
            }
        }
        impl Drop for Path {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default() {
        let config = file(
            "# a worker's settings\ncapacity = 8\nprefetch = 2\ndrain_timeout = \"5s\"\nallow-exec = [\"/bin/true\", \"/opt/*\"]\n",
        );
        let env = |name: &str| match name {
            "HERDER_PREFETCH" => Some("3".to_owned()),
            "HERDER_CAPACITY" => Some("6".to_owned()),
            _ => None,
        };
        let expanded = expand(
            args(&[
                "herder",
                "worker",
                "--id",
                "w1",
                "--capacity",
                "1",
                "--config",
                config.arg(),
            ]),
            &env,
        )
        .expect("expands");
        let words = words(&expanded);
        assert_eq!(expanded.sources["capacity"], Source::Flag);
        assert_eq!(expanded.sources["prefetch"], Source::Env);
        assert_eq!(expanded.sources["drain-timeout"], Source::File);
        assert_eq!(expanded.sources["allow-exec"], Source::File);
        assert_eq!(expanded.sources["max-frame-bytes"], Source::Default);
        // The flag's own value stays the only capacity; the others are added once each.
        assert_eq!(words.iter().filter(|w| *w == "--capacity").count(), 1);
        let cli = <Cli as clap::Parser>::try_parse_from(&expanded.args).expect("parses");
        let crate::cli::Command::Worker(worker) = cli.command else {
            panic!("a worker");
        };
        assert_eq!(worker.capacity, 1);
        assert_eq!(worker.prefetch, 3);
        assert_eq!(worker.drain_timeout, std::time::Duration::from_secs(5));
        assert_eq!(worker.exec.allow_exec, ["/bin/true", "/opt/*"]);
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let config = file("capacity = 2\n\n# typo below\ncapacty = 3\n");
        let error = expand(
            args(&["herder", "worker", "--id", "w1", "--config", config.arg()]),
            &|_| None,
        )
        .expect_err("refused");
        assert!(error.contains(":4: unknown setting \"capacty\""), "{error}");
    }

    #[test]
    fn a_value_of_the_wrong_shape_is_refused() {
        for (text, expected) in [
            ("capacity = [1, 2]\n", "takes one value"),
            ("[worker]\ncapacity = 2\n", "is a table"),
            ("capacity = \n", "config-test"),
        ] {
            let config = file(text);
            let error = expand(
                args(&["herder", "worker", "--id", "w1", "--config", config.arg()]),
                &|_| None,
            )
            .expect_err("refused");
            assert!(error.contains(expected), "{text:?}: {error}");
        }
        let error = expand(args(&["herder", "coordinator"]), &|name| {
            (name == "HERDER_INSECURE_NO_AUTH").then(|| "maybe".to_owned())
        })
        .expect_err("refused");
        assert!(error.contains("HERDER_INSECURE_NO_AUTH"), "{error}");
    }

    #[test]
    fn settings_go_before_the_words_after_a_double_dash() {
        let expanded = expand(
            args(&["herder", "submit", "exec", "--", "/bin/echo", "--json"]),
            &|name| (name == "HERDER_JSON").then(|| "true".to_owned()),
        )
        .expect("expands");
        let words = words(&expanded);
        let dashes = words.iter().position(|w| w == "--").expect("kept");
        let json = words.iter().position(|w| w == "--json").expect("added");
        assert!(json < dashes, "{words:?}");
    }
}
