//! The accept loop: HTTP/1.1 and HTTP/2 (prior knowledge) on one port.
//!
//! Our own loop rather than `axum::serve` for two settings it does not expose:
//! - `TCP_NODELAY` on every accepted socket: SSE and long-poll answers are small writes that
//!   must leave at once, not wait for the previous segment's ACK (Nagle);
//! - HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`: hyper's default (200) caps how many tailers
//!   one multiplexed connection can hold.
//!
//! HTTP/2 connections gather their writes ([`Coalesce`]) so that one append's frames for many
//! subscribers leave in one write, and run their streams in the connection's own task
//! ([`ConnExec`]) instead of a task per stream.
//!
//! It also gives HTTP/1.1 a timer, so a client that opens a connection and never finishes its
//! request headers is dropped after [`HEADER_READ_TIMEOUT`] instead of holding a socket.

use crate::coalesce::Coalesce;
use crate::conn_exec::ConnExec;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Listener settings.
#[derive(Debug, Clone, Copy)]
pub struct ListenOptions {
    /// HTTP/2 streams one connection may have open at once.
    pub http2_max_streams: u32,
}

/// Longest wait for a request's headers on an HTTP/1.1 connection.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes one HTTP/2 stream may have queued for a client that does not read (hyper's default
/// is ~400 KiB). One read chunk (64 KiB by default) fits; with 1024 streams a connection holds
/// at most 64 MiB for slow readers instead of 400 MiB.
const H2_SEND_BUF: usize = 64 * 1024;

/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The connection builder, with `exec` running the connection's HTTP/2 streams (public so
/// `examples/sse_floor.rs` measures the same stack).
pub fn builder(opts: ListenOptions, exec: ConnExec) -> Builder<ConnExec> {
    let mut b = Builder::new(exec);
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    b.http2()
        .max_concurrent_streams(opts.http2_max_streams)
        .max_send_buf_size(H2_SEND_BUF);
    b
}

/// Serves `app` until `stop` turns true, then waits for open connections to finish their
/// in-flight requests (the caller bounds that wait with its drain timeout).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    opts: ListenOptions,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let svc = TowerToHyperService::new(app.clone());
        // An executor per connection, so its HTTP/2 streams run in its own task.
        let exec = ConnExec::default();
        let conn = builder(opts, exec.clone())
            .serve_connection_with_upgrades(TokioIo::new(Coalesce::new(tcp)), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = exec.drive(conn).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
