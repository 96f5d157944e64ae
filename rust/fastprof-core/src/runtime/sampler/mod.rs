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
//! latency, time inside NVML, and the cost of each NVML call group per
//! device) and reports it in the trace metadata. NVML is read within a
//! budget and a per-tick cap ([`schedule`]): on an H200 reading every field
//! on every tick cost 4.6 ms per tick at 100 Hz.

pub mod gpu;
pub mod gpus;
pub mod helper;
pub mod pcie;
pub mod procfs;
pub mod runwait;
pub mod schedule;
pub mod series;

pub use series::SeriesStore;

use crate::runtime::clock;
use crate::runtime::names;
use crate::runtime::registry;
use gpu::GpuSelect;
use procfs::{Children, CpuTimes, NetSource, ProcFile};
use serde_json::{json, Value};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Default reads per second of the system-wide readings: CPU utilisation,
/// load, memory, swap, disk and network. What the job itself does (this
/// process, its descendants, its GPUs) is read on every tick: the host
/// around it is context, read at a rate that costs next to nothing.
///
/// * /proc/stat counts CPU time in USER_HZ units of 10 ms per core, so a
///   shorter window reads 0, 50 or 100% on two cores, and mostly nothing at
///   1 kHz: quantisation noise, not information. A 100 ms window resolves
///   10% of a core. (This process's CPU comes from getrusage in µs, its
///   descendants' from schedstat in ns: precise at any rate.)
/// * The load average changes every 5 s.
/// * /proc/meminfo is the costliest file of a tick (~55 formatted lines,
///   one walk over every block device); its counters are folded from
///   per-CPU deltas once a second or when a delta passes a threshold.
/// * /proc/stat's cost grows with cores and interrupt lines (a line of
///   numbers per core and one number per IRQ), hundreds of µs on big hosts.
/// * Each file read costs 10-30 µs when the kernel's caches have gone cold
///   between ticks (as at 100 Hz) on the 2-vCPU VM we measured; at 100 Hz,
///   reading the host every tick cost 1.5% of a core.
pub const DEFAULT_SYSTEM_HZ: f64 = 10.0;

/// Sampler ticks per second unless a caller says otherwise: the one place
/// this default is written (the Python option table reads it from the
/// binding, `_core.DEFAULT_SAMPLE_HZ`).
pub const DEFAULT_HZ: f64 = 10.0;

/// Sampler options.
#[derive(Debug, Clone)]
pub struct SamplerConfig {
    /// Ticks per second (1..=1000). Higher rates resolve shorter events but
    /// cost proportionally more of the sampler thread's CPU.
    pub hz: f64,
    /// Reads per second of system-wide CPU, load and memory (at most `hz`);
    /// see [`DEFAULT_SYSTEM_HZ`].
    pub system_hz: f64,
    /// Also sample every core's utilisation (one metric per core).
    pub per_cpu: bool,
    /// Which GPUs NVML samples.
    pub gpus: GpuSelect,
    /// Samples kept in memory per metric for `counters()` (the trace keeps all).
    pub history: usize,
    /// Seconds between PCIe throughput reads (each blocks ~20 ms in the
    /// driver, on the NVML helper thread), for devices without PCIe byte
    /// counters; byte counters are read every tick where the budget allows
    /// and at least every 50 ms (they wrap: [`gpu::PCIE_COUNTER_HORIZON_NS`]).
    pub pcie_every_s: f64,
    /// NVML wall time allowed per device, as a fraction of one core (0.02:
    /// 20 ms a second). Where calls are slow, the groups are read less often
    /// than desired rather than costing more; the periods in use are in the
    /// metadata (`nvml.calls`). Higher buys rate on slow drivers at the
    /// price of a core's share per GPU: an 8-GPU node pays 8 times this.
    pub nvml_budget: f64,
    /// Read host/process counters here (/proc); off when the Python layer
    /// samples them with psutil instead (non-Linux hosts).
    pub host: bool,
    /// Test hook: the thread fails (panics) when it reaches this tick, so
    /// the failure path can be exercised. Also taken from
    /// [`TEST_PANIC_ENV`], read once when the sampler starts. Never set in
    /// normal use.
    #[doc(hidden)]
    pub panic_after_ticks: Option<u64>,
}

/// Environment variable for [`SamplerConfig::panic_after_ticks`]
/// (a number of ticks), for tests of the layers above the core.
#[doc(hidden)]
pub const TEST_PANIC_ENV: &str = "FASTPROF_TEST_SAMPLER_PANIC_AFTER";

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            hz: DEFAULT_HZ,
            system_hz: DEFAULT_SYSTEM_HZ,
            per_cpu: false,
            gpus: GpuSelect::All,
            history: 1 << 16,
            pcie_every_s: 1.0,
            nvml_budget: gpus::DEFAULT_NVML_BUDGET,
            host: true,
            panic_after_ticks: None,
        }
    }
}

/// The sampler's measured cost, from its thread's CPU clock.
#[derive(Debug, Clone, Default)]
pub struct SelfCost {
    pub ticks: u64,
    /// All of the thread's CPU since its loop began (readings, publishing,
    /// and waking up and going back to sleep) over its first `cpu_ticks`
    /// ticks: the clock is read on measured ticks and at the end.
    pub cpu_ns_total: u64,
    pub cpu_ticks: u64,
    /// CPU of the tick bodies (readings and publishing, from wake-up to
    /// sleep), measured on every [`BODY_SAMPLE_EVERY`]th tick.
    pub body_ticks: u64,
    pub body_cpu_ns_total: u64,
    pub body_cpu_ns_max: u64,
    pub wall_ns_total: u64,
    pub wall_ns_max: u64,
    /// NVML time on the tick thread; the calls read apart on the helper
    /// thread are accounted per call group in `nvml.calls`.
    pub nvml_ns_total: u64,
    pub late_ticks: u64,
    /// Wall time of the last [`RECENT_TICKS`] ticks (a ring at
    /// `ticks % RECENT_TICKS`), for the tick-cost percentiles.
    pub recent_wall_ns: Vec<u32>,
}

/// Ticks whose wall time is kept for `tick_wall_ns_p50` / `_p99` (16 KB).
pub const RECENT_TICKS: usize = 4096;

/// One tick in this many, picked at random (periodic work such as the
/// system readings every tenth tick must not alias with it), reads the
/// thread's CPU clock (a syscall) before and after its body.
pub const BODY_SAMPLE_EVERY: u64 = 8;

impl SelfCost {
    fn json(&self) -> Value {
        let per = |x: u64, n: u64| if n > 0 { x as f64 / n as f64 } else { 0.0 };
        let total = per(self.cpu_ns_total, self.cpu_ticks);
        let body = per(self.body_cpu_ns_total, self.body_ticks);
        let mut recent = self.recent_wall_ns.clone();
        recent.sort_unstable();
        // Nearest rank over the recent ticks; null before the first tick.
        let pct = |q: f64| {
            let n = recent.len();
            (n > 0).then(|| recent[((q * n as f64).ceil() as usize).clamp(1, n) - 1])
        };
        json!({
            "ticks": self.ticks,
            "cpu_ns_per_tick_mean": total,
            "read_cpu_ns_per_tick_mean": body,
            "read_cpu_ns_per_tick_max": self.body_cpu_ns_max,
            "wake_cpu_ns_per_tick_mean": (total - body).max(0.0),
            "read_ticks_measured": self.body_ticks,
            "tick_wall_ns_mean": per(self.wall_ns_total, self.ticks),
            "tick_wall_ns_max": self.wall_ns_max,
            "nvml_ns_per_tick_mean": per(self.nvml_ns_total, self.ticks),
            "thread_cpu_s": self.cpu_ns_total as f64 / 1e9,
            "late_ticks": self.late_ticks,
            "tick_wall_ns_p50": pct(0.50),
            "tick_wall_ns_p99": pct(0.99),
            "tick_wall_ns_over": recent.len(),
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
    /// Why the sampler thread ended early (a panic caught in it), if it did.
    failure: Mutex<Option<String>>,
}

impl SamplerShared {
    /// Why sampling stopped early, in words for the user; `None` while it
    /// runs or after a normal stop.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record a failure: in `failure` and in the metadata the writer puts
    /// into the trace (`otherData.sampler.state` / `.error`). The first one wins.
    fn fail(&self, what: &str) {
        let reason = format!(
            "the sampler stopped after an internal error ({what}); recording goes on without it"
        );
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_some() {
            return;
        }
        *f = Some(reason.clone());
        let mut meta = self.meta.lock().unwrap_or_else(|e| e.into_inner());
        meta["state"] = json!("failed");
        meta["error"] = json!(reason);
    }
}

/// The message of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

pub struct Sampler {
    pub shared: Arc<SamplerShared>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Start the sampler thread. Readings go into the trace of the running recorder.
    pub fn start(mut cfg: SamplerConfig) -> std::io::Result<Sampler> {
        if cfg.panic_after_ticks.is_none() {
            cfg.panic_after_ticks = std::env::var(TEST_PANIC_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok());
        }
        let shared = Arc::new(SamplerShared {
            store: Mutex::new(SeriesStore::new(cfg.history)),
            meta: Mutex::new(json!({"hz": cfg.hz, "state": "starting"})),
            cost: Mutex::new(SelfCost::default()),
            stop: AtomicBool::new(false),
            failure: Mutex::new(None),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fastprof-sampler".into())
            .spawn(move || {
                // A bug in the sampler (a /proc format we did not expect, a
                // driver returning nonsense) must not pass unnoticed, nor
                // touch the job: the thread ends, the reason is recorded
                // for stop() and the trace, and the writer carries on.
                // Every lock it shares is taken with poison recovery.
                let run_sh = sh.clone();
                if let Err(payload) =
                    std::panic::catch_unwind(AssertUnwindSafe(|| run(cfg, run_sh)))
                {
                    sh.fail(&panic_message(&*payload));
                }
            })?;
        Ok(Sampler {
            shared,
            thread: Some(thread),
        })
    }

    /// Stop and join the thread; the data stays readable through `shared`.
    /// Returns why the sampler stopped early, if it failed while running.
    pub fn stop(mut self) -> Option<String> {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                // Not reached while the body is wrapped in catch_unwind, but
                // a join error is a failure too, never to be dropped.
                self.shared.fail("the sampler thread panicked");
            }
        }
        self.shared.failure()
    }
}

pub(crate) fn thread_cpu_ns() -> u64 {
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
    /// Where the caller's name string lived when the metric was last seen:
    /// names are literals or strings made once, so the same address means
    /// the same metric without comparing bytes.
    seen_at: Vec<*const u8>,
    pending: Vec<(usize, f64)>,
    /// Trace counters of one tick: (interned name, value).
    batch: Vec<(u32, f64)>,
    /// Metrics come in the same order every tick: try the next one first.
    cursor: usize,
}

impl Metrics {
    fn new() -> Metrics {
        Metrics {
            names: Vec::new(),
            seen_at: Vec::new(),
            pending: Vec::new(),
            batch: Vec::new(),
            cursor: 0,
        }
    }

    fn id(&mut self, name: &str) -> usize {
        let c = self.cursor;
        let i =
            if self.seen_at.get(c) == Some(&name.as_ptr()) && self.names[c].0.len() == name.len() {
                c
            } else {
                // Out of order (the NVML groups read vary from tick to
                // tick): the same address again, then the bytes.
                let by_address = self
                    .seen_at
                    .iter()
                    .position(|&p| p == name.as_ptr())
                    .filter(|&i| self.names[i].0 == name);
                let by_name = || self.names.iter().position(|(n, _)| n == name);
                let i = match by_address.or_else(by_name) {
                    Some(i) => i,
                    None => {
                        self.names.push((name.to_string(), names::intern(name)));
                        self.seen_at.push(std::ptr::null());
                        self.names.len() - 1
                    }
                };
                self.seen_at[i] = name.as_ptr();
                i
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
    /// When the system-wide readings were last taken.
    system_mono: u64,
    cpus: Vec<CpuTimes>,
    disk: Option<(u64, u64)>,
    /// `None` after a read that failed, so the next rate is skipped.
    net: Option<(u64, u64)>,
    rusage: (u64, u64, u64, u64, u64),
}

/// The host and process readings taken from files kept open (Linux).
struct Host {
    stat: Option<ProcFile>,
    meminfo: Option<ProcFile>,
    statm: Option<ProcFile>,
    disks: Vec<String>,
    disk_files: Vec<ProcFile>,
    ifaces: Vec<String>,
    net: Option<NetSource>,
    cpus: Vec<CpuTimes>,
    /// Per-core metric names by core number, made once.
    cpu_names: Vec<String>,
    page: u64,
}

impl Host {
    /// System CPU from /proc/stat, over the window since its previous read.
    fn sample_cpu(&mut self, cfg: &SamplerConfig, prev: &mut Prev, m: &mut Metrics) {
        let Some(text) = self.stat.as_mut().and_then(|f| f.read()) else {
            return;
        };
        procfs::parse_stat(text, cfg.per_cpu, &mut self.cpus);
        if let (Some(c), Some(p)) = (self.cpus.first(), prev.cpus.first()) {
            if c.total <= p.total {
                // Not one whole USER_HZ unit (10 ms of one core) since the last
                // reading: nothing was measured. Keep the old reading, so the
                // next value averages over the whole window.
                return;
            }
        }
        cpu_percentages(&self.cpus, &prev.cpus, &mut self.cpu_names, |name, pct| {
            m.emit(name, pct)
        });
        std::mem::swap(&mut prev.cpus, &mut self.cpus);
    }

    fn open(page: u64) -> Host {
        let disks = procfs::whole_disks();
        // One small /sys/block/<d>/stat per disk is cheaper than
        // /proc/diskstats, which formats every block device on each read.
        let disk_files = disks
            .iter()
            .filter_map(|d| ProcFile::open(format!("/sys/block/{d}/stat")))
            .collect();
        let ifaces = procfs::net_interfaces();
        Host {
            stat: ProcFile::open("/proc/stat"),
            meminfo: ProcFile::open("/proc/meminfo"),
            statm: ProcFile::open("/proc/self/statm"),
            disks,
            disk_files,
            net: NetSource::open(&ifaces),
            ifaces,
            cpus: Vec::new(),
            cpu_names: Vec::new(),
            page,
        }
    }

    /// One tick's host and process readings: the system-wide ones (CPU, load,
    /// memory, swap, disk, network) when `slow` (see [`DEFAULT_SYSTEM_HZ`]),
    /// this process's RSS every tick.
    fn sample(
        &mut self,
        cfg: &SamplerConfig,
        prev: &mut Prev,
        m: &mut Metrics,
        mono: u64,
        slow: bool,
    ) {
        if slow {
            self.sample_cpu(cfg, prev, m);
            if let Some(load) = procfs::load1() {
                m.emit("sys.load1", load);
            }
            if let Some(mi) = self
                .meminfo
                .as_mut()
                .and_then(|f| f.read())
                .and_then(procfs::parse_meminfo)
            {
                m.emit(
                    "sys.mem_used [B]",
                    mi.total.saturating_sub(mi.available) as f64,
                );
                m.emit("sys.mem_available [B]", mi.available as f64);
                m.emit(
                    "sys.swap_used [B]",
                    mi.swap_total.saturating_sub(mi.swap_free) as f64,
                );
            }
        }
        if slow {
            // Rates over the time since the previous system reading.
            let dt = mono.saturating_sub(prev.system_mono);
            prev.system_mono = mono;
            if !self.disk_files.is_empty() {
                let d = self
                    .disk_files
                    .iter_mut()
                    .filter_map(|f| f.read().map(procfs::parse_block_stat))
                    .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
                if let Some(p) = prev.disk {
                    m.emit("sys.disk_read [B/s]", rate(d.0, p.0, dt));
                    m.emit("sys.disk_write [B/s]", rate(d.1, p.1, dt));
                }
                prev.disk = Some(d);
            }
            if let Some(net) = self.net.as_mut() {
                let n = net.read();
                if let (Some(n), Some(p)) = (n, prev.net) {
                    m.emit("sys.net_rx [B/s]", rate(n.0, p.0, dt));
                    m.emit("sys.net_tx [B/s]", rate(n.1, p.1, dt));
                }
                if n.is_none() {
                    // An interface went away (or came back under a new
                    // kobject): choose the interfaces afresh; the next read
                    // starts a new baseline.
                    self.ifaces = procfs::net_interfaces();
                    self.net = NetSource::open(&self.ifaces);
                }
                prev.net = n;
            }
        }
        if let Some(rss) = self
            .statm
            .as_mut()
            .and_then(|f| f.read())
            .and_then(procfs::parse_statm_rss)
        {
            m.emit("proc.rss [B]", (rss * self.page) as f64);
        }
    }
}

/// Bound on per-core names: a garbled core number must not allocate billions.
const MAX_CORES: usize = 1 << 16;

/// System CPU utilisation over the window between two /proc/stat readings
/// (`prev`, `cur`, as [`procfs::parse_stat`] gives them): `sys.cpu [%]` and,
/// per core, `sys.cpu{N} [%]` named by the core's number, for each line whose
/// counters advanced by at least one USER_HZ unit. `names[n]` is core n's
/// name, made once; names are made for every core up to the highest seen,
/// whichever advanced first.
fn cpu_percentages(
    cur: &[CpuTimes],
    prev: &[CpuTimes],
    names: &mut Vec<String>,
    mut emit: impl FnMut(&str, f64),
) {
    for (i, c) in cur.iter().enumerate() {
        // Same position as before, unless a core went on- or offline.
        let p = match prev.get(i) {
            Some(p) if p.core == c.core => p,
            _ => match prev.iter().find(|p| p.core == c.core) {
                Some(p) => p,
                None => continue, // new core: no window yet
            },
        };
        if c.total <= p.total {
            continue; // this line: no whole unit yet
        }
        let pct = c.busy.saturating_sub(p.busy) as f64 * 100.0 / (c.total - p.total) as f64;
        match c.core {
            None => emit("sys.cpu [%]", pct),
            Some(n) if (n as usize) < MAX_CORES => {
                let n = n as usize;
                while names.len() <= n {
                    names.push(format!("sys.cpu{} [%]", names.len()));
                }
                emit(&names[n], pct);
            }
            Some(_) => {} // not a core number Linux can have (NR_CPUS <= 8192)
        }
    }
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
    let mut host = if linux { Some(Host::open(page)) } else { None };
    let mut children = Children::new(std::process::id(), page, 1_000_000_000 / clk_tck);

    let nvml = gpu::open(&cfg.gpus);
    let (devices, dev_errors) = match &nvml {
        Ok(n) => gpu::devices(n, &cfg.gpus),
        Err(_) => (Vec::new(), Vec::new()),
    };
    let host_meta = if let Some(h) = &host {
        json!({
            "available": true,
            "source": "procfs",
            "disks": h.disks,
            "net_interfaces": h.ifaces,
            "net_source": h.net.as_ref().map(|n| n.name()),
        })
    } else if !cfg.host {
        json!({"available": true, "source": "psutil (Python thread)"})
    } else {
        json!({"available": false, "reason": "host sampling reads /proc, which this OS lacks"})
    };
    let system_hz = cfg.system_hz.clamp(f64::MIN_POSITIVE, cfg.hz);
    let slow_every = ((cfg.hz / system_hz).round() as u64).max(1);
    let mut gpus = gpus::GpuSampler::new(
        devices,
        cfg.hz,
        cfg.hz / slow_every as f64,
        cfg.pcie_every_s,
        cfg.nvml_budget,
    );
    let mut nvml_meta = gpu::metadata(&nvml, &gpus.devices, &dev_errors);
    if nvml.is_ok() {
        nvml_meta["budget"] = json!(gpus.budget());
        nvml_meta["tick_cap_us"] = json!(schedule::TICK_CAP_NS as f64 / 1e3);
    }
    *sh.meta.lock().unwrap_or_else(|e| e.into_inner()) = json!({
        "hz": cfg.hz,
        "system_hz": cfg.hz / slow_every as f64,
        "per_cpu": cfg.per_cpu,
        "history": cfg.history,
        "host": host_meta,
        "nvml": nvml_meta,
    });

    let period = Duration::from_secs_f64(1.0 / cfg.hz);
    let refresh_children_every = ((cfg.hz / 2.0).ceil() as u64).max(1);
    let mut m = Metrics::new();
    let mut prev = Prev::default();
    let mut namer = registry::Named("fastprof-sampler");
    let mut tick_no: u64 = 0;
    let mut next = std::time::Instant::now();
    let mut last_meta = std::time::Instant::now();

    // The cost of a tick is everything the thread uses, waking up and going
    // back to sleep included: total thread CPU over ticks. Bodies alone are
    // measured on every BODY_SAMPLE_EVERY-th tick.
    let cpu_start = thread_cpu_ns();
    let mut pick: u64 = 0x9E37_79B9_7F4A_7C15 ^ clock::monotonic_ns();
    while !sh.stop.load(Ordering::Acquire) {
        let wall0 = std::time::Instant::now();
        // xorshift64: a fresh pseudo-random draw per tick, no syscall.
        pick ^= pick << 13;
        pick ^= pick >> 7;
        pick ^= pick << 17;
        let body0 = (pick % BODY_SAMPLE_EVERY == 0).then(thread_cpu_ns);
        let ticks = clock::ticks();
        let mono = clock::monotonic_ns();
        let dt = mono.saturating_sub(prev.mono);
        let first = tick_no == 0;
        if cfg.panic_after_ticks == Some(tick_no) {
            panic!("injected by {TEST_PANIC_ENV} after {tick_no} ticks");
        }

        if let Some(h) = host.as_mut() {
            h.sample(&cfg, &mut prev, &mut m, mono, tick_no % slow_every == 0);
            if let Some(n) = children.own_threads() {
                m.emit("proc.threads", n as f64);
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

        let nvml_ns = gpus.tick(mono, &mut |name, v| m.emit(name, v));
        prev.mono = mono;

        // Publish: trace counters (through this thread's ring) and history.
        {
            let mut store = sh.store.lock().unwrap_or_else(|e| e.into_inner());
            for &(id, v) in &m.pending {
                let (name, trace_id) = &m.names[id];
                store.ensure(id, name);
                store.push(id, mono, v);
                if let Some(tid) = trace_id {
                    m.batch.push((*tid, v));
                }
            }
        }
        registry::counters_at(&m.batch, ticks, &mut namer);
        m.batch.clear();
        m.pending.clear();
        m.cursor = 0;
        tick_no += 1;

        let body_end = body0.map(|b0| {
            let now = thread_cpu_ns();
            (now, now.saturating_sub(b0))
        });
        let wall = wall0.elapsed().as_nanos() as u64;
        {
            let mut c = sh.cost.lock().unwrap_or_else(|e| e.into_inner());
            c.ticks += 1;
            if let Some((now, body)) = body_end {
                c.cpu_ns_total = now.saturating_sub(cpu_start);
                c.cpu_ticks = c.ticks;
                c.body_ticks += 1;
                c.body_cpu_ns_total += body;
                c.body_cpu_ns_max = c.body_cpu_ns_max.max(body);
            }
            c.wall_ns_total += wall;
            c.wall_ns_max = c.wall_ns_max.max(wall);
            let w = u32::try_from(wall).unwrap_or(u32::MAX);
            let at = ((c.ticks - 1) % RECENT_TICKS as u64) as usize;
            if c.recent_wall_ns.len() < RECENT_TICKS {
                c.recent_wall_ns.push(w);
            } else {
                c.recent_wall_ns[at] = w;
            }
            c.nvml_ns_total += nvml_ns;
        }
        if last_meta.elapsed() >= Duration::from_secs(1) {
            last_meta = std::time::Instant::now();
            publish_meta(&sh, &gpus);
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
    {
        let mut c = sh.cost.lock().unwrap_or_else(|e| e.into_inner());
        c.cpu_ns_total = thread_cpu_ns().saturating_sub(cpu_start);
        c.cpu_ticks = c.ticks;
    }
    publish_meta(&sh, &gpus);
}

fn publish_meta(sh: &SamplerShared, gpus: &gpus::GpuSampler<'_>) {
    let cost = sh.cost.lock().unwrap_or_else(|e| e.into_inner()).json();
    let calls = gpus.calls_json();
    let disabled: serde_json::Map<String, Value> = gpus
        .devices
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
        if !gpus.devices.is_empty() {
            nv["calls"] = calls;
            nv["share"] = gpus.share_json();
        }
        if let Some(why) = gpus.helper_error() {
            nv["helper_error"] = json!(why);
        }
        // Sources can fall back while running (a field stops being
        // supported): per device in the inventory, and by label.
        if let Some(inv) = nv.get_mut("devices").and_then(Value::as_array_mut) {
            for (d, inv) in gpus.devices.iter().zip(inv.iter_mut()) {
                inv["sources"] = d.sources_json();
                inv["source_fallbacks"] = d.fallbacks_json();
            }
        }
        if !gpus.devices.is_empty() {
            nv["sources"] = gpus
                .devices
                .iter()
                .map(|d| (d.label.clone(), d.sources_json()))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
    }
    meta["state"] = json!("running");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A /proc/stat text: per line (label, busy, idle) jiffies.
    fn stat_text(lines: &[(&str, u64, u64)]) -> Vec<u8> {
        let mut s = String::new();
        for (label, busy, idle) in lines {
            s += &format!("{label} {busy} 0 0 {idle} 0 0 0 0 0 0\n");
        }
        s += "intr 12345 0 0\nctxt 99\n";
        s.into_bytes()
    }

    /// Parse each text as the sampler does and return what every window emits.
    fn windows(texts: &[Vec<u8>]) -> Vec<Vec<(String, f64)>> {
        let (mut prev, mut cur, mut names) = (Vec::new(), Vec::new(), Vec::new());
        let mut out = Vec::new();
        for text in texts {
            procfs::parse_stat(text, true, &mut cur);
            let mut got = Vec::new();
            cpu_percentages(&cur, &prev, &mut names, |n, v| got.push((n.to_string(), v)));
            out.push(got);
            std::mem::swap(&mut prev, &mut cur);
        }
        out
    }

    #[test]
    fn per_core_names_when_a_core_has_not_advanced_yet() {
        // Window 1: cpu0 has not counted a whole unit, cpu1 has (a core's
        // name is needed before the names of the cores below it exist).
        let w = windows(&[
            stat_text(&[("cpu", 100, 900), ("cpu0", 50, 450), ("cpu1", 50, 450)]),
            stat_text(&[("cpu", 160, 940), ("cpu0", 50, 450), ("cpu1", 110, 490)]),
            stat_text(&[("cpu", 200, 1000), ("cpu0", 70, 480), ("cpu1", 130, 520)]),
        ]);
        let named = |w: &[(String, f64)]| -> Vec<(String, i64)> {
            w.iter()
                .map(|(n, v)| (n.clone(), v.round() as i64))
                .collect()
        };
        assert!(w[0].is_empty());
        assert_eq!(
            named(&w[1]),
            [
                ("sys.cpu [%]".to_string(), 60),
                ("sys.cpu1 [%]".to_string(), 60)
            ]
        );
        assert_eq!(
            named(&w[2]),
            [
                ("sys.cpu [%]".to_string(), 40),
                ("sys.cpu0 [%]".to_string(), 40),
                ("sys.cpu1 [%]".to_string(), 40)
            ]
        );
    }

    #[test]
    fn per_core_names_are_core_numbers_with_cores_offline() {
        // cpu1 is offline: /proc/stat skips its line.
        let w = windows(&[
            stat_text(&[
                ("cpu", 0, 0),
                ("cpu0", 0, 0),
                ("cpu2", 0, 0),
                ("cpu3", 0, 0),
            ]),
            stat_text(&[
                ("cpu", 30, 270),
                ("cpu0", 10, 90),
                ("cpu2", 20, 80),
                ("cpu3", 0, 100),
            ]),
        ]);
        let names: Vec<&str> = w[1].iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "sys.cpu [%]",
                "sys.cpu0 [%]",
                "sys.cpu2 [%]",
                "sys.cpu3 [%]"
            ]
        );
        let pct: Vec<f64> = w[1].iter().map(|(_, v)| v.round()).collect();
        assert_eq!(pct, [10.0, 10.0, 20.0, 0.0]);
    }

    fn wait_for(what: impl Fn() -> bool) {
        let t0 = std::time::Instant::now();
        while !what() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn quiet_config() -> SamplerConfig {
        SamplerConfig {
            hz: 1000.0,
            gpus: GpuSelect::None,
            ..Default::default()
        }
    }

    #[test]
    fn a_sampler_failure_is_recorded_and_returned_by_stop() {
        let s = Sampler::start(SamplerConfig {
            panic_after_ticks: Some(3),
            ..quiet_config()
        })
        .unwrap();
        let sh = s.shared.clone();
        wait_for(|| sh.failure().is_some());
        let meta = sh.meta.lock().unwrap().clone();
        assert_eq!(meta["state"], "failed", "{meta}");
        let reason = s.stop().expect("stop() returns the failure");
        assert_eq!(meta["error"], json!(reason));
        assert!(reason.contains("after 3 ticks"), "{reason}");
        assert!(reason.contains("recording goes on"), "{reason}");
        // The ticks before the failure happened and were counted.
        assert_eq!(sh.cost.lock().unwrap().ticks, 3);
        assert_eq!(sh.failure(), Some(reason));
    }

    #[test]
    fn a_healthy_sampler_stops_without_failure() {
        let s = Sampler::start(quiet_config()).unwrap();
        let sh = s.shared.clone();
        wait_for(|| sh.cost.lock().unwrap().ticks >= 5);
        assert_eq!(s.stop(), None);
        let meta = sh.meta.lock().unwrap().clone();
        assert_ne!(meta["state"], "failed", "{meta}");
        assert!(meta.get("error").is_none(), "{meta}");
    }
}
