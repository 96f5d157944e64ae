//! Streaming scan of Chrome-trace JSON in constant memory: the one walk under
//! `fastprof merge`, the salvaging [`crate::offline::trace::reader`] and
//! [`crate::offline::trace::columns`].
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
//! no control characters inside strings and no stray bytes between tokens
//! (the rest of the grammar, such as commas, colons and number forms, is
//! checked by [`Fields::parse_checked`] in the pass that locates an event's
//! keys, see [`validate`]). A
//! value failing that is dropped with a warning and the walk resumes at the
//! next element (a bad byte between elements skips to the next `{`): a truncated
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
    /// Open a file: gzip (magic 1f 8b; multi-member OK) or plain. A path
    /// holding a URL (see [`crate::offline::trace::remote`]) is an object streamed
    /// through the registered storage backend, read as a file is: a failing
    /// read is an I/O error naming the URL, not a truncated trace.
    pub fn open(path: &Path) -> Result<Scanner> {
        let source: Box<dyn Read + Send> = match crate::offline::trace::remote::url_of(path) {
            Some(url) => {
                crate::offline::trace::remote::open(url).map_err(|e| CoreError::io(path, e))?
            }
            None => Box::new(std::fs::File::open(path).map_err(|e| CoreError::io(path, e))?),
        };
        let mut scanner = Scanner::from_reader(path, source);
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

    /// Events dropped so far because they could not be copied through as
    /// JSON (each also named in a warning, up to the warning limit).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Why the input stream stopped early (a truncated or corrupt gzip
    /// stream, a failed read), or None while it reads cleanly.
    pub fn stream_error(&self) -> Option<&str> {
        self.stream_err.as_deref()
    }

    /// Decompressed bytes read from the input so far (consumed or buffered).
    pub fn text_read(&self) -> u64 {
        self.total()
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

mod fields;
pub mod validate;
use fields::number_parts;
pub use fields::{
    for_each_entry, parse_int, parse_us_to_ns, str_text, str_value, Fields, MAX_DUR_NS,
};

#[cfg(test)]
mod tests;
