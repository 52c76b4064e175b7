//! The client commands: data on stdout, notes on stderr.

use crate::cli::ReadFormat;
use anyhow::{Context, anyhow, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use pico_client::{
    BatchRecord, Client, ClientError, IdempotentProducer, InFlight, ProducerConfig, ReadChunk,
    ReadRecord, StreamMeta,
};
use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::io::Write;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::sync::mpsc;

/// Batches read ahead of the request in flight: stdin is read while the previous
/// batch is being sent, and order is kept because requests go one at a time.
const READ_AHEAD_BATCHES: usize = 2;
/// Batches of one `pico append` in flight at once (kept in order by the producer's seqs).
const APPEND_IN_FLIGHT: usize = 4;
/// Most record bytes in one batch request: a JSON batch can take up to six times its records'
/// bytes (`\u00XX` escapes), and the server's default request limit is 32 MiB.
const MAX_BATCH_BYTES: usize = 4 << 20;
/// Longest input line (one record): the server's default request limit. Longer input (no
/// newlines, a binary file) is refused before it is held in memory whole.
const MAX_LINE_BYTES: usize = 32 << 20;

pub async fn create(
    client: &Client,
    name: &str,
    content_type: Option<&str>,
    ttl: Option<u64>,
) -> anyhow::Result<()> {
    let created = client.create(name, content_type, ttl).await?;
    eprintln!(
        "{} {name}",
        if created.created { "created" } else { "exists" }
    );
    Ok(())
}

pub async fn head(client: &Client, name: &str) -> anyhow::Result<()> {
    let meta = client.head(name).await?.ok_or_else(|| not_found(name))?;
    println!(
        "start={} next={} closed={} type={}",
        meta.start, meta.next, meta.closed, meta.content_type
    );
    Ok(())
}

pub async fn append(client: &Client, name: &str, batch: usize) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::channel::<Vec<Bytes>>(READ_AHEAD_BATCHES);
    let reader = tokio::spawn(read_batches(tx, batch));
    // Through an idempotent producer of its own: a request without an answer, or refused while
    // the server restarts, is resent under the same sequence number, so it is written once,
    // and a few batches are in flight at a time.
    let id = format!(
        "pico-append-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let producer = IdempotentProducer::new(
        client.clone(),
        name,
        ProducerConfig::new(id, 0, APPEND_IN_FLIGHT),
    )?;
    let mut in_flight: VecDeque<(u64, InFlight)> = VecDeque::new();
    let mut records = 0u64;
    let mut next_seq = None;
    let mut input_done = false;
    // A refused send means an earlier batch failed: its own error, found by draining, says why.
    let mut refused = None;
    loop {
        // Keep the window full while input lasts, then drain it. Acknowledged in order:
        // `records` always counts a prefix of the input.
        if !input_done && in_flight.len() < APPEND_IN_FLIGHT {
            match rx.recv().await {
                Some(lines) => {
                    let n = lines.len() as u64;
                    let recs: Vec<BatchRecord> = lines.into_iter().map(BatchRecord::new).collect();
                    match producer.send(recs).await {
                        Ok(f) => in_flight.push_back((n, f)),
                        Err(e) => {
                            refused = Some(e);
                            input_done = true;
                        }
                    }
                    continue;
                }
                None => input_done = true,
            }
        }
        let Some((n, f)) = in_flight.pop_front() else {
            if let Some(e) = refused {
                return Err(append_failed(e, name, records, reader));
            }
            break;
        };
        match f.ack().await {
            Ok(ack) => {
                records += n;
                next_seq = Some(ack.append.next_seq);
            }
            Err(e) => return Err(append_failed(e, name, records, reader)),
        }
    }
    reader.await.context("stdin reader")??;
    match next_seq {
        Some(next) => eprintln!("appended {records} records to {name} (next seq {next})"),
        None => eprintln!("appended 0 records to {name}"),
    }
    Ok(())
}

/// The error of a `pico append` that gave up after `records` were acknowledged. Retries are
/// over by then: if a request may still have been written, so may the ones sent behind it.
fn append_failed(
    e: ClientError,
    name: &str,
    records: u64,
    reader: tokio::task::JoinHandle<anyhow::Result<()>>,
) -> anyhow::Error {
    reader.abort();
    let context = if passing(&e) || e.is_outcome_unknown() {
        format!(
            "append to {name} failed after {records} records; records after those may have \
             been written too: see `pico head {name}` before resuming"
        )
    } else {
        format!("append to {name} failed after {records} records")
    };
    anyhow!(e).context(context)
}

/// Reads newline-delimited records from stdin in groups of `batch`; a trailing `\r` is dropped.
async fn read_batches(tx: mpsc::Sender<Vec<Bytes>>, batch: usize) -> anyhow::Result<()> {
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut lines = Vec::with_capacity(batch);
    let mut bytes = 0usize;
    loop {
        let mut line = Vec::new();
        let n = (&mut stdin)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
            .context("reading stdin")?;
        if n == 0 {
            break;
        }
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        if line.len() > MAX_LINE_BYTES {
            bail!(
                "an input line is longer than {} MiB: records are newline-delimited",
                MAX_LINE_BYTES >> 20
            );
        }
        // Batches also end at a byte budget, so long lines cannot make a request the server
        // must refuse after earlier ones were written.
        if !lines.is_empty() && bytes + line.len() > MAX_BATCH_BYTES {
            let full = std::mem::replace(&mut lines, Vec::with_capacity(batch));
            bytes = 0;
            if tx.send(full).await.is_err() {
                return Ok(()); // the sender stopped after an error
            }
        }
        bytes += line.len();
        lines.push(Bytes::from(line));
        if lines.len() == batch {
            let full = std::mem::replace(&mut lines, Vec::with_capacity(batch));
            bytes = 0;
            if tx.send(full).await.is_err() {
                return Ok(()); // the sender stopped after an error
            }
        }
    }
    if !lines.is_empty() {
        let _ = tx.send(lines).await;
    }
    Ok(())
}

pub async fn read(
    client: &Client,
    name: &str,
    from: Option<u64>,
    format: ReadFormat,
) -> anyhow::Result<()> {
    // Without `--from`, the stream's first record: offset 0 is gone once it is trimmed.
    let from = match from {
        Some(seq) => seq,
        None => {
            client
                .head(name)
                .await?
                .ok_or_else(|| not_found(name))?
                .start
        }
    };
    let mut out = std::io::stdout().lock();
    catch_up(client, name, from, format, &mut out).await?;
    Ok(())
}

/// Reads from `seq` until the server says the reader is up to date; returns where it stopped
/// and whether the stream is closed at that point.
async fn catch_up(
    client: &Client,
    name: &str,
    mut seq: u64,
    format: ReadFormat,
    out: &mut impl Write,
) -> anyhow::Result<(u64, bool)> {
    loop {
        let chunk = client.read(name, seq, None).await?;
        print_chunk(&chunk, format, out)?;
        let stalled = chunk.records.is_empty() && chunk.next_seq <= seq;
        seq = chunk.next_seq.max(seq);
        if chunk.up_to_date || chunk.closed || stalled {
            return Ok((seq, chunk.closed));
        }
    }
}

pub async fn tail(
    client: &Client,
    name: &str,
    follow: bool,
    lines: u64,
    format: ReadFormat,
) -> anyhow::Result<()> {
    let meta = if follow {
        // Following outlives a server that is restarting, from its first request on.
        head_retrying(client, name, FOLLOW_RETRY_FIRST).await?
    } else {
        client.head(name).await?.ok_or_else(|| not_found(name))?
    };
    let from = meta.next.saturating_sub(lines).max(meta.start);
    let mut out = std::io::stdout();
    let (seq, closed) = if from < meta.next {
        catch_up(client, name, from, format, &mut out).await?
    } else {
        (from, meta.closed)
    };
    if !follow || closed {
        return Ok(());
    }
    follow_from(client, name, seq, format, &mut out, FOLLOW_RETRY_FIRST).await
}

/// First pause before a failed long-poll of `tail -f` is retried; doubles per failure in a
/// row, up to [`FOLLOW_RETRY_MAX`].
const FOLLOW_RETRY_FIRST: Duration = Duration::from_millis(100);
const FOLLOW_RETRY_MAX: Duration = Duration::from_secs(5);

/// Long-polls from `seq` until the stream closes. A failure that may pass (no connection, no
/// answer, 5xx: a restarting or moving server) is retried from the same offset, so nothing
/// is skipped or printed twice; any other (404: the stream is gone, other 4xx) ends it.
async fn follow_from(
    client: &Client,
    name: &str,
    mut seq: u64,
    format: ReadFormat,
    out: &mut impl Write,
    first_pause: Duration,
) -> anyhow::Result<()> {
    let mut pause = first_pause;
    loop {
        let chunk = match client.long_poll(name, seq).await {
            Ok(chunk) => chunk,
            Err(e) if e.is_not_found() => {
                bail!("stream not found while following: name=`{name}` seq={seq}")
            }
            Err(e) if passing(&e) => {
                eprintln!("note: following {name} at seq {seq}: {e}; retrying in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(FOLLOW_RETRY_MAX);
                continue;
            }
            Err(e) => return Err(anyhow!(e).context(format!("following {name} at seq {seq}"))),
        };
        pause = first_pause;
        print_chunk(&chunk, format, out)?;
        seq = chunk.next_seq.max(seq);
        if chunk.closed {
            eprintln!("stream {name} closed at seq {seq}");
            return Ok(());
        }
    }
}

/// Attempts of `tail -f`'s first HEAD (about 25 s with the backoff): long enough for a
/// restart, short enough that a wrong endpoint fails.
const FIRST_HEAD_ATTEMPTS: u32 = 10;

/// The stream's HEAD, retried while the failure may pass (see [`passing`]).
async fn head_retrying(
    client: &Client,
    name: &str,
    first_pause: Duration,
) -> anyhow::Result<StreamMeta> {
    let mut pause = first_pause;
    let mut attempt = 0;
    loop {
        attempt += 1;
        match client.head(name).await {
            Ok(Some(meta)) => return Ok(meta),
            Ok(None) => return Err(not_found(name)),
            Err(e) if passing(&e) && attempt < FIRST_HEAD_ATTEMPTS => {
                eprintln!("note: {name}: {e}; retrying in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(FOLLOW_RETRY_MAX);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A failure a later attempt may not see: the request got no answer, or a 5xx one.
fn passing(e: &ClientError) -> bool {
    match e {
        ClientError::Transport(_) | ClientError::Timeout(_) => true,
        ClientError::Http { status, .. } => *status >= 500,
        _ => false,
    }
}

fn print_chunk(chunk: &ReadChunk, format: ReadFormat, out: &mut impl Write) -> anyhow::Result<()> {
    for rec in &chunk.records {
        match format {
            ReadFormat::Text => {
                out.write_all(&rec.body)?;
                out.write_all(b"\n")?;
            }
            ReadFormat::Json => {
                serde_json::to_writer(&mut *out, &record_json(rec))?;
                out.write_all(b"\n")?;
            }
        }
    }
    // Followers read this through a pipe: every chunk must reach them now.
    out.flush()?;
    Ok(())
}

/// One line of `--format json`, fields in the order of the server's `json` read format.
#[derive(serde::Serialize)]
struct JsonLine<'a> {
    seq: u64,
    timestamp: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_b64: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_b64: Option<String>,
}

fn record_json(rec: &ReadRecord) -> JsonLine<'_> {
    let (key, key_b64) = match rec.key.as_deref().map(text_or_b64) {
        Some((text, b64)) => (text, b64),
        None => (None, None),
    };
    let (body, body_b64) = text_or_b64(&rec.body);
    JsonLine {
        seq: rec.seq,
        timestamp: rec.timestamp,
        key,
        key_b64,
        headers: &rec.headers,
        body,
        body_b64,
    }
}

/// Text when the bytes are UTF-8, base64 otherwise (the server's `field` / `field_b64`).
fn text_or_b64(bytes: &[u8]) -> (Option<&str>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text), None),
        Err(_) => (None, Some(B64.encode(bytes))),
    }
}

pub async fn ls(client: &Client, prefix: Option<&str>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut start_after: Option<String> = None;
    loop {
        let page = client.list(prefix, start_after.as_deref(), None).await?;
        for name in &page.streams {
            writeln!(out, "{name}")?;
        }
        match page.streams.last() {
            Some(last) if page.has_more => start_after = Some(last.clone()),
            _ => break,
        }
    }
    out.flush()?;
    Ok(())
}

pub async fn close(client: &Client, name: &str) -> anyhow::Result<()> {
    let ack = client.close(name).await?;
    eprintln!("closed {name} (next seq {})", ack.next_seq);
    Ok(())
}

pub async fn delete(client: &Client, name: &str) -> anyhow::Result<()> {
    client.delete(name).await.map_err(|e| {
        if e.is_not_found() {
            not_found(name)
        } else {
            anyhow!(e)
        }
    })?;
    eprintln!("deleted {name}");
    Ok(())
}

pub async fn trim(client: &Client, name: &str, seq: u64) -> anyhow::Result<()> {
    let start = client.trim(name, seq).await?;
    eprintln!("trimmed {name} (start seq {start})");
    Ok(())
}

fn not_found(name: &str) -> anyhow::Error {
    anyhow!("stream not found: name=`{name}`")
}

/// Fails fast on a stream name the server would reject, or that no URL can carry as it is
/// (the client's rule, [`pico_client::wire::stream_path`]).
pub fn check_name(name: &str) -> anyhow::Result<()> {
    match pico_client::wire::stream_path(name) {
        Ok(_) => Ok(()),
        Err(pico_client::ClientError::Invalid(why)) => bail!("{why}"),
        Err(e) => bail!("{e}"),
    }
}

/// Longest `pico admin transfer --wait` waits for the target to own the stream.
const TRANSFER_WAIT: Duration = Duration::from_secs(60);

/// `pico admin …`.
pub async fn admin(args: &crate::cli::AdminArgs, token: Option<String>) -> anyhow::Result<()> {
    use crate::cli::AdminCommand;
    let admin = pico_client::AdminClient::new(&args.admin_endpoint, token)?;
    match &args.command {
        AdminCommand::Transfer {
            name,
            to_node,
            wait: false,
        } => {
            let t = admin.transfer(name, *to_node).await?;
            eprintln!(
                "transfer of {name} to node {to_node} requested (from node {}, epoch {})",
                t.from_node.map_or("none".to_string(), |n| n.to_string()),
                t.epoch
            );
        }
        AdminCommand::Transfer {
            name,
            to_node,
            wait: true,
        } => {
            let h = admin
                .transfer_and_wait(name, *to_node, TRANSFER_WAIT)
                .await
                .with_context(|| format!("transfer of {name} to node {to_node}"))?;
            println!(
                "node={to_node} epoch={} handoff_ms={}",
                h.epoch,
                h.elapsed.as_millis()
            );
            eprintln!(
                "{name} moved from node {} to node {to_node} in {} ms",
                h.started
                    .from_node
                    .map_or("none".to_string(), |n| n.to_string()),
                h.elapsed.as_millis()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_follow_the_read_format() {
        let mut rec = ReadRecord {
            seq: 7,
            timestamp: 11,
            key: Some(Bytes::from_static(&[0xff])),
            headers: BTreeMap::new(),
            body: Bytes::from_static(b"hi"),
        };
        let line = serde_json::to_string(&record_json(&rec)).unwrap();
        assert_eq!(
            line,
            r#"{"seq":7,"timestamp":11,"key_b64":"/w==","body":"hi"}"#
        );
        rec.key = None;
        rec.headers.insert("h".into(), "v".into());
        rec.body = Bytes::from_static(&[0, 0xfe]);
        let line = serde_json::to_string(&record_json(&rec)).unwrap();
        assert_eq!(
            line,
            r#"{"seq":7,"timestamp":11,"headers":{"h":"v"},"body_b64":"AP4="}"#
        );
    }

    /// A server that answers the `i`th connection's request with `answers[i]`: `Some(raw)`
    /// writes that HTTP/1.1 response, `None` closes the connection unanswered. Returns its
    /// endpoint and the request lines it received.
    async fn scripted_server(
        answers: Vec<Option<String>>,
    ) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = seen.clone();
        tokio::spawn(async move {
            for answer in answers {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = socket.read(&mut buf).await.unwrap();
                    assert!(n > 0, "request cut short");
                    head.extend_from_slice(&buf[..n]);
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap()
                    .to_string();
                log.lock().unwrap().push(line);
                if let Some(raw) = answer {
                    socket.write_all(raw.as_bytes()).await.unwrap();
                }
            }
        });
        (format!("http://{addr}"), seen)
    }

    fn response(status: &str, headers: &[(&str, &str)], body: &str) -> Option<String> {
        let mut raw = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
        for (k, v) in headers {
            raw.push_str(&format!("{k}: {v}\r\n"));
        }
        raw.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
        Some(raw)
    }

    /// `tail -f` outlives a server that fails for a while (503, a connection closed without
    /// an answer) and resumes from the same offset: nothing skipped, nothing twice.
    #[tokio::test]
    async fn follow_retries_passing_failures_from_the_same_offset() {
        let records = r#"[{"seq":5,"timestamp":1,"body":"a"},{"seq":6,"timestamp":2,"body":"b"}]"#;
        let (endpoint, seen) = scripted_server(vec![
            response(
                "503 Service Unavailable",
                &[],
                r#"{"error":"unavailable","message":"moving"}"#,
            ),
            None,
            response(
                "200 OK",
                &[
                    ("content-type", "application/json"),
                    ("pico-next-seq", "7"),
                    ("pico-closed", "true"),
                ],
                records,
            ),
        ])
        .await;
        let client = Client::new(&endpoint, Default::default()).unwrap();
        let mut out = Vec::new();
        let pause = Duration::from_millis(1);
        follow_from(&client, "s", 5, ReadFormat::Text, &mut out, pause)
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out), "a\nb\n");
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(
            seen.iter().all(|l| l.starts_with("GET /s?seq=5&")),
            "{seen:?}"
        );
    }

    /// `tail -f` started while the server restarts waits for it rather than failing at once;
    /// a missing stream still fails at once.
    #[tokio::test]
    async fn tail_follow_retries_its_first_head() {
        let (endpoint, seen) = scripted_server(vec![
            None,
            response(
                "503 Service Unavailable",
                &[],
                r#"{"error":"unavailable","message":"starting"}"#,
            ),
            response(
                "200 OK",
                &[("pico-next-seq", "9"), ("pico-start-seq", "2")],
                "",
            ),
            response("404 Not Found", &[], ""),
        ])
        .await;
        let client = Client::new(&endpoint, Default::default()).unwrap();
        let meta = head_retrying(&client, "s", Duration::from_millis(1))
            .await
            .unwrap();
        assert_eq!((meta.start, meta.next), (2, 9));
        assert_eq!(seen.lock().unwrap().len(), 3);
        let err = head_retrying(&client, "s", Duration::from_millis(1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not found"), "{err:#}");
        assert_eq!(seen.lock().unwrap().len(), 4);
        // A server that never comes back (or a wrong endpoint): it gives up.
        let busy = || response("503 Service Unavailable", &[], "");
        let (endpoint, seen) = scripted_server(vec![busy(); 12]).await;
        let client = Client::new(&endpoint, Default::default()).unwrap();
        let err = head_retrying(&client, "s", Duration::from_millis(1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("503"), "{err:#}");
        assert_eq!(seen.lock().unwrap().len(), FIRST_HEAD_ATTEMPTS as usize);
    }

    /// A stream deleted under `tail -f` ends it with a clear error, not endless retries.
    #[tokio::test]
    async fn follow_stops_when_the_stream_is_gone() {
        let gone = r#"{"error":"not_found","message":"stream not found: name=`s`"}"#;
        let (endpoint, seen) = scripted_server(vec![
            response("404 Not Found", &[], gone),
            response("404 Not Found", &[], gone),
        ])
        .await;
        let client = Client::new(&endpoint, Default::default()).unwrap();
        let mut out = Vec::new();
        let err = follow_from(&client, "s", 3, ReadFormat::Text, &mut out, Duration::ZERO)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("stream not found while following"),
            "{err:#}"
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn text_output_is_one_body_per_line() {
        let chunk = ReadChunk {
            records: vec![
                ReadRecord {
                    seq: 0,
                    timestamp: 0,
                    key: None,
                    headers: BTreeMap::new(),
                    body: Bytes::from_static(b"a"),
                },
                ReadRecord {
                    seq: 1,
                    timestamp: 0,
                    key: None,
                    headers: BTreeMap::new(),
                    body: Bytes::new(),
                },
            ],
            next_seq: 2,
            up_to_date: true,
            closed: false,
        };
        let mut out = Vec::new();
        print_chunk(&chunk, ReadFormat::Text, &mut out).unwrap();
        assert_eq!(out, b"a\n\n");
    }
}
