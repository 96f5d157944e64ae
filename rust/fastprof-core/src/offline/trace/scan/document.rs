//! The document's grammar at the top level: the trace object's keys (`traceEvents` and the
//! metadata values), the event list's elements, the close and what may follow it. Each step
//! locates one value in the buffer (`source.rs`) and says what it found.

use std::io::{Cursor, Read};
use std::ops::Range;

use super::recover::{kind, show_byte, too_big};
use super::source::Val;
use super::walk::starts_value;
use super::{Scanner, DEFAULT_BUF};
use crate::error::{CoreError, Result};

/// What the next byte must start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Nothing read yet.
    Start,
    /// In the top-level object: a key or `}`.
    Key,
    /// After a top-level value: `,` or `}`.
    AfterValue,
    /// In an event list: an element or `]`.
    Elem,
    /// After an element: `,` or `]`.
    AfterElem,
    /// The document closed: only blanks may follow.
    Trailing,
    Done,
}

/// What `advance` found, as ranges of `buf` (a lending iterator cannot
/// return a borrow from inside the loop that also refills the buffer).
pub(super) enum Found {
    Event(Range<usize>),
    Meta(Range<usize>),
}

impl Scanner {
    pub(super) fn advance(&mut self) -> Result<Option<Found>> {
        if self.buf.len() > DEFAULT_BUF && self.end - self.start <= DEFAULT_BUF / 2 {
            self.compact();
            self.buf.truncate(DEFAULT_BUF);
            self.buf.shrink_to_fit();
        }
        loop {
            match self.state {
                State::Done => return Ok(None),
                State::Start => self.start_document()?,
                State::Key => {
                    if let Some(found) = self.key_value()? {
                        return Ok(Some(found));
                    }
                }
                State::AfterValue => match self.peek()? {
                    None => return self.truncated("the text ends inside the top-level object"),
                    Some(b',') => {
                        self.start += 1;
                        self.state = State::Key;
                    }
                    Some(b'}') => {
                        self.start += 1;
                        self.last_good = self.offset();
                        self.close_document()?;
                    }
                    Some(_) => return self.cut("expected `,` or `}`"),
                },
                State::Elem => {
                    if let Some(found) = self.element()? {
                        return Ok(Some(found));
                    }
                }
                State::AfterElem => match self.peek()? {
                    None => return self.truncated("the text ends inside the event list"),
                    Some(b',') => {
                        self.start += 1;
                        self.state = State::Elem;
                    }
                    Some(b']') => self.close_list()?,
                    Some(_) => {
                        if !self.resync("expected `,` or `]` after an event")? {
                            return Ok(None);
                        }
                    }
                },
                State::Trailing => self.trailing()?,
            }
        }
    }

    pub(super) fn start_document(&mut self) -> Result<()> {
        while self.end < 3 && self.fill()? {}
        if self.stream_err.is_none() && self.buf[..self.end].starts_with(&[0x1f, 0x8b]) {
            let head = self.buf[..self.end].to_vec();
            let raw = std::mem::replace(&mut self.reader, Box::new(std::io::empty()));
            self.reader = Box::new(flate2::read::MultiGzDecoder::new(
                Cursor::new(head).chain(raw),
            ));
            self.gzip = true;
            self.end = 0;
            self.eof = false;
            while self.end < 3 && self.fill()? {}
        }
        // Some Windows tools prefix a BOM.
        if self.buf[..self.end].starts_with(b"\xEF\xBB\xBF") {
            self.start = 3;
        }
        let Some(b) = self.peek()? else {
            let total = self.total();
            return Err(if total > 0 {
                self.err(total, "no JSON value (only whitespace)")
            } else if let Some(e) = &self.stream_err {
                self.err(0, format!("{e} and yields no data"))
            } else if self.gzip {
                self.err(0, "gzip stream holds no data")
            } else {
                self.err(0, "empty file")
            });
        };
        let at = self.offset();
        match b {
            b'{' => {
                self.doc_open = at;
                self.state = State::Key;
            }
            b'[' => {
                self.top_array = true;
                self.in_list = true;
                self.last_good = at + 1;
                self.state = State::Elem;
            }
            _ => {
                // Enough text to name what it is.
                while self.end - self.start < 5 && self.fill()? {}
                let rest = &self.buf[self.start..self.end];
                let found = match b {
                    b'"' => Some("a string"),
                    b'-' | b'0'..=b'9' => Some("a number"),
                    _ if rest.starts_with(b"true") || rest.starts_with(b"false") => {
                        Some("a boolean")
                    }
                    _ if rest.starts_with(b"null") => Some("null"),
                    _ => None,
                };
                return Err(match found {
                    Some(what) => self.err(
                        at,
                        format!(
                            "not a trace: expected a JSON object with a traceEvents array, found {what}"
                        ),
                    ),
                    None => self.err(
                        at,
                        format!("not JSON: expected `{{` or `[`, found {}", show_byte(b)),
                    ),
                });
            }
        }
        self.start += 1;
        Ok(())
    }

    /// In the top-level object, expecting a key or `}`.
    pub(super) fn key_value(&mut self) -> Result<Option<Found>> {
        match self.peek()? {
            None => return self.truncated("the text ends inside the top-level object"),
            Some(b'}') => {
                self.start += 1;
                self.last_good = self.offset();
                self.close_document()?;
                return Ok(None);
            }
            Some(b'"') => {}
            Some(_) => return self.cut("expected a key string"),
        }
        let key_at = self.offset();
        let len = match self.value()? {
            Val::Done { len, bad: None } => len,
            Val::Cut => return self.truncated("the text ends inside a key"),
            _ => return self.cut("unreadable key"),
        };
        let raw = &self.buf[self.start..self.start + len];
        self.key = match serde_json::from_slice::<String>(raw) {
            Ok(key) => key,
            Err(_) => {
                let lossy = String::from_utf8_lossy(&raw[1..raw.len() - 1]).into_owned();
                self.warn(format!(
                    "key at byte {key_at} is not valid UTF-8 or has a bad escape; read as {lossy:?}"
                ));
                lossy
            }
        };
        self.start += len;
        match self.peek()? {
            None => return self.truncated("the text ends after a key"),
            Some(b':') => self.start += 1,
            Some(_) => return self.cut("expected `:` after a key"),
        }
        let is_events = self.key == "traceEvents";
        match self.peek()? {
            None => return self.truncated("the text ends after a key"),
            Some(b'[') if is_events => {
                self.start += 1;
                self.in_list = true;
                self.last_good = self.offset();
                self.state = State::Elem;
                return Ok(None);
            }
            Some(b) if !starts_value(b) => return self.cut("expected a value"),
            Some(_) => {}
        }
        let at = self.offset();
        let (len, bad) = match self.value()? {
            Val::Cut => return self.truncated("the text ends inside a top-level value"),
            Val::TooBig { len } => {
                self.last_good = self.offset();
                self.state = State::AfterValue;
                if is_events {
                    self.bad_events_value = Some((at, "too big to read"));
                } else {
                    let key = self.key.clone();
                    self.warn(format!(
                        "dropped the value of {key:?} at byte {at}: {}",
                        too_big(len)
                    ));
                }
                return Ok(None);
            }
            Val::Done { len, bad } => (len, bad),
        };
        let range = self.start..self.start + len;
        self.start += len;
        self.last_good = self.offset();
        self.state = State::AfterValue;
        if is_events {
            self.bad_events_value = Some((at, kind(self.buf[range.start])));
            return Ok(None);
        }
        if let Some((bad_at, why)) = bad {
            let key = self.key.clone();
            self.warn(format!(
                "dropped the unreadable value of {key:?} at byte {at} ({why} at byte {bad_at})"
            ));
            return Ok(None);
        }
        Ok(Some(Found::Meta(range)))
    }

    /// In an event list, expecting an element or `]`.
    pub(super) fn element(&mut self) -> Result<Option<Found>> {
        let b = match self.peek()? {
            None => return self.truncated("the text ends inside the event list"),
            Some(b']') => {
                self.close_list()?;
                return Ok(None);
            }
            Some(b) => b,
        };
        if !starts_value(b) {
            let nothing_yet = self.events + self.non_objects + self.dropped == 0;
            if self.top_array && nothing_yet {
                let at = self.offset();
                return Err(self.err(
                    at,
                    format!(
                        "not a trace: expected an event object, found {}",
                        show_byte(b)
                    ),
                ));
            }
            self.resync("expected an event object")?;
            return Ok(None);
        }
        let at = self.offset();
        let val = self.value()?;
        self.state = State::AfterElem;
        let (len, bad) = match val {
            Val::Cut => return self.truncated("the text ends inside an event"),
            Val::TooBig { len } => {
                self.dropped += 1;
                self.last_good = self.offset();
                self.warn(format!("dropped the event at byte {at}: {}", too_big(len)));
                return Ok(None);
            }
            Val::Done { len, bad } => (len, bad),
        };
        let range = self.start..self.start + len;
        self.start += len;
        self.last_good = self.offset();
        if let Some((bad_at, why)) = bad {
            self.dropped += 1;
            self.warn(format!(
                "dropped the unreadable event at byte {at} ({why} at byte {bad_at})"
            ));
            return Ok(None);
        }
        if b != b'{' {
            self.non_objects += 1;
            self.warn(format!(
                "ignored a traceEvents entry that is not an object ({}) at byte {at}",
                kind(b)
            ));
            return Ok(None);
        }
        self.events += 1;
        Ok(Some(Found::Event(range)))
    }

    /// At `]` closing an event list.
    pub(super) fn close_list(&mut self) -> Result<()> {
        self.start += 1;
        self.last_good = self.offset();
        if self.top_array {
            self.close_document()
        } else {
            self.state = State::AfterValue;
            Ok(())
        }
    }

    /// The top-level value closed: is it a trace?
    pub(super) fn close_document(&mut self) -> Result<()> {
        if self.top_array && self.events == 0 && self.non_objects > 0 {
            return Err(self.err(
                self.last_good,
                "not a trace: the array holds no event objects",
            ));
        }
        if !self.in_list {
            return Err(self.no_trace_events());
        }
        self.state = State::Trailing;
        Ok(())
    }

    pub(super) fn no_trace_events(&self) -> CoreError {
        match self.bad_events_value {
            Some((at, found)) => self.err(
                at,
                format!("not a trace: traceEvents is {found}, not an array"),
            ),
            None => self.err(
                self.doc_open,
                "not a trace: the object has no traceEvents array",
            ),
        }
    }

    /// Only blanks (and NUL padding a crashed file system leaves) may follow
    /// a complete document; anything else is reported but spoils nothing.
    pub(super) fn trailing(&mut self) -> Result<()> {
        let mut first = None;
        loop {
            if first.is_none() {
                let rest = &self.buf[self.start..self.end];
                if let Some(i) = rest
                    .iter()
                    .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0))
                {
                    first = Some(self.offset() + i as u64);
                }
            }
            self.start = self.end;
            if !self.fill()? {
                break;
            }
        }
        if let Some(at) = first {
            let n = self.total() - at;
            self.warn(format!(
                "ignored {n} bytes after the end of the trace at byte {at}"
            ));
        }
        if let Some(e) = self.stream_err.clone() {
            self.warn(format!("{e} after the end of the JSON document"));
        }
        self.finish();
        Ok(())
    }

    pub(super) fn finish(&mut self) {
        self.state = State::Done;
        if self.suppressed > 0 {
            let msg = format!(
                "{}: {} more warning(s) not shown",
                self.path.display(),
                self.suppressed
            );
            self.warnings.push(msg);
            self.suppressed = 0;
        }
    }
}
