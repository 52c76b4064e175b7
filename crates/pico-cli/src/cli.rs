//! The command line: every flag, its default and its `PICO_` environment variable.

use crate::size::parse_size;
use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use pico_common::BucketUri;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "pico",
    version,
    about = "PicoMQ: durable streams on object storage"
)]
pub struct Cli {
    /// Pico protocol endpoint the client commands talk to.
    #[arg(
        long,
        global = true,
        display_order = 900,
        env = "PICO_ENDPOINT",
        default_value = "http://127.0.0.1:4437"
    )]
    pub endpoint: String,
    /// Protocol: for `serve`, what the listener root speaks; for client commands, what they speak.
    #[arg(long, global = true, display_order = 900, env = "PICO_PROTOCOL", value_enum, default_value_t = Protocol::Pico)]
    pub protocol: Protocol,
    /// Use HTTP/2 without negotiation (h2c prior knowledge).
    #[arg(long, global = true, display_order = 900, env = "PICO_HTTP2", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub http2: bool,
    /// Named configuration profile. Hidden until profiles arrive with `pico config`.
    #[arg(
        long,
        global = true,
        display_order = 900,
        env = "PICO_PROFILE",
        hide = true
    )]
    pub profile: Option<String>,
    /// Bearer token sent with every request.
    #[arg(
        long,
        global = true,
        display_order = 900,
        env = "PICO_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

impl Command {
    /// The stream a client command acts on, if it names one.
    pub fn stream_name(&self) -> Option<&str> {
        match self {
            Command::Create { name, .. }
            | Command::Head { name }
            | Command::Append { name, .. }
            | Command::Read { name, .. }
            | Command::Tail { name, .. }
            | Command::Close { name }
            | Command::Delete { name }
            | Command::Trim { name, .. } => Some(name),
            Command::Admin(a) => match &a.command {
                AdminCommand::Transfer { name, .. } => Some(name),
            },
            Command::Serve(_) | Command::Bench(_) | Command::Ls { .. } => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    Pico,
    Ds,
    /// The Kafka wire protocol: `pico bench` only, with `--endpoint HOST:PORT` of the node's
    /// Kafka listener.
    Kafka,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RoutingArg {
    Redirect,
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthArg {
    Off,
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadFormat {
    /// One record body per line.
    Text,
    /// One JSON object per line: seq, timestamp, key, headers, body or body_b64.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a node.
    Serve(Box<ServeArgs>),
    /// Create a stream (idempotent).
    Create {
        name: String,
        /// The stream's content type.
        #[arg(long, env = "PICO_CONTENT_TYPE")]
        content_type: Option<String>,
        /// Sliding idle TTL in seconds.
        #[arg(long, env = "PICO_TTL")]
        ttl: Option<u64>,
    },
    /// Print `start= next= closed= type=`; exits 1 if the stream is missing.
    Head { name: String },
    /// Append newline-delimited records from stdin.
    Append {
        name: String,
        /// Records per request (a batch also ends at 4 MiB of records); at most 10,000, the
        /// server's limit per append. Requests go through an idempotent producer, so those
        /// that fail in passing (no answer, a restart) are resent and written once.
        #[arg(long, env = "PICO_BATCH", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        batch: u32,
        /// Accepted for compatibility and ignored: Pico appends are not checked against the
        /// stream's content type (a JSON stream still checks that each record is JSON).
        #[arg(long, env = "PICO_CONTENT_TYPE")]
        content_type: Option<String>,
    },
    /// Read from an offset up to the tail, then exit.
    Read {
        name: String,
        /// First offset to read (default: the stream's first record).
        #[arg(long, env = "PICO_FROM")]
        from: Option<u64>,
        #[arg(long, env = "PICO_FORMAT", value_enum, default_value_t = ReadFormat::Text)]
        format: ReadFormat,
    },
    /// Print from the tail (or the last N records); `-f` keeps following.
    Tail {
        name: String,
        /// Keep following with long-poll until the stream closes; failures that may pass (no
        /// connection, no answer, 5xx) are retried from the same offset.
        #[arg(short = 'f', long, env = "PICO_FOLLOW", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
        follow: bool,
        /// Start this many records before the tail.
        #[arg(
            short = 'n',
            long = "lines",
            env = "PICO_TAIL_LINES",
            default_value_t = 0
        )]
        lines: u64,
        #[arg(long, env = "PICO_FORMAT", value_enum, default_value_t = ReadFormat::Text)]
        format: ReadFormat,
    },
    /// List streams.
    Ls {
        /// Only names starting with this prefix.
        #[arg(long, env = "PICO_PREFIX")]
        prefix: Option<String>,
    },
    /// Close a stream to appends.
    Close { name: String },
    /// Delete a stream; the name is reusable at once.
    Delete { name: String },
    /// Load generator: throughput and latency of appends (and tailers) against a server.
    Bench(Box<crate::bench::BenchArgs>),
    /// Drop records below an offset.
    Trim {
        name: String,
        /// New first offset.
        #[arg(long, env = "PICO_TRIM_SEQ")]
        seq: u64,
    },
    /// Talk to a node's admin listener.
    Admin(AdminArgs),
}

/// `pico admin`: the admin listener's API.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Admin listener of the node to ask (any node of the cluster).
    #[arg(
        long,
        global = true,
        env = "PICO_ADMIN_ENDPOINT",
        default_value = "http://127.0.0.1:9090"
    )]
    pub admin_endpoint: String,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Move a stream to another node: its owner flushes and releases it, the target opens it
    /// at the next epoch; offsets and idempotent producers carry on.
    Transfer {
        name: String,
        /// The node to move it to.
        #[arg(long, env = "PICO_TO_NODE")]
        to_node: u32,
        /// Wait until the target owns the stream, and print how long the handoff took.
        #[arg(long, env = "PICO_WAIT", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
        wait: bool,
    },
}

/// `pico serve`: every flag of the node, each with a `PICO_` variable.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Node id, unique in the cluster.
    #[arg(long, env = "PICO_NODE_ID", default_value_t = 1)]
    pub node_id: u32,
    /// Node epoch; must grow across restarts, at most 2^63 − 1 [default: start time in ms].
    #[arg(long, env = "PICO_NODE_EPOCH", value_parser = clap::value_parser!(u64).range(..=pico_runtime::MAX_NODE_EPOCH))]
    pub node_epoch: Option<u64>,
    /// Protocol listener address.
    #[arg(long, env = "PICO_LISTEN", default_value = "127.0.0.1:4437")]
    pub listen: SocketAddr,
    /// Admin listener address (health, readiness, metrics, admin API, dashboard).
    #[arg(long, env = "PICO_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    pub admin_listen: SocketAddr,
    /// Run without the admin listener.
    #[arg(long, env = "PICO_NO_ADMIN", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub no_admin: bool,
    /// Kafka listener address (the Kafka wire protocol on the same streams, docs/kafka.md).
    #[arg(long, env = "PICO_KAFKA_LISTEN", default_value = "127.0.0.1:9092")]
    pub kafka_listen: SocketAddr,
    /// Kafka address advertised to clients (host:port) [default: the listen address].
    #[arg(long, env = "PICO_KAFKA_ADVERTISE")]
    pub kafka_advertise: Option<String>,
    /// Run without the Kafka listener.
    #[arg(long, env = "PICO_NO_KAFKA", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub no_kafka: bool,
    /// Advertised URL of the protocol listener, used in 307 redirects; an http:// or https://
    /// URL, required when --listen is 0.0.0.0 or [::] [default: http://{listen}].
    #[arg(long, env = "PICO_HTTP_ADDRESS")]
    pub http_address: Option<String>,
    /// Metadata log: sqlite:<path>, sqlite::memory: or postgres://…
    #[arg(long, env = "PICO_META_URL", default_value = "sqlite:./data/meta.db")]
    pub meta_url: String,
    /// Object storage for data objects: <bucket id>@<scheme>://<location>[?params].
    #[arg(long, env = "PICO_STORAGE", default_value = "-2@file://./objects", allow_hyphen_values = true, value_parser = parse_bucket)]
    pub storage: BucketUri,
    /// Write-ahead log location (bucket URI or postgres://…) [default: storage with bucket id − 1].
    #[arg(long, env = "PICO_WAL", allow_hyphen_values = true, value_parser = parse_bucket)]
    pub wal: Option<BucketUri>,
    /// Cluster id; nodes sharing a metadata log must agree on it.
    #[arg(long, env = "PICO_CLUSTER_ID", default_value = "picomq")]
    pub cluster_id: String,
    /// Redirect requests for streams owned elsewhere (307), or serve them locally.
    #[arg(long, env = "PICO_ROUTING", value_enum, default_value_t = RoutingArg::Redirect)]
    pub routing: RoutingArg,
    /// Streams this node may own at once, at least 1 [default: unlimited].
    #[arg(long, env = "PICO_SLOTS", value_parser = clap::value_parser!(u32).range(1..))]
    pub slots: Option<u32>,
    /// Longest a long-poll read waits before 204, in seconds (1 to 604800, one week).
    #[arg(long, env = "PICO_LONG_POLL_TIMEOUT_SEC", default_value_t = 25, value_parser = live_seconds())]
    pub long_poll_timeout_sec: u64,
    /// Longest an SSE response stays open, in seconds (1 to 604800, one week).
    #[arg(long, env = "PICO_SSE_MAX_DURATION_SEC", default_value_t = 55, value_parser = live_seconds())]
    pub sse_max_duration_sec: u64,
    /// Largest body of one read response (bytes, or KiB/MiB/GiB).
    #[arg(long, env = "PICO_MAX_CHUNK_SIZE", default_value = "64KiB", value_parser = parse_size)]
    pub max_chunk_size: usize,
    /// Largest accepted request body; larger gets 413 (bytes, or KiB/MiB/GiB).
    #[arg(long, env = "PICO_MAX_REQUEST_SIZE", default_value = "32MiB", value_parser = parse_size)]
    pub max_request_size: usize,
    /// Seconds to let in-flight requests finish on shutdown.
    #[arg(long, env = "PICO_SHUTDOWN_DRAIN_SEC", default_value_t = 5)]
    pub shutdown_drain_sec: u64,
    /// HTTP/2 streams one connection may have open at once (each SSE or long-poll tailer holds
    /// one).
    #[arg(long, env = "PICO_HTTP2_MAX_STREAMS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_streams: u32,
    /// Memory for recently written records (bytes, or KiB/MiB/GiB).
    #[arg(long, env = "PICO_WAL_CACHE_SIZE", default_value = "128MiB", value_parser = parse_size)]
    pub wal_cache_size: usize,
    /// Memory for blocks read from object storage (bytes, or KiB/MiB/GiB).
    #[arg(long, env = "PICO_BLOCK_CACHE_SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub block_cache_size: usize,
    /// Authentication: off, or required (bearer tokens on every request).
    #[arg(long, env = "PICO_AUTH", value_enum, default_value_t = AuthArg::Off, hide = true)]
    pub auth: AuthArg,
    /// Allow binding non-loopback addresses with authentication off.
    #[arg(long, env = "PICO_INSECURE_ALLOW_REMOTE", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub insecure_allow_remote: bool,
    /// Admin token created at first start when no token exists. Hidden, like the other auth
    /// flags, until authentication lands.
    #[arg(
        long,
        env = "PICO_AUTH_BOOTSTRAP_TOKEN",
        hide_env_values = true,
        hide = true
    )]
    pub auth_bootstrap_token: Option<String>,
    /// File holding the bootstrap admin token.
    #[arg(long, env = "PICO_AUTH_BOOTSTRAP_TOKEN_FILE", hide = true)]
    pub auth_bootstrap_token_file: Option<PathBuf>,
    /// Web origins that may call the protocol listener from a browser, comma-separated exact
    /// origins (https://app.example.com,http://localhost:5173), or `*` for any [default: none].
    #[arg(long, env = "PICO_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,
    /// Host names a loopback node also answers, comma-separated (besides localhost, *.localhost,
    /// loopback addresses and the host of --http-address); others get 421.
    #[arg(long, env = "PICO_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
}

/// Seconds of a long-poll wait or an SSE response: at least 1, at most
/// [`pico_runtime::MAX_LIVE_WAIT`].
fn live_seconds() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=pico_runtime::MAX_LIVE_WAIT.as_secs())
}

fn parse_bucket(raw: &str) -> Result<BucketUri, String> {
    BucketUri::parse(raw).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Flags whose feature has not landed still parse (scripts may pass them) but are not
    /// offered in `--help`.
    #[test]
    fn flags_of_features_not_built_are_hidden() {
        let mut cmd = Cli::command();
        let global = cmd.render_long_help().to_string();
        let serve_help = cmd
            .find_subcommand_mut("serve")
            .unwrap()
            .render_long_help()
            .to_string();
        for flag in ["--kafka-listen", "--kafka-advertise", "--no-kafka"] {
            assert!(serve_help.contains(flag), "serve --help lacks {flag}");
        }
        for flag in ["--auth ", "--auth-bootstrap-token", "--profile"] {
            assert!(!serve_help.contains(flag), "serve --help offers {flag}");
            assert!(!global.contains(flag), "--help offers {flag}");
        }
        assert!(serve_help.contains("--insecure-allow-remote"));
        let s = serve(&["--no-kafka", "--kafka-listen", "127.0.0.1:1"]);
        assert!(s.no_kafka);
    }

    fn serve(args: &[&str]) -> ServeArgs {
        let mut argv = vec!["pico", "serve"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Serve(s) => *s,
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn storage_parses_with_equals_and_as_separate_word() {
        let a = serve(&["--storage=-2@file://./objects"]);
        let b = serve(&["--storage", "-2@file://./objects"]);
        assert_eq!(a.storage, b.storage);
        assert_eq!(a.storage.id, -2);
        let w = serve(&["--wal", "-3@memory://wal", "--no-kafka"]);
        assert_eq!(w.wal.unwrap().id, -3);
        assert!(w.no_kafka);
        assert!(Cli::try_parse_from(["pico", "serve", "--storage", "nope"]).is_err());
    }

    #[test]
    fn sizes_and_enums_parse() {
        let s = serve(&[
            "--max-request-size",
            "1KiB",
            "--routing",
            "local",
            "--auth",
            "required",
        ]);
        assert_eq!(s.max_request_size, 1024);
        assert_eq!(s.max_chunk_size, 64 * 1024);
        assert_eq!(s.routing, RoutingArg::Local);
        assert_eq!(s.auth, AuthArg::Required);
        assert!(Cli::try_parse_from(["pico", "serve", "--max-chunk-size", "12XB"]).is_err());
    }

    #[test]
    fn serve_numbers_are_bounded() {
        let refused = |args: &[&str]| {
            let mut argv = vec!["pico", "serve"];
            argv.extend_from_slice(args);
            Cli::try_parse_from(argv).is_err()
        };
        let max = u64::MAX.to_string();
        for flag in ["--long-poll-timeout-sec", "--sse-max-duration-sec"] {
            assert!(refused(&[flag, &max]), "{flag} u64::MAX");
            assert!(refused(&[flag, "604801"]), "{flag} above a week");
            assert!(refused(&[flag, "0"]), "{flag} 0");
            assert!(!refused(&[flag, "604800"]), "{flag} one week");
        }
        assert!(refused(&["--slots", "0"]));
        assert_eq!(serve(&["--slots", "1"]).slots, Some(1));
        assert!(refused(&["--node-epoch", &max]));
        assert!(refused(&["--node-epoch", "9223372036854775808"]));
        let top = serve(&["--node-epoch", "9223372036854775807"]);
        assert_eq!(top.node_epoch, Some(i64::MAX as u64));
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli =
            Cli::try_parse_from(["pico", "head", "/a", "--endpoint", "http://h:1", "--http2"])
                .unwrap();
        assert_eq!(cli.endpoint, "http://h:1");
        assert!(cli.http2);
        let cli = Cli::try_parse_from(["pico", "--protocol", "ds", "serve"]).unwrap();
        assert_eq!(cli.protocol, Protocol::Ds);
    }

    #[test]
    fn every_flag_has_a_pico_env_var() {
        fn check(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_positional() || id == "help" || id == "version" {
                    continue;
                }
                let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or("");
                assert!(
                    env.starts_with("PICO_"),
                    "{path} --{id} has no PICO_ env var"
                );
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        check(&cmd, "pico");
    }
}
