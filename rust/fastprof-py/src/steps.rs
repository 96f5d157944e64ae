//! `_StepLoop` and `_LoaderIter`: the Python face of the core's step
//! machine (`fastprof_core::runtime::steps`), one C call per loop event.
//!
//! The machine decides where steps begin and end; this module only
//! converts: [`PyHost`] answers the machine's questions by calling the
//! Profiler back (`_on_begin`, `_on_end_annotation`, `_on_end`,
//! `_on_explicit`, `_on_memory`; `_on_fetched` from the loader) and records
//! each step (its span, the RSS counter, the action level). A step of a
//! quiet stretch of the schedule enters no Python at all.
//!
//! Every entry point is called from a training loop and never raises a
//! profiling failure: a failure in a callback is reported as unraisable
//! (`sys.unraisablehook`) and the loop goes on. What the job's own code
//! raised inside a callback (`SystemExit`, `KeyboardInterrupt`, its signal
//! handler's exception) is raised from the call that ran the callback.

use crate::anatomy::_PhaseClock;
use crate::convert::text;
use crate::recording::lookup;
use crate::session::{surface_notices, PyHooks, Session};
use fastprof_core::runtime::steps::rss::StepRss;
use fastprof_core::runtime::steps::{self, Ended, Fetch, Plan, Position, StepHost, StepMachine};
use fastprof_core::runtime::{clock, registry};
use pyo3::prelude::*;
use pyo3::types::PyString;

/// Ask for the Profiler's attention at the next step boundary (a trigger).
#[pyfunction]
pub fn _attention_set() {
    steps::attention_set();
}

/// Take the request: True when one was pending (and clear it).
#[pyfunction]
pub fn _attention_take() -> bool {
    steps::attention_take()
}

/// The last anomaly found and not yet taken: (batch, duration ns, median
/// ns, MAD ns), or None.
#[pyfunction]
pub fn _anomaly_take() -> Option<(u64, u64, u64, u64)> {
    steps::anomaly_take().map(|a| (a.batch, a.duration_ns, a.median_ns, a.mad_ns))
}

/// The median step time of the recent judged steps in ns (0 before enough).
#[pyfunction]
pub fn _median_step_ns() -> u64 {
    steps::median_step_ns()
}

/// Judge none of the next `steps` steps.
#[pyfunction]
pub fn _anomaly_hold(steps: u64) {
    steps::hold(steps);
}

fn report(py: Python<'_>, e: PyErr, what: &str) {
    let msg = PyString::new(py, &format!("fastprof: Profiler {what}"));
    e.write_unraisable(py, Some(msg.as_any()));
}

/// A callback's exception is a profiling failure (reported, and the loop
/// goes on) unless it is not an `Exception` (`SystemExit`,
/// `KeyboardInterrupt`) or the job's own signal handler raised it while the
/// callback ran (`fastprof._signals.is_job`): those are the job's outcome.
fn profiling_failure(py: Python<'_>, e: &PyErr) -> bool {
    e.is_instance_of::<pyo3::exceptions::PyException>(py)
        && !py
            .import("fastprof._signals")
            .and_then(|m| m.call_method1("is_job", (e.value(py), e.traceback(py))))
            .and_then(|r| r.is_truthy())
            .unwrap_or(false)
}

fn interned(name: &Bound<'_, PyString>) -> PyResult<u32> {
    match lookup(name)? {
        Some(n) => Ok(n.get().id),
        None => Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
            "fastprof's name table is full: cannot intern {}",
            text(name)
        ))),
    }
}

/// Everything the step machine's host needs that is not the machine.
struct LoopIo {
    step_name: u32,
    action_name: u32,
    session: Option<Py<Session>>,
    hooks: Py<PyAny>,
    /// A `BaseException` that is not an `Exception` (`SystemExit`,
    /// `KeyboardInterrupt`) out of a callback, or the job's own signal
    /// handler's: it is the job's to decide, so it is raised from the call
    /// that ran the callback, never reported and swallowed as a profiling
    /// failure is.
    pending: Option<PyErr>,
    /// Per-step host memory (issue #16), when on.
    /// The counter's name and its reader (`record_rss`).
    rss: Option<(u32, StepRss)>,
    /// Call the hooks' `_on_memory(epoch, batch, batch_in_epoch)` at every
    /// step's end, quiet ones too (the CUDA allocator's per-step statistics
    /// and state-only snapshots, read in Python).
    memory_hook: bool,
    /// The step anatomy's clock, whose phases this loop records at each
    /// step's end (linked by `_PhaseClock.set_steps`).
    phases: Option<Py<_PhaseClock>>,
}

impl LoopIo {
    fn call<'py, A>(&mut self, py: Python<'py>, method: &str, args: A)
    where
        A: pyo3::call::PyCallArgs<'py>,
    {
        if let Err(e) = self.hooks.bind(py).call_method1(method, args).map(|_| ()) {
            self.failed(py, e, method);
        }
    }

    /// A callback raised: a profiling failure is reported (the job goes
    /// on); anything else is kept for [`Self::raise_pending`].
    fn failed(&mut self, py: Python<'_>, e: PyErr, what: &str) {
        if profiling_failure(py, &e) {
            report(py, e, what);
        } else if self.pending.is_none() {
            self.pending = Some(e);
        }
    }

    /// End of a Python-facing call: raise what a callback left pending.
    fn raise_pending(&mut self) -> PyResult<()> {
        match self.pending.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn host<'a, 'py>(&'a mut self, py: Python<'py>) -> PyHost<'a, 'py> {
        PyHost { py, io: self }
    }
}

/// The step machine's host: the Profiler's callbacks and the recorder.
struct PyHost<'a, 'py> {
    py: Python<'py>,
    io: &'a mut LoopIo,
}

impl StepHost for PyHost<'_, '_> {
    fn begin(&mut self, at: Position, epoch_len: Option<u64>, driver: bool) -> Option<Plan> {
        let py = self.py;
        let pos = (at.batch, at.epoch, at.batch_in_epoch, epoch_len, driver);
        // (level, action, quiet steps after this one, driver due)
        let answer = self
            .io
            .hooks
            .bind(py)
            .call_method1("_on_begin", pos)
            .and_then(|r| r.extract::<(i64, Bound<'_, PyString>, u64, bool)>())
            .and_then(|(level, action, quiet, driver_due)| {
                Ok(Plan {
                    level,
                    action: interned(&action)?,
                    quiet,
                    driver_due,
                })
            });
        match answer {
            Ok(plan) => Some(plan),
            Err(e) => {
                self.io.failed(py, e, "step begin");
                None
            }
        }
    }

    fn level(&mut self, level: i64) {
        if registry::is_active() {
            registry::counter(self.io.action_name, level as f64, &mut PyHooks(self.py));
        }
    }

    fn mark(&mut self, batch: u64) {
        if let Some(s) = &self.io.session {
            s.get().mark_step_quiet(self.py, batch);
        }
    }

    /// fastprof's step N is recorded first, then torch's `ProfilerStep#N`
    /// ends (in `_on_end_annotation`): the step began after torch's began,
    /// so it nests inside it, also once the merge moves torch's ends past
    /// the Python calls they fall in (merge/nest.rs).
    fn ended(&mut self, s: &Ended) {
        let py = self.py;
        let Position {
            epoch,
            batch,
            batch_in_epoch: bie,
        } = s.at;
        if let Some(c) = &self.io.phases {
            // The step's phases, before its span and anything that reads them.
            c.get().flush(py, batch);
        }
        if registry::is_active() {
            surface_notices(py);
            let args = registry::StepArgs {
                epoch,
                batch,
                batch_in_epoch: bie,
                action: s.action,
            };
            registry::step_complete(self.io.step_name, s.t0, args, &mut PyHooks(py));
            if let Some((name, r)) = &mut self.io.rss {
                if let Some(bytes) = r.at_step_end(clock::ticks) {
                    registry::counter(*name, bytes as f64, &mut PyHooks(py));
                }
            }
        }
        if self.io.memory_hook {
            self.io.call(py, "_on_memory", (epoch, batch, bie));
        }
        if !s.quiet {
            self.io.call(py, "_on_end_annotation", ());
            self.io.call(py, "_on_end", (epoch, batch, bie));
        }
    }

    fn explicit(&mut self) {
        self.io.call(self.py, "_on_explicit", ());
    }

    fn depth(&self) -> u32 {
        registry::thread_depth()
    }
}

/// The step lifecycle of the Profiler's loop (see the module docs). Not
/// shared across threads by the Profiler (the optimizer hook checks the
/// thread before calling).
#[pyclass(module = "fastprof._core")]
pub struct _StepLoop {
    m: StepMachine,
    io: LoopIo,
}

impl _StepLoop {
    /// The loop's step number (`batch`), for the anatomy's clock.
    pub(crate) fn batch_number(&self) -> u64 {
        self.m.position().batch
    }

    /// Record `clock`'s phases at each step's end (None: no more).
    pub(crate) fn set_phase_clock(&mut self, clock: Option<Py<_PhaseClock>>) {
        self.io.phases = clock;
    }

    /// Run `f` on the machine with its host, then raise what a callback left.
    fn drive(
        &mut self,
        py: Python<'_>,
        f: impl FnOnce(&mut StepMachine, &mut PyHost<'_, '_>),
    ) -> PyResult<()> {
        f(&mut self.m, &mut self.io.host(py));
        self.io.raise_pending()
    }
}

#[pymethods]
impl _StepLoop {
    /// `hooks`: the Profiler (its `_on_*` methods); `session`: the recorder's
    /// session, for the step marker (None when none records).
    #[new]
    fn new(
        hooks: Py<PyAny>,
        session: Option<Py<Session>>,
        step_name: &Bound<'_, PyString>,
        action_name: &Bound<'_, PyString>,
    ) -> PyResult<Self> {
        let none = interned(&PyString::new(step_name.py(), ""))?;
        Ok(_StepLoop {
            m: StepMachine::new(none),
            io: LoopIo {
                step_name: interned(step_name)?,
                action_name: interned(action_name)?,
                session,
                hooks,
                pending: None,
                rss: None,
                memory_hook: false,
                phases: None,
            },
        })
    }

    #[getter]
    fn batch(&self) -> u64 {
        self.m.position().batch
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.m.position().epoch
    }

    #[getter]
    fn batch_in_epoch(&self) -> u64 {
        self.m.position().batch_in_epoch
    }

    #[getter]
    fn train_passes(&self) -> u64 {
        self.m.train_passes()
    }

    #[getter]
    fn driver_due(&self) -> bool {
        self.m.driver_due()
    }

    #[getter]
    fn state(&self) -> &'static str {
        self.m.state()
    }

    #[getter]
    fn explicit(&self) -> bool {
        self.m.explicit()
    }

    /// Record the process's resident memory at steps' ends as the counter
    /// `name` (bytes, from /proc/self/statm: one read of a file kept open),
    /// within the core's budget (`fastprof_core::runtime::steps::rss`: every step
    /// longer than 20 reads gets its own). Returns None when on, else why it
    /// cannot be (no procfs).
    fn record_rss(&mut self, name: &Bound<'_, PyString>) -> PyResult<Option<String>> {
        let name = interned(name)?;
        match StepRss::open() {
            Ok(r) => {
                self.io.rss = Some((name, r));
                Ok(None)
            }
            Err(why) => Ok(Some(why)),
        }
    }

    /// Call the hooks' `_on_memory(epoch, batch, batch_in_epoch)` at every step's end (or stop).
    fn memory_hook(&mut self, on: bool) {
        self.io.memory_hook = on;
    }

    /// Judge every step's time against the last `window` steps (the anomaly
    /// is taken with `_anomaly_take`); `window` 0 turns it off. A slow step
    /// must also be `min_excess_ns` slower than the median.
    fn anomaly_detector(&mut self, window: usize, factor: f64, z: f64, min_excess_ns: u64) {
        self.m.anomaly_detector(window, factor, z, min_excess_ns);
    }

    /// Start: step 0 begins now, or at the first fetch/`begin_step` (`defer`).
    fn start(&mut self, py: Python<'_>, defer: bool) -> PyResult<()> {
        self.drive(py, |m, h| m.start(h, defer))
    }

    /// Stop: the last step is recorded if anything was fetched into it.
    fn stop(&mut self, py: Python<'_>) -> PyResult<()> {
        self.drive(py, |m, h| m.stop(h))
    }

    /// End the current step (`Profiler.step()`). Raises only what the job's
    /// own code raised in a callback (`SystemExit`, `KeyboardInterrupt`).
    fn step(&mut self, py: Python<'_>) -> PyResult<()> {
        self.drive(py, |m, h| m.step(h))
    }

    /// An optimizer step on the training thread (torch's global post hook).
    fn optimizer_step(&mut self, py: Python<'_>) -> PyResult<()> {
        self.drive(py, |m, h| m.optimizer_step(h))
    }

    /// A train pass starts (a loader's pass, or `begin_epoch`); `epoch_len`
    /// its number of batches when known.
    #[pyo3(signature = (epoch_len, framework=false))]
    fn start_epoch(
        &mut self,
        py: Python<'_>,
        epoch_len: Option<u64>,
        framework: bool,
    ) -> PyResult<()> {
        self.drive(py, |m, h| m.start_epoch(h, epoch_len, framework))
    }

    /// The pass `start_epoch(framework=True)` started is over.
    fn end_epoch(&mut self, py: Python<'_>) -> PyResult<()> {
        self.drive(py, |m, h| m.end_epoch(h))
    }

    /// The next step begins now if none is open (a framework's fetch).
    fn begin_step(&mut self, py: Python<'_>) -> PyResult<()> {
        self.drive(py, |m, h| m.begin_step(h))
    }

    /// A train loader's pass begins iterating / stops iterating.
    fn enter_pass(&mut self) {
        self.m.enter_pass();
    }

    fn exit_pass(&mut self, py: Python<'_>) -> PyResult<()> {
        self.drive(py, |m, h| m.exit_pass(h))
    }
}

/// The iterator's next item, None once it is exhausted. An iterator's
/// `tp_iternext` is called directly (what a `for` loop does), not looked up
/// as a method; anything else is asked for `__next__`, as before.
fn next_item<'py>(it: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = it.py();
    // SAFETY: PyIter_Check only reads the object's type slots.
    if unsafe { pyo3::ffi::PyIter_Check(it.as_ptr()) } != 0 {
        // SAFETY: `it` is an iterator (checked above), the GIL is held;
        // PyIter_Next returns a new reference, or NULL when exhausted (a
        // StopIteration is cleared) or failed (an exception is set).
        let p = unsafe { pyo3::ffi::PyIter_Next(it.as_ptr()) };
        if p.is_null() {
            return PyErr::take(py).map_or(Ok(None), Err);
        }
        // SAFETY: a new, non-null reference that we now own.
        return Ok(Some(unsafe { Bound::from_owned_ptr(py, p) }));
    }
    match it.call_method0(pyo3::intern!(py, "__next__")) {
        Ok(item) => Ok(Some(item)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a callback left pending in `steps` (when not borrowed).
fn pending(py: Python<'_>, steps: &Option<Py<_StepLoop>>) -> Option<PyErr> {
    let s = steps.as_ref()?;
    let mut s = s.bind(py).try_borrow_mut().ok()?;
    s.io.pending.take()
}

/// One pass over a loader (what `Profiler.loader()` returns): times each
/// `next()` as `loader.<name>.next` plus a `loader.<name>.wait_ms` counter
/// and, for a train pass, tells the step loop where steps begin. Set up
/// lazily at the first `next()` (`setup(iterable)` returns the iterator), as
/// a generator would be.
#[pyclass(module = "fastprof._core")]
pub struct _LoaderIter {
    iterable: Option<Py<PyAny>>,
    setup: Option<Py<PyAny>>,
    it: Option<Py<PyAny>>,
    steps: Option<Py<_StepLoop>>,
    next_name: u32,
    wait_name: u32,
    entered: bool,
    done: bool,
}

impl _LoaderIter {
    fn finish(&mut self, py: Python<'_>) {
        if self.done {
            return;
        }
        self.done = true;
        self.it = None;
        if self.entered {
            if let Some(s) = &self.steps {
                if let Ok(mut s) = s.bind(py).try_borrow_mut() {
                    let s = &mut *s;
                    s.m.exit_pass(&mut s.io.host(py));
                }
            }
        }
    }
}

#[pymethods]
impl _LoaderIter {
    /// `steps`: the step loop for a train pass, None for any other loader.
    #[new]
    fn new(
        iterable: Py<PyAny>,
        setup: Py<PyAny>,
        steps: Option<Py<_StepLoop>>,
        next_name: &Bound<'_, PyString>,
        wait_name: &Bound<'_, PyString>,
    ) -> PyResult<Self> {
        Ok(_LoaderIter {
            iterable: Some(iterable),
            setup: Some(setup),
            it: None,
            steps,
            next_name: interned(next_name)?,
            wait_name: interned(wait_name)?,
            entered: false,
            done: false,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        let (it, steps) = {
            let mut me = slf.try_borrow_mut()?;
            if me.done {
                return Ok(None);
            }
            if me.it.is_none() {
                let (Some(iterable), Some(setup)) = (me.iterable.take(), me.setup.take()) else {
                    return Ok(None);
                };
                let it = match setup.bind(py).call1((iterable,)) {
                    Ok(it) => it.unbind(),
                    Err(e) => {
                        me.done = true;
                        return Err(e);
                    }
                };
                me.it = Some(it);
                if let Some(s) = &me.steps {
                    if let Ok(mut s) = s.bind(py).try_borrow_mut() {
                        s.m.enter_pass();
                    }
                    me.entered = true;
                }
            }
            (
                me.it.as_ref().map(|i| i.clone_ref(py)),
                me.steps.as_ref().map(|s| s.clone_ref(py)),
            )
        };
        let Some(it) = it else { return Ok(None) };
        let fetch = match &steps {
            Some(s) => match s.bind(py).try_borrow_mut() {
                Ok(mut s) => {
                    let s = &mut *s;
                    let fetch = s.m.fetch(&mut s.io.host(py));
                    s.io.raise_pending()?;
                    fetch
                }
                _ => Fetch::Within,
            },
            None => Fetch::Within,
        };
        let (next_name, wait_name) = {
            let me = slf.borrow();
            (me.next_name, me.wait_name)
        };
        let t0 = std::time::Instant::now();
        registry::begin(next_name, &mut PyHooks(py));
        let item = match next_item(it.bind(py)) {
            Ok(Some(item)) => item,
            Ok(None) => {
                registry::end(false);
                if fetch != Fetch::Within {
                    // The fetch that would have started a step found the
                    // loader exhausted: that step is none (no phantom step
                    // for a pass of no batches).
                    if let Some(s) = &steps {
                        if let Ok(mut s) = s.bind(py).try_borrow_mut() {
                            s.m.unbegin();
                        }
                    }
                }
                slf.borrow_mut().finish(py);
                return pending(py, &steps).map_or(Ok(None), Err);
            }
            Err(e) => {
                registry::end(false);
                slf.borrow_mut().finish(py);
                return Err(e);
            }
        };
        registry::end(false);
        if registry::is_active() {
            let ms = t0.elapsed().as_nanos() as f64 * 1e-6;
            registry::counter(wait_name, ms, &mut PyHooks(py));
        }
        if fetch == Fetch::Began {
            if let Some(s) = &steps {
                let hooks = match s.bind(py).try_borrow_mut() {
                    Ok(mut st) => st.m.take_driver_due().then(|| st.io.hooks.clone_ref(py)),
                    _ => None,
                };
                // The torch step held back for this batch: `_on_fetched`
                // steps torch and says whether its window is live; the step
                // then begins after torch's ProfilerStep boundary.
                if let Some(h) = hooks {
                    match h.bind(py).call_method0("_on_fetched") {
                        Ok(live) if live.is_truthy().unwrap_or(false) => {
                            if let Ok(mut st) = s.bind(py).try_borrow_mut() {
                                st.m.restart_clock(clock::ticks());
                            }
                        }
                        Ok(_) => {}
                        Err(e) if profiling_failure(py, &e) => report(py, e, "loader fetch"),
                        Err(e) => return Err(e), // the job's own (see _StepLoop::pending)
                    }
                }
            }
        }
        Ok(Some(item.unbind()))
    }

    /// Leave the pass now (the loop broke out of it); also on garbage collection.
    fn close(&mut self, py: Python<'_>) {
        self.finish(py);
    }
}

impl Drop for _LoaderIter {
    fn drop(&mut self) {
        if !self.done && self.entered {
            // Dropped by the interpreter: often while the job's exception
            // unwinds the frame that held this iterator (the loop body
            // raised), with that exception set. Finishing the pass may end
            // the step and call the Profiler back; Python must not run with
            // an exception set (it took that exception for the callback's,
            // reported it as unraisable and crashed), so it is set aside
            // for the callbacks and given back unchanged.
            Python::attach(|py| {
                let _job = PendingException::set_aside(py);
                self.finish(py);
            });
        }
    }
}

/// The exception the interpreter has set on this thread, taken off for
/// the life of the guard and restored when it drops (see
/// `_LoaderIter::drop`). Rust code that may run while one is set (a
/// `tp_dealloc`) calls into Python only under this guard.
struct PendingException<'py> {
    py: Python<'py>,
    err: Option<PyErr>,
}

impl<'py> PendingException<'py> {
    fn set_aside(py: Python<'py>) -> Self {
        PendingException {
            py,
            err: PyErr::take(py),
        }
    }
}

impl Drop for PendingException<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.err.take() {
            // A failure under the guard was reported (unraisable); whatever
            // a callback left set is cleared so the job's own comes back.
            let _ = PyErr::take(self.py);
            e.restore(self.py);
        }
    }
}
