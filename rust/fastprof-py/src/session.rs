//! `fastprof._core.Session`: the handle a Python `Recorder` owns. Starting
//! one starts recording; its sampler data and stop report stay with it after
//! `stop`, so two recorders never see each other's readings.
//!
//! A forked child inherits a copy of the handle but not the threads behind
//! it, and any lock inside may be held by a thread that vanished: every
//! method checks the owning pid first and, in another process, acts as a
//! stopped session without touching the session's locks or threads.

use crate::convert;
use crate::errors::{not_running, Error, FastprofWarning};
use fastprof_core::runtime::collect::StopReport;
use fastprof_core::runtime::config::Config;
use fastprof_core::runtime::registry::{self, ThreadHooks};
use fastprof_core::runtime::sampler::gpu::GpuSelect;
use fastprof_core::runtime::sampler::{SamplerConfig, SamplerShared};
use fastprof_core::runtime::session::Session as CoreSession;
use fastprof_core::runtime::sink::held::{gzip_held, Copied};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

/// What a Python thread tells the registry: its `threading` name, and
/// warnings as `FastprofWarning` (never raised into the recording call: a
/// warnings filter set to "error" only loses the warning, and the message
/// also goes to stderr).
pub struct PyHooks<'py>(pub Python<'py>);

/// Raise `message`, which the core has said on stderr already
/// (`registry::say`, at the time), as a `FastprofWarning` on this Python
/// thread, for code that filters or records warnings; never as an exception
/// (with a warnings filter of "error" the warning is dropped). The warning
/// is marked `_fastprof_said`: `fastprof._warning_display` shows it as
/// nothing, so that the message is one line, not two.
pub fn py_warn(py: Python<'_>, message: &str) {
    let cat = py.get_type::<FastprofWarning>();
    let Ok(w) = cat.call1((message,)) else {
        return;
    };
    let _ = w.setattr("_fastprof_said", true);
    let _ = py
        .import("warnings")
        .and_then(|m| m.call_method1("warn", (w,)));
}

/// Show the recording session's pending messages (failures, a shared
/// directory) as warnings, now that a Python thread calls fastprof. Costs one
/// relaxed load when there are none; not called from the span hot path.
#[inline]
pub fn surface_notices(py: Python<'_>) {
    if registry::NOTICES_PENDING.load(std::sync::atomic::Ordering::Relaxed) {
        for m in registry::take_notices() {
            py_warn(py, &m);
        }
    }
}

impl ThreadHooks for PyHooks<'_> {
    fn thread_name(&mut self) -> String {
        self.0
            .import("threading")
            .and_then(|t| t.call_method0("current_thread"))
            .and_then(|t| t.getattr("name"))
            .and_then(|n| n.extract::<String>())
            .unwrap_or_else(|_| "thread".to_string())
    }

    fn warn(&mut self, message: &str) {
        registry::say(message);
        py_warn(self.0, message);
    }
}

/// One recording (see the module docs).
#[pyclass(frozen, module = "fastprof._core")]
pub struct Session {
    /// Read-locked by every call (several at once: a flight dump on its own
    /// thread and the training thread's step marks); write-locked by `stop`.
    inner: RwLock<Option<CoreSession>>,
    sampler: Option<Arc<SamplerShared>>,
    owner_pid: u32,
}

impl Session {
    fn forked(&self) -> bool {
        registry::current_pid() != self.owner_pid
    }

    fn with<R>(&self, f: impl FnOnce(&CoreSession) -> PyResult<R>) -> PyResult<R> {
        Python::attach(surface_notices);
        if self.forked() {
            return Err(not_running(&format!(
                "this recording belongs to process {} (this is a forked child)",
                self.owner_pid
            )));
        }
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(s) => f(s),
            None => Err(not_running("this recording has stopped")),
        }
    }
}

impl Session {
    /// Mark step `n` for the step loop: as `mark_step`, but a stopped or
    /// inherited session marks nothing and says nothing (a training step
    /// never fails for it).
    pub(crate) fn mark_step_quiet(&self, py: Python<'_>, n: u64) {
        if self.forked() {
            return;
        }
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = g.as_ref() {
            if s.is_active() {
                s.mark_step(n, &mut PyHooks(py));
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if std::process::id() != self.owner_pid {
            // The threads behind this session live in the parent: never join
            // or lock anything here, just forget it.
            let inner = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = inner.take() {
                std::mem::forget(s);
            }
            if let Some(s) = self.sampler.take() {
                std::mem::forget(s);
            }
        }
    }
}

fn report_dict<'py>(py: Python<'py>, r: &StopReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("events_written", r.events_written)?;
    d.set_item("dropped", r.dropped)?;
    d.set_item(
        "dropped_per_thread",
        r.dropped_per_thread
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect::<Vec<_>>(),
    )?;
    d.set_item("segments", r.segments.clone())?;
    d.set_item("unclosed_spans", r.unclosed_spans)?;
    d.set_item("bytes_compressed", r.bytes_compressed)?;
    d.set_item("error", r.error.clone())?;
    d.set_item("sampler_error", r.sampler_error.clone())?;
    d.set_item("payload_dropped", r.payload_dropped)?;
    d.set_item("notices", r.notices.clone())?;
    let rotated = match &r.rotated {
        Some(v) => convert::to_py(py, v)?,
        None => py.None().into_bound(py),
    };
    d.set_item("rotated", rotated)?;
    Ok(d)
}

#[pymethods]
impl Session {
    /// Start recording. Raises before anything is recorded when an option is
    /// invalid or the trace directory cannot be written.
    #[new]
    #[pyo3(signature = (trace_dir, run_name, rank, world_size, local_rank, buffer_size,
                        flush_interval, segment_size, segment_seconds, compression_level,
                        extra_config_json, sample_hz=0.0, sample_per_cpu=false, sample_gpus=None,
                        sample_history=65536, sample_host=true, sample_system_hz=10.0,
                        window_seconds=0.0, window_bytes=67108864, max_disk=0,
                        keep_segments=0, buffer_growth=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        trace_dir: PathBuf,
        run_name: String,
        rank: u32,
        world_size: u32,
        local_rank: u32,
        buffer_size: usize,
        flush_interval: f64,
        segment_size: u64,
        segment_seconds: f64,
        compression_level: u32,
        extra_config_json: String,
        sample_hz: f64,
        sample_per_cpu: bool,
        sample_gpus: Option<Vec<String>>,
        sample_history: usize,
        sample_host: bool,
        sample_system_hz: f64,
        window_seconds: f64,
        window_bytes: u64,
        max_disk: u64,
        keep_segments: u32,
        buffer_growth: Option<u64>,
    ) -> PyResult<Self> {
        let gpus = gpu_select(sample_gpus);
        let sampler = (sample_hz != 0.0).then(|| SamplerConfig {
            hz: sample_hz,
            per_cpu: sample_per_cpu,
            gpus,
            history: sample_history,
            host: sample_host,
            system_hz: sample_system_hz,
            ..SamplerConfig::default()
        });
        let cfg = Config {
            trace_dir,
            run_name,
            rank,
            world_size,
            local_rank,
            buffer_size,
            buffer_growth: buffer_growth
                .unwrap_or(fastprof_core::runtime::ring::DEFAULT_GROWTH_BYTES),
            flush_interval_s: flush_interval,
            segment_size,
            segment_seconds,
            max_disk,
            keep_segments,
            compression_level,
            extra_config_json,
            sampler,
            window_seconds,
            window_bytes,
        };
        let s = py.detach(|| CoreSession::start(cfg)).map_err(Error)?;
        Ok(Session {
            sampler: s.sampler().cloned(),
            inner: RwLock::new(Some(s)),
            owner_pid: std::process::id(),
        })
    }

    /// Stop recording and return the report as a dict; the GIL is released
    /// while the writer drains and closes its outputs. Failures inside
    /// fastprof are in the report (`error`, `sampler_error`), never raised.
    fn stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.forked() {
            return Err(not_running("this recording belongs to the parent process"));
        }
        let taken = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        let Some(mut s) = taken else {
            return Err(not_running("this recording has already stopped"));
        };
        let r = py.detach(move || {
            let r = s.stop();
            drop(s);
            r
        });
        let r = r.map_err(Error)?;
        report_dict(py, &r)
    }

    /// True while this session records (paused or not).
    #[getter]
    fn active(&self) -> bool {
        !self.forked()
            && self
                .inner
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|s| s.is_active())
    }

    #[getter]
    fn paused(&self) -> bool {
        self.with(|s| Ok(s.is_paused())).unwrap_or(false)
    }

    /// Gate new spans, instants and counters; open spans still close.
    fn pause(&self) -> PyResult<()> {
        self.with(|s| s.pause().map_err(|e| Error(e).into()))
    }

    fn resume(&self) -> PyResult<()> {
        self.with(|s| s.resume().map_err(|e| Error(e).into()))
    }

    /// Record this process's clock offset to the reference clock.
    fn set_clock_offset(&self, offset_ns: i64, uncertainty_ns: u64) -> PyResult<()> {
        self.with(|s| {
            s.set_clock_offset(offset_ns, uncertainty_ns);
            Ok(())
        })
    }

    #[getter]
    fn clock_offset(&self) -> Option<(i64, u64)> {
        self.with(|s| Ok(s.clock_offset())).ok().flatten()
    }

    /// Mark the start of step `n` (a `fastprof.step` counter on this thread).
    fn mark_step(&self, py: Python<'_>, n: u64) -> PyResult<()> {
        self.with(|s| {
            s.mark_step(n, &mut PyHooks(py));
            Ok(())
        })
    }

    /// (last step marked, its CLOCK_MONOTONIC ns); (0, 0) before any.
    #[getter]
    fn step(&self) -> (u64, u64) {
        self.with(|s| Ok(s.step())).unwrap_or((0, 0))
    }

    /// Write the in-memory window to `path` as a complete trace.
    /// The session is locked only while detached: a dump from a thread of
    /// its own (the triggers') holding it while it takes the GIL back would
    /// deadlock with the training thread, which holds the GIL and waits for
    /// the session at its next step mark.
    fn dump<'py>(&self, py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
        surface_notices(py);
        if self.forked() {
            return Err(not_running(&format!(
                "this recording belongs to process {} (this is a forked child)",
                self.owner_pid
            )));
        }
        let info = py
            .detach(|| {
                let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
                g.as_ref().map(|s| s.dump_window(&path))
            })
            .ok_or_else(|| not_running("this recording has stopped"))?
            .map_err(Error)?;
        let d = PyDict::new(py);
        // Nothing written (the disk cap): no path to read.
        d.set_item("path", info.skipped.is_none().then_some(info.path))?;
        d.set_item("events", info.events)?;
        d.set_item("open_spans", info.open_spans)?;
        d.set_item("bytes", info.bytes)?;
        d.set_item("deleted", info.deleted)?;
        d.set_item("left_out", info.left_out)?;
        d.set_item("skipped", info.skipped)?;
        Ok(d)
    }

    /// Count `path`, a file written for this recording outside it (`kind`:
    /// "torch" for a torch.profiler window), under its disk cap (max_disk);
    /// why, when the cap deleted it at once. Waits for the writer thread
    /// without holding the GIL.
    /// `release`: bytes held for it while written (`gzip_from`), given back
    /// as it is counted.
    #[pyo3(signature = (path, kind, release = 0))]
    fn count_file(
        &self,
        py: Python<'_>,
        path: PathBuf,
        kind: &str,
        release: u64,
    ) -> PyResult<Option<String>> {
        surface_notices(py);
        if self.forked() {
            return Ok(None);
        }
        py.detach(|| {
            let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
            g.as_ref().map(|s| s.count_file_held(&path, kind, release))
        })
        .ok_or_else(|| not_running("this recording has stopped"))?
        .map_err(|e| Error(e).into())
    }

    /// Gzip what arrives on file descriptor `fd` (owned from this call on:
    /// closed when read to its end) into `dst` at `level`, on a thread of
    /// the core's own that never takes the GIL (the writer at the other end
    /// of a pipe may hold it: Kineto's save does), holding disk under the
    /// cap (max_disk) as the file grows. The handle's `join()` says how it
    /// went; count the file with `count_file(dst, kind, release=held)`.
    fn gzip_from(&self, fd: i32, dst: PathBuf, level: u32) -> PyResult<_GzipJob> {
        use std::os::fd::FromRawFd;
        // SAFETY: the caller hands the descriptor over (documented above);
        // owning it from here on closes it on every path, errors included.
        let mut src = unsafe { std::fs::File::from_raw_fd(fd) };
        let holder = self.with(|s| Ok(s.disk_holder()))?;
        let handle = std::thread::Builder::new()
            .name("fastprof-gzip".into())
            .spawn(move || gzip_held(&mut src, &dst, level, &holder))
            .map_err(|e| {
                Error(fastprof_core::error::CoreError::io(
                    Path::new("gzip thread"),
                    e,
                ))
            })?;
        Ok(_GzipJob {
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Messages for the user not yet shown (a shared directory, failures…).
    fn take_notices(&self) -> Vec<String> {
        if self.forked() {
            return Vec::new();
        }
        registry::NOTICES_PENDING.store(false, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| s.take_notices())
            .unwrap_or_default()
    }

    /// Every sampled metric: `{name: (timestamps int64 CLOCK_MONOTONIC ns, values float64)}`.
    fn series<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let Some(s) = self.sampler.as_ref().filter(|_| !self.forked()) else {
            return Ok(d);
        };
        let snap = py.detach(|| s.store.lock().unwrap_or_else(|e| e.into_inner()).snapshot());
        for (name, ts, vals) in snap {
            let ts: Vec<i64> = ts.into_iter().map(|t| t as i64).collect();
            let t = PyArray1::from_vec(py, ts);
            let v = PyArray1::from_vec(py, vals);
            t.readwrite().make_nonwriteable();
            v.readwrite().make_nonwriteable();
            d.set_item(name, (t, v))?;
        }
        Ok(d)
    }

    /// The sampler's metadata (availability, devices, disabled fields,
    /// self-cost, state), or None when this session did not sample.
    fn sampler_info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(s) = self.sampler.as_ref().filter(|_| !self.forked()) else {
            return Ok(None);
        };
        let meta = s.meta.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(Some(convert::to_py(py, &meta)?))
    }

    /// Joules `gpu` (e.g. "gpu0") used between two CLOCK_MONOTONIC ns
    /// instants, with the source; None if unknown.
    fn energy_between(&self, gpu: &str, t0_ns: u64, t1_ns: u64) -> Option<(f64, &'static str)> {
        let s = self.sampler.as_ref().filter(|_| !self.forked())?;
        let store = s.store.lock().unwrap_or_else(|e| e.into_inner());
        store.energy_between(gpu, t0_ns, t1_ns)
    }
}

/// The sampler's device choice from the Python value of `sample_gpus`:
/// None = all visible devices, [] = no NVML, else NVML indices / UUIDs.
pub(crate) fn gpu_select(sample_gpus: Option<Vec<String>>) -> GpuSelect {
    match sample_gpus {
        None => GpuSelect::All,
        Some(v) if v.is_empty() => GpuSelect::None,
        Some(v) => GpuSelect::Some(v),
    }
}

/// A gzip running on its own thread (`Session.gzip_from`).
#[pyclass(frozen, module = "fastprof._core")]
pub struct _GzipJob {
    handle: Mutex<Option<JoinHandle<Copied>>>,
}

#[pymethods]
impl _GzipJob {
    /// Wait for it (without the GIL): `bytes` of the file, `raw_bytes` read,
    /// `held` (bytes the cap holds for it: release them by counting the
    /// file, or with `count_file` of a path that is gone), `error` (why no
    /// file was written; it is then removed) and `refused` (that was the
    /// cap, not an I/O error). A second call returns None.
    fn join<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(h) = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(None);
        };
        let c = py.detach(|| {
            h.join().unwrap_or_else(|_| Copied {
                error: Some("the gzip thread panicked".into()),
                ..Copied::default()
            })
        });
        let d = PyDict::new(py);
        d.set_item("bytes", c.bytes)?;
        d.set_item("raw_bytes", c.raw)?;
        d.set_item("held", c.held)?;
        d.set_item("error", c.error)?;
        d.set_item("refused", c.refused)?;
        Ok(Some(d))
    }
}

/// The training thread's wait for a CPU (issue #36, item 1): a watcher
/// thread of the core reads the kernel's `run_delay` of thread `tid`
/// every `period_ms`; [`_RunWait::waited`] is called only for a step
/// already suspect. In a forked child (no watcher thread there) it reads
/// nothing and is never joined.
#[pyclass(frozen, module = "fastprof._core")]
pub struct _RunWait {
    pid: u32,
    inner: Mutex<Option<fastprof_core::runtime::sampler::runwait::RunWait>>,
}

impl _RunWait {
    fn mine(&self) -> bool {
        self.pid == std::process::id()
    }
}

#[pymethods]
impl _RunWait {
    /// Err (OSError): the kernel keeps no `schedstat` for the thread.
    #[new]
    #[pyo3(signature = (tid, period_ms = 10.0, keep_s = 60.0))]
    fn new(tid: i32, period_ms: f64, keep_s: f64) -> PyResult<Self> {
        let period = std::time::Duration::from_secs_f64(period_ms.clamp(1.0, 1000.0) / 1e3);
        let keep = std::time::Duration::from_secs_f64(keep_s.clamp(1.0, 3600.0));
        let w = fastprof_core::runtime::sampler::runwait::RunWait::start(tid, period, keep)?;
        Ok(_RunWait {
            pid: std::process::id(),
            inner: Mutex::new(Some(w)),
        })
    }

    /// The thread's wait for a CPU over the last `step_ns` up to now:
    /// `run_delay_ns` and `on_cpu_ns` over the step from `begin_ns` (now less
    /// `step_ns`) to `to_ns` (CLOCK_MONOTONIC; `from_ns`: the last reading at
    /// or before the begin, of whose interval only the part after the begin
    /// counts), and
    /// `involuntary` switches from `involuntary_from_ns` (None when not
    /// read), and the usual wait before it: `usual_rate`, the median share
    /// of the intervals between readings over the `usual_span_ns` (up to
    /// `baseline_ns`) that end at `from_ns` spent waiting; None when the thread's files are gone or the watcher stopped.
    #[pyo3(signature = (step_ns, baseline_ns = 2_000_000_000))]
    fn waited<'py>(
        &self,
        py: Python<'py>,
        step_ns: u64,
        baseline_ns: u64,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        if !self.mine() {
            return Ok(None);
        }
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(w) = g.as_ref().and_then(|w| w.waited(step_ns, baseline_ns)) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("run_delay_ns", w.run_delay_ns)?;
        d.set_item("on_cpu_ns", w.on_cpu_ns)?;
        d.set_item("begin_ns", w.begin_ns)?;
        d.set_item("from_ns", w.from_ns)?;
        d.set_item("to_ns", w.to_ns)?;
        d.set_item("involuntary", w.involuntary)?;
        d.set_item("involuntary_from_ns", w.involuntary_from_ns)?;
        d.set_item("usual_rate", w.usual_rate)?;
        d.set_item("usual_span_ns", w.usual_span_ns)?;
        Ok(Some(d))
    }

    /// `readings` taken, the watcher's own `cpu_ns`, its `period_ms`.
    fn cost<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let ((readings, cpu_ns), period) = match g.as_ref() {
            Some(w) if self.mine() => (w.cost(), w.period().as_secs_f64() * 1e3),
            _ => ((0, 0), 0.0),
        };
        d.set_item("readings", readings)?;
        d.set_item("cpu_ns", cpu_ns)?;
        d.set_item("period_ms", period)?;
        Ok(d)
    }

    /// Stop the watcher (without the GIL) and wait for it; idempotent.
    fn stop(&self, py: Python<'_>) {
        if !self.mine() {
            return;
        }
        let w = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut w) = w {
            py.detach(move || w.stop());
        }
    }
}

impl Drop for _RunWait {
    fn drop(&mut self) {
        if !self.mine() {
            // A forked child's copy: its thread is not here to join.
            if let Some(w) = self
                .inner
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                std::mem::forget(w);
            }
        }
    }
}
