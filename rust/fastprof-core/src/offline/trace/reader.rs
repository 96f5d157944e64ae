//! Reading a Chrome trace back as one `serde_json::Value`, salvaging
//! truncated traces: what `fastprof.read_trace` returns.
//!
//! Built on the streaming [`Scanner`], like the merger and the columns: plain
//! or gzip (single- or multi-member) input, object (`{"traceEvents": [...]}`)
//! or array (`[ev, ...]`) format, read in one pass without inflating the file
//! first, so a file that is no trace is refused after its first bytes.
//!
//! The scanner decides what an event is. An event that is not well-formed
//! JSON (a raw TAB, NUL or newline inside a string, a bad escape, garbage
//! between events) is dropped with a warning naming its byte offset and the
//! walk resumes at the next event, exactly as `fastprof merge` does; only the
//! end of the input (or text that never turns back into events) stops it. Each
//! event the scanner yields is then parsed by `serde_json`; one serde_json
//! refuses (a number beyond f64, a lone surrogate escape, nesting past its
//! recursion limit) is dropped and counted too.
//!
//! The writer keeps its open segment readable by sync-flushing the gzip
//! stream, so a killed process leaves a file whose gzip stream stops at a
//! sync point and whose JSON stops after some event: every complete event
//! before the break is kept and the document is marked salvaged. Offsets in
//! warnings and errors count bytes of the decompressed JSON text.

use std::borrow::Cow;
use std::io::Cursor;
use std::path::Path;

use serde_json::{Map, Value};

use super::scan::{Item, Scanner};
use crate::error::Result;

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
    read_from(Scanner::open(path)?, path)
}

/// Read a trace from `bytes` already in memory; `path_for_messages` only
/// names the source in warnings and errors.
pub fn read_trace_bytes(path_for_messages: &Path, bytes: &[u8]) -> Result<TraceDocument> {
    let source = Box::new(Cursor::new(bytes.to_vec()));
    read_from(
        Scanner::from_reader(path_for_messages, source),
        path_for_messages,
    )
}

/// What one value the scanner yielded came to.
enum Parsed {
    Value(Value),
    /// serde_json refused it: why.
    Refused(String),
}

/// Counts of values repaired or dropped, each with the first offset.
#[derive(Default)]
struct Tally {
    utf8_bad: u64,
    utf8_first: u64,
    dropped: u64,
    first_dropped: Option<(u64, String)>,
}

fn read_from(mut sc: Scanner, path: &Path) -> Result<TraceDocument> {
    let mut map = Map::new();
    let mut events = Vec::new();
    let mut tally = Tally::default();
    loop {
        // The item borrows the scanner; offsets are taken once it is done with.
        let (key, raw_len, parsed, bad_utf8) = match sc.next_item()? {
            None => break,
            Some(Item::Event(raw)) => {
                let (p, bad) = parse(raw);
                (None, raw.len(), p, bad)
            }
            Some(Item::Meta { key, raw }) => {
                let (p, bad) = parse(raw);
                (Some(key.to_string()), raw.len(), p, bad)
            }
        };
        let at = sc.offset() - raw_len as u64;
        if let Some((n, first)) = bad_utf8 {
            if tally.utf8_bad == 0 {
                tally.utf8_first = at + first as u64;
            }
            tally.utf8_bad += n;
        }
        match (parsed, key) {
            (Parsed::Value(v), None) => events.push(v),
            (Parsed::Value(v), Some(key)) => {
                map.insert(key, v);
            }
            (Parsed::Refused(why), _) => {
                tally.dropped += 1;
                tally.first_dropped.get_or_insert((at, why));
            }
        }
    }

    let name = path.display();
    let mut warnings = Vec::new();
    let salvage = sc.salvage().cloned();
    let gzip_truncated = sc.stream_error().is_some();
    if let (Some(e), Some(_)) = (sc.stream_error(), &salvage) {
        // After a complete document the scanner has said so itself.
        warnings.push(format!(
            "{name}: {e}; using the {} bytes decompressed before it",
            sc.text_read()
        ));
    }
    if tally.utf8_bad > 0 {
        warnings.push(format!(
            "{name}: replaced {} invalid UTF-8 sequence(s) with U+FFFD, the first at byte {}",
            tally.utf8_bad, tally.utf8_first
        ));
    }
    if let Some((at, why)) = &tally.first_dropped {
        warnings.push(format!(
            "{name}: dropped {} unreadable value(s), the first at byte {at} ({why})",
            tally.dropped
        ));
    }
    warnings.extend(sc.warnings().iter().cloned());

    let n = events.len();
    map.insert("traceEvents".into(), Value::Array(events));
    let (salvaged, unused_bytes) = match salvage {
        None => (false, 0),
        Some(s) => {
            warnings.push(format!(
                "{name}: trace truncated at byte {}; salvaged {n} events, {} bytes unused",
                s.offset, s.unused_bytes
            ));
            mark_salvaged(&mut map, s.unused_bytes);
            (true, s.unused_bytes)
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

/// Parse one raw value, repairing invalid UTF-8 first (torch writes raw C++
/// symbol bytes into names): each bad sequence becomes U+FFFD rather than
/// costing the value. The second result counts the repairs and gives the
/// first one's offset within `raw`.
fn parse(raw: &[u8]) -> (Parsed, Option<(u64, usize)>) {
    let (text, bad) = repair_utf8(raw);
    let parsed = match serde_json::from_slice::<Value>(&text) {
        Ok(v) => Parsed::Value(v),
        Err(e) => Parsed::Refused(describe(&e)),
    };
    (parsed, bad)
}

fn repair_utf8(raw: &[u8]) -> (Cow<'_, [u8]>, Option<(u64, usize)>) {
    if std::str::from_utf8(raw).is_ok() {
        return (Cow::Borrowed(raw), None);
    }
    let mut out = Vec::with_capacity(raw.len() + 16);
    let (mut bad, mut first, mut at) = (0u64, 0usize, 0usize);
    for chunk in raw.utf8_chunks() {
        out.extend_from_slice(chunk.valid().as_bytes());
        at += chunk.valid().len();
        if !chunk.invalid().is_empty() {
            out.extend_from_slice("\u{FFFD}".as_bytes());
            if bad == 0 {
                first = at;
            }
            bad += 1;
            at += chunk.invalid().len();
        }
    }
    (Cow::Owned(out), Some((bad, first)))
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

/// serde_json's message without its "at line L column C" suffix: callers
/// report a byte offset instead.
fn describe(err: &serde_json::Error) -> String {
    let msg = err.to_string();
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CoreError;
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
        assert!(
            reason.starts_with("gzip stream truncated or corrupt")
                && reason.ends_with("yields no data"),
            "{reason}"
        );
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

    /// `{"traceEvents":[e0,<bad event>,e2,e3]}` with `bad` inside the bad event's name.
    fn with_bad_event(bad: &[u8]) -> (Vec<u8>, usize) {
        let head = format!(r#"{{"traceEvents":[{},"#, ev(0));
        let mut text = head.clone().into_bytes();
        text.extend_from_slice(br#"{"ph":"X","name":"bad"#);
        text.extend_from_slice(bad);
        text.extend_from_slice(
            format!(
                r#"name","ts":1,"dur":1,"pid":1,"tid":1}},{},{}],"otherData":{{"k":1}}}}"#,
                ev(2),
                ev(3)
            )
            .as_bytes(),
        );
        (text, head.len())
    }

    #[test]
    fn a_raw_tab_nul_or_newline_in_a_string_costs_only_its_event() {
        for bad in [&b"\t"[..], b"\0", b"\n", b"\r\n", b"\x1f"] {
            let (text, at) = with_bad_event(bad);
            for bytes in [text.clone(), gzip(&text)] {
                let doc = read(&bytes).unwrap();
                assert!(!doc.salvaged, "{bad:?}: {:?}", doc.warnings);
                assert_eq!(names(&doc), ["e0", "e2", "e3"], "{bad:?}");
                assert_eq!(doc.value["otherData"]["k"], 1);
                assert_eq!(doc.warnings.len(), 1, "{:?}", doc.warnings);
                let want = format!(
                    "t.json: dropped the unreadable event at byte {at} (control character in a string at byte {}",
                    at + r#"{"ph":"X","name":"bad"#.len()
                );
                assert!(doc.warnings[0].starts_with(&want), "{:?}", doc.warnings);
            }
        }
        // Many bad events: each one dropped, every good one kept, all counted.
        let mut text = String::from("[");
        for i in 0..200 {
            let name = if i % 2 == 0 {
                format!("e{i}")
            } else {
                format!("b\t{i}")
            };
            text.push_str(&format!(r#"{{"ph":"i","name":"{name}","ts":{i}}},"#));
        }
        text.push_str("{}]");
        let doc = read(text.as_bytes()).unwrap();
        assert_eq!(events(&doc).len(), 101);
        let shown = doc
            .warnings
            .iter()
            .filter(|w| w.contains("dropped the unreadable event"))
            .count();
        assert!(
            doc.warnings
                .last()
                .unwrap()
                .contains(&format!("{} more warning(s)", 100 - shown)),
            "{:?}",
            doc.warnings.last()
        );
    }

    #[test]
    fn garbage_between_events_is_skipped_to_the_next_event() {
        let e0 = format!(r#"{{"traceEvents":[{}"#, ev(0));
        for (junk, why) in [
            (", @#% !! ,", "expected an event object"),
            (" junk ,", "expected `,` or `]` after an event"),
            ("\0\0\0,", "expected `,` or `]` after an event"),
        ] {
            let text = format!("{e0}{junk}{},{}]}}", ev(1), ev(2));
            let doc = read(text.as_bytes()).unwrap();
            assert!(!doc.salvaged, "{junk:?}");
            assert_eq!(names(&doc), ["e0", "e1", "e2"], "{junk:?}");
            let at = e0.len() + junk.find(|c: char| !matches!(c, ',' | ' ')).unwrap();
            assert_eq!(doc.warnings.len(), 1, "{:?}", doc.warnings);
            assert!(
                doc.warnings[0].starts_with(&format!("t.json: {why} at byte {at}; skipped")),
                "{junk:?}: {:?}",
                doc.warnings
            );
        }
        // A value that is no JSON at all in the list is dropped like a bad event.
        let text = format!("{e0},12abc,{}]}}", ev(1));
        let doc = read(text.as_bytes()).unwrap();
        assert_eq!(names(&doc), ["e0", "e1"]);
        assert!(doc.warnings[0].contains(&format!(
            "dropped the unreadable event at byte {}",
            e0.len() + 1
        )));
    }

    #[test]
    fn a_non_trace_is_refused_after_its_first_bytes() {
        // A gzip stream whose text is not JSON fails before the rest is inflated:
        // the scanner stops reading as soon as it has seen the first byte.
        // Incompressible after the first bytes, so the file is as big as its text.
        let mut text = b"<html>".to_vec();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        text.extend((0..8 << 20).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        }));
        let bytes = gzip(&text);
        let mut sc =
            Scanner::from_reader(Path::new("t.json"), Box::new(Cursor::new(bytes.clone())));
        let err = sc.next_item().unwrap_err().to_string();
        assert!(
            err.starts_with("t.json: not JSON") && err.ends_with("at byte 0"),
            "{err}"
        );
        assert!(
            sc.compressed_read() < bytes.len() as u64 / 4,
            "{} of {}",
            sc.compressed_read(),
            bytes.len()
        );
        trace_error(read(&bytes));
    }
}
