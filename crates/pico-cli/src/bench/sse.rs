//! A minimal incremental `text/event-stream` parser for the bench's SSE tailers.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    pub event: String,
    pub id: Option<String>,
    /// `data:` lines joined with `\n`.
    pub data: String,
}

#[derive(Debug, Default)]
pub struct Parser {
    buf: Vec<u8>,
    cur: Event,
    has_data: bool,
}

impl Parser {
    /// Feeds bytes; calls `each` for every complete event.
    pub fn feed(&mut self, bytes: &[u8], mut each: impl FnMut(Event)) {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|b| *b == b'\n') {
            let end = start + nl;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            if line.is_empty() {
                if self.has_data || !self.cur.event.is_empty() {
                    each(std::mem::take(&mut self.cur));
                }
                self.has_data = false;
            } else if line[0] != b':' {
                let (field, value) = match line.iter().position(|b| *b == b':') {
                    Some(i) => {
                        let v = &line[i + 1..];
                        (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
                    }
                    None => (line, &b""[..]),
                };
                let value = String::from_utf8_lossy(value);
                match field {
                    b"event" => self.cur.event = value.into_owned(),
                    b"id" => self.cur.id = Some(value.into_owned()),
                    b"data" => {
                        if self.has_data {
                            self.cur.data.push('\n');
                        }
                        self.cur.data.push_str(&value);
                        self.has_data = true;
                    }
                    _ => {}
                }
            }
            start = end + 1;
        }
        self.buf.drain(..start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_and_multiline_data() {
        let raw = b"event: data\nid: 5\ndata:[1,\ndata: 2]\n\n: keepalive\n\nevent: control\r\ndata: {\"a\":1}\r\n\r\n";
        let mut p = Parser::default();
        let mut got = Vec::new();
        for piece in raw.chunks(3) {
            p.feed(piece, |e| got.push(e));
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].event, "data");
        assert_eq!(got[0].id.as_deref(), Some("5"));
        assert_eq!(got[0].data, "[1,\n2]");
        assert_eq!(got[1].event, "control");
        assert_eq!(got[1].data, "{\"a\":1}");
    }
}
