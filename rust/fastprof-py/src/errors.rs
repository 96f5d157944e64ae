//! The Python exception hierarchy, rooted at `FastprofError`, and the one
//! mapping from the core's error enum to it.
//!
//! Classes whose meaning matches a built-in also subclass it (a bad option is
//! a `ValueError`, a missing file a `FileNotFoundError`), which
//! `create_exception!` cannot express, so those are made at import time with
//! `type(name, (FastprofError, Builtin), {})`.

use fastprof_core::CoreError;
use pyo3::exceptions::{
    PyException, PyFileNotFoundError, PyOSError, PyPermissionError, PyRuntimeError, PyUserWarning,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

pyo3::create_exception!(
    fastprof,
    FastprofError,
    PyException,
    "Base class of every error fastprof raises."
);
pyo3::create_exception!(
    fastprof,
    FastprofWarning,
    PyUserWarning,
    "Something fastprof could not record or read; the job goes on."
);

macro_rules! dual_classes {
    ($( $static:ident, $name:literal, $builtin:ty, $doc:literal; )*) => {
        $( static $static: PyOnceLock<Py<PyType>> = PyOnceLock::new(); )*

        /// Create the dual-base classes and add every class to `m`.
        pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            m.add("FastprofError", py.get_type::<FastprofError>())?;
            m.add("FastprofWarning", py.get_type::<FastprofWarning>())?;
            let type_ = py.get_type::<PyType>();
            $(
                let bases = PyTuple::new(py, [py.get_type::<FastprofError>(), py.get_type::<$builtin>()])?;
                let ns = PyDict::new(py);
                ns.set_item("__doc__", $doc)?;
                ns.set_item("__module__", "fastprof")?;
                let cls = type_.call1(($name, bases, ns))?.cast_into::<PyType>()?;
                m.add($name, &cls)?;
                let _ = $static.set(py, cls.unbind());
            )*
            Ok(())
        }
    };
}

dual_classes! {
    CONFIG_ERROR, "ConfigError", PyValueError, "An option is invalid (also a ValueError).";
    ALREADY_RUNNING, "AlreadyRunningError", PyRuntimeError, "A recorder already runs in this process (also a RuntimeError).";
    NOT_RUNNING, "NotRunningError", PyRuntimeError, "No recorder runs (also a RuntimeError).";
    TRACE_ERROR, "TraceError", PyValueError, "A trace file cannot be read (also a ValueError).";
    NO_EVENTS, "NoEventsError", PyValueError, "A merge found no event to write: no trace files, or every event skipped or filtered out (also a ValueError).";
    FILE_NOT_FOUND, "FastprofFileNotFoundError", PyFileNotFoundError, "A file fastprof needs does not exist (also a FileNotFoundError).";
    PERMISSION, "FastprofPermissionError", PyPermissionError, "fastprof may not read or write a path (also a PermissionError).";
    OS_ERROR, "FastprofOSError", PyOSError, "Another I/O failure on a named path (also an OSError).";
}

/// Newtype so that the core's error converts with `?` in binding functions.
pub struct Error(pub CoreError);

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Self {
        Error(e)
    }
}

fn new_err(py: Python<'_>, cls: &PyOnceLock<Py<PyType>>, args: String) -> PyErr {
    match cls.get(py) {
        Some(t) => match t.bind(py).call1((args,)) {
            Ok(inst) => PyErr::from_value(inst),
            Err(e) => e,
        },
        None => FastprofError::new_err("fastprof._core is not initialised"),
    }
}

/// A `NotRunningError` with its own message.
pub fn not_running(msg: &str) -> PyErr {
    Python::attach(|py| new_err(py, &NOT_RUNNING, msg.to_string()))
}

impl From<Error> for PyErr {
    fn from(Error(e): Error) -> PyErr {
        Python::attach(|py| {
            let msg = e.to_string();
            match &e {
                CoreError::Config { .. } => new_err(py, &CONFIG_ERROR, msg),
                CoreError::AlreadyRunning { .. } => new_err(py, &ALREADY_RUNNING, msg),
                CoreError::NotRunning => new_err(py, &NOT_RUNNING, msg),
                CoreError::NoEvents { .. } => new_err(py, &NO_EVENTS, msg),
                CoreError::Cancelled => pyo3::exceptions::PyKeyboardInterrupt::new_err(msg),
                CoreError::Trace {
                    path,
                    offset,
                    reason,
                } => {
                    let err = new_err(py, &TRACE_ERROR, msg.clone());
                    let v = err.value(py);
                    let _ = v.setattr("path", path.display().to_string());
                    let _ = v.setattr("offset", *offset);
                    let _ = v.setattr("reason", reason.as_str());
                    err
                }
                CoreError::Io { path, source } => {
                    // The storage backend's own exception, when it says
                    // more as itself (see `PyIoError::reraise`).
                    if let Some(p) = source
                        .get_ref()
                        .and_then(|e| e.downcast_ref::<crate::remote::PyIoError>())
                        .filter(|p| p.reraise(py))
                    {
                        return p.err.clone_ref(py);
                    }
                    let cls = match source.kind() {
                        std::io::ErrorKind::NotFound => &FILE_NOT_FOUND,
                        std::io::ErrorKind::PermissionDenied => &PERMISSION,
                        _ => &OS_ERROR,
                    };
                    // OSError(errno, strerror, filename): keeps .errno and .filename.
                    // A cause the core wrote itself ("already exists; pass -f",
                    // "cannot write the output in DIR: Not a directory") has no
                    // errno of its own: take its kind's, never 0. The CLI tells
                    // bad input (exit 2) from a failing machine (exit 1) by it.
                    let errno = source.raw_os_error().unwrap_or(match source.kind() {
                        std::io::ErrorKind::NotFound => libc::ENOENT,
                        std::io::ErrorKind::PermissionDenied => libc::EACCES,
                        std::io::ErrorKind::AlreadyExists => libc::EEXIST,
                        std::io::ErrorKind::InvalidInput => libc::EINVAL,
                        std::io::ErrorKind::NotADirectory => libc::ENOTDIR,
                        std::io::ErrorKind::IsADirectory => libc::EISDIR,
                        std::io::ErrorKind::ReadOnlyFilesystem => libc::EROFS,
                        std::io::ErrorKind::InvalidFilename => libc::ENAMETOOLONG,
                        std::io::ErrorKind::StorageFull => libc::ENOSPC,
                        std::io::ErrorKind::QuotaExceeded => libc::EDQUOT,
                        std::io::ErrorKind::FileTooLarge => libc::EFBIG,
                        _ => libc::EIO,
                    });
                    let args = (errno, strerror(source), path.display().to_string());
                    match cls.get(py) {
                        Some(t) => match t.bind(py).call1(args) {
                            Ok(inst) => PyErr::from_value(inst),
                            Err(e) => e,
                        },
                        None => FastprofError::new_err(msg),
                    }
                }
            }
        })
    }
}

/// The cause without Rust's " (os error N)" suffix: Python's OSError shows
/// the errno itself.
fn strerror(e: &std::io::Error) -> String {
    let text = e.to_string();
    match (e.raw_os_error(), text.rfind(" (os error ")) {
        (Some(_), Some(i)) => text[..i].to_string(),
        _ => text,
    }
}
