//! The client commands: data on stdout, notes on stderr.

use crate::cli::ReadFormat;
use anyhow::{Context, anyhow, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use pico_client::{BatchRecord, Client, ReadChunk, ReadRecord};
use std::collections::BTreeMap;
use std::io::Write;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

/// Batches read ahead of the request in flight: stdin is read while the previous
/// batch is being sent, and order is kept because requests go one at a time.
const READ_AHEAD_BATCHES: usize = 2;

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

pub async fn append(
    client: &Client,
    name: &str,
    batch: usize,
    content_type: Option<String>,
) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::channel::<Vec<Bytes>>(READ_AHEAD_BATCHES);
    let reader = tokio::spawn(read_batches(tx, batch));
    let options = pico_client::AppendOptions {
        content_type,
        ..Default::default()
    };
    let mut records = 0u64;
    let mut next_seq = None;
    while let Some(lines) = rx.recv().await {
        let n = lines.len() as u64;
        let result = if batch == 1 && lines.iter().all(|l| !l.is_empty()) {
            // Batches of one are plain single-record POSTs, so `--content-type` applies.
            // (An empty raw body means "no record", so empty lines go as a JSON batch.)
            let body = lines.into_iter().next().unwrap_or_default();
            client.append_with(name, body, &options).await
        } else {
            let recs: Vec<BatchRecord> = lines.into_iter().map(BatchRecord::new).collect();
            client.append_batch(name, &recs).await
        };
        match result {
            Ok(ack) => {
                records += n;
                next_seq = Some(ack.next_seq);
            }
            Err(e) => {
                reader.abort();
                return Err(
                    anyhow!(e).context(format!("append to {name} failed after {records} records"))
                );
            }
        }
    }
    reader.await.context("stdin reader")??;
    match next_seq {
        Some(next) => eprintln!("appended {records} records to {name} (next seq {next})"),
        None => eprintln!("appended 0 records to {name}"),
    }
    Ok(())
}

/// Reads newline-delimited records from stdin in groups of `batch`; a trailing `\r` is dropped.
async fn read_batches(tx: mpsc::Sender<Vec<Bytes>>, batch: usize) -> anyhow::Result<()> {
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let mut lines = Vec::with_capacity(batch);
    loop {
        let mut line = Vec::new();
        let n = stdin
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
        lines.push(Bytes::from(line));
        if lines.len() == batch {
            let full = std::mem::replace(&mut lines, Vec::with_capacity(batch));
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
    from: u64,
    format: ReadFormat,
) -> anyhow::Result<()> {
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
    let meta = client.head(name).await?.ok_or_else(|| not_found(name))?;
    let from = meta.next.saturating_sub(lines).max(meta.start);
    let mut out = std::io::stdout();
    let (mut seq, closed) = if from < meta.next {
        catch_up(client, name, from, format, &mut out).await?
    } else {
        (from, meta.closed)
    };
    if !follow || closed {
        return Ok(());
    }
    loop {
        let chunk = client.long_poll(name, seq).await?;
        print_chunk(&chunk, format, &mut out)?;
        seq = chunk.next_seq.max(seq);
        if chunk.closed {
            eprintln!("stream {name} closed at seq {seq}");
            return Ok(());
        }
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

/// Fails fast on arguments the server would reject anyway.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    if let Err(e) = pico_common::StreamName::parse(name) {
        bail!("{e}");
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
