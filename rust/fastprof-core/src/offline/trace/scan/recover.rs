//! Where a scan gives up on a value or on the input: a truncated input's salvage, the cut at a
//! failed read, resynchronising at the next element after a bad byte, and the words its
//! warnings and errors use for what they found.

use super::{Salvage, Scanner, State, MAX_VALUE};
use crate::error::Result;

impl Scanner {
    /// The input ended early: a salvage once an event list has been opened,
    /// an error before.
    pub(super) fn truncated<T>(&mut self, why: &str) -> Result<Option<T>> {
        let at = self.total();
        let reason = match &self.stream_err {
            Some(e) => format!("{e}; {why} at byte {at}"),
            None => format!("{why} at byte {at}"),
        };
        self.stop(at, reason)
    }

    /// The text turned into something unreadable outside any event list.
    pub(super) fn cut<T>(&mut self, why: &str) -> Result<Option<T>> {
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

    pub(super) fn stop<T>(&mut self, at: u64, reason: String) -> Result<Option<T>> {
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
    pub(super) fn resync(&mut self, why: &str) -> Result<bool> {
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
}

pub(super) fn too_big(len: u64) -> String {
    format!(
        "{len} bytes, over the limit of {} MiB for one value",
        MAX_VALUE >> 20
    )
}

pub(super) fn kind(first: u8) -> &'static str {
    match first {
        b'{' => "an object",
        b'[' => "an array",
        b'"' => "a string",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        _ => "a number",
    }
}

pub(super) fn show_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("`{}`", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}
