//! How long each file read of the sampler takes, warm (back to back) and cold
//! (10 ms apart, as at 100 Hz, when caches have gone cold):
//! `cargo run --release -p fastprof-core --example proc_cost`.
//! /proc/self/stat, /proc/net/dev and /proc/diskstats are there for
//! comparison: the sampler reads statm, sysfs counters and /sys/block instead.
use fastprof_core::runtime::sampler::procfs::{self, ProcFile};
use std::time::{Duration, Instant};

fn main() {
    let mut paths: Vec<String> = [
        "/proc/stat",
        "/proc/meminfo",
        "/proc/self/statm",
        "/proc/self/stat",
        "/proc/net/dev",
        "/proc/diskstats",
        "/proc/loadavg",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(d) = procfs::whole_disks().first() {
        paths.push(format!("/sys/block/{d}/stat"));
    }
    if let Some(i) = procfs::net_interfaces().first() {
        paths.push(format!("/sys/class/net/{i}/statistics/rx_bytes"));
    }
    for path in paths {
        let Some(mut f) = ProcFile::open(&path) else {
            println!("{path:<40} (absent)");
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
        println!("{path:<40} warm {warm:6.1} us  cold {cold:6.1} us  ({len} bytes)");
    }
}
