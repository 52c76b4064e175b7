//! The listener: one task per connection, reading length-prefixed frames and answering them in
//! order, one at a time (as a Kafka broker does: a connection's next request is read once the
//! previous one is answered).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use crate::broker::{Broker, Reply};

/// Accepts connections until `stop` turns true.
pub async fn serve(listener: TcpListener, broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(broker.options().max_connections.max(1)));
    // Group deadlines are on the node's clock; this only decides how often they are checked.
    let ticker = {
        let broker = broker.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(TICK) => broker.coordinator().tick(),
                    _ = stop.changed() => return,
                }
            }
        })
    };
    let _ticker = AbortOnDrop(ticker);
    // Other nodes list this one in Metadata once its address is in the metadata log.
    let advertiser = {
        let broker = broker.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut delay = std::time::Duration::from_millis(100);
            loop {
                match broker.advertise().await {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(error = %e, "kafka address not stored yet, retrying"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.changed() => return,
                }
                delay = (delay * 2).min(std::time::Duration::from_secs(5));
            }
        })
    };
    let _advertiser = AbortOnDrop(advertiser);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = stop.changed() => return,
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let (socket, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "kafka accept failed");
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let broker = broker.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(socket, broker, stop).await {
                tracing::debug!(%peer, error = %e, "kafka connection closed");
            }
            drop(permit);
        });
    }
}

/// How often group deadlines are checked.
const TICK: std::time::Duration = std::time::Duration::from_millis(100);

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame length invalid: {0}")]
    FrameLength(i64),
    #[error("request refused: {0}")]
    Refused(String),
}

/// Serves one connection until the peer closes it, a frame is malformed, or the node stops.
pub async fn connection(
    mut socket: TcpStream,
    broker: Arc<Broker>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    let opts = broker.options().clone();
    loop {
        let mut len = [0u8; 4];
        tokio::select! {
            r = socket.read_exact(&mut len) => match r {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e.into()),
            },
            _ = stop.changed() => return Ok(()),
        }
        let len = i32::from_be_bytes(len);
        // The smallest request is its header: key, version, correlation id, client id length.
        if len < 10 || len as usize > opts.max_frame {
            return Err(ConnError::FrameLength(i64::from(len)));
        }
        let len = len as usize;
        let mut frame = BytesMut::zeroed(2);
        socket.read_exact(&mut frame[..]).await?;
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        if key != kafka_protocol::messages::ApiKey::Produce as i16 && len > opts.max_small_frame {
            return Err(ConnError::FrameLength(len as i64));
        }
        frame.resize(len, 0);
        socket.read_exact(&mut frame[2..]).await?;
        match broker.handle(frame.freeze()).await {
            Reply::Send(bytes) => write_frame(&mut socket, bytes).await?,
            Reply::None => {}
            Reply::Close(why) => return Err(ConnError::Refused(why)),
        }
    }
}

async fn write_frame(socket: &mut TcpStream, body: Bytes) -> Result<(), ConnError> {
    let len = i32::try_from(body.len()).map_err(|_| ConnError::FrameLength(body.len() as i64))?;
    socket.write_all(&len.to_be_bytes()).await?;
    socket.write_all(&body).await?;
    Ok(())
}
