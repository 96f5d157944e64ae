//! How long each file read of the sampler takes, warm (back to back) and cold
//! (10 ms apart, as at 100 Hz, when caches have gone cold):
//! `cargo run --release -p fastprof-core --example proc_cost`.
use fastprof_core::sampler::procfs::ProcFile;
use std::time::{Duration, Instant};

fn main() {
    for path in [
        "/proc/stat",
        "/proc/meminfo",
        "/proc/diskstats",
        "/proc/net/dev",
        "/proc/loadavg",
        "/proc/self/stat",
        "/proc/self/io",
        "/proc/self/statm",
        "/sys/block/vda/stat",
    ] {
        let Some(mut f) = ProcFile::open(path) else {
            println!("{path:<20} (absent)");
            continue;
        };
        let n = 2000;
        let t = Instant::now();
        let mut len = 0;
        for _ in 0..n {
            len = f.read().map(|s| s.len()).unwrap_or(0);
        }
        let warm = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let mut cold = 0.0;
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(10));
            let t = Instant::now();
            len = f.read().map(|s| s.len()).unwrap_or(0);
            cold += t.elapsed().as_secs_f64() * 1e6 / 50.0;
        }
        println!("{path:<20} warm {warm:6.1} us  cold {cold:6.1} us  ({len} bytes)");
    }
}
