//! Tests of the streaming scanner and the field parsers.

use super::*;
use crate::test_support::{gzip, trace_error, Trickle};
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::{Cursor, Write};
use std::ops::Range;

#[derive(Debug, PartialEq)]
enum Got {
    Meta(String, String),
    Event(String),
}

fn scanner(bytes: &[u8], chunk: usize) -> Scanner {
    let r = Trickle::new(bytes.to_vec(), chunk);
    Scanner::from_reader(Path::new("t.json"), Box::new(r))
}

fn drain(s: &mut Scanner) -> Result<Vec<Got>> {
    let mut out = Vec::new();
    while let Some(item) = s.next_item()? {
        out.push(match item {
            Item::Meta { key, raw } => Got::Meta(key.into(), String::from_utf8_lossy(raw).into()),
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

fn reader_count(bytes: &[u8]) -> Option<usize> {
    let doc = crate::offline::trace::reader::read_trace_bytes(Path::new("t.json"), bytes).ok()?;
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
        reason.contains("gzip stream truncated or corrupt") && reason.ends_with("yields no data"),
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
    let flow = br#" {"ph":"f","id":"0x1f","bind_id":7,"id2":{"local":"0x2"},"bp":"e","args":{}} "#;
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

#[test]
fn entries_of_an_object_with_nested_values() {
    let mut got = Vec::new();
    let obj = br#" { "a" : 1, "b\"c": {"x": [1, "}"]}, "d":"s,t" ,"e":-2.5e3 } "#;
    assert!(for_each_entry(obj, |k, v| got.push((
        String::from_utf8_lossy(k).into_owned(),
        String::from_utf8_lossy(v).into_owned()
    ))));
    assert_eq!(
        got,
        [
            ("a", "1"),
            ("b\\\"c", r#"{"x": [1, "}"]}"#),
            ("d", r#""s,t""#),
            ("e", "-2.5e3")
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
    );
    assert!(for_each_entry(b"{}", |_, _| panic!("no entries")));
    let mut n = 0;
    assert!(!for_each_entry(br#"{"a":1,"b"}"#, |_, _| n += 1));
    assert_eq!(n, 1, "entries before the break are seen");
    for bad in [&b"[1]"[..], b"", b"{", br#"{"a":}"#, br#"{"a":1"#, b"{a:1}"] {
        assert!(!for_each_entry(bad, |_, _| {}), "{bad:?}");
    }
}

#[test]
fn a_bad_dur_is_none_never_zero() {
    let dur = |e: &str| {
        Fields::parse(e.as_bytes())
            .unwrap()
            .dur_checked(e.as_bytes())
    };
    assert_eq!(dur(r#"{"ph":"X","ts":1,"dur":2.5}"#), Some(2_500));
    assert_eq!(dur(r#"{"ph":"X","ts":1}"#), Some(0));
    assert_eq!(dur(r#"{"ph":"X","ts":1,"dur":0}"#), Some(0));
    for bad in ["-3", "1e300", "\"soon\"", "null", "2e15"] {
        assert_eq!(
            dur(&format!(r#"{{"ph":"X","ts":1,"dur":{bad}}}"#)),
            None,
            "{bad}"
        );
    }
    // The longest kept: MAX_DUR_NS exactly (1e15 µs).
    assert_eq!(
        dur(r#"{"ph":"X","ts":1,"dur":1000000000000000}"#),
        Some(MAX_DUR_NS)
    );
}
