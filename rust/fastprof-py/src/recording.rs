//! The recording calls: interned `Name`s (reusable context managers, no
//! allocation per use), `ArgSpan`s for spans with args, and the module-level
//! `span`/`instant`/`counter`/`name_id` that pick the fast or slow path.

use crate::convert::{args_json, counter_json, text};
use crate::session::{surface_notices, PyHooks};
use fastprof_core::runtime::record::{Extra, NAME_IN_EXTRA};
use fastprof_core::runtime::registry::ThreadHooks;
use fastprof_core::runtime::{names, registry};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString};
use std::sync::atomic::{AtomicBool, Ordering};

/// An interned name: `with name:` records a span, and the same object serves
/// `instant(name)` and `counter(name, v)`. Immutable and stateless (the open
/// span lives in the thread's ring), so one object is shared by every thread.
#[pyclass(frozen, module = "fastprof._core")]
pub struct Name {
    pub(crate) id: u32,
    name: Py<PyString>,
}

#[pymethods]
impl Name {
    fn __enter__<'py>(slf: &Bound<'py, Self>) -> Bound<'py, Self> {
        registry::begin(slf.get().id, &mut PyHooks(slf.py()));
        slf.clone()
    }

    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        registry::end(exc_type.is_some_and(|t| !t.is_none()));
        false
    }

    /// Open the span without a `with` block (close it with `fastprof.end()`):
    /// one C call each way, for the hottest loops.
    fn begin(slf: &Bound<'_, Self>) {
        registry::begin(slf.get().id, &mut PyHooks(slf.py()));
    }

    /// Use as a decorator: `@fastprof.span("name")`.
    fn __call__(slf: &Bound<'_, Self>, func: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        decorate(slf.as_any(), func)
    }

    /// Open this span as an async span keyed by `key` (the asyncio task):
    /// what `@fastprof.span` does for a coroutine function.
    fn _async_begin(slf: &Bound<'_, Self>, key: u64) {
        let x = Box::new(Extra {
            async_id: key,
            ..Default::default()
        });
        registry::async_event(true, slf.get().id, x, &mut PyHooks(slf.py()));
    }

    #[pyo3(signature = (key, exception=false))]
    fn _async_end(slf: &Bound<'_, Self>, key: u64, exception: bool) {
        async_end(slf.py(), slf.get().id, key, exception);
    }

    #[getter]
    fn name(&self, py: Python<'_>) -> Py<PyString> {
        self.name.clone_ref(py)
    }

    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "fastprof.Name({:?}, id={})",
            self.name.bind(py).to_string(),
            self.id
        )
    }
}

/// A span with args (or with a name the interner had no room for). Made per
/// call; each `__enter__` hands the writer its own copy of the args.
#[pyclass(frozen, module = "fastprof._core")]
pub struct ArgSpan {
    id: u32,
    name: Option<Box<str>>,
    args: Option<Box<str>>,
}

impl ArgSpan {
    fn extra(&self) -> Box<Extra> {
        Box::new(Extra {
            name: self.name.clone(),
            args_json: self.args.clone(),
            ..Default::default()
        })
    }
}

#[pymethods]
impl ArgSpan {
    fn __enter__<'py>(slf: &Bound<'py, Self>) -> Bound<'py, Self> {
        let me = slf.get();
        registry::begin_extra(me.id, me.extra(), &mut PyHooks(slf.py()));
        slf.clone()
    }

    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        registry::end(exc_type.is_some_and(|t| !t.is_none()));
        false
    }

    fn __call__(slf: &Bound<'_, Self>, func: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        decorate(slf.as_any(), func)
    }

    fn _async_begin(slf: &Bound<'_, Self>, key: u64) {
        let me = slf.get();
        let mut x = me.extra();
        x.async_id = key;
        registry::async_event(true, me.id, x, &mut PyHooks(slf.py()));
    }

    #[pyo3(signature = (key, exception=false))]
    fn _async_end(slf: &Bound<'_, Self>, key: u64, exception: bool) {
        async_end(slf.py(), slf.get().id, key, exception);
    }
}

/// The end of an async span (the writer finds its begin by key).
fn async_end(py: Python<'_>, id: u32, key: u64, exception: bool) {
    let x = Box::new(Extra {
        async_id: key,
        // The end's flags travel in its args; the name is the begin's.
        args_json: exception.then(|| "{\"exception\":true}".into()),
        ..Default::default()
    });
    registry::async_event(false, id, x, &mut PyHooks(py));
}

/// Wrap `func` so each call runs inside `span` (written in Python, where
/// `functools.wraps` and coroutine handling belong).
fn decorate(span: &Bound<'_, PyAny>, func: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let py = span.py();
    Ok(py
        .import("fastprof.recording.decorate")?
        .call_method1("wrap", (span, func))?
        .unbind())
}

/// A context manager whose enter and exit do nothing: the floor that the
/// span benchmark measures `with name:` against (same Python machinery,
/// no recording).
#[pyclass(frozen, module = "fastprof._core")]
pub struct _NullSpan;

#[pymethods]
impl _NullSpan {
    #[new]
    fn new() -> Self {
        _NullSpan
    }

    fn __enter__<'py>(slf: &Bound<'py, Self>) -> Bound<'py, Self> {
        slf.clone()
    }

    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        let _ = exc_type;
        false
    }
}

/// str -> Name, so a span by string costs one dict lookup (str hashes are cached).
static CACHE: PyOnceLock<Py<PyDict>> = PyOnceLock::new();

/// The interned `Name` for `s`, or `None` if the interner is full.
pub(crate) fn lookup<'py>(s: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, Name>>> {
    let py = s.py();
    let cache = CACHE.get_or_init(py, || PyDict::new(py).unbind()).bind(py);
    if let Some(hit) = cache.get_item(s)? {
        return Ok(Some(hit.cast_into::<Name>()?));
    }
    let text = text(s);
    let Some(id) = names::intern(&text) else {
        return Ok(None);
    };
    let name = Bound::new(
        py,
        Name {
            id,
            name: s.clone().unbind(),
        },
    )?;
    cache.set_item(s, &name)?;
    Ok(Some(name))
}

enum Target<'py> {
    Interned(Bound<'py, Name>),
    Owned(Box<str>),
}

/// What a name argument refers to; `None` for something that is not a name
/// (a recording call then drops its event and counts it, see [`bad_value`]).
fn target<'py>(name: &Bound<'py, PyAny>) -> PyResult<Option<Target<'py>>> {
    if let Ok(n) = name.cast::<Name>() {
        return Ok(Some(Target::Interned(n.clone())));
    }
    let Ok(s) = name.cast::<PyString>() else {
        return Ok(None);
    };
    Ok(Some(match lookup(s)? {
        Some(n) => Target::Interned(n),
        None => Target::Owned(text(s).into()),
    }))
}

/// A recording call got a value it cannot record: drop it, count it, and say
/// so once per process (a `FastprofWarning`, never an exception: a recording
/// call must not take a training step down).
#[cold]
fn bad_value(py: Python<'_>, what: impl FnOnce() -> String) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    registry::note_replaced();
    if !WARNED.swap(true, Ordering::Relaxed) {
        PyHooks(py).warn(&format!(
            "{}; the event was dropped and counted (otherData.replaced_values). \
             Further such values are counted without a warning",
            what()
        ));
    }
}

/// [`target`], or `None` after dropping and counting the event of a
/// recording call (`call`) whose name is not a name.
fn target_or_drop<'py>(
    py: Python<'py>,
    name: &Bound<'py, PyAny>,
    call: &str,
) -> PyResult<Option<Target<'py>>> {
    let t = target(name)?;
    if t.is_none() {
        bad_value(py, || {
            format!(
                "fastprof.{call}() got a {} as its name (a str or fastprof.Name is expected)",
                type_name(name)
            )
        });
    }
    Ok(t)
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

fn id_and_name(t: Target<'_>) -> (u32, Option<Box<str>>) {
    match t {
        Target::Interned(n) => (n.get().id, None),
        Target::Owned(s) => (NAME_IN_EXTRA, Some(s)),
    }
}

/// `span(name, **args)`: the shared `Name` when there are no args, else an `ArgSpan`.
#[pyfunction]
#[pyo3(signature = (name, **args))]
pub fn span<'py>(
    name: &Bound<'py, PyAny>,
    args: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = name.py();
    surface_notices(py);
    let args = args.and_then(args_json);
    let Some(t) = target_or_drop(py, name, "span")? else {
        return Ok(Bound::new(py, _NullSpan)?.into_any());
    };
    match (t, args) {
        (Target::Interned(n), None) => Ok(n.into_any()),
        (t, args) => {
            let (id, name) = id_and_name(t);
            Ok(Bound::new(py, ArgSpan { id, name, args })?.into_any())
        }
    }
}

/// The interned `Name` for a str (for hot loops: look it up once, reuse it).
#[pyfunction]
pub fn name_id<'py>(name: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match target(name)? {
        Some(Target::Interned(n)) => Ok(n.into_any()),
        Some(Target::Owned(_)) => Err(PyTypeError::new_err(
            "fastprof's name table is full; use fastprof.span(str) instead",
        )),
        None => Err(PyTypeError::new_err(format!(
            "a fastprof name must be a str or fastprof.Name, not {}",
            type_name(name)
        ))),
    }
}

/// Close this thread's innermost open span (pairs with `Name.begin()`).
#[pyfunction]
pub fn end() {
    registry::end(false);
}

/// A span `name` (with `args`) from `begin_ticks` (read with `_ticks()` on
/// this thread) to now, recorded at once (see `registry::complete`).
#[pyfunction]
#[pyo3(signature = (name, begin_ticks, **args))]
pub fn _complete(
    name: &Bound<'_, PyAny>,
    begin_ticks: u64,
    args: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    if let Some((id, extra)) = named_extra(name, args, "span")? {
        registry::complete(id, begin_ticks, extra, &mut PyHooks(name.py()));
    }
    Ok(())
}

/// The interned id of `name` and the extra (an un-interned name, args) of
/// an event about to be recorded; None when nothing records or `name` is
/// dropped (counted).
fn named_extra(
    name: &Bound<'_, PyAny>,
    args: Option<&Bound<'_, PyDict>>,
    what: &str,
) -> PyResult<Option<(u32, Option<Box<Extra>>)>> {
    surface_notices(name.py());
    if !registry::is_active() {
        return Ok(None);
    }
    let args = args.and_then(args_json);
    let Some(t) = target_or_drop(name.py(), name, what)? else {
        return Ok(None);
    };
    let (id, owned) = id_and_name(t);
    let extra = (owned.is_some() || args.is_some()).then(|| {
        Box::new(Extra {
            name: owned,
            args_json: args,
            ..Default::default()
        })
    });
    Ok(Some((id, extra)))
}

/// The recorder's clock now, in its own ticks (for `_complete`).
#[pyfunction]
pub fn _ticks() -> u64 {
    fastprof_core::runtime::clock::ticks()
}

/// A point event.
#[pyfunction]
#[pyo3(signature = (name, **args))]
pub fn instant(name: &Bound<'_, PyAny>, args: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    if let Some((id, extra)) = named_extra(name, args, "instant")? {
        registry::instant(id, extra, &mut PyHooks(name.py()));
    }
    Ok(())
}

/// A counter sample: a number, or a mapping of series name to number.
#[pyfunction]
pub fn counter(name: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
    surface_notices(name.py());
    if !registry::is_active() {
        return Ok(());
    }
    let py = name.py();
    let Some(t) = target_or_drop(py, name, "counter")? else {
        return Ok(());
    };
    let (id, owned) = id_and_name(t);
    match (value.extract::<f64>(), owned) {
        (Ok(v), None) => registry::counter(id, v, &mut PyHooks(py)),
        (Ok(v), Some(owned)) => {
            let mut a = Vec::new();
            a.extend_from_slice(b"{\"value\":");
            fastprof_core::json::write_f64(&mut a, v);
            a.push(b'}');
            let args = String::from_utf8(a).unwrap_or_default().into_boxed_str();
            let x = Box::new(Extra {
                name: Some(owned),
                args_json: Some(args),
                ..Default::default()
            });
            registry::counter_extra(id, x, &mut PyHooks(py))
        }
        (Err(_), owned) => {
            let series = if value.hasattr("items").unwrap_or(false) {
                counter_json(value)
            } else {
                None
            };
            let Some(series) = series else {
                bad_value(py, || {
                    format!(
                        "fastprof.counter() got a {} as its value (a number or a mapping of \
                         names to numbers is expected)",
                        type_name(value)
                    )
                });
                return Ok(());
            };
            let x = Box::new(Extra {
                name: owned,
                args_json: Some(series),
                ..Default::default()
            });
            registry::counter_extra(id, x, &mut PyHooks(py))
        }
    }
    Ok(())
}
