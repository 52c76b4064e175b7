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

use super::sse_conn::{Endpoint, driving};
use super::target::refused;
use bytes::Bytes;
use futures::FutureExt;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::sync::Arc;
use tokio::net::TcpStream;

type Conn = Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// A keep-alive connection, opened on first use and again after the server closes it.
pub struct Appender {
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
        Appender { ep, conn: None }
    }

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

    /// `POST url` with `body`; Ok once the server answered 2xx. Not retried: a failure is the
    /// bench's to count, and the next request starts on a fresh connection.
    pub async fn append(
        &mut self,
        url: &str,
        body: Bytes,
        content_type: &'static str,
    ) -> Result<(), String> {
        let mut req = self.ep.request(url, Full::new(body), true)?;
        *req.method_mut() = hyper::Method::POST;
        req.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        let result = self.exchange(req).await;
        // Any failure, a refusal included, drops the connection: the server may have closed
        // it (it does after a 413) and errors are rare here.
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    /// One request on the open connection, opening one first if needed.
    async fn exchange(&mut self, req: Request<Full<Bytes>>) -> Result<(), String> {
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
        let body = driving(c.conn.as_mut(), &mut c.done, resp.into_body().collect())
            .await?
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        if status.is_success() {
            Ok(())
        } else {
            Err(refused(status, &body))
        }
    }
}

#[cfg(test)]
mod tests {
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
