//! A minimal incremental `text/event-stream` parser for the bench's SSE tailers.
//!
//! With 1000 tailers every append is parsed 1000 times on the machine that also runs the
//! server, so the parser allocates nothing per event: events are handed out as borrowed
//! slices of buffers that are reused, and bytes are copied only when a line is cut between
//! two reads.

/// One dispatched event, borrowed from the parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    pub event: &'a [u8],
    pub id: Option<&'a [u8]>,
    /// `data:` lines joined with `\n`.
    pub data: &'a [u8],
}

#[derive(Debug, Default)]
struct Current {
    event: Vec<u8>,
    id: Vec<u8>,
    has_id: bool,
    data: Vec<u8>,
    has_data: bool,
}

#[derive(Debug, Default)]
pub struct Parser {
    /// An incomplete line carried over from the previous read.
    carry: Vec<u8>,
    cur: Current,
}

impl Parser {
    /// Feeds bytes; calls `each` for every complete event and stops at its first error.
    pub fn feed<E>(
        &mut self,
        bytes: &[u8],
        mut each: impl FnMut(Event<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.carry.is_empty() {
            let used = lines(&mut self.cur, bytes, &mut each)?;
            self.carry.extend_from_slice(&bytes[used..]);
        } else {
            self.carry.extend_from_slice(bytes);
            // `carry` never holds a newline, so without one in `bytes` there is still no
            // complete line: a long line arriving in many reads is scanned once, not per read.
            if memchr::memchr(b'\n', bytes).is_none() {
                return Ok(());
            }
            let used = lines(&mut self.cur, &self.carry, &mut each)?;
            self.carry.drain(..used);
        }
        Ok(())
    }
}

/// Handles every complete line of `input`; returns how many bytes that was.
fn lines<E>(
    cur: &mut Current,
    input: &[u8],
    each: &mut impl FnMut(Event<'_>) -> Result<(), E>,
) -> Result<usize, E> {
    let mut start = 0;
    while let Some(nl) = memchr::memchr(b'\n', &input[start..]) {
        let end = start + nl;
        let mut line = &input[start..end];
        start = end + 1;
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        if line.is_empty() {
            if cur.has_data || !cur.event.is_empty() {
                let r = each(Event {
                    event: &cur.event,
                    id: cur.has_id.then_some(&cur.id[..]),
                    data: &cur.data,
                });
                cur.event.clear();
                cur.id.clear();
                cur.has_id = false;
                cur.data.clear();
                cur.has_data = false;
                r?;
            }
            continue;
        }
        if line[0] == b':' {
            continue; // a comment (keep-alive)
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"event" => {
                cur.event.clear();
                cur.event.extend_from_slice(value);
            }
            b"id" => {
                cur.id.clear();
                cur.id.extend_from_slice(value);
                cur.has_id = true;
            }
            b"data" => {
                if cur.has_data {
                    cur.data.push(b'\n');
                }
                cur.data.extend_from_slice(value);
                cur.has_data = true;
            }
            _ => {}
        }
    }
    Ok(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Owned {
        event: String,
        id: Option<String>,
        data: String,
    }

    fn parse_in_pieces(raw: &[u8], piece: usize) -> Vec<Owned> {
        let mut p = Parser::default();
        let mut got = Vec::new();
        let s = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
        for chunk in raw.chunks(piece) {
            p.feed(chunk, |e| {
                got.push(Owned {
                    event: s(e.event),
                    id: e.id.map(s),
                    data: s(e.data),
                });
                Ok::<(), ()>(())
            })
            .unwrap();
        }
        got
    }

    #[test]
    fn events_split_anywhere_and_multiline_data() {
        let raw = b"event: data\nid: 5\ndata:[1,\ndata: 2]\n\n: keepalive\n\nevent: control\r\ndata: {\"a\":1}\r\n\r\nevent: data\ndata:x\n\n";
        for piece in [1, 3, 7, raw.len()] {
            let got = parse_in_pieces(raw, piece);
            assert_eq!(got.len(), 3, "piece {piece}");
            assert_eq!(got[0].event, "data");
            assert_eq!(got[0].id.as_deref(), Some("5"));
            assert_eq!(got[0].data, "[1,\n2]");
            assert_eq!(got[1].event, "control");
            assert_eq!(got[1].id, None, "an id does not leak into the next event");
            assert_eq!(got[1].data, "{\"a\":1}");
            assert_eq!(got[2].data, "x");
        }
    }

    #[test]
    fn a_long_line_over_many_reads_is_one_event() {
        let long = "y".repeat(100_000);
        let raw = format!("event: data\ndata:{long}\n\nevent: control\ndata:c\n\n");
        for piece in [999, 4096] {
            let got = parse_in_pieces(raw.as_bytes(), piece);
            assert_eq!(got.len(), 2, "piece {piece}");
            assert_eq!(got[0].data, long);
            assert_eq!(got[1].data, "c");
        }
    }

    #[test]
    fn an_error_stops_the_feed() {
        let mut p = Parser::default();
        let mut seen = 0;
        let r = p.feed(b"data:a\n\ndata:b\n\n", |_| {
            seen += 1;
            Err("stop")
        });
        assert_eq!(r, Err("stop"));
        assert_eq!(seen, 1);
    }
}
