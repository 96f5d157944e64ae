//! The merge's rewrite path: arbitrary events through `fastprof merge`,
//! whose output must always be valid JSON. The oracle is serde_json (syntax,
//! through `IgnoredAny`: numbers beyond f64 and lone surrogate escapes are
//! valid JSON text), independent of the scanner the merge is built on.
//!
//! The first byte picks the input: the bytes as a whole file, or as the body
//! of the event list of a well-formed trace (so that mutations reach the
//! events rather than the document's frame). The merge writes plain JSON
//! (`.json`), one thread. Also checked: on error, neither output nor
//! temporary file is left; on success the output is a single object with a
//! `traceEvents` array whose events are all objects.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use fastprof_core::offline::merge::{merge, MergeOptions, Window};
use libfuzzer_sys::fuzz_target;
use serde::de::IgnoredAny;
use serde_json::Value;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("fastprof-fuzz-merge-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let d = dir();
    let input = d.join("rank0.json");
    let output = d.join("out.json");
    let _ = std::fs::remove_file(&output);
    let mut text = Vec::with_capacity(body.len() + 128);
    if mode & 1 == 0 {
        text.extend_from_slice(b"{\"baseTimeNanoseconds\":1700000000000000000,\"traceEvents\":[\n");
        text.extend_from_slice(body);
        text.extend_from_slice(b"\n],\"otherData\":{\"producer\":\"fastprof\",\"rank\":0}}");
    } else {
        text.extend_from_slice(body);
    }
    std::fs::write(&input, &text).unwrap();
    let window = match mode >> 1 & 3 {
        1 => Window::Seconds {
            start: Some(0.0),
            end: Some(1e-3),
        },
        2 => Window::Steps { from: 0, to: 1 },
        _ => Window::All,
    };
    let opts = MergeOptions {
        inputs: vec![input],
        output: output.clone(),
        force: true,
        window,
        exclude_categories: if mode & 8 != 0 {
            vec!["cpu_op".into()]
        } else {
            Vec::new()
        },
        threads: 1,
        ..Default::default()
    };
    let result = merge(&opts);
    let leftovers: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary file left: {leftovers:?}");
    match result {
        Err(_) => assert!(!output.exists(), "an output after an error"),
        Ok(summary) => {
            let out = std::fs::read(&output).unwrap();
            let text = std::str::from_utf8(&out).expect("the output is UTF-8");
            if let Err(e) = serde_json::from_str::<IgnoredAny>(text) {
                panic!("the merge output is not JSON: {e}\n{text}");
            }
            // Where serde_json can also build the document, it has the right shape.
            if let Ok(doc) = serde_json::from_str::<Value>(text) {
                let events = doc["traceEvents"].as_array().expect("traceEvents array");
                assert!(events.iter().all(Value::is_object));
                assert_eq!(doc["otherData"]["events_out"], summary.events_out);
            }
        }
    }
});
