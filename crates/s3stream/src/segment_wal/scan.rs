//! Recovery's reading of the segment files: the frames of each segment, and the checks that
//! nothing acknowledged and uncommitted is missing (see the parent module's invariants and
//! docs/design/engine.md, "A damaged WAL").

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::{Segment, io, parse_name, segment_name};
use crate::format;
use crate::segment_format::{
    self as layout, END_MARKER, FRAME_HEADER, HeaderError, MANIFEST, Manifest, SEGMENT_HEADER,
    SegmentHeader,
};
use crate::wal::{WalError, WalRecord};

/// One segment file as found on disk.
pub(super) struct Scanned {
    pub(super) first: u64,
    pub(super) path: PathBuf,
    /// Its header, when valid and matching the name.
    pub(super) header: Option<SegmentHeader>,
    pub(super) size: u64,
    pub(super) entries: Vec<(u64, Vec<WalRecord>)>,
    /// The highest trim watermark among its frames.
    pub(super) trimmed: u64,
    /// Where and why its data ends in a torn frame, if it does.
    pub(super) torn: Option<(usize, String)>,
    /// Positions whose frames are damaged, with valid frames after them: `(from, to)`.
    pub(super) gaps: Vec<(u64, u64)>,
}

pub(super) fn corrupt(path: &Path, source: format::FormatError) -> WalError {
    WalError::Corrupt {
        key: path.display().to_string(),
        source,
    }
}

/// Reads every valid frame of one segment. Positions inside a segment are consecutive; frames
/// that cannot be read but have valid frames after them are reported in `gaps`.
///
/// A frame counts only if it carries the segment's key, which is random per segment and never
/// leaves this process's files: record bytes that a client shaped like a frame, and the frames
/// a recycled file held under its earlier name, never match it, so the byte-by-byte search for
/// data after a damaged frame (below) finds only this segment's own frames.
pub(super) fn scan_segment(path: &Path, first: u64, key: u64) -> Result<Scanned, WalError> {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(|e| io(path, e))?;
    let data = Bytes::from(data);
    let mut scanned = Scanned {
        first,
        path: path.to_path_buf(),
        header: None,
        size: data.len() as u64,
        entries: Vec::new(),
        trimmed: 0,
        gaps: Vec::new(),
        torn: None,
    };
    match layout::decode_segment_header(&data) {
        Ok(h) if h.first == first && h.key == key => scanned.header = Some(h),
        Ok(_) | Err(HeaderError::Invalid) => return Ok(scanned),
        Err(HeaderError::Version(v)) => {
            return Err(corrupt(path, format::FormatError::UnsupportedVersion(v)));
        }
    }
    let mut expected = first;
    let mut at = SEGMENT_HEADER;
    while at < data.len() {
        let rest = &data[at..];
        // Why the data stops here, if it does (otherwise the frame is taken and the loop goes
        // on). What ends the data without a crash: the end marker every append writes after its
        // frame, the zeros of a preallocated segment, or a frame left by a recycled segment's
        // earlier use.
        let why: String = if rest.len() < FRAME_HEADER {
            if rest.iter().all(|&b| b == 0) {
                "zeros".into()
            } else {
                "partial frame header".into()
            }
        } else if rest[..END_MARKER.len()] == END_MARKER {
            "end marker".into()
        } else {
            match layout::header_at(rest, key) {
                None => "damaged frame header".into(),
                Some((len, _)) if FRAME_HEADER + len > rest.len() => {
                    "frame runs past the end of the file".into()
                }
                Some((len, trimmed)) => {
                    let end = at + FRAME_HEADER + len;
                    match format::decode_wal_entry(&data.slice(at + FRAME_HEADER..end)) {
                        Ok((pos, records)) if pos == expected => {
                            scanned.entries.push((pos, records));
                            scanned.trimmed = scanned.trimmed.max(trimmed);
                            expected += 1;
                            at = end;
                            continue;
                        }
                        // Written before this file was recycled into this segment: every
                        // earlier use held positions below this segment's first.
                        Ok((pos, _)) if pos < first => "stale frame of a recycled segment".into(),
                        Ok((pos, _)) if pos > expected => {
                            scanned.gaps.push((expected, pos - 1));
                            expected = pos;
                            continue;
                        }
                        Ok((pos, _)) => {
                            return Err(WalError::PositionMismatch {
                                key: format!("{}@{at}", path.display()),
                                stored: pos,
                            });
                        }
                        Err(e) => e.to_string(),
                    }
                }
            }
        };
        match next_valid_frame(&data, at + 1, expected, key) {
            // Damage in the middle of the segment: the frames up to the next valid one are lost
            // (whether that matters is decided against the trim watermark).
            Some((k, pos)) => {
                tracing::warn!(
                    segment = %path.display(), offset = at, why, from = expected, to = pos - 1,
                    "damaged wal frames"
                );
                if pos > expected {
                    scanned.gaps.push((expected, pos - 1));
                }
                expected = pos;
                at = k;
            }
            None => {
                if matches!(
                    why.as_str(),
                    "zeros" | "end marker" | "stale frame of a recycled segment"
                ) {
                    tracing::debug!(segment = %path.display(), offset = at, why, "end of wal segment data");
                } else {
                    // Logged once recovery accepts it: a cut segment also ends in a torn frame.
                    scanned.torn = Some((at, why));
                }
                break;
            }
        }
    }
    Ok(scanned)
}

/// Where the first whole, valid frame holding a position >= `expected` starts at or after
/// `from`, and its position. Asked once per segment at recovery, where its data ends (and once
/// per damaged stretch), so the byte-by-byte search is off the append path. Only a header that
/// carries the key and passes its checksum gets its entry decoded, so the search is linear in
/// the file.
pub(super) fn next_valid_frame(
    data: &Bytes,
    from: usize,
    expected: u64,
    key: u64,
) -> Option<(usize, u64)> {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let mut k = from;
    while k + FRAME_HEADER <= end {
        if let Some((len, _)) = layout::header_at(&data[k..], key)
            && k + FRAME_HEADER + len <= data.len()
            && let Ok((pos, _)) =
                format::decode_wal_entry(&data.slice(k + FRAME_HEADER..k + FRAME_HEADER + len))
            && pos >= expected
        {
            return Some((k, pos));
        }
        k += 1;
    }
    None
}

pub(super) fn scan_dir(dir: &Path) -> Result<Vec<Scanned>, WalError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some((first, key)) = parse_name(&name) {
            found.push((first, key, entry.path()));
        }
    }
    // Two files with one first position (a crash between starting a segment and deleting the
    // attempt it replaces) hold nothing acknowledged at or above it; the order is fixed anyway.
    found.sort();
    found
        .into_iter()
        .map(|(first, key, path)| scan_segment(&path, first, key))
        .collect()
}

/// What recovery keeps: the segments, their live entries, and the trim watermark.
pub(super) struct Live {
    pub(super) segments: Vec<Segment>,
    pub(super) entries: Vec<(u64, Vec<WalRecord>)>,
    pub(super) trimmed: u64,
}

/// A loss recovery refuses: positions `from..=to` (`to: None`: and every later one) of `file`.
pub(super) fn lost(dir: &Path, file: String, why: String, from: u64, to: Option<u64>) -> WalError {
    WalError::Lost {
        file,
        why,
        from,
        to,
        dir: dir.display().to_string(),
    }
}

/// Applies "a later segment starting at q supersedes entries >= q of earlier ones", and checks
/// that nothing acknowledged and uncommitted is missing: every position above the trim watermark
/// up to the last one written must be readable, except a torn last frame (never acknowledged).
/// A torn frame that is not the WAL's last, a missing or cut segment, damage in the middle: a
/// position lost there was acknowledged, and starting would give its offsets out again.
pub(super) fn live_entries(
    dir: &Path,
    scanned: Vec<Scanned>,
    manifest: Option<Manifest>,
) -> Result<Live, WalError> {
    let mut trimmed = scanned
        .iter()
        .map(|s| s.trimmed)
        .max()
        .unwrap_or(0)
        .max(manifest.map_or(0, |m| m.trimmed));
    let head = manifest.and_then(|m| m.head);
    let head_first = head.map(|(f, _)| f);
    if manifest.is_none()
        && let Some(oldest) = scanned.first()
    {
        // Only a new WAL has no manifest (the first segment's start wrote none yet): with
        // frames in it, it was deleted, and what was trimmed before is unknown.
        if scanned.iter().any(|s| !s.entries.is_empty()) {
            tracing::warn!(
                dir = %dir.display(),
                "the wal manifest is missing: a deleted or emptied wal segment cannot be detected on this start"
            );
        }
        trimmed = trimmed.max(oldest.first.saturating_sub(1));
    }
    if let Some((h, key)) = head
        && scanned.last().is_none_or(|s| s.first < h)
    {
        return Err(lost(
            dir,
            dir.join(segment_name(h, key)).display().to_string(),
            "is missing (the manifest names it as the newest segment)".into(),
            h.max(trimmed + 1),
            None,
        ));
    }
    if let Some(oldest) = scanned.first()
        && oldest.first > trimmed + 1
    {
        return Err(lost(
            dir,
            oldest.path.display().to_string(),
            "is the oldest segment left, and the segments before it are missing".into(),
            trimmed + 1,
            Some(oldest.first - 1),
        ));
    }
    let starts: Vec<u64> = scanned.iter().map(|s| s.first).collect();
    let count = scanned.len();
    let mut segments = Vec::with_capacity(count);
    let mut entries = Vec::new();
    for (i, s) in scanned.into_iter().enumerate() {
        let cut = starts.get(i + 1).copied();
        let file = || s.path.display().to_string();
        let below_cut = |p: u64| cut.is_none_or(|c| p < c);
        for &(from, to) in &s.gaps {
            let to = cut.map_or(to, |c| to.min(c.saturating_sub(1)));
            if from > to {
                continue;
            }
            if to > trimmed {
                let why = "has damaged frames with valid frames after them".into();
                return Err(lost(dir, file(), why, from.max(trimmed + 1), Some(to)));
            }
            tracing::warn!(segment = %file(), from, to, "damaged wal frames of committed entries ignored");
        }
        let before = entries.len();
        entries.extend(s.entries.into_iter().filter(|(p, _)| below_cut(*p)));
        let reached = entries[before..]
            .last()
            .map_or(s.first.saturating_sub(1), |(p, _)| *p);
        if let Some(q) = cut.filter(|q| *q > s.first)
            && reached < q - 1
        {
            if q - 1 > trimmed {
                let why = match s.header {
                    None => "has no valid header (emptied or damaged)".to_string(),
                    Some(h) if s.size < h.length => {
                        format!("was cut to {} of its {} bytes", s.size, h.length)
                    }
                    Some(_) => {
                        "ends before the next segment starts (its last frames are damaged)".into()
                    }
                };
                return Err(lost(
                    dir,
                    file(),
                    why,
                    (reached + 1).max(trimmed + 1),
                    Some(q - 1),
                ));
            }
            tracing::warn!(segment = %file(), "a wal segment of committed entries is damaged: ignored");
        }
        // The newest segment: nothing after it tells how far it reached, so its header does.
        // One the manifest does not name yet never finished starting and holds nothing.
        let started = match head_first {
            Some(h) => s.first <= h,
            None => reached >= s.first,
        };
        if i + 1 == count && started {
            let why = match s.header {
                None => Some("has no valid header (emptied or damaged)".to_string()),
                Some(h) if s.size < h.length => {
                    Some(format!("was cut to {} of its {} bytes", s.size, h.length))
                }
                Some(_) => None,
            };
            if let Some(why) = why {
                return Err(lost(dir, file(), why, (reached + 1).max(trimmed + 1), None));
            }
        }
        if let Some((offset, why)) = &s.torn {
            tracing::warn!(
                segment = %file(), offset, why,
                "ignoring the torn tail of a wal segment (a crash mid-append)"
            );
        }
        segments.push(Segment {
            first: s.first,
            path: s.path,
        });
    }
    Ok(Live {
        segments,
        entries,
        trimmed,
    })
}

pub(super) fn read_manifest(dir: &Path) -> Result<Option<Manifest>, WalError> {
    let path = dir.join(MANIFEST);
    match layout::read_manifest(dir).map_err(|e| io(&path, e))? {
        None => Ok(None),
        Some(Ok(m)) => Ok(Some(m)),
        Some(Err(HeaderError::Version(v))) => {
            Err(corrupt(&path, format::FormatError::UnsupportedVersion(v)))
        }
        Some(Err(HeaderError::Invalid)) => Err(corrupt(
            &path,
            format::FormatError::Invalid(
                "the wal manifest is damaged, so a missing or cut segment cannot be told; \
                 if every segment is intact, delete the manifest to start",
            ),
        )),
    }
}
