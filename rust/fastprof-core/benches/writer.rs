//! Writer throughput: how fast `Session::stop` drains a million recorded span
//! pairs, formats them as Chrome-trace `X` events and gzips them (level 1).

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use fastprof_core::runtime::config::Config;
use fastprof_core::runtime::session::Session;
use fastprof_core::runtime::{names, registry};
use std::time::{Duration, Instant};

/// Span pairs per measured stop; each becomes one `X` event.
const N: u64 = 1_000_000;

fn writer_throughput(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("fastprof-bench-writer-{}", std::process::id()));
    let id = names::intern("bench-span").expect("intern");
    let mut namer = || "bench".to_string();
    let mut per_event: Option<f64> = None;

    let mut g = c.benchmark_group("writer");
    // Each iteration is a whole recording (~0.1 s or more): fixed iterations
    // per sample instead of criterion's growing ramp.
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(N));
    g.bench_function("stop_1m_spans", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                let _ = std::fs::remove_dir_all(&dir);
                // A ring far larger than 2N records and an hour's flush
                // interval: the writer drains nothing before stop.
                let mut session = Session::start(Config {
                    trace_dir: dir.clone(),
                    buffer_size: 1 << 24,
                    flush_interval_s: 3600.0,
                    compression_level: 1,
                    ..Config::default()
                })
                .expect("start the recorder");
                for _ in 0..N {
                    registry::begin(id, &mut namer);
                    registry::end(false);
                }
                let t = Instant::now();
                let report = session.stop().expect("stop the recorder");
                timed += t.elapsed();
                assert_eq!(
                    report.dropped, 0,
                    "the ring overflowed: bench not measuring the writer"
                );
                assert!(report.events_written >= N);
                per_event = Some(report.bytes_compressed as f64 / report.events_written as f64);
            }
            timed
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(b) = per_event {
        println!("writer: {b:.2} compressed bytes per event (gzip level 1)");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = writer_throughput
}
criterion_main!(benches);
