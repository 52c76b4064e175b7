//! A TCP proxy in front of Postgres that a test can cut or hang, to play a lost connection
//! or a server that stopped answering. Binds 127.0.0.1 on a free port; stops with the test.
//! Shared with `pico-wal-pg`'s tests (included there by path).
#![allow(dead_code)]

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Bytes flow both ways.
    Forward,
    /// Every connection is closed, new ones closed as soon as accepted: a restarted server.
    Cut,
    /// Connections stay open but nothing is forwarded (bytes are held until resumed): a
    /// server or network that stopped answering.
    Hang,
}

pub struct PgProxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// See [`PgProxy::hold_containing`].
    hold: watch::Sender<Option<Vec<u8>>>,
    accept: JoinHandle<()>,
}

impl PgProxy {
    /// Starts forwarding to the host and port of `url` (a postgres:// URL).
    pub async fn start(url: &str) -> PgProxy {
        let target = target_of(url);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode, _) = watch::channel(Mode::Forward);
        let (hold, _) = watch::channel(None);
        let rx = mode.subscribe();
        let held = hold.subscribe();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *rx.borrow() == Mode::Cut {
                    continue; // dropped: closed at once
                }
                tokio::spawn(relay(client, target.clone(), rx.clone(), held.clone()));
            }
        });
        PgProxy {
            addr,
            mode,
            hold,
            accept,
        }
    }

    /// `url` pointed at the proxy instead of the server.
    pub fn url(&self, url: &str) -> String {
        let target = target_of(url);
        url.replacen(&target, &self.addr.to_string(), 1)
    }

    pub fn cut(&self) {
        self.mode.send_replace(Mode::Cut);
    }

    pub fn hang(&self) {
        self.mode.send_replace(Mode::Hang);
    }

    pub fn resume(&self) {
        self.mode.send_replace(Mode::Forward);
    }

    /// From now on, a client-to-server chunk containing `marker` is held (everything else
    /// flows) until [`PgProxy::release`], and then delivered even if its client has gone: a
    /// statement the network delays past its client's deadline.
    pub fn hold_containing(&self, marker: &[u8]) {
        self.hold.send_replace(Some(marker.to_vec()));
    }

    pub fn release(&self) {
        self.hold.send_replace(None);
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Cut);
        self.accept.abort();
    }
}

/// `host:port` of a postgres:// URL (port 5432 if none).
fn target_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hostport = rest.split(['/', '?']).next().unwrap_or(rest);
    if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:5432")
    }
}

async fn relay(
    client: TcpStream,
    target: String,
    mode: watch::Receiver<Mode>,
    hold: watch::Receiver<Option<Vec<u8>>>,
) {
    let Ok(server) = TcpStream::connect(&target).await else {
        return;
    };
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // Either direction ending (or a cut) drops both sockets.
    tokio::select! {
        _ = pump(cr, sw, mode.clone(), Some(hold)) => {}
        _ = pump(sr, cw, mode, None) => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    mut hold: Option<watch::Receiver<Option<Vec<u8>>>>,
) {
    let mut cut = mode.clone();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = cut.wait_for(|m| *m == Mode::Cut) => return,
        };
        // A held chunk is not read past, so its client's close is noticed only after it went.
        if let Some(hold) = hold.as_mut() {
            let _ = hold
                .wait_for(|m| {
                    m.as_ref()
                        .is_none_or(|m| !buf[..n].windows(m.len()).any(|w| w == &m[..]))
                })
                .await;
        }
        // Held while hanging; dropped with the connection on a cut.
        match mode.wait_for(|m| *m != Mode::Hang).await.map(|m| *m) {
            Ok(Mode::Forward) => {}
            _ => return,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
