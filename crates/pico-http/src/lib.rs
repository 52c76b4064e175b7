//! PicoMQ HTTP facades. They only translate; all behaviour lives in `pico-server`.
//!
//! - [`protocol_router`]: the protocol listener (Pico protocol on stream paths, the Durable
//!   Streams mount under `/v1/stream`): [`fast::Protocol`], which serves the stream routes
//!   itself and the rest through an axum router.
//! - [`fast`]: that hot path, matched by hand, its edge checks plain calls.
//! - [`admin_router`]: the admin listener (`/health`, `/ready`, `/metrics`).
//! - [`pico`]: Pico protocol handlers, one file per request kind.
//! - [`ds`]: the Durable Streams protocol under `/v1/stream` (and at `/` with `--protocol ds`).
//! - [`headers`]: strict request-header parsing (TTL, Expires-At, producer triple, integers).
//! - [`error`]: the one mapping of service errors to status, JSON body and headers.
//! - [`cors`]: which web origins may call a listener (CORS, `--cors-origins`) and the headers
//!   every response carries.
//! - [`routing`]: 307 to the owning node for streams open elsewhere.
//! - [`admin`]: probe handlers and the Prometheus scrape.
//! - [`telemetry`]: the listener's request and SSE figures on `/metrics`.
//! - [`pieces`]: streamed bodies whose large reads are rendered as they are sent.

pub mod admin;
pub mod cors;
pub mod ds;
pub mod error;
pub mod fast;
pub mod headers;
pub mod pico;
pub mod pieces;
pub mod routing;
pub mod telemetry;

use std::sync::Arc;

use axum::Router;
use axum::middleware::from_fn_with_state;
use pico_server::Node;

pub use error::HttpError;

/// Protocol listener options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpOptions {
    /// `--routing local`: never 307 to a stream's owner.
    pub routing_local: bool,
    /// `--protocol ds`: serve Durable Streams at the root instead of the Pico protocol (DS stays
    /// under `/v1/stream` too).
    pub ds_at_root: bool,
    /// `--cors-origins`: the web origins granted CORS (none by default).
    pub cors: cors::CorsOrigins,
}

/// The protocol listener's service: the stream routes on the hot path ([`fast`]), everything
/// else through the axum router. Its request counters are taken from the metrics recorder
/// installed when it is built.
pub fn protocol_router(node: Node, opts: HttpOptions) -> fast::Protocol {
    let HttpOptions {
        routing_local,
        ds_at_root,
        cors,
    } = opts;
    let cors = Arc::new(cors::Cors {
        metrics: Some(telemetry::HttpMetrics::new()),
        origins: cors,
    });
    let router = axum_router(node.clone(), ds_at_root, routing_local, cors.clone());
    fast::Protocol::new(node, ds_at_root, !routing_local, cors, router)
}

/// Every protocol route behind the edge layers (CORS and telemetry, owner routing).
fn axum_router(node: Node, ds_at_root: bool, routing_local: bool, cors: Arc<cors::Cors>) -> Router {
    let mut r = ds::router(node.clone(), ds_at_root);
    if !ds_at_root {
        r = r.merge(pico::router(node.clone()));
    }
    if !routing_local {
        r = r.layer(from_fn_with_state(
            (node, ds_at_root),
            routing::redirect_to_owner,
        ));
    }
    r.layer(from_fn_with_state(cors, cors::cors))
}

/// The admin listener's router; `metrics` is the handle of the process's Prometheus recorder.
pub fn admin_router(
    node: Node,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
) -> Router {
    // No CORS here: a web page in an operator's browser must not read the admin listener.
    admin::router(node, metrics).layer(axum::middleware::from_fn(cors::same_origin_only))
}
