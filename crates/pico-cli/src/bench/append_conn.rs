//! The plain append loops' HTTP/1.1 connections: one socket per loop, driven by hyper's
//! connection API in the loop's own task.
//!
//! The bench shares the machine with the server it measures, so its CPU per request is taken
//! from the server. Through reqwest an append cost the client ≈ 70 µs here (`perf`: URL
//! parsing with IDNA, the pool's checkout and a hand-off to the connection's task, header
//! maps built and dropped per request); this path keeps the socket, the `Host` and content
//! type headers, and sends only a path, a body and those headers.
//!
//! Over HTTP/2 (streams multiplexed on shared connections) the loops keep reqwest.
//!
//! A `307`/`308` (a node that does not own the stream points at its owner) is followed: the
//! same request (method, body, content type, `Authorization`) goes to `Location` on a
//! keep-alive connection of its own to that node, at most [`MAX_REDIRECTS`] hops, as
//! `bench::redirect` does for reqwest. The next append starts at the bench's endpoint again
//! (the bench measures what a client that does not cache owners sees).

use super::sse_conn::{Endpoint, MAX_REDIRECTS, driving, is_redirect, redirect_target};
use super::target::refused;
use bytes::Bytes;
use futures::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::header::{CONTENT_TYPE, HeaderValue, LOCATION};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use tokio::net::TcpStream;

type Conn = Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// Nodes a loop keeps connections to besides its endpoint (a loop writes one stream at a
/// time, so one or two are normal; past this they are all dropped and reopened on demand).
const MAX_ELSEWHERE: usize = 8;

/// The append loop's connections: to the bench's endpoint, and to the nodes redirects
/// pointed at, keyed by `host:port`.
pub struct Appender {
    home: NodeConn,
    elsewhere: HashMap<String, NodeConn>,
}

/// What one exchange ended with.
enum Sent {
    Ok,
    /// A redirect to `(authority, url)`.
    Redirect(String, String),
}

/// A keep-alive connection, opened on first use and again after the server closes it.
struct NodeConn {
    ep: Arc<Endpoint>,
    conn: Option<Open>,
}

struct Open {
    send: SendRequest<Full<Bytes>>,
    conn: Pin<Box<Conn>>,
    /// The connection future has finished (closed by the server or failed).
    done: bool,
}

impl Appender {
    pub fn new(ep: Arc<Endpoint>) -> Appender {
        Appender {
            home: NodeConn { ep, conn: None },
            elsewhere: HashMap::new(),
        }
    }

    /// `POST url` with `body`, following redirects; Ok once a server answered 2xx. Not
    /// retried: a failure is the bench's to count, and the next request starts on a fresh
    /// connection.
    pub async fn append(
        &mut self,
        url: &str,
        body: Bytes,
        content_type: &'static str,
    ) -> Result<(), String> {
        let mut url = url.to_string();
        let mut at: Option<String> = None;
        for _ in 0..=MAX_REDIRECTS {
            let conn = match &at {
                None => &mut self.home,
                Some(a) => self
                    .elsewhere
                    .get_mut(a)
                    .ok_or_else(|| format!("no connection to {a}"))?,
            };
            match conn.append(&url, body.clone(), content_type).await? {
                Sent::Ok => return Ok(()),
                Sent::Redirect(authority, next) => {
                    url = next;
                    if authority == self.home.ep.authority() {
                        at = None;
                        continue;
                    }
                    if !self.elsewhere.contains_key(&authority) {
                        if self.elsewhere.len() >= MAX_ELSEWHERE {
                            self.elsewhere.clear();
                        }
                        let ep = Arc::new(self.home.ep.at(&authority).await?);
                        self.elsewhere
                            .insert(authority.clone(), NodeConn { ep, conn: None });
                    }
                    at = Some(authority);
                }
            }
        }
        Err(format!("more than {MAX_REDIRECTS} redirects from {url}"))
    }
}

impl NodeConn {
    async fn open(&self) -> Result<Open, String> {
        let tcp = self.ep.connect().await?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        Ok(Open {
            send,
            conn: Box::pin(conn),
            done: false,
        })
    }

    /// `POST url` with `body` on this connection: Ok once the server answered 2xx or a
    /// redirect.
    async fn append(
        &mut self,
        url: &str,
        body: Bytes,
        content_type: &'static str,
    ) -> Result<Sent, String> {
        let mut req = self.ep.request(url, Full::new(body), true)?;
        *req.method_mut() = hyper::Method::POST;
        req.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        let result = self.exchange(url, req).await;
        // Any failure, a refusal included, drops the connection: the server may have closed
        // it (it does after a 413) and errors are rare here.
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    /// One request on the open connection, opening one first if needed.
    async fn exchange(&mut self, url: &str, req: Request<Full<Bytes>>) -> Result<Sent, String> {
        // The connection is polled only during exchanges: one poll now sees a close the server
        // sent while it sat idle, instead of writing the request into a closed socket.
        if let Some(c) = self.conn.as_mut()
            && !c.done
            && c.conn.as_mut().now_or_never().is_some()
        {
            c.done = true;
        }
        if self
            .conn
            .as_ref()
            .is_none_or(|c| c.done || c.send.is_closed())
        {
            self.conn = Some(self.open().await?);
        }
        let Some(c) = self.conn.as_mut() else {
            return Err("no connection".into());
        };
        driving(c.conn.as_mut(), &mut c.done, c.send.ready())
            .await?
            .map_err(|e| format!("connection: {e}"))?;
        let resp = driving(c.conn.as_mut(), &mut c.done, c.send.send_request(req))
            .await?
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status();
        let redirect =
            is_redirect(status).then(|| redirect_target(url, resp.headers().get(LOCATION)));
        let body = driving(c.conn.as_mut(), &mut c.done, resp.into_body().collect())
            .await?
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        match redirect {
            Some(to) => to.map(|(authority, url)| Sent::Redirect(authority, url)),
            None if status.is_success() => Ok(Sent::Ok),
            None => Err(refused(status, &body)),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// A server that answers each connection's one request with `status` and then, when told
    /// on the returned sender, closes the socket without having said so (as an idle timeout
    /// does), reporting the close on the returned receiver.
    async fn one_shot_server(
        status: &'static str,
    ) -> (String, mpsc::Sender<()>, mpsc::Receiver<()>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let (close_tx, mut close_rx) = mpsc::channel::<()>(1);
        let (closed_tx, closed_rx) = mpsc::channel::<()>(16);
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                // Headers, then the 5-byte body of the test's requests.
                while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"hello") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => got.extend_from_slice(&buf[..k]),
                    }
                }
                // A 204 has no body; the refusal carries a message.
                let resp = if status.starts_with("204") {
                    format!("HTTP/1.1 {status}\r\n\r\n")
                } else {
                    format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\n\r\nno")
                };
                let _ = s.write_all(resp.as_bytes()).await;
                if close_rx.recv().await.is_none() {
                    return;
                }
                drop(s);
                let _ = closed_tx.send(()).await;
            }
        });
        (url, close_tx, closed_rx)
    }

    async fn appender(url: &str) -> Appender {
        Appender::new(Arc::new(Endpoint::resolve(url, None).await.unwrap()))
    }

    async fn append(a: &mut Appender, url: &str) -> Result<(), String> {
        tokio::time::timeout(
            Duration::from_secs(10),
            a.append(
                &format!("{url}/s"),
                Bytes::from_static(b"hello"),
                "text/plain",
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("append hung"))
    }

    /// A one-request HTTP/1.1 server answering `answer`; returns its address and the request
    /// it got (headers, then the body its `Content-Length` announces).
    pub(in crate::bench) async fn one_shot(
        answer: String,
    ) -> (String, tokio::task::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            s.write_all(answer.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&got).to_string()
        });
        (addr, task)
    }

    /// A 307 from a node that does not own the stream is followed to `Location` on another
    /// port with the same method, body, content type and bearer token (it used to be counted
    /// as a failed append).
    #[tokio::test]
    async fn a_307_is_followed_to_the_owner_with_body_and_token() {
        let (owner, owner_req) =
            one_shot("HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n".into()).await;
        let (other, other_req) = one_shot(format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{owner}/s?x=1\r\n\
             content-length: 0\r\nconnection: close\r\n\r\n"
        ))
        .await;
        let url = format!("http://{other}");
        let ep = Endpoint::resolve(&url, Some("t0ken")).await.unwrap();
        let mut a = Appender::new(Arc::new(ep));
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            a.append(
                &format!("{url}/s?x=1"),
                Bytes::from_static(b"hello"),
                "text/plain",
            ),
        )
        .await
        .unwrap();
        assert_eq!(sent, Ok(()));
        let first = other_req.await.unwrap();
        let second = owner_req.await.unwrap().to_ascii_lowercase();
        assert!(first.starts_with("POST /s?x=1 "), "{first}");
        assert!(second.starts_with("post /s?x=1 "), "{second}");
        assert!(second.contains(&format!("host: {owner}")), "{second}");
        assert!(second.contains("authorization: bearer t0ken"), "{second}");
        assert!(second.contains("content-type: text/plain"), "{second}");
        assert!(second.ends_with("hello"), "{second}");
    }

    /// Redirects that never end are an error after a bounded number of hops.
    #[tokio::test]
    async fn redirect_hops_are_bounded() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = served.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.ends_with(b"hello") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => got.extend_from_slice(&buf[..k]),
                    }
                }
                let resp = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://{addr}/s\r\n\
                     content-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        let url = format!("http://{addr}");
        let mut a = appender(&url).await;
        let e = append(&mut a, &url).await.unwrap_err();
        assert!(e.contains("redirects"), "{e}");
        assert_eq!(
            served.load(std::sync::atomic::Ordering::Relaxed),
            MAX_REDIRECTS + 1
        );
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced() {
        let (url, close, mut closed) = one_shot_server("204 No Content").await;
        let mut a = appender(&url).await;
        for i in 0..5 {
            assert_eq!(append(&mut a, &url).await, Ok(()), "append {i}");
            // The server closes the idle connection before the next request.
            close.send(()).await.unwrap();
            closed.recv().await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_refusal_is_an_error_with_the_status_and_body() {
        let (url, close, mut closed) = one_shot_server("413 Payload Too Large").await;
        let mut a = appender(&url).await;
        for _ in 0..2 {
            let e = append(&mut a, &url).await.unwrap_err();
            assert!(e.contains("413") && e.ends_with("no"), "{e}");
            close.send(()).await.unwrap();
            closed.recv().await.unwrap();
        }
    }
}
