//! The HTTP floor for `docs/performance.md`: a hyper server whose handler reads the request
//! body and answers an empty 200, over HTTP/1.1 or h2c. Whatever a PicoMQ append costs above
//! this is PicoMQ's own work.
//!
//! `cargo run --release -p pico-cli --example hello_hyper -- 127.0.0.1:47400`

use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use std::convert::Infallible;
use std::pin::Pin;

async fn handle(req: Request<Incoming>) -> Result<Response<String>, Infallible> {
    let mut body = req.into_body();
    // Drain the body so keep-alive connections stay usable.
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if frame.is_err() {
            break;
        }
    }
    Ok(Response::new(String::new()))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:47400".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("hello_hyper listening on {addr}");
    loop {
        let (sock, _) = listener.accept().await?;
        sock.set_nodelay(true)?;
        tokio::spawn(async move {
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(sock), service_fn(handle))
                .await;
        });
    }
}
