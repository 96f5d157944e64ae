//! Tests of the columns reader on small traces written to a temporary directory.

use super::*;
use crate::test_support::{gzip, Scratch};

/// A fresh directory for one test, removed when it ends.
fn dir(name: &str) -> Scratch {
    Scratch::new(&format!("columns-{name}"))
}

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    if path.extension().is_some_and(|e| e == "gz") {
        std::fs::write(path, gzip(text.as_bytes())).unwrap();
    } else {
        std::fs::write(path, text).unwrap();
    }
    path.to_path_buf()
}

fn read(paths: &[PathBuf], opts: &ColumnsOptions) -> Columns {
    read_columns(paths, opts).unwrap_or_else(|e| panic!("{e}"))
}

fn names_of(c: &Columns, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&i| c.names[i as usize].clone()).collect()
}

const BASE: i64 = 1_700_000_000_000_000_000;

/// A closed fastprof segment of `rank` with a clock offset.
fn fastprof_segment(rank: u32, offset_ns: i64) -> String {
    format!(
        r#"{{"baseTimeNanoseconds":{BASE},"displayTimeUnit":"ms","traceEvents":[
{{"ph":"M","name":"fastprof_info","pid":40,"tid":0,"args":{{"producer":"fastprof","rank":{rank},"clock":{{"offset_ns":{offset_ns}}}}}}},
{{"ph":"M","name":"process_name","pid":40,"tid":0,"args":{{"name":"rank {rank}"}}}},
{{"ph":"X","cat":"user","name":"step","pid":40,"tid":1,"ts":10.000,"dur":100.000,"args":{{"step":7}}}},
{{"ph":"X","cat":"user","name":"forward","pid":40,"tid":1,"ts":20.500,"dur":30.250}},
{{"ph":"i","cat":"user","name":"ckpt","pid":40,"tid":1,"ts":60.001,"s":"t"}},
{{"ph":"C","cat":"user","name":"loss","pid":40,"tid":1,"ts":70.000,"args":{{"train":0.5,"val":"1.25","note":"x"}}}},
{{"ph":"X","cat":"user","name":"step","pid":40,"tid":1,"ts":110.000,"dur":50.000,"args":{{"step":8}}}},
{{"ph":"X","cat":"user","name":"forward","pid":40,"tid":2,"ts":120.000,"dur":1.000}},
{{"ph":"X","cat":"user","name":"forward","pid":40,"tid":1,"ts":200.000,"dur":1.000}}
],"otherData":{{"producer":"fastprof","rank":{rank},"clock":{{"offset_ns":{offset_ns}}}}}}}"#
    )
}

#[test]
fn every_column_of_a_fastprof_segment() {
    let d = dir("segment");
    let p = write(
        &d.join("rank2/fastprof.0.json.gz"),
        &fastprof_segment(2, 1000),
    );
    let c = read(std::slice::from_ref(&p), &ColumnsOptions::default());
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let s = &c.spans;
    assert_eq!(
        names_of(&c, &s.name),
        ["step", "forward", "step", "forward", "forward"]
    );
    let t = |us_thousandths: i64| BASE + us_thousandths + 1000;
    assert_eq!(
        s.ts,
        [t(10_000), t(20_500), t(110_000), t(120_000), t(200_000)]
    );
    assert_eq!(s.dur, [100_000, 30_250, 50_000, 1_000, 1_000]);
    assert_eq!(s.pid, [40; 5]);
    assert_eq!(s.tid, [1, 1, 1, 2, 1]);
    assert_eq!(s.rank, [2; 5]);
    // Steps from the step spans' args; tid 2 is on the same pid; after the last step: -1.
    assert_eq!(s.step, [7, 7, 8, 8, -1]);
    assert_eq!(s.file, [0; 5]);
    assert_eq!(c.categories, ["user"]);
    assert!(s.cat.iter().all(|&x| x == 0));

    assert_eq!(names_of(&c, &c.instants.name), ["ckpt"]);
    assert_eq!(c.instants.ts, [t(60_001)]);
    assert!(c.instants.dur.is_empty() && c.instants.value.is_empty());
    assert_eq!(c.instants.step, [7]);

    // One row per numeric series; "note" is not a number.
    let k = &c.counters;
    assert_eq!(names_of(&c, &k.name), ["loss", "loss"]);
    assert_eq!(names_of(&c, &k.series), ["train", "val"]);
    assert_eq!(k.value, [0.5, 1.25]);
    assert_eq!(k.ts, [t(70_000); 2]);
    assert_eq!(k.step, [7, 7]);

    assert_eq!(c.files.len(), 1);
    let f = &c.files[0];
    assert_eq!(
        (f.kind, f.rank, f.base_ns, f.offset_ns),
        ("fastprof", Some(2), Some(BASE), 1000)
    );
    assert_eq!((f.events, f.salvaged, f.skipped.clone()), (9, false, None));
}

#[test]
fn filters_by_name_prefix_category_kind_and_time() {
    let d = dir("filters");
    let text = format!(
        r#"{{"baseTimeNanoseconds":{BASE},"traceEvents":[
{{"ph":"X","cat":"cpu_op,fwd","name":"aten::mm","pid":1,"tid":1,"ts":0,"dur":10}},
{{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":1,"ts":20,"dur":10}},
{{"ph":"X","cat":"python_function","name":"model.py(1): forward","pid":1,"tid":1,"ts":40,"dur":10}},
{{"ph":"i","cat":"cpu_op","name":"aten::mark","pid":1,"tid":1,"ts":45}},
{{"ph":"C","cat":"mem","name":"aten::alloc","pid":1,"tid":1,"ts":50,"args":{{"bytes":64}}}}
]}}"#
    );
    let p = write(&d.join("t.json"), &text);
    let run = |opts: ColumnsOptions| {
        let c = read(std::slice::from_ref(&p), &opts);
        let mut got = names_of(&c, &c.spans.name);
        got.extend(names_of(&c, &c.instants.name));
        got.extend(names_of(&c, &c.counters.name));
        got
    };
    let exact = ColumnsOptions {
        names: Some(vec!["aten::add".into(), "nothing".into()]),
        ..Default::default()
    };
    assert_eq!(run(exact), ["aten::add"]);
    let prefix = ColumnsOptions {
        name_prefixes: vec!["aten::".into()],
        ..Default::default()
    };
    assert_eq!(
        run(prefix),
        ["aten::mm", "aten::add", "aten::mark", "aten::alloc"]
    );
    let both = ColumnsOptions {
        names: Some(vec!["model.py(1): forward".into()]),
        name_prefixes: vec!["aten::m".into()],
        spans: true,
        instants: false,
        counters: false,
        ..Default::default()
    };
    assert_eq!(run(both), ["aten::mm", "model.py(1): forward"]);
    // One comma-separated part of cat is enough.
    let cats = ColumnsOptions {
        categories: Some(vec!["fwd".into(), "mem".into()]),
        ..Default::default()
    };
    assert_eq!(run(cats), ["aten::mm", "aten::alloc"]);
    // Spans overlapping [25 µs, 45 µs): aten::add (20..30) and forward (40..50); the
    // instant at 45 is outside the half-open window, aten::mm (0..10) too.
    let window = ColumnsOptions {
        start_ns: Some(BASE + 25_000),
        end_ns: Some(BASE + 45_000),
        ..Default::default()
    };
    assert_eq!(run(window), ["aten::add", "model.py(1): forward"]);
    // Tables hold only what kept rows use.
    let c = read(
        std::slice::from_ref(&p),
        &ColumnsOptions {
            names: Some(vec!["aten::add".into()]),
            ..Default::default()
        },
    );
    assert_eq!(
        (c.names.clone(), c.categories.clone()),
        (vec!["aten::add".to_string()], vec!["cpu_op".to_string()])
    );
}

#[test]
fn torch_trace_with_absolute_microseconds_and_profiler_steps() {
    let d = dir("torch");
    // torch < 2.4: absolute epoch µs, no baseTimeNanoseconds; decimals kept exactly.
    let text = r#"{"schemaVersion":1,"distributedInfo":{"rank":3,"world_size":4},"traceEvents":[
{"ph":"X","cat":"user_annotation","name":"ProfilerStep#12","pid":77,"tid":77,"ts":1700000000000100.000,"dur":500.000},
{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":77,"tid":77,"ts":1700000000000150.123,"dur":0.001},
{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":1700000000000300.5,"dur":10},
{"ph":"X","cat":"user_annotation","name":"ProfilerStep#13","pid":77,"tid":77,"ts":1700000000000600,"dur":100},
{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":1700000000000650,"dur":10},
{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":1700000000000800,"dur":10}
],"traceName":"x.pt.trace.json"}"#;
    let p = write(&d.join("host_1.pt.trace.json"), text);
    let c = read(&[p], &ColumnsOptions::default());
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let s = &c.spans;
    assert_eq!(s.ts[1], 1_700_000_000_000_150_123);
    assert_eq!(s.dur[1], 1);
    assert_eq!(s.ts[2], 1_700_000_000_000_300_500);
    assert_eq!(s.rank, [3; 6]);
    // The GPU pid has no markers: it takes its rank's.
    assert_eq!(s.step, [12, 12, 12, 13, 13, -1]);
    assert_eq!((c.files[0].kind, c.files[0].base_ns), ("kineto", None));
}

#[test]
fn base_time_after_the_events_and_be_pairs() {
    let d = dir("late-base");
    let text = r#"{"traceEvents":[
{"ph":"B","name":"outer","pid":1,"tid":1,"ts":1},
{"ph":"B","name":"inner","pid":1,"tid":1,"ts":2},
{"ph":"E","pid":1,"tid":1,"ts":3},
{"ph":"E","pid":1,"tid":1,"ts":9},
{"ph":"E","pid":1,"tid":2,"ts":9},
{"ph":"B","name":"open","pid":1,"tid":1,"ts":10}
],"baseTimeNanoseconds":5000000}"#;
    let p = write(&d.join("be.json"), text);
    let c = read(&[p], &ColumnsOptions::default());
    assert_eq!(names_of(&c, &c.spans.name), ["inner", "outer"]);
    assert_eq!(c.spans.ts, [5_002_000, 5_001_000]);
    assert_eq!(c.spans.dur, [1_000, 8_000]);
    assert_eq!(c.spans.rank, [-1, -1], "no rank anywhere");
    let w = c.warnings.join("\n");
    assert!(w.contains("1 B/E events did not pair up"), "{w}");
    assert!(w.contains("1 B events had no E"), "{w}");
}

#[test]
fn fastprof_step_counters_and_a_malformed_event_in_the_middle() {
    let d = dir("resync");
    let mut text = format!(r#"{{"baseTimeNanoseconds":{BASE},"traceEvents":["#);
    text.push_str(
        r#"{"ph":"C","name":"fastprof.step","pid":5,"tid":1,"ts":100,"args":{"value":3}},"#,
    );
    text.push_str(r#"{"ph":"X","name":"a","pid":5,"tid":1,"ts":150,"dur":1},"#);
    text.push_str(
        "{\"ph\":\"X\",\"name\":\"bad\tname\",\"pid\":5,\"tid\":1,\"ts\":160,\"dur\":1},",
    );
    text.push_str(r#"{"ph":"X","name":"b","pid":5,"tid":1,"ts":170,"dur":1} garbage "#);
    text.push_str(
        r#"{"ph":"C","name":"fastprof.step","pid":5,"tid":1,"ts":200,"args":{"value":4}},"#,
    );
    text.push_str(r#"{"ph":"X","name":"c","pid":5,"tid":1,"ts":250,"dur":1}]}"#);
    let p = write(&d.join("r.json"), &text);
    let c = read(&[p], &ColumnsOptions::default());
    assert_eq!(names_of(&c, &c.spans.name), ["a", "b", "c"]);
    assert_eq!(c.spans.step, [3, 3, 4]);
    assert_eq!(names_of(&c, &c.counters.series), ["value", "value"]);
    assert_eq!(c.counters.value, [3.0, 4.0]);
    assert_eq!(c.counters.step, [3, 4]);
    assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
    assert!(
        c.warnings[0].contains("dropped the unreadable event at byte"),
        "{:?}",
        c.warnings
    );
    assert!(c.warnings[1].contains("skipped"), "{:?}", c.warnings);
    assert!(!c.files[0].salvaged);
}

#[test]
fn run_directory_with_two_ranks_torch_traces_and_a_merged_output() {
    let d = dir("rundir");
    let run = d.join("run");
    write(
        &run.join("rank0/fastprof.0.json.gz"),
        &fastprof_segment(0, 0),
    );
    write(
        &run.join("rank1/fastprof.0.json.gz"),
        &fastprof_segment(1, -500),
    );
    // A torch trace of rank 1 (rank from the path), aligned by its own base,
    // placed with rank 1's clock offset.
    let torch = format!(
        r#"{{"schemaVersion":1,"traceEvents":[{{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":20.000,"dur":5.000}}],"baseTimeNanoseconds":{BASE}}}"#
    );
    write(&run.join("rank1/torch/w.pt.trace.json.gz"), &torch);
    // A previous merge output next to its inputs: skipped.
    let merged = format!(
        r#"{{"baseTimeNanoseconds":{BASE},"traceEvents":[
{{"ph":"M","name":"fastprof_merge","pid":0,"tid":0,"args":{{"inputs":2}}}},
{{"ph":"M","name":"fastprof_info","pid":200000,"tid":0,"args":{{"producer":"fastprof","rank":1}}}},
{{"ph":"M","name":"process_name","pid":200000,"tid":0,"args":{{"name":"rank 1: rank 1"}}}},
{{"ph":"M","name":"fastprof_info","pid":100000,"tid":0,"args":{{"producer":"fastprof","rank":0}}}},
{{"ph":"X","name":"forward","pid":200000,"tid":1,"ts":1.000,"dur":1.000}},
{{"ph":"X","name":"forward","pid":100000,"tid":1,"ts":2.000,"dur":1.000}}
],"otherData":{{"producer":"fastprof merge","merged":true}}}}"#
    );
    write(&run.join("trace.json.gz"), &merged);
    // Not a trace, found by the walk: skipped with a warning.
    write(&run.join("notes/summary.json"), r#"{"steps": 3}"#);
    // The report's folder holds none: skipped without one.
    write(
        &run.join("reports/operators.rank0.ep0-ba1.json"),
        r#"{"rows": []}"#,
    );

    let opts = ColumnsOptions {
        names: Some(vec!["forward".into(), "gemm".into()]),
        ..Default::default()
    };
    let c = read(std::slice::from_ref(&run), &opts);
    let used: Vec<_> = c
        .files
        .iter()
        .filter(|f| f.skipped.is_none())
        .map(|f| f.path.clone())
        .collect();
    assert_eq!(used.len(), 3, "{:?}", c.files);
    assert!(c
        .files
        .iter()
        .any(|f| f.kind == "merged" && f.skipped.is_some()));
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("previous merge output")),
        "{:?}",
        c.warnings
    );
    assert!(c
        .warnings
        .iter()
        .any(|w| w.starts_with("skipped, not a trace:") && w.contains("summary.json")));
    assert!(
        !c.warnings.iter().any(|w| w.contains("operators.rank0")),
        "{:?}",
        c.warnings
    );
    let s = &c.spans;
    let mut rows: Vec<(String, i32, i64, i64)> = (0..s.len())
        .map(|r| {
            (
                c.names[s.name[r] as usize].clone(),
                s.rank[r],
                s.ts[r] - BASE,
                s.step[r],
            )
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("forward".to_string(), 0, 20_500, 7),
            ("forward".into(), 0, 120_000, 8),
            ("forward".into(), 0, 200_000, -1),
            ("forward".into(), 1, 20_000, 7),
            ("forward".into(), 1, 119_500, 8),
            ("forward".into(), 1, 199_500, -1),
            ("gemm".into(), 1, 19_500, 7),
        ]
    );

    // The merged trace on its own: ranks from its process names and pid numbering.
    let c = read(&[run.join("trace.json.gz")], &opts);
    assert_eq!(c.files[0].kind, "merged");
    assert_eq!(c.spans.rank, [1, 0]);
    assert_eq!(c.spans.ts, [BASE + 1000, BASE + 2000]);
    // A directory holding only a merged trace reads it.
    let only = d.join("only");
    std::fs::create_dir_all(&only).unwrap();
    std::fs::copy(run.join("trace.json.gz"), only.join("trace.json.gz")).unwrap();
    write(&only.join("notes.json"), "[1, 2]");
    let c = read(&[only], &opts);
    assert_eq!(c.spans.len(), 2);
}

#[test]
fn errors_name_the_file() {
    let d = dir("errors");
    let p = write(&d.join("page.json"), "<html>not a trace</html>");
    match read_columns(std::slice::from_ref(&p), &ColumnsOptions::default()) {
        Err(CoreError::Trace {
            path,
            offset,
            reason,
        }) => {
            assert_eq!((path, offset), (p, 0));
            assert!(reason.starts_with("not JSON"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match read_columns(&[d.join("missing.json")], &ColumnsOptions::default()) {
        Err(CoreError::Io { path, source }) => {
            assert_eq!(path, d.join("missing.json"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_truncated_segment_is_salvaged() {
    let d = dir("salvage");
    let full = fastprof_segment(0, 0);
    let cut = &full[..full
        .find(r#"{"ph":"X","cat":"user","name":"forward","pid":40,"tid":2"#)
        .unwrap()
        + 20];
    let p = write(&d.join("rank0/fastprof.1.json.gz.part"), cut);
    let c = read(&[p], &ColumnsOptions::default());
    assert!(c.files[0].salvaged);
    assert_eq!(names_of(&c, &c.spans.name), ["step", "forward", "step"]);
    assert_eq!(c.spans.rank, [0; 3], "rank from the fastprof_info event");
    assert!(
        c.warnings.iter().any(|w| w.contains("salvaged")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn hostile_durations_are_left_out_and_named() {
    let d = dir("hostile-dur");
    let p = write(
        &d.join("t.json"),
        r#"{"traceEvents":[
{"ph":"X","name":"step","pid":1,"tid":1,"ts":10,"dur":5},
{"ph":"X","name":"step","pid":1,"tid":1,"ts":20,"dur":1e300},
{"ph":"X","name":"step","pid":1,"tid":1,"ts":30,"dur":-3},
{"ph":"X","name":"fwd","pid":1,"tid":1,"ts":40,"dur":"soon"},
{"ph":"X","name":"fwd","pid":1,"tid":1,"ts":50,"dur":2e15},
{"ph":"X","name":"fwd","pid":1,"tid":1,"ts":60},
{"ph":"B","name":"bwd","pid":1,"tid":1,"ts":80},
{"ph":"E","pid":1,"tid":1,"ts":70}
]}"#,
    );
    let c = read(std::slice::from_ref(&p), &ColumnsOptions::default());
    // Kept: the 5 µs step and the fwd without a dur (0 s, as viewers read it).
    assert_eq!(names_of(&c, &c.spans.name), ["step", "fwd"]);
    assert_eq!(c.spans.dur, [5_000, 0]);
    assert_eq!(
        c.files[0].bad_dur,
        [
            ("bwd".to_string(), 1),
            ("fwd".to_string(), 2),
            ("step".to_string(), 2)
        ]
    );
    let said: Vec<&String> = c.warnings.iter().filter(|w| w.contains(" dur ")).collect();
    assert_eq!(said.len(), 1, "{:?}", c.warnings);
    assert!(
        said[0].contains("5 spans with a negative") && said[0].contains(r#""step" x2"#),
        "{:?}",
        c.warnings
    );
}

#[test]
fn a_cut_file_says_where() {
    let d = dir("cut");
    let full = fastprof_segment(0, 0);
    let at = full.find(r#"{"ph":"i""#).unwrap();
    let p = write(&d.join("rank0/fastprof.0.json.gz.part"), &full[..at + 10]);
    let c = read(std::slice::from_ref(&p), &ColumnsOptions::default());
    let (byte, why) = c.files[0].cut.clone().expect("a cut");
    assert!(c.files[0].salvaged);
    assert!(byte > 0 && byte <= at as u64, "{byte} {at}");
    assert!(!why.is_empty());
    assert_eq!(names_of(&c, &c.spans.name), ["step", "forward"]);
    let kept = format!("kept the {} events before byte {byte} ", c.files[0].events);
    assert!(
        c.warnings.iter().any(|w| w.contains(&kept)),
        "{:?}",
        c.warnings
    );
}

#[test]
fn folded_categories_are_totals_per_rank_name_and_category() {
    let d = dir("fold");
    // Two ranks' Kineto traces: ProfilerStep#N (user_annotation) stays rows,
    // read as one name; cpu_op and kernel spans become totals; a user span
    // stays a row.
    let trace = |rank: u32, shift: i64| {
        format!(
            r#"{{"distributedInfo":{{"rank":{rank}}},"baseTimeNanoseconds":{BASE},"traceEvents":[
{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":9,"tid":9,"ts":{a},"dur":100}},
{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#2","pid":9,"tid":9,"ts":{b},"dur":100}},
{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#x","pid":9,"tid":9,"ts":{b},"dur":5}},
{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":9,"tid":9,"ts":{c},"dur":10}},
{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":9,"tid":9,"ts":{d},"dur":30}},
{{"ph":"B","cat":"cpu_op","name":"aten::add","pid":9,"tid":9,"ts":{d}}},
{{"ph":"E","pid":9,"tid":9,"ts":{e}}},
{{"ph":"X","cat":"kernel","name":"sgemm","pid":0,"tid":7,"ts":{e},"dur":40}},
{{"ph":"X","cat":"user","name":"mine","pid":9,"tid":9,"ts":{c},"dur":1}}
]}}"#,
            a = shift,
            b = 100 + shift,
            c = 10 + shift,
            d = 110 + shift,
            e = 150 + shift,
        )
    };
    let p0 = write(&d.join("r0.pt.trace.json"), &trace(0, 0));
    let p1 = write(&d.join("r1.pt.trace.json"), &trace(1, 1000));
    let opts = ColumnsOptions {
        fold_categories: vec!["cpu_op".into(), "kernel".into(), "user_annotation".into()],
        fold_except: vec!["ProfilerStep#".into()],
        collapse_numbered: vec!["ProfilerStep#".into()],
        step_column: false,
        ..Default::default()
    };
    let c = read(&[p0.clone(), p1.clone()], &opts);
    assert!(c.spans.step.is_empty());
    // Rows: per rank the two steps under one name, "ProfilerStep#x" (kept
    // by the prefix, not collapsed: no number), and the user span.
    let rows: Vec<(i32, String)> = (0..c.spans.len())
        .map(|i| (c.spans.rank[i], c.names[c.spans.name[i] as usize].clone()))
        .collect();
    let want = |r| {
        [
            (r, "ProfilerStep#*"),
            (r, "ProfilerStep#*"),
            (r, "ProfilerStep#x"),
            (r, "mine"),
        ]
        .map(|(r, n): (i32, &str)| (r, n.to_string()))
    };
    let mut expected: Vec<(i32, String)> = want(0).to_vec();
    expected.extend(want(1));
    assert_eq!(rows, expected);
    let f = &c.folded;
    type Row = (i32, String, String, u64, i64, i64, i64, i64);
    let got: Vec<Row> = (0..f.rank.len())
        .map(|i| {
            let x = f.folds[i];
            (
                f.rank[i],
                c.names[f.name[i] as usize].clone(),
                c.categories[f.cat[i] as usize].clone(),
                x.count,
                x.total_ns,
                x.max_ns,
                x.first_ns - BASE,
                x.last_ns - BASE,
            )
        })
        .collect();
    let us = 1000;
    let mut want = Vec::new();
    for (r, shift) in [(0, 0), (1, 1000 * us)] {
        want.extend(
            [
                ("aten::mm", "cpu_op", 2, 40 * us, 30 * us, 10 * us, 140 * us),
                (
                    "aten::add",
                    "cpu_op",
                    1,
                    40 * us,
                    40 * us,
                    110 * us,
                    150 * us,
                ),
                ("sgemm", "kernel", 1, 40 * us, 40 * us, 150 * us, 190 * us),
            ]
            .map(|(n, cat, count, total, max, first, last)| {
                (
                    r,
                    n.to_string(),
                    cat.to_string(),
                    count,
                    total,
                    max,
                    first + shift,
                    last + shift,
                )
            }),
        );
    }
    let mut got_sorted = got.clone();
    got_sorted.sort();
    want.sort();
    assert_eq!(got_sorted, want);
    // Sorted by (rank, name id, cat id) as returned.
    let keys: Vec<(i32, u32, u32)> = (0..f.rank.len())
        .map(|i| (f.rank[i], f.name[i], f.cat[i]))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    // Folding with a time window is refused, naming the option.
    let bad = ColumnsOptions {
        start_ns: Some(BASE),
        ..opts
    };
    let e = read_columns(&[p0], &bad).unwrap_err().to_string();
    assert!(e.contains("fold_categories"), "{e}");
}

/// `omit` leaves columns out without changing any other: the same rows,
/// ranks (a left-out pid still places its row) and values, with and
/// without a time window; every column returned holds exactly its rows.
#[test]
fn omitted_columns_change_no_other_and_columns_are_exact() {
    let d = dir("omit");
    let a = write(
        &d.join("rank2/fastprof.0.json.gz"),
        &fastprof_segment(2, 1000),
    );
    let b = write(&d.join("rank3/fastprof.0.json"), &fastprof_segment(3, -500));
    let be = write(
        &d.join("rank3/pairs.json"),
        r#"{"traceEvents":[
{"ph":"B","cat":"user","name":"outer","pid":7,"tid":1,"ts":5},
{"ph":"C","cat":"user","name":"mem","pid":7,"tid":1,"ts":6,"args":{"a":1,"b":2}},
{"ph":"E","pid":7,"tid":1,"ts":9}]}"#,
    );
    let paths = [a, b, be];
    let all = Omit {
        cat: true,
        pid: true,
        tid: true,
        file: true,
    };
    for (start_ns, end_ns) in [(None, None), (Some(BASE + 60_000), Some(BASE + 150_000))] {
        let base = ColumnsOptions {
            step_column: false,
            start_ns,
            end_ns,
            ..Default::default()
        };
        let full = read(&paths, &base);
        let lean = read(
            &paths,
            &ColumnsOptions {
                omit: [all; 3],
                ..base.clone()
            },
        );
        assert_eq!(full.warnings, lean.warnings);
        for (f, l) in [
            (&full.spans, &lean.spans),
            (&full.instants, &lean.instants),
            (&full.counters, &lean.counters),
        ] {
            assert!(!f.is_empty());
            assert!(f.is_exact() && l.is_exact());
            assert_eq!(
                (&f.name, &f.ts, &f.dur, &f.rank, &f.series, &f.value),
                (&l.name, &l.ts, &l.dur, &l.rank, &l.series, &l.value)
            );
            assert!(l.cat.is_empty() && l.pid.is_empty() && l.tid.is_empty() && l.file.is_empty());
            assert_eq!(f.pid.len(), f.len());
        }
        assert!(full.counters.rank.contains(&2) && full.counters.rank.contains(&3));
        // Counters only: the spans keep every column.
        let some = read(
            &paths,
            &ColumnsOptions {
                omit: [Omit::default(), Omit::default(), all],
                ..base.clone()
            },
        );
        assert_eq!(some.spans, full.spans);
        assert_eq!(some.counters.rank, full.counters.rank);
    }
    let stepped = ColumnsOptions {
        omit: [all; 3],
        ..Default::default()
    };
    let e = read_columns(&paths, &stepped).unwrap_err();
    assert!(e.to_string().contains("invalid option omit"), "{e}");
}

/// Step markers are kept only for the step column: without it a long run's
/// reader holds no marker per step (issue #38, item 1).
#[test]
fn no_step_markers_are_held_without_the_step_column() {
    let d = dir("markers");
    let path = write(&d.join("rank0/fastprof.0.json.gz"), &fastprof_segment(0, 0));
    for step_column in [false, true] {
        let opts = ColumnsOptions {
            step_column,
            ..ColumnsOptions::default()
        };
        let mut r = Reading::new(&opts);
        r.read_file(&path, 0, false).unwrap();
        assert_eq!(
            r.markers.is_empty(),
            !step_column,
            "step_column {step_column}"
        );
        assert!(!r.out.spans.is_empty());
    }
}

/// Rows as comparable tuples: (name, ts, dur or value, rank, series).
fn rows_of(c: &Columns, t: &Table) -> Vec<(String, i64, String, i32, String)> {
    (0..t.len())
        .map(|r| {
            let v = match (t.dur.get(r), t.value.get(r)) {
                (Some(d), _) => d.to_string(),
                (None, Some(v)) => v.to_string(),
                _ => String::new(),
            };
            let series = t
                .series
                .get(r)
                .map_or(String::new(), |&i| c.names[i as usize].clone());
            (
                c.names[t.name[r] as usize].clone(),
                t.ts[r],
                v,
                t.rank[r],
                series,
            )
        })
        .collect()
}

#[test]
fn chunks_hand_over_every_row_placed_as_the_whole_read_places_it() {
    let d = dir("chunks");
    // The offset only in otherData, at the end: chunks before it are moved.
    let late = fastprof_segment(1, 5000).replacen(r#","clock":{"offset_ns":5000}}}"#, "}}", 1);
    assert_ne!(late, fastprof_segment(1, 5000));
    let a = write(&d.join("rank1/fastprof.0.json.gz"), &late);
    let b = write(
        &d.join("rank2/fastprof.0.json.gz"),
        &fastprof_segment(2, 1000),
    );
    let opts = ColumnsOptions {
        step_column: false,
        ..ColumnsOptions::default()
    };
    let inputs = [a, b];
    let whole = read(&inputs, &opts);
    let mut got: Vec<Chunk> = Vec::new();
    let mut sink = |c: Chunk| -> Result<()> {
        got.push(c);
        Ok(())
    };
    let rest = read_columns_chunked(&inputs, &opts, 2, &mut sink).unwrap();
    assert_eq!(
        rest.spans.len() + rest.instants.len() + rest.counters.len(),
        0
    );
    assert_eq!(rest.files, whole.files);
    // More than one chunk a file, and only the file's last one says it is.
    assert!(got.len() > 4, "{}", got.len());
    assert_eq!(got.iter().filter(|c| c.last).count(), 2);
    let moved: Vec<(u32, i64)> = got
        .iter()
        .filter(|c| c.last)
        .map(|c| (c.file, c.moved_ns))
        .collect();
    assert_eq!(moved, [(0, 5000), (1, 0)]);
    // Apply each file's move to its earlier chunks: the whole read's rows.
    let mut spans = Vec::new();
    let mut instants = Vec::new();
    let mut counters = Vec::new();
    for (i, c) in got.iter().enumerate() {
        let shift = if c.last {
            0
        } else {
            got[i..]
                .iter()
                .find(|x| x.file == c.file && x.last)
                .unwrap()
                .moved_ns
        };
        for (out, t) in [
            (&mut spans, &c.columns.spans),
            (&mut instants, &c.columns.instants),
            (&mut counters, &c.columns.counters),
        ] {
            out.extend(rows_of(&c.columns, t).into_iter().map(|mut r| {
                r.1 += shift;
                r
            }));
        }
    }
    assert_eq!(spans, rows_of(&whole, &whole.spans));
    assert_eq!(instants, rows_of(&whole, &whole.instants));
    assert_eq!(counters, rows_of(&whole, &whole.counters));
    // Refused with what it cannot serve.
    let mut none = |_: Chunk| -> Result<()> { Ok(()) };
    let err = read_columns_chunked(&inputs, &ColumnsOptions::default(), 2, &mut none).unwrap_err();
    assert!(err.to_string().contains("chunk_rows"), "{err}");
}
