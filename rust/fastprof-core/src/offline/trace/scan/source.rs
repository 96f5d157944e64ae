//! The scanner's input: the reader counting the compressed bytes it pulls, and the refillable
//! buffer in which one value at a time is located (grown only for a single huge value, shrunk
//! back after it).

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::walk::{walk, Walk};
use super::{is_token_byte, valid_scalar, Scanner, DEFAULT_BUF, MAX_WARNINGS};
use crate::error::{CoreError, Result};

/// Compressed bytes read from the source, and whether the source itself failed.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) read: AtomicU64,
    pub(super) failed: AtomicBool,
}

/// Counts the bytes the decoder pulls from the source. Relaxed ordering is
/// enough: both atomics are written and read on the scanning thread (the
/// decoder runs inside `next_item`); they sit behind an `Arc` only because
/// this reader is buried inside the boxed decoder chain.
pub(super) struct Counting<R> {
    pub(super) inner: R,
    pub(super) counters: Arc<Counters>,
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

/// A value located by `Scanner::value`.
pub(super) enum Val {
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

impl Scanner {
    /// Locate the value starting at `buf[start]` (a byte for which
    /// `starts_value` holds), refilling as needed. Does not move `start`
    /// unless the value was too big to hold.
    pub(super) fn value(&mut self) -> Result<Val> {
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
    pub(super) fn peek(&mut self) -> Result<Option<u8>> {
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

    pub(super) fn compact(&mut self) {
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
    pub(super) fn fill(&mut self) -> Result<bool> {
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
    pub(super) fn total(&self) -> u64 {
        self.base + self.end as u64
    }

    pub(super) fn err(&self, offset: u64, reason: impl Into<String>) -> CoreError {
        CoreError::Trace {
            path: self.path.clone(),
            offset,
            reason: reason.into(),
        }
    }

    pub(super) fn warn(&mut self, msg: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings
                .push(format!("{}: {msg}", self.path.display()));
        } else {
            self.suppressed += 1;
        }
    }

    #[cfg(test)]
    pub(super) fn with_max_value(mut self, n: usize) -> Self {
        self.max_value = n;
        self
    }
}
