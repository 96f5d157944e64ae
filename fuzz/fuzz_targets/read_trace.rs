//! Arbitrary bytes (plain, or gzip when they start with its magic) through
//! `read_trace`, the salvaging whole-document reader behind
//! `fastprof.read_trace`. Besides "never panics":
//! * a document read is an object whose `traceEvents` is an array of objects;
//! * it serializes back to JSON that serde_json reads again (an oracle apart
//!   from the scanner);
//! * a salvage is flagged consistently (`salvaged`, `unused_bytes`,
//!   `otherData.salvaged`) and named in a warning;
//! * an error names the source.
#![no_main]

use std::path::Path;

use fastprof_core::offline::trace::reader::read_trace_bytes;
use fastprof_core::CoreError;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    match read_trace_bytes(Path::new("fuzz.json"), data) {
        Ok(doc) => {
            let obj = doc.value.as_object().expect("the document is an object");
            let events = obj["traceEvents"]
                .as_array()
                .expect("traceEvents is an array");
            assert!(events.iter().all(Value::is_object));
            let text = serde_json::to_string(&doc.value).unwrap();
            let again: Value = serde_json::from_str(&text).expect("the document re-reads");
            assert_eq!(
                again["traceEvents"].as_array().map(Vec::len),
                Some(events.len())
            );
            if doc.salvaged {
                assert_eq!(doc.value["otherData"]["salvaged"], Value::Bool(true));
                assert!(doc.warnings.iter().any(|w| w.contains("truncated")));
            } else {
                assert_eq!(doc.unused_bytes, 0);
            }
            assert!(doc.warnings.iter().all(|w| w.starts_with("fuzz.json")));
        }
        Err(CoreError::Trace { path, .. }) => assert_eq!(path, Path::new("fuzz.json")),
        Err(e) => panic!("unexpected error kind: {e}"),
    }
});
