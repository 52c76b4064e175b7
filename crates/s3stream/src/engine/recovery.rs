//! Recovery at start: make every acked append in the WAL committed exactly once.
//!
//! Selection rules per stream, walking WAL entries in position order from the catalog's
//! committed end:
//! - a record below the committed end is already committed: skipped (no duplicates);
//! - a record of a higher epoch than the records kept so far replaces them from its base
//!   offset on (the stream was re-opened; the old tail was never committed);
//! - a record of a lower epoch, a duplicate (a retried WAL write), or one that leaves a gap is
//!   skipped.
//!
//! Kept records are uploaded and committed with their WAL epoch; the catalog may still fence
//! them. The WAL is trimmed only after every commit answered.

use std::collections::HashMap;
use std::time::Duration;

use super::uploader::{plan_objects, put_and_commit};
use super::{CatalogError, EngineError, RecoveryReport, Shared};
use crate::wal::WalRecord;

const RECOVERY_ATTEMPTS: u32 = 5;

#[derive(Debug, Default, PartialEq)]
pub(super) struct Selection {
    /// Records to replay, grouped per stream (streams in first-appearance order).
    pub(super) records: Vec<WalRecord>,
    pub(super) skipped: usize,
}

struct Tail {
    epoch: i64,
    committed_end: u64,
    records: Vec<WalRecord>,
}

impl Tail {
    fn expected(&self) -> u64 {
        self.records
            .last()
            .map_or(self.committed_end, |r| r.next_offset())
    }
}

pub(super) fn select(
    entries: &[(u64, Vec<WalRecord>)],
    committed_end: impl Fn(u64) -> u64,
) -> Selection {
    let mut order: Vec<u64> = Vec::new();
    let mut tails: HashMap<u64, Tail> = HashMap::new();
    let mut skipped = 0;
    for (_, records) in entries {
        for rec in records {
            let tail = tails.entry(rec.stream).or_insert_with(|| {
                order.push(rec.stream);
                Tail {
                    epoch: i64::MIN,
                    committed_end: committed_end(rec.stream),
                    records: Vec::new(),
                }
            });
            if rec.base_offset < tail.committed_end {
                skipped += 1;
                continue;
            }
            if rec.epoch < tail.epoch {
                skipped += 1;
                continue;
            }
            if rec.epoch > tail.epoch {
                let before = tail.records.len();
                tail.records.retain(|r| r.next_offset() <= rec.base_offset);
                skipped += before - tail.records.len();
                tail.epoch = rec.epoch;
            }
            if rec.base_offset == tail.expected() {
                tail.records.push(rec.clone());
            } else {
                if rec.base_offset > tail.expected() {
                    tracing::warn!(
                        stream = rec.stream,
                        base = rec.base_offset,
                        expected = tail.expected(),
                        "wal record after a gap skipped"
                    );
                }
                skipped += 1;
            }
        }
    }
    let mut out = Vec::new();
    for s in order {
        if let Some(t) = tails.remove(&s) {
            out.extend(t.records);
        }
    }
    Selection {
        records: out,
        skipped,
    }
}

fn is_fenced(e: &EngineError) -> bool {
    matches!(e, EngineError::Catalog(CatalogError::Fenced(_)))
}

pub(super) async fn recover(shared: &Shared) -> Result<RecoveryReport, EngineError> {
    let entries = shared.wal.recover().await?;
    let catalog = shared.catalog.clone();
    let selection = select(&entries, |s| catalog.committed_end(s));
    let mut report = RecoveryReport {
        wal_entries: entries.len(),
        records_replayed: 0,
        streams: Vec::new(),
        skipped: selection.skipped,
    };
    if !selection.records.is_empty() {
        let refs: Vec<(u64, &WalRecord)> = selection.records.iter().map(|r| (0, r)).collect();
        let mut objects = plan_objects(&refs, shared.cfg.stream_object_min_bytes, || {
            shared.next_object_key()
        })?;
        let mut attempt = 0;
        loop {
            match put_and_commit(shared, &mut objects).await {
                Ok(()) => break,
                // Fenced: no retry can commit, and nothing is trimmed (see `CatalogError`).
                Err(e) if attempt + 1 < RECOVERY_ATTEMPTS && !is_fenced(&e) => {
                    tracing::warn!(error = %e, attempt, "recovery upload failed, retrying");
                    tokio::time::sleep(Duration::from_millis(50 * 2u64.pow(attempt))).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
        // The selected records' base offsets per stream and epoch, ascending: each planned range
        // counts its records by two binary searches, not a pass over every record (a crash
        // with 100k streams in the WAL would otherwise cost streams × records before start).
        let mut bases: HashMap<(u64, i64), Vec<u64>> = HashMap::new();
        for x in &selection.records {
            bases
                .entry((x.stream, x.epoch))
                .or_default()
                .push(x.base_offset);
        }
        for v in bases.values_mut() {
            v.sort_unstable();
        }
        // Per stream: the epoch and end of its last accepted range, in first-seen order.
        let mut ends: Vec<(u64, i64, u64)> = Vec::new();
        let mut at: HashMap<u64, usize> = HashMap::new();
        for obj in &objects {
            let outcome = obj.outcome.as_deref().unwrap_or(&[]);
            for (planned, accepted) in obj.ranges.iter().zip(outcome) {
                let r = &planned.range;
                let count = bases.get(&(r.stream, r.epoch)).map_or(0, |v| {
                    v.partition_point(|b| *b < r.end_offset)
                        - v.partition_point(|b| *b < r.start_offset)
                });
                if *accepted {
                    report.records_replayed += count;
                    match at.get(&r.stream).and_then(|&i| ends.get_mut(i)) {
                        Some(e) => *e = (r.stream, r.epoch, r.end_offset.max(e.2)),
                        None => {
                            at.insert(r.stream, ends.len());
                            ends.push((r.stream, r.epoch, r.end_offset));
                        }
                    }
                } else {
                    report.skipped += count;
                }
            }
        }
        report.streams = ends;
    }
    if let Some((last, _)) = entries.last() {
        shared.wal.trim(*last).await?;
    }
    if !entries.is_empty() {
        tracing::info!(
            wal_entries = report.wal_entries,
            replayed = report.records_replayed,
            skipped = report.skipped,
            "wal recovered"
        );
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(stream: u64, epoch: i64, base: u64, n: u32) -> WalRecord {
        WalRecord::new(
            stream,
            epoch,
            base,
            n,
            Bytes::from(format!("{stream}:{epoch}:{base}")),
            Bytes::new(),
        )
    }

    fn keys(s: &Selection) -> Vec<(u64, i64, u64)> {
        s.records
            .iter()
            .map(|r| (r.stream, r.epoch, r.base_offset))
            .collect()
    }

    #[test]
    fn skips_committed_and_duplicates() {
        let entries = vec![
            (1, vec![rec(1, 1, 0, 2), rec(2, 1, 0, 1)]),
            (2, vec![rec(1, 1, 2, 1)]),
            (3, vec![rec(1, 1, 2, 1)]), // retried write: duplicate
            (4, vec![rec(1, 1, 3, 1), rec(2, 1, 1, 1)]),
        ];
        let s = select(&entries, |s| if s == 1 { 2 } else { 0 });
        assert_eq!(keys(&s), vec![(1, 1, 2), (1, 1, 3), (2, 1, 0), (2, 1, 1)]);
        assert_eq!(s.skipped, 2);
    }

    #[test]
    fn higher_epoch_replaces_uncommitted_tail() {
        let entries = vec![
            (1, vec![rec(1, 1, 5, 1)]),
            (2, vec![rec(1, 1, 6, 1)]),
            (3, vec![rec(1, 2, 5, 1)]), // re-opened at the committed end 5
            (4, vec![rec(1, 1, 7, 1)]), // late write of the old epoch
            (5, vec![rec(1, 2, 9, 1)]), // gap
        ];
        let s = select(&entries, |_| 5);
        assert_eq!(keys(&s), vec![(1, 2, 5)]);
        assert_eq!(s.skipped, 4);
    }
}
