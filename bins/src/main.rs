//! The `herder` command. Parsing and printing live here; everything else is the runtime's.

mod batch;
mod batch_graph;
mod bench;
mod cli;
mod config;
mod credentials;
mod dev;
mod group;
mod log_writer;
mod output;
mod retention;
mod retry;
mod verbs;
mod web;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, LogFormat};

/// Exit codes, as README.md ("Command line") documents them.
pub mod exit {
    pub const OK: u8 = 0;
    /// The job ended FAILED or CANCELLED (`wait`, `submit --wait`).
    pub const JOB_UNSUCCESSFUL: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const REJECTED: u8 = 3;
    pub const UNREACHABLE: u8 = 4;
    pub const SERVER: u8 = 5;
}

fn main() -> ExitCode {
    let wants_json = std::env::args().any(|arg| arg == "--json");
    let expanded = match config::expand(std::env::args_os().collect(), &|name| {
        std::env::var(name).ok()
    }) {
        Ok(expanded) => expanded,
        Err(error) => return ExitCode::from(output::usage_error(&error, wants_json)),
    };
    let cli = match Cli::try_parse_from(&expanded.args) {
        Ok(cli) => cli,
        Err(error) if error.use_stderr() && wants_json => {
            // A script that asked for JSON gets its usage error as JSON too.
            let message = error.render().to_string();
            return ExitCode::from(output::usage_error(message.trim_end(), true));
        }
        Err(error) => error.exit(),
    };
    let print_config = match &cli.command {
        Command::Coordinator(args) if args.print_config => Some("coordinator"),
        Command::Worker(args) if args.print_config => Some("worker"),
        _ => None,
    };
    if let Some(verb) = print_config {
        config::print(verb, &expanded.args, &expanded.sources);
        return ExitCode::from(exit::OK);
    }
    let server = matches!(
        cli.command,
        Command::Coordinator(_) | Command::Worker(_) | Command::Dev(_)
    );
    let log_guard = init_logging(cli.log_format, server);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(cli.io_threads))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("herder: cannot start the async runtime: {error}");
            return ExitCode::from(exit::SERVER);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Coordinator(args) => verbs::coordinator(args).await,
            Command::Worker(args) => verbs::worker(args).await,
            Command::Submit(args) => verbs::submit(args).await,
            Command::Status(args) => verbs::status(args).await,
            Command::Wait(args) => verbs::wait(args).await,
            Command::Cancel(args) => verbs::cancel(args).await,
            Command::List(args) => verbs::list(args).await,
            Command::Workers(args) => verbs::workers(args).await,
            Command::Queues(args) => verbs::queues(args).await,
            Command::Queue(args) => verbs::queue(args).await,
            Command::Purge(args) => verbs::purge(args).await,
            Command::Retry(args) => retry::run(args).await,
            Command::Cluster(args) => verbs::cluster(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Dev(args) => dev::run(args).await,
            Command::GenCerts(args) => verbs::gen_certs(args),
        }
    });
    // Do not wait for lingering connection tasks.
    runtime.shutdown_background();
    drop(log_guard);
    ExitCode::from(code)
}

/// Logs go to stderr through a background writer thread (see `log_writer`), so a busy
/// coordinator never waits on the terminal and a burst of lines costs a few writes instead of
/// one per line. Servers log at info; client verbs only warn, so their stdout stays clean. The
/// returned guard writes what is still buffered when dropped; without a thread, lines are
/// written directly.
fn init_logging(format: LogFormat, server: bool) -> Option<log_writer::FlushGuard> {
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    use tracing_subscriber::EnvFilter;
    let default = if server { "info" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi);
    let (writer, guard) = match log_writer::start(std::io::stderr()) {
        Ok((writer, guard)) => (BoxMakeWriter::new(writer), Some(guard)),
        Err(error) => {
            eprintln!("herder: no log writer thread ({error}); writing log lines directly");
            (BoxMakeWriter::new(std::io::stderr), None)
        }
    };
    let builder = builder.with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    guard
}
