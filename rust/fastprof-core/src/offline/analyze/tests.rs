//! Traces written by hand, breakdowns computed by hand.

use super::*;
use crate::test_support::{gzip, Scratch};

const BASE: i64 = 1_700_000_000_000_000_000;

fn x(name: &str, cat: &str, pid: i64, tid: i64, ts: f64, dur: f64, args: &str) -> String {
    format!(
        r#"{{"ph":"X","name":"{name}","cat":"{cat}","pid":{pid},"tid":{tid},"ts":{ts},"dur":{dur},"args":{{{args}}}}}"#
    )
}

fn kineto(events: &[String], extra: &str) -> String {
    format!(
        r#"{{"schemaVersion":1,"deviceProperties":[{{"id":0,"numSms":108}}],{extra}"traceEvents":[{}],"baseTimeNanoseconds":{BASE}}}"#,
        events.join(",\n")
    )
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, gzip(text.as_bytes())).unwrap();
    p
}

fn us(x: i64) -> i64 {
    x * 1000
}

/// Two steps on one GPU; every number below is worked out in the comments.
fn gpu_events() -> Vec<String> {
    let k = |name: &str, ts, dur, stream, corr, more: &str| {
        x(
            name,
            "kernel",
            0,
            stream,
            ts,
            dur,
            &format!(r#""device":0,"stream":{stream},"correlation":{corr}{more}"#),
        )
    };
    let rt = |ts, dur, corr| {
        x(
            "cudaLaunchKernel",
            "cuda_runtime",
            1,
            1,
            ts,
            dur,
            &format!(r#""correlation":{corr},"external id":9"#),
        )
    };
    vec![
        x("ProfilerStep#1", "user_annotation", 1, 1, 0.0, 100.0, ""),
        x(
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "user_annotation",
            1,
            1,
            0.0,
            20.0,
            "",
        ),
        x("aten::mm", "cpu_op", 1, 1, 20.0, 30.0, ""),
        x("aten::addmm", "cpu_op", 1, 1, 25.0, 20.0, ""),
        rt(30.0, 5.0, 1),
        rt(40.0, 2.0, 2),
        rt(44.0, 2.0, 3),
        k(
            "sm80_xmma_gemm_f16",
            36.0,
            24.0,
            7,
            1,
            r#","blocks per SM":0.5,"est. achieved occupancy %":50"#,
        ),
        k(
            "ncclDevKernel_AllReduce",
            55.0,
            25.0,
            20,
            2,
            r#","blocks per SM":2"#,
        ),
        x(
            "Memcpy HtoD (Pageable -> Device)",
            "gpu_memcpy",
            0,
            7,
            82.0,
            8.0,
            r#""device":0,"stream":7,"correlation":3"#,
        ),
        x("ProfilerStep#2", "user_annotation", 1, 1, 100.0, 100.0, ""),
        x("aten::relu", "cpu_op", 1, 1, 100.0, 30.0, ""),
        rt(110.0, 2.0, 4),
        rt(138.0, 1.0, 5),
        x("nccl:all_reduce", "cpu_op", 1, 1, 160.0, 10.0, ""),
        k("relu_kernel", 150.0, 60.0, 7, 4, r#","grid":[216,1,1]"#),
        x(
            "Memset (Device)",
            "gpu_memset",
            0,
            7,
            140.0,
            5.0,
            r#""device":0,"stream":7,"correlation":5"#,
        ),
        x(
            "python_function_ignored",
            "python_function",
            1,
            1,
            0.0,
            300.0,
            "",
        ),
    ]
}

fn parts(r: &StepRow) -> [i64; 8] {
    [
        r.kernel_ns,
        r.memcpy_ns,
        r.memset_ns,
        r.communication_ns,
        r.runtime_ns,
        r.dataloader_ns,
        r.cpu_exec_ns,
        r.other_ns,
    ]
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn synthetic_gpu_trace_matches_the_hand_computed_breakdown() {
    let dir = tempdir();
    let p = write(
        &dir,
        "w.pt.trace.json.gz",
        &kineto(&gpu_events(), r#""distributedInfo":{"rank":3},"#),
    );
    let a = analyze_steps(&[p]).unwrap();
    assert_eq!(a.steps.len(), 2, "{:?}", a.warnings);
    let rows = a.steps.rows();
    let (s1, s2) = (&rows[0], &rows[1]);
    assert_eq!((s1.rank, s1.step, s1.source), (3, 1, "ProfilerStep"));
    // Step 1: [0, 100) µs (its device work ends at 90).
    assert_eq!((s1.start_ns, s1.end_ns), (BASE, BASE + us(100)));
    // kernel [36,60); memcpy [82,90); comm [60,80); runtime [30,35);
    // loader [0,20); cpu [20,30)+[35,36); other [80,82)+[90,100).
    assert_eq!(parts(s1), [24, 8, 0, 20, 5, 20, 11, 12].map(us));
    assert!(s1.has_gpu);
    assert!(close(s1.gpu_utilization, 0.44));
    // 0.5 over [36,55), capped 1 over [55,80): 34.5 µs of 100.
    assert!(close(s1.sm_efficiency, 0.345));
    assert!(close(s1.achieved_occupancy, 50.0));
    assert!(close(s1.tensor_core_share, 24.0 / 49.0));
    assert_eq!(
        [s1.gpu_busy_ns, s1.compute_ns, s1.non_compute_ns, s1.idle_ns],
        [52, 24, 28, 48].map(us)
    );
    // Stream 7: gap [60,82) is kernel wait (22 µs, launched before 60);
    // gap [90,140) is host wait (launched at 138), 10 µs of it in step 1.
    assert_eq!(
        [
            s1.idle_host_wait_ns,
            s1.idle_kernel_wait_ns,
            s1.idle_other_ns
        ],
        [10, 22, 0].map(us)
    );
    assert_eq!(
        [
            s1.kernel_communication_ns,
            s1.kernel_computation_ns,
            s1.kernel_memory_ns,
            s1.kernel_other_ns
        ],
        [25, 24, 8, 0].map(us)
    );
    assert_eq!((s1.comm_kernel_ns, s1.comm_overlap_ns), (us(25), us(5)));
    assert!(close(s1.comm_overlap_pct, 20.0));

    // Step 2: host [100, 200), extended to 210 by relu_kernel.
    assert_eq!((s2.start_ns, s2.end_ns), (BASE + us(100), BASE + us(210)));
    assert_eq!(parts(s2), [60, 0, 5, 0, 3, 0, 28, 14].map(us));
    assert!(close(s2.gpu_utilization, 60.0 / 110.0));
    // grid 216 blocks over 108 SMs: 2 per SM, capped at 1.
    assert!(close(s2.sm_efficiency, 60.0 / 110.0));
    assert!(s2.achieved_occupancy.is_nan());
    assert!(close(s2.tensor_core_share, 0.0));
    assert_eq!(
        [s2.gpu_busy_ns, s2.compute_ns, s2.non_compute_ns, s2.idle_ns],
        [65, 60, 5, 45].map(us)
    );
    assert_eq!(
        [
            s2.idle_host_wait_ns,
            s2.idle_kernel_wait_ns,
            s2.idle_other_ns
        ],
        [40, 5, 0].map(us)
    );
    assert!(s2.comm_overlap_pct.is_nan());
    for r in &rows {
        assert_eq!(parts(r).iter().sum::<i64>(), r.end_ns - r.start_ns);
    }
    assert_eq!(a.devices.len(), 1);
    let d = &a.devices[0];
    assert_eq!((d.rank, d.device), (3, 0));
    assert!(close(d.gpu_utilization, 104.0 / 210.0));
    assert!(close(d.sm_efficiency, (34.5 + 60.0) / 210.0));
    assert!(close(d.achieved_occupancy, 50.0));
}

#[test]
fn cpu_only_trace_has_no_gpu_and_a_full_host_breakdown() {
    let dir = tempdir();
    let ev = vec![
        x("ProfilerStep#4", "user_annotation", 1, 1, 0.0, 50.0, ""),
        x(
            "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
            "user_annotation",
            1,
            1,
            0.0,
            30.0,
            "",
        ),
        x("aten::add", "cpu_op", 1, 1, 35.0, 10.0, ""),
        x("aten::add_inner", "cpu_op", 1, 1, 36.0, 2.0, ""),
        x("aten::other_thread", "cpu_op", 1, 2, 40.0, 8.0, ""),
    ];
    let p = write(&dir, "cpu.json.gz", &kineto(&ev, ""));
    let a = analyze_steps(&[p]).unwrap();
    let r = &a.steps.row(0);
    assert!(!r.has_gpu);
    assert_eq!((r.rank, r.step), (-1, 4));
    // cpu [35,48) across both threads; other [30,35) + [48,50).
    assert_eq!(parts(r), [0, 0, 0, 0, 0, 30, 13, 7].map(us));
    assert!(r.gpu_utilization.is_nan() && r.sm_efficiency.is_nan());
    assert!(a.devices.is_empty());
}

#[test]
fn merged_trace_rows_per_rank_and_fastprof_steps() {
    let dir = tempdir();
    let meta = |pid: i64, name: &str| {
        format!(
            r#"{{"ph":"M","name":"process_name","pid":{pid},"tid":0,"args":{{"name":"{name}"}}}}"#
        )
    };
    let ev = [
        r#"{"ph":"M","name":"fastprof_merge","pid":0,"tid":0,"args":{}}"#.to_string(),
        meta(100001, "rank 0"),
        meta(200001, "rank 1 · main"),
        x("step", "", 100001, 1, 0.0, 10.0, r#""step":5"#),
        x("loader.train.next", "", 100001, 1, 0.0, 4.0, ""),
        x("step", "", 200001, 1, 0.0, 20.0, r#""step":5"#),
        x("loader.train.next", "", 200001, 1, 0.0, 15.0, ""),
        // A worker process of rank 1 (pid scheme only): its fetch is not
        // the main process waiting.
        x("loader.train.fetch", "", 200002, 1, 0.0, 20.0, ""),
    ];
    let text = format!(
        r#"{{"traceEvents":[{}],"baseTimeNanoseconds":{BASE},"otherData":{{"merged":true}}}}"#,
        ev.join(",")
    );
    let p = write(&dir, "trace.json.gz", &text);
    let a = analyze_steps(&[p]).unwrap();
    let got: Vec<_> = a
        .steps
        .rows()
        .iter()
        .map(|r| (r.rank, r.step, r.source, r.dataloader_ns, r.other_ns))
        .collect();
    assert_eq!(
        got,
        [(0, 5, "step", us(4), us(6)), (1, 5, "step", us(15), us(5))]
    );
}

fn tempdir() -> Scratch {
    Scratch::new("analyze")
}
/// Many steps with gaps between them, kernels spanning several steps,
/// nested and overlapping on two streams: every per-step figure that depends
/// on which activities a step overlaps equals a scan of all of them per step.
#[test]
fn sweep_over_many_steps_matches_a_scan_per_step() {
    // (ts µs, dur µs, stream); steps are [120 i, 120 i + 100).
    let kernels: Vec<(i64, i64, i64)> = vec![
        (5, 30, 7),
        (40, 500, 7), // spans five steps and their gaps
        (50, 10, 8),
        (55, 2, 8),   // nested in the previous, same stream
        (100, 15, 8), // wholly in a gap
        (130, 40, 8),
        (560, 10, 7),
        (600, 900, 8), // spans the rest
        (700, 5, 7),
        (1000, 400, 7),
        (3000, 10, 7), // after every step
    ];
    let n_steps = 15;
    let mut events: Vec<String> = (0..n_steps)
        .map(|i| {
            let ts = 120.0 * i as f64;
            x(
                &format!("ProfilerStep#{i}"),
                "user_annotation",
                1,
                1,
                ts,
                100.0,
                "",
            )
        })
        .collect();
    for (j, &(ts, dur, stream)) in kernels.iter().enumerate() {
        events.push(x(
            "sm80_xmma_gemm_f16",
            "kernel",
            0,
            stream,
            ts as f64,
            dur as f64,
            &format!(r#""device":0,"stream":{stream},"correlation":{}"#, 100 + j),
        ));
    }
    let dir = tempdir();
    let p = write(&dir, "w.pt.trace.json.gz", &kineto(&events, ""));
    let a = analyze_steps(&[p]).unwrap();
    assert_eq!(a.steps.len(), n_steps);

    // The straightforward computation: every kernel and every stream gap
    // against every step.
    let mut gaps: Vec<(i64, i64, bool)> = Vec::new();
    for stream in [7, 8] {
        let mut prev_end: Option<i64> = None;
        for &(ts, dur, _) in kernels.iter().filter(|k| k.2 == stream) {
            if let Some(pe) = prev_end {
                if ts > pe {
                    gaps.push((pe, ts, ts - pe < 30));
                }
            }
            prev_end = Some(ts + dur);
        }
    }
    for (i, row) in a.steps.rows().iter().enumerate() {
        let (s, e) = (120 * i as i64, 120 * i as i64 + 100);
        assert_eq!((row.start_ns, row.end_ns), (BASE + us(s), BASE + us(e)));
        let ov = |a: i64, b: i64| (b.min(e) - a.max(s)).max(0);
        let k_time: i64 = kernels.iter().map(|k| ov(k.0, k.0 + k.1)).sum();
        assert_eq!(row.kernel_computation_ns, us(k_time), "step {i}");
        let wait: i64 = gaps.iter().filter(|g| g.2).map(|g| ov(g.0, g.1)).sum();
        let other: i64 = gaps.iter().filter(|g| !g.2).map(|g| ov(g.0, g.1)).sum();
        assert_eq!(row.idle_kernel_wait_ns, us(wait), "step {i}");
        assert_eq!(row.idle_other_ns, us(other), "step {i}");
        let busy = (s..e)
            .filter(|t| kernels.iter().any(|k| k.0 <= *t && *t < k.0 + k.1))
            .count() as i64;
        assert_eq!(row.gpu_busy_ns, us(busy), "step {i}");
        assert_eq!(row.kernel_ns, us(busy), "step {i}");
        assert_eq!(parts(row).iter().sum::<i64>(), us(e - s));
    }
}
