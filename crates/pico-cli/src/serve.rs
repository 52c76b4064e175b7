//! `pico serve`: flags → [`pico_runtime::Config`] → [`pico_runtime::run`] until SIGINT/SIGTERM.

use crate::cli::{AuthArg, Protocol, RoutingArg, ServeArgs};
use anyhow::{Context, bail};
use pico_runtime::{AuthMode, Config, RootProtocol, Routing};
use std::time::Duration;

/// Builds the runtime configuration (checked by [`pico_runtime::validate`] when it runs).
pub fn to_config(args: &ServeArgs, protocol: Protocol) -> anyhow::Result<Config> {
    if args.node_id == 0 {
        bail!("--node-id must be at least 1");
    }
    if args.max_chunk_size == 0 || args.max_request_size == 0 {
        bail!("--max-chunk-size and --max-request-size must be positive");
    }
    let config = Config {
        node_id: args.node_id,
        node_epoch: args.node_epoch,
        listen: args.listen,
        admin_listen: (!args.no_admin).then_some(args.admin_listen),
        kafka_listen: (!args.no_kafka).then_some(args.kafka_listen),
        kafka_advertise: args.kafka_advertise.clone(),
        http_address: args.http_address.clone(),
        meta_url: args.meta_url.clone(),
        storage: args.storage.clone(),
        wal: args.wal.clone(),
        cluster_id: args.cluster_id.clone(),
        routing: match args.routing {
            RoutingArg::Redirect => Routing::Redirect,
            RoutingArg::Local => Routing::Local,
        },
        protocol: match protocol {
            Protocol::Pico => RootProtocol::Pico,
            Protocol::Ds => RootProtocol::Ds,
            Protocol::Kafka => bail!(
                "--protocol kafka is not a root protocol: the Kafka listener is --kafka-listen"
            ),
        },
        slots: args.slots,
        long_poll_timeout: Duration::from_secs(args.long_poll_timeout_sec),
        sse_max_duration: Duration::from_secs(args.sse_max_duration_sec),
        max_chunk_size: args.max_chunk_size,
        max_request_size: args.max_request_size,
        shutdown_drain: Duration::from_secs(args.shutdown_drain_sec),
        http2_max_streams: args.http2_max_streams,
        wal_cache_size: args.wal_cache_size,
        block_cache_size: args.block_cache_size,
        auth: match args.auth {
            AuthArg::Off => AuthMode::Off,
            AuthArg::Required => AuthMode::Required,
        },
        insecure_allow_remote: args.insecure_allow_remote,
        auth_bootstrap_token: args.auth_bootstrap_token.clone(),
        auth_bootstrap_token_file: args.auth_bootstrap_token_file.clone(),
        cors_origins: args.cors_origins.clone(),
        allowed_hosts: args.allowed_hosts.clone(),
        ..Config::default()
    };
    Ok(config)
}

pub async fn serve(args: &ServeArgs, protocol: Protocol) -> anyhow::Result<()> {
    let config = to_config(args, protocol)?;
    // Listening from the start, so no signal is missed: one during start-up begins the shutdown
    // once the node is up, and a second one still ends the process at once.
    let mut signals = Signals::new();
    tracing::info!(
        node_id = config.node_id,
        listen = %config.listen,
        admin = ?config.admin_listen,
        meta_url = %pico_common::uri::redact(&config.meta_url),
        storage = %config.storage,
        "starting pico node"
    );
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (name, _) = signals.next().await;
        tracing::info!("{name} received, shutting down");
        let _ = first_tx.send(());
        // The graceful shutdown may wait out its drain; a second signal is the operator
        // saying not to.
        let (name, code) = signals.next().await;
        tracing::warn!(
            "{name} received again: exiting now; acknowledged appends are safe in the WAL and \
             are recovered at the next start"
        );
        std::process::exit(code);
    });
    pico_runtime::run(config, async {
        let _ = first_rx.await;
    })
    .await
    .context("pico serve")?;
    tracing::info!("pico node stopped");
    Ok(())
}

/// SIGINT and SIGTERM, listened for from creation on (each arrival is seen once).
struct Signals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for {name}");
                    None
                }
            };
            Signals {
                int: listen(SignalKind::interrupt(), "SIGINT"),
                term: listen(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Resolves on the next SIGINT or SIGTERM with its name and the status a shell reports for
    /// a process it ended (128 + the signal's number); never, if neither can be heard.
    async fn next(&mut self) -> (&'static str, i32) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                if let Some(s) = s
                    && s.recv().await.is_some()
                {
                    return;
                }
                std::future::pending().await
            }
            tokio::select! {
                _ = recv(&mut self.int) => ("SIGINT", 130),
                _ = recv(&mut self.term) => ("SIGTERM", 143),
            }
        }
        #[cfg(not(unix))]
        {
            if let Err(e) = tokio::signal::ctrl_c().await {
                tracing::warn!(error = %e, "cannot listen for ctrl-c");
                std::future::pending::<()>().await;
            }
            ("ctrl-c", 130)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn config(args: &[&str]) -> anyhow::Result<Config> {
        let mut argv = vec!["pico", "serve"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).unwrap();
        match cli.command {
            Command::Serve(s) => to_config(&s, cli.protocol),
            _ => unreachable!(),
        }
    }

    #[test]
    fn defaults_match_the_runtime_defaults() {
        let c = config(&[]).unwrap();
        let d = Config::default();
        assert_eq!(c.listen, d.listen);
        assert_eq!(c.admin_listen, d.admin_listen);
        assert_eq!(c.kafka_listen, d.kafka_listen);
        assert_eq!(c.meta_url, d.meta_url);
        assert_eq!(c.storage, d.storage);
        assert_eq!(c.long_poll_timeout, d.long_poll_timeout);
        assert_eq!(c.sse_max_duration, d.sse_max_duration);
        assert_eq!(c.max_chunk_size, d.max_chunk_size);
        assert_eq!(c.max_request_size, d.max_request_size);
        assert_eq!(c.shutdown_drain, d.shutdown_drain);
        assert_eq!(c.http2_max_streams, d.http2_max_streams);
        assert_eq!(c.wal_cache_size, d.wal_cache_size);
        assert_eq!(c.block_cache_size, d.block_cache_size);
        assert_eq!(c.cluster_id, d.cluster_id);
        assert_eq!(c.routing, d.routing);
        assert_eq!(c.auth, d.auth);
        assert_eq!(c.cors_origins, d.cors_origins);
        assert_eq!(c.allowed_hosts, d.allowed_hosts);
    }

    #[test]
    fn flags_map_into_the_config() {
        let c = config(&[
            "--no-admin",
            "--no-kafka",
            "--long-poll-timeout-sec",
            "1",
            "--max-request-size",
            "4KiB",
            "--meta-url",
            "sqlite::memory:",
            "--storage",
            "-5@memory://objs",
        ])
        .unwrap();
        assert_eq!(c.admin_listen, None);
        assert_eq!(c.kafka_listen, None);
        assert_eq!(c.long_poll_timeout, Duration::from_secs(1));
        assert_eq!(c.max_request_size, 4096);
        assert_eq!(c.storage.id, -5);
        assert_eq!(c.meta_url, "sqlite::memory:");
        let c = config(&[
            "--cors-origins",
            "https://app.example.com,http://localhost:5173",
            "--allowed-hosts",
            "pico.internal",
        ])
        .unwrap();
        assert_eq!(
            c.cors_origins,
            ["https://app.example.com", "http://localhost:5173"]
        );
        assert_eq!(c.allowed_hosts, ["pico.internal"]);
        pico_runtime::validate(&c).unwrap();
        let bad = config(&["--cors-origins", "app.example.com"]).unwrap();
        let err = pico_runtime::validate(&bad).unwrap_err().to_string();
        assert!(err.contains("--cors-origins"), "{err}");
    }

    #[test]
    fn remote_binds_need_an_explicit_opt_in() {
        let checked = |args: &[&str]| pico_runtime::validate(&config(args).unwrap());
        for (flag, addr) in [
            ("--listen", "0.0.0.0:4437"),
            ("--admin-listen", "10.0.0.1:9090"),
            ("--kafka-listen", "0.0.0.0:9092"),
        ] {
            let err = checked(&[flag, addr]).unwrap_err().to_string();
            assert!(
                err.contains(flag) && err.contains("--insecure-allow-remote"),
                "{err}"
            );
        }
        // Authentication is not built: asking for it is refused, not ignored.
        let err = checked(&["--listen", "0.0.0.0:4437", "--auth", "required"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--auth required"), "{err}");
        checked(&["--listen", "0.0.0.0:4437", "--insecure-allow-remote"]).unwrap();
        checked(&["--admin-listen", "10.0.0.1:9090", "--no-admin"]).unwrap();
        checked(&["--kafka-listen", "0.0.0.0:9092", "--no-kafka"]).unwrap();
        checked(&["--listen", "[::1]:4437"]).unwrap();
    }

    /// 0.0.0.0 is where a node listens, never where others can reach it: the node must be told
    /// its address, and that address must be a URL other nodes can redirect to.
    #[test]
    fn a_wildcard_listen_takes_only_a_usable_http_address() {
        let checked = |args: &[&str]| {
            let mut all = vec!["--insecure-allow-remote"];
            all.extend_from_slice(args);
            pico_runtime::validate(&config(&all).unwrap()).map_err(|e| e.to_string())
        };
        for listen in ["0.0.0.0:4437", "[::]:4437"] {
            // Advertised by host name (see `pico_runtime::advertised_url`).
            checked(&["--listen", listen]).unwrap();
            checked(&[
                "--listen",
                listen,
                "--http-address",
                "http://node1.example:4437",
            ])
            .unwrap();
        }
        checked(&["--http-address", "https://[2001:db8::1]:8443"]).unwrap();
        for bad in [
            "node1:4437",
            "ftp://node1:4437",
            "http://",
            "http://0.0.0.0:4437",
            "http://[::]:4437",
            "http://node1:4437/?x=1",
            "not a url",
        ] {
            let err = checked(&["--listen", "0.0.0.0:4437", "--http-address", bad]).unwrap_err();
            assert!(err.contains("--http-address"), "{bad}: {err}");
        }
    }
}
