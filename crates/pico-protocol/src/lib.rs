//! PicoMQ sans-IO wire vocabulary. No IO happens here.
//!
//! - [`record`]: [`Record`], the record every protocol translates to and from.
//! - [`batch`]: the stored record format (Kafka RecordBatch v2, CRC-32C).
//! - [`compression`]: bounded decompression of Kafka producers' compressed batches.
//! - [`headers`]: Pico and Durable Streams header names, batch content types.
//! - [`ds_json`]: Durable Streams JSON mode (flatten one level, render arrays).
//! - [`json_batch`]: the `application/vnd.picomq.batch+json` body and the `json` read format,
//!   both directions (the server parses batches and renders reads, the client the reverse);
//!   [`json_render`] renders that format a piece at a time for large reads.
//! - [`binary`]: the `application/vnd.picomq.batch` framing.
//! - [`cursor`]: live-read cursors that keep CDN cache keys moving.
//! - [`offset`]: text forms of record offsets (Durable Streams).
//! - [`number`]: strict decimal parsing for TTLs and other integer headers.
//! - `reader`: the bounds-checked byte reader both binary codecs decode with.

pub mod batch;
pub mod binary;
pub mod compression;
pub mod cursor;
pub mod ds_json;
pub mod headers;
pub mod json_batch;
pub mod json_render;
pub mod number;
pub mod offset;
mod reader;
pub mod record;

pub use batch::{
    BatchError, BatchRecords, DecodedBatch, ProducedBatch, batch_records, batch_records_verified,
    check_produced, crc_parts, decode_batch, encode_batch, record_count, set_base_offset,
    stamp_batch,
};
pub use binary::{
    BinaryError, MAX_HEADER_KEY_LEN, MAX_HEADERS, MAX_HEADERS_PER_APPEND, check_storable,
    decode_binary, decode_binary_append, decode_binary_records, encode_binary,
};
pub use json_batch::{
    JsonBatchError, JsonReadError, encode_json_batch, parse_json_batch, parse_read_json,
    record_to_json, render_json,
};
pub use number::{NumberError, parse_strict_u64, push_decimal};
pub use offset::{OffsetError, OffsetSpec, format_offset, parse_offset, push_offset};
pub use record::Record;
