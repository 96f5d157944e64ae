//! How long each /proc read of the sampler takes (kernel generation + parse).
use fastprof_core::sampler::procfs::ProcFile;
use std::time::Instant;
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
    ] {
        let mut f = ProcFile::open(path).unwrap();
        let n = 2000;
        let t = Instant::now();
        let mut len = 0;
        for _ in 0..n {
            len = f.read().map(|s| s.len()).unwrap_or(0);
        }
        println!(
            "{path:<20} {:6.1} us  ({len} bytes)",
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
}
