//! The hang watchdog's handle (`_core._HangWatch`, issue #37) and the stack dumper it uses:
//! CPython's `_Py_DumpTracebackThreads`, the function `faulthandler`'s own watchdog thread
//! calls, which walks every thread state of an interpreter without the GIL (so it works while
//! a thread holds the GIL in a C call). It is looked up at run time (`dlsym`): an interpreter
//! without it leaves the stacks to the Python side instead of failing the import.

use fastprof_core::runtime::hang::{Config, Event, StackDumper, Watchdog};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::time::Duration;

type DumpFn = unsafe extern "C" fn(
    libc::c_int,
    *mut ffi::PyInterpreterState,
    *mut ffi::PyThreadState,
) -> *const libc::c_char;

struct CpythonDumper {
    dump: Option<DumpFn>,
    /// The main interpreter (an address: it lives as long as the process's Python).
    interp: usize,
}

impl StackDumper for CpythonDumper {
    fn dump(&self, fd: i32) -> bool {
        let Some(f) = self.dump else { return false };
        // SAFETY: the function's documented use: from a thread that may not hold the GIL,
        // with the interpreter captured while it was held, and no current thread state.
        // It returns an error message, or NULL when it wrote the stacks.
        let err = unsafe {
            f(
                fd,
                self.interp as *mut ffi::PyInterpreterState,
                std::ptr::null_mut(),
            )
        };
        err.is_null()
    }
}

fn dumper() -> CpythonDumper {
    // SAFETY: dlsym on the process's own symbols with a NUL-terminated name; the result is
    // either NULL or the function of that name, whose signature (3.8 to 3.14) is `DumpFn`.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_Py_DumpTracebackThreads".as_ptr()) };
    let dump =
        (!sym.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, DumpFn>(sym) });
    // SAFETY: called with the GIL held (from a pyfunction).
    let interp = unsafe { ffi::PyInterpreterState_Main() } as usize;
    CpythonDumper { dump, interp }
}

/// The watchdog thread of one Profiler (see `fastprof_core::runtime::hang`). Frozen: the
/// helper thread waits in `next` (a shared borrow, without the GIL) while the Profiler's
/// close calls `stop` from another thread.
#[pyclass(module = "fastprof._core", frozen)]
pub struct _HangWatch {
    inner: Watchdog,
    stacks_native: bool,
}

#[pymethods]
impl _HangWatch {
    /// `timeout_s` 0: the default rule. `abort_status` None: report only. `sigterm_hook`: hook
    /// SIGTERM under the interpreter's handler (a rank whose main thread waits in C still
    /// writes its evidence); `sigterm_default`: then end by SIGTERM's default action.
    #[new]
    #[pyo3(signature = (rank_dir, rank, timeout_s, grace_s, poll_s, abort_status=None, abort_after_s=0.0, sigterm_hook=false, sigterm_default=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank_dir: PathBuf,
        rank: u32,
        timeout_s: f64,
        grace_s: f64,
        poll_s: f64,
        abort_status: Option<i32>,
        abort_after_s: f64,
        sigterm_hook: bool,
        sigterm_default: bool,
    ) -> PyResult<Self> {
        let secs = |s: f64| Duration::from_secs_f64(s.clamp(0.0, 1e9));
        let config = Config {
            rank_dir,
            rank,
            timeout: (timeout_s > 0.0).then(|| secs(timeout_s)),
            grace: secs(grace_s),
            poll: secs(poll_s).max(Duration::from_millis(1)),
            abort_status,
            abort_after: secs(abort_after_s),
            sigterm_hook,
            sigterm_default,
        };
        let d = dumper();
        let stacks_native = d.dump.is_some();
        let w = Watchdog::start(config, Box::new(d)).map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!("cannot start the hang watchdog: {e}"))
        })?;
        Ok(_HangWatch {
            inner: w,
            stacks_native,
        })
    }

    /// Whether stacks are read without the GIL (CPython's dumper was found).
    #[getter]
    fn stacks_native(&self) -> bool {
        self.stacks_native
    }

    /// The next event as a dict, waiting at most `wait_s` without the GIL; None if none came.
    fn next<'py>(&self, py: Python<'py>, wait_s: f64) -> PyResult<Option<Bound<'py, PyDict>>> {
        let w = &self.inner;
        let wait = Duration::from_secs_f64(wait_s.clamp(0.0, 3600.0));
        let got: Option<Event> = py.detach(|| w.next(wait));
        let Some(e) = got else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("n", e.n)?;
        d.set_item("reason", e.reason)?;
        d.set_item("request", e.request)?;
        d.set_item("step", e.step)?;
        d.set_item("stalled_s", e.stalled_s)?;
        d.set_item("timeout_s", e.timeout_s)?;
        d.set_item("typical_step_s", e.typical_step_s)?;
        d.set_item("stacks", e.stacks)?;
        d.set_item("time", e.time)?;
        Ok(Some(d))
    }

    /// `(seconds since a step last ended, the median recent step or None)`, as of the
    /// watchdog's last poll.
    fn stall(&self) -> (f64, Option<f64>) {
        self.inner.stall()
    }

    /// Whether SIGTERM is hooked now (a handler set since replaces the hook).
    #[getter]
    fn sigterm_hooked(&self) -> bool {
        self.inner.sigterm_hooked()
    }

    /// The Python side wrote event `n`'s evidence.
    fn done(&self, n: u64) {
        self.inner.done(n)
    }

    /// Take event `n` (False: the watchdog already wrote its evidence).
    fn claim(&self, n: u64) -> bool {
        self.inner.claim(n)
    }

    /// Stop and join the thread (idempotent).
    fn stop(&self, py: Python<'_>) {
        let w = &self.inner;
        py.detach(|| w.stop());
    }
}

/// The last ended step's global index as the watchdog sees it (None before the first).
#[pyfunction]
pub fn _hang_last_step() -> Option<u64> {
    fastprof_core::runtime::hang::last_step()
}

/// Python's SIGTERM handler runs: True when it is to write the evidence, False when the
/// watchdog already answered this SIGTERM (the main thread was in C when it came).
#[pyfunction]
pub fn _hang_sigterm_take() -> bool {
    fastprof_core::runtime::hang_sigterm::take_python()
}
