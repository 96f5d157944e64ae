//! Streaming scan of Chrome-trace JSON in constant memory, for `fastprof merge`.
//!
//! Owns the byte-level walk over a trace of any size (plain or gzip, single-
//! or multi-member; object `{"traceEvents": [...]}` or array `[ev, ...]`
//! format). It yields each event and each other top-level value as its raw
//! bytes, so the merger copies events through and rewrites only the few fields
//! [`Fields`] locates, without building a DOM. Memory is one refillable buffer
//! that grows only to hold a single huge value and shrinks back after it.
//!
//! Events are bytes, never validated as UTF-8 (torch writes raw C++ symbol
//! bytes into names), but the walk does check what copy-through needs for the
//! output to stay valid JSON: balanced and matching brackets, legal escapes,
//! no control characters inside strings and no stray bytes between tokens. A
//! value failing that is dropped with a warning, like the salvaging
//! [`crate::reader`] does, whose outcomes this module mirrors: a truncated
//! input ends with a [`Salvage`] after every complete event, and input that is
//! no trace at all is a [`CoreError::Trace`].

use std::io::{Cursor, Read};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{CoreError, Result};

/// Working buffer size. Large enough that a plain file is read in few
/// syscalls and a Kineto event (~300 bytes) rarely straddles a refill.
const DEFAULT_BUF: usize = 1 << 20;
/// One value larger than this is dropped (discarded while scanned, never held)
/// so that a file that is one unclosed `{` cannot take all memory.
const MAX_VALUE: usize = 64 << 20;
/// Warnings kept one by one; later ones are only counted.
const MAX_WARNINGS: usize = 64;
/// Bracket kinds are checked for the first `64 * STACK_WORDS` nesting levels;
/// deeper ones are only counted.
const STACK_WORDS: usize = 1024;

/// One step of a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// A top-level object key other than "traceEvents", with its complete raw JSON value.
    Meta { key: &'a str, raw: &'a [u8] },
    /// One element of the traceEvents array (or of a top-level array-format
    /// trace): the raw bytes of the JSON object `{...}`. Elements that are not
    /// objects are skipped with a warning, as the reader does.
    Event(&'a [u8]),
}

/// How a truncated input ended: every complete event before `offset` was yielded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Salvage {
    /// Byte (of the decompressed text) just after the last value that was used.
    pub offset: u64,
    /// Bytes of decompressed text from `offset` to the end of the input.
    pub unused_bytes: u64,
    /// Why reading stopped, naming the failing byte and any gzip error.
    pub reason: String,
}

/// Compressed bytes read from the source, and whether the source itself failed.
#[derive(Default)]
struct Counters {
    read: AtomicU64,
    failed: AtomicBool,
}

/// Counts the bytes the decoder pulls from the source. Relaxed ordering is
/// enough: both atomics are written and read on the scanning thread (the
/// decoder runs inside `next_item`); they sit behind an `Arc` only because
/// this reader is buried inside the boxed decoder chain.
struct Counting<R> {
    inner: R,
    counters: Arc<Counters>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let result = self.inner.read(out);
        match &result {
            Ok(n) => {
                self.counters.read.fetch_add(*n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() != std::io::ErrorKind::Interrupted => {
                self.counters.failed.store(true, Ordering::Relaxed);
            }
            Err(_) => {}
        }
        result
    }
}

/// What the next byte must start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
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

/// A value located by `Scanner::value`.
enum Val {
    /// Complete, `len` bytes from `start`; `bad` when unfit to copy through.
    Done {
        len: usize,
        bad: Option<(u64, &'static str)>,
    },
    /// Larger than the limit; already discarded (`start` is past it).
    TooBig { len: u64 },
    /// The input ended inside it.
    Cut,
}

/// What `advance` found, as ranges of `buf` (a lending iterator cannot
/// return a borrow from inside the loop that also refills the buffer).
enum Found {
    Event(Range<usize>),
    Meta(Range<usize>),
}

/// A streaming Chrome-trace scanner: see the module docs.
pub struct Scanner {
    path: PathBuf,
    reader: Box<dyn Read + Send>,
    counters: Arc<Counters>,
    /// A failing read is an I/O error on our file, not a broken stream.
    file_backed: bool,
    gzip: bool,
    /// `buf[start..end]` is unconsumed text; `buf[0]` is byte `base` of the text.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    base: u64,
    eof: bool,
    /// Why the stream stopped early (gzip corrupt or truncated, read error).
    stream_err: Option<String>,
    state: State,
    top_array: bool,
    /// An event list has been opened: a cut from now on is a salvage.
    in_list: bool,
    /// Offset just after the last value used: where a salvage cuts.
    last_good: u64,
    doc_open: u64,
    events: u64,
    non_objects: u64,
    dropped: u64,
    bad_events_value: Option<(u64, &'static str)>,
    key: String,
    stack: Box<[u64; STACK_WORDS]>,
    max_value: usize,
    salvage: Option<Salvage>,
    warnings: Vec<String>,
    suppressed: u64,
}

impl Scanner {
    /// Open a file: gzip (magic 1f 8b; multi-member OK) or plain.
    pub fn open(path: &Path) -> Result<Scanner> {
        let file = std::fs::File::open(path).map_err(|e| CoreError::io(path, e))?;
        let mut scanner = Scanner::from_reader(path, Box::new(file));
        scanner.file_backed = true;
        Ok(scanner)
    }

    /// Scan `r`, plain or gzip (detected by its magic bytes like [`Scanner::open`]);
    /// `path_for_messages` only names the source in warnings and errors. Read
    /// errors of `r` count as a truncated stream.
    pub fn from_reader(path_for_messages: &Path, r: Box<dyn Read + Send>) -> Scanner {
        let counters = Arc::new(Counters::default());
        Scanner {
            path: path_for_messages.to_path_buf(),
            reader: Box::new(Counting {
                inner: r,
                counters: Arc::clone(&counters),
            }),
            counters,
            file_backed: false,
            gzip: false,
            buf: vec![0; DEFAULT_BUF],
            start: 0,
            end: 0,
            base: 0,
            eof: false,
            stream_err: None,
            state: State::Start,
            top_array: false,
            in_list: false,
            last_good: 0,
            doc_open: 0,
            events: 0,
            non_objects: 0,
            dropped: 0,
            bad_events_value: None,
            key: String::new(),
            stack: Box::new([0; STACK_WORDS]),
            max_value: MAX_VALUE,
            salvage: None,
            warnings: Vec::new(),
            suppressed: 0,
        }
    }

    /// Next item, or None at the end. A lending iterator: the slices live
    /// until the next call. After an `Err` every further call returns `None`.
    pub fn next_item(&mut self) -> Result<Option<Item<'_>>> {
        let found = match self.advance() {
            Ok(found) => found,
            Err(e) => {
                self.state = State::Done;
                return Err(e);
            }
        };
        Ok(found.map(|f| match f {
            Found::Event(r) => Item::Event(&self.buf[r]),
            Found::Meta(r) => Item::Meta {
                key: &self.key,
                raw: &self.buf[r],
            },
        }))
    }

    /// Decompressed bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.base + self.start as u64
    }

    /// Bytes read from the file (compressed, for gzip) so far.
    pub fn compressed_read(&self) -> u64 {
        self.counters.read.load(Ordering::Relaxed)
    }

    /// After `next_item` returned None: how a truncated input ended, or None
    /// when the document ended cleanly.
    pub fn salvage(&self) -> Option<&Salvage> {
        self.salvage.as_ref()
    }

    /// Non-fatal problems seen so far, each naming the file and a byte offset.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Events yielded so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    fn advance(&mut self) -> Result<Option<Found>> {
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

    fn start_document(&mut self) -> Result<()> {
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
    fn key_value(&mut self) -> Result<Option<Found>> {
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
    fn element(&mut self) -> Result<Option<Found>> {
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
    fn close_list(&mut self) -> Result<()> {
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
    fn close_document(&mut self) -> Result<()> {
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

    fn no_trace_events(&self) -> CoreError {
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
    fn trailing(&mut self) -> Result<()> {
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

    fn finish(&mut self) {
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

    /// The input ended early: a salvage once an event list has been opened,
    /// an error before.
    fn truncated<T>(&mut self, why: &str) -> Result<Option<T>> {
        let at = self.total();
        let reason = match &self.stream_err {
            Some(e) => format!("{e}; {why} at byte {at}"),
            None => format!("{why} at byte {at}"),
        };
        self.stop(at, reason)
    }

    /// The text turned into something unreadable outside any event list.
    fn cut<T>(&mut self, why: &str) -> Result<Option<T>> {
        let at = self.offset();
        let b = self.buf.get(self.start).copied().unwrap_or(0);
        let reason = format!("{why}, found {} at byte {at}", show_byte(b));
        if self.in_list {
            // Count what is left, for `unused_bytes`.
            loop {
                self.start = self.end;
                if !self.fill()? {
                    break;
                }
            }
        }
        self.stop(at, reason)
    }

    fn stop<T>(&mut self, at: u64, reason: String) -> Result<Option<T>> {
        if self.top_array && self.events == 0 && self.non_objects > 0 {
            return Err(self.err(at, "not a trace: the array holds no event objects"));
        }
        if !self.in_list {
            if self.bad_events_value.is_some() {
                return Err(self.no_trace_events());
            }
            return Err(self.err(at, format!("cannot read the trace: {reason}")));
        }
        self.salvage = Some(Salvage {
            offset: self.last_good,
            unused_bytes: self.total().saturating_sub(self.last_good),
            reason,
        });
        self.finish();
        Ok(None)
    }

    /// Skip unexpected bytes in an event list up to the next `{` (or the `]`
    /// closing the list). False when the input ended first (a salvage).
    fn resync(&mut self, why: &str) -> Result<bool> {
        let at = self.offset();
        let found_at = loop {
            let rest = &self.buf[self.start..self.end];
            if let Some(i) = rest.iter().position(|&b| b == b'{' || b == b']') {
                self.start += i;
                break self.offset();
            }
            self.start = self.end;
            if !self.fill()? {
                self.truncated::<()>(&format!(
                    "{why}: unexpected text from byte {at} up to the end"
                ))?;
                return Ok(false);
            }
        };
        self.warn(format!(
            "{why} at byte {at}; skipped {} bytes to the next event",
            found_at - at
        ));
        self.state = State::Elem;
        Ok(true)
    }

    /// Locate the value starting at `buf[start]` (a byte for which
    /// `starts_value` holds), refilling as needed. Does not move `start`
    /// unless the value was too big to hold.
    fn value(&mut self) -> Result<Val> {
        let first = self.buf[self.start];
        let mut w = Walk::default();
        let mut discarded = 0u64;
        loop {
            let buf = &self.buf[self.start..self.end];
            let done = if matches!(first, b'{' | b'[' | b'"') {
                walk(buf, &mut w, &mut self.stack, self.base + self.start as u64)
            } else {
                match buf[w.off..].iter().position(|&b| !is_token_byte(b)) {
                    Some(i) => {
                        w.off += i;
                        true
                    }
                    None => {
                        w.off = buf.len();
                        false
                    }
                }
            };
            if done {
                if discarded > 0 {
                    self.start += w.off;
                    return Ok(Val::TooBig {
                        len: discarded + w.off as u64,
                    });
                }
                let bad = w.bad.or_else(|| {
                    let tok = &self.buf[self.start..self.start + w.off];
                    (!matches!(first, b'{' | b'[' | b'"') && !valid_scalar(tok))
                        .then(|| (self.offset(), "not a JSON value"))
                });
                return Ok(Val::Done { len: w.off, bad });
            }
            if w.off > self.max_value {
                discarded += w.off as u64;
                self.start += w.off;
                w.off = 0;
            }
            if !self.fill()? {
                return Ok(Val::Cut);
            }
        }
    }

    /// Skip blanks, refilling; the next byte, or None at the end of input.
    fn peek(&mut self) -> Result<Option<u8>> {
        loop {
            while self.start < self.end {
                let b = self.buf[self.start];
                if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                    return Ok(Some(b));
                }
                self.start += 1;
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.base += self.start as u64;
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Read more text after `buf[start..end]`, compacting first (so callers
    /// keep offsets relative to `start`) and growing only when the unconsumed
    /// text fills the buffer. False at the end of input or on a broken stream.
    fn fill(&mut self) -> Result<bool> {
        if self.eof {
            return Ok(false);
        }
        self.compact();
        if self.end == self.buf.len() {
            let grown = (self.buf.len() * 2).max(DEFAULT_BUF);
            self.buf.resize(grown, 0);
        }
        loop {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end += n.min(self.buf.len() - self.end);
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.eof = true;
                    if self.file_backed && self.counters.failed.load(Ordering::Relaxed) {
                        return Err(CoreError::io(&self.path, e));
                    }
                    let at = self.compressed_read();
                    self.stream_err = Some(if self.gzip {
                        format!("gzip stream truncated or corrupt at compressed byte {at} ({e})")
                    } else {
                        format!("read failed at byte {at} ({e})")
                    });
                    return Ok(false);
                }
            }
        }
    }

    /// Decompressed bytes read from the input so far.
    fn total(&self) -> u64 {
        self.base + self.end as u64
    }

    fn err(&self, offset: u64, reason: impl Into<String>) -> CoreError {
        CoreError::Trace {
            path: self.path.clone(),
            offset,
            reason: reason.into(),
        }
    }

    fn warn(&mut self, msg: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings
                .push(format!("{}: {msg}", self.path.display()));
        } else {
            self.suppressed += 1;
        }
    }

    #[cfg(test)]
    fn with_max_value(mut self, n: usize) -> Self {
        self.max_value = n;
        self
    }
}

fn too_big(len: u64) -> String {
    format!(
        "{len} bytes, over the limit of {} MiB for one value",
        MAX_VALUE >> 20
    )
}

fn kind(first: u8) -> &'static str {
    match first {
        b'{' => "an object",
        b'[' => "an array",
        b'"' => "a string",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        _ => "a number",
    }
}

fn show_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("`{}`", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}

fn starts_value(b: u8) -> bool {
    matches!(
        b,
        b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
    )
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')
}

/// `true`, `false`, `null` or a JSON number.
fn valid_scalar(tok: &[u8]) -> bool {
    matches!(tok, b"true" | b"false" | b"null") || number_parts(tok).is_some()
}

/// Byte classes outside strings.
const PLAIN: u8 = 0;
const QUOTE: u8 = 1;
const OPEN: u8 = 2;
const CLOSE: u8 = 3;
const STRAY: u8 = 4;

/// Outside strings only blanks, `:`, `,`, number and literal characters are
/// plain; anything else would not survive copy-through as JSON.
static OUTSIDE: [u8; 256] = {
    let mut t = [STRAY; 256];
    let plain = b" \t\r\n:,+-.0123456789eEtruefalsn";
    let mut i = 0;
    while i < plain.len() {
        t[plain[i] as usize] = PLAIN;
        i += 1;
    }
    t[b'"' as usize] = QUOTE;
    t[b'{' as usize] = OPEN;
    t[b'[' as usize] = OPEN;
    t[b'}' as usize] = CLOSE;
    t[b']' as usize] = CLOSE;
    t
};

/// Inside strings: 0 for bytes copied as they are, 1 for `"`, `\` and control bytes.
static INSIDE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = 1;
        i += 1;
    }
    t[b'"' as usize] = 1;
    t[b'\\' as usize] = 1;
    t
};

/// Resumable state of the walk over one string, object or array.
#[derive(Default)]
struct Walk {
    /// Next byte to look at, relative to the value's first (kept) byte.
    off: usize,
    depth: usize,
    in_str: bool,
    /// The first reason the value cannot be copied through, with its offset.
    bad: Option<(u64, &'static str)>,
}

impl Walk {
    fn note(&mut self, at: u64, why: &'static str) {
        if self.bad.is_none() {
            self.bad = Some((at, why));
        }
    }
}

/// Advance `w` over `buf`; true when the value ended (`w.off` is then just
/// past it). `abs0` is the text offset of `buf[0]`, for messages. The hot
/// loop of the module: two table-driven byte loops, no calls.
fn walk(buf: &[u8], w: &mut Walk, stack: &mut [u64; STACK_WORDS], abs0: u64) -> bool {
    let n = buf.len();
    let mut i = w.off;
    let mut depth = w.depth;
    let done = 'scan: loop {
        if w.in_str {
            loop {
                while i < n && INSIDE[buf[i] as usize] == 0 {
                    i += 1;
                }
                if i >= n {
                    break 'scan false;
                }
                match buf[i] {
                    b'"' => {
                        i += 1;
                        w.in_str = false;
                        if depth == 0 {
                            break 'scan true;
                        }
                        break;
                    }
                    b'\\' => {
                        let need = if buf.get(i + 1) == Some(&b'u') { 6 } else { 2 };
                        if i + need > n {
                            // Look at the escape again once the rest is in.
                            break 'scan false;
                        }
                        let ok = match buf[i + 1] {
                            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => true,
                            b'u' => buf[i + 2..i + 6].iter().all(u8::is_ascii_hexdigit),
                            _ => false,
                        };
                        if !ok {
                            w.note(abs0 + i as u64, "invalid escape in a string");
                        }
                        i += 2;
                    }
                    _ => {
                        w.note(abs0 + i as u64, "control character in a string");
                        i += 1;
                    }
                }
            }
        }
        while i < n {
            let b = buf[i];
            i += 1;
            match OUTSIDE[b as usize] {
                PLAIN => {}
                QUOTE => {
                    w.in_str = true;
                    continue 'scan;
                }
                OPEN => {
                    if depth < STACK_WORDS * 64 {
                        let bit = 1u64 << (depth % 64);
                        if b == b'[' {
                            stack[depth / 64] |= bit;
                        } else {
                            stack[depth / 64] &= !bit;
                        }
                    }
                    depth += 1;
                }
                CLOSE => {
                    if depth == 0 {
                        // Unreachable from a value's first byte; stop safely.
                        w.note(abs0 + i as u64 - 1, "unbalanced bracket");
                        break 'scan true;
                    }
                    depth -= 1;
                    if depth < STACK_WORDS * 64 {
                        let is_array = stack[depth / 64] >> (depth % 64) & 1 == 1;
                        if is_array != (b == b']') {
                            w.note(abs0 + i as u64 - 1, "mismatched bracket");
                        }
                    }
                    if depth == 0 {
                        break 'scan true;
                    }
                }
                _ => w.note(abs0 + i as u64 - 1, "unexpected byte outside a string"),
            }
        }
        break false;
    };
    w.off = i;
    w.depth = depth;
    done
}

/// Shallow view of one event object: byte ranges (within the event slice) of
/// the values of these top-level keys, when present (the last one wins, as in
/// serde_json). Nested values are stepped over, never parsed.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    pub ph: Option<Range<usize>>,
    pub pid: Option<Range<usize>>,
    pub tid: Option<Range<usize>>,
    pub ts: Option<Range<usize>>,
    pub dur: Option<Range<usize>>,
    pub name: Option<Range<usize>>,
    pub cat: Option<Range<usize>>,
    pub id: Option<Range<usize>>,
    pub id2: Option<Range<usize>>,
    pub bind_id: Option<Range<usize>>,
    pub args: Option<Range<usize>>,
}

impl Fields {
    /// None if `event` is not one object with string keys and well-formed
    /// top-level values (nested values are only checked for balance).
    pub fn parse(event: &[u8]) -> Option<Fields> {
        let mut f = Fields::default();
        let mut i = skip_ws(event, 0);
        if event.get(i) != Some(&b'{') {
            return None;
        }
        i = skip_ws(event, i + 1);
        if event.get(i) == Some(&b'}') {
            return (skip_ws(event, i + 1) == event.len()).then_some(f);
        }
        loop {
            if event.get(i) != Some(&b'"') {
                return None;
            }
            let key_end = string_end(event, i)?;
            let key = &event[i + 1..key_end - 1];
            i = skip_ws(event, key_end);
            if event.get(i) != Some(&b':') {
                return None;
            }
            i = skip_ws(event, i + 1);
            let end = value_end(event, i)?;
            let slot = match key {
                b"ph" => &mut f.ph,
                b"pid" => &mut f.pid,
                b"tid" => &mut f.tid,
                b"ts" => &mut f.ts,
                b"dur" => &mut f.dur,
                b"name" => &mut f.name,
                b"cat" => &mut f.cat,
                b"id" => &mut f.id,
                b"id2" => &mut f.id2,
                b"bind_id" => &mut f.bind_id,
                b"args" => &mut f.args,
                _ => &mut None,
            };
            *slot = Some(i..end);
            i = skip_ws(event, end);
            match event.get(i)? {
                b',' => i = skip_ws(event, i + 1),
                b'}' => return (skip_ws(event, i + 1) == event.len()).then_some(f),
                _ => return None,
            }
        }
    }
}

fn skip_ws(text: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = text.get(i) {
        i += 1;
    }
    i
}

/// Index just past the closing quote of the string opening at `open`.
fn string_end(text: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    loop {
        while i < text.len() && INSIDE[text[i] as usize] == 0 {
            i += 1;
        }
        match text.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => return None,
        }
    }
}

/// Index just past the value starting at `i`.
fn value_end(text: &[u8], i: usize) -> Option<usize> {
    match *text.get(i)? {
        b'"' => string_end(text, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < text.len() {
                match OUTSIDE[text[j] as usize] {
                    QUOTE => j = string_end(text, j)? - 1,
                    OPEN => depth += 1,
                    CLOSE => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let len = text[i..]
                .iter()
                .position(|&b| !is_token_byte(b))
                .unwrap_or(text.len() - i);
            valid_scalar(&text[i..i + len]).then_some(i + len)
        }
    }
}

/// The value of a JSON string token (between the quotes, escapes left as-is).
pub fn str_value(raw: &[u8]) -> Option<&[u8]> {
    match raw {
        [b'"', inner @ .., b'"'] => Some(inner),
        _ => None,
    }
}

/// The parts of a JSON number (leading zeros tolerated): sign, integer
/// digits, fraction digits, exponent (saturated far beyond any i64 use).
fn number_parts(text: &[u8]) -> Option<(bool, &[u8], &[u8], i64)> {
    let (neg, rest) = match text.split_first()? {
        (b'-', rest) => (true, rest),
        _ => (false, text),
    };
    let digits = |s: &[u8]| s.iter().take_while(|b| b.is_ascii_digit()).count();
    let n = digits(rest);
    if n == 0 {
        return None;
    }
    let (int, mut rest) = rest.split_at(n);
    let mut frac: &[u8] = &[];
    if let Some((b'.', after)) = rest.split_first() {
        let n = digits(after);
        if n == 0 {
            return None;
        }
        (frac, rest) = after.split_at(n);
    }
    let mut exp = 0i64;
    if let Some((b'e' | b'E', after)) = rest.split_first() {
        let (neg_exp, after) = match after.split_first() {
            Some((b'-', a)) => (true, a),
            Some((b'+', a)) => (false, a),
            _ => (false, after),
        };
        let n = digits(after);
        if n == 0 {
            return None;
        }
        for &d in &after[..n] {
            exp = (exp * 10 + i64::from(d - b'0')).min(1 << 40);
        }
        if neg_exp {
            exp = -exp;
        }
        rest = &after[n..];
    }
    rest.is_empty().then_some((neg, int, frac, exp))
}

/// Timestamp text (a JSON number of µs, or a string holding one) to integer
/// nanoseconds without going through a float, rounding half away from zero
/// beyond three decimals. None if not a number or out of i64 range.
pub fn parse_us_to_ns(raw: &[u8]) -> Option<i64> {
    let text = str_value(raw).unwrap_or(raw);
    let (neg, int, frac, exp) = number_parts(text)?;
    let mut digits = int
        .iter()
        .chain(frac)
        .map(|d| d - b'0')
        .skip_while(|&d| d == 0);
    let significant = digits.clone().count() as i64;
    if significant == 0 {
        return Some(0);
    }
    // value = 0.d1d2...dn * 10^(n + exp - frac_len) µs, so the ns value has
    // `whole` digits before its decimal point.
    let whole = significant + exp - frac.len() as i64 + 3;
    if whole > 19 {
        return None;
    }
    let mut acc = 0u64;
    for _ in 0..whole.max(0) {
        acc = acc * 10 + u64::from(digits.next().unwrap_or(0));
    }
    // Half away from zero: only the first dropped digit matters.
    if whole >= 0 && digits.next().unwrap_or(0) >= 5 {
        acc += 1;
    }
    if neg {
        (acc <= 1 << 63).then(|| (acc as i64).wrapping_neg())
    } else {
        i64::try_from(acc).ok()
    }
}

/// Integer JSON value (pid/tid/id): a number, or a string of decimal digits or
/// `0x` hex; an integral float such as `12.0` too. Values above `i64::MAX`
/// (u64 ids) come back with their bits reinterpreted, which keeps them
/// distinct; None past 64 bits or if not an integer.
pub fn parse_int(raw: &[u8]) -> Option<i64> {
    let text = str_value(raw).unwrap_or(raw);
    if let Some(hex) = text
        .strip_prefix(b"0x")
        .or_else(|| text.strip_prefix(b"0X"))
    {
        if hex.is_empty() || hex.len() > 16 || !hex.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let s = std::str::from_utf8(hex).ok()?;
        return u64::from_str_radix(s, 16).ok().map(|v| v as i64);
    }
    let (neg, int, frac, exp) = number_parts(text)?;
    if exp != 0 || frac.iter().any(|&d| d != b'0') {
        return None;
    }
    let mut acc = 0u64;
    for &d in int {
        acc = acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if neg {
        (acc <= 1 << 63).then(|| (acc as i64).wrapping_neg())
    } else {
        Some(acc as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;

    #[derive(Debug, PartialEq)]
    enum Got {
        Meta(String, String),
        Event(String),
    }

    /// Hands out at most `chunk` bytes per read, to exercise every refill path.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = self.chunk.min(out.len()).min(self.data.len() - self.at);
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn scanner(bytes: &[u8], chunk: usize) -> Scanner {
        let r = Trickle {
            data: bytes.to_vec(),
            at: 0,
            chunk,
        };
        Scanner::from_reader(Path::new("t.json"), Box::new(r))
    }

    fn drain(s: &mut Scanner) -> Result<Vec<Got>> {
        let mut out = Vec::new();
        while let Some(item) = s.next_item()? {
            out.push(match item {
                Item::Meta { key, raw } => {
                    Got::Meta(key.into(), String::from_utf8_lossy(raw).into())
                }
                Item::Event(raw) => Got::Event(String::from_utf8_lossy(raw).into()),
            });
        }
        assert!(s.next_item().unwrap().is_none(), "stays at the end");
        Ok(out)
    }

    /// Scan with big and with 1- and 7-byte reads; all must agree.
    fn scan(bytes: &[u8]) -> (Result<Vec<Got>>, Scanner) {
        let mut s = scanner(bytes, usize::MAX);
        let got = drain(&mut s);
        for chunk in [1, 7] {
            let mut t = scanner(bytes, chunk);
            let again = drain(&mut t);
            let same = |a: String, b: String| assert_eq!(norm(&a), norm(&b), "chunk {chunk}");
            same(format!("{got:?}"), format!("{again:?}"));
            same(format!("{:?}", s.salvage()), format!("{:?}", t.salvage()));
            same(format!("{:?}", s.warnings()), format!("{:?}", t.warnings()));
        }
        (got, s)
    }

    /// How far the gzip decoder had read depends on the read sizes.
    fn norm(text: &str) -> String {
        let mut parts = text.split("compressed byte ");
        let mut out = parts.next().unwrap_or_default().to_string();
        for p in parts {
            out.push_str(p.trim_start_matches(|c: char| c.is_ascii_digit()));
        }
        out
    }

    fn events(got: &[Got]) -> Vec<&str> {
        got.iter()
            .filter_map(|g| match g {
                Got::Event(e) => Some(e.as_str()),
                Got::Meta(..) => None,
            })
            .collect()
    }

    fn ev(i: usize) -> String {
        format!(r#"{{"ph":"X","name":"e{i}","pid":1,"tid":1,"ts":{i}.000,"dur":1.000}}"#)
    }

    /// Torch-profiler-shaped: nested args, braces and escaped quotes in strings.
    fn kineto(i: usize) -> String {
        format!(
            r#"{{
    "ph": "X", "cat": "cpu_op", "name": "aten::linear {{\"x\": [}}", "pid": 1234, "tid": 5678,
    "ts": 1700000000{i:06}.123, "dur": 45.678,
    "args": {{
      "External id": {i},"Record function id": 0, "Sequence number": {i}, "Ev Idx": {i},
      "Input Dims": [[4096, 1024], [1024, 1024], [1024]], "Input type": ["float", "c10::Half", "\"]"],
      "Concrete Inputs": ["", "{{[", ""], "stack": ["a.py(1): f\n"]
    }}
  }}"#
        )
    }

    fn gzip(text: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(text).unwrap();
        enc.finish().unwrap()
    }

    fn trace_error(result: Result<Vec<Got>>) -> (u64, String) {
        match result {
            Err(CoreError::Trace {
                path,
                offset,
                reason,
            }) => {
                assert_eq!(path, Path::new("t.json"));
                (offset, reason)
            }
            other => panic!("expected a Trace error, got {other:?}"),
        }
    }

    fn reader_count(bytes: &[u8]) -> Option<usize> {
        let doc = crate::reader::read_trace_bytes(Path::new("t.json"), bytes).ok()?;
        Some(doc.value["traceEvents"].as_array()?.len())
    }

    #[test]
    fn object_in_any_key_order_and_array_format() {
        let evs = format!("[{},\n{}]", ev(0), kineto(1));
        let other = r#"{"host":"h","x":[1,{"y":"}"}]}"#;
        for text in [
            format!(r#"{{"traceEvents":{evs},"baseTimeNanoseconds":7,"otherData":{other}}}"#),
            format!(r#"{{"otherData":{other},"traceEvents":{evs},"baseTimeNanoseconds":7}}"#),
            format!("\u{FEFF}{{\n \"baseTimeNanoseconds\" : 7 ,\n \"otherData\": {other},\n \"traceEvents\": {evs}\n}}\n"),
        ] {
            let (got, s) = scan(text.as_bytes());
            let got = got.unwrap();
            assert!(s.salvage().is_none() && s.warnings().is_empty(), "{text}");
            assert_eq!(s.offset(), text.len() as u64);
            assert_eq!(events(&got), [ev(0), kineto(1)]);
            // Meta items in document order, values raw.
            let metas: Vec<&Got> = got.iter().filter(|g| matches!(g, Got::Meta(..))).collect();
            let base = Got::Meta("baseTimeNanoseconds".into(), "7".into());
            let od = Got::Meta("otherData".into(), other.into());
            let want = if text.starts_with("{\"otherData") { [&od, &base] } else { [&base, &od] };
            assert_eq!(metas, want);
        }
        let (got, s) = scan(format!("[{}, {}]", ev(0), ev(1)).as_bytes());
        assert_eq!(events(&got.unwrap()), [ev(0), ev(1)]);
        assert!(s.salvage().is_none());
        let (got, s) = scan(br#"{"traceEvents":[]}"#);
        assert!(got.unwrap().is_empty() && s.salvage().is_none());
    }

    #[test]
    fn events_are_exact_bytes_that_serde_reads() {
        let mut text = String::from(r#"{"traceEvents":["#);
        for i in 0..50 {
            text.push_str(&kineto(i));
            text.push_str(if i < 49 { ",\n  " } else { "]}" });
        }
        let (got, _) = scan(text.as_bytes());
        let got = got.unwrap();
        assert_eq!(got.len(), 50);
        for (i, e) in events(&got).into_iter().enumerate() {
            assert_eq!(e, kineto(i));
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            assert_eq!(v["args"]["Input type"][2], "\"]");
        }
    }

    #[test]
    fn gzip_single_and_multi_member() {
        let text = format!(
            r#"{{"baseTimeNanoseconds":1,"traceEvents":[{},{}]}}"#,
            ev(0),
            ev(1)
        );
        let (got, s) = scan(&gzip(text.as_bytes()));
        assert_eq!(events(&got.unwrap()), [ev(0), ev(1)]);
        assert!(s.salvage().is_none() && s.warnings().is_empty());
        assert_eq!(s.offset(), text.len() as u64);
        assert!(s.compressed_read() > 10);

        let cut = text.len() / 2;
        let mut bytes = gzip(&text.as_bytes()[..cut]);
        bytes.extend(gzip(&text.as_bytes()[cut..]));
        bytes.extend(gzip(b"\n"));
        let (got, s) = scan(&bytes);
        assert_eq!(events(&got.unwrap()), [ev(0), ev(1)]);
        assert!(s.salvage().is_none() && s.warnings().is_empty());
        assert_eq!(s.compressed_read(), bytes.len() as u64);

        // Garbage after the last member spoils nothing but is reported.
        bytes.extend_from_slice(b"\x00\x00junk");
        let (got, s) = scan(&bytes);
        assert_eq!(events(&got.unwrap()).len(), 2);
        assert!(s.salvage().is_none());
        assert!(
            s.warnings()[0].contains("after the end of the JSON document"),
            "{:?}",
            s.warnings()
        );
    }

    #[test]
    fn plain_cut_at_every_byte_keeps_complete_events() {
        let header = r#"{"baseTimeNanoseconds":9,"traceEvents":["#;
        let mut text = header.to_string();
        let mut ends = Vec::new();
        for i in 0..5 {
            if i > 0 {
                text.push_str(",\n");
            }
            text.push_str(&if i == 2 { kineto(i) } else { ev(i) });
            ends.push(text.len());
        }
        text.push_str(r#"],"otherData":{"a":[1,2]}}"#);
        for cut in 0..=text.len() {
            let bytes = &text.as_bytes()[..cut];
            let (got, s) = scan(bytes);
            if cut < header.len() {
                trace_error(got);
                continue;
            }
            let got = got.unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            let complete = ends.iter().filter(|&&e| e <= cut).count();
            assert_eq!(events(&got).len(), complete, "cut at {cut}");
            assert_eq!(Some(complete), reader_count(bytes), "cut at {cut}");
            if cut == text.len() {
                assert!(s.salvage().is_none());
                continue;
            }
            let salvage = s.salvage().unwrap_or_else(|| panic!("cut at {cut}"));
            // Inside the list the cut is after the last complete event;
            // after the `]` it is wherever the last top-level value ended.
            if cut <= ends[4] {
                let last = if complete == 0 {
                    header.len()
                } else {
                    ends[complete - 1]
                };
                assert_eq!(salvage.offset, last as u64, "cut at {cut}");
            }
            assert_eq!(
                salvage.offset + salvage.unused_bytes,
                cut as u64,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn gzip_cut_at_every_byte_keeps_a_prefix_of_the_events() {
        let mut text = String::from(r#"{"baseTimeNanoseconds":5,"traceEvents":["#);
        let all: Vec<String> = (0..30)
            .map(|i| if i % 3 == 0 { kineto(i) } else { ev(i) })
            .collect();
        text.push_str(&all.join(",\n"));
        text.push_str(r#"],"otherData":{"closed":true}}"#);
        // Sync-flushed in three parts, as the writer leaves an open segment.
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        for part in text.as_bytes().chunks(text.len() / 3 + 1) {
            enc.write_all(part).unwrap();
            enc.flush().unwrap();
        }
        let full = enc.finish().unwrap();
        for cut in 0..=full.len() {
            let (got, s) = scan(&full[..cut]);
            let Ok(got) = got else { continue };
            let got = events(&got);
            assert_eq!(got, all[..got.len()], "cut at {cut}");
            assert_eq!(Some(got.len()), reader_count(&full[..cut]), "cut at {cut}");
            if cut == full.len() {
                assert_eq!(got.len(), 30);
                assert!(s.salvage().is_none());
            } else if let Some(salvage) = s.salvage() {
                assert!(salvage.reason.contains("gzip"), "{}", salvage.reason);
            } else {
                // Cut in the gzip trailer: the JSON is whole, the cut reported.
                assert_eq!(got.len(), 30, "cut at {cut}");
                assert!(
                    s.warnings()[0].contains("gzip stream truncated"),
                    "cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn errors_name_the_file_and_the_offset() {
        assert_eq!(trace_error(scan(b"").0), (0, "empty file".into()));
        assert_eq!(trace_error(scan(b" \n\t").0).0, 3);
        let (offset, reason) = trace_error(scan(b"  hello world").0);
        assert_eq!(offset, 2);
        assert!(reason.starts_with("not JSON"), "{reason}");
        let (offset, reason) = trace_error(scan(br#"{"foo":1}"#).0);
        assert_eq!(offset, 0);
        assert!(reason.contains("no traceEvents"), "{reason}");
        for (text, found) in [
            (&b"42"[..], "a number"),
            (b"\"traceEvents\"", "a string"),
            (b"null", "null"),
            (b"true", "a boolean"),
        ] {
            let (_, reason) = trace_error(scan(text).0);
            assert!(reason.ends_with(found), "{reason}");
        }
        let (_, reason) = trace_error(scan(b"[1, 2, 3]").0);
        assert!(reason.contains("no event objects"), "{reason}");
        trace_error(scan(b"[garbage").0);
        let (offset, reason) = trace_error(scan(br#"{"traceEvents": {"a":1}}"#).0);
        assert_eq!(offset, 16);
        assert!(reason.contains("traceEvents is an object"), "{reason}");
        let (offset, _) = trace_error(scan(br#"{"a":1, oops}"#).0);
        assert_eq!(offset, 8);
        let (offset, reason) = trace_error(scan(br#"{"baseTimeNanoseconds":1,"trace"#).0);
        assert_eq!(offset, 31);
        assert!(reason.starts_with("cannot read the trace"), "{reason}");
        let (_, reason) = trace_error(scan(&gzip(b"")).0);
        assert_eq!(reason, "gzip stream holds no data");
        let (_, reason) = trace_error(scan(b"\x1f\x8b\x08\x00garbage-after-a-gzip-magic").0);
        assert!(
            reason.contains("gzip stream truncated or corrupt")
                && reason.ends_with("yields no data"),
            "{reason}"
        );
        let msg = scan(b"\x00\x01garbage").0.unwrap_err().to_string();
        assert!(
            msg.starts_with("t.json: not JSON") && msg.ends_with("at byte 0"),
            "{msg}"
        );
        match Scanner::open(Path::new("/nonexistent/fastprof/t.json")) {
            Err(CoreError::Io { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
            }
            _ => panic!("expected an Io error"),
        }
    }

    #[test]
    fn stray_bytes_and_unreadable_events_are_skipped_with_warnings() {
        let bad = [
            r#"{"a":[1}}"#,                           // mismatched bracket
            "{\"name\":\"a\nb\",\"args\":{\"x\":1}}", // raw newline in a string
            r#"{"name":"\q"}"#,                       // bad escape
            r#"{"ts": 12 @}"#,                        // stray byte
        ];
        for b in bad {
            let text = format!("{{\"traceEvents\":[{},{b},{}]}}", ev(0), ev(1));
            let (got, s) = scan(text.as_bytes());
            assert_eq!(events(&got.unwrap()), [ev(0), ev(1)], "{b}");
            assert_eq!(s.warnings().len(), 1, "{b}");
            assert!(
                s.warnings()[0].contains("dropped the unreadable event at byte"),
                "{:?}",
                s.warnings()
            );
            assert!(s.salvage().is_none());
        }
        for (glue, skipped) in [(",,", 1), (", garbage\n, ", 10), (" ", 0), (",\x00\x00", 2)] {
            let text = format!("[{}{glue}{}]", ev(0), ev(1));
            let (got, s) = scan(text.as_bytes());
            assert_eq!(events(&got.unwrap()), [ev(0), ev(1)], "{glue:?}");
            assert!(s.salvage().is_none());
            assert!(
                s.warnings()[0].contains(&format!("skipped {skipped} bytes")),
                "{:?}",
                s.warnings()
            );
        }
        // Non-objects are ignored; trailing commas and NUL padding are fine.
        let text = format!(
            "{{\"traceEvents\":[{},7,\"s\",[1],{},],}}\n\x00\x00",
            ev(0),
            ev(1)
        );
        let (got, s) = scan(text.as_bytes());
        assert_eq!(events(&got.unwrap()), [ev(0), ev(1)]);
        assert_eq!(s.warnings().len(), 3, "{:?}", s.warnings());
        // NUL padding where events should be: a salvage after resync fails.
        let mut bytes = format!("{{\"traceEvents\":[{},", ev(0)).into_bytes();
        bytes.extend_from_slice(&[0; 32]);
        let (got, s) = scan(&bytes);
        assert_eq!(events(&got.unwrap()).len(), 1);
        assert_eq!(s.salvage().unwrap().unused_bytes, 33);
        // Array format without `]`.
        let (got, s) = scan(format!("[{},\n{},\n", ev(0), ev(1)).as_bytes());
        assert_eq!(events(&got.unwrap()).len(), 2);
        assert_eq!(s.salvage().unwrap().unused_bytes, 2);
        // Trailing text is reported once.
        let (_, s) = scan(format!("[{}] junk", ev(0)).as_bytes());
        assert!(
            s.warnings()[0].contains("ignored 4 bytes after the end"),
            "{:?}",
            s.warnings()
        );
        // Warnings are capped.
        let text = format!("[{}]", vec![ev(0); 200].join(",,"));
        let (_, s) = scan(text.as_bytes());
        assert_eq!(s.warnings().len(), MAX_WARNINGS + 1);
        assert!(s.warnings()[MAX_WARNINGS].contains("more warning(s)"));
    }

    #[test]
    fn huge_values_grow_the_buffer_then_shrink_or_are_dropped() {
        let big = format!(
            r#"{{"ph":"X","args":{{"s":"{}"}}}}"#,
            "x{".repeat(1_500_000)
        );
        let text = format!("[{},{big},{}]", ev(0), ev(1));
        let (got, s) = scan(text.as_bytes());
        assert_eq!(events(&got.unwrap()), [ev(0).as_str(), &big, &ev(1)]);
        assert_eq!(s.buf.len(), DEFAULT_BUF, "shrunk back");

        let mut s = scanner(text.as_bytes(), 4096).with_max_value(100_000);
        let got = drain(&mut s).unwrap();
        assert_eq!(events(&got), [ev(0), ev(1)]);
        assert!(
            s.warnings()[0].contains("over the limit"),
            "{:?}",
            s.warnings()
        );
        assert!(s.buf.len() <= 2 * DEFAULT_BUF);
    }

    #[test]
    fn memory_stays_constant_over_a_long_stream() {
        /// ~22 MB of events, produced as they are read.
        struct Gen {
            i: usize,
            pending: Cursor<Vec<u8>>,
        }
        impl Read for Gen {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let n = self.pending.read(out)?;
                if n > 0 || self.i > 50_000 {
                    return Ok(n);
                }
                let text = match self.i {
                    0 => format!(r#"{{"traceEvents":[{}"#, kineto(0)),
                    50_000 => r#"],"otherData":{}}"#.to_string(),
                    i => format!(",{}", kineto(i)),
                };
                self.i += 1;
                self.pending = Cursor::new(text.into_bytes());
                self.read(out)
            }
        }
        let gen = Gen {
            i: 0,
            pending: Cursor::new(Vec::new()),
        };
        let mut s = Scanner::from_reader(Path::new("gen"), Box::new(gen));
        let mut n = 0;
        while s.next_item().unwrap().is_some() {
            n += 1;
            assert_eq!(s.buf.len(), DEFAULT_BUF);
        }
        assert_eq!(n, 50_001);
        assert!(s.offset() > 20 << 20 && s.salvage().is_none());
    }

    #[test]
    fn fields_of_kineto_events() {
        let e = kineto(3);
        let f = Fields::parse(e.as_bytes()).unwrap();
        let get = |r: &Option<Range<usize>>| &e[r.clone().unwrap()];
        assert_eq!(get(&f.ph), "\"X\"");
        assert_eq!(get(&f.name), r#""aten::linear {\"x\": [}""#);
        assert_eq!(get(&f.ts), "1700000000000003.123");
        assert_eq!(get(&f.pid), "1234");
        assert!(get(&f.args).starts_with('{') && get(&f.args).ends_with('}'));
        assert!(f.id.is_none() && f.bind_id.is_none() && f.id2.is_none());
        assert_eq!(str_value(get(&f.cat).as_bytes()), Some(&b"cpu_op"[..]));
        let flow =
            br#" {"ph":"f","id":"0x1f","bind_id":7,"id2":{"local":"0x2"},"bp":"e","args":{}} "#;
        let f = Fields::parse(flow).unwrap();
        assert_eq!(parse_int(&flow[f.id.unwrap()]), Some(31));
        assert_eq!(&flow[f.id2.unwrap()], br#"{"local":"0x2"}"#);
        assert_eq!(Fields::parse(b"{}"), Some(Fields::default()));
        for bad in [
            &b""[..],
            b"[]",
            b"{",
            b"{\"a\"}",
            b"{\"a\":}",
            b"{\"a\":1,}",
            b"{\"a\":1 \"b\":2}",
            b"{\"a\":tru}",
            b"{\"a\":{\"b\":1}",
            b"{\"a\":1}x",
            b"{\"a\":\"x}",
            b"{a:1}",
        ] {
            assert_eq!(Fields::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(str_value(b"\"\""), Some(&b""[..]));
        assert_eq!(str_value(b"\""), None);
        assert_eq!(str_value(b"12"), None);
    }

    #[test]
    fn microseconds_to_nanoseconds_exactly() {
        for (text, want) in [
            ("1234.567", Some(1_234_567)),
            ("12", Some(12_000)),
            ("-3.5", Some(-3_500)),
            ("0.0005", Some(1)),
            ("0.00049999", Some(0)),
            ("-0.0005", Some(-1)),
            ("0.0015", Some(2)),
            ("1.5e3", Some(1_500_000)),
            ("1.5E+3", Some(1_500_000)),
            ("15e-4", Some(2)),
            ("-0.001", Some(-1)),
            ("-0", Some(0)),
            ("0e999999999999", Some(0)),
            ("1e-400", Some(0)),
            ("1.7e15", Some(1_700_000_000_000_000_000)),
            ("1700000000000000.123", Some(1_700_000_000_000_000_123)),
            ("1700000000000000.1234999", Some(1_700_000_000_000_000_123)),
            ("9223372036854775.807", Some(i64::MAX)),
            ("9223372036854775.8075", None),
            ("-9223372036854775.808", Some(i64::MIN)),
            ("-9223372036854775.809", None),
            ("1e400", None),
            ("1e16", None),
            ("007.5", Some(7_500)),
            ("\"123.5\"", Some(123_500)),
            ("\"-1\"", Some(-1_000)),
            ("", None),
            ("-", None),
            ("1.", None),
            (".5", None),
            ("1e", None),
            ("1e+", None),
            ("12a", None),
            ("NaN", None),
            ("\"\"", None),
            ("\"12", None),
            ("true", None),
        ] {
            assert_eq!(parse_us_to_ns(text.as_bytes()), want, "{text}");
        }
    }

    #[test]
    fn integers_from_numbers_and_strings() {
        for (text, want) in [
            ("0", Some(0)),
            ("1234", Some(1234)),
            ("-7", Some(-7)),
            ("12.0", Some(12)),
            ("\"4321\"", Some(4321)),
            ("\"0x1A\"", Some(26)),
            ("\"0xffffffffffffffff\"", Some(-1)),
            ("9223372036854775807", Some(i64::MAX)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("-9223372036854775809", None),
            ("18446744073709551615", Some(-1)),
            ("18446744073709551616", None),
            ("\"0x1ffffffffffffffff\"", None),
            ("12.5", None),
            ("1e3", None),
            ("\"0x\"", None),
            ("\"0xg\"", None),
            ("\"abc\"", None),
            ("", None),
            ("null", None),
        ] {
            assert_eq!(parse_int(text.as_bytes()), want, "{text}");
        }
    }

    /// `cargo test --release -p fastprof-core scan_throughput -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn scan_throughput() {
        let mut text = String::from(r#"{"baseTimeNanoseconds":1,"traceEvents":["#);
        let mut n = 0;
        while text.len() < 200 << 20 {
            text.push_str(&kineto(n));
            text.push_str(",\n  ");
            n += 1;
        }
        text.push_str(&ev(0));
        text.push_str("]}");
        let bytes = text.into_bytes();
        let packed = gzip(&bytes);
        for (label, fields) in [("plain", false), ("plain", true), ("gzip", true)] {
            let input = if label == "gzip" { &packed } else { &bytes };
            let mut best = f64::MAX;
            for _ in 0..3 {
                let source = Box::new(Cursor::new(input.clone()));
                let t = std::time::Instant::now();
                let mut s = Scanner::from_reader(Path::new("bench"), source);
                let (mut count, mut ts_sum) = (0usize, 0i64);
                while let Some(item) = s.next_item().unwrap() {
                    if let Item::Event(e) = item {
                        count += 1;
                        if fields {
                            let f = Fields::parse(e).unwrap();
                            let ts = parse_us_to_ns(&e[f.ts.unwrap()]).unwrap();
                            ts_sum = ts_sum.wrapping_add(ts);
                        }
                    }
                }
                best = best.min(t.elapsed().as_secs_f64());
                assert_eq!(count, n + 1);
                assert!(ts_sum != 0 || !fields);
            }
            println!(
                "{label} scan{}: {n} events, {:.0} MB of JSON in {best:.3} s: {:.0} MB/s",
                if fields { " + Fields::parse + ts" } else { "" },
                bytes.len() as f64 / 1e6,
                bytes.len() as f64 / 1e6 / best
            );
        }
    }
}
