//! The step anatomy's hot path (`python/fastprof/profiler/anatomy.py` owns
//! the hooks' installation, the learning of the outermost modules, GPU
//! timing and the status). Each phase of a training step (forward,
//! backward, the optimizer, communication) is timed here: its begin ticks,
//! its span (one complete event), and its time added to the step's row of
//! recent phase times, which the anomaly trigger reads to say which phase
//! made a step slow.
//!
//! Why in Rust: a Python wrapper per phase cost ~45k instructions a step on
//! a one-layer step (frames for the wrapper, the phase's end, the step's
//! row); the wrappers here are C calls, and they add no frame to the job's
//! traceback (an exception in backward reads as it does without fastprof).
//!
//! Only the training thread's calls are timed (a DataLoader thread's or an
//! evaluation thread's calls pass through). Every call holds the GIL, so the
//! state's mutex is never contended; it is released before calling Python
//! (the GPU marks, the optimizer-step callback).

use crate::recording::Name;
use crate::session::PyHooks;
use crate::steps::_StepLoop;
use fastprof_core::runtime::{clock, registry};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The phases, in the order of a step's row of times (communication, the
/// fourth, is timed from Python: `begin` / `done_with`).
const FORWARD: usize = 0;
const BACKWARD: usize = 1;
const OPTIMIZER: usize = 2;
const PHASES: usize = 4;

/// Steps whose phase times are kept (for `explain`).
const RECENT_STEPS: usize = 64;

/// Phases ended and not yet recorded, at most (see [`State::pending`]).
const PENDING: usize = 16;

/// What a wrapper times (see [`_Timed`]).
const KIND_BACKWARD: u8 = 0;
const KIND_ZERO_GRAD: u8 = 1;
const KIND_FORWARD: u8 = 2;

fn thread_ident() -> u64 {
    // What `threading.get_ident()` returns on Linux and macOS.
    unsafe { libc::pthread_self() as u64 }
}

#[derive(Default)]
struct State {
    /// The training thread (`threading.get_ident()`); 0: none yet.
    thread: u64,
    forward_depth: u32,
    forward_t0: u64,
    backward: bool,
    backward_t0: u64,
    zero_grad_t0: u64,
    /// An optimizer step is running (its begin ticks); 0: none.
    optimizer_t0: u64,
    /// An optimizer step's closure is running a forward or backward.
    optimizer_paused: bool,
    /// The outermost modules timed by their class's `__call__` (addresses;
    /// a few, searched in order: no hashing on the step's path).
    timed: Vec<usize>,
    /// Recent steps' phase times (ticks), oldest first.
    rows: VecDeque<(u64, [u64; PHASES])>,
    /// The step number last read from the loop (when it cannot be read now).
    last_step: u64,
    /// The step loop records the phases at each step's end
    /// ([`_PhaseClock::flush`]): a phase's end only notes its times here.
    /// Recording a span and finding its step at every phase's end cost
    /// more thread CPU than the phase's own timing: amid a training step
    /// the ring, its thread-local state and the loop are out of the caches,
    /// and at the step's end the loop records its own span in any case.
    by_loop: bool,
    /// Ended phases not yet recorded: `(phase, begin ticks, end ticks)`.
    pending: [(usize, u64, u64); PENDING],
    pending_len: usize,
}

impl State {
    fn mine(&self) -> bool {
        self.thread != 0 && self.thread == thread_ident()
    }

    fn add(&mut self, step: u64, phase: usize, ticks: u64) {
        // The current step is the last row: the search ends at once.
        if let Some(row) = self.rows.iter_mut().rev().find(|r| r.0 == step) {
            row.1[phase] += ticks;
            return;
        }
        let mut row = [0u64; PHASES];
        row[phase] = ticks;
        self.rows.push_back((step, row));
        while self.rows.len() > RECENT_STEPS {
            self.rows.pop_front();
        }
    }
}

/// A GPU mark to make once the state's lock is released.
type Mark = Option<(usize, bool)>;

/// A callable the clock calls only where one is set (the GPU timing's
/// marks, the learning's callback): the phases' path reads a flag, and
/// takes the lock only when it is set.
struct Hook {
    on: AtomicBool,
    call: Mutex<Option<Py<PyAny>>>,
}

impl Hook {
    fn new() -> Self {
        Hook {
            on: AtomicBool::new(false),
            call: Mutex::new(None),
        }
    }

    fn set(&self, call: Option<Py<PyAny>>) {
        let on = call.is_some();
        *self.call.lock().unwrap_or_else(|e| e.into_inner()) = call;
        self.on.store(on, Ordering::Relaxed);
    }

    #[inline(always)]
    fn is_set(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The callable, to call once the lock is released; None where unset.
    fn get(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        if !self.is_set() {
            return None;
        }
        self.call
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|c| c.clone_ref(py))
    }
}

/// The anatomy's clock: its state, and the phases' begins and ends.
#[pyclass(module = "fastprof._core", frozen)]
pub struct _PhaseClock {
    /// The span name of each phase.
    ids: [u32; PHASES],
    /// The phases' names, for the GPU marks (`mark(phase, end)`).
    names: [Py<PyString>; PHASES],
    /// The span from backward's begin to this rank's own gradients being
    /// ready (`grads_ready`); None: not recorded.
    grads: Option<u32>,
    state: Mutex<State>,
    /// What numbers a phase's step: the step loop (its `batch`, read
    /// directly) or a callable returning the step.
    steps: Mutex<Option<Py<PyAny>>>,
    /// `mark(phase, end)` of the GPU timing, where CUDA is used.
    gpu: Hook,
    /// Called after an optimizer step while set (the anatomy's learning).
    on_optimizer_step: Hook,
}

impl _PhaseClock {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn step(&self, py: Python<'_>, st: &mut State) -> u64 {
        let steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = steps.as_ref().map(|s| s.bind(py)) else {
            return st.last_step;
        };
        if let Ok(l) = s.cast::<_StepLoop>() {
            // Borrowed mutably while the loop runs a callback: the last step read.
            if let Ok(l) = l.try_borrow() {
                st.last_step = l.batch_number();
            }
        } else if let Ok(n) = s.call0().and_then(|n| n.extract::<u64>()) {
            st.last_step = n;
        }
        st.last_step
    }

    /// Phase `phase` ran from `t0` to now: its span, and its time in the
    /// step's row; at the step's end where the loop records them.
    fn done(&self, py: Python<'_>, st: &mut State, phase: usize, t0: u64) {
        let now = clock::ticks();
        if st.by_loop && st.pending_len < PENDING {
            st.pending[st.pending_len] = (phase, t0, now);
            st.pending_len += 1;
            return;
        }
        self.record_now(py, st, phase, t0, now);
    }

    /// A phase recorded at its end (no step loop records them).
    #[cold]
    #[inline(never)]
    fn record_now(&self, py: Python<'_>, st: &mut State, phase: usize, t0: u64, now: u64) {
        registry::complete_between(self.ids[phase], t0, now, &mut PyHooks(py));
        let step = self.step(py, st);
        st.add(step, phase, now.saturating_sub(t0));
    }

    /// `old` numbers the steps no more: what is noted is recorded, and a
    /// step loop stops recording this clock's phases.
    fn unlink(&self, py: Python<'_>, old: Option<Py<PyAny>>) {
        let lp = old
            .as_ref()
            .and_then(|o| o.bind(py).cast::<_StepLoop>().ok().cloned());
        let mut st = self.lock();
        if st.pending_len > 0 {
            // Phases end within the step the loop is in.
            if let Some(n) = lp
                .as_ref()
                .and_then(|l| l.try_borrow().ok().map(|l| l.batch_number()))
            {
                st.last_step = n;
            }
            let step = st.last_step;
            self.flush_into(py, &mut st, step);
        }
        st.by_loop = false;
        drop(st);
        if let Some(Ok(mut l)) = lp.as_ref().map(|l| l.try_borrow_mut()) {
            l.set_phase_clock(None);
        }
    }

    /// Record the ended phases noted since the last flush, as step `step`'s.
    fn flush_into(&self, py: Python<'_>, st: &mut State, step: u64) {
        let n = std::mem::take(&mut st.pending_len);
        for i in 0..n {
            let (phase, t0, t1) = st.pending[i];
            registry::complete_between(self.ids[phase], t0, t1, &mut PyHooks(py));
            st.add(step, phase, t1.saturating_sub(t0));
        }
        if n > 0 {
            st.last_step = step;
        }
    }

    /// Step `step` ended (the step loop, before it records the step's
    /// span): its phases' spans and row.
    pub(crate) fn flush(&self, py: Python<'_>, step: u64) {
        let mut st = self.lock();
        if st.pending_len > 0 {
            self.flush_into(py, &mut st, step);
        }
    }

    /// Make `marks` on the GPU timing, where there is one (false: none).
    #[inline(always)]
    fn mark(&self, py: Python<'_>, marks: &[Mark]) -> bool {
        if !self.gpu.is_set() {
            return false;
        }
        self.mark_gpu(py, marks)
    }

    /// `mark`'s GPU part: out of the phases' path (kept small for the
    /// instruction cache; most steps have no GPU timing).
    #[cold]
    #[inline(never)]
    fn mark_gpu(&self, py: Python<'_>, marks: &[Mark]) -> bool {
        if marks.iter().all(Option::is_none) {
            return false;
        }
        let Some(gpu) = self.gpu.get(py) else {
            return false;
        };
        for &(phase, end) in marks.iter().flatten() {
            // The GPU timing catches its own failures; a raise here is dropped.
            let _ = gpu.call1(py, (self.names[phase].clone_ref(py), end));
        }
        true
    }

    /// An optimizer step's span so far is recorded before a forward or
    /// backward inside it (a closure): phases never overlap.
    #[inline(always)]
    fn pause_optimizer(&self, py: Python<'_>, st: &mut State) -> Mark {
        if st.optimizer_t0 == 0 {
            return None;
        }
        self.pause_running_optimizer(py, st)
    }

    #[cold]
    #[inline(never)]
    fn pause_running_optimizer(&self, py: Python<'_>, st: &mut State) -> Mark {
        let t0 = std::mem::take(&mut st.optimizer_t0);
        self.done(py, st, OPTIMIZER, t0);
        st.optimizer_paused = true;
        Some((OPTIMIZER, true))
    }

    fn resume_optimizer(&self, st: &mut State) -> Mark {
        if !st.optimizer_paused {
            return None;
        }
        st.optimizer_paused = false;
        st.optimizer_t0 = clock::ticks();
        Some((OPTIMIZER, false))
    }

    fn forward_begin(&self, py: Python<'_>, st: &mut State) -> [Mark; 2] {
        let mut marks = [None, None];
        if st.forward_depth == 0 {
            marks[0] = self.pause_optimizer(py, st);
            marks[1] = Some((FORWARD, false));
            st.forward_t0 = clock::ticks();
        }
        st.forward_depth += 1;
        marks
    }

    fn forward_end(&self, py: Python<'_>, st: &mut State) -> [Mark; 2] {
        st.forward_depth -= 1;
        if st.forward_depth > 0 {
            return [None, None];
        }
        let t0 = st.forward_t0;
        self.done(py, st, FORWARD, t0);
        [Some((FORWARD, true)), self.resume_optimizer(st)]
    }

    /// Begin `kind`'s phase if this call is timed; false: pass it through.
    fn enter(&self, py: Python<'_>, kind: u8, target: Option<&Bound<'_, PyAny>>) -> bool {
        let mut st = self.lock();
        if !st.mine() {
            return false;
        }
        let marks: [Mark; 2] = match kind {
            KIND_BACKWARD => {
                if st.backward {
                    return false;
                }
                let m = self.pause_optimizer(py, &mut st);
                st.backward = true;
                st.backward_t0 = clock::ticks();
                [m, Some((BACKWARD, false))]
            }
            KIND_ZERO_GRAD => {
                // Inside an optimizer step (its closure), the step's span has it.
                if st.optimizer_t0 != 0 || st.zero_grad_t0 != 0 {
                    return false;
                }
                st.zero_grad_t0 = clock::ticks();
                [None, Some((OPTIMIZER, false))]
            }
            _ => {
                let key = target.map_or(0, |t| t.as_ptr() as usize);
                if st.forward_depth > 0 || !st.timed.contains(&key) {
                    return false;
                }
                self.forward_begin(py, &mut st)
            }
        };
        drop(st);
        if self.mark(py, &marks) {
            // A GPU event costs ~10 µs of host time: the phase begins after it.
            let mut st = self.lock();
            let now = clock::ticks();
            match kind {
                KIND_BACKWARD => st.backward_t0 = now,
                KIND_ZERO_GRAD => st.zero_grad_t0 = now,
                _ => st.forward_t0 = now,
            }
        }
        true
    }

    fn leave(&self, py: Python<'_>, kind: u8) {
        let mut st = self.lock();
        let marks: [Mark; 2] = match kind {
            KIND_BACKWARD => {
                st.backward = false;
                let t0 = st.backward_t0;
                self.done(py, &mut st, BACKWARD, t0);
                [Some((BACKWARD, true)), self.resume_optimizer(&mut st)]
            }
            KIND_ZERO_GRAD => {
                let t0 = std::mem::take(&mut st.zero_grad_t0);
                self.done(py, &mut st, OPTIMIZER, t0);
                [Some((OPTIMIZER, true)), None]
            }
            _ => self.forward_end(py, &mut st),
        };
        drop(st);
        self.mark(py, &marks);
    }

    fn on_optimizer_pre(&self, py: Python<'_>) {
        let mut st = self.lock();
        if !st.mine() {
            return;
        }
        st.optimizer_t0 = clock::ticks();
        st.optimizer_paused = false;
        drop(st);
        self.mark(py, &[Some((OPTIMIZER, false))]);
    }

    fn on_optimizer_post(&self, py: Python<'_>) -> PyResult<()> {
        let mut st = self.lock();
        if st.optimizer_t0 == 0 || !st.mine() {
            return Ok(());
        }
        let t0 = std::mem::take(&mut st.optimizer_t0);
        self.done(py, &mut st, OPTIMIZER, t0);
        drop(st);
        self.mark(py, &[Some((OPTIMIZER, true))]);
        if let Some(cb) = self.on_optimizer_step.get(py) {
            cb.call0(py)?;
        }
        Ok(())
    }

    /// `inner(*args)` with `args` as a vectorcall passes them, timed as
    /// `kind` where this call is timed (for a forward, `args[0]` is the
    /// module): what every timed call runs. No tuple, no dict: the
    /// arguments go through as they came.
    ///
    /// # Safety
    /// The attached thread's `args`, `nargsf` and `kwnames` of one vectorcall.
    unsafe fn vectorcall(
        &self,
        py: Python<'_>,
        kind: u8,
        inner: &Py<PyAny>,
        args: *const *mut ffi::PyObject,
        nargsf: usize,
        kwnames: *mut ffi::PyObject,
    ) -> *mut ffi::PyObject {
        let module = if kind == KIND_FORWARD && ffi::PyVectorcall_NARGS(nargsf) > 0 {
            Some(Bound::from_borrowed_ptr(py, *args))
        } else {
            None
        };
        if !self.enter(py, kind, module.as_ref()) {
            return ffi::PyObject_Vectorcall(inner.as_ptr(), args, nargsf, kwnames);
        }
        let r = ffi::PyObject_Vectorcall(inner.as_ptr(), args, nargsf, kwnames);
        if r.is_null() {
            self.leave_raised(py, kind);
        } else {
            self.leave(py, kind);
        }
        r
    }

    /// `leave` after the timed call raised: the job's exception waits while
    /// the phase ends (a GPU mark is a call).
    #[cold]
    #[inline(never)]
    fn leave_raised(&self, py: Python<'_>, kind: u8) {
        let e = PyErr::take(py);
        self.leave(py, kind);
        if let Some(e) = e {
            e.restore(py);
        }
    }
}

#[pymethods]
impl _PhaseClock {
    /// `names`: the span (a `Name`) of forward, backward, optimizer and
    /// communication; `phases`: their phase names (for the GPU marks).
    /// `grads`: the span `grads_ready` records (None: it records nothing).
    #[new]
    #[pyo3(signature = (names, phases, grads=None))]
    fn new(
        names: Vec<Bound<'_, Name>>,
        phases: Vec<Bound<'_, PyString>>,
        grads: Option<Bound<'_, Name>>,
    ) -> PyResult<Self> {
        if names.len() != PHASES || phases.len() != PHASES {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "_PhaseClock takes 4 names and 4 phases",
            ));
        }
        let ids = [0, 1, 2, 3].map(|i| names[i].get().id);
        let names = [0, 1, 2, 3].map(|i| phases[i].clone().unbind());
        Ok(_PhaseClock {
            ids,
            names,
            grads: grads.map(|g| g.get().id),
            state: Mutex::new(State::default()),
            steps: Mutex::new(None),
            gpu: Hook::new(),
            on_optimizer_step: Hook::new(),
        })
    }

    /// Time the calling thread's phases from now on.
    fn start(&self) {
        self.lock().thread = thread_ident();
    }

    /// Number the phases' steps by `steps`: the step loop (its `batch`;
    /// then the loop records the phases at each step's end) or a callable
    /// returning the step; None: the last step read.
    #[pyo3(signature = (steps=None))]
    fn set_steps(slf: &Bound<'_, Self>, steps: Option<Py<PyAny>>) {
        let py = slf.py();
        let me = slf.get();
        let old = std::mem::replace(
            &mut *me.steps.lock().unwrap_or_else(|e| e.into_inner()),
            steps.as_ref().map(|s| s.clone_ref(py)),
        );
        me.unlink(py, old);
        // A loop busy in a callback (borrowed) is not linked: each phase is
        // then recorded at its end.
        let linked = steps.as_ref().is_some_and(|s| {
            s.bind(py)
                .cast::<_StepLoop>()
                .ok()
                .and_then(|l| l.try_borrow_mut().ok())
                .map(|mut l| l.set_phase_clock(Some(slf.clone().unbind())))
                .is_some()
        });
        me.lock().by_loop = linked;
    }

    /// Time no thread from now on; forget the loop, the GPU timing and the
    /// callback (a wrapper still installed somewhere passes through).
    fn stop(&self, py: Python<'_>) {
        let mut st = self.lock();
        st.thread = 0;
        st.timed.clear();
        drop(st);
        let old = self.steps.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.unlink(py, old);
        self.gpu.set(None);
        self.on_optimizer_step.set(None);
    }

    /// The GPU timing's `mark(phase, end)`, or None.
    #[pyo3(signature = (mark=None))]
    fn set_gpu(&self, mark: Option<Py<PyAny>>) {
        self.gpu.set(mark);
    }

    /// `callback()` after each optimizer step recorded, or None.
    #[pyo3(signature = (callback=None))]
    fn set_on_optimizer_step(&self, callback: Option<Py<PyAny>>) {
        self.on_optimizer_step.set(callback);
    }

    /// Time `module`'s calls by its class's `__call__` (a [`_Timed`] forward).
    fn time_module(&self, module: &Bound<'_, PyAny>) {
        let key = module.as_ptr() as usize;
        let mut st = self.lock();
        if !st.timed.contains(&key) {
            st.timed.push(key);
        }
    }

    /// A forward begins (the hooks' forward: nested calls count once); a
    /// module forward pre-hook (its arguments are not used).
    #[pyo3(signature = (*_args))]
    fn forward_pre(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) {
        let mut st = self.lock();
        if !st.mine() {
            return;
        }
        let marks = self.forward_begin(py, &mut st);
        drop(st);
        self.mark(py, &marks);
    }

    /// A forward ends (pairs with `forward_pre`); a module forward hook.
    #[pyo3(signature = (*_args))]
    fn forward_post(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) {
        let mut st = self.lock();
        if st.forward_depth == 0 || !st.mine() {
            return;
        }
        let marks = self.forward_end(py, &mut st);
        drop(st);
        self.mark(py, &marks);
    }

    /// A parameter's gradient was accumulated (a post-accumulate-grad hook
    /// on the parameter accumulated last in backward): inside a timed
    /// backward, the span from its begin to now, this rank's own gradients
    /// ready before DDP's all-reduce holds it. Any thread (the autograd
    /// engine's on a GPU).
    fn grads_ready(&self, py: Python<'_>, _param: &Bound<'_, PyAny>) {
        let Some(id) = self.grads else {
            return;
        };
        let st = self.lock();
        if !st.backward || st.thread == 0 {
            return;
        }
        let t0 = st.backward_t0;
        drop(st);
        registry::complete(id, t0, None, &mut PyHooks(py));
    }

    /// A timed outermost module's call begins (true), or passes through.
    fn enter_forward(&self, py: Python<'_>, module: &Bound<'_, PyAny>) -> bool {
        self.enter(py, KIND_FORWARD, Some(module))
    }

    /// The step loop records the phases at each step's end (see
    /// [`State::by_loop`]); false: each at its end.
    #[getter]
    fn by_loop(&self) -> bool {
        self.lock().by_loop
    }

    /// A forward runs on the training thread.
    #[getter]
    fn forward_depth(&self) -> u32 {
        self.lock().forward_depth
    }

    /// torch's optimizer step hooks to register: `(pre, post)`, builtin
    /// functions (C closures whose self is this clock) that torch calls by
    /// vectorcall with `(optimizer, args, kwargs)`, not read. A pyo3
    /// method's call (its trampoline and argument parsing) cost more
    /// thread CPU at every step than the phase's own work.
    fn optimizer_hooks<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        Ok((
            OPTIMIZER_PRE.bind(slf.as_any())?,
            OPTIMIZER_POST.bind(slf.as_any())?,
        ))
    }

    /// An optimizer step is running (its span begun, not paused).
    #[getter]
    fn optimizer_running(&self) -> bool {
        self.lock().optimizer_t0 != 0
    }

    /// Phase `phase` begins on the training thread (communication, from
    /// Python): its begin ticks (0 on another thread: not timed). An
    /// optimizer step around it is paused for a forward or backward.
    fn begin(&self, py: Python<'_>, phase: usize) -> u64 {
        let mut st = self.lock();
        if !st.mine() || phase >= PHASES {
            return 0;
        }
        let paused = match phase {
            FORWARD | BACKWARD => self.pause_optimizer(py, &mut st),
            _ => None,
        };
        drop(st);
        self.mark(py, &[paused, Some((phase, false))]);
        clock::ticks()
    }

    /// Phase `phase` begun at `t0` ended: its span (with `args`), its time
    /// in the step's row.
    #[pyo3(signature = (phase, t0, args=None))]
    fn done_with(
        &self,
        py: Python<'_>,
        phase: usize,
        t0: u64,
        args: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        if phase >= PHASES || t0 == 0 {
            return Ok(());
        }
        match args {
            None => registry::complete(self.ids[phase], t0, None, &mut PyHooks(py)),
            Some(a) => {
                let x = Box::new(fastprof_core::runtime::record::Extra {
                    args_json: crate::convert::args_json(a),
                    ..Default::default()
                });
                registry::complete(self.ids[phase], t0, Some(x), &mut PyHooks(py));
            }
        }
        let mut st = self.lock();
        let step = self.step(py, &mut st);
        st.add(step, phase, clock::ticks().saturating_sub(t0));
        drop(st);
        self.mark(py, &[Some((phase, true))]);
        Ok(())
    }

    /// The recent steps' phase times: `[(step, (forward, backward,
    /// optimizer, communication))]` in ticks, oldest first.
    fn rows(&self) -> Vec<(u64, (u64, u64, u64, u64))> {
        self.lock()
            .rows
            .iter()
            .map(|(s, r)| (*s, (r[0], r[1], r[2], r[3])))
            .collect()
    }

    /// An outermost module class's timed `__call__`: `(method, function)`,
    /// where `function` is a builtin function (a C closure) that times the
    /// calls of the modules given to `time_module` and passes every other
    /// call to `inner`, and `method` binds it like a function when set on a
    /// class. A builtin, so that Dynamo can be given a Python stand-in to
    /// trace in its place (`torch.compiler.substitute_in_graph`).
    fn forward_call<'py>(
        slf: &Bound<'py, Self>,
        inner: Py<PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let py = slf.py();
        let timed = _Timed::new(py, slf.clone().unbind(), KIND_FORWARD, inner)?;
        let f = FORWARD_CALL.bind(timed.as_any())?;
        let m = unsafe { PyInstanceMethod_New(f.as_ptr()) };
        let m = unsafe { Bound::from_owned_ptr_or_err(py, m)? };
        Ok((m, f))
    }

    /// A wrapper of `inner` that times backward (`"backward"`) or an
    /// optimizer's `zero_grad` (`"zero_grad"`); an outermost module's call
    /// is `forward_call`'s.
    fn wrap(slf: &Bound<'_, Self>, kind: &str, inner: Py<PyAny>) -> PyResult<Py<_Timed>> {
        let kind = match kind {
            "backward" => KIND_BACKWARD,
            "zero_grad" => KIND_ZERO_GRAD,
            _ => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "no such timed call: {kind:?}"
                )))
            }
        };
        Ok(_Timed::new(slf.py(), slf.clone().unbind(), kind, inner)?.unbind())
    }
}

extern "C" {
    /// CPython's bound method constructor (pyo3-ffi does not declare it).
    fn PyMethod_New(
        func: *mut pyo3::ffi::PyObject,
        obj: *mut pyo3::ffi::PyObject,
    ) -> *mut pyo3::ffi::PyObject;
    /// CPython's `instancemethod`: binds any callable like a function.
    fn PyInstanceMethod_New(func: *mut pyo3::ffi::PyObject) -> *mut pyo3::ffi::PyObject;
}

/// A timed call: `inner(*args, **kwargs)` inside its phase on the training
/// thread, passed through elsewhere. A method when set on a class (it binds
/// like a function). Adds no frame to a traceback.
///
/// Called by vectorcall (CPython's call without an argument tuple): pyo3
/// gives a class's `__call__` only the tuple-and-dict protocol, which cost
/// a tuple, a dict and their unpacking at every timed call; so the type's
/// call slot is set here, once, to vectorcall through `vectorcall`, the
/// instance's first field.
#[pyclass(module = "fastprof._core", frozen)]
#[repr(C)]
pub struct _Timed {
    vectorcall: ffi::vectorcallfunc,
    clock: Py<_PhaseClock>,
    kind: u8,
    inner: Py<PyAny>,
}

/// A C function's static method table (the forward's `__call__`, the
/// optimizer hooks).
struct MethodDef(ffi::PyMethodDef);
// SAFETY: read-only after construction; CPython only reads it.
unsafe impl Sync for MethodDef {}

impl MethodDef {
    /// A builtin function of this table whose self is `slf`.
    fn bind<'py>(&'static self, slf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: a static method table; the function holds `slf` as its self.
        unsafe {
            Bound::from_owned_ptr_or_err(
                slf.py(),
                ffi::PyCMethod_New(
                    &self.0 as *const ffi::PyMethodDef as *mut ffi::PyMethodDef,
                    slf.as_ptr(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                ),
            )
        }
    }
}

static FORWARD_CALL: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"__call__".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFastWithKeywords: forward_fast,
    },
    ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
    ml_doc: c"An outermost module's call, timed by fastprof's step anatomy.".as_ptr(),
});

static OPTIMIZER_PRE: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"optimizer_pre".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFast: optimizer_pre_fast,
    },
    ml_flags: ffi::METH_FASTCALL,
    ml_doc: c"torch's optimizer step pre-hook of fastprof's step anatomy.".as_ptr(),
});

static OPTIMIZER_POST: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"optimizer_post".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunctionFast: optimizer_post_fast,
    },
    ml_flags: ffi::METH_FASTCALL,
    ml_doc: c"torch's optimizer step post-hook of fastprof's step anatomy.".as_ptr(),
});

/// `optimizer_hooks`' pre-hook: its self is the clock; torch's arguments
/// (optimizer, args, kwargs) are not read.
unsafe extern "C" fn optimizer_pre_fast(
    slf: *mut ffi::PyObject,
    _args: *mut *mut ffi::PyObject,
    _nargs: ffi::Py_ssize_t,
) -> *mut ffi::PyObject {
    optimizer_hook(slf, |c, py| {
        c.on_optimizer_pre(py);
        Ok(())
    })
}

/// `optimizer_hooks`' post-hook (as the pre-hook); a raise of the learning's
/// callback goes to torch's step, as a hook's does.
unsafe extern "C" fn optimizer_post_fast(
    slf: *mut ffi::PyObject,
    _args: *mut *mut ffi::PyObject,
    _nargs: ffi::Py_ssize_t,
) -> *mut ffi::PyObject {
    optimizer_hook(slf, |c, py| c.on_optimizer_post(py))
}

/// A hook's body on the clock `slf`: None, or NULL with its error set.
///
/// # Safety
/// CPython's call of a builtin: attached, with its self (a `_PhaseClock`) alive.
#[inline(always)]
unsafe fn optimizer_hook(
    slf: *mut ffi::PyObject,
    body: impl FnOnce(&_PhaseClock, Python<'_>) -> PyResult<()>,
) -> *mut ffi::PyObject {
    let py = Python::assume_attached();
    let clock = Bound::from_borrowed_ptr(py, slf);
    match body(clock.cast_unchecked::<_PhaseClock>().get(), py) {
        Ok(()) => {
            ffi::Py_IncRef(ffi::Py_None());
            ffi::Py_None()
        }
        Err(e) => {
            e.restore(py);
            std::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn forward_fast(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    timed_call(slf, args, nargs as usize, kwnames)
}

/// `_Timed`'s vectorcall.
unsafe extern "C" fn timed_call(
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a vectorcall attached, with a live `_Timed`.
    let py = Python::assume_attached();
    let timed = Bound::from_borrowed_ptr(py, callable);
    let t = timed.cast_unchecked::<_Timed>().get();
    t.clock
        .get()
        .vectorcall(py, t.kind, &t.inner, args, nargsf, kwnames)
}

/// `_Timed`'s descriptor get: bound to an instance like a function (a
/// bound method), itself when read from the class.
unsafe extern "C" fn timed_get(
    slf: *mut ffi::PyObject,
    obj: *mut ffi::PyObject,
    _owner: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    if obj.is_null() || obj == ffi::Py_None() {
        ffi::Py_IncRef(slf);
        return slf;
    }
    PyMethod_New(slf, obj)
}

impl _Timed {
    fn new<'py>(
        py: Python<'py>,
        clock: Py<_PhaseClock>,
        kind: u8,
        inner: Py<PyAny>,
    ) -> PyResult<Bound<'py, _Timed>> {
        let t = Bound::new(
            py,
            _Timed {
                vectorcall: timed_call,
                clock,
                kind,
                inner,
            },
        )?;
        let offset =
            (&t.get().vectorcall as *const ffi::vectorcallfunc as isize) - (t.as_ptr() as isize);
        let tp = t.get_type().as_type_ptr();
        // SAFETY: the type is ours and the GIL is held; every instance has
        // the same layout, so the offset found on the first holds for all.
        unsafe {
            if (*tp).tp_vectorcall_offset == 0 {
                (*tp).tp_vectorcall_offset = offset as ffi::Py_ssize_t;
                (*tp).tp_call = Some(ffi::PyVectorcall_Call);
                (*tp).tp_flags |= ffi::Py_TPFLAGS_HAVE_VECTORCALL;
                // Binding (`optimizer.zero_grad`) at every call: in C, as a
                // function binds, not through pyo3's `__get__` trampoline.
                (*tp).tp_descr_get = Some(timed_get);
                ffi::PyType_Modified(tp);
            } else if (*tp).tp_vectorcall_offset != offset as ffi::Py_ssize_t {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "fastprof._core._Timed: instances differ in layout",
                ));
            }
        }
        Ok(t)
    }
}

#[pymethods]
impl _Timed {
    /// `__call__` as a method (`timed.__call__(...)`): calls go by vectorcall;
    /// this is the slot's named form, which the type's dict keeps.
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__(
        slf: &Bound<'_, Self>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let kw = kwargs.map_or(std::ptr::null_mut(), |k| k.as_ptr());
        // SAFETY: an instance exists, so the type's vectorcall is set.
        unsafe {
            Bound::from_owned_ptr_or_err(
                py,
                ffi::PyVectorcall_Call(slf.as_ptr(), args.as_ptr(), kw),
            )
            .map(Bound::unbind)
        }
    }

    /// Bound to an instance like a function (`optimizer.zero_grad()`).
    fn __get__(
        slf: &Bound<'_, Self>,
        obj: Option<&Bound<'_, PyAny>>,
        _owner: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        match obj {
            Some(o) if !o.is_none() => {
                let m = unsafe { PyMethod_New(slf.as_ptr(), o.as_ptr()) };
                Ok(unsafe { Bound::from_owned_ptr_or_err(py, m)? }.unbind())
            }
            _ => Ok(slf.clone().into_any().unbind()),
        }
    }

    /// The wrapped call (`inspect.unwrap`, `inspect.signature`).
    #[getter]
    fn __wrapped__(&self, py: Python<'_>) -> Py<PyAny> {
        self.inner.clone_ref(py)
    }

    /// Everything else (`__name__`, `__qualname__`, `__doc__`...) is the wrapped call's.
    fn __getattr__(&self, py: Python<'_>, name: &Bound<'_, PyString>) -> PyResult<Py<PyAny>> {
        Ok(self.inner.bind(py).getattr(name)?.unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let inner = self
            .inner
            .bind(py)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_default();
        format!("<timed by fastprof's step anatomy: {inner}>")
    }
}
