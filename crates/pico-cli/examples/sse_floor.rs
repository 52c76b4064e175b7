//! The SSE fan-out floor for `docs/performance.md`: the least a server can do to deliver each
//! append to every SSE subscriber over the Durable Streams URL layout, so `pico bench
//! --readers N --read-mode sse` can drive it unchanged. Nothing is stored: a POST body is rendered
//! once as a `data` + `control` event pair and handed to every open `?live=sse` response through
//! one broadcast channel. Whatever PicoMQ's delivery latency is above this is PicoMQ's own work;
//! what this costs is the machine's (sockets, HTTP framing, the client's reads).
//!
//! `cargo run --release -p pico-cli --example sse_floor -- 127.0.0.1:47401`
//! (HTTP/1.1 and h2c prior knowledge, TCP_NODELAY, and PicoMQ's own connection builder: up to
//! 1024 HTTP/2 streams per connection, writes coalesced, streams run in the connection's task.)

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::HeaderValue;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use pico_runtime::coalesce::Coalesce;
use pico_runtime::conn_exec::ConnExec;
use pico_runtime::listener::{self, ListenOptions};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::broadcast;

/// A response body: nothing, or the SSE events of one subscriber.
enum Out {
    Empty,
    Events(BoxStream<'static, Bytes>),
}

impl Body for Out {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Out::Empty => Poll::Ready(None),
            Out::Events(s) => s.poll_next_unpin(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Out::Empty)
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Out::Empty => SizeHint::with_exact(0),
            Out::Events(_) => SizeHint::default(),
        }
    }
}

struct State {
    tx: broadcast::Sender<Bytes>,
    /// Bytes appended so far: the offsets in headers and control events.
    next: AtomicU64,
}

async fn body_bytes(req: Request<Incoming>) -> Vec<u8> {
    let mut body = req.into_body();
    let mut out = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    out.extend_from_slice(d);
                }
            }
            Err(_) => break,
        }
    }
    out
}

fn reply(status: StatusCode, next: u64, body: Out) -> Response<Out> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    // Digits only, so always a valid header value.
    if let Ok(v) = HeaderValue::from_str(&format!("{next:020}")) {
        h.insert("stream-next-offset", v);
    }
    r
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Result<Response<Out>, Infallible> {
    let live_sse = req.uri().query().is_some_and(|q| q.contains("live=sse"));
    let next = st.next.load(Ordering::Relaxed);
    Ok(match *req.method() {
        Method::PUT => reply(StatusCode::CREATED, next, Out::Empty),
        Method::POST => {
            let body = body_bytes(req).await;
            let next = st.next.fetch_add(body.len() as u64, Ordering::Relaxed) + body.len() as u64;
            // Rendered once for every subscriber (the payload is the bench's text records).
            let mut ev = Vec::with_capacity(body.len() + 128);
            ev.extend_from_slice(b"event: data\ndata:");
            ev.extend_from_slice(&body);
            ev.extend_from_slice(b"\n\nevent: control\ndata:{\"streamNextOffset\":\"");
            ev.extend_from_slice(format!("{next:020}").as_bytes());
            ev.extend_from_slice(b"\",\"upToDate\":true}\n\n");
            let _ = st.tx.send(Bytes::from(ev));
            reply(StatusCode::NO_CONTENT, next, Out::Empty)
        }
        Method::GET if live_sse => {
            let rx = st.tx.subscribe();
            let events = futures::stream::unfold(rx, |mut rx| async move {
                loop {
                    match rx.recv().await {
                        Ok(b) => return Some((b, rx)),
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            });
            let first = Bytes::from(format!(
                "event: control\ndata:{{\"streamNextOffset\":\"{next:020}\",\"upToDate\":true}}\n\n"
            ));
            let s = futures::stream::once(async move { first }).chain(events);
            let mut r = reply(StatusCode::OK, next, Out::Events(s.boxed()));
            r.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("text/event-stream"),
            );
            r
        }
        _ => reply(StatusCode::OK, next, Out::Empty),
    })
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:47401".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("sse_floor listening on {addr}");
    let st = Arc::new(State {
        tx: broadcast::channel(64).0,
        next: AtomicU64::new(0),
    });
    loop {
        let (sock, _) = listener.accept().await?;
        sock.set_nodelay(true)?;
        let st = st.clone();
        // Like PicoMQ's listener: the connection's HTTP/2 streams run in its own task.
        let exec = ConnExec::default();
        let opts = ListenOptions {
            http2_max_streams: 1024,
        };
        let builder = listener::builder(opts, exec.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(st.clone(), req));
            let conn = builder.serve_connection(TokioIo::new(Coalesce::new(sock)), svc);
            let _ = exec.drive(conn).await;
        });
    }
}
