//! The `event: data` frame of a large read, rendered a piece at a time.
//!
//! SSE framing can multiply a payload: every line gets `data:` and a line end, so a record of
//! newlines renders at 6× its size (base64 at 4/3). A read always returns at least one record
//! whole, so rendering a 32 MiB record at once would cost ~200 MB per subscriber. This writer
//! holds the read's record values (shared with the cache, not copied) and renders at most about
//! [`CHUNK`] bytes per call: a subscriber's memory stays bounded whatever the record size.
//!
//! Its output is byte for byte what [`super::sse::data_frame`] renders at once (the tests and a
//! property test pin that): the payload is the concatenation of the values (a JSON array of them
//! for JSON streams), read as UTF-8 with invalid sequences replaced, or base64 for binary types;
//! CR, LF and CRLF each end a line, even where a record boundary splits a CRLF or a character.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use std::collections::VecDeque;

use super::sse::Render;

/// Output per call, roughly (a call stops after the input slice that crosses it).
pub const CHUNK: usize = 64 * 1024;

/// Input consumed per step: its rendering is at most 6× (a run of empty lines) plus a prefix.
const STEP: usize = 8 * 1024;

pub struct DataFrameWriter {
    /// Payload pieces still to render, in order.
    input: VecDeque<Bytes>,
    text: bool,
    started: bool,
    finished: bool,
    /// Text: an incomplete UTF-8 sequence cut by a piece boundary. Base64: up to 2 bytes
    /// short of a 3-byte group.
    carry: Vec<u8>,
    framer: LineFramer,
}

impl DataFrameWriter {
    pub fn new(values: impl IntoIterator<Item = Bytes>, render: Render) -> DataFrameWriter {
        let mut input = VecDeque::new();
        if render.json {
            input.push_back(Bytes::from_static(b"["));
            for (i, v) in values.into_iter().enumerate() {
                if i > 0 {
                    input.push_back(Bytes::from_static(b","));
                }
                input.push_back(v);
            }
            input.push_back(Bytes::from_static(b"]"));
        } else {
            input.extend(values.into_iter().filter(|v| !v.is_empty()));
        }
        DataFrameWriter {
            input,
            text: render.text,
            started: false,
            finished: false,
            carry: Vec::new(),
            framer: LineFramer::default(),
        }
    }

    /// The next piece of the frame; `None` once it is all out.
    pub fn next_chunk(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        let mut out = Vec::with_capacity(CHUNK + 1024);
        if !self.started {
            self.started = true;
            out.extend_from_slice(b"event: data\n");
        }
        while out.len() < CHUNK {
            let Some(front) = self.input.front_mut() else {
                self.finish(&mut out);
                break;
            };
            let piece = front.split_to(front.len().min(STEP));
            if front.is_empty() {
                self.input.pop_front();
            }
            if self.text {
                self.text_piece(&piece, &mut out);
            } else {
                self.base64_piece(&piece, &mut out);
            }
        }
        Some(Bytes::from(out))
    }

    /// Decodes `piece` (after the carried bytes) as UTF-8, replacing invalid sequences as
    /// `String::from_utf8_lossy` does, and keeps an incomplete sequence at its end for later.
    fn text_piece(&mut self, piece: &[u8], out: &mut Vec<u8>) {
        let joined;
        let mut rest: &[u8] = if self.carry.is_empty() {
            piece
        } else {
            self.carry.extend_from_slice(piece);
            joined = std::mem::take(&mut self.carry);
            &joined
        };
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.framer.feed(s.as_bytes(), out);
                    return;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    self.framer.feed(valid, out);
                    match e.error_len() {
                        Some(n) => {
                            self.framer.feed("\u{FFFD}".as_bytes(), out);
                            rest = &after[n..];
                        }
                        None => {
                            // Cut by the end of this piece: the next one may complete it.
                            self.carry.extend_from_slice(after);
                            return;
                        }
                    }
                }
            }
        }
    }

    fn base64_piece(&mut self, piece: &[u8], out: &mut Vec<u8>) {
        self.carry.extend_from_slice(piece);
        let whole = self.carry.len() / 3 * 3;
        let encoded = STANDARD.encode(&self.carry[..whole]);
        self.carry.drain(..whole);
        self.framer.feed(encoded.as_bytes(), out);
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.carry.is_empty() {
            let tail = std::mem::take(&mut self.carry);
            if self.text {
                // What is left is an incomplete sequence at the very end: one replacement.
                self.framer.feed("\u{FFFD}".as_bytes(), out);
            } else {
                self.framer.feed(STANDARD.encode(&tail).as_bytes(), out);
            }
        }
        self.framer.finish(out);
        self.finished = true;
    }
}

impl crate::pieces::Render for DataFrameWriter {
    fn next_chunk(&mut self) -> Option<Bytes> {
        DataFrameWriter::next_chunk(self)
    }
}

/// Turns payload bytes into `data:` lines, fed in pieces.
#[derive(Default)]
struct LineFramer {
    /// The next byte starts a line (its `data:` prefix is not written yet).
    mid_line: bool,
    /// The last piece ended with CR: an LF starting the next one belongs to it.
    after_cr: bool,
}

impl LineFramer {
    fn feed(&mut self, mut p: &[u8], out: &mut Vec<u8>) {
        if p.is_empty() {
            return;
        }
        if std::mem::take(&mut self.after_cr) && p[0] == b'\n' {
            p = &p[1..];
        }
        while !p.is_empty() {
            if !self.mid_line {
                // Parsers strip one space after the colon: a line starting with one keeps it.
                out.extend_from_slice(if p[0] == b' ' { b"data: " } else { b"data:" });
                self.mid_line = true;
            }
            match p.iter().position(|&b| b == b'\r' || b == b'\n') {
                Some(i) => {
                    out.extend_from_slice(&p[..i]);
                    out.push(b'\n');
                    self.mid_line = false;
                    let mut skip = i + 1;
                    if p[i] == b'\r' {
                        match p.get(i + 1) {
                            Some(b'\n') => skip += 1,
                            Some(_) => {}
                            None => self.after_cr = true,
                        }
                    }
                    p = &p[skip..];
                }
                None => {
                    out.extend_from_slice(p);
                    return;
                }
            }
        }
    }

    /// Ends the last line (an empty one if the payload ended with a line end) and the event.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.mid_line {
            out.extend_from_slice(b"data:");
        }
        out.extend_from_slice(b"\n\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What `data_frame` renders at once for these values.
    fn at_once(values: &[Vec<u8>], render: Render) -> Vec<u8> {
        let body: Vec<u8> = if render.json {
            pico_protocol::ds_json::render_array(values.iter().map(|v| &v[..]))
        } else {
            values.concat()
        };
        let payload = if render.text {
            String::from_utf8_lossy(&body).into_owned()
        } else {
            STANDARD.encode(&body)
        };
        let mut out = Vec::new();
        super::super::sse::frame(&mut out, "data", &payload);
        out
    }

    fn lazily(values: &[Vec<u8>], render: Render) -> (Vec<u8>, usize) {
        let mut w = DataFrameWriter::new(values.iter().map(|v| Bytes::from(v.clone())), render);
        let (mut out, mut largest) = (Vec::new(), 0);
        while let Some(c) = w.next_chunk() {
            largest = largest.max(c.len());
            out.extend_from_slice(&c);
        }
        (out, largest)
    }

    const TEXT: Render = Render {
        json: false,
        text: true,
    };
    const BINARY: Render = Render {
        json: false,
        text: false,
    };
    const JSON: Render = Render {
        json: true,
        text: true,
    };

    #[test]
    fn a_record_of_newlines_renders_in_bounded_pieces() {
        let values = vec![vec![b'\n'; 1 << 20]];
        let (out, largest) = lazily(&values, TEXT);
        assert_eq!(out, at_once(&values, TEXT));
        assert!(out.len() > 6 << 20, "{}", out.len());
        assert!(
            largest <= CHUNK + 6 * STEP + 64,
            "a piece of {largest} bytes"
        );
    }

    #[test]
    fn boundaries_inside_crlf_and_characters_render_as_the_whole() {
        let cases: Vec<Vec<Vec<u8>>> = vec![
            vec![b"a\r".to_vec(), b"\nb".to_vec()],
            vec![b"a\r".to_vec(), b"".to_vec(), b"\nb".to_vec()],
            vec!["é".as_bytes()[..1].to_vec(), "é".as_bytes()[1..].to_vec()],
            vec![b"x\xe2\x82".to_vec()],
            vec![b"\xff\n".to_vec(), b" lead".to_vec()],
            vec![b"line\n".to_vec()],
            vec![],
            vec![b"".to_vec()],
        ];
        for values in cases {
            for render in [TEXT, BINARY, JSON] {
                assert_eq!(
                    lazily(&values, render).0,
                    at_once(&values, render),
                    "{values:?} {render:?}"
                );
            }
        }
    }

    proptest! {
        // Pieces over 8 KiB cross the writer's input steps; a few dozen cases suffice.
        #![proptest_config(ProptestConfig::with_cases(40))]
        #[test]
        fn prop_matches_rendering_at_once(
            values in proptest::collection::vec(
                proptest::collection::vec(
                    prop_oneof![
                        Just(b'\r'), Just(b'\n'), Just(b' '), Just(b'a'),
                        Just(0xe2u8), Just(0x82u8), Just(0xacu8), Just(0xffu8), any::<u8>()
                    ],
                    0..20_000,
                ),
                0..5,
            ),
            json in any::<bool>(),
            text in any::<bool>(),
        ) {
            let render = Render { json: json && text, text };
            prop_assert_eq!(lazily(&values, render).0, at_once(&values, render));
        }
    }
}
