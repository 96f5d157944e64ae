//! Merges of real files in a temporary directory, outputs checked with
//! serde_json (an oracle independent of the scanner).

use super::*;

/// A fresh directory for one test.
fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fastprof-merge-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn trace(events: &[&str]) -> String {
    format!(
        "{{\"baseTimeNanoseconds\":1700000000000000000,\"traceEvents\":[\n{}\n]}}",
        events.join(",\n")
    )
}

const GOOD: &str = r#"{"ph":"X","name":"ok","pid":1,"tid":1,"ts":1.000,"dur":2.000}"#;

/// Malformed events, each alone between two good ones; all must be dropped.
pub(crate) const MALFORMED: &[&str] = &[
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"args":{"x":1,}}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"args":{"x":[1,2,]}}"#,
    r#"{"ph":"X","name":"a" "pid":1,"tid":1,"ts":1.0}"#,
    r#"{"ph":"X","name" "a","pid":1,"tid":1,"ts":1.0}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"args":{"b":tru}}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":+5}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":.5}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":05}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":5.}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,,"dur":1}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"args":{"k":nul}}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"args":{x:1}}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"args":[1 2]}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"args":{"a":-}}"#,
    r#"{"ph":"X","name":"a","pid":1,"tid":1,"ts":1,"args":{"a":1e}}"#,
];

fn opts(inputs: Vec<PathBuf>, output: PathBuf) -> MergeOptions {
    MergeOptions {
        inputs,
        output,
        threads: 2,
        ..Default::default()
    }
}

fn parse_output(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("merged output is not JSON: {e}"))
}

fn names(doc: &Value) -> Vec<String> {
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] != "M")
        .map(|e| e["name"].as_str().unwrap_or("?").to_string())
        .collect()
}

#[test]
fn malformed_events_are_dropped_never_copied() {
    let d = tmpdir("malformed");
    let mut evs = vec![GOOD];
    for m in MALFORMED {
        evs.push(m);
        evs.push(GOOD);
    }
    let input = d.join("rank0.json");
    std::fs::write(&input, trace(&evs)).unwrap();
    let out = d.join("out.json");
    let s = merge(&opts(vec![input.clone()], out.clone())).unwrap();
    let doc = parse_output(&out);
    assert_eq!(names(&doc), vec!["ok"; MALFORMED.len() + 1]);
    assert_eq!(s.events_dropped, MALFORMED.len() as u64);
    assert_eq!(doc["otherData"]["events_dropped"], MALFORMED.len());
    // One warning per event, naming the file and the event's byte offset.
    let text = std::fs::read_to_string(&input).unwrap();
    for m in MALFORMED {
        let at = text.find(m).unwrap();
        let needle = format!(" event at byte {at} (");
        assert!(
            s.warnings
                .iter()
                .any(|w| w.contains("rank0.json: dropped the ") && w.contains(&needle)),
            "{needle} not in {:#?}",
            s.warnings
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn ids_of_any_type_are_rewritten_into_valid_json() {
    let d = tmpdir("ids");
    let input = d.join("rank0.json");
    std::fs::write(
        &input,
        trace(&[
            r#"{"ph":"s","name":"f","pid":1,"tid":1,"ts":1,"id":{"a":"b\"c"}}"#,
            r#"{"ph":"f","name":"f","pid":1,"tid":1,"ts":2,"id":1.5,"bind_id":[1]}"#,
            r#"{"ph":"t","name":"f","pid":1,"tid":1,"ts":2,"id":"x\"y"}"#,
        ]),
    )
    .unwrap();
    let out = d.join("out.json");
    merge(&opts(vec![input], out.clone())).unwrap();
    let doc = parse_output(&out);
    let ids: Vec<String> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] != "M")
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["r1:{\"a\":\"b\\\"c\"}", "r1:1.5", "r1:x\"y"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_open_segment_renamed_between_the_passes_is_followed() {
    let d = tmpdir("rename");
    let seg = d.join("rank0").join("fastprof.0.json.gz");
    std::fs::create_dir_all(seg.parent().unwrap()).unwrap();
    let part = d.join("rank0").join("fastprof.0.json.gz.part");
    // An open segment: no closing brackets yet.
    let open = format!(
        "{{\"baseTimeNanoseconds\":1700000000000000000,\"traceEvents\":[\n{GOOD},\n{GOOD},\n"
    );
    std::fs::write(&part, &open).unwrap();
    let out = d.join("out.json");
    let o = opts(vec![d.clone()], out.clone());
    let (done, cancel) = (Arc::new(AtomicU64::new(0)), AtomicBool::new(false));
    let files = inputs::expand(&o.inputs).unwrap();
    assert_eq!(files, vec![part.clone()]);
    let plan = plan_all(&o, files, 2, &done, &cancel).unwrap();
    // The recording closes the segment: more events, then a rename.
    let closed = format!("{open}{GOOD},\n{GOOD}\n]}}");
    std::fs::write(&part, closed).unwrap();
    std::fs::rename(&part, &seg).unwrap();
    let s = write_all(&o, plan, 2, &done, &cancel).unwrap();
    // Exactly the events pass 1 planned for.
    assert_eq!(names(&parse_output(&out)), ["ok", "ok"]);
    assert_eq!(s.events_out, 2);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_empty_open_segment_is_skipped_with_a_warning() {
    let d = tmpdir("emptypart");
    std::fs::create_dir_all(d.join("rank0")).unwrap();
    std::fs::write(d.join("rank0/fastprof.1.json.gz.part"), b"").unwrap();
    std::fs::write(d.join("rank0/fastprof.0.json.gz"), trace(&[GOOD])).unwrap();
    let out = d.join("out.json");
    let s = merge(&opts(vec![d.clone()], out.clone())).unwrap();
    assert_eq!(names(&parse_output(&out)), ["ok"]);
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("fastprof.1.json.gz.part: skipped")),
        "{:?}",
        s.warnings
    );
    std::fs::remove_dir_all(&d).unwrap();
}

fn no_leftovers(d: &Path) {
    let left: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("out") || n.starts_with(".out"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn nothing_selected_is_one_error_and_no_file() {
    let d = tmpdir("empty");
    let input = d.join("rank0.json");
    std::fs::write(&input, trace(&[GOOD])).unwrap();
    let out = d.join("out.json");
    let mut o = opts(vec![input.clone()], out.clone());
    o.include_categories = vec!["nope".into()];
    let e = merge(&o).unwrap_err();
    assert!(matches!(e, CoreError::NoEvents { .. }), "{e}");
    assert!(e.to_string().contains("rank0.json") && e.to_string().contains("filtered out"));
    no_leftovers(&d);
    // A previous merge's output alone.
    merge(&opts(vec![input.clone()], out.clone())).unwrap();
    let e = merge(&opts(vec![out.clone()], d.join("out2.json"))).unwrap_err();
    assert!(e.to_string().contains("previous merge output"), "{e}");
    std::fs::remove_file(&out).unwrap();
    // An input with no events, and an empty directory.
    std::fs::write(&input, trace(&[])).unwrap();
    let e = merge(&opts(vec![input.clone()], out.clone())).unwrap_err();
    assert!(e.to_string().contains("hold no events"), "{e}");
    std::fs::create_dir(d.join("void")).unwrap();
    let e = merge(&opts(vec![d.join("void")], out.clone())).unwrap_err();
    assert!(
        matches!(e, CoreError::NoEvents { .. }) && e.to_string().contains("void"),
        "{e}"
    );
    no_leftovers(&d);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn options_are_checked() {
    let d = tmpdir("options");
    let input = d.join("rank0.json");
    std::fs::write(&input, trace(&[GOOD])).unwrap();
    let out = d.join("out.json");
    let run = |f: &dyn Fn(&mut MergeOptions)| {
        let mut o = opts(vec![input.clone()], out.clone());
        f(&mut o);
        merge(&o).unwrap_err().to_string()
    };
    assert!(run(&|o| o.threads = 100_000).contains("threads"));
    let w = |s: Option<f64>, e: Option<f64>| {
        move |o: &mut MergeOptions| o.window = Window::Seconds { start: s, end: e }
    };
    assert!(run(&w(Some(5.0), Some(1.0))).contains("before it starts"));
    assert!(run(&w(Some(f64::NAN), None)).contains("start"));
    assert!(run(&w(None, Some(f64::INFINITY))).contains("end"));
    assert!(run(&w(Some(-1.0), None)).contains("start"));
    let e = run(&w(Some(100.0), None));
    assert!(e.contains("span 0.000 s"), "{e}");
    no_leftovers(&d);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_cancelled_merge_leaves_nothing() {
    let d = tmpdir("cancel");
    let input = d.join("rank0.json");
    std::fs::write(&input, trace(&[GOOD; 1000])).unwrap();
    let out = d.join("out.json.gz");
    let mut o = opts(vec![input], out);
    o.cancel = Some(Arc::new(AtomicBool::new(true)));
    assert!(matches!(merge(&o), Err(CoreError::Cancelled)));
    no_leftovers(&d);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_unwritable_output_directory_is_named() {
    let d = tmpdir("unwritable");
    let input = d.join("rank0.json");
    std::fs::write(&input, trace(&[GOOD])).unwrap();
    // A directory under a regular file can never be created, even as root.
    let out = input.join("out.json");
    let e = merge(&opts(vec![input.clone()], out))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rank0.json/out.json") && !e.contains(".tmp-"),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A fastprof segment as the recorder closes it, with a disk-cap ledger.
fn rotated_segment(dir: &Path, index: u32, pid: u32, base: i64, ts: f64, ledger: &str) {
    use flate2::write::GzEncoder;
    use std::fs::File;
    let doc = format!(
        "{{\"baseTimeNanoseconds\":{base},\"traceEvents\":[\n\
         {{\"ph\":\"M\",\"name\":\"fastprof_info\",\"pid\":{pid},\"tid\":0,\"args\":{{\"producer\":\"fastprof\",\"rank\":0}}}},\n\
         {{\"ph\":\"i\",\"s\":\"t\",\"name\":\"tick\",\"pid\":{pid},\"tid\":1,\"ts\":{ts:.3}}}\n\
         ],\"otherData\":{{\"producer\":\"fastprof\",\"rank\":0,\"pid\":{pid},\"rotated\":{ledger}}}}}"
    );
    let f = File::create(dir.join(format!("fastprof.{index}.json.gz"))).unwrap();
    let mut gz = GzEncoder::new(f, flate2::Compression::fast());
    gz.write_all(doc.as_bytes()).unwrap();
    gz.finish().unwrap();
}

#[test]
fn gaps_in_segment_numbering_and_two_rotated_recordings_of_a_rank() {
    let d = tmpdir("rotated");
    let rank = d.join("rank0");
    std::fs::create_dir_all(&rank).unwrap();
    const B1: i64 = 1_700_000_000_000_000_000;
    const B2: i64 = B1 + 3_600_000_000_000;
    let ledger = |n: u64, s: f64, e: f64| {
        format!(
            r#"{{"segments":{n},"bytes":{},"events":{},"ts_start":{s},"ts_end":{e},"deleted":[]}}"#,
            n * 100,
            n * 10
        )
    };
    // Recording 1 (pid 11): segments 0..=6 deleted by the time 9 closed;
    // 7 says 5 were (an older ledger, superseded by 9's).
    rotated_segment(&rank, 7, 11, B1, 5_000_000.0, &ledger(5, 1.5, 4_000_000.0));
    rotated_segment(&rank, 9, 11, B1, 6_000_000.0, &ledger(7, 1.5, 4_500_000.0));
    // Recording 2 (pid 22, a resumed job in the same directory): 2 deleted.
    rotated_segment(
        &rank,
        12,
        22,
        B2,
        2_000_000.0,
        &ledger(2, 10.0, 1_000_000.0),
    );
    let out = d.join("merged.json");
    let s = merge(&opts(vec![d.clone()], out.clone())).unwrap();
    assert_eq!(s.files, 3, "every segment is read whatever the gaps");
    assert_eq!(s.events_in, 6);
    let [r] = &s.rotated[..] else {
        panic!("one rank: {:?}", s.rotated)
    };
    assert_eq!(r["rank"], 0);
    assert_eq!(r["segments"], 9);
    assert_eq!(r["bytes"], 900);
    assert_eq!(r["events"], 90);
    assert_eq!(r["start_ns"], B1 + 1_500);
    assert_eq!(r["end_ns"], B2 + 1_000_000_000);
    assert_eq!(r["recordings"].as_array().unwrap().len(), 2);
    // The merged trace starts at its first event (B1 + 5 s): the range lies before it.
    assert_eq!(s.base_ns, B1 + 5_000_000_000);
    assert!(r["start_s"].as_f64().unwrap() < 0.0);
    let doc = parse_output(&out);
    assert_eq!(doc["otherData"]["rotated"][0]["segments"], 9);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_later_ledger_that_deleted_only_files_is_the_one_counted() {
    // Segment 9 closed after the cap deleted flight dumps and torch windows
    // (no more segments): its ledger, not 7's, says what is gone.
    let d = tmpdir("rotated-files");
    let rank = d.join("rank0");
    std::fs::create_dir_all(&rank).unwrap();
    const B: i64 = 1_700_000_000_000_000_000;
    let early =
        r#"{"segments":2,"bytes":200,"events":20,"ts_start":1.0,"ts_end":2.0,"deleted":[]}"#;
    let late = r#"{"segments":2,"bytes":200,"events":20,"files":3,"files_bytes":3000,"ts_start":1.0,"ts_end":2.0,"deleted":[]}"#;
    rotated_segment(&rank, 7, 11, B, 5_000.0, early);
    rotated_segment(&rank, 9, 11, B, 6_000.0, late);
    let out = d.join("merged.json");
    let s = merge(&opts(vec![d.clone()], out.clone())).unwrap();
    let [r] = &s.rotated[..] else {
        panic!("one rank: {:?}", s.rotated)
    };
    assert_eq!(
        (r["segments"].as_u64(), r["files"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(r["files_bytes"], 3000);
    assert_eq!(parse_output(&out)["otherData"]["rotated"][0]["files"], 3);
    std::fs::remove_dir_all(&d).unwrap();
}
