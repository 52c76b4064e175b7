//! The protocol listener's own figures on `/metrics`: requests answered (by method and status
//! class), how long they took to answer (live reads excepted, see [`LiveRead`]), requests in flight (long-polls
//! waiting included) and open SSE responses.
//!
//! The handles are taken once, when the router is built (`pico serve` installs its recorder
//! before that), so a request costs a few atomic updates and two clock reads, never a registry
//! lookup. Labels are bounded: seven methods times five classes, whatever clients send.

use std::time::Instant;

use axum::http::{Method, StatusCode};
use axum::response::Response;
use metrics::{Counter, Gauge, Histogram};

const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "other"];
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
const SSE_PROTOCOLS: [&str; 2] = ["ds", "pico"];

/// Registers help texts and units with the installed recorder (call once, after installing it).
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "pico_http_requests_total",
        Unit::Count,
        "Protocol-listener requests answered, by method and status class."
    );
    describe_histogram!(
        "pico_http_request_seconds",
        Unit::Seconds,
        "Protocol-listener requests, router to response headers; live reads not timed."
    );
    describe_gauge!(
        "pico_http_requests_in_flight",
        Unit::Count,
        "Protocol-listener requests not yet answered (waiting long-polls included)."
    );
    describe_gauge!(
        "pico_http_sse_streams",
        Unit::Count,
        "Open SSE responses, by protocol."
    );
}

/// The handles one protocol listener records through.
pub struct HttpMetrics {
    /// `[method][class]`, indexed as [`METHODS`] and [`CLASSES`].
    requests: [[Counter; CLASSES.len()]; METHODS.len()],
    /// Seconds to the response's headers, by method.
    latency: [Histogram; METHODS.len()],
    in_flight: Gauge,
}

impl std::fmt::Debug for HttpMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpMetrics")
    }
}

impl HttpMetrics {
    /// Takes the handles from the recorder installed now (none: every record is a no-op).
    pub fn new() -> Self {
        // Registered now so that both read 0 before the first SSE response, not missing.
        for p in SSE_PROTOCOLS {
            let _ = metrics::gauge!("pico_http_sse_streams", "protocol" => p);
        }
        Self {
            requests: METHODS.map(|m| {
                CLASSES.map(
                    |c| metrics::counter!("pico_http_requests_total", "method" => m, "status" => c),
                )
            }),
            latency: METHODS
                .map(|m| metrics::histogram!("pico_http_request_seconds", "method" => m)),
            in_flight: metrics::gauge!("pico_http_requests_in_flight"),
        }
    }

    /// Marks a request as in flight until the returned guard is finished or dropped (a client
    /// that goes away mid-request is no longer in flight, and is not counted as answered).
    pub fn start(&self, method: &Method) -> InFlight<'_> {
        self.in_flight.increment(1.0);
        InFlight {
            m: self,
            method: method_index(method),
            started: Instant::now(),
        }
    }
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Marks a response as a live read's (long-poll or SSE): counted, but not timed, as its answer
/// waits for data by design and would hide the latency of everything else. Set by the
/// handlers, which alone know (a query's `live=` may be percent-encoded, repeated or invalid).
#[derive(Debug, Clone, Copy)]
pub struct LiveRead;

/// Tags `resp` as a [`LiveRead`].
pub fn live_read(mut resp: Response) -> Response {
    resp.extensions_mut().insert(LiveRead);
    resp
}

fn method_index(m: &Method) -> usize {
    match *m {
        Method::GET => 0,
        Method::HEAD => 1,
        Method::POST => 2,
        Method::PUT => 3,
        Method::DELETE => 4,
        Method::OPTIONS => 5,
        _ => 6,
    }
}

/// `None` for codes outside 100–599 (hyper never sends one; counted nowhere rather than
/// under a wrong class).
fn class_index(s: StatusCode) -> Option<usize> {
    match s.as_u16() {
        100..=599 => Some(usize::from(s.as_u16() / 100 - 1)),
        _ => None,
    }
}

/// One request in flight; see [`HttpMetrics::start`].
pub struct InFlight<'a> {
    m: &'a HttpMetrics,
    method: usize,
    started: Instant,
}

impl InFlight<'_> {
    /// The response's headers are ready: count it under its status class, and time it unless
    /// it is a [`LiveRead`].
    pub fn finish(self, resp: &Response) {
        if let Some(c) = class_index(resp.status()) {
            self.m.requests[self.method][c].increment(1);
        }
        if resp.extensions().get::<LiveRead>().is_none() {
            let secs = self.started.elapsed().as_secs_f64();
            self.m.latency[self.method].record(secs);
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.m.in_flight.decrement(1.0);
    }
}

/// Held by an open SSE response; `pico_http_sse_streams{protocol}` counts them. Opening one is
/// rare next to its events, so its handle is looked up here rather than passed down.
pub struct SseOpen(Gauge);

impl SseOpen {
    /// `protocol`: `"ds"` or `"pico"`.
    pub fn new(protocol: &'static str) -> Self {
        let g = metrics::gauge!("pico_http_sse_streams", "protocol" => protocol);
        g.increment(1.0);
        Self(g)
    }
}

impl Drop for SseOpen {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

impl std::fmt::Debug for SseOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SseOpen")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use metrics_exporter_prometheus::PrometheusBuilder;

    #[test]
    fn classes_and_methods_index_their_labels() {
        assert_eq!(class_index(StatusCode::OK), Some(1));
        assert_eq!(class_index(StatusCode::TEMPORARY_REDIRECT), Some(2));
        assert_eq!(class_index(StatusCode::NOT_FOUND), Some(3));
        assert_eq!(class_index(StatusCode::SERVICE_UNAVAILABLE), Some(4));
        assert_eq!(class_index(StatusCode::CONTINUE), Some(0));
        assert_eq!(CLASSES[class_index(StatusCode::CONFLICT).unwrap()], "4xx");
        assert_eq!(METHODS[method_index(&Method::DELETE)], "DELETE");
        assert_eq!(METHODS[method_index(&Method::PATCH)], "other");
    }

    #[test]
    fn a_request_counts_once_and_leaves_flight_even_when_dropped() {
        let rec = PrometheusBuilder::new().build_recorder();
        let handle = rec.handle();
        let m = metrics::with_local_recorder(&rec, HttpMetrics::new);
        let text = handle.render();
        assert!(
            text.contains(r#"pico_http_sse_streams{protocol="pico"} 0"#),
            "{text}"
        );
        let answered = m.start(&Method::POST);
        let abandoned = m.start(&Method::GET);
        let text = handle.render();
        assert!(text.contains("pico_http_requests_in_flight 2"), "{text}");
        answered.finish(&StatusCode::NO_CONTENT.into_response());
        drop(abandoned);
        let text = handle.render();
        assert!(text.contains("pico_http_requests_in_flight 0"), "{text}");
        assert!(
            text.contains(r#"pico_http_requests_total{method="POST",status="2xx"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pico_http_requests_total{method="GET",status="2xx"} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pico_http_request_seconds_count{method="POST"} 1"#),
            "{text}"
        );
        m.start(&Method::GET)
            .finish(&live_read(StatusCode::OK.into_response()));
        let text = handle.render();
        assert!(
            text.contains(r#"pico_http_requests_total{method="GET",status="2xx"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains(r#"pico_http_request_seconds_count{method="GET"} 1"#),
            "a live read is not timed:\n{text}"
        );
        let sse = metrics::with_local_recorder(&rec, || SseOpen::new("ds"));
        let text = handle.render();
        assert!(
            text.contains(r#"pico_http_sse_streams{protocol="ds"} 1"#),
            "{text}"
        );
        drop(sse);
        let text = handle.render();
        assert!(
            text.contains(r#"pico_http_sse_streams{protocol="ds"} 0"#),
            "{text}"
        );
    }
}
