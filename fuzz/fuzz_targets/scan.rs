//! Arbitrary bytes through the streaming scanner (plain or, with a gzip
//! magic, gzip), in one read and in small reads, then through `Fields::parse`
//! and the number parsers for every event. Besides "never panics" it checks
//! properties the merger relies on:
//! * every event is one `{...}` object, the same whatever the read sizes;
//! * the scanner keeps at least the events the reader (built on it) keeps;
//! * `parse_us_to_ns` agrees with a float computation where floats are exact enough.
#![no_main]

use std::io::{Cursor, Read};
use std::path::Path;

use fastprof_core::offline::trace::reader::read_trace_bytes;
use fastprof_core::offline::trace::scan::{
    parse_int, parse_us_to_ns, str_value, Fields, Item, Scanner,
};
use libfuzzer_sys::fuzz_target;

// The core's own test reader (plain std), shared rather than copied.
#[path = "../../rust/fastprof-core/src/test_support/trickle.rs"]
mod trickle;
use trickle::Trickle;

/// (ok, events, salvage offset) of one scan.
fn scan(r: Box<dyn Read + Send>) -> (bool, Vec<Vec<u8>>, Option<u64>) {
    let mut s = Scanner::from_reader(Path::new("fuzz"), r);
    let mut events = Vec::new();
    let ok = loop {
        match s.next_item() {
            Ok(Some(Item::Event(e))) => {
                assert!(e.first() == Some(&b'{') && e.last() == Some(&b'}'));
                check_event(e);
                events.push(e.to_vec());
            }
            Ok(Some(Item::Meta { key, raw })) => {
                assert!(key != "traceEvents" && !raw.is_empty());
            }
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    assert!(matches!(s.next_item(), Ok(None)));
    let salvage = s.salvage().map(|x| x.offset);
    if let Some(offset) = salvage {
        assert!(offset <= s.offset() + s.salvage().unwrap().unused_bytes);
    }
    (ok, events, salvage)
}

fn check_event(e: &[u8]) {
    let Some(f) = Fields::parse(e) else { return };
    for r in [
        &f.ph, &f.pid, &f.tid, &f.ts, &f.dur, &f.name, &f.cat, &f.id, &f.id2, &f.bind_id, &f.args,
    ]
    .into_iter()
    .flatten()
    {
        let v = &e[r.clone()];
        assert!(!v.is_empty());
        let _ = (str_value(v), parse_int(v));
        check_number(v);
    }
}

fn check_number(text: &[u8]) {
    let ns = parse_us_to_ns(text);
    let inner = str_value(text).unwrap_or(text);
    let Some(f) = std::str::from_utf8(inner)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
    else {
        return;
    };
    // Rust's float parser takes forms JSON does not (`inf`, `.5`, `+1`).
    let json_like = inner
        .first()
        .is_some_and(|b| b.is_ascii_digit() || *b == b'-')
        && inner
            .iter()
            .all(|b| b.is_ascii_digit() || b"-+.eE".contains(b))
        && !inner.ends_with(b".")
        && !inner
            .windows(2)
            .any(|w| w == b".e" || w == b".E" || w == b"-.");
    if json_like && f.is_finite() && (f * 1000.0).abs() < 1e12 {
        let want = (f * 1000.0).round() as i64;
        let got = ns.unwrap_or_else(|| panic!("{:?} -> None", String::from_utf8_lossy(text)));
        assert!(
            (got - want).abs() <= 1,
            "{:?}: {got} vs {want}",
            String::from_utf8_lossy(text)
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = Fields::parse(data);
    let _ = parse_int(data);
    check_number(data);

    let (ok, events, salvage) = scan(Box::new(Cursor::new(data.to_vec())));
    let chunk = 1 + data.get(1).map_or(0, |b| usize::from(b % 13));
    let trickled = scan(Box::new(Trickle::new(data.to_vec(), chunk)));
    if data.starts_with(&[0x1f, 0x8b]) {
        // How much a corrupt deflate stream yields before its error depends
        // on the read sizes (flate2 drops the output of the failing call),
        // so only a prefix relation holds.
        let (short, long) = if events.len() <= trickled.1.len() {
            (&events, &trickled.1)
        } else {
            (&trickled.1, &events)
        };
        assert_eq!(short[..], long[..short.len()]);
        return;
    }
    assert_eq!(
        (ok, &events, salvage),
        (trickled.0, &trickled.1, trickled.2)
    );

    // Differential: whatever the reader keeps, the scanner keeps too.
    if let Ok(doc) = read_trace_bytes(Path::new("fuzz"), data) {
        let kept = doc.value["traceEvents"].as_array().map_or(0, Vec::len);
        if kept > 0 {
            assert!(ok, "the reader kept {kept} events, the scanner failed");
        }
        let readable = events
            .iter()
            .filter(|e| {
                serde_json::from_str::<serde_json::Value>(&String::from_utf8_lossy(e)).is_ok()
            })
            .count();
        assert!(readable >= kept, "scanner {readable} < reader {kept}");
    }
});
