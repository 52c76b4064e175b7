//! The listener: one task per connection, reading length-prefixed frames and answering them in
//! order. Produce requests are pipelined within a bounded window (librdkafka keeps up to
//! `max.in.flight` of them outstanding per connection); every other request is answered alone.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use crate::broker::{Broker, Produced, Reply, Started};

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
///
/// Produce requests are pipelined: a reader admits each one (its batches get their offsets,
/// in request order) and goes on to the next while a writer waits for their writes and
/// answers, strictly in request order. The window is bounded in requests and bytes; any other
/// request waits until every earlier one is answered, then is answered in turn. A malformed
/// frame ends the connection after the answers to the requests before it.
pub async fn connection(
    mut socket: TcpStream,
    broker: Arc<Broker>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    let depth = broker
        .options()
        .max_in_flight
        .clamp(1, Semaphore::MAX_PERMITS.min(1 << 16));
    let (rd, wr) = socket.split();
    let (tx, rx) = mpsc::channel(depth);
    let reading = read_requests(rd, &broker, tx, depth);
    let writing = write_replies(wr, &broker, rx);
    tokio::select! {
        r = async { tokio::try_join!(reading, writing) } => r.map(|_| ()),
        // Answers still waiting are dropped: their writes go on (or fail) without them.
        _ = stop.changed() => Ok(()),
    }
}

/// A request read (and, a Produce, admitted), waiting for its turn to be answered.
struct Queued {
    answer: Answer,
    /// Its share of the connection's window (a request slot, the others' slots for anything
    /// but a Produce, its bytes), given back once it is answered.
    _window: Window,
}

type Window = (
    OwnedSemaphorePermit,
    Option<OwnedSemaphorePermit>,
    Option<OwnedSemaphorePermit>,
);

enum Answer {
    Reply(Reply),
    Produce(Produced),
    /// The connection ends here, after every earlier answer.
    Fail(ConnError),
}

/// Reads frames and admits them in order, within the window.
async fn read_requests(
    mut rd: ReadHalf<'_>,
    broker: &Broker,
    tx: mpsc::Sender<Queued>,
    depth: usize,
) -> Result<(), ConnError> {
    let opts = broker.options();
    let slots = Arc::new(Semaphore::new(depth));
    let budget = opts
        .max_in_flight_bytes
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let bytes = Arc::new(Semaphore::new(budget));
    // Neither semaphore is ever closed.
    let closed = |_| ConnError::Refused("connection window closed".into());
    loop {
        let slot = slots.clone().acquire_owned().await.map_err(closed)?;
        let mut len = [0u8; 4];
        match rd.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let len = i32::from_be_bytes(len);
        let fail = |e: ConnError, slot| Queued {
            answer: Answer::Fail(e),
            _window: (slot, None, None),
        };
        // The smallest request is its header: key, version, correlation id, client id length.
        if len < 10 || len as usize > opts.max_frame {
            let _ = tx
                .send(fail(ConnError::FrameLength(i64::from(len)), slot))
                .await;
            return Ok(());
        }
        let len = len as usize;
        let mut frame = BytesMut::zeroed(2);
        rd.read_exact(&mut frame[..]).await?;
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let produce = key == kafka_protocol::messages::ApiKey::Produce as i16;
        if !produce && len > opts.max_small_frame {
            let _ = tx
                .send(fail(ConnError::FrameLength(len as i64), slot))
                .await;
            return Ok(());
        }
        // Anything but a Produce is handled once every earlier request is answered: it sees
        // their effects, and only Produce answers wait on storage.
        let rest = if produce || depth == 1 {
            None
        } else {
            Some(
                slots
                    .clone()
                    .acquire_many_owned((depth - 1) as u32)
                    .await
                    .map_err(closed)?,
            )
        };
        let held = bytes
            .clone()
            .acquire_many_owned(len.min(budget) as u32)
            .await
            .map_err(closed)?;
        frame.resize(len, 0);
        rd.read_exact(&mut frame[2..]).await?;
        let answer = match broker.start(frame.freeze()).await {
            Started::Done(reply) => Answer::Reply(reply),
            Started::Produce(p) => Answer::Produce(p),
        };
        let last = matches!(answer, Answer::Reply(Reply::Close(_)));
        let queued = Queued {
            answer,
            _window: (slot, rest, Some(held)),
        };
        // The writer stopped: it ended the connection with its own error.
        if tx.send(queued).await.is_err() || last {
            return Ok(());
        }
    }
}

/// Answers the queued requests in order.
async fn write_replies(
    mut wr: WriteHalf<'_>,
    broker: &Broker,
    mut rx: mpsc::Receiver<Queued>,
) -> Result<(), ConnError> {
    while let Some(Queued { answer, _window }) = rx.recv().await {
        let reply = match answer {
            Answer::Reply(reply) => reply,
            Answer::Produce(p) => broker.finish(p).await,
            Answer::Fail(e) => return Err(e),
        };
        match reply {
            Reply::Send(bytes) => write_frame(&mut wr, bytes).await?,
            Reply::None => {}
            Reply::Close(why) => return Err(ConnError::Refused(why)),
        }
    }
    Ok(())
}

/// Bodies up to this size go out with their length prefix in one write.
const COPY_MAX: usize = 16 << 10;

async fn write_frame(wr: &mut WriteHalf<'_>, body: Bytes) -> Result<(), ConnError> {
    let len = i32::try_from(body.len()).map_err(|_| ConnError::FrameLength(body.len() as i64))?;
    if body.len() <= COPY_MAX {
        let mut buf = BytesMut::with_capacity(4 + body.len());
        buf.extend_from_slice(&len.to_be_bytes());
        buf.extend_from_slice(&body);
        wr.write_all(&buf).await?;
    } else {
        wr.write_all(&len.to_be_bytes()).await?;
        wr.write_all(&body).await?;
    }
    Ok(())
}
