//! `analyze_steps`: the step-time breakdown per (rank, step) as numpy
//! columns (see `fastprof_core::offline::analyze`). The GIL is released while the
//! files are read.

use crate::errors::Error;
use fastprof_core::offline::analyze::{
    self, AnalyzeOptions, DeviceRow, StepColumns, ROLES, STEP_SOURCES,
};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// Returns `{"steps": {column: ndarray} (empty unless keep_rows),
/// "step_sources", "summaries": [dict per rank], "bars": [dict per rank],
/// "step_count", "devices": {column: ndarray}, "files", "warnings",
/// "kernel_wait_ns"}`. `csv`: write breakdown.csv there as the rows are
/// computed.
#[pyfunction]
#[pyo3(signature = (paths, *, csv=None, keep_rows=true, max_bars=1000))]
pub fn analyze_steps(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    csv: Option<PathBuf>,
    keep_rows: bool,
    max_bars: usize,
) -> PyResult<Bound<'_, PyDict>> {
    let opts = AnalyzeOptions {
        csv: csv.as_deref(),
        keep_rows,
        max_bars,
    };
    let a = py
        .detach(|| analyze::analyze_steps_with(&paths, &opts))
        .map_err(Error)?;
    let d = PyDict::new(py);
    d.set_item(
        "steps",
        if keep_rows {
            steps(py, a.steps)?
        } else {
            PyDict::new(py)
        },
    )?;
    d.set_item("step_sources", STEP_SOURCES.to_vec())?;
    d.set_item("step_count", a.step_count)?;
    let mut sums = Vec::with_capacity(a.summaries.len());
    for s in &a.summaries {
        let sd = PyDict::new(py);
        sd.set_item("rank", s.rank)?;
        sd.set_item("steps", s.steps)?;
        sd.set_item("duration_ns", s.duration_ns)?;
        sd.set_item("step_mean_ns", s.step_mean_ns)?;
        sd.set_item("step_p50_ns", s.step_p50_ns)?;
        sd.set_item("step_p95_ns", s.step_p95_ns)?;
        sd.set_item("step_max_ns", s.step_max_ns)?;
        for (name, v) in ROLES.iter().zip(s.parts) {
            sd.set_item(*name, v)?;
        }
        sd.set_item("gpu_steps", s.gpu_steps)?;
        sd.set_item("gpu_util", s.gpu_util)?;
        sd.set_item("sm_efficiency", s.sm_efficiency)?;
        sd.set_item("occupancy", s.occupancy)?;
        sd.set_item("tensor_core_share", s.tensor_core_share)?;
        sd.set_item("overlap_pct", s.overlap_pct)?;
        sd.set_item("source", s.source)?;
        sums.push(sd);
    }
    d.set_item("summaries", sums)?;
    let mut bars = Vec::with_capacity(a.bars.len());
    for b in a.bars {
        let bd = PyDict::new(py);
        bd.set_item("rank", b.rank)?;
        bd.set_item("per", b.per)?;
        bd.set_item("step", PyArray1::from_vec(py, b.step))?;
        for (name, v) in ROLES.iter().zip(b.parts) {
            bd.set_item(*name, PyArray1::from_vec(py, v))?;
        }
        bars.push(bd);
    }
    d.set_item("bars", bars)?;
    d.set_item("devices", devices(py, &a.devices)?)?;
    d.set_item("files", crate::columns::file_dicts(py, a.files)?)?;
    d.set_item("warnings", a.warnings)?;
    d.set_item("kernel_wait_ns", analyze::KERNEL_WAIT_NS)?;
    Ok(d)
}

/// One numpy column per named field of `rows`, into dict `d`.
macro_rules! cols {
    ($py:expr, $d:expr, $rows:expr, $($f:ident),* $(,)?) => {$(
        $d.set_item(stringify!($f), PyArray1::from_vec($py, $rows.iter().map(|r| r.$f).collect()))?;
    )*};
}

/// One numpy column per named field of `cols`, moved into dict `d`.
macro_rules! moved {
    ($py:expr, $d:expr, $cols:expr, $($f:ident),* $(,)?) => {$(
        $d.set_item(stringify!($f), PyArray1::from_vec($py, $cols.$f))?;
    )*};
}
/// Each column moved into its array (no copy); `source` holds indices
/// into `step_sources`.
fn steps(py: Python<'_>, c: StepColumns) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    moved!(
        py,
        d,
        c,
        source,
        rank,
        step,
        start_ns,
        end_ns,
        kernel_ns,
        memcpy_ns,
        memset_ns,
        communication_ns,
        runtime_ns,
        dataloader_ns,
        cpu_exec_ns,
        other_ns,
        has_gpu,
        gpu_utilization,
        sm_efficiency,
        achieved_occupancy,
        tensor_core_share,
        gpu_busy_ns,
        compute_ns,
        non_compute_ns,
        idle_ns,
        idle_host_wait_ns,
        idle_kernel_wait_ns,
        idle_other_ns,
        kernel_communication_ns,
        kernel_computation_ns,
        kernel_memory_ns,
        kernel_other_ns,
        comm_kernel_ns,
        comm_overlap_ns,
        comm_overlap_pct
    );
    Ok(d)
}

fn devices<'py>(py: Python<'py>, rows: &[DeviceRow]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    cols!(
        py,
        d,
        rows,
        rank,
        device,
        gpu_utilization,
        sm_efficiency,
        achieved_occupancy
    );
    Ok(d)
}
