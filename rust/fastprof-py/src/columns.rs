//! `read_columns`: the spans, instants and counters of traces as numpy
//! arrays (see `fastprof_core::offline::trace::columns`). The GIL is released while
//! the files are read; each column's `Vec` becomes its array without a copy.

use crate::errors::Error;
use fastprof_core::error::CoreError;
use fastprof_core::offline::trace::columns::{
    self, Chunk, ColumnsOptions, FileInfo, Fold, Omit, Table,
};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// Read trace files, run directories or a merged trace into columns.
/// Returns `{"spans"|"instants"|"counters": {column: ndarray}, "folded":
/// {column: ndarray}, "names", "categories", "files", "warnings"}` (no
/// `step` column with `step_column=False`; none of those `omit` names, as
/// `"counters.pid"`: `cat`, `pid`, `tid` or `file` of a table).
///
/// With `chunk_rows`, every row goes to `on_chunk` instead, called (with the
/// GIL, the read itself without it) with `{"spans", "instants", "counters",
/// "names", "categories", "file", "last", "moved_ns"}` per chunk of at most
/// about `chunk_rows` rows of a fastprof segment or a merged trace (a whole other trace at its
/// end; `names` as interned so far, the same ids from chunk to chunk;
/// `moved_ns` in a file's last chunk: by how much the times of its earlier
/// chunks move, placed before the file gave its clock offset); the result
/// then holds no rows. Not with `step_column` or a time window. An exception
/// raised by `on_chunk` stops the read and is raised.
#[pyfunction]
#[pyo3(signature = (paths, *, names=None, name_prefixes=Vec::new(), categories=None,
                    start_ns=None, end_ns=None, spans=true, instants=true, counters=true,
                    fold_categories=Vec::new(), fold_except=Vec::new(), step_column=true,
                    collapse_numbered=Vec::new(), omit=Vec::new(), chunk_rows=None, on_chunk=None,
                    step_epochs=false))]
#[allow(clippy::too_many_arguments)]
pub fn read_columns(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    names: Option<Vec<String>>,
    name_prefixes: Vec<String>,
    categories: Option<Vec<String>>,
    start_ns: Option<i64>,
    end_ns: Option<i64>,
    spans: bool,
    instants: bool,
    counters: bool,
    fold_categories: Vec<String>,
    fold_except: Vec<String>,
    step_column: bool,
    collapse_numbered: Vec<String>,
    omit: Vec<String>,
    chunk_rows: Option<usize>,
    on_chunk: Option<Py<PyAny>>,
    step_epochs: bool,
) -> PyResult<Bound<'_, PyDict>> {
    let mut omitted = [Omit::default(); 3];
    for o in &omit {
        let ok = match o.split_once('.') {
            Some((kind, col)) => ["spans", "instants", "counters"]
                .iter()
                .position(|k| *k == kind)
                .is_some_and(|i| omitted[i].set(col)),
            None => false,
        };
        if !ok {
            return Err(Error(CoreError::Config {
                option: "omit",
                reason: format!("{o:?}: expected spans|instants|counters.cat|pid|tid|file"),
            })
            .into());
        }
    }
    let opts = ColumnsOptions {
        names,
        name_prefixes,
        categories,
        start_ns,
        end_ns,
        spans,
        instants,
        counters,
        fold_categories,
        fold_except,
        step_column,
        collapse_numbered,
        omit: omitted,
        step_epochs,
    };
    let span_cols: &[&str] = if step_epochs {
        &["dur", "epoch"]
    } else {
        &["dur"]
    };
    let c = match (chunk_rows, on_chunk) {
        (None, None) => py
            .detach(|| columns::read_columns(&paths, &opts))
            .map_err(Error)?,
        (Some(n), Some(f)) => {
            let mut raised: Option<PyErr> = None;
            let mut sink = |c: Chunk| -> fastprof_core::error::Result<()> {
                Python::attach(|py| {
                    let called =
                        chunk_dict(py, c, &omitted, span_cols).and_then(|d| f.call1(py, (d,)));
                    called.map(|_| ()).map_err(|e| {
                        raised = Some(e);
                        CoreError::Config {
                            option: "on_chunk",
                            reason: "raised".into(),
                        }
                    })
                })
            };
            let got = py.detach(|| columns::read_columns_chunked(&paths, &opts, n, &mut sink));
            if let Some(e) = raised {
                return Err(e);
            }
            got.map_err(Error)?
        }
        _ => {
            return Err(Error(CoreError::Config {
                option: "chunk_rows",
                reason: "chunk_rows and on_chunk go together".into(),
            })
            .into())
        }
    };
    let d = PyDict::new(py);
    // Whether every column's capacity is its length (no spare room held).
    let exact = PyDict::new(py);
    exact.set_item("spans", c.spans.is_exact())?;
    exact.set_item("instants", c.instants.is_exact())?;
    exact.set_item("counters", c.counters.is_exact())?;
    d.set_item("exact", exact)?;
    put_tables(
        py,
        &d,
        [c.spans, c.instants, c.counters],
        span_cols,
        step_column,
        &omitted,
    )?;
    let f = c.folded;
    let fd = PyDict::new(py);
    fd.set_item("rank", PyArray1::from_vec(py, f.rank))?;
    fd.set_item("name", PyArray1::from_vec(py, f.name))?;
    fd.set_item("cat", PyArray1::from_vec(py, f.cat))?;
    let col = |g: fn(&Fold) -> i64| f.folds.iter().map(g).collect::<Vec<i64>>();
    fd.set_item("count", PyArray1::from_vec(py, col(|x| x.count as i64)))?;
    fd.set_item("total_ns", PyArray1::from_vec(py, col(|x| x.total_ns)))?;
    fd.set_item("max_ns", PyArray1::from_vec(py, col(|x| x.max_ns)))?;
    fd.set_item("first_ns", PyArray1::from_vec(py, col(|x| x.first_ns)))?;
    fd.set_item("last_ns", PyArray1::from_vec(py, col(|x| x.last_ns)))?;
    d.set_item("folded", fd)?;
    d.set_item("names", c.names)?;
    d.set_item("categories", c.categories)?;
    d.set_item("files", file_dicts(py, c.files)?)?;
    d.set_item("warnings", c.warnings)?;
    Ok(d)
}

/// One chunk as the dict `on_chunk` is given.
fn chunk_dict<'py>(
    py: Python<'py>,
    c: Chunk,
    omitted: &[Omit; 3],
    span_cols: &[&str],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let cols = c.columns;
    put_tables(
        py,
        &d,
        [cols.spans, cols.instants, cols.counters],
        span_cols,
        false,
        omitted,
    )?;
    d.set_item("names", cols.names)?;
    d.set_item("categories", cols.categories)?;
    d.set_item("file", c.file)?;
    d.set_item("last", c.last)?;
    d.set_item("moved_ns", c.moved_ns)?;
    Ok(d)
}

/// The spans, instants and counters tables into `d` (`span_cols`: the spans' extra columns).
fn put_tables(
    py: Python<'_>,
    d: &Bound<'_, PyDict>,
    [spans, instants, counters]: [Table; 3],
    span_cols: &[&str],
    step_column: bool,
    omitted: &[Omit; 3],
) -> PyResult<()> {
    d.set_item(
        "spans",
        table(py, spans, span_cols, step_column, &omitted[0])?,
    )?;
    d.set_item(
        "instants",
        table(py, instants, &[], step_column, &omitted[1])?,
    )?;
    let extra = ["series", "value"];
    d.set_item(
        "counters",
        table(py, counters, &extra, step_column, &omitted[2])?,
    )?;
    Ok(())
}

/// What was read from each file, as Python dicts (read_columns and
/// analyze_steps): `path` a `pathlib.Path`, or the URL as a `str`.
pub(crate) fn file_dicts(py: Python<'_>, files: Vec<FileInfo>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    files
        .into_iter()
        .map(|f| {
            let fd = PyDict::new(py);
            // A URL stays text: a pathlib.Path would fold its `//`.
            match fastprof_core::offline::trace::remote::url_of(&f.path) {
                Some(url) => fd.set_item("path", url)?,
                None => fd.set_item("path", &f.path)?,
            }
            fd.set_item("kind", f.kind)?;
            fd.set_item("rank", f.rank)?;
            fd.set_item("base_ns", f.base_ns)?;
            fd.set_item("offset_ns", f.offset_ns)?;
            fd.set_item("events", f.events)?;
            fd.set_item("salvaged", f.salvaged)?;
            fd.set_item("cut", f.cut)?;
            fd.set_item("bad_dur", f.bad_dur)?;
            fd.set_item("skipped", f.skipped)?;
            let rotated = match &f.rotated {
                Some(v) => crate::convert::to_py(py, v)?,
                None => py.None().into_bound(py),
            };
            fd.set_item("rotated", rotated)?;
            Ok(fd)
        })
        .collect()
}

/// One table as `{column: ndarray}` (each `Vec` the array's own memory, no
/// copy); `extra` names the kind's own columns, `omit` those left out.
fn table<'py>(
    py: Python<'py>,
    t: Table,
    extra: &[&str],
    step: bool,
    omit: &Omit,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", PyArray1::from_vec(py, t.name))?;
    if !omit.cat {
        d.set_item("cat", PyArray1::from_vec(py, t.cat))?;
    }
    d.set_item("ts", PyArray1::from_vec(py, t.ts))?;
    if extra.contains(&"dur") {
        d.set_item("dur", PyArray1::from_vec(py, t.dur))?;
    }
    if !omit.pid {
        d.set_item("pid", PyArray1::from_vec(py, t.pid))?;
    }
    if !omit.tid {
        d.set_item("tid", PyArray1::from_vec(py, t.tid))?;
    }
    d.set_item("rank", PyArray1::from_vec(py, t.rank))?;
    if step {
        d.set_item("step", PyArray1::from_vec(py, t.step))?;
    }
    if !omit.file {
        d.set_item("file", PyArray1::from_vec(py, t.file))?;
    }
    if extra.contains(&"epoch") {
        d.set_item("epoch", PyArray1::from_vec(py, t.epoch))?;
    }
    if extra.contains(&"series") {
        d.set_item("series", PyArray1::from_vec(py, t.series))?;
        d.set_item("value", PyArray1::from_vec(py, t.value))?;
    }
    Ok(d)
}
