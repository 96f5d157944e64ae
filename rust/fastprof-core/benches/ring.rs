//! The producer's cost: a bare ring push + drain, and the full hot path
//! (`registry::begin` + `registry::end`) with a recorder and its writer
//! running, both when every span is recorded and when the ring is full.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fastprof_core::runtime::config::Config;
use fastprof_core::runtime::record::{Kind, Record};
use fastprof_core::runtime::ring::{ring, Growth};
use fastprof_core::runtime::session::Session;
use fastprof_core::runtime::{names, registry};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Records pushed before each drain: what a busy thread leaves between two
/// writer passes, and small enough to stay in cache.
const BATCH: u64 = 4096;

fn ring_push_drain(c: &mut Criterion) {
    let (producer, mut consumer) = ring(1 << 16, &Growth::new(0)).expect("allocate the ring");
    let mut out = Vec::with_capacity(BATCH as usize);
    let mut g = c.benchmark_group("ring");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("push_drain_4096", |b| {
        b.iter(|| {
            for i in 0..BATCH {
                let rec = Record::new(Kind::Begin, 7, black_box(i), 0);
                let ok = producer.push(rec, 1);
                debug_assert!(ok.stored());
            }
            out.clear();
            let n = consumer.drain_into(&mut out);
            black_box((n, &out));
        })
    });
    g.finish();
}

/// Span pairs per timed burst of the recorded hot path.
const BURST: u64 = 250_000;
/// Untimed pause after a burst, as a multiple of the burst's duration: the
/// producer outruns the writer (format + gzip, ~7x slower on one core), and an
/// unpaced loop would fill the ring and time the cheaper drop path instead.
const PACE: u32 = 10;

fn start(tag: &str, buffer_size: usize, flush_interval_s: f64) -> (Session, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("fastprof-bench-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let session = Session::start(Config {
        trace_dir: dir.clone(),
        buffer_size,
        flush_interval_s,
        ..Config::default()
    })
    .expect("start the recorder");
    (session, dir)
}

fn hot_path(c: &mut Criterion) {
    let id = names::intern("bench-span").expect("intern");
    let mut namer = || "bench".to_string();
    let mut g = c.benchmark_group("hot_path");
    g.throughput(Throughput::Elements(1));
    // No time overrides needed for the pacing: criterion sizes samples from
    // wall time, so `--measurement-time 3` stays about 3 s of wall time.

    // Every span recorded: the writer drains the ring while it runs.
    let (mut session, dir) = start("hot", 1 << 22, 0.05);
    // Register this thread outside the measurement (the slow path).
    registry::begin(id, &mut namer);
    registry::end(false);
    g.bench_function("begin_end", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(BURST);
                let t = Instant::now();
                for _ in 0..n {
                    registry::begin(black_box(id), &mut namer);
                    registry::end(black_box(false));
                }
                let dt = t.elapsed();
                timed += dt;
                left -= n;
                std::thread::sleep(dt * PACE);
            }
            timed
        })
    });
    let report = session.stop().expect("stop the recorder");
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "hot_path/begin_end: {} events written, {} records dropped",
        report.events_written, report.dropped
    );
    if report.dropped != 0 {
        println!("  warning: drops mean part of the figure above is the drop path; raise PACE");
    }

    // Ring full (16 slots, no drain before stop): what a thread pays while
    // its events are being dropped and counted.
    let (mut session, dir) = start("full", 16, 3600.0);
    registry::begin(id, &mut namer);
    registry::end(false);
    for _ in 0..16 {
        registry::begin(id, &mut namer);
        registry::end(false);
    }
    g.bench_function("begin_end_ring_full", |b| {
        b.iter(|| {
            registry::begin(black_box(id), &mut namer);
            registry::end(black_box(false));
        })
    });
    g.finish();
    session.stop().expect("stop the recorder");
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = ring_push_drain, hot_path
}
criterion_main!(benches);
