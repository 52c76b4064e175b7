//! `pico`: the PicoMQ server, client CLI, admin tool and benchmark.
//!
//! - [`cli`]: clap definitions; every flag has a `PICO_` environment variable.
//! - [`serve`]: `pico serve` → `pico_runtime::run`, with the loopback/auth exposure check.
//! - [`commands`]: create, head, append, read, tail, ls, close, delete, trim, admin.
//! - [`bench`]: `pico bench`, the load generator (Pico, Durable Streams and Kafka protocols).
//! - [`size`]: `64KiB`-style size parsing.

// jemalloc instead of glibc malloc: measured 11 % less server CPU per small append, and half
// the RSS after creating 100k streams (glibc's arenas kept the create churn); docs/performance.md.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod bench;
mod cli;
mod commands;
mod serve;
mod size;

use clap::Parser;
use cli::{Cli, Command, Protocol};
use pico_client::{Client, ClientOptions};
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve(_));
    // The server logs at info by default; client commands keep stderr for their own notes.
    let default_level = if serving { "info" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level)),
        )
        .with_writer(|| LossyStderr)
        .with_ansi(std::io::stderr().is_terminal())
        // Its fallback for a failed write is `eprintln!`, which panics (see `LossyStderr`).
        .log_internal_errors(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(format_args!("error: cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(dispatch(cli));
    if !serving {
        // Client commands may leave requests behind (a bench's tailers stop mid long-poll):
        // do not wait for them to run out before exiting.
        runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            say(format_args!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    if let Command::Serve(args) = &cli.command {
        return serve::serve(args, cli.protocol).await;
    }
    if let Command::Bench(args) = cli.command {
        return bench::run(
            *args,
            bench::Global {
                endpoint: cli.endpoint,
                protocol: cli.protocol,
                http2: cli.http2,
                token: cli.token,
            },
        )
        .await;
    }
    if cli.protocol != Protocol::Pico {
        anyhow::bail!(
            "--protocol {} is not supported by the client commands (use --protocol pico)",
            if cli.protocol == Protocol::Ds {
                "ds"
            } else {
                "kafka"
            }
        );
    }
    if let Some(profile) = &cli.profile {
        say(format_args!(
            "note: profiles arrive with `pico config`; ignoring --profile {profile}"
        ));
    }
    // Every command checks its name first: the server reads the name from the raw URL path,
    // so one it would refuse (`orders?x`) could otherwise act on another stream (`orders`).
    if let Some(name) = cli.command.stream_name() {
        commands::check_name(name)?;
    }
    let client = Client::new(
        &cli.endpoint,
        ClientOptions {
            http2_prior_knowledge: cli.http2,
            token: cli.token.clone(),
            ..Default::default()
        },
    )?;
    match cli.command {
        Command::Serve(_) | Command::Bench(_) => unreachable!("handled above"),
        Command::Create {
            name,
            content_type,
            ttl,
        } => commands::create(&client, &name, content_type.as_deref(), ttl).await,
        Command::Head { name } => commands::head(&client, &name).await,
        // `--content-type` is accepted and ignored (see its help).
        Command::Append {
            name,
            batch,
            content_type: _,
        } => commands::append(&client, &name, batch as usize).await,
        Command::Read { name, from, format } => commands::read(&client, &name, from, format).await,
        Command::Tail {
            name,
            follow,
            lines,
            format,
        } => commands::tail(&client, &name, follow, lines, format).await,
        Command::Ls { prefix } => commands::ls(&client, prefix.as_deref()).await,
        Command::Close { name } => commands::close(&client, &name).await,
        Command::Delete { name } => commands::delete(&client, &name).await,
        Command::Trim { name, seq } => commands::trim(&client, &name, seq).await,
        Command::Admin(args) => commands::admin(&args, cli.token).await,
    }
}

/// stderr for the log, dropping what cannot be written. A node must not die because its log
/// cannot be written (a full disk under the log file, stderr on `/dev/full`): `eprintln!`
/// panics on a failed write, and so did tracing's writer through its `eprintln!` fallback; a
/// panic in the metadata committer then panicked again in a destructor that logs, which aborts
/// the process (SIGABRT, docs/design/failures.md "Disk full").
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // One write_all per line (the formatter hands over a whole event): the line is
        // written whole or, on a failure partway through, cut off.
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// `eprintln!` that drops the line when stderr cannot be written instead of panicking.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A closed stdout (`pico read x | head`) is a normal way to stop reading.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
