//! The `herder` command. Parsing and printing live here; everything else is the runtime's.

mod batch;
mod bench;
mod cli;
mod dev;
mod group;
mod output;
mod retention;
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) if error.use_stderr() && std::env::args().any(|arg| arg == "--json") => {
            // A script that asked for JSON gets its usage error as JSON too.
            let message = error.render().to_string();
            return ExitCode::from(output::usage_error(message.trim_end(), true));
        }
        Err(error) => error.exit(),
    };
    let server = matches!(
        cli.command,
        Command::Coordinator(_) | Command::Worker(_) | Command::Dev(_)
    );
    let log_guard = init_logging(cli.log_format, server);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
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
            Command::Purge(args) => verbs::purge(args).await,
            Command::Cluster(args) => verbs::cluster(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Dev(args) => dev::run(args).await,
        }
    });
    // Do not wait for lingering connection tasks.
    runtime.shutdown_background();
    drop(log_guard);
    ExitCode::from(code)
}

/// Logs go to stderr through a background writer thread, so a busy coordinator never waits on
/// the terminal. The thread writes through a buffer that it flushes whenever it has nothing
/// more to write, so a burst of lines costs one write instead of one per line, and a quiet
/// moment shows every line at once. Servers log at info; client verbs only warn, so their
/// stdout stays clean. The returned guard flushes what is buffered when dropped.
/// The log writer's buffer: lines beyond it are written before the burst ends.
const LOG_BUFFER_BYTES: usize = 64 * 1024;

fn init_logging(format: LogFormat, server: bool) -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::EnvFilter;
    let default = if server { "info" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .finish(std::io::BufWriter::with_capacity(
            LOG_BUFFER_BYTES,
            std::io::stderr(),
        ));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(false)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    guard
}
