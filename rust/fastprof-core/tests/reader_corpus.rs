//! Runs the reader over every file in `tests/corpus/` (made by
//! `tests/corpus/generate.py`, described in its README.md). The expectation is
//! in each name: `ok_*` reads completely, `salvage_*` reads as a salvaged
//! prefix, `err_*` is a `CoreError::Trace` naming the file. Every prefix of
//! every file is read too, to show that no input makes the reader panic.

mod common;

use common::{corpus, file_name};
use std::path::Path;

use fastprof_core::offline::trace::reader::{read_trace, read_trace_bytes, TraceDocument};
use fastprof_core::CoreError;
use serde_json::Value;

/// Events each readable file must yield, so a regression that drops events
/// quietly still fails.
const EVENT_COUNTS: &[(&str, usize)] = &[
    ("ok_absurd_1e400_ts.json", 4),
    ("ok_array_closed.json", 4),
    ("ok_bom_prefixed.json", 2),
    ("ok_complete_object.json", 5),
    ("ok_deeply_nested_args.json", 3),
    ("ok_empty_trace_events.json", 0),
    ("ok_huge_ints.json", 3),
    ("ok_invalid_utf8_names.json", 3),
    ("ok_keys_reversed.json", 3),
    ("ok_kineto_like.json", 4),
    ("ok_lone_surrogate_escape.json", 2),
    ("ok_malformed_events.json", 18),
    ("ok_multi_member.json.gz", 8),
    ("ok_garbage_between_events.json", 4),
    ("ok_nul_padded.json", 3),
    ("ok_raw_control_chars_in_strings.json", 4),
    ("ok_single_member.json.gz", 10),
    ("ok_trailing_comma.json", 3),
    ("ok_unbalanced_b_e.json", 4),
    ("salvage_array_no_bracket.json", 4),
    ("salvage_array_partial_event.json", 4),
    ("salvage_fastprof_open_segment.json", 8),
    ("salvage_mid_event.json", 5),
    ("salvage_multi_member_truncated.json.gz", 29),
    ("salvage_nul_padding_mid_list.json", 3),
    ("salvage_opened_no_events.json", 0),
    ("salvage_truncated_gzip_sync_flush.json.gz", 41),
    ("salvage_truncated_in_other_data.json", 3),
];

/// What every document the reader returns must satisfy, whatever the input.
fn check_invariants(doc: &TraceDocument, what: &str) {
    let events = doc.value["traceEvents"].as_array();
    assert!(events.is_some(), "{what}: no traceEvents array");
    assert!(
        events.unwrap().iter().all(Value::is_object),
        "{what}: non-object event"
    );
    if doc.salvaged {
        assert_eq!(doc.value["otherData"]["salvaged"], true, "{what}");
        assert_eq!(
            doc.value["otherData"]["unused_bytes"], doc.unused_bytes,
            "{what}"
        );
        assert!(
            doc.warnings
                .iter()
                .any(|w| w.contains("trace truncated at byte")),
            "{what}"
        );
    } else {
        assert_eq!(doc.unused_bytes, 0, "{what}");
    }
}

#[test]
fn corpus_files_read_as_their_names_say() {
    for path in corpus() {
        let name = file_name(&path);
        match read_trace(&path) {
            Ok(doc) => {
                assert!(
                    !name.starts_with("err_"),
                    "{name}: expected an error, read {:?}",
                    doc.value
                );
                check_invariants(&doc, name);
                assert_eq!(
                    doc.salvaged,
                    name.starts_with("salvage_"),
                    "{name}: {:?}",
                    doc.warnings
                );
                for warning in &doc.warnings {
                    assert!(
                        warning.starts_with(path.to_str().unwrap()),
                        "{name}: {warning}"
                    );
                }
                let n = doc.value["traceEvents"].as_array().unwrap().len();
                let want = EVENT_COUNTS.iter().find(|(file, _)| *file == name);
                let want = want
                    .unwrap_or_else(|| panic!("{name}: not in EVENT_COUNTS (reads {n} events)"));
                assert_eq!(n, want.1, "{name}");
            }
            Err(err) => {
                assert!(name.starts_with("err_"), "{name}: {err}");
                assert!(matches!(err, CoreError::Trace { .. }), "{name}: {err:?}");
                let msg = err.to_string();
                assert!(msg.starts_with(path.to_str().unwrap()), "{name}: {msg}");
                assert!(msg.contains(" at byte "), "{name}: {msg}");
            }
        }
    }
}

#[test]
fn specific_corpus_outcomes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let read = |name: &str| read_trace(&dir.join(name)).unwrap();

    let doc = read("salvage_truncated_gzip_sync_flush.json.gz");
    assert!(doc.gzip_truncated);
    // Seeded from the fastprof_info event: the open segment had no otherData.
    assert_eq!(doc.value["otherData"]["producer"], "fastprof");
    assert_eq!(doc.value["otherData"]["rank"], 1);
    assert_eq!(
        doc.value["baseTimeNanoseconds"],
        1_700_000_000_000_000_000u64
    );

    let doc = read("salvage_truncated_in_other_data.json");
    assert!(!doc.gzip_truncated);
    assert!(doc.value["otherData"]["producer"].is_null());

    for name in [
        "ok_absurd_1e400_ts.json",
        "ok_deeply_nested_args.json",
        "ok_lone_surrogate_escape.json",
    ] {
        let doc = read(name);
        assert!(
            doc.warnings
                .iter()
                .any(|w| w.contains("dropped 1 unreadable")),
            "{name}: {:?}",
            doc.warnings
        );
    }
    let doc = read("ok_malformed_events.json");
    assert!(
        doc.warnings
            .iter()
            .any(|w| w.contains("dropped 15 unreadable")),
        "{:?}",
        doc.warnings
    );
    let doc = read("ok_invalid_utf8_names.json");
    assert!(doc.warnings.iter().any(|w| w.contains("invalid UTF-8")));
    let names: Vec<&str> = doc.value["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("at::\u{FFFD}")),
        "{names:?}"
    );

    // A malformed event costs only itself; the events after it are kept.
    let doc = read("ok_raw_control_chars_in_strings.json");
    let names: Vec<&str> = doc.value["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["op0", "op2", "op4", "op6"]);
    let dropped = doc
        .warnings
        .iter()
        .filter(|w| {
            w.contains("dropped the unreadable event at byte") && w.contains("control character")
        })
        .count();
    assert_eq!(dropped, 3, "{:?}", doc.warnings);
    let doc = read("ok_garbage_between_events.json");
    assert_eq!(doc.warnings.len(), 3, "{:?}", doc.warnings);
    assert!(doc.warnings.iter().all(|w| w.contains("; skipped")));

    let doc = read("ok_array_closed.json");
    assert_eq!(doc.value.as_object().unwrap().len(), 1);
    let doc = read("ok_multi_member.json.gz");
    assert!(!doc.gzip_truncated && doc.warnings.is_empty());
}

#[test]
fn no_prefix_of_any_corpus_file_panics() {
    for path in corpus() {
        let bytes = std::fs::read(&path).unwrap();
        // Every cut for small files, ~400 spread cuts for larger ones.
        let step = (bytes.len() / 400).max(1);
        for cut in (0..=bytes.len()).step_by(step) {
            let what = format!("{} cut at {cut}", file_name(&path));
            match read_trace_bytes(&path, &bytes[..cut]) {
                Ok(doc) => check_invariants(&doc, &what),
                Err(CoreError::Trace { path: p, .. }) => assert_eq!(p, path, "{what}"),
                Err(other) => panic!("{what}: unexpected error {other:?}"),
            }
        }
    }
}
