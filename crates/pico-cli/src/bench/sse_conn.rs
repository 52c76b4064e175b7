//! Connections for the SSE tailers, with as few task wake-ups per event as the protocol allows
//! ([`Endpoint`] and [`driving`] serve the append loops' connections too).
//!
//! The bench runs on the machine that runs the server, and with 1000 tailers the client's work
//! per event is part of every delivery time it measures. Through reqwest each event woke the
//! connection's task and then the tailer's task, and went through reqwest's and hyper's body
//! layers: ≈ 3 µs of client CPU per event over HTTP/2 and ≈ 10 µs over HTTP/1.1, as much as the
//! server spent delivering it. Here:
//!
//! - **HTTP/2**: one task per group of tailers drives its `h2` connections (one to the bench's
//!   endpoint, one to each node a 307 sent a stream to) and every tailer's stream on them; a
//!   data frame wakes nothing but that task (the streams are futures in one
//!   `FuturesUnordered`).
//! - **HTTP/1.1**: each tailer has its own socket (one exchange at a time) and polls hyper's
//!   connection in its own task instead of beside it in a second one.
//!
//! Plain `http://` only, as everywhere in the bench. A response that ends (the server's SSE
//! duration) or fails is reopened from the tailer's last position, after a pause on errors.

use super::Ctx;
use super::reader::{ERROR_PAUSE, SseTail};
use anyhow::{Context as _, bail};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper::header::{AUTHORIZATION, HOST, HeaderValue, LOCATION};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// HTTP/2 receive windows: large enough that flow control never holds an event back, and that
/// window updates are rare (h2 sends one when half of a window has been consumed).
const STREAM_WINDOW: u32 = 2 << 20;
const CONN_WINDOW: u32 = 16 << 20;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the tailers connect.
pub struct Endpoint {
    addr: SocketAddr,
    authority: HeaderValue,
    auth: Option<HeaderValue>,
}

/// Redirect hops the raw connections follow (a 307 from a non-owner points at the owner, so
/// one is normal), as `bench::redirect` does for reqwest.
pub(super) const MAX_REDIRECTS: usize = 5;

/// Where a 307/308 answer to `url` points: `(authority, absolute URL)`, its `Location` resolved
/// against `url`. Plain `http://` only, as everywhere in the bench.
pub(super) fn redirect_target(
    url: &str,
    location: Option<&HeaderValue>,
) -> Result<(String, String), String> {
    let loc = location
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| format!("redirect from {url} without a usable Location"))?;
    let next = reqwest::Url::parse(url)
        .and_then(|u| u.join(loc))
        .map_err(|e| format!("redirect from {url} to {loc}: {e}"))?;
    if next.scheme() != "http" {
        return Err(format!("redirect to {next}: plain http:// only"));
    }
    let host = next
        .host_str()
        .ok_or_else(|| format!("redirect to {next} without a host"))?;
    let port = next.port_or_known_default().unwrap_or(80);
    Ok((format!("{host}:{port}"), next.to_string()))
}

/// Whether `status` is a redirect the bench follows (same method, body and headers).
pub(super) fn is_redirect(status: hyper::StatusCode) -> bool {
    status == hyper::StatusCode::TEMPORARY_REDIRECT
        || status == hyper::StatusCode::PERMANENT_REDIRECT
}

impl Endpoint {
    pub async fn resolve(base: &str, token: Option<&str>) -> anyhow::Result<Endpoint> {
        let auth = token
            .map(|t| HeaderValue::try_from(format!("Bearer {t}")))
            .transpose()
            .context("token not allowed in a header")?;
        Endpoint::resolve_with(base, auth).await
    }

    /// The node at `authority` (where a redirect pointed), with this endpoint's token: each
    /// hop re-sends `Authorization`, which reqwest's own policy would drop across hosts.
    pub(super) async fn at(&self, authority: &str) -> Result<Endpoint, String> {
        Endpoint::resolve_with(&format!("http://{authority}"), self.auth.clone())
            .await
            .map_err(|e| format!("redirect target {authority}: {e:#}"))
    }

    /// This endpoint's `host:port`.
    pub(super) fn authority(&self) -> &str {
        self.authority.to_str().unwrap_or("")
    }

    async fn resolve_with(base: &str, auth: Option<HeaderValue>) -> anyhow::Result<Endpoint> {
        let uri: Uri = base
            .parse()
            .with_context(|| format!("bad endpoint {base}"))?;
        if uri.scheme_str() != Some("http") {
            bail!("the bench's tailers speak plain http:// only, not {base}");
        }
        let authority = uri
            .authority()
            .with_context(|| format!("endpoint without a host: {base}"))?
            .as_str()
            .to_string();
        let hostport = if uri.port().is_some() {
            authority.clone()
        } else {
            format!("{authority}:80")
        };
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(&hostport)
            .await
            .with_context(|| format!("resolving {hostport}"))?
            .collect();
        let addr = reachable(&addrs)
            .await
            .with_context(|| format!("{hostport} resolves to no address"))?;
        Ok(Endpoint {
            addr,
            authority: HeaderValue::try_from(authority).context("bad endpoint authority")?,
            auth,
        })
    }

    pub(super) async fn connect(&self) -> Result<TcpStream, String> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(self.addr))
            .await
            .map_err(|_| format!("connect {}: timed out", self.addr))?
            .map_err(|e| format!("connect {}: {e}", self.addr))?;
        tcp.set_nodelay(true)
            .map_err(|e| format!("TCP_NODELAY: {e}"))?;
        Ok(tcp)
    }

    /// `GET url` (callers may change the method); over HTTP/1.1 with the path alone and a
    /// `Host` header, over HTTP/2 with the full URL (h2 takes `:scheme` and `:authority`).
    pub(super) fn request<B>(&self, url: &str, body: B, h1: bool) -> Result<Request<B>, String> {
        let uri: Uri = url.parse().map_err(|e| format!("bad url {url}: {e}"))?;
        let mut b = if h1 {
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            Request::get(path).header(HOST, self.authority.clone())
        } else {
            Request::get(uri)
        };
        if let Some(a) = &self.auth {
            b = b.header(AUTHORIZATION, a.clone());
        }
        b.body(body).map_err(|e| format!("request {url}: {e}"))
    }
}

/// The first of `addrs` that accepts a connection, or the first of them if none does (the run
/// then reports the connect errors). `localhost` often resolves to `::1` first while a server
/// listens on 127.0.0.1 only; every connection of the run goes to the address chosen here. A
/// lone address is taken as it is, without a probe connection.
async fn reachable(addrs: &[SocketAddr]) -> Option<SocketAddr> {
    if addrs.len() < 2 {
        return addrs.first().copied();
    }
    for &a in addrs {
        if let Ok(Ok(_probe)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            return Some(a);
        }
    }
    addrs.first().copied()
}

fn encoding(h: &hyper::HeaderMap) -> Option<&[u8]> {
    h.get("stream-sse-data-encoding").map(|v| v.as_bytes())
}

/// One tailer over HTTP/1.1, until the bench aborts it.
pub async fn h1_tailer(ctx: Arc<Ctx>, ep: Arc<Endpoint>, mut tail: SseTail) {
    while !ctx.stopped() {
        match h1_session(&ep, &mut tail).await {
            Err(e) => {
                tail.error(&e);
                tokio::time::sleep(ERROR_PAUSE).await;
            }
            Ok(()) if tail.got_nothing() => tokio::time::sleep(ERROR_PAUSE).await,
            Ok(()) => {}
        }
    }
}

type H1Conn<B> = hyper::client::conn::http1::Connection<TokioIo<TcpStream>, B>;

/// Awaits `fut` while driving the connection it depends on (`done` once the connection ended).
/// Once the connection has ended, `fut` gets one more poll and then fails: what it waits for
/// (readiness, a response, body frames) can no longer arrive, and waiting would hang.
pub(super) async fn driving<B, F>(
    mut conn: Pin<&mut H1Conn<B>>,
    done: &mut bool,
    fut: F,
) -> Result<F::Output, String>
where
    B: hyper::body::Body + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    F: Future,
{
    let mut fut = std::pin::pin!(fut);
    loop {
        if *done {
            return fut
                .as_mut()
                .now_or_never()
                .ok_or_else(|| "connection closed".to_string());
        }
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                *done = true;
                r.map_err(|e| format!("connection: {e}"))?;
            }
            out = &mut fut => return Ok(out),
        }
    }
}

/// One response: open (following a 307 from a non-owner to the owner, a few hops at most),
/// then feed the body to the tailer until it ends. The next session starts at the bench's
/// endpoint again, so a stream that moved is found where it went.
async fn h1_session(ep: &Endpoint, tail: &mut SseTail) -> Result<(), String> {
    let mut url = tail.request_url();
    let mut elsewhere: Option<Endpoint> = None;
    for _ in 0..=MAX_REDIRECTS {
        let at = elsewhere.as_ref().unwrap_or(ep);
        match h1_exchange(at, &url, tail).await? {
            None => return Ok(()),
            Some((authority, next)) => {
                elsewhere = Some(ep.at(&authority).await?);
                url = next;
            }
        }
    }
    Err(format!(
        "read: more than {MAX_REDIRECTS} redirects from {url}"
    ))
}

/// One request on a connection of its own: `Some((authority, url))` when the answer was a
/// redirect there, else the response fed to the tailer until it ended.
async fn h1_exchange(
    ep: &Endpoint,
    url: &str,
    tail: &mut SseTail,
) -> Result<Option<(String, String)>, String> {
    let tcp = ep.connect().await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let mut conn = std::pin::pin!(conn);
    let mut done = false;
    let req = ep.request(url, Empty::<Bytes>::new(), true)?;
    let resp = driving(conn.as_mut(), &mut done, send.send_request(req))
        .await?
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status();
    if is_redirect(status) {
        return redirect_target(url, resp.headers().get(LOCATION)).map(Some);
    }
    let enc = encoding(resp.headers()).map(<[u8]>::to_vec);
    let mut body = resp.into_body();
    if !status.is_success() {
        let text = driving(conn.as_mut(), &mut done, body.collect()).await?;
        let text = text.map(|c| c.to_bytes()).unwrap_or_default();
        return Err(format!(
            "read: http {status}: {}",
            String::from_utf8_lossy(&text).trim()
        ));
    }
    tail.opened(enc.as_deref());
    loop {
        match driving(conn.as_mut(), &mut done, body.frame()).await? {
            None => return Ok(None), // the server ended the response: reopen from `pos`
            Some(Err(e)) => return Err(format!("body: {e}")),
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    tail.feed(d)?;
                }
            }
        }
    }
}

/// An HTTP/2 connection to one node: requests are sent through `client` while the task of the
/// tailers drives the connection itself.
#[derive(Clone)]
struct Conn {
    ep: Arc<Endpoint>,
    client: h2::client::SendRequest<Bytes>,
}

type H2Connection = h2::client::Connection<TcpStream, Bytes>;

/// A connection being made: `(authority, paused first, the connection)`.
type Dialed = (String, bool, Result<(Conn, H2Connection), String>);

/// Where one task's tailers are served, and its HTTP/2 connections there: one to the bench's
/// endpoint, and one to each node a 307 sent a tailer's stream to (its owner in a cluster), so
/// the streams of each node are multiplexed on a connection to that node. Rare events only
/// (opens, connections); the data frames are read in [`h2_tailers`] itself.
struct Routes {
    home: Arc<Endpoint>,
    /// Per tailer: the owner a redirect sent its stream to, `(authority, stream URL without
    /// query)`; `None` at the bench's endpoint. A stream that fails (its owner may have died or
    /// handed it over) goes back to the endpoint, which redirects again if need be.
    owner: Vec<Option<(String, String)>>,
    /// Per tailer: redirects followed since its last opened response.
    hops: Vec<usize>,
    conns: HashMap<String, Conn>,
    /// Tailers waiting for a connection being made, with whether their open pauses first.
    waiting: HashMap<String, Vec<(usize, bool)>>,
    dialing: FuturesUnordered<BoxFuture<'static, Dialed>>,
    opening: FuturesUnordered<BoxFuture<'static, (usize, Opened)>>,
    /// The connections, each ending with its authority.
    driving: FuturesUnordered<BoxFuture<'static, (String, Result<(), h2::Error>)>>,
}

impl Routes {
    fn new(home: Arc<Endpoint>, tailers: usize) -> Routes {
        Routes {
            home,
            owner: vec![None; tailers],
            hops: vec![0; tailers],
            conns: HashMap::new(),
            waiting: HashMap::new(),
            dialing: FuturesUnordered::new(),
            opening: FuturesUnordered::new(),
            driving: FuturesUnordered::new(),
        }
    }

    /// (Re)opens tailer `i`'s stream where it is served, after a pause if `pause`: on the
    /// connection there, or once one is made.
    fn open(&mut self, tail: &SseTail, i: usize, pause: bool) {
        let (authority, url) = match &self.owner[i] {
            None => (self.home.authority().to_string(), tail.request_url()),
            Some((authority, stream)) => (authority.clone(), tail.request_url_at(stream)),
        };
        if let Some(conn) = self.conns.get(&authority) {
            self.opening
                .push(Box::pin(open(conn.clone(), url, i, pause)));
            return;
        }
        let waiters = self.waiting.entry(authority.clone()).or_default();
        if waiters.is_empty() {
            self.dialing
                .push(Box::pin(dial(self.home.clone(), authority, pause)));
        }
        waiters.push((i, pause));
    }

    /// Tailer `i`'s stream failed: it is asked for at the bench's endpoint again.
    fn lost(&mut self, i: usize) {
        self.owner[i] = None;
        self.hops[i] = 0;
    }

    /// A 307 to `url` on `authority`: the next open goes there, unless it is one hop too many
    /// (then the error is returned).
    fn moved(&mut self, i: usize, authority: String, url: String) -> Result<(), String> {
        if self.hops[i] >= MAX_REDIRECTS {
            self.lost(i);
            return Err(format!(
                "read: more than {MAX_REDIRECTS} redirects to {url}"
            ));
        }
        self.hops[i] += 1;
        let stream = url.split_once('?').map_or(url.as_str(), |(s, _)| s);
        self.owner[i] = Some((authority, stream.to_string()));
        Ok(())
    }
}

/// A connection to `authority` (the bench's endpoint, or a node a redirect named, reached with
/// the endpoint's token), after a pause if `pause`.
async fn dial(home: Arc<Endpoint>, authority: String, pause: bool) -> Dialed {
    if pause {
        tokio::time::sleep(ERROR_PAUSE).await;
    }
    let r = async {
        let ep = if authority == home.authority() {
            home
        } else {
            Arc::new(home.at(&authority).await?)
        };
        let tcp = ep.connect().await?;
        let (client, conn) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONN_WINDOW)
            .handshake::<_, Bytes>(tcp)
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
        Ok((Conn { ep, client }, conn))
    };
    let r = r.await;
    (authority, pause, r)
}

/// Tailers sharing HTTP/2 connections, until the bench aborts them: each stream is opened at
/// the bench's endpoint and, if that answers 307, on a connection to the node it points at
/// (one per node, made on first use). A stream that ends is reopened where it was served; one
/// that fails (its connection lost, an error status) counts one error and is reopened at the
/// endpoint after a pause.
pub async fn h2_tailers(ep: Arc<Endpoint>, mut tails: Vec<SseTail>) {
    let mut routes = Routes::new(ep, tails.len());
    for (i, t) in tails.iter().enumerate() {
        routes.open(t, i, false);
    }
    let mut reading = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            Some((authority, r)) = routes.driving.next(), if !routes.driving.is_empty() => {
                // The connection is gone and every stream on it fails (h2 ends them when the
                // connection is dropped): each tailer counts its own error below.
                routes.conns.remove(&authority);
                if let Err(e) = r {
                    tracing::debug!(%authority, error = %e, "bench h2 connection ended");
                }
            }
            Some((authority, paused, r)) = routes.dialing.next(), if !routes.dialing.is_empty() => {
                let waiters = routes.waiting.remove(&authority).unwrap_or_default();
                match r {
                    Ok((conn, driver)) => {
                        routes.conns.insert(authority.clone(), conn);
                        routes.driving.push(Box::pin(async move { (authority, driver.await) }));
                        for (i, pause) in waiters {
                            routes.open(&tails[i], i, pause && !paused);
                        }
                    }
                    Err(e) => {
                        for (i, _) in waiters {
                            tails[i].error(&e);
                            routes.lost(i);
                            routes.open(&tails[i], i, true);
                        }
                    }
                }
            }
            Some((i, r)) = routes.opening.next(), if !routes.opening.is_empty() => {
                let t = &mut tails[i];
                match r {
                    Ok(Open::Stream(enc, recv)) => {
                        routes.hops[i] = 0;
                        t.opened(enc.as_deref());
                        reading.push(next(i, recv));
                    }
                    Ok(Open::Moved(authority, url)) => match routes.moved(i, authority, url) {
                        Ok(()) => routes.open(t, i, false),
                        Err(e) => {
                            t.error(&e);
                            routes.open(t, i, true);
                        }
                    },
                    Err(e) => {
                        t.error(&e);
                        routes.lost(i);
                        routes.open(t, i, true);
                    }
                }
            }
            Some((i, recv, d)) = reading.next(), if !reading.is_empty() => {
                let t = &mut tails[i];
                match d {
                    Some(Ok(bytes)) => match t.feed(&bytes) {
                        Ok(()) => reading.push(next(i, recv)),
                        Err(e) => {
                            // Dropping `recv` resets the stream.
                            t.error(&e);
                            routes.lost(i);
                            routes.open(t, i, true);
                        }
                    },
                    // The server ended the response: reopen from the last position where it
                    // was served (after a pause if it delivered nothing).
                    None => {
                        let pause = t.got_nothing();
                        routes.open(t, i, pause);
                    }
                    Some(Err(e)) => {
                        t.error(&format!("h2 body: {e}"));
                        routes.lost(i);
                        routes.open(t, i, true);
                    }
                }
            }
        }
    }
}

/// What opening a stream gave: a successful response's encoding header and body, or the
/// owner a 307/308 points at.
enum Open {
    Stream(Option<Vec<u8>>, h2::RecvStream),
    /// `(authority, absolute URL)` of the redirect's target.
    Moved(String, String),
}

/// What opening a stream gave; an error status with the server's message.
type Opened = Result<Open, String>;

/// Most of an error response's body kept for the message.
const ERROR_BODY: usize = 1024;

async fn open(conn: Conn, url: String, i: usize, pause: bool) -> (usize, Opened) {
    if pause {
        tokio::time::sleep(ERROR_PAUSE).await;
    }
    let r = async {
        let req = conn.ep.request(&url, (), false)?;
        let mut client = conn.client.ready().await.map_err(|e| format!("h2: {e}"))?;
        let (resp, _) = client
            .send_request(req, true)
            .map_err(|e| format!("h2 request: {e}"))?;
        let resp = resp.await.map_err(|e| format!("h2 response: {e}"))?;
        let status = resp.status();
        if is_redirect(status) {
            // Dropping the body resets the stream.
            let (authority, next) = redirect_target(&url, resp.headers().get(LOCATION))?;
            return Ok(Open::Moved(authority, next));
        }
        let enc = encoding(resp.headers()).map(<[u8]>::to_vec);
        let mut body = resp.into_body();
        if !status.is_success() {
            let mut text = Vec::new();
            while text.len() < ERROR_BODY {
                match body.data().await {
                    Some(Ok(b)) => {
                        let _ = body.flow_control().release_capacity(b.len());
                        text.extend_from_slice(&b);
                    }
                    _ => break,
                }
            }
            return Err(format!(
                "read: http {status}: {}",
                String::from_utf8_lossy(&text).trim()
            ));
        }
        Ok(Open::Stream(enc, body))
    };
    (i, r.await)
}

/// The server's limit on concurrent streams per HTTP/2 connection, read from its SETTINGS on a
/// connection of its own before any reader starts (reqwest, which carries the long-poll
/// readers, does not expose it). A server sends its SETTINGS before any response, so one
/// answer to a `HEAD url` (whatever its status) means the limit is known.
pub async fn h2_stream_limit(ep: &Endpoint, url: &str) -> Result<usize, String> {
    let tcp = ep.connect().await?;
    let (client, conn) = h2::client::handshake(tcp)
        .await
        .map_err(|e| format!("h2 handshake: {e}"))?;
    let mut conn = std::pin::pin!(conn);
    let mut req = ep.request(url, (), false)?;
    *req.method_mut() = hyper::Method::HEAD;
    let ask = async {
        let mut client = client.ready().await.map_err(|e| format!("h2: {e}"))?;
        let (resp, _) = client
            .send_request(req, true)
            .map_err(|e| format!("h2 request: {e}"))?;
        resp.await.map_err(|e| format!("h2 response: {e}"))
    };
    // The answer first: a server that answers and closes in the same read has answered.
    tokio::select! {
        biased;
        r = tokio::time::timeout(CONNECT_TIMEOUT, ask) => {
            r.map_err(|_| format!("h2: no answer to HEAD {url} in {CONNECT_TIMEOUT:?}"))??;
            Ok(conn.max_concurrent_send_streams())
        }
        r = conn.as_mut() => Err(match r {
            Ok(()) => "h2 connection closed before an answer".to_string(),
            Err(e) => format!("h2 connection: {e}"),
        }),
    }
}

/// The next piece of a stream's body, its flow-control credit returned at once.
async fn next(
    i: usize,
    mut recv: h2::RecvStream,
) -> (usize, h2::RecvStream, Option<Result<Bytes, h2::Error>>) {
    let d = recv.data().await;
    if let Some(Ok(b)) = &d {
        let _ = recv.flow_control().release_capacity(b.len());
    }
    (i, recv, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Protocol;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers every SSE request with an empty 200 gets reopened after a pause,
    /// not in a tight loop that would take the CPU of the server under test, and an empty
    /// response is no error.
    #[tokio::test]
    async fn an_empty_response_is_reopened_after_a_pause() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let _ = s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        let ctx = super::super::reader::test_ctx(Protocol::Ds);
        let ep = Arc::new(
            Endpoint::resolve(&format!("http://{addr}"), None)
                .await
                .unwrap(),
        );
        let task = tokio::spawn(h1_tailer(ctx.clone(), ep, SseTail::new(ctx.clone(), 0)));
        tokio::time::sleep(Duration::from_millis(500)).await;
        task.abort();
        let n = accepted.load(Ordering::Relaxed);
        assert!((2..=8).contains(&n), "{n} responses in 0.5 s");
        assert_eq!(ctx.counters.snapshot_all().read_errors, 0);
    }

    /// A lost HTTP/2 connection costs every reader on it its stream: one error each, as over
    /// HTTP/1.1 where each has its own connection (before, one error per connection, so the
    /// HTTP/2 rows read `readers / connections` times fewer errors than the HTTP/1.1 ones).
    #[tokio::test]
    async fn a_lost_h2_connection_is_an_error_for_each_of_its_readers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    // Answer the three readers' requests, then drop the connection without a
                    // GOAWAY, as a crashed server or a reset would.
                    let mut held = Vec::new();
                    for _ in 0..3 {
                        let Some(Ok((_req, mut respond))) = conn.accept().await else {
                            return;
                        };
                        let resp = hyper::Response::builder().status(200).body(()).unwrap();
                        held.push(respond.send_response(resp, false).unwrap());
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(20), conn.accept()).await;
                });
            }
        });
        let ctx = super::super::reader::test_ctx(Protocol::Ds);
        let ep = Arc::new(
            Endpoint::resolve(&format!("http://{addr}"), None)
                .await
                .unwrap(),
        );
        let tails = (0..3).map(|i| SseTail::new(ctx.clone(), i)).collect();
        let task = tokio::spawn(h2_tailers(ep, tails));
        let errors = || ctx.counters.snapshot_all().read_errors;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while errors() == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The next session starts only after the 100 ms pause: what is counted now is the
        // first connection's loss.
        tokio::time::sleep(Duration::from_millis(30)).await;
        task.abort();
        assert_eq!(errors(), 3, "one error per reader on the lost connection");
    }

    /// An SSE read answered 307 by a node that does not own the stream is reopened at
    /// `Location` on the owner, with the bearer token (it used to count as a read error).
    #[tokio::test]
    async fn a_307_to_the_owner_is_followed_by_an_h1_reader() {
        use super::super::append_conn::tests::one_shot;
        let (owner, owner_req) = one_shot(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 0\r\n\r\n"
                .into(),
        )
        .await;
        let (other, other_req) = one_shot(format!(
            "HTTP/1.1 307 Temporary Redirect\r\n\
             location: http://{owner}/v1/stream/s?offset=now&live=sse\r\n\
             content-length: 0\r\nconnection: close\r\n\r\n"
        ))
        .await;
        let ctx = super::super::reader::test_ctx(Protocol::Ds);
        let ep = Endpoint::resolve(&format!("http://{other}"), Some("t0ken"))
            .await
            .unwrap();
        let mut tail = SseTail::new(ctx.clone(), 0);
        let r = tokio::time::timeout(Duration::from_secs(10), h1_session(&ep, &mut tail))
            .await
            .unwrap();
        assert_eq!(r, Ok(()));
        let first = other_req.await.unwrap();
        let second = owner_req.await.unwrap().to_ascii_lowercase();
        assert!(first.starts_with("GET /"), "{first}");
        assert!(
            second.starts_with("get /v1/stream/s?offset=now&live=sse "),
            "{second}"
        );
        assert!(second.contains(&format!("host: {owner}")), "{second}");
        assert!(second.contains("authorization: bearer t0ken"), "{second}");
    }

    /// What an HTTP/2 fake server saw: connections accepted, and each request's
    /// `(connection number, path and query, authorization)`.
    #[derive(Default)]
    struct Seen {
        connections: AtomicUsize,
        requests: std::sync::Mutex<Vec<(usize, String, String)>>,
    }

    impl Seen {
        fn requests(&self) -> Vec<(usize, String, String)> {
            self.requests.lock().unwrap().clone()
        }
    }

    /// An HTTP/2 server on 127.0.0.1 answering each request with `answer(path and query)`
    /// (headers only, the response held open); the first connection is dropped after
    /// `drop_first_after` requests, without a GOAWAY, if given.
    async fn h2_server(
        answer: impl Fn(&str) -> hyper::Response<()> + Send + Sync + 'static,
        drop_first_after: Option<usize>,
    ) -> (SocketAddr, Arc<Seen>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let answer = Arc::new(answer);
        let counted = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let conn_no = counted.connections.fetch_add(1, Ordering::SeqCst);
                let limit = drop_first_after.filter(|_| conn_no == 0);
                let (seen, answer) = (counted.clone(), answer.clone());
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    let mut held = Vec::new();
                    while limit.is_none_or(|n| held.len() < n) {
                        let Some(Ok((req, mut respond))) = conn.accept().await else {
                            return;
                        };
                        let pq = req.uri().path_and_query().unwrap().to_string();
                        let auth = req
                            .headers()
                            .get(AUTHORIZATION)
                            .map(|v| v.to_str().unwrap().to_string())
                            .unwrap_or_default();
                        seen.requests
                            .lock()
                            .unwrap()
                            .push((conn_no, pq.clone(), auth));
                        held.push(respond.send_response(answer(&pq), false).unwrap());
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(20), conn.accept()).await;
                });
            }
        });
        (addr, seen)
    }

    /// Waits (10 s at most) until `done`.
    async fn until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// HTTP/2 SSE readers answered 307 by a node that does not own their stream open it on the
    /// owner, all on one connection there and with the token (a 307 used to count as a read
    /// error). When the owner's connection is lost, each counts one error and asks the
    /// endpoint again, which redirects again.
    #[tokio::test]
    async fn h2_readers_follow_a_307_to_the_owner_on_one_connection_there() {
        let (owner, at_owner) = h2_server(
            |_| {
                hyper::Response::builder()
                    .status(200)
                    .header("content-type", "text/event-stream")
                    .body(())
                    .unwrap()
            },
            Some(3),
        )
        .await;
        let (other, at_other) = h2_server(
            move |pq| {
                hyper::Response::builder()
                    .status(307)
                    .header("location", format!("http://{owner}{pq}"))
                    .body(())
                    .unwrap()
            },
            None,
        )
        .await;
        let ctx = super::super::reader::test_ctx(Protocol::Ds);
        let ep = Arc::new(
            Endpoint::resolve(&format!("http://{other}"), Some("t0ken"))
                .await
                .unwrap(),
        );
        let tails = (0..3).map(|i| SseTail::new(ctx.clone(), i)).collect();
        let task = tokio::spawn(h2_tailers(ep, tails));
        until("3 readers connected on the owner", || {
            ctx.readers_connected.load(Ordering::Relaxed) == 3
        })
        .await;
        let opened = at_owner.requests();
        assert_eq!(opened.len(), 3, "{opened:?}");
        for (conn, pq, auth) in &opened {
            assert_eq!(*conn, 0, "one connection to the owner: {opened:?}");
            assert_eq!(pq, "/v1/stream/s?offset=now&live=sse");
            assert_eq!(auth, "Bearer t0ken");
        }
        assert_eq!(at_other.requests().len(), 3);
        assert_eq!(ctx.counters.snapshot_all().read_errors, 0);
        // The owner's first connection drops: one error each, then the endpoint again (after
        // the pause) and a new connection to the owner.
        until("the endpoint asked again", || {
            at_other.requests().len() == 6
        })
        .await;
        until("reopened on the owner", || at_owner.requests().len() == 6).await;
        task.abort();
        assert_eq!(ctx.counters.snapshot_all().read_errors, 3);
        assert!(at_owner.requests()[3..].iter().all(|(conn, ..)| *conn == 1));
        assert_eq!(at_other.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_address_that_accepts_is_chosen() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live = listener.local_addr().unwrap();
        // A port nobody listens on: bound, then released.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        assert_eq!(reachable(&[dead_addr, live]).await, Some(live));
        assert_eq!(reachable(&[dead_addr]).await, Some(dead_addr));
        assert_eq!(reachable(&[]).await, None);
    }
}
