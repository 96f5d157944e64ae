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
//!
//! * `mod.rs`: the [`Scanner`] and what it yields ([`Item`], [`Salvage`]).
//! * `document.rs`: the document's grammar at the top level: the trace object's keys, the
//!   event list's elements, what may follow the end.
//! * `source.rs`: the input: the counted (and decompressed) reader and the refillable buffer
//!   a value is located in.
//! * `recover.rs`: where a scan gives up on a value or the input: truncation, the cut,
//!   resynchronising after a bad byte, and the wording of its warnings.
//! * `walk.rs`: the byte walk over one value (brackets, strings, escapes, stray bytes).
//! * `fields.rs`, `validate.rs`: an event's keys located and its grammar checked.

mod document;
mod fields;
mod recover;
mod source;
pub mod validate;
mod walk;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{CoreError, Result};

use document::{Found, State};
use fields::number_parts;
pub use fields::{
    for_each_entry, parse_int, parse_us_to_ns, str_text, str_value, Fields, MAX_DUR_NS,
};
use source::{Counters, Counting};
use walk::{is_token_byte, valid_scalar, CLOSE, INSIDE, OPEN, OUTSIDE, QUOTE};

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
}

#[cfg(test)]
mod tests;
