//! `fastprof._core`: thin PyO3 wrappers over `fastprof-core`. The public API
//! is written in Python (`python/fastprof`); this module only converts values,
//! releases the GIL around blocking work and maps errors.

mod columns;
mod convert;
mod errors;
mod recording;

use errors::Error;
use fastprof_core::config::Config;
use fastprof_core::sampler::gpu::GpuSelect;
use fastprof_core::sampler::SamplerConfig;
use fastprof_core::{reader, recorder};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// Start the process-wide recorder. Raises before anything is recorded when
/// an option is invalid or the trace directory cannot be written.
#[pyfunction]
#[pyo3(signature = (trace_dir, run_name, rank, world_size, local_rank, buffer_size,
                    flush_interval, segment_size, segment_seconds, compression_level,
                    extra_config_json, sample_hz=0.0, sample_per_cpu=false, sample_gpus=None,
                    sample_history=65536, sample_host=true, sample_system_hz=10.0))]
#[allow(clippy::too_many_arguments)]
fn start(
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
) -> PyResult<()> {
    // sample_gpus: None = all visible devices, [] = no NVML, else indices/UUIDs.
    let gpus = match sample_gpus {
        None => GpuSelect::All,
        Some(v) if v.is_empty() => GpuSelect::None,
        Some(v) => GpuSelect::Some(v),
    };
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
        flush_interval_s: flush_interval,
        segment_size,
        segment_seconds,
        compression_level,
        extra_config_json,
        sampler,
    };
    py.detach(|| recorder::start(cfg)).map_err(Error)?;
    Ok(())
}

/// Stop recording and return the writer's report as a dict. The GIL is
/// released while the writer drains and closes the last segment.
#[pyfunction]
fn stop(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let r = py.detach(recorder::stop).map_err(Error)?;
    let d = PyDict::new(py);
    d.set_item("events_written", r.events_written)?;
    d.set_item("dropped", r.dropped)?;
    d.set_item(
        "dropped_per_thread",
        r.dropped_per_thread.into_iter().collect::<Vec<_>>(),
    )?;
    d.set_item("segments", r.segments)?;
    d.set_item("unclosed_spans", r.unclosed_spans)?;
    d.set_item("bytes_compressed", r.bytes_compressed)?;
    d.set_item("error", r.error)?;
    Ok(d)
}

/// True while events are being recorded.
#[pyfunction]
fn is_active() -> bool {
    recorder::is_active()
}

/// Every sampled metric of the running (or last) recorder:
/// `{name: (timestamps int64 CLOCK_MONOTONIC ns, values float64)}`.
#[pyfunction]
fn sampler_series(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let Some(s) = recorder::sampler() else {
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

/// The sampler's metadata (availability, devices, disabled fields, self-cost)
/// as a dict, or None when the recorder did not sample.
#[pyfunction]
fn sampler_info(py: Python<'_>) -> PyResult<Option<Bound<'_, PyAny>>> {
    let Some(s) = recorder::sampler() else {
        return Ok(None);
    };
    let meta = s.meta.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(Some(convert::to_py(py, &meta)?))
}

/// Joules `gpu` (e.g. "gpu0") used between two CLOCK_MONOTONIC ns instants,
/// with the source ("energy_counter" or "integrated_power"); None if unknown.
#[pyfunction]
fn energy_between(gpu: &str, t0_ns: u64, t1_ns: u64) -> Option<(f64, &'static str)> {
    let s = recorder::sampler()?;
    let store = s.store.lock().unwrap_or_else(|e| e.into_inner());
    store.energy_between(gpu, t0_ns, t1_ns)
}

/// Merge traces (see `fastprof merge --help`); runs in Rust with the GIL released.
#[pyfunction]
#[pyo3(signature = (inputs, output, *, force=false, ranks=None, start=None, end=None, steps=None,
                    include_categories=Vec::new(), exclude_categories=Vec::new(), max_bytes=None,
                    threads=0, compression_level=1, progress=false))]
#[allow(clippy::too_many_arguments)]
fn merge(
    py: Python<'_>,
    inputs: Vec<PathBuf>,
    output: PathBuf,
    force: bool,
    ranks: Option<Vec<u32>>,
    start: Option<f64>,
    end: Option<f64>,
    steps: Option<(u64, u64)>,
    include_categories: Vec<String>,
    exclude_categories: Vec<String>,
    max_bytes: Option<u64>,
    threads: usize,
    compression_level: u32,
    progress: bool,
) -> PyResult<Bound<'_, PyDict>> {
    use fastprof_core::merge::{MergeOptions, Window};
    let window = match (steps, start, end) {
        (Some((from, to)), _, _) => Window::Steps { from, to },
        (None, None, None) => Window::All,
        (None, s, e) => Window::Seconds { start: s, end: e },
    };
    let opts = MergeOptions {
        inputs,
        output,
        force,
        ranks,
        window,
        include_categories,
        exclude_categories,
        max_bytes,
        threads,
        compression_level,
        progress,
    };
    let s = py
        .detach(|| fastprof_core::merge::merge(&opts))
        .map_err(Error)?;
    let d = PyDict::new(py);
    d.set_item("output", s.output)?;
    d.set_item("files", s.files)?;
    d.set_item("skipped_files", s.skipped_files)?;
    d.set_item("ranks", s.ranks)?;
    d.set_item("events_in", s.events_in)?;
    d.set_item("events_out", s.events_out)?;
    d.set_item("metadata_added", s.metadata_added)?;
    d.set_item("metadata_replaced", s.metadata_replaced)?;
    d.set_item("filtered_window", s.filtered_window)?;
    d.set_item("filtered_category", s.filtered_category)?;
    d.set_item("filtered_rank", s.filtered_rank)?;
    d.set_item("filtered_max_bytes", s.filtered_max_bytes)?;
    d.set_item("dropped_categories", s.dropped_categories)?;
    d.set_item("salvaged_bytes", s.salvaged_bytes)?;
    d.set_item("base_ns", s.base_ns)?;
    d.set_item("start_ns", s.start_ns)?;
    d.set_item("end_ns", s.end_ns)?;
    d.set_item("uncertainty_ns", s.uncertainty_ns)?;
    d.set_item("bytes_uncompressed", s.bytes_uncompressed)?;
    d.set_item("bytes_written", s.bytes_written)?;
    d.set_item("warnings", s.warnings)?;
    d.set_item(
        "inputs",
        convert::to_py(py, &serde_json::Value::Array(s.inputs_json))?,
    )?;
    Ok(d)
}

/// Called in a forked child (os.register_at_fork): forget the parent's recorder.
#[pyfunction]
fn _after_fork_in_child() {
    recorder::after_fork_in_child();
}

/// Does nothing: the floor the span benchmark compares against.
#[pyfunction]
fn _noop() {}

/// Read a trace file (`.json`, `.json.gz`, or an open `.part` segment).
/// Returns `(document, warnings, salvaged, unused_bytes)`.
#[pyfunction]
fn read_trace(
    py: Python<'_>,
    path: PathBuf,
) -> PyResult<(Bound<'_, PyAny>, Vec<String>, bool, u64)> {
    let doc = py.detach(|| reader::read_trace(&path)).map_err(Error)?;
    let value = convert::to_py(py, &doc.value)?;
    Ok((value, doc.warnings, doc.salvaged, doc.unused_bytes))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<recording::Name>()?;
    m.add_class::<recording::ArgSpan>()?;
    m.add_class::<recording::_NullSpan>()?;
    m.add_function(wrap_pyfunction!(recording::span, m)?)?;
    m.add_function(wrap_pyfunction!(recording::name_id, m)?)?;
    m.add_function(wrap_pyfunction!(recording::instant, m)?)?;
    m.add_function(wrap_pyfunction!(recording::end, m)?)?;
    m.add_function(wrap_pyfunction!(recording::counter, m)?)?;
    m.add_function(wrap_pyfunction!(start, m)?)?;
    m.add_function(wrap_pyfunction!(stop, m)?)?;
    m.add_function(wrap_pyfunction!(is_active, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(_noop, m)?)?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(sampler_series, m)?)?;
    m.add_function(wrap_pyfunction!(sampler_info, m)?)?;
    m.add_function(wrap_pyfunction!(energy_between, m)?)?;
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    m.add_function(wrap_pyfunction!(columns::read_columns, m)?)?;
    m.add("__version__", fastprof_core::VERSION)?;
    Ok(())
}
