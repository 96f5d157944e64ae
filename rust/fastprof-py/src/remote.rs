//! `_set_remote`: the storage backend the core reads URL inputs through
//! (`fastprof_core::offline::trace::remote`), made of a Python object with
//! `list(url) -> list[tuple[str, int]]` and `open(url) -> binary file`
//! (`fastprof.storage.backend.FsspecRemote`, over fsspec).
//!
//! The core calls it from whatever thread reads: the caller's own, inside
//! `py.detach` (`read_columns`, `analyze_steps`, `trace_inputs`,
//! `read_trace`), or the merge's workers while the caller waits detached.
//! Every call attaches for its own duration only, so no thread waits for
//! the GIL while holding something another attached thread needs: the
//! registration's lock is never held across a call into Python.
//!
//! A read takes the GIL once per `read`: the file object's own read-ahead
//! block (fsspec's cache) is what memory holds, never the object.

use fastprof_core::offline::trace::remote::{self, Remote};
use pyo3::exceptions::{PyFileNotFoundError, PyPermissionError, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use std::io::{self, Read};
use std::sync::Arc;

/// A Python exception raised by the backend, carried inside an
/// `io::Error` through the core. Its text is the exception's
/// `Type: message`; the binding re-raises the exception itself where that
/// says more than an OSError would (see [`PyIoError::reraise`]).
pub struct PyIoError {
    text: String,
    pub err: PyErr,
}

impl std::fmt::Display for PyIoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::fmt::Debug for PyIoError {
    // Not PyErr's Debug: that attaches to the interpreter.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PyIoError({:?})", self.text)
    }
}

impl std::error::Error for PyIoError {}

impl PyIoError {
    /// Whether the original exception is raised as it is rather than as an
    /// OSError naming the URL: fastprof's own errors (the one-line
    /// `ConfigError` for a protocol whose package is missing) and what is
    /// no error of the storage (`KeyboardInterrupt`, `SystemExit`).
    pub fn reraise(&self, py: Python<'_>) -> bool {
        self.err
            .is_instance(py, &py.get_type::<crate::errors::FastprofError>())
            || !self
                .err
                .is_instance(py, &py.get_type::<pyo3::exceptions::PyException>())
    }
}

/// `err` as an `io::Error` of the matching kind.
fn py_io(py: Python<'_>, err: PyErr) -> io::Error {
    let kind = if err.is_instance_of::<PyFileNotFoundError>(py) {
        io::ErrorKind::NotFound
    } else if err.is_instance_of::<PyPermissionError>(py) {
        io::ErrorKind::PermissionDenied
    } else if err.is_instance_of::<PyTimeoutError>(py) {
        io::ErrorKind::TimedOut
    } else {
        io::ErrorKind::Other
    };
    let ty = err
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    let msg = err
        .value(py)
        .str()
        .map(|s| s.to_string())
        .unwrap_or_default();
    let text = if msg.is_empty() {
        ty
    } else {
        format!("{ty}: {msg}")
    };
    io::Error::new(kind, PyIoError { text, err })
}

/// Run `f` attached to the interpreter, or fail when it is gone (a merge
/// thread still reading while Python exits).
fn attached<R>(f: impl for<'py> FnOnce(Python<'py>) -> io::Result<R>) -> io::Result<R> {
    Python::try_attach(f).unwrap_or_else(|| {
        Err(io::Error::other(
            "the Python interpreter is shutting down: cannot read from storage",
        ))
    })
}

/// The backend object registered by `_set_remote`.
struct PyRemote {
    backend: Py<PyAny>,
}

impl Remote for PyRemote {
    fn list(&self, url: &str) -> io::Result<Vec<(String, u64)>> {
        attached(|py| {
            self.backend
                .bind(py)
                .call_method1("list", (url,))
                .and_then(|v| v.extract::<Vec<(String, u64)>>())
                .map_err(|e| py_io(py, e))
        })
    }

    fn open(&self, url: &str) -> io::Result<Box<dyn Read + Send>> {
        attached(|py| {
            let file = self
                .backend
                .bind(py)
                .call_method1("open", (url,))
                .map_err(|e| py_io(py, e))?;
            Ok(Box::new(PyReader {
                file: Some(file.unbind()),
            }) as Box<dyn Read + Send>)
        })
    }
}

/// A Python binary file read through `read(n)`: fsspec's files implement
/// `readinto` as `read` plus a copy, so this costs the same one copy
/// without lending Rust memory to Python as a writable buffer it could keep.
struct PyReader {
    /// None once closed.
    file: Option<Py<PyAny>>,
}

impl Read for PyReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let Some(file) = &self.file else {
            return Ok(0);
        };
        if out.is_empty() {
            return Ok(0);
        }
        attached(|py| {
            let got = file
                .bind(py)
                .call_method1("read", (out.len(),))
                .map_err(|e| py_io(py, e))?;
            if got.is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "the storage file returned None (no data available yet)",
                ));
            }
            let data = got
                .extract::<PyBackedBytes>()
                .map_err(|e| py_io(py, e.into()))?;
            if data.len() > out.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the storage file returned {} bytes for a read of {}",
                        data.len(),
                        out.len()
                    ),
                ));
            }
            out[..data.len()].copy_from_slice(&data);
            Ok(data.len())
        })
    }
}

impl Drop for PyReader {
    fn drop(&mut self) {
        let mut file = self.file.take();
        let attached = Python::try_attach(|py| {
            if let Some(f) = file.take() {
                // A failing close loses nothing: the object was only read.
                let _ = f.bind(py).call_method0("close");
            }
        });
        if attached.is_none() {
            // The interpreter is gone: not even a reference count to touch.
            std::mem::forget(file);
        }
    }
}

/// Register `backend` (an object with `list(url)` and `open(url)`) as the
/// storage every URL input is read through; None unregisters.
#[pyfunction]
#[pyo3(signature = (backend))]
pub fn _set_remote(backend: Option<Py<PyAny>>) {
    remote::set_remote(backend.map(|backend| Arc::new(PyRemote { backend }) as Arc<dyn Remote>));
}
