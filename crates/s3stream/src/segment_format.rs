//! The on-disk layout of [`crate::SegmentWal`]: segment header, frame header and manifest.
//! Sans-IO apart from [`write_manifest`] / [`read_manifest`]; `docs/design/formats.md` is the
//! reference for these bytes (all integers little-endian).
//!
//! Segment `{first:020}-{key:016x}.wal`:
//! ```text
//! header (SEGMENT_HEADER bytes): "PICOWALS" u32 version u32 0 u64 first u64 key u64 length
//!                                u32 crc32c(the 40 bytes above), zeros up to SEGMENT_HEADER
//! frames: u32 len u32 crc32c(len, key, trimmed) u64 key u64 trimmed, then `len` bytes of one
//!         WAL entry (`format::encode_wal_entry`); END_MARKER after the last one
//! ```
//! Manifest `wal.manifest`:
//! ```text
//! "PICOWALM" u32 version u32 flags(bit 0: head is set) u64 head_first u64 head_key
//! u64 trimmed u32 crc32c(the 40 bytes above)
//! ```

use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Version of the segment and manifest layouts; see `docs/design/formats.md` for the rule a
/// change follows.
pub const VERSION: u32 = 1;
pub const SEGMENT_MAGIC: &[u8; 8] = b"PICOWALS";
pub const MANIFEST_MAGIC: &[u8; 8] = b"PICOWALM";
/// Bytes before a segment's first frame.
pub const SEGMENT_HEADER: usize = 64;
const SEGMENT_HEADER_USED: usize = 44;
/// `u32 len` + `u32 crc32c` + `u64 key` + `u64 trimmed`.
pub const FRAME_HEADER: usize = 24;
/// Written after every frame, and overwritten by the next one: the end of a segment's data is
/// found without relying on what follows (zeros, or a recycled file's stale frames). Never the
/// start of a frame header: a frame's length is never 0.
pub const END_MARKER: [u8; 8] = [0; 8];
pub const MANIFEST: &str = "wal.manifest";
const MANIFEST_TMP: &str = "wal.manifest.tmp";
const MANIFEST_BYTES: usize = 44;

/// What a segment's header says: written and synced when the segment starts, before the
/// manifest names it and before any frame goes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub first: u64,
    pub key: u64,
    /// The file's length when the segment started (preallocated, or extended sparse): a
    /// crash never makes it shorter, so a file shorter than this was cut.
    pub length: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Not a header at all (zeros, a cut file, damage): the bytes say nothing.
    Invalid,
    /// A valid header of a layout this build does not read.
    Version(u32),
}

pub fn encode_segment_header(h: &SegmentHeader) -> [u8; SEGMENT_HEADER] {
    let mut b = [0u8; SEGMENT_HEADER];
    b[..8].copy_from_slice(SEGMENT_MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&h.first.to_le_bytes());
    b[24..32].copy_from_slice(&h.key.to_le_bytes());
    b[32..40].copy_from_slice(&h.length.to_le_bytes());
    let crc = crc32c::crc32c(&b[..40]);
    b[40..SEGMENT_HEADER_USED].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

pub fn decode_segment_header(b: &[u8]) -> Result<SegmentHeader, HeaderError> {
    let b = b.get(..SEGMENT_HEADER_USED).ok_or(HeaderError::Invalid)?;
    if &b[..8] != SEGMENT_MAGIC || crc32c::crc32c(&b[..40]) != u32_at(b, 40) {
        return Err(HeaderError::Invalid);
    }
    let version = u32_at(b, 8);
    if version != VERSION {
        return Err(HeaderError::Version(version));
    }
    Ok(SegmentHeader {
        first: u64_at(b, 16),
        key: u64_at(b, 24),
        length: u64_at(b, 32),
    })
}

/// A frame header: the entry's length, the segment's key and the trim watermark when written
/// (every position `<= trimmed` was committed to objects by then).
pub fn frame_header(len: u32, key: u64, trimmed: u64) -> [u8; FRAME_HEADER] {
    let mut h = [0u8; FRAME_HEADER];
    h[..4].copy_from_slice(&len.to_le_bytes());
    h[8..16].copy_from_slice(&key.to_le_bytes());
    h[16..24].copy_from_slice(&trimmed.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..4]), &h[8..24]);
    h[4..8].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Whether a frame header of the segment keyed `key` starts `h`: returns the entry's length
/// and the frame's trim watermark.
pub fn header_at(h: &[u8], key: u64) -> Option<(usize, u64)> {
    let h = h.get(..FRAME_HEADER)?;
    // The key first: the cheapest test, and the one recovery's byte-by-byte search fails on.
    if u64_at(h, 8) != key {
        return None;
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..4]), &h[8..24]);
    let len = u32_at(h, 0);
    (len > 0 && crc == u32_at(h, 4)).then_some((len as usize, u64_at(h, 16)))
}

/// The WAL's own record of what must be on disk, rewritten (atomically) when a segment starts
/// and before trim removes segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Manifest {
    /// First position and key of the newest segment started, unless trim removed it since: a
    /// segment starting there (or a later one) must exist.
    pub head: Option<(u64, u64)>,
    /// Every position `<= trimmed` was committed to objects: its frames may be gone or damaged.
    pub trimmed: u64,
}

pub fn encode_manifest(m: &Manifest) -> [u8; MANIFEST_BYTES] {
    let mut b = [0u8; MANIFEST_BYTES];
    b[..8].copy_from_slice(MANIFEST_MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&u32::from(m.head.is_some()).to_le_bytes());
    let (first, key) = m.head.unwrap_or((0, 0));
    b[16..24].copy_from_slice(&first.to_le_bytes());
    b[24..32].copy_from_slice(&key.to_le_bytes());
    b[32..40].copy_from_slice(&m.trimmed.to_le_bytes());
    let crc = crc32c::crc32c(&b[..40]);
    b[40..].copy_from_slice(&crc.to_le_bytes());
    b
}

pub fn decode_manifest(b: &[u8]) -> Result<Manifest, HeaderError> {
    if b.len() != MANIFEST_BYTES
        || &b[..8] != MANIFEST_MAGIC
        || crc32c::crc32c(&b[..40]) != u32_at(b, 40)
    {
        return Err(HeaderError::Invalid);
    }
    let version = u32_at(b, 8);
    if version != VERSION {
        return Err(HeaderError::Version(version));
    }
    Ok(Manifest {
        head: (u32_at(b, 12) & 1 == 1).then(|| (u64_at(b, 16), u64_at(b, 24))),
        trimmed: u64_at(b, 32),
    })
}

/// Writes the manifest durably: a synced temporary file renamed over it, then the directory
/// synced. A crash leaves the old manifest or the new one, never a mix.
pub fn write_manifest(dir: &Path, m: &Manifest) -> std::io::Result<()> {
    let tmp = dir.join(MANIFEST_TMP);
    let mut f = File::create(&tmp)?;
    f.write_all(&encode_manifest(m))?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(MANIFEST))?;
    crate::storage::fsync_dir(dir)
}

/// The manifest, `None` when there is none (a new WAL).
pub fn read_manifest(dir: &Path) -> std::io::Result<Option<Result<Manifest, HeaderError>>> {
    match std::fs::read(dir.join(MANIFEST)) {
        Ok(b) => Ok(Some(decode_manifest(&b))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_round_trip_and_reject_damage() {
        let h = SegmentHeader {
            first: 42,
            key: 0x0123_4567_89ab_cdef,
            length: 32 << 20,
        };
        let mut b = encode_segment_header(&h);
        assert_eq!(decode_segment_header(&b), Ok(h));
        assert_eq!(
            decode_segment_header(&b[..SEGMENT_HEADER_USED - 1]),
            Err(HeaderError::Invalid)
        );
        b[20] ^= 1;
        assert_eq!(decode_segment_header(&b), Err(HeaderError::Invalid));
        assert_eq!(
            decode_segment_header(&[0u8; SEGMENT_HEADER]),
            Err(HeaderError::Invalid)
        );

        for m in [
            Manifest {
                head: Some((7, 0xabc)),
                trimmed: 6,
            },
            Manifest {
                head: None,
                trimmed: 9,
            },
        ] {
            let mut b = encode_manifest(&m);
            assert_eq!(decode_manifest(&b), Ok(m));
            b[30] ^= 1;
            assert_eq!(decode_manifest(&b), Err(HeaderError::Invalid));
        }

        let f = frame_header(100, 5, 77);
        assert_eq!(header_at(&f, 5), Some((100, 77)));
        assert_eq!(header_at(&f, 6), None, "another segment's key");
        let mut bad = f;
        bad[17] ^= 1;
        assert_eq!(header_at(&bad, 5), None, "the watermark is checksummed");
        assert_eq!(header_at(&frame_header(0, 5, 0), 5), None, "never empty");
    }

    /// A layout of another version is told apart from damage, so the message can say which.
    #[test]
    fn another_version_is_reported_as_such() {
        let mut b = encode_segment_header(&SegmentHeader {
            first: 1,
            key: 2,
            length: 3,
        });
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&b[..40]);
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode_segment_header(&b), Err(HeaderError::Version(2)));
    }
}
