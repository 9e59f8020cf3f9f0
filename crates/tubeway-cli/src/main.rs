//! `tubeway`: run a Tubeway broker, or use one from the shell.
//!
//! `tubeway --help` is the reference; each subcommand lives in a module of its own.

mod bench;
mod call;
mod cli;
mod function;
mod offer;
mod output;
mod poll;
mod publish;
mod queue;
mod serve;
mod server;
mod stats;
mod subscribe;
mod topic;

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cli::{Cli, Command, UsageError};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match start(cli) {
        Ok(()) => cli::EXIT_OK,
        Err(e) => output::report(&e),
    };
    ExitCode::from(code)
}

fn start(cli: Cli) -> anyhow::Result<()> {
    let is_server = matches!(cli.command, Command::Server(_));
    init_logging(
        cli.log_level.as_deref(),
        if is_server { "info" } else { "warn" },
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tubeway")
        .build()?;
    let result = runtime.block_on(run(cli.command));
    // Never hang on exit: a task still waiting (a read of stdin, say) is abandoned.
    runtime.shutdown_timeout(Duration::from_millis(500));
    result
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Server(args) => server::run(args).await,
        Command::Call(args) => call::run(args).await,
        Command::Queue(cmd) => queue::run(cmd).await,
        Command::Offer(args) => offer::run(args).await,
        Command::Poll(args) => poll::run(args).await,
        Command::Topic(cmd) => topic::run(cmd).await,
        Command::Function(cmd) => function::run(cmd).await,
        Command::Serve(args) => serve::run(args).await,
        Command::Publish(args) => publish::run(args).await,
        Command::Subscribe(args) => subscribe::run(args).await,
        Command::Stats(args) => stats::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::BenchPeer(args) => tokio::task::spawn_blocking(move || bench::peer::run(&args))
            .await
            .map_err(anyhow::Error::from)?,
    }
}

/// Logs to stderr, filtered by `--log-level`, else RUST_LOG, else `default`.
fn init_logging(flag: Option<&str>, default: &str) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match flag {
        Some(level) => EnvFilter::try_new(level)
            .map_err(|e| UsageError(format!("invalid --log-level {level:?}: {e}")))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    Ok(())
}
