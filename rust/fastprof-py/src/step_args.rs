//! `_read_step_args`: the args of one trace file's `step` spans that the
//! columns leave out (see `fastprof_core::offline::trace::step_args`), as
//! numpy arrays; the GIL is released while the file is read.

use crate::errors::Error;
use fastprof_core::offline::trace::step_args;
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// `{"pid", "number", "epoch"}`: int64 arrays, one entry per step span of
/// `path` in file order (the order of its rows in `read_columns`).
#[pyfunction]
pub fn _read_step_args(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let got = py
        .detach(|| step_args::read_step_args(&path))
        .map_err(Error)?;
    let d = PyDict::new(py);
    d.set_item("pid", PyArray1::from_vec(py, got.pid))?;
    d.set_item("number", PyArray1::from_vec(py, got.number))?;
    d.set_item("epoch", PyArray1::from_vec(py, got.epoch))?;
    Ok(d)
}
