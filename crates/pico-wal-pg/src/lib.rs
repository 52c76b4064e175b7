//! The engine's WAL in Postgres (`--wal postgres://…`).
//!
//! One row per [`Wal::append`] (one engine group commit, all streams) in `pico_wal`, keyed by
//! `(node_id, position)`; the payload is the engine's own WAL entry encoding, so it is
//! checksummed and verified on recovery exactly like the other WALs. `pico_wal_nodes` holds
//! each node's registered epoch and is the fence: every append and trim locks the node's row
//! and fails when a later incarnation registered a higher epoch there, so a zombie process can
//! never add to or delete from the WAL its successor recovers. An append is one statement (the
//! fence folded into the INSERT) on a connection of its own: one round trip, one commit. See
//! `docs/design/wal-postgres.md`.

mod url;

use std::pin::Pin;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use s3stream::format::{self, FormatError};
use s3stream::{Wal, WalError, WalRecord};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Postgres, Transaction};
use tokio::sync::Mutex;
use tokio::time::{Instant, Sleep};

pub use url::{ALLOW_UNSAFE, check_durability, split_allow_unsafe};

/// Pooled connections, for trims, recovery and opening: appends have a connection of their own.
const MAX_CONNECTIONS: u32 = 3;

/// The fenced append, one statement and so one round trip and one implicit transaction: the
/// node's row is read `FOR SHARE` (held to the commit) and a row is inserted only if no higher
/// epoch is registered there. A re-open's epoch update waits for that lock, or, if it committed
/// first, the re-checked row no longer matches and nothing is inserted (no row returned).
/// A plain INSERT: a position is new unless an append at it failed (see [`APPEND_RETRY`]), and
/// an upsert costs Postgres a speculative insertion (more WAL, an extra lock) on every append.
/// A position at or below the trim watermark is never written: a statement that arrives after
/// its position was trimmed (one whose client gave up long ago) inserts nothing.
/// Public so the latency measurement (`tests/latency.rs`) times this very statement.
pub const APPEND: &str = "INSERT INTO pico_wal (node_id, position, node_epoch, payload, attempt)
     SELECT node_id, $2, $3, $4, $5 FROM pico_wal_nodes
         WHERE node_id = $1 AND epoch <= $3 AND trimmed_upto < $2 FOR SHARE
     RETURNING position";

/// [`APPEND`] for a retry after a failed append at the same position, with the same fence: if
/// that failed commit did land, its row is replaced, never kept at a second position. Only a
/// later attempt replaces a row (`attempt`, increasing per statement): an earlier attempt's
/// statement that reaches Postgres late (its client timed out, the network still held it) must
/// not overwrite what a later append, perhaps of other records and acknowledged, wrote there.
const APPEND_RETRY: &str = "INSERT INTO pico_wal (node_id, position, node_epoch, payload, attempt)
     SELECT node_id, $2, $3, $4, $5 FROM pico_wal_nodes
         WHERE node_id = $1 AND epoch <= $3 AND trimmed_upto < $2 FOR SHARE
     ON CONFLICT (node_id, position)
     DO UPDATE SET node_epoch = EXCLUDED.node_epoch, payload = EXCLUDED.payload,
                   attempt = EXCLUDED.attempt
         WHERE pico_wal.attempt < EXCLUDED.attempt
     RETURNING position";

/// How long a WAL statement, and a whole append or trim transaction, may take.
#[derive(Clone, Debug)]
pub struct PgWalOptions {
    /// Server-side `statement_timeout`, and the client-side bound on each append's or trim's
    /// whole transaction (an append's statement gets between 90 % and all of it: one timer
    /// serves all appends, see `Writer::deadline`): a hung Postgres (or a network that stopped answering) fails the
    /// write retryably instead of holding every append behind it forever. A write that timed
    /// out may still have landed; the engine's retry reuses its position, so it is replaced,
    /// never duplicated.
    pub statement_timeout: Duration,
    /// Longest wait for a pooled connection (a new one while Postgres is unreachable).
    pub acquire_timeout: Duration,
}

impl Default for PgWalOptions {
    fn default() -> Self {
        PgWalOptions {
            statement_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// Key of the advisory lock that serializes schema creation across processes.
const SCHEMA_LOCK: i64 = 0x7069_636f_5f77_616c; // "pico_wal"

const SCHEMA: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS pico_wal_nodes (
        node_id INT PRIMARY KEY,
        epoch BIGINT NOT NULL,
        trimmed_upto BIGINT NOT NULL DEFAULT 0
    )",
    "CREATE TABLE IF NOT EXISTS pico_wal (
        node_id INT NOT NULL,
        position BIGINT NOT NULL,
        node_epoch BIGINT NOT NULL,
        payload BYTEA NOT NULL,
        PRIMARY KEY (node_id, position)
    )",
    // The statement that wrote the row ([`APPEND_RETRY`]); tables created before it have 0.
    "ALTER TABLE pico_wal ADD COLUMN IF NOT EXISTS attempt BIGINT NOT NULL DEFAULT 0",
];

#[derive(Debug, thiserror::Error)]
pub enum PgWalError {
    #[error("postgres wal url: {0}")]
    Url(String),
    #[error(
        "postgres wal: the server runs with {setting}={value}, so a crash can lose appends it \
         acknowledged; refusing to use it. Turn {setting} on, or add {ALLOW_UNSAFE}=true to \
         the WAL URL to accept that loss"
    )]
    Unsafe {
        setting: &'static str,
        value: String,
    },
    #[error(
        "postgres wal fenced: node {node_id} is registered at epoch {registered}, above this \
         process's epoch {epoch} (a newer incarnation of the node owns its WAL)"
    )]
    Fenced {
        node_id: u32,
        epoch: i64,
        registered: i64,
    },
    #[error("postgres wal: node {node_id} is not registered (was pico_wal_nodes edited?)")]
    Unregistered { node_id: u32 },
    #[error("postgres wal: epoch {0} is above the largest storable ({max})", max = i64::MAX)]
    EpochRange(u64),
    #[error("postgres wal position {0} is out of range")]
    PositionRange(u64),
    #[error("postgres wal: no answer within {0:?} (the write may or may not have landed)")]
    Timeout(Duration),
    #[error("postgres wal: {0}")]
    Db(#[from] sqlx::Error),
}

impl From<PgWalError> for WalError {
    fn from(e: PgWalError) -> WalError {
        match e {
            PgWalError::Fenced { .. } => WalError::Fenced(e.to_string()),
            other => WalError::Other(other.to_string()),
        }
    }
}

/// A node's WAL in Postgres, fenced by the epoch it was opened at.
pub struct PgWal {
    pool: PgPool,
    /// How the append connection is (re)connected.
    connect: PgConnectOptions,
    node_id: u32,
    epoch: i64,
    opts: PgWalOptions,
    /// Held across each append: appends are serialized, so positions are assigned, committed
    /// and acknowledged in order.
    writer: Mutex<Writer>,
}

/// The append path's state, behind one lock.
struct Writer {
    /// Next position to write.
    next: i64,
    /// An append at `next` failed, or was dropped mid-statement: it may have committed all the
    /// same (an answer lost), so the next one at `next` must replace that row rather than
    /// collide with it.
    retrying: bool,
    /// The last statement's attempt number ([`APPEND_RETRY`]); each append statement takes the
    /// next. Started at open from the wall clock in µs, above every number stored, so that a
    /// late statement of an earlier process of this node at the same epoch (a restart at an
    /// explicit `--node-epoch`) is older too: it sent fewer statements than µs went by.
    attempt: i64,
    /// The append connection: not pooled, so an append costs no acquire (no liveness ping,
    /// no hand-back task) and its prepared statement stays warm. Dropped after any failed
    /// append (its state is unknown) and reconnected by the next one.
    conn: Option<PgConnection>,
    /// The client-side bound on an append's statement: one timer for all appends, moved
    /// later only when less than [`REARM_BELOW`] of `statement_timeout` is left, so a busy
    /// writer does not insert and remove a timer-wheel entry per append (a `timeout` per
    /// statement did: ~2k of the node's ~73k instructions per append). An idle writer's
    /// timer fires once, and wakes the last appender's task for nothing.
    deadline: Pin<Box<Sleep>>,
}

/// [`Writer::deadline`] is moved to `statement_timeout` from now when less than this fraction
/// of it is left: a statement gets between 90 % and all of `statement_timeout`, and the timer
/// moves once per tenth of it at most.
const REARM_BELOW: f64 = 0.9;

impl Writer {
    /// The deadline for a statement starting now: at most `limit` away, at least
    /// [`REARM_BELOW`] of it.
    fn deadline(&mut self, limit: Duration) -> Pin<&mut Sleep> {
        let now = Instant::now();
        if self.deadline.deadline() < now + limit.mul_f64(REARM_BELOW) {
            self.deadline.as_mut().reset(now + limit);
        }
        self.deadline.as_mut()
    }
}

impl PgWal {
    /// Connects, creates the schema if missing, checks the server is durable (unless the URL
    /// says `allowUnsafe=true`), and registers `node_epoch` for `node_id`: from then on an
    /// older incarnation's appends fail. Refuses if a higher epoch is already registered.
    pub async fn open(url: &str, node_id: u32, node_epoch: u64) -> Result<PgWal, PgWalError> {
        PgWal::open_with(url, node_id, node_epoch, PgWalOptions::default()).await
    }

    /// [`PgWal::open`] with explicit timeouts.
    pub async fn open_with(
        url: &str,
        node_id: u32,
        node_epoch: u64,
        opts: PgWalOptions,
    ) -> Result<PgWal, PgWalError> {
        let (url, allow_unsafe) = split_allow_unsafe(url)?;
        let epoch = i64::try_from(node_epoch).map_err(|_| PgWalError::EpochRange(node_epoch))?;
        let options = PgConnectOptions::from_str(&url)
            .map_err(|e| PgWalError::Url(format!("`{}`: {e}", pico_common::uri::redact(&url))))?
            .options([(
                "statement_timeout",
                format!("{}ms", opts.statement_timeout.as_millis().max(1)),
            )]);
        // Connections that died with the server are replaced at the next acquire.
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(opts.acquire_timeout)
            .connect_with(options.clone())
            .await?;
        Self::check_server(&pool, allow_unsafe).await?;
        create_schema(&pool).await?;

        let node = i32::try_from(node_id).map_err(|_| {
            PgWalError::Url(format!("node id {node_id} does not fit a Postgres INT"))
        })?;
        // Registers the epoch unless a higher one is there; equal re-registers (a restart at an
        // explicit `--node-epoch`). Committed before positions are read: an older incarnation's
        // append still in flight holds the row and commits first, so recovery sees it.
        let registered: Option<i64> = sqlx::query_scalar(
            "INSERT INTO pico_wal_nodes (node_id, epoch) VALUES ($1, $2)
             ON CONFLICT (node_id) DO UPDATE SET epoch = EXCLUDED.epoch
                 WHERE pico_wal_nodes.epoch <= EXCLUDED.epoch
             RETURNING epoch",
        )
        .bind(node)
        .bind(epoch)
        .fetch_optional(&pool)
        .await?;
        if registered.is_none() {
            let registered: i64 =
                sqlx::query_scalar("SELECT epoch FROM pico_wal_nodes WHERE node_id = $1")
                    .bind(node)
                    .fetch_one(&pool)
                    .await?;
            return Err(PgWalError::Fenced {
                node_id,
                epoch,
                registered,
            });
        }
        // Positions continue after the highest ever written, even when all were trimmed.
        let (last, last_attempt): (i64, i64) = sqlx::query_as(
            "SELECT GREATEST(
                 (SELECT trimmed_upto FROM pico_wal_nodes WHERE node_id = $1),
                 (SELECT COALESCE(MAX(position), 0) FROM pico_wal WHERE node_id = $1)),
                 (SELECT COALESCE(MAX(attempt), 0) FROM pico_wal WHERE node_id = $1)",
        )
        .bind(node)
        .fetch_one(&pool)
        .await?;
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX / 2));
        tracing::info!(
            node_id,
            epoch,
            next_position = last + 1,
            "postgres WAL opened"
        );
        Ok(PgWal {
            pool,
            connect: options,
            node_id,
            epoch,
            opts,
            writer: Mutex::new(Writer {
                next: last + 1,
                retrying: false,
                attempt: now_us.max(last_attempt),
                conn: None,
                deadline: Box::pin(tokio::time::sleep_until(Instant::now())),
            }),
        })
    }

    async fn check_server(pool: &PgPool, allow_unsafe: bool) -> Result<(), PgWalError> {
        let fsync: String = sqlx::query_scalar("SHOW fsync").fetch_one(pool).await?;
        let sync_commit: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(pool)
            .await?;
        check_durability(&fsync, &sync_commit, allow_unsafe)
    }

    /// The node id as stored (checked to fit at open).
    fn node(&self) -> i32 {
        self.node_id as i32
    }

    /// Locks the node's row for this transaction and fails if a higher epoch is registered:
    /// a re-open at a higher epoch waits for this transaction, or this one sees its epoch.
    async fn fence(&self, tx: &mut Transaction<'_, Postgres>) -> Result<(), PgWalError> {
        let registered: Option<i64> =
            sqlx::query_scalar("SELECT epoch FROM pico_wal_nodes WHERE node_id = $1 FOR SHARE")
                .bind(self.node())
                .fetch_optional(&mut **tx)
                .await?;
        match registered {
            None => Err(PgWalError::Unregistered {
                node_id: self.node_id,
            }),
            Some(r) if r > self.epoch => Err(PgWalError::Fenced {
                node_id: self.node_id,
                epoch: self.epoch,
                registered: r,
            }),
            Some(_) => Ok(()),
        }
    }

    /// A pooled connection, within `statement_timeout` (the pool tests an idle one first, so
    /// a server that stopped answering times out here).
    async fn acquire(&self) -> Result<PoolConnection<Postgres>, PgWalError> {
        let limit = self.opts.statement_timeout;
        match tokio::time::timeout(limit, self.pool.acquire()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(sqlx::Error::PoolTimedOut)) => {
                Err(PgWalError::Timeout(self.opts.acquire_timeout.min(limit)))
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(PgWalError::Timeout(limit)),
        }
    }

    /// The error for a write that ran out of time. Its connection is in an unknown state (a
    /// query half-sent, no answer): closed, never returned to the pool.
    fn abandon(&self, conn: PoolConnection<Postgres>) -> PgWalError {
        drop(conn.detach());
        PgWalError::Timeout(self.opts.statement_timeout)
    }

    /// Writes `payload` at `position` on the append connection (connected first if needed),
    /// within `statement_timeout` for the connect and again for the statement. On any failure
    /// the connection is dropped: a timed-out one has a query half-sent and no answer, and a
    /// broken one would fail again; the next append connects afresh.
    async fn insert(
        &self,
        writer: &mut Writer,
        position: i64,
        payload: &[u8],
    ) -> Result<(), PgWalError> {
        let limit = self.opts.statement_timeout;
        let mut conn = match writer.conn.take() {
            Some(conn) => conn,
            // Statements are not logged: this one runs per group commit.
            None => match tokio::time::timeout(
                limit,
                self.connect.clone().disable_statement_logging().connect(),
            )
            .await
            {
                Ok(conn) => conn?,
                Err(_) => return Err(PgWalError::Timeout(limit)),
            },
        };
        let sql = if writer.retrying {
            APPEND_RETRY
        } else {
            APPEND
        };
        // Until it answers, the statement may land or not: a retry, or an append after this
        // future was dropped, replaces its row.
        writer.retrying = true;
        writer.attempt += 1;
        let write = sqlx::query_scalar::<_, i64>(sql)
            .bind(self.node())
            .bind(position)
            .bind(self.epoch)
            .bind(payload)
            .bind(writer.attempt)
            .fetch_optional(&mut conn);
        let deadline = writer.deadline(limit);
        let inserted = tokio::select! {
            biased;
            r = write => r?,
            () = deadline => return Err(PgWalError::Timeout(limit)),
        };
        writer.conn = Some(conn);
        match inserted {
            Some(_) => Ok(()),
            // Nothing written: a higher epoch is registered, the row is gone, or (only for a
            // process at this epoch beside another) a later attempt holds the position.
            None => Err(self.why_not_inserted().await),
        }
    }

    /// Why the fenced INSERT matched no row (rare: read on a pooled connection).
    async fn why_not_inserted(&self) -> PgWalError {
        let read =
            sqlx::query_scalar::<_, i64>("SELECT epoch FROM pico_wal_nodes WHERE node_id = $1")
                .bind(self.node())
                .fetch_optional(&self.pool);
        match tokio::time::timeout(self.opts.statement_timeout, read).await {
            Ok(Ok(Some(registered))) if registered > self.epoch => PgWalError::Fenced {
                node_id: self.node_id,
                epoch: self.epoch,
                registered,
            },
            Ok(Ok(None)) => PgWalError::Unregistered {
                node_id: self.node_id,
            },
            // The epoch read back is ours (it cannot go down): the fence did not refuse, so a
            // later attempt holds the position (another process at this epoch) or it is trimmed.
            Ok(Ok(Some(registered))) => PgWalError::Db(sqlx::Error::Protocol(format!(
                "append wrote nothing though epoch {registered} is registered: a later attempt \
                 holds the position (another process at this node id and epoch?) or it is \
                 trimmed"
            ))),
            Ok(Err(e)) => e.into(),
            Err(_) => PgWalError::Timeout(self.opts.statement_timeout),
        }
    }

    async fn delete_upto(&self, upto: i64) -> Result<(), PgWalError> {
        let mut conn = self.acquire().await?;
        let write = self.delete_upto_on(&mut conn, upto);
        match tokio::time::timeout(self.opts.statement_timeout, write).await {
            Ok(r) => r,
            Err(_) => Err(self.abandon(conn)),
        }
    }

    async fn delete_upto_on(
        &self,
        conn: &mut sqlx::PgConnection,
        upto: i64,
    ) -> Result<(), PgWalError> {
        use sqlx::Connection;
        let mut tx = conn.begin().await?;
        self.fence(&mut tx).await?;
        sqlx::query("DELETE FROM pico_wal WHERE node_id = $1 AND position <= $2")
            .bind(self.node())
            .bind(upto)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE pico_wal_nodes SET trimmed_upto = GREATEST(trimmed_upto, $2)
             WHERE node_id = $1",
        )
        .bind(self.node())
        .bind(upto)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Creates the tables once: concurrent `CREATE TABLE IF NOT EXISTS` can still collide, so
/// schema creation runs under a transaction-scoped advisory lock.
async fn create_schema(pool: &PgPool) -> Result<(), PgWalError> {
    let mut tx = pool.begin().await?;
    // Quiet the "already exists, skipping" notices of every open after the first.
    sqlx::query("SET LOCAL client_min_messages = warning")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(SCHEMA_LOCK)
        .execute(&mut *tx)
        .await?;
    for stmt in SCHEMA {
        sqlx::query(stmt).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

fn position_of(raw: i64) -> u64 {
    // Positions are written from 1 up, so a stored one is never negative.
    u64::try_from(raw).unwrap_or(0)
}

#[async_trait::async_trait]
impl Wal for PgWal {
    /// Opening registered this epoch in `pico_wal_nodes`: every earlier process's insert fails.
    fn fences_earlier_writers(&self) -> bool {
        true
    }

    async fn append(&self, records: Vec<WalRecord>) -> Result<u64, WalError> {
        let mut writer = self.writer.lock().await;
        let position = writer.next;
        let payload =
            format::encode_wal_entry(position_of(position), &records).map_err(|source| {
                WalError::Corrupt {
                    key: self.key(position),
                    source,
                }
            })?;
        self.insert(&mut writer, position, &payload).await?;
        writer.next = position + 1;
        writer.retrying = false;
        Ok(position_of(position))
    }

    async fn recover(&self) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError> {
        let rows: Vec<(i64, Vec<u8>)> = sqlx::query_as(
            "SELECT position, payload FROM pico_wal WHERE node_id = $1 ORDER BY position",
        )
        .bind(self.node())
        .fetch_all(&self.pool)
        .await
        .map_err(PgWalError::from)?;
        let mut out = Vec::with_capacity(rows.len());
        for (position, payload) in rows {
            let corrupt = |source: FormatError| WalError::Corrupt {
                key: self.key(position),
                source,
            };
            let (stored, records) =
                format::decode_wal_entry(&Bytes::from(payload)).map_err(corrupt)?;
            if i64::try_from(stored).ok() != Some(position) {
                return Err(WalError::PositionMismatch {
                    key: self.key(position),
                    stored,
                });
            }
            out.push((position_of(position), records));
        }
        Ok(out)
    }

    async fn trim(&self, upto: u64) -> Result<(), WalError> {
        let upto = i64::try_from(upto).map_err(|_| PgWalError::PositionRange(upto))?;
        Ok(self.delete_upto(upto).await?)
    }
}

impl PgWal {
    /// How an entry is named in errors.
    fn key(&self, position: i64) -> String {
        format!("pico_wal node_id={} position={position}", self.node_id)
    }

    /// The epoch this WAL writes at.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_statement_deadline_moves_only_when_most_of_it_is_spent() {
        let mut w = Writer {
            next: 1,
            retrying: false,
            attempt: 0,
            conn: None,
            deadline: Box::pin(tokio::time::sleep_until(Instant::now())),
        };
        let limit = Duration::from_secs(100);
        let first = w.deadline(limit).deadline();
        assert!(
            first >= Instant::now() + limit.mul_f64(REARM_BELOW),
            "armed a limit away"
        );
        assert!(first <= Instant::now() + limit);
        assert_eq!(
            w.deadline(limit).deadline(),
            first,
            "not moved while most of the limit is left"
        );
        // Less than 90 % left (as after a long idle or a slow statement): moved a limit away.
        let half = Instant::now() + limit / 2;
        w.deadline.as_mut().reset(half);
        let moved = w.deadline(limit).deadline();
        assert!(moved > half);
        assert!(moved >= Instant::now() + limit.mul_f64(REARM_BELOW));
    }
}
