//! `analyze_steps`: the step-time breakdown per (rank, step) as numpy
//! columns (see `fastprof_core::analyze`). The GIL is released while the
//! files are read.

use crate::errors::Error;
use fastprof_core::analyze::{self, DeviceRow, StepRow};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// Returns `{"steps": {column: ndarray}, "devices": {column: ndarray},
/// "files": [...], "warnings": [...]}`.
#[pyfunction]
pub fn analyze_steps(py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<Bound<'_, PyDict>> {
    let a = py
        .detach(|| analyze::analyze_steps(&paths))
        .map_err(Error)?;
    let d = PyDict::new(py);
    d.set_item("steps", steps(py, &a.steps)?)?;
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

fn steps<'py>(py: Python<'py>, rows: &[StepRow]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    cols!(
        py,
        d,
        rows,
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
    d.set_item("source", rows.iter().map(|r| r.source).collect::<Vec<_>>())?;
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
