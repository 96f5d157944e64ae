//! The always-on sampler: a Rust thread (never touching Python) that ticks at
//! `sample_hz`, reads host, process and child-process counters from /proc and
//! GPU readings from NVML, computes rates, and
//! * pushes each reading into the trace as a counter event (through its own
//!   ring, like any recording thread), and
//! * keeps the last `history` samples per metric in memory for
//!   `Recorder.counters()` (numpy arrays, no text parsing).
//!
//! Memory is bounded (`history` per metric); disk is bounded by the writer's
//! segments. The sampler measures its own cost (thread CPU time per tick, tick
//! latency, time inside NVML) and reports it in the trace metadata.

pub mod gpu;
pub mod procfs;

use crate::clock;
use crate::names;
use crate::recorder;
use gpu::GpuSelect;
use procfs::{Children, ProcFile};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Sampler options.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Ticks per second (1..=1000). Higher rates resolve shorter events but
    /// cost proportionally more of the sampler thread's CPU.
    pub hz: f64,
    /// Also sample every core's utilisation (one metric per core).
    pub per_cpu: bool,
    /// Which GPUs NVML samples.
    pub gpus: GpuSelect,
    /// Samples kept in memory per metric for `counters()` (the trace keeps all).
    pub history: usize,
    /// Seconds between PCIe throughput reads (each blocks ~20 ms in the driver).
    pub pcie_every_s: f64,
    /// Read host/process counters here (/proc); off when the Python layer
    /// samples them with psutil instead (non-Linux hosts).
    pub host: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            hz: 10.0,
            per_cpu: false,
            gpus: GpuSelect::All,
            history: 1 << 16,
            pcie_every_s: 1.0,
            host: true,
        }
    }
}

/// Bounded per-metric sample history.
pub struct SeriesStore {
    names: Vec<String>,
    data: Vec<VecDeque<(u64, f64)>>,
    cap: usize,
}

impl SeriesStore {
    fn new(cap: usize) -> SeriesStore {
        SeriesStore {
            names: Vec::new(),
            data: Vec::new(),
            cap: cap.max(2),
        }
    }

    fn ensure(&mut self, id: usize, name: &str) {
        while self.names.len() <= id {
            self.names.push(String::new());
            self.data.push(VecDeque::new());
        }
        if self.names[id].is_empty() {
            self.names[id] = name.to_string();
        }
    }

    fn push(&mut self, id: usize, ts: u64, v: f64) {
        let q = &mut self.data[id];
        if q.len() == self.cap {
            q.pop_front();
        }
        q.push_back((ts, v));
    }

    /// Every metric: (name, CLOCK_MONOTONIC ns, values).
    pub fn snapshot(&self) -> Vec<(String, Vec<u64>, Vec<f64>)> {
        self.names
            .iter()
            .zip(&self.data)
            .map(|(n, q)| {
                (
                    n.clone(),
                    q.iter().map(|x| x.0).collect(),
                    q.iter().map(|x| x.1).collect(),
                )
            })
            .collect()
    }

    fn series(&self, name: &str) -> Option<&VecDeque<(u64, f64)>> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| &self.data[i])
    }

    /// Joules a GPU used between two CLOCK_MONOTONIC instants: the driver's
    /// energy counter where supported, else power integrated over time.
    /// Returns (joules, source).
    pub fn energy_between(&self, gpu: &str, t0: u64, t1: u64) -> Option<(f64, &'static str)> {
        if let Some(q) = self
            .series(&format!("{gpu}.energy [J]"))
            .filter(|q| q.len() >= 2)
        {
            let (a, b) = (interp(q, t0)?, interp(q, t1)?);
            return Some((b - a, "energy_counter"));
        }
        let q = self
            .series(&format!("{gpu}.power [W]"))
            .filter(|q| q.len() >= 2)?;
        Some((integrate(q, t0, t1), "integrated_power"))
    }
}

/// Linear interpolation of a series at `t` (clamped to its ends).
fn interp(q: &VecDeque<(u64, f64)>, t: u64) -> Option<f64> {
    let (first, last) = (q.front()?, q.back()?);
    if t <= first.0 {
        return Some(first.1);
    }
    if t >= last.0 {
        return Some(last.1);
    }
    let i = q.partition_point(|x| x.0 <= t);
    let (a, b) = (q[i - 1], q[i]);
    Some(a.1 + (b.1 - a.1) * (t - a.0) as f64 / (b.0 - a.0) as f64)
}

/// Trapezoid integral (value × seconds) of a series over [t0, t1].
fn integrate(q: &VecDeque<(u64, f64)>, t0: u64, t1: u64) -> f64 {
    if t1 <= t0 {
        return 0.0;
    }
    let mut pts: Vec<(u64, f64)> = vec![(t0, interp(q, t0).unwrap_or(0.0))];
    pts.extend(q.iter().copied().filter(|x| x.0 > t0 && x.0 < t1));
    pts.push((t1, interp(q, t1).unwrap_or(0.0)));
    pts.windows(2)
        .map(|w| (w[1].0 - w[0].0) as f64 / 1e9 * (w[0].1 + w[1].1) / 2.0)
        .sum()
}

/// The sampler's measured cost.
#[derive(Debug, Clone, Default)]
pub struct SelfCost {
    pub ticks: u64,
    pub cpu_ns_total: u64,
    pub cpu_ns_max: u64,
    pub wall_ns_total: u64,
    pub wall_ns_max: u64,
    pub nvml_ns_total: u64,
    pub late_ticks: u64,
}

impl SelfCost {
    fn json(&self) -> Value {
        let per = |x: u64| {
            if self.ticks > 0 {
                x as f64 / self.ticks as f64
            } else {
                0.0
            }
        };
        json!({
            "ticks": self.ticks,
            "cpu_ns_per_tick_mean": per(self.cpu_ns_total),
            "cpu_ns_per_tick_max": self.cpu_ns_max,
            "tick_wall_ns_mean": per(self.wall_ns_total),
            "tick_wall_ns_max": self.wall_ns_max,
            "nvml_ns_per_tick_mean": per(self.nvml_ns_total),
            "thread_cpu_s": self.cpu_ns_total as f64 / 1e9,
            "late_ticks": self.late_ticks,
        })
    }
}

/// What the sampler shares with the recorder, the writer and Python.
pub struct SamplerShared {
    pub store: Mutex<SeriesStore>,
    /// `otherData.sampler` in the trace.
    pub meta: Mutex<Value>,
    pub cost: Mutex<SelfCost>,
    stop: AtomicBool,
}

pub struct Sampler {
    pub shared: Arc<SamplerShared>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Start the sampler thread. Readings go into the trace of the running recorder.
    pub fn start(cfg: SamplerConfig) -> std::io::Result<Sampler> {
        let shared = Arc::new(SamplerShared {
            store: Mutex::new(SeriesStore::new(cfg.history)),
            meta: Mutex::new(json!({"hz": cfg.hz, "state": "starting"})),
            cost: Mutex::new(SelfCost::default()),
            stop: AtomicBool::new(false),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fastprof-sampler".into())
            .spawn(move || run(cfg, sh))?;
        Ok(Sampler {
            shared,
            thread: Some(thread),
        })
    }

    /// Stop and join the thread; the data stays readable through `shared`.
    pub fn stop(mut self) -> Arc<SamplerShared> {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        self.shared.clone()
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec; the clock id exists on Linux and macOS.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// This process's (user µs, system µs, context switches, storage bytes read,
/// storage bytes written). On Linux `ru_inblock`/`ru_oublock` are the task I/O
/// accounting's read_bytes/write_bytes in 512-byte units, so one syscall
/// replaces reading /proc/self/io.
fn rusage() -> (u64, u64, u64, u64, u64) {
    // SAFETY: zeroed rusage is valid; getrusage only writes into it.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (
        us(r.ru_utime),
        us(r.ru_stime),
        (r.ru_nvcsw + r.ru_nivcsw) as u64,
        r.ru_inblock as u64 * 512,
        r.ru_oublock as u64 * 512,
    )
}

/// Metric registry of the sampler thread: store index + interned trace name.
struct Metrics {
    names: Vec<(String, Option<u32>)>,
    pending: Vec<(usize, f64)>,
    /// Metrics come in the same order every tick: try the next one first.
    cursor: usize,
}

impl Metrics {
    fn id(&mut self, name: &str) -> usize {
        let i = match self.names.get(self.cursor) {
            Some((n, _)) if n == name => self.cursor,
            _ => match self.names.iter().position(|(n, _)| n == name) {
                Some(i) => i,
                None => {
                    self.names.push((name.to_string(), names::intern(name)));
                    self.names.len() - 1
                }
            },
        };
        self.cursor = i + 1;
        i
    }

    fn emit(&mut self, name: &str, v: f64) {
        let id = self.id(name);
        self.pending.push((id, v));
    }
}

/// Previous cumulative readings, for rates.
#[derive(Default)]
struct Prev {
    mono: u64,
    cpus: Vec<(u64, u64)>,
    disk: (u64, u64),
    net: (u64, u64),
    rusage: (u64, u64, u64, u64, u64),
}

fn rate(now: u64, before: u64, dt_ns: u64) -> f64 {
    now.saturating_sub(before) as f64 * 1e9 / dt_ns as f64
}

fn run(cfg: SamplerConfig, sh: Arc<SamplerShared>) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    let clk_tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let procfs_ok = cfg!(target_os = "linux") && std::path::Path::new("/proc/self/stat").exists();
    let linux = cfg.host && procfs_ok;
    let mut stat = ProcFile::open("/proc/stat");
    let mut meminfo = ProcFile::open("/proc/meminfo");
    let mut netdev = ProcFile::open("/proc/net/dev");
    let mut self_stat = ProcFile::open("/proc/self/stat");
    let disks = procfs::whole_disks();
    // One small /sys/block/<d>/stat per disk is cheaper than /proc/diskstats,
    // which formats every block device (loops, partitions) on each read.
    let mut disk_files: Vec<ProcFile> = disks
        .iter()
        .filter_map(|d| ProcFile::open(format!("/sys/block/{d}/stat")))
        .collect();
    let mut children = Children::new(std::process::id(), page, 1_000_000_000 / clk_tck);

    let nvml = gpu::open(&cfg.gpus);
    let (mut devices, dev_errors) = match &nvml {
        Ok(n) => gpu::devices(n, &cfg.gpus),
        Err(_) => (Vec::new(), Vec::new()),
    };
    let nvml_meta = match &nvml {
        Ok(n) => json!({
            "available": !devices.is_empty(),
            "reason": if devices.is_empty() { Value::from("no device selected or visible") } else { Value::Null },
            "driver": n.sys_driver_version().ok(),
            "devices": devices.iter().map(|d| d.inventory()).collect::<Vec<_>>(),
            "errors": dev_errors,
        }),
        Err(reason) => json!({"available": false, "reason": reason}),
    };
    let host_meta = if linux {
        json!({"available": true, "source": "procfs", "disks": disks})
    } else if !cfg.host {
        json!({"available": true, "source": "psutil (Python thread)"})
    } else {
        json!({"available": false, "reason": "host sampling reads /proc, which this OS lacks"})
    };
    *sh.meta.lock().unwrap_or_else(|e| e.into_inner()) = json!({
        "hz": cfg.hz,
        "per_cpu": cfg.per_cpu,
        "history": cfg.history,
        "host": host_meta,
        "nvml": nvml_meta,
    });

    let period = Duration::from_secs_f64(1.0 / cfg.hz);
    let refresh_children_every = ((cfg.hz / 2.0).ceil() as u64).max(1);
    let pcie_every = ((cfg.hz * cfg.pcie_every_s).ceil() as u64).max(1);
    let mut m = Metrics {
        names: Vec::new(),
        pending: Vec::new(),
        cursor: 0,
    };
    let mut prev = Prev::default();
    // Per-core metric names, made once (cores come in order, 0..).
    let mut cpu_names: Vec<String> = Vec::new();
    let mut namer = || "fastprof-sampler".to_string();
    let mut tick_no: u64 = 0;
    let mut next = std::time::Instant::now();
    let mut last_meta = std::time::Instant::now();

    while !sh.stop.load(Ordering::Acquire) {
        let wall0 = std::time::Instant::now();
        let cpu0 = thread_cpu_ns();
        let ticks = clock::ticks();
        let mono = clock::monotonic_ns();
        let dt = mono.saturating_sub(prev.mono);
        let first = tick_no == 0;

        if linux {
            if let Some(cpus) = stat.as_mut().and_then(|f| f.read()).map(procfs::parse_stat) {
                if !first {
                    for (i, (&(b, t), &(pb, pt))) in cpus.iter().zip(&prev.cpus).enumerate() {
                        if i > 0 && !cfg.per_cpu {
                            break;
                        }
                        let pct = if t > pt {
                            (b - pb.min(b)) as f64 * 100.0 / (t - pt) as f64
                        } else {
                            0.0
                        };
                        if i == 0 {
                            m.emit("sys.cpu [%]", pct);
                        } else {
                            if cpu_names.len() < i {
                                cpu_names.push(format!("sys.cpu{} [%]", i - 1));
                            }
                            m.emit(&cpu_names[i - 1], pct);
                        }
                    }
                }
                prev.cpus = cpus;
            }
            if let Some(text) = meminfo.as_mut().and_then(|f| f.read()) {
                let v = procfs::parse_meminfo(
                    text,
                    &["MemTotal", "MemAvailable", "SwapTotal", "SwapFree"],
                );
                m.emit("sys.mem_used [B]", v[0].saturating_sub(v[1]) as f64);
                m.emit("sys.mem_available [B]", v[1] as f64);
                m.emit("sys.swap_used [B]", v[2].saturating_sub(v[3]) as f64);
            }
            if !disk_files.is_empty() {
                let d = disk_files
                    .iter_mut()
                    .filter_map(|f| f.read().map(procfs::parse_block_stat))
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                if !first {
                    m.emit("sys.disk_read [B/s]", rate(d.0, prev.disk.0, dt));
                    m.emit("sys.disk_write [B/s]", rate(d.1, prev.disk.1, dt));
                }
                prev.disk = d;
            }
            if let Some(n) = netdev
                .as_mut()
                .and_then(|f| f.read())
                .map(procfs::parse_netdev)
            {
                if !first {
                    m.emit("sys.net_rx [B/s]", rate(n.0, prev.net.0, dt));
                    m.emit("sys.net_tx [B/s]", rate(n.1, prev.net.1, dt));
                }
                prev.net = n;
            }
            if let Some((threads, rss, _)) = self_stat
                .as_mut()
                .and_then(|f| f.read())
                .and_then(procfs::parse_pid_stat)
            {
                m.emit("proc.rss [B]", (rss * page) as f64);
                m.emit("proc.threads", threads as f64);
            }
            if tick_no % refresh_children_every == 0 {
                children.refresh();
            }
            let (n, cpu, rss) = children.sample(dt);
            m.emit("children.count", n as f64);
            if !first {
                m.emit("children.cpu [%]", cpu);
            }
            m.emit("children.rss [B]", rss as f64);
        }
        let ru = rusage();
        if !first && cfg.host {
            // µs of CPU per ns of wall, as % of one core.
            m.emit(
                "proc.cpu_user [%]",
                (ru.0 - prev.rusage.0.min(ru.0)) as f64 * 1e5 / dt as f64,
            );
            m.emit(
                "proc.cpu_system [%]",
                (ru.1 - prev.rusage.1.min(ru.1)) as f64 * 1e5 / dt as f64,
            );
            m.emit("proc.ctx_switches [1/s]", rate(ru.2, prev.rusage.2, dt));
            if linux {
                m.emit("proc.read [B/s]", rate(ru.3, prev.rusage.3, dt));
                m.emit("proc.write [B/s]", rate(ru.4, prev.rusage.4, dt));
            }
        }
        prev.rusage = ru;

        let mut nvml_ns = 0;
        let with_pcie = tick_no % pcie_every == 0;
        for d in devices.iter_mut() {
            nvml_ns += d.read(with_pcie, &mut |name, v| m.emit(name, v));
        }
        prev.mono = mono;

        // Publish: trace counters (through this thread's ring) and history.
        {
            let mut store = sh.store.lock().unwrap_or_else(|e| e.into_inner());
            for &(id, v) in &m.pending {
                let (name, trace_id) = &m.names[id];
                store.ensure(id, name);
                store.push(id, mono, v);
                if let Some(tid) = trace_id {
                    recorder::counter_at(*tid, v, ticks, &mut namer);
                }
            }
        }
        m.pending.clear();
        m.cursor = 0;
        tick_no += 1;

        let cpu = thread_cpu_ns().saturating_sub(cpu0);
        let wall = wall0.elapsed().as_nanos() as u64;
        {
            let mut c = sh.cost.lock().unwrap_or_else(|e| e.into_inner());
            c.ticks += 1;
            c.cpu_ns_total += cpu;
            c.cpu_ns_max = c.cpu_ns_max.max(cpu);
            c.wall_ns_total += wall;
            c.wall_ns_max = c.wall_ns_max.max(wall);
            c.nvml_ns_total += nvml_ns;
        }
        if last_meta.elapsed() >= Duration::from_secs(1) {
            last_meta = std::time::Instant::now();
            publish_meta(&sh, &devices);
        }

        next += period;
        let now = std::time::Instant::now();
        if next <= now {
            // Behind (a slow NVML call, a starved core): skip, never burst.
            sh.cost.lock().unwrap_or_else(|e| e.into_inner()).late_ticks += 1;
            next = now + period;
        }
        std::thread::park_timeout(next - now);
    }
    publish_meta(&sh, &devices);
}

fn publish_meta(sh: &SamplerShared, devices: &[gpu::GpuDevice<'_>]) {
    let cost = sh.cost.lock().unwrap_or_else(|e| e.into_inner()).json();
    let disabled: serde_json::Map<String, Value> = devices
        .iter()
        .filter(|d| !d.disabled.is_empty())
        .map(|d| {
            let f: serde_json::Map<String, Value> = d
                .disabled
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            (d.label.clone(), Value::Object(f))
        })
        .collect();
    let mut meta = sh.meta.lock().unwrap_or_else(|e| e.into_inner());
    meta["self_cost"] = cost;
    if let Some(nv) = meta.get_mut("nvml") {
        nv["disabled_fields"] = Value::Object(disabled);
    }
    meta["state"] = json!("running");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn energy_from_counter_and_from_power() {
        let mut s = SeriesStore::new(16);
        s.ensure(0, "gpu0.energy [J]");
        s.ensure(1, "gpu1.power [W]");
        for i in 0..5u64 {
            s.push(0, i * 1_000_000_000, 100.0 + 50.0 * i as f64);
            s.push(1, i * 1_000_000_000, 200.0);
        }
        let (j, src) = s
            .energy_between("gpu0", 1_000_000_000, 3_500_000_000)
            .unwrap();
        assert!((j - 125.0).abs() < 1e-9 && src == "energy_counter");
        let (j, src) = s
            .energy_between("gpu1", 500_000_000, 2_500_000_000)
            .unwrap();
        assert!((j - 400.0).abs() < 1e-6 && src == "integrated_power", "{j}");
        assert!(s.energy_between("gpu7", 0, 1).is_none());
    }

    #[test]
    fn history_is_bounded() {
        let mut s = SeriesStore::new(4);
        s.ensure(0, "x");
        for i in 0..10 {
            s.push(0, i, i as f64);
        }
        let snap = s.snapshot();
        assert_eq!(snap[0].1, vec![6, 7, 8, 9]);
    }
}
