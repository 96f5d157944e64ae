//! Runs the streaming scanner (`fastprof_core::offline::trace::scan`) over every file in
//! `tests/corpus/` (see its README.md), with the reader (which parses each
//! scanned event with serde_json) as the reference:
//!
//! * `err_*`: a `CoreError::Trace` naming the file and a byte offset, like the
//!   reader (no `err_*` file yields an event or a salvage instead).
//! * `ok_*`: ends cleanly (no salvage) with as many events as the reader,
//!   except where the two differ on purpose (`INTENDED_DIFFERENCES`).
//! * `salvage_*`: ends with a salvage, after as many events as the reader.
//!
//! In every readable file, the events the scanner yields that serde_json can
//! parse are exactly as many as the reader keeps, and every prefix of every
//! file is scanned to show that no input panics.

mod common;

use common::{corpus, file_name};
use std::path::Path;

use fastprof_core::offline::trace::reader::{read_trace, read_trace_bytes};
use fastprof_core::offline::trace::scan::{
    parse_int, parse_us_to_ns, Fields, Item, Salvage, Scanner,
};
use fastprof_core::{CoreError, Result};

/// Files where the scanner yields more events than the reader, and why: the
/// reader parses each event with serde_json and drops what serde_json
/// refuses, while the scanner only delimits events (brackets, strings,
/// escapes, stray bytes). The merger and the columns decide what to do with
/// the rest: `Fields::parse` refuses what is not valid JSON syntax.
const INTENDED_DIFFERENCES: &[(&str, usize, &str)] = &[
    (
        "ok_absurd_1e400_ts.json",
        5,
        "ts 1e400 is out of f64 range, not a syntax error",
    ),
    (
        "ok_deeply_nested_args.json",
        4,
        "nesting past serde_json's recursion limit",
    ),
    (
        "ok_malformed_events.json",
        33,
        "brackets balance, JSON syntax does not: Fields::parse_checked refuses them",
    ),
    (
        "ok_lone_surrogate_escape.json",
        3,
        "a lone \\udcff escape is valid JSON syntax",
    ),
];

struct Outcome {
    result: Result<()>,
    events: Vec<Vec<u8>>,
    salvage: Option<Salvage>,
    warnings: Vec<String>,
}

fn run(mut scanner: Scanner) -> Outcome {
    let mut events = Vec::new();
    let result = loop {
        match scanner.next_item() {
            Ok(Some(Item::Event(e))) => {
                // The contract: every event is one object `{...}`.
                assert!(e.first() == Some(&b'{') && e.last() == Some(&b'}'));
                let fields = Fields::parse(e);
                if let Some(f) = fields {
                    // Never panics, whatever the values are.
                    f.ts.map(|r| parse_us_to_ns(&e[r]));
                    f.pid.map(|r| parse_int(&e[r]));
                }
                events.push(e.to_vec());
            }
            Ok(Some(Item::Meta { key, raw })) => {
                assert!(key != "traceEvents" && !raw.is_empty());
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    assert!(scanner.next_item().unwrap().is_none());
    Outcome {
        result,
        events,
        salvage: scanner.salvage().cloned(),
        warnings: scanner.warnings().to_vec(),
    }
}

/// Events serde_json accepts, after the reader's own UTF-8 repair.
fn serde_readable(events: &[Vec<u8>]) -> usize {
    events
        .iter()
        .filter(|e| {
            let text = String::from_utf8_lossy(e);
            serde_json::from_str::<serde_json::Value>(&text).is_ok()
        })
        .count()
}

#[test]
fn corpus_files_scan_as_their_names_say() {
    for path in corpus() {
        let name = file_name(&path);
        let out = run(Scanner::open(&path).unwrap());
        for warning in &out.warnings {
            assert!(
                warning.starts_with(path.to_str().unwrap()),
                "{name}: {warning}"
            );
            assert!(warning.contains("byte"), "{name}: {warning}");
        }
        if name.starts_with("err_") {
            let err = out.result.expect_err(name);
            assert!(matches!(err, CoreError::Trace { .. }), "{name}: {err:?}");
            let msg = err.to_string();
            assert!(msg.starts_with(path.to_str().unwrap()), "{name}: {msg}");
            assert!(msg.contains(" at byte "), "{name}: {msg}");
            // The reader agrees that this is no trace.
            assert!(read_trace(&path).is_err(), "{name}");
            continue;
        }
        if let Err(e) = &out.result {
            panic!("{name}: {e}");
        }
        let doc = read_trace(&path).unwrap();
        let want = doc.value["traceEvents"].as_array().unwrap().len();
        assert_eq!(
            out.salvage.is_some(),
            name.starts_with("salvage_"),
            "{name}: {:?}",
            out.salvage
        );
        assert_eq!(out.salvage.is_some(), doc.salvaged, "{name}");
        if let Some(s) = &out.salvage {
            assert_eq!(s.unused_bytes, doc.unused_bytes, "{name}: {s:?}");
        }
        let n = out.events.len();
        match INTENDED_DIFFERENCES.iter().find(|(file, ..)| *file == name) {
            Some((_, scanned, why)) => assert_eq!(n, *scanned, "{name}: {why}"),
            None => assert_eq!(n, want, "{name}"),
        }
        assert_eq!(serde_readable(&out.events), want, "{name}");
        // Fields accepts only valid JSON syntax (serde_json through
        // IgnoredAny, on UTF-8-repaired text, is the oracle), and at least
        // every event the reader keeps.
        let accepted: Vec<&Vec<u8>> = out
            .events
            .iter()
            .filter(|e| Fields::parse_checked(e).is_ok())
            .collect();
        for e in &accepted {
            let text = String::from_utf8_lossy(e);
            assert!(
                serde_json::from_str::<serde::de::IgnoredAny>(&text).is_ok(),
                "{name}: Fields accepted {text}"
            );
        }
        assert!(accepted.len() >= want, "{name}");
    }
}

#[test]
fn specific_corpus_outcomes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let scan = |name: &str| run(Scanner::open(&dir.join(name)).unwrap());

    let out = scan("salvage_truncated_gzip_sync_flush.json.gz");
    assert!(out
        .salvage
        .unwrap()
        .reason
        .contains("gzip stream truncated"));
    let out = scan("salvage_multi_member_truncated.json.gz");
    assert!(out.salvage.unwrap().reason.contains("gzip"));

    let out = scan("ok_invalid_utf8_names.json");
    // Copied through as bytes, never replaced.
    assert!(out.events.iter().any(|e| std::str::from_utf8(e).is_err()));
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);

    let out = scan("ok_nul_padded.json");
    assert!(out.warnings.is_empty(), "{:?}", out.warnings);

    let mut s = Scanner::open(&dir.join("ok_kineto_like.json")).unwrap();
    let mut keys = Vec::new();
    while let Some(item) = s.next_item().unwrap() {
        if let Item::Meta { key, .. } = item {
            keys.push(key.to_string());
        }
    }
    assert_eq!(
        keys[..3],
        ["schemaVersion", "deviceProperties", "baseTimeNanoseconds"]
    );
    let len = std::fs::metadata(dir.join("ok_kineto_like.json"))
        .unwrap()
        .len();
    assert_eq!((s.offset(), s.compressed_read()), (len, len));

    for (name, reason) in [
        ("err_empty.json", "empty file"),
        ("err_whitespace_only.json", "no JSON value"),
        ("err_garbage.bin", "not JSON"),
        ("err_nul_bytes.bin", "not JSON"),
        ("err_html.bin", "not JSON"),
        ("err_python_pickle.bin", "not JSON"),
        ("err_not_trace_object.json", "no traceEvents array"),
        ("err_number.json", "found a number"),
        ("err_string.json", "found a string"),
        (
            "err_trace_events_not_array.json",
            "traceEvents is an object",
        ),
        ("err_array_of_numbers.json", "no event objects"),
        (
            "err_truncated_before_trace_events.json",
            "cannot read the trace",
        ),
        ("err_gzip_garbage.json.gz", "yields no data"),
        ("err_gzip_empty_member.json.gz", "gzip stream holds no data"),
        ("err_truncated_gzip_header.json.gz", "yields no data"),
    ] {
        let msg = scan(name).result.unwrap_err().to_string();
        assert!(msg.contains(reason), "{name}: {msg}");
    }
}

#[test]
fn no_prefix_of_any_corpus_file_panics() {
    for path in corpus() {
        let bytes = std::fs::read(&path).unwrap();
        let step = (bytes.len() / 400).max(1);
        for cut in (0..=bytes.len()).step_by(step) {
            let what = format!("{} cut at {cut}", file_name(&path));
            let prefix = bytes[..cut].to_vec();
            let out = run(Scanner::from_reader(
                &path,
                Box::new(std::io::Cursor::new(prefix)),
            ));
            match out.result {
                Ok(()) => {
                    // The reader salvages the same prefix into as many events.
                    let doc = read_trace_bytes(&path, &bytes[..cut]);
                    let doc = doc.unwrap_or_else(|e| panic!("{what}: reader: {e}"));
                    let want = doc.value["traceEvents"].as_array().unwrap().len();
                    assert_eq!(serde_readable(&out.events), want, "{what}");
                }
                Err(CoreError::Trace { path: p, .. }) => assert_eq!(p, path, "{what}"),
                Err(other) => panic!("{what}: unexpected error {other:?}"),
            }
        }
    }
}
