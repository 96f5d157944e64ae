//! `fastprof._core`: thin PyO3 wrappers over `fastprof-core`. The public API
//! is written in Python (`python/fastprof`); this module only converts values,
//! releases the GIL around blocking work and maps errors.

mod convert;
mod errors;
mod recording;

use errors::Error;
use fastprof_core::config::Config;
use fastprof_core::{reader, recorder};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// Start the process-wide recorder. Raises before anything is recorded when
/// an option is invalid or the trace directory cannot be written.
#[pyfunction]
#[pyo3(signature = (trace_dir, run_name, rank, world_size, local_rank, buffer_size,
                    flush_interval, segment_size, segment_seconds, compression_level,
                    extra_config_json))]
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
) -> PyResult<()> {
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

/// True between start and stop, even after a failure disabled recording.
#[pyfunction]
fn is_started() -> bool {
    recorder::is_started()
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
    m.add_function(wrap_pyfunction!(is_started, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(_noop, m)?)?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add("__version__", fastprof_core::VERSION)?;
    Ok(())
}
