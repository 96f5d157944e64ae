//! `_ActionClock`: spans opened and closed by name (`start("x")` ...
//! `stop("x")`), the interface framework profilers call (Lightning's
//! `Profiler.start/stop(action_name)`), at the cost of one C call each way.
//!
//! A framework calls these for every hook of every batch, so they are C
//! methods the integration binds as the profiler's own `start`/`stop`: a
//! Python method in between would cost more than the recording (measured in
//! benches/bench_lightning.py). Each action is recorded whole at its stop
//! (`registry::complete`), so starts and stops of different actions need not
//! nest, and a stop never closes another action's span; an action started
//! again before its stop keeps a stack of begin ticks.

use crate::convert::text;
use crate::recording::lookup;
use crate::session::{surface_notices, PyHooks};
use fastprof_core::runtime::record::{Extra, NAME_IN_EXTRA};
use fastprof_core::runtime::{clock, registry};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

struct Action {
    id: u32,
    /// The name itself when the interner had no room (recorded in the extra).
    owned: Option<Box<str>>,
    /// Begin ticks of the starts not yet stopped, innermost last.
    starts: Vec<u64>,
    /// Called (no arguments) before the action's begin is read.
    on_start: Option<Py<PyAny>>,
    /// Called (no arguments) after the action's span is recorded.
    on_stop: Option<Py<PyAny>>,
}

/// Named actions timed by `start(name)`/`stop(name)` (see the module docs).
/// Not shared across threads: an action's span goes to the thread that
/// stops it.
#[pyclass(module = "fastprof._core")]
pub struct _ActionClock {
    /// action str -> index into `actions` (a dict: str hashes are cached, so a
    /// lookup hashes nothing).
    index: Py<PyDict>,
    actions: Vec<Action>,
}

impl _ActionClock {
    fn slot(&mut self, name: &Bound<'_, PyString>) -> PyResult<usize> {
        let index = self.index.bind(name.py());
        if let Some(i) = index.get_item(name)? {
            return i.extract();
        }
        let (id, owned) = match lookup(name)? {
            Some(n) => (n.get().id, None),
            None => (NAME_IN_EXTRA, Some(text(name).into())),
        };
        let i = self.actions.len();
        self.actions.push(Action {
            id,
            owned,
            starts: Vec::new(),
            on_start: None,
            on_stop: None,
        });
        index.set_item(name, i)?;
        Ok(i)
    }
}

/// Run a hook; its failure is reported as unraisable, never raised into the
/// framework's loop.
fn call_hook(py: Python<'_>, hook: Option<Py<PyAny>>) {
    if let Some(h) = hook {
        if let Err(e) = h.call0(py) {
            e.write_unraisable(py, Some(h.bind(py)));
        }
    }
}

/// Start action `find` picks (one borrow of the clock when it has no hook).
fn start_with(
    slf: &Bound<'_, _ActionClock>,
    find: impl FnOnce(&mut _ActionClock) -> PyResult<usize>,
) -> PyResult<()> {
    let py = slf.py();
    let (i, hook) = {
        let mut me = slf.borrow_mut();
        let i = find(&mut me)?;
        let a = &mut me.actions[i];
        match &a.on_start {
            None => {
                a.starts.push(clock::ticks());
                return Ok(());
            }
            Some(h) => (i, h.clone_ref(py)),
        }
    };
    // The hook runs with the clock released: it may use the clock itself.
    call_hook(py, Some(hook));
    slf.borrow_mut().actions[i].starts.push(clock::ticks());
    Ok(())
}

/// Stop action `find` picks: record its span, then run its hook.
fn stop_with(
    slf: &Bound<'_, _ActionClock>,
    find: impl FnOnce(&mut _ActionClock) -> PyResult<usize>,
) -> PyResult<()> {
    let py = slf.py();
    let hook = {
        let mut me = slf.borrow_mut();
        let i = find(&mut me)?;
        let a = &mut me.actions[i];
        if let Some(t0) = a.starts.pop() {
            if registry::is_active() {
                surface_notices(py);
                let extra = a.owned.as_ref().map(|n| {
                    Box::new(Extra {
                        name: Some(n.clone()),
                        ..Default::default()
                    })
                });
                registry::complete(a.id, t0, extra, &mut PyHooks(py));
            }
        }
        match &a.on_stop {
            None => return Ok(()),
            Some(h) => h.clone_ref(py),
        }
    };
    call_hook(py, Some(hook));
    Ok(())
}

/// What `_ActionClock.profile(name)` returns: enter starts the action, exit
/// stops it (also when the body raised).
#[pyclass(frozen, module = "fastprof._core")]
pub struct _ActionScope {
    clock: Py<_ActionClock>,
    index: usize,
    name: Py<PyString>,
}

#[pymethods]
impl _ActionScope {
    fn __enter__(&self, py: Python<'_>) -> PyResult<Py<PyString>> {
        start_with(self.clock.bind(py), |_| Ok(self.index))?;
        Ok(self.name.clone_ref(py))
    }

    #[pyo3(signature = (_exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        // A failed stop is reported, never raised over the body's own outcome.
        if let Err(e) = stop_with(self.clock.bind(py), |_| Ok(self.index)) {
            e.write_unraisable(py, None);
        }
        false
    }
}

#[pymethods]
impl _ActionClock {
    #[new]
    fn new(py: Python<'_>) -> Self {
        _ActionClock {
            index: PyDict::new(py).unbind(),
            actions: Vec::new(),
        }
    }

    /// Begin `name` now (after its `on_start` hook, if any).
    fn start(slf: &Bound<'_, Self>, name: &Bound<'_, PyString>) -> PyResult<()> {
        start_with(slf, |me| me.slot(name))
    }

    /// End `name`'s innermost start and record its span (then its `on_stop`
    /// hook). A stop without a start records nothing.
    fn stop(slf: &Bound<'_, Self>, name: &Bound<'_, PyString>) -> PyResult<()> {
        stop_with(slf, |me| me.slot(name))
    }

    /// A context manager timing `name` (``with clock.profile(name):``), for
    /// a framework's ``profile(action)``: one lookup, then one C call each way.
    fn profile(slf: &Bound<'_, Self>, name: &Bound<'_, PyString>) -> PyResult<_ActionScope> {
        let index = slf.borrow_mut().slot(name)?;
        Ok(_ActionScope {
            clock: slf.clone().unbind(),
            index,
            name: name.clone().unbind(),
        })
    }

    /// Set (or clear, with None) the callables run at `name`'s start (before
    /// its begin is read) and stop (after its span is recorded).
    #[pyo3(signature = (name, on_start=None, on_stop=None))]
    fn hook(
        &mut self,
        name: &Bound<'_, PyString>,
        on_start: Option<Py<PyAny>>,
        on_stop: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        let i = self.slot(name)?;
        self.actions[i].on_start = on_start;
        self.actions[i].on_stop = on_stop;
        Ok(())
    }

    /// Forget the starts not yet stopped (at the end of a framework's run).
    fn clear(&mut self) {
        for a in &mut self.actions {
            a.starts.clear();
        }
    }

    /// Actions started but not yet stopped.
    fn open(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let mut out = Vec::new();
        for (k, v) in self.index.bind(py).iter() {
            if !self.actions[v.extract::<usize>()?].starts.is_empty() {
                out.push(k.extract()?);
            }
        }
        Ok(out)
    }

    /// Every action name this clock has seen, in first-seen order.
    fn names<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        self.index.bind(py).keys()
    }
}
