//! `fastprof._core`: thin PyO3 wrappers over `fastprof-core`. The public API
//! is written in Python (`python/fastprof`); this module only converts values,
//! releases the GIL around blocking work and maps errors.

mod actions;
mod analyze;
mod anatomy;
mod columns;
mod convert;
mod errors;
mod hang;
mod recording;
mod remote;
mod session;
mod signals;
mod step_args;
mod steps;

use errors::Error;
use fastprof_core::offline::trace::reader;
use fastprof_core::runtime::registry;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// True while a session records (paused or not).
#[pyfunction]
fn is_active(py: Python<'_>) -> bool {
    session::surface_notices(py);
    registry::is_active()
}

/// Merge traces (see `fastprof merge --help`); runs in Rust with the GIL
/// released, interruptible by signals (Ctrl-C raises KeyboardInterrupt).
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
    use fastprof_core::offline::merge::{MergeOptions, Window};
    let window = match (steps, start, end) {
        (Some((from, to)), _, _) => Window::Steps { from, to },
        (None, None, None) => Window::All,
        (None, s, e) => Window::Seconds { start: s, end: e },
    };
    let cancel = Arc::new(AtomicBool::new(false));
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
        cancel: Some(cancel.clone()),
    };
    // The merge runs on its own thread while this one, between short waits
    // without the GIL, lets Python run its signal handlers: Ctrl-C (or a
    // handler that raises, e.g. for SIGTERM) cancels the merge, which then
    // removes its temporary file, and the exception propagates.
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("fastprof-merge".into())
        .spawn(move || {
            let _ = tx.send(fastprof_core::offline::merge::merge(&opts));
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the merge thread: {e}")))?;
    // A Receiver is Send but not Sync: it moves into each wait and back.
    let mut rx = rx;
    let result = loop {
        let (back, got) = py.detach(move || {
            let got = rx.recv_timeout(Duration::from_millis(50));
            (rx, got)
        });
        rx = back;
        match got {
            Ok(r) => break r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    // Relaxed: the merge polls it; the channel orders the rest.
                    cancel.store(true, Ordering::Relaxed);
                    // Finished in the instant before the signal was seen: the
                    // caller is told nothing was written, so that holds.
                    if let Ok(Ok(done)) = py.detach(move || rx.recv()) {
                        let _ = std::fs::remove_file(&done.output);
                    }
                    return Err(e);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "the merge thread ended without a result",
                ))
            }
        }
    };
    let s = result.map_err(Error)?;
    let d = PyDict::new(py);
    d.set_item("output", s.output)?;
    d.set_item("files", s.files)?;
    d.set_item("skipped_files", s.skipped_files)?;
    d.set_item("own_files", s.own_files)?;
    d.set_item("removed_temps", s.removed_temps)?;
    d.set_item("ranks", s.ranks)?;
    d.set_item("events_in", s.events_in)?;
    d.set_item("events_out", s.events_out)?;
    d.set_item("events_dropped", s.events_dropped)?;
    d.set_item("metadata_added", s.metadata_added)?;
    d.set_item("metadata_replaced", s.metadata_replaced)?;
    d.set_item("filtered_window", s.filtered_window)?;
    d.set_item("filtered_category", s.filtered_category)?;
    d.set_item("filtered_rank", s.filtered_rank)?;
    d.set_item("filtered_max_bytes", s.filtered_max_bytes)?;
    d.set_item("dropped_categories", s.dropped_categories)?;
    d.set_item("salvaged_bytes", s.salvaged_bytes)?;
    d.set_item("python_calls", s.python_calls)?;
    d.set_item("nest_moved", s.nest_moved)?;
    d.set_item("nest_clipped", s.nest_clipped)?;
    d.set_item("base_ns", s.base_ns)?;
    d.set_item("start_ns", s.start_ns)?;
    d.set_item("end_ns", s.end_ns)?;
    d.set_item("uncertainty_ns", s.uncertainty_ns)?;
    d.set_item(
        "rotated",
        convert::to_py(py, &serde_json::Value::Array(s.rotated.clone()))?,
    )?;
    d.set_item("bytes_uncompressed", s.bytes_uncompressed)?;
    d.set_item("bytes_written", s.bytes_written)?;
    d.set_item("warnings", s.warnings)?;
    d.set_item(
        "inputs",
        convert::to_py(py, &serde_json::Value::Array(s.inputs_json))?,
    )?;
    Ok(d)
}

/// Does nothing: the floor the span benchmark compares against.
#[pyfunction]
fn _noop() {}

/// Spans this thread has open in the current recording (see `registry::thread_depth`).
#[pyfunction]
fn _span_depth() -> u32 {
    registry::thread_depth()
}

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

/// The core's input walker (`trace::inputs::find`) over `paths`: returns
/// `(trace files, fastprof's own non-trace files skipped, temporary files
/// of dead processes removed, warnings)`. The Profiler merges what it finds,
/// the reports call it to clean a run directory.
#[pyfunction]
fn trace_inputs(py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<[Vec<String>; 4]> {
    let f = py
        .detach(|| fastprof_core::offline::trace::inputs::find(&paths))
        .map_err(Error)?;
    let s = |v: Vec<PathBuf>| v.iter().map(|p| p.display().to_string()).collect();
    Ok([s(f.files), s(f.own), s(f.removed), f.warnings])
}

/// What NVML offers here, found by the sampler's own probe
/// (`sampler::gpu::probe`) over the devices `gpus` selects (as the
/// recorder's `sample_gpus`: None = all visible, [] = none). A dict; no
/// library or no driver is `available: False` with the reason, never an error.
#[pyfunction]
#[pyo3(signature = (gpus=None))]
fn nvml_probe(py: Python<'_>, gpus: Option<Vec<String>>) -> PyResult<Bound<'_, PyAny>> {
    let select = session::gpu_select(gpus);
    let probe = py.detach(|| fastprof_core::runtime::sampler::gpu::probe(&select));
    convert::to_py(py, &probe)
}

/// Whether `text` names a place through a storage backend rather than a local
/// path (`fastprof_core::contract::is_url`: the Python package's rule too).
/// A str that is not valid UTF-8 (a lone surrogate) is read with the
/// replacement character, which no URL's scheme holds.
#[pyfunction]
fn _is_url(text: &Bound<'_, pyo3::types::PyString>) -> bool {
    fastprof_core::contract::is_url(&text.to_string_lossy())
}

/// The names of the writer/reader contract (`fastprof_core::contract`), as
/// module constants `fastprof.recording.names` takes.
fn add_contract(m: &Bound<'_, PyModule>) -> PyResult<()> {
    use fastprof_core::contract as c;
    for (name, value) in [
        ("STEP_SPAN", c::STEP_SPAN),
        ("STEP_COUNTER", c::STEP_COUNTER),
        ("LOADER_PREFIX", c::LOADER_PREFIX),
        ("LOADER_NEXT_SUFFIX", c::LOADER_NEXT_SUFFIX),
        ("SEGMENT_PREFIX", c::SEGMENT_PREFIX),
        ("SEGMENT_SUFFIX", c::SEGMENT_SUFFIX),
        ("OPEN_SUFFIX", c::OPEN_SUFFIX),
        ("FIRST_INDEX_FILE", c::FIRST_INDEX_FILE),
        ("UNIFIED_TRACE", c::UNIFIED_TRACE),
        ("PROFILER_JSON", c::PROFILER_JSON),
        ("TRIGGERS_JSON", c::TRIGGERS_JSON),
        ("LIVE_JSON", c::LIVE_JSON),
        ("OOM_JSON", c::OOM_JSON),
        ("REPORT_JSON", c::REPORT_JSON),
        ("MODEL_SUMMARY_JSON", c::MODEL_SUMMARY_JSON),
        ("OPERATORS_JSON", c::OPERATORS_JSON),
    ] {
        m.add(name, value)?;
    }
    m.add(
        "OWN_JSON_FILES",
        pyo3::types::PyTuple::new(m.py(), c::OWN_JSON_FILES)?,
    )?;
    m.add_function(wrap_pyfunction!(_is_url, m)?)
}

/// The clocks a recording would use here (`clock::describe`), as a dict.
#[pyfunction]
fn clock_info(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    convert::to_py(py, &fastprof_core::runtime::clock::describe())
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    registry::install_fork_handlers();
    // A process spawned by a recording one (a DataLoader worker under spawn
    // or forkserver) learns it from the environment the recorder set.
    if let Ok(pid) = std::env::var("FASTPROF_RECORDING_PID") {
        if pid
            .trim()
            .parse::<u32>()
            .is_ok_and(|p| p != std::process::id())
        {
            registry::FORKED_FROM_RECORDING.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    errors::register(m)?;
    m.add_class::<recording::Name>()?;
    m.add_class::<recording::ArgSpan>()?;
    m.add_class::<recording::_NullSpan>()?;
    m.add_function(wrap_pyfunction!(recording::span, m)?)?;
    m.add_function(wrap_pyfunction!(recording::name_id, m)?)?;
    m.add_function(wrap_pyfunction!(recording::instant, m)?)?;
    m.add_function(wrap_pyfunction!(recording::_complete, m)?)?;
    m.add_function(wrap_pyfunction!(recording::_ticks, m)?)?;
    m.add_function(wrap_pyfunction!(recording::end, m)?)?;
    m.add_function(wrap_pyfunction!(recording::counter, m)?)?;
    m.add_class::<actions::_ActionClock>()?;
    m.add_class::<actions::_ActionScope>()?;
    m.add_class::<session::Session>()?;
    m.add_class::<session::_GzipJob>()?;
    m.add_class::<session::_RunWait>()?;
    m.add_class::<steps::_StepLoop>()?;
    m.add_class::<anatomy::_PhaseClock>()?;
    m.add_class::<anatomy::_Timed>()?;
    m.add_class::<steps::_LoaderIter>()?;
    m.add_function(wrap_pyfunction!(steps::_attention_set, m)?)?;
    m.add_function(wrap_pyfunction!(steps::_attention_take, m)?)?;
    m.add_function(wrap_pyfunction!(steps::_anomaly_take, m)?)?;
    m.add_function(wrap_pyfunction!(steps::_anomaly_hold, m)?)?;
    m.add_function(wrap_pyfunction!(steps::_median_step_ns, m)?)?;
    m.add_function(wrap_pyfunction!(signals::_signal_harmless, m)?)?;
    m.add_class::<hang::_HangWatch>()?;
    m.add_function(wrap_pyfunction!(hang::_hang_last_step, m)?)?;
    m.add_function(wrap_pyfunction!(hang::_hang_sigterm_take, m)?)?;
    m.add_function(wrap_pyfunction!(is_active, m)?)?;
    m.add_function(wrap_pyfunction!(_noop, m)?)?;
    m.add_function(wrap_pyfunction!(_span_depth, m)?)?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(trace_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(remote::_set_remote, m)?)?;
    m.add_function(wrap_pyfunction!(analyze::analyze_steps, m)?)?;
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    m.add_function(wrap_pyfunction!(columns::read_columns, m)?)?;
    m.add_function(wrap_pyfunction!(step_args::_read_step_args, m)?)?;
    m.add_function(wrap_pyfunction!(nvml_probe, m)?)?;
    m.add_function(wrap_pyfunction!(clock_info, m)?)?;
    add_contract(m)?;
    m.add("__version__", fastprof_core::VERSION)?;
    m.add(
        "DEFAULT_SAMPLE_HZ",
        fastprof_core::runtime::sampler::DEFAULT_HZ,
    )?;
    m.add(
        "DEFAULT_BUFFER_GROWTH",
        fastprof_core::runtime::ring::DEFAULT_GROWTH_BYTES,
    )?;
    Ok(())
}
