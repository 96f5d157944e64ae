//! Reading Chrome-trace JSON back, salvaging truncated traces.
//!
//! Owns the one entry point every consumer of trace files goes through (the
//! merger, the reports, the CLI): plain or gzip (single- or multi-member)
//! input, object (`{"traceEvents": [...]}`) or array (`[ev, ...]`) format.
//!
//! The writer keeps its open segment readable by sync-flushing the gzip
//! stream, so a killed process leaves a file whose gzip stream stops at a
//! sync point and whose JSON stops after some event. `serde_json` alone would
//! reject such a file outright, so the top level is walked by a small scanner
//! that hands each event to `serde_json` separately and, when the text breaks
//! off, keeps every complete event before the break. Offsets in warnings and
//! errors count bytes of the decompressed JSON text.

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{CoreError, Result};

/// A trace read back from disk, possibly salvaged from a truncated file.
#[derive(Debug, Clone)]
pub struct TraceDocument {
    /// The whole document: always a JSON object with at least a `traceEvents` array.
    /// An array-format input (`[ev, ev, ...]`) becomes `{"traceEvents": [...]}`.
    pub value: Value,
    /// True when only a prefix of the input could be used.
    pub salvaged: bool,
    /// Bytes of (decompressed) JSON text after the last complete event that were not used; 0 when complete.
    pub unused_bytes: u64,
    /// True when the gzip stream ended early / was corrupt part-way.
    pub gzip_truncated: bool,
    /// One line each, naming the file and the byte offset.
    pub warnings: Vec<String>,
}

/// Read the trace at `path` (plain JSON or gzip), salvaging a truncated one.
pub fn read_trace(path: &Path) -> Result<TraceDocument> {
    let bytes = std::fs::read(path).map_err(|e| CoreError::io(path, e))?;
    read_trace_bytes(path, &bytes)
}

/// Read a trace from `bytes` already in memory; `path_for_messages` only
/// names the source in warnings and errors.
pub fn read_trace_bytes(path_for_messages: &Path, bytes: &[u8]) -> Result<TraceDocument> {
    let path = path_for_messages;
    if bytes.is_empty() {
        return Err(trace_err(path, 0, "empty file"));
    }
    let mut warnings = Vec::new();
    let mut gzip_truncated = false;

    let raw: Cow<[u8]> = if bytes.starts_with(&[0x1f, 0x8b]) {
        let (data, failure) = gunzip(bytes);
        if let Some((consumed, err)) = failure {
            if data.is_empty() {
                return Err(trace_err(
                    path,
                    0,
                    format!("gzip stream is corrupt at compressed byte {consumed} ({err}) and yields no data"),
                ));
            }
            gzip_truncated = true;
            warnings.push(format!(
                "{}: gzip stream truncated or corrupt at compressed byte {consumed} ({err}); using the {} bytes decompressed before it",
                path.display(),
                data.len()
            ));
        }
        if data.is_empty() {
            return Err(trace_err(path, 0, "gzip stream holds no data"));
        }
        Cow::Owned(data)
    } else {
        Cow::Borrowed(bytes)
    };
    let text = repair_utf8(path, raw, &mut warnings);

    let mut scan = Scanner::new(path, &text);
    let parsed = scan.document()?;
    scan.report(&mut warnings);

    let mut map = parsed.map;
    let (salvaged, unused_bytes) = match parsed.cut {
        None => (false, 0),
        Some(cut) => {
            let unused = (text.len() - cut.at) as u64;
            let n = match map.get("traceEvents") {
                Some(Value::Array(events)) => events.len(),
                _ => 0,
            };
            warnings.push(format!(
                "{}: trace truncated at byte {}; salvaged {n} events, {unused} bytes unused",
                path.display(),
                cut.at
            ));
            mark_salvaged(&mut map, unused);
            (true, unused)
        }
    };
    Ok(TraceDocument {
        value: Value::Object(map),
        salvaged,
        unused_bytes,
        gzip_truncated,
        warnings,
    })
}

/// Decompress every gzip member; on a truncated or corrupt stream keep what
/// came out before the failure and report how far into the compressed input
/// it got (the writer's sync flushes make that prefix worth keeping).
fn gunzip(bytes: &[u8]) -> (Vec<u8>, Option<(usize, std::io::Error)>) {
    let mut rest = bytes;
    // Chrome-trace JSON compresses roughly 10x; start at 4x so that the
    // doubling growth of `read_to_end` copies little.
    let mut out = Vec::with_capacity(bytes.len().saturating_mul(4));
    // `read_to_end` keeps every byte read before an error, which is exactly
    // the salvage contract.
    let result = flate2::bufread::MultiGzDecoder::new(&mut rest).read_to_end(&mut out);
    match result {
        Ok(_) => (out, None),
        Err(err) => (out, Some((bytes.len() - rest.len(), err))),
    }
}

/// torch emits names with invalid UTF-8 (raw bytes of C++ symbols); replace
/// each bad sequence with U+FFFD rather than refuse the whole trace. A
/// multi-byte character cut by truncation at the very end is replaced too but
/// not warned about: the salvage warning covers those bytes.
fn repair_utf8<'a>(path: &Path, raw: Cow<'a, [u8]>, warnings: &mut Vec<String>) -> Cow<'a, [u8]> {
    if std::str::from_utf8(&raw).is_ok() {
        return raw;
    }
    let mut out = Vec::with_capacity(raw.len() + 64);
    let mut bad = 0usize;
    let mut first_bad = 0usize;
    let mut at = 0usize;
    for chunk in raw.utf8_chunks() {
        out.extend_from_slice(chunk.valid().as_bytes());
        at += chunk.valid().len();
        let invalid = chunk.invalid();
        if invalid.is_empty() {
            continue;
        }
        out.extend_from_slice("\u{FFFD}".as_bytes());
        let cut_at_end = at + invalid.len() == raw.len()
            && std::str::from_utf8(invalid).is_err_and(|e| e.error_len().is_none());
        if !cut_at_end {
            if bad == 0 {
                first_bad = at;
            }
            bad += 1;
        }
        at += invalid.len();
    }
    if bad > 0 {
        warnings.push(format!(
            "{}: replaced {bad} invalid UTF-8 sequence(s) with U+FFFD, the first at byte {first_bad}",
            path.display()
        ));
    }
    Cow::Owned(out)
}

/// Record the salvage in `otherData`. A salvaged open segment has no
/// `otherData` (the writer adds it at close), so seed one from the static
/// metadata the writer put in the first `fastprof_info` event.
fn mark_salvaged(map: &mut Map<String, Value>, unused: u64) {
    if !matches!(map.get("otherData"), Some(Value::Object(_))) {
        let seed = match map.get("traceEvents") {
            Some(Value::Array(events)) => events
                .iter()
                .find(|ev| {
                    ev.get("ph").and_then(Value::as_str) == Some("M")
                        && ev.get("name").and_then(Value::as_str) == Some("fastprof_info")
                })
                .and_then(|ev| ev.get("args"))
                .and_then(Value::as_object)
                .cloned(),
            _ => None,
        };
        map.insert("otherData".into(), Value::Object(seed.unwrap_or_default()));
    }
    if let Some(Value::Object(other)) = map.get_mut("otherData") {
        other.insert("salvaged".into(), Value::Bool(true));
        other.insert("unused_bytes".into(), Value::from(unused));
    }
}

fn trace_err(path: &Path, offset: usize, reason: impl Into<String>) -> CoreError {
    CoreError::Trace {
        path: path.to_path_buf(),
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Where the text stopped being usable.
struct Cut {
    /// Byte just after the last value that was used: everything from here on is unused.
    at: usize,
    /// Byte where reading actually failed, for error messages.
    err_at: usize,
    why: String,
    /// The text simply ran out (truncation) rather than turning into garbage.
    eof: bool,
}

/// One value read by `Scanner::item`.
enum Item {
    Value(Value, usize),
    /// A balanced but unparsable value (a number out of f64 range, a lone
    /// surrogate escape, nesting past serde_json's limit): dropped so that one
    /// bad event does not cost every event after it.
    Skipped(usize, String),
    Broken(Cut),
}

/// How an event list ended.
enum ListEnd {
    Closed(usize),
    Cut(Cut),
}

struct Parsed {
    map: Map<String, Value>,
    cut: Option<Cut>,
}

/// Walks the top level of the text once; every value below it is parsed by
/// `serde_json`, so the whole read stays linear in the input.
struct Scanner<'a> {
    path: &'a Path,
    text: &'a [u8],
    dropped: usize,
    first_dropped: Option<(usize, String)>,
    non_objects: usize,
    first_non_object: usize,
    /// Offset and length of non-blank text after a complete document.
    trailing: Option<(usize, usize)>,
}

impl<'a> Scanner<'a> {
    fn new(path: &'a Path, text: &'a [u8]) -> Self {
        Scanner {
            path,
            text,
            dropped: 0,
            first_dropped: None,
            non_objects: 0,
            first_non_object: 0,
            trailing: None,
        }
    }

    fn skip_ws(&self, mut pos: usize) -> usize {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(pos) {
            pos += 1;
        }
        pos
    }

    fn err(&self, offset: usize, reason: impl Into<String>) -> CoreError {
        trace_err(self.path, offset, reason)
    }

    fn document(&mut self) -> Result<Parsed> {
        // Some Windows tools prefix a BOM; serde_json rejects it.
        let start = if self.text.starts_with(b"\xEF\xBB\xBF") {
            3
        } else {
            0
        };
        let pos = self.skip_ws(start);
        match self.text.get(pos) {
            None => Err(self.err(pos, "no JSON value (only whitespace)")),
            Some(b'{') => self.object(pos),
            Some(b'[') => self.array_format(pos),
            // Not a trace either way; parse it whole only to say what it is.
            Some(_) => Err(match serde_json::from_slice::<Value>(&self.text[pos..]) {
                Ok(v) => self.err(
                    pos,
                    format!(
                        "not a trace: expected a JSON object with a traceEvents array, found {}",
                        kind(&v)
                    ),
                ),
                Err(e) => self.err(
                    pos + error_offset(&self.text[pos..], &e),
                    format!("not JSON: {}", describe(&e)),
                ),
            }),
        }
    }

    fn object(&mut self, open: usize) -> Result<Parsed> {
        let text = self.text;
        let mut map = Map::new();
        let mut events: Option<Vec<Value>> = None;
        let mut bad_events_value: Option<(usize, &'static str)> = None;
        let mut last_good = open + 1;
        let mut pos = self.skip_ws(open + 1);
        let mut cut = None;
        let mut closed = None;
        if text.get(pos) == Some(&b'}') {
            closed = Some(pos + 1);
        }
        while closed.is_none() {
            let key = match self.item(pos) {
                Item::Value(Value::String(key), end) => {
                    pos = end;
                    key
                }
                Item::Broken(c) => {
                    cut = Some(Cut { at: last_good, ..c });
                    break;
                }
                _ => {
                    cut = Some(self.cut(last_good, pos, "expected a key string"));
                    break;
                }
            };
            pos = self.skip_ws(pos);
            if text.get(pos) != Some(&b':') {
                cut = Some(self.cut(last_good, pos, "expected `:` after a key"));
                break;
            }
            pos = self.skip_ws(pos + 1);
            if key == "traceEvents" && text.get(pos) == Some(&b'[') {
                let mut list = Vec::new();
                let end = self.events(pos, &mut list);
                events = Some(list);
                bad_events_value = None;
                match end {
                    ListEnd::Closed(end) => {
                        last_good = end;
                        pos = end;
                    }
                    ListEnd::Cut(c) => {
                        cut = Some(c);
                        break;
                    }
                }
            } else {
                match self.item(pos) {
                    Item::Value(value, end) => {
                        if key == "traceEvents" {
                            bad_events_value = Some((pos, kind(&value)));
                            events = None;
                        }
                        map.insert(key, value);
                        last_good = end;
                        pos = end;
                    }
                    Item::Skipped(end, why) => {
                        self.note_dropped(pos, why);
                        pos = end;
                    }
                    Item::Broken(c) => {
                        cut = Some(Cut { at: last_good, ..c });
                        break;
                    }
                }
            }
            pos = self.skip_ws(pos);
            match text.get(pos) {
                Some(b',') => {
                    pos = self.skip_ws(pos + 1);
                    // Tolerate a trailing comma: harmless, and easy to emit.
                    if text.get(pos) == Some(&b'}') {
                        closed = Some(pos + 1);
                    }
                }
                Some(b'}') => closed = Some(pos + 1),
                None => cut = Some(self.cut(last_good, pos, "unexpected end of text")),
                Some(_) => cut = Some(self.cut(last_good, pos, "expected `,` or `}`")),
            }
            if cut.is_some() {
                break;
            }
        }

        let Some(events) = events else {
            if let Some((at, found)) = bad_events_value {
                return Err(self.err(
                    at,
                    format!("not a trace: traceEvents is {found}, not an array"),
                ));
            }
            return Err(match cut {
                Some(c) => self.err(c.err_at, format!("cannot read the trace: {}", c.why)),
                None => self.err(open, "not a trace: the object has no traceEvents array"),
            });
        };
        map.insert("traceEvents".into(), Value::Array(events));
        if let Some(end) = closed {
            self.check_trailing(end);
        }
        Ok(Parsed { map, cut })
    }

    fn array_format(&mut self, open: usize) -> Result<Parsed> {
        let mut events = Vec::new();
        let end = self.events(open, &mut events);
        let cut = match end {
            ListEnd::Closed(end) => {
                self.check_trailing(end);
                None
            }
            // Chrome's array format allows the closing `]` to be missing, but a
            // list that turns into garbage before its first event is no trace.
            ListEnd::Cut(c) if events.is_empty() && !c.eof => {
                return Err(self.err(c.err_at, format!("not a trace: {}", c.why)));
            }
            ListEnd::Cut(c) => Some(c),
        };
        if events.is_empty() && self.non_objects > 0 {
            return Err(self.err(
                self.first_non_object,
                "not a trace: the array holds no event objects",
            ));
        }
        let mut map = Map::new();
        map.insert("traceEvents".into(), Value::Array(events));
        Ok(Parsed { map, cut })
    }

    /// Read the elements of the array opened at `open` into `out`.
    fn events(&mut self, open: usize, out: &mut Vec<Value>) -> ListEnd {
        let text = self.text;
        let mut last_good = open + 1;
        let mut pos = self.skip_ws(open + 1);
        if text.get(pos) == Some(&b']') {
            return ListEnd::Closed(pos + 1);
        }
        loop {
            match self.item(pos) {
                Item::Value(value, end) => {
                    if value.is_object() {
                        out.push(value);
                    } else {
                        if self.non_objects == 0 {
                            self.first_non_object = pos;
                        }
                        self.non_objects += 1;
                    }
                    last_good = end;
                    pos = end;
                }
                Item::Skipped(end, why) => {
                    self.note_dropped(pos, why);
                    pos = end;
                }
                Item::Broken(c) => return ListEnd::Cut(Cut { at: last_good, ..c }),
            }
            pos = self.skip_ws(pos);
            match text.get(pos) {
                Some(b',') => {
                    pos = self.skip_ws(pos + 1);
                    if text.get(pos) == Some(&b']') {
                        return ListEnd::Closed(pos + 1);
                    }
                }
                Some(b']') => return ListEnd::Closed(pos + 1),
                None => return ListEnd::Cut(self.cut(last_good, pos, "unexpected end of text")),
                Some(_) => return ListEnd::Cut(self.cut(last_good, pos, "expected `,` or `]`")),
            }
        }
    }

    /// Parse one JSON value starting at `pos` (which is not whitespace).
    fn item(&self, pos: usize) -> Item {
        let rest = &self.text[pos..];
        // The stream deserializer is the serde_json API that reports where a
        // value ended, and it accepts any of `,]}` right after a value.
        let mut stream = serde_json::Deserializer::from_slice(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value)) => {
                let end = pos + stream.byte_offset();
                // A number that runs into the end of the text may have lost
                // digits to truncation; objects and strings close themselves.
                if value.is_number() && self.skip_ws(end) == self.text.len() {
                    return Item::Broken(self.cut(pos, end, "unexpected end of text"));
                }
                Item::Value(value, end)
            }
            None => Item::Broken(self.cut(pos, self.text.len(), "unexpected end of text")),
            Some(Err(err)) => {
                let err_at = pos + error_offset(rest, &err);
                let why = describe(&err);
                if err.is_eof() {
                    return Item::Broken(Cut {
                        at: pos,
                        err_at,
                        why,
                        eof: true,
                    });
                }
                match raw_end(rest) {
                    Some(len) => Item::Skipped(pos + len, why),
                    None => Item::Broken(Cut {
                        at: pos,
                        err_at,
                        why,
                        eof: false,
                    }),
                }
            }
        }
    }

    fn cut(&self, at: usize, err_at: usize, why: &str) -> Cut {
        Cut {
            at,
            err_at,
            why: why.into(),
            eof: err_at >= self.text.len(),
        }
    }

    fn note_dropped(&mut self, pos: usize, why: String) {
        if self.first_dropped.is_none() {
            self.first_dropped = Some((pos, why));
        }
        self.dropped += 1;
    }

    /// Text after a complete document: whitespace and NUL padding (left by a
    /// crashed file system) are ignored silently; anything else is reported
    /// but does not spoil the document.
    fn check_trailing(&mut self, end: usize) {
        let extra = self.text[end..]
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0));
        if let Some(i) = extra {
            self.trailing = Some((end + i, self.text.len() - end - i));
        }
    }

    fn report(&self, warnings: &mut Vec<String>) {
        let path = self.path.display();
        if let Some((at, why)) = &self.first_dropped {
            warnings.push(format!(
                "{path}: dropped {} unreadable value(s), the first at byte {at} ({why})",
                self.dropped
            ));
        }
        if self.non_objects > 0 {
            warnings.push(format!(
                "{path}: ignored {} traceEvents entries that are not objects, the first at byte {}",
                self.non_objects, self.first_non_object
            ));
        }
        if let Some((at, n)) = self.trailing {
            warnings.push(format!(
                "{path}: ignored {n} bytes after the end of the trace at byte {at}"
            ));
        }
    }
}

/// Length of the balanced value at the start of `text` without interpreting
/// it, so that a value serde_json refuses can be stepped over. `None` when
/// the value runs into the end of the text or does not start like a value.
/// The same walk the streaming scanner uses.
fn raw_end(text: &[u8]) -> Option<usize> {
    crate::trace::scan::value_end(text, 0)
}

/// Byte offset within `text` of the line/column serde_json reported. Only
/// called on failure, and only scans up to the failing line.
fn error_offset(text: &[u8], err: &serde_json::Error) -> usize {
    if err.is_eof() {
        return text.len();
    }
    let mut line_start = 0;
    for _ in 1..err.line() {
        match text[line_start..].iter().position(|&b| b == b'\n') {
            Some(i) => line_start += i + 1,
            None => break,
        }
    }
    (line_start + err.column().saturating_sub(1)).min(text.len())
}

/// serde_json's message without its "at line L column C" suffix: callers
/// report a byte offset instead.
fn describe(err: &serde_json::Error) -> String {
    let msg = err.to_string();
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{gzip, trace_error};
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;

    fn read(bytes: &[u8]) -> Result<TraceDocument> {
        read_trace_bytes(Path::new("t.json"), bytes)
    }

    fn ev(i: usize) -> String {
        format!(r#"{{"ph":"X","name":"e{i}","pid":1,"tid":1,"ts":{i}.000,"dur":1.000}}"#)
    }

    fn events(doc: &TraceDocument) -> &Vec<Value> {
        doc.value["traceEvents"]
            .as_array()
            .expect("traceEvents array")
    }

    fn names(doc: &TraceDocument) -> Vec<String> {
        events(doc)
            .iter()
            .map(|e| e["name"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn complete_object_in_any_key_order() {
        let evs = format!("[{},{}]", ev(0), ev(1));
        let other = r#"{"host":"h","rank":0}"#;
        for text in [
            format!(r#"{{"traceEvents":{evs},"baseTimeNanoseconds":7,"otherData":{other}}}"#),
            format!(r#"{{"otherData":{other},"traceEvents":{evs},"baseTimeNanoseconds":7}}"#),
            format!(
                "{{\n  \"baseTimeNanoseconds\": 7,\n  \"otherData\": {other},\n  \"traceEvents\": {evs}\n}}\n"
            ),
        ] {
            let doc = read(text.as_bytes()).unwrap();
            assert!(!doc.salvaged && !doc.gzip_truncated, "{text}");
            assert_eq!(doc.unused_bytes, 0);
            assert!(doc.warnings.is_empty(), "{:?}", doc.warnings);
            // Complete documents come back exactly as serde_json reads them.
            let whole: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(doc.value, whole);
            assert_eq!(names(&doc), ["e0", "e1"]);
        }
    }

    #[test]
    fn array_format_with_and_without_closing_bracket() {
        let doc = read(format!("[{}, {}]\n", ev(0), ev(1)).as_bytes()).unwrap();
        assert!(!doc.salvaged);
        assert_eq!(names(&doc), ["e0", "e1"]);
        assert_eq!(doc.value.as_object().unwrap().len(), 1, "only traceEvents");

        // Chrome's array format may lack the `]`; the partial event is dropped.
        let head = format!("[{},\n{}", ev(0), ev(1));
        for tail in ["", ",", ",\n", ",\n{\"ph\":\"X\",\"na"] {
            let text = format!("{head}{tail}");
            let doc = read(text.as_bytes()).unwrap();
            assert!(doc.salvaged, "{text}");
            assert_eq!(names(&doc), ["e0", "e1"]);
            assert_eq!(doc.unused_bytes, tail.len() as u64);
            assert_eq!(doc.value["otherData"]["salvaged"], true);
            assert_eq!(doc.value["otherData"]["unused_bytes"], tail.len() as u64);
            assert_eq!(doc.warnings.len(), 1);
            let offset = head.len();
            assert_eq!(
                doc.warnings[0],
                format!(
                    "t.json: trace truncated at byte {offset}; salvaged 2 events, {} bytes unused",
                    tail.len()
                )
            );
        }
        // A lone `[` is a trace cut before its first event.
        let doc = read(b"[").unwrap();
        assert!(doc.salvaged && events(&doc).is_empty());
        assert_eq!(
            read(b"[]").unwrap().value,
            serde_json::json!({"traceEvents": []})
        );
    }

    #[test]
    fn gzip_single_member() {
        let text = format!(
            r#"{{"baseTimeNanoseconds":1,"traceEvents":[{},{}]}}"#,
            ev(0),
            ev(1)
        );
        let doc = read(&gzip(text.as_bytes())).unwrap();
        assert!(!doc.salvaged && !doc.gzip_truncated);
        assert_eq!(doc.value["baseTimeNanoseconds"], 1);
        assert_eq!(names(&doc), ["e0", "e1"]);
    }

    #[test]
    fn gzip_multi_member_with_events_across_members() {
        let mut bytes = gzip(format!(r#"{{"traceEvents":[{},{},"#, ev(0), ev(1)).as_bytes());
        bytes.extend(gzip(format!("{},{}]}}", ev(2), ev(3)).as_bytes()));
        let doc = read(&bytes).unwrap();
        assert!(!doc.salvaged && !doc.gzip_truncated);
        assert_eq!(names(&doc), ["e0", "e1", "e2", "e3"]);
    }

    #[test]
    fn gzip_cut_anywhere_after_a_sync_flush_keeps_every_flushed_event() {
        // What the writer leaves when killed: a stream sync-flushed after the
        // first batch, then more compressed data that never reached a flush.
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        let header = r#"{"baseTimeNanoseconds":5,"traceEvents":["#;
        enc.write_all(header.as_bytes()).unwrap();
        let flushed = 60;
        for i in 0..flushed {
            enc.write_all(format!("{}{},", if i == 0 { "" } else { "\n" }, ev(i)).as_bytes())
                .unwrap();
        }
        enc.flush().unwrap();
        let flush_point = enc.get_ref().len();
        for i in flushed..2 * flushed {
            enc.write_all(
                format!("\n{}{}", ev(i), if i + 1 < 2 * flushed { "," } else { "" }).as_bytes(),
            )
            .unwrap();
        }
        enc.write_all(br#"],"otherData":{"closed":true}}"#).unwrap();
        let full = enc.finish().unwrap();

        let want: Vec<String> = (0..flushed).map(|i| format!("e{i}")).collect();
        for cut in 0..=full.len() {
            let result = read(&full[..cut]);
            if cut < flush_point {
                // Before the flush point any outcome but a panic is fine.
                continue;
            }
            let doc = result.unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert_eq!(doc.gzip_truncated, cut < full.len(), "cut at {cut}");
            let got = names(&doc);
            assert!(got.len() >= flushed, "cut at {cut}: {} events", got.len());
            assert_eq!(got[..flushed], want[..], "cut at {cut}");
            assert_eq!(doc.value["baseTimeNanoseconds"], 5);
            if doc.salvaged {
                assert_eq!(doc.value["otherData"]["salvaged"], true);
                assert!(doc
                    .warnings
                    .iter()
                    .any(|w| w.contains("gzip stream truncated")));
            } else {
                assert_eq!(got.len(), 2 * flushed, "cut at {cut}");
                assert_eq!(doc.value["otherData"], serde_json::json!({"closed": true}));
            }
        }
    }

    #[test]
    fn plain_json_cut_at_every_byte_keeps_complete_events() {
        let header = r#"{"baseTimeNanoseconds":9,"traceEvents":["#;
        let mut text = header.to_string();
        let mut ends = Vec::new();
        for i in 0..5 {
            if i > 0 {
                text.push_str(",\n");
            }
            text.push_str(&ev(i));
            ends.push(text.len());
        }
        text.push_str("]}");
        for cut in header.len()..=ends[4] {
            let doc = read(&text.as_bytes()[..cut]).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert!(doc.salvaged, "cut at {cut}");
            let complete = ends.iter().filter(|&&e| e <= cut).count();
            let last_end = if complete == 0 {
                header.len()
            } else {
                ends[complete - 1]
            };
            assert_eq!(events(&doc).len(), complete, "cut at {cut}");
            assert_eq!(doc.unused_bytes, (cut - last_end) as u64, "cut at {cut}");
            assert_eq!(doc.value["baseTimeNanoseconds"], 9);
            assert_eq!(
                doc.value["otherData"]["unused_bytes"],
                (cut - last_end) as u64
            );
        }
        // Cut after the list closed: every event, nothing unused, still a salvage.
        let doc = read(&text.as_bytes()[..text.len() - 1]).unwrap();
        assert!(doc.salvaged);
        assert_eq!((events(&doc).len(), doc.unused_bytes), (5, 0));
        // Cut inside the number before `traceEvents` or inside the key: no trace.
        for cut in 1..header.len() - 1 {
            trace_error(read(&text.as_bytes()[..cut]));
        }
    }

    #[test]
    fn invalid_utf8_in_a_name_is_replaced_with_a_warning() {
        let mut bytes = br#"{"traceEvents":[{"ph":"X","name":"at::"#.to_vec();
        bytes.extend_from_slice(b"\xff\xfeop\xc3");
        bytes.extend_from_slice(br#"","ts":1,"dur":1,"pid":1,"tid":1}]}"#);
        let doc = read(&bytes).unwrap();
        assert!(!doc.salvaged);
        assert_eq!(events(&doc)[0]["name"], "at::\u{FFFD}\u{FFFD}op\u{FFFD}");
        assert_eq!(doc.warnings.len(), 1);
        assert!(
            doc.warnings[0].contains("3 invalid UTF-8"),
            "{}",
            doc.warnings[0]
        );
        assert!(doc.warnings[0].contains("byte 38"), "{}", doc.warnings[0]);
    }

    #[test]
    fn errors_name_the_file_and_the_offset() {
        assert_eq!(trace_error(read(b"")), (0, "empty file".into()));
        assert_eq!(trace_error(read(b" \n\t")).0, 3);
        let (offset, reason) = trace_error(read(b"  hello world"));
        assert_eq!(offset, 2);
        assert!(reason.starts_with("not JSON"), "{reason}");
        let (_, reason) = trace_error(read(br#"{"foo":1}"#));
        assert!(reason.contains("no traceEvents"), "{reason}");
        let (_, reason) = trace_error(read(b"42"));
        assert!(reason.contains("found a number"), "{reason}");
        trace_error(read(br#""traceEvents""#));
        trace_error(read(b"null"));
        trace_error(read(b"[1, 2, 3]"));
        trace_error(read(b"[garbage"));
        let (offset, reason) = trace_error(read(br#"{"traceEvents": 5}"#));
        assert_eq!(offset, 16);
        assert!(reason.contains("traceEvents is a number"), "{reason}");
        let (offset, _) = trace_error(read(br#"{"a":1, oops}"#));
        assert_eq!(offset, 8);
        // The message carries path and offset for the CLI's one line.
        let msg = read(b"\x00\x01garbage").unwrap_err().to_string();
        assert!(
            msg.starts_with("t.json: not JSON") && msg.ends_with("at byte 0"),
            "{msg}"
        );
    }

    #[test]
    fn gzip_without_usable_data_is_an_error() {
        let (_, reason) = trace_error(read(&gzip(b"")));
        assert!(reason.contains("no data"), "{reason}");
        let (_, reason) = trace_error(read(b"\x1f\x8b\x08\x00garbage-after-a-gzip-magic"));
        assert!(reason.contains("gzip stream is corrupt"), "{reason}");
        trace_error(read(&gzip(b"   ")));
    }

    #[test]
    fn salvage_seeds_other_data_from_fastprof_info() {
        let info = r#"{"ph":"M","name":"fastprof_info","pid":42,"tid":0,"args":{"producer":"fastprof","version":"0.1.0","pid":42,"rank":3}}"#;
        let pname = r#"{"ph":"M","name":"process_name","pid":42,"tid":0,"args":{"name":"rank 3"}}"#;
        let text = format!(
            r#"{{"baseTimeNanoseconds":1000,"traceEvents":[{pname},{info},{},{{"ph":"X","#,
            ev(0)
        );
        let doc = read(&gzip(text.as_bytes())).unwrap();
        assert!(doc.salvaged && !doc.gzip_truncated);
        assert_eq!(events(&doc).len(), 3);
        assert_eq!(
            doc.value["otherData"],
            serde_json::json!({
                "producer": "fastprof", "version": "0.1.0", "pid": 42, "rank": 3,
                "salvaged": true, "unused_bytes": 11,
            })
        );

        // An otherData already read keeps its keys and gains the salvage marks.
        let text = format!(
            r#"{{"otherData":{{"host":"h","salvaged":false}},"traceEvents":[{info},{}"#,
            ev(0)
        );
        let doc = read(text.as_bytes()).unwrap();
        assert_eq!(
            doc.value["otherData"],
            serde_json::json!({"host": "h", "salvaged": true, "unused_bytes": 0})
        );
        assert!(doc.value.get("baseTimeNanoseconds").is_none());
    }

    #[test]
    fn opened_but_empty_event_list_is_a_valid_salvage() {
        let doc = read(br#"{"baseTimeNanoseconds":1,"traceEvents":[ {"ph""#).unwrap();
        assert!(doc.salvaged && events(&doc).is_empty());
        assert_eq!(doc.unused_bytes, 6);
        // No traceEvents array yet: nothing to salvage.
        let (offset, reason) = trace_error(read(br#"{"baseTimeNanoseconds":1,"trace"#));
        assert_eq!(offset, 31);
        assert!(reason.starts_with("cannot read the trace"), "{reason}");
    }

    #[test]
    fn one_unreadable_event_does_not_cost_the_rest() {
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        let text = format!(
            r#"{{"traceEvents":[{},{{"ph":"X","ts":1e400}},{{"name":"\ud800 lone"}},{{"args":{deep}}},{}]}}"#,
            ev(0),
            ev(4)
        );
        let doc = read(text.as_bytes()).unwrap();
        assert!(!doc.salvaged);
        assert_eq!(names(&doc), ["e0", "e4"]);
        assert_eq!(doc.warnings.len(), 1);
        assert!(
            doc.warnings[0].contains("dropped 3 unreadable"),
            "{}",
            doc.warnings[0]
        );
        // Huge integers fall back to f64 rather than failing.
        let doc = read(br#"[{"ph":"i","ts":123456789012345678901234567890}]"#).unwrap();
        assert!(events(&doc)[0]["ts"].as_f64().unwrap() > 1e29);
    }

    #[test]
    fn bom_trailing_text_and_nul_padding() {
        let text = format!("\u{FEFF}{{\"traceEvents\":[{}]}}", ev(0));
        assert_eq!(names(&read(text.as_bytes()).unwrap()), ["e0"]);

        let mut bytes = format!("{{\"traceEvents\":[{}]}}\n", ev(0)).into_bytes();
        bytes.extend_from_slice(&[0; 64]);
        let doc = read(&bytes).unwrap();
        assert!(!doc.salvaged && doc.warnings.is_empty());

        bytes.extend_from_slice(b"junk");
        let doc = read(&bytes).unwrap();
        assert!(!doc.salvaged);
        assert!(
            doc.warnings[0].contains("ignored 4 bytes"),
            "{:?}",
            doc.warnings
        );

        // NUL padding where the rest of the events should be: a salvage.
        let mut bytes = format!("{{\"traceEvents\":[{},", ev(0)).into_bytes();
        bytes.extend_from_slice(&[0; 32]);
        let doc = read(&bytes).unwrap();
        assert!(doc.salvaged);
        assert_eq!(doc.unused_bytes, 33);
    }

    #[test]
    fn read_trace_reports_io_errors_with_the_path() {
        let missing = Path::new("/nonexistent/fastprof/trace.json.gz");
        match read_trace(missing) {
            Err(CoreError::Io { path, source }) => {
                assert_eq!(path, missing);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected an Io error, got {other:?}"),
        }
    }
}
