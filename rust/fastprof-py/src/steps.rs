//! `_StepLoop` and `_LoaderIter`: the training-loop profiler's per-step
//! bookkeeping (python/fastprof/profiler/loop.py) in one C call per event.
//!
//! The Profiler asks a step lifecycle question at every batch: does a step
//! begin at this fetch, does one end here, is an optimizer step a boundary.
//! Answered in Python that was ten flags and a handful of method calls per
//! step (3.6 µs); here it is one explicit state ([`Step`]) and a few flags,
//! and a step of a quiet stretch of the schedule (no torch window, the same
//! action as the step before) is begun, counted and recorded without
//! entering Python at all. The schedule, torch windows and gating stay in
//! Python: a step that needs them calls the Profiler back (`_on_begin`,
//! `_on_end_annotation`, `_on_end`, `_on_fetched`, `_on_explicit`), and the
//! Profiler says for how many following steps it needs no call.
//!
//! Every entry point is called from a training loop and never raises: a
//! failure in a callback is reported as unraisable (`sys.unraisablehook`)
//! and the loop goes on, as the Python version warned and went on.

use crate::convert::text;
use crate::recording::lookup;
use crate::session::{surface_notices, PyHooks, Session};
use fastprof_core::record::Extra;
use fastprof_core::{clock, json, registry};
use pyo3::prelude::*;
use pyo3::types::PyString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Something outside the step loop wants the Profiler at the next step
/// boundary (a trigger: a signal, a trigger file, another rank through the
/// store; python/fastprof/always_on/). Set from any thread or a signal
/// handler; read with one relaxed load at each step's begin, so that a
/// quiet stretch of the schedule (no Python per step) still answers it at
/// the next boundary. The Profiler takes it (`_attention_take`) in `_on_begin`.
static ATTENTION: AtomicBool = AtomicBool::new(false);

/// Ask for the Profiler's attention at the next step boundary (see [`ATTENTION`]).
#[pyfunction]
pub fn _attention_set() {
    ATTENTION.store(true, Ordering::Release);
}

/// Take the request: True when one was pending (and clear it).
#[pyfunction]
pub fn _attention_take() -> bool {
    ATTENTION.load(Ordering::Relaxed) && ATTENTION.swap(false, Ordering::AcqRel)
}

/// The last anomaly found and not yet taken: (batch, duration ns, median
/// ns, MAD ns). Beside the loop, not in it: the Profiler takes it from
/// inside the loop's own callback, where the loop is borrowed.
static ANOMALY: Mutex<Option<(u64, u64, u64, u64)>> = Mutex::new(None);
/// The median of the recent judged steps, ns (0 before enough steps).
static MEDIAN_NS: AtomicU64 = AtomicU64::new(0);
/// Steps not to judge (a window just ended: its export competes for the CPU).
static HOLD: AtomicU64 = AtomicU64::new(0);

/// The last anomaly found and not yet taken (see [`ANOMALY`]), or None.
#[pyfunction]
pub fn _anomaly_take() -> Option<(u64, u64, u64, u64)> {
    ANOMALY.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The median step time of the recent judged steps in ns (0 before enough).
#[pyfunction]
pub fn _median_step_ns() -> u64 {
    MEDIAN_NS.load(Ordering::Relaxed)
}

/// Judge none of the next `steps` steps.
#[pyfunction]
pub fn _anomaly_hold(steps: u64) {
    HOLD.fetch_max(steps, Ordering::Relaxed);
}

/// A slow step, judged against the recent steps (issue #17's anomaly
/// trigger): a rolling window of step durations (ticks), its median and
/// median absolute deviation recomputed every [`StepTimes::EVERY`] steps
/// (O(window) each time, select-nth on a copy), and a step beyond both
/// `factor` x median and median + `z` x 1.4826 x MAD is an anomaly. Only
/// steps of no window (schedule level <= 1) and not first in an epoch are
/// judged or kept: a window's steps, the first batch of an epoch (workers
/// starting) and the steps held after a window (its export competing for
/// the CPU) are slow for a known reason.
struct StepTimes {
    ring: Vec<u64>,
    next: usize,
    filled: usize,
    since: u32,
    median: u64,
    mad: u64,
    factor: f64,
    z: f64,
    scratch: Vec<u64>,
    /// The last judged step was slow: a burst of slow steps is one anomaly
    /// (its first step), not one per step.
    in_burst: bool,
    /// A slow step must also be this much (ns) slower than the median: a
    /// loop of microsecond steps is noise at 3x, not an anomaly.
    min_excess_ns: u64,
}

impl StepTimes {
    const EVERY: u32 = 8;

    fn new(window: usize, factor: f64, z: f64, min_excess_ns: u64) -> Self {
        StepTimes {
            ring: vec![0; window.max(8)],
            next: 0,
            filled: 0,
            since: 0,
            median: 0,
            mad: 0,
            factor,
            z,
            scratch: Vec::with_capacity(window.max(8)),
            in_burst: false,
            min_excess_ns,
        }
    }

    fn recompute(&mut self) {
        let n = self.filled;
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.ring[..n]);
        let mid = n / 2;
        let (_, m, _) = self.scratch.select_nth_unstable(mid);
        let median = *m;
        for v in self.scratch.iter_mut() {
            *v = v.abs_diff(median);
        }
        let (_, d, _) = self.scratch.select_nth_unstable(mid);
        self.median = median;
        self.mad = *d;
    }

    /// A step of `d` ticks ended; (median, MAD) when it is an anomaly.
    /// `recomputed`: called when the median changed.
    fn observe(&mut self, d: u64, recomputed: impl FnOnce(u64)) -> Option<(u64, u64)> {
        if HOLD.load(Ordering::Relaxed) > 0 {
            let _ = HOLD.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| h.checked_sub(1));
            return None;
        }
        let cap = self.ring.len();
        let judged = self.filled >= cap / 2 && self.median > 0;
        let slow = judged && {
            let (df, med) = (d as f64, self.median as f64);
            df > self.factor * med && df > med + self.z * 1.4826 * self.mad as f64
        };
        self.ring[self.next] = d;
        self.next = (self.next + 1) % cap;
        self.filled = (self.filled + 1).min(cap);
        self.since += 1;
        let (median, mad) = (self.median, self.mad);
        let first = slow && !self.in_burst;
        self.in_burst = slow;
        if self.filled < cap || self.since >= Self::EVERY {
            self.since = 0;
            self.recompute();
            recomputed(self.median);
        }
        first.then_some((median, mad))
    }
}

/// What a train fetch is to the current step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fetch {
    /// It began the step.
    Began,
    /// The step was open with nothing fetched into it: its time starts here.
    Starts,
    /// A fetch inside a step that already fetched.
    Within,
}

/// Where the current training step is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// No step open and none waiting (before the first, after the last).
    Closed,
    /// The next step begins at the next train fetch (or the next boundary).
    Pending,
    /// A step is open. `fresh`: opened by a boundary or at start, and no
    /// batch fetched into it yet (its time starts at the first fetch).
    Open { fresh: bool },
    /// A step is open and its end is due: it ends where the next begins (the
    /// next train fetch, or where the pass ends), so that steps tile an epoch.
    EndDue,
}

/// The step lifecycle (see the module docs). Not shared across threads by
/// the Profiler (the optimizer hook checks the thread before calling).
#[pyclass(module = "fastprof._core")]
pub struct _StepLoop {
    step: Step,
    running: bool,
    /// Global step, epoch, and batch within the epoch of the next step to end.
    #[pyo3(get)]
    batch: u64,
    #[pyo3(get)]
    epoch: u64,
    #[pyo3(get)]
    batch_in_epoch: u64,
    epoch_len: Option<u64>,
    /// Train passes started; nested train passes now iterating.
    #[pyo3(get)]
    train_passes: u64,
    in_train_pass: u64,
    /// The current pass was begun by `begin_epoch` (a framework's loop).
    framework_pass: bool,
    /// The loop ends its steps itself (`step()` was called): optimizer steps don't.
    explicit: bool,
    /// An optimizer step asked for a boundary inside a user span: taken at
    /// the next fetch, `step()` or optimizer step.
    opt_pending: bool,
    /// The last optimizer step ended the step (a `step()` right after is the same boundary).
    opt_ended: bool,
    /// The torch step of the open step waits for its batch (`_on_fetched`).
    #[pyo3(get)]
    driver_due: bool,
    /// The span depth at the step's begin (an optimizer step deeper is inside a user span).
    depth: u32,
    /// Begin ticks of the open step.
    t0: u64,
    /// The open step's position and action, as its args say.
    args: (u64, u64, u64),
    action: Box<str>,
    /// The open step began without calling Python: it ends without too.
    quiet: bool,
    /// Steps after the open one that need no `_on_begin` (same action, no window).
    quiet_left: u64,
    last_level: i64,
    step_name: u32,
    action_name: u32,
    session: Option<Py<Session>>,
    hooks: Py<PyAny>,
    /// A `BaseException` that is not an `Exception` (`SystemExit`,
    /// `KeyboardInterrupt`) out of a callback: the job's own signal handler
    /// (or Ctrl-C) landed in Python code the loop called. It is the job's to
    /// decide, so it is raised from the call that ran the callback, never
    /// reported and swallowed as a profiling failure is.
    pending: Option<PyErr>,
    /// Per-step host memory (issue #16), when on.
    rss: Option<RssAtStepEnd>,
    /// Call the hooks' `_on_memory(epoch, batch, batch_in_epoch)` at every
    /// step's end, quiet ones too (the CUDA allocator's per-step statistics
    /// and state-only snapshots, read in Python).
    memory_hook: bool,
    /// The anomaly trigger's step times, when on.
    times: Option<StepTimes>,
    /// (ticks, CLOCK_MONOTONIC ns) at start, to give an anomaly in ns.
    origin: (u64, u64),
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

impl _StepLoop {
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

    /// A step begins now. `driver`: torch may be stepped now (else it waits
    /// for the batch: `_on_fetched`).
    fn open_step(&mut self, py: Python<'_>, driver: bool) {
        self.step = Step::Open { fresh: true };
        if self.quiet_left > 0 && !ATTENTION.load(Ordering::Relaxed) {
            self.quiet_left -= 1;
            self.quiet = true;
            self.driver_due = false;
        } else {
            self.quiet = false;
            let pos = (
                self.batch,
                self.epoch,
                self.batch_in_epoch,
                self.epoch_len,
                driver,
            );
            // (level, action, quiet steps after this one, driver due)
            let answer = self
                .hooks
                .bind(py)
                .call_method1("_on_begin", pos)
                .and_then(|r| r.extract::<(i64, String, u64, bool)>());
            match answer {
                Ok((level, action, quiet, due)) => {
                    if level != self.last_level {
                        if registry::is_active() {
                            registry::counter(self.action_name, level as f64, &mut PyHooks(py));
                        }
                        self.last_level = level;
                    }
                    if *self.action != *action {
                        self.action = action.into_boxed_str();
                    }
                    self.quiet_left = quiet;
                    self.driver_due = due;
                }
                Err(e) => {
                    self.failed(py, e, "step begin");
                    self.driver_due = false;
                }
            }
        }
        if let Some(s) = &self.session {
            s.get().mark_step_quiet(py, self.batch);
        }
        self.args = (self.epoch, self.batch, self.batch_in_epoch);
        self.depth = registry::thread_depth();
        self.t0 = clock::ticks();
    }

    /// The open step ends now (the caller sets the state that follows).
    /// fastprof's step N is recorded first, then torch's `ProfilerStep#N`
    /// ends (in `_on_end_annotation`): the step began after torch's began
    /// (its begin is read once `_on_begin`/`_on_fetched` stepped torch), so
    /// it nests inside it, also once the merge moves torch's ends past the
    /// Python calls they fall in (merge/nest.rs).
    fn end_step(&mut self, py: Python<'_>) {
        let (epoch, batch, bie) = self.args;
        let origin = self.origin;
        let judged = self.last_level <= 1 && bie > 0;
        if let Some(t) = self.times.as_mut().filter(|_| judged) {
            let d = clock::ticks().saturating_sub(self.t0);
            let min_excess = t.min_excess_ns;
            let found = t.observe(d, |m| {
                MEDIAN_NS.store(ticks_to_ns(origin, m), Ordering::Relaxed);
            });
            let found = found
                .filter(|&(median, _)| ticks_to_ns(origin, d.saturating_sub(median)) >= min_excess);
            if let Some((median, mad)) = found {
                let ns = |t: u64| ticks_to_ns(origin, t);
                *ANOMALY.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((batch, ns(d), ns(median), ns(mad)));
                ATTENTION.store(true, Ordering::Release);
            }
        }
        if registry::is_active() {
            surface_notices(py);
            let mut a = Vec::with_capacity(80);
            a.extend_from_slice(b"{\"epoch\":");
            json::write_int(&mut a, epoch);
            a.extend_from_slice(b",\"batch\":");
            json::write_int(&mut a, batch);
            a.extend_from_slice(b",\"batch_in_epoch\":");
            json::write_int(&mut a, bie);
            a.extend_from_slice(b",\"action\":");
            json::write_str(&mut a, &self.action);
            a.push(b'}');
            let extra = Box::new(Extra {
                args_json: Some(String::from_utf8(a).unwrap_or_default().into_boxed_str()),
                ..Default::default()
            });
            registry::complete(self.step_name, self.t0, Some(extra), &mut PyHooks(py));
            if let Some(r) = &mut self.rss {
                if let Some(bytes) = r.read() {
                    registry::counter(r.name, bytes as f64, &mut PyHooks(py));
                }
            }
        }
        if self.memory_hook {
            self.call(py, "_on_memory", (epoch, batch, bie));
        }
        if !self.quiet {
            self.call(py, "_on_end_annotation", ());
            self.call(py, "_on_end", (epoch, batch, bie));
        }
        self.batch += 1;
        self.batch_in_epoch += 1;
    }

    fn take_due_end(&mut self, py: Python<'_>) {
        if self.step == Step::EndDue {
            self.end_step(py);
            self.step = Step::Pending;
        }
    }

    fn is_open(&self) -> bool {
        matches!(self.step, Step::Open { .. } | Step::EndDue)
    }

    /// The boundary between two steps (a `step()` call or an optimizer step).
    fn boundary(&mut self, py: Python<'_>) {
        self.take_due_end(py);
        if self.step == Step::Pending {
            // A step whose begin never came (no train fetch since the last
            // boundary): it still counts, as an empty span.
            self.open_step(py, true);
        }
        if self.in_train_pass > 0 {
            // Inside a train pass the step ends where the next begins.
            self.step = if self.is_open() {
                Step::EndDue
            } else {
                Step::Pending
            };
            return;
        }
        if self.is_open() {
            self.end_step(py);
        }
        self.open_step(py, true);
    }

    /// A train loader's next() is about to block. What this fetch is to the
    /// step: [`Fetch::Began`] it, [`Fetch::Starts`] a step opened before
    /// with nothing fetched into it, or [`Fetch::Within`] it.
    fn on_fetch(&mut self, py: Python<'_>) -> Fetch {
        if self.opt_pending {
            self.opt_pending = false;
            self.boundary(py);
        }
        self.take_due_end(py);
        let fetch = match self.step {
            Step::Pending => {
                // Past the loader's known length the fetch may find it
                // exhausted: torch is stepped only once a batch came
                // (`_on_fetched`).
                let driver = self.epoch_len.is_some_and(|n| self.batch_in_epoch < n);
                self.open_step(py, driver);
                Fetch::Began
            }
            Step::Open { fresh: true } => {
                // Opened at start (or by a boundary outside a train pass) and
                // nothing fetched yet: the step starts with its first fetch.
                self.t0 = clock::ticks();
                Fetch::Starts
            }
            _ => Fetch::Within,
        };
        if let Step::Open { fresh } = &mut self.step {
            *fresh = false;
        }
        self.opt_ended = false;
        fetch
    }

    /// The fetch that began a step found the loader exhausted: that step is
    /// no step; it begins again at the next train fetch.
    fn unbegin(&mut self) {
        self.step = Step::Pending;
        self.driver_due = false;
    }

    /// The loop says where its steps end: true on the first call.
    fn go_explicit(&mut self, py: Python<'_>) -> bool {
        if self.explicit {
            return false;
        }
        self.explicit = true;
        self.call(py, "_on_explicit", ());
        true
    }

    fn leave_pass(&mut self, py: Python<'_>) {
        self.in_train_pass = self.in_train_pass.saturating_sub(1);
        if self.in_train_pass == 0 && self.running {
            self.take_due_end(py); // the loop left the pass early (break)
        }
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
        Ok(_StepLoop {
            step: Step::Closed,
            running: false,
            batch: 0,
            epoch: 0,
            batch_in_epoch: 0,
            epoch_len: None,
            train_passes: 0,
            in_train_pass: 0,
            framework_pass: false,
            explicit: false,
            opt_pending: false,
            opt_ended: false,
            driver_due: false,
            depth: 0,
            t0: 0,
            args: (0, 0, 0),
            action: "".into(),
            quiet: false,
            quiet_left: 0,
            last_level: -1,
            step_name: interned(step_name)?,
            action_name: interned(action_name)?,
            session,
            hooks,
            pending: None,
            rss: None,
            memory_hook: false,
            times: None,
            origin: (0, 0),
        })
    }

    /// Record the process's resident memory at each step's end as the
    /// counter `name` (bytes, from /proc/self/statm: one read of a file kept
    /// open). Returns None when on, else why it cannot be (no procfs).
    fn record_rss(&mut self, name: &Bound<'_, PyString>) -> PyResult<Option<String>> {
        match RssAtStepEnd::open(interned(name)?) {
            Ok(r) => {
                self.rss = Some(r);
                Ok(None)
            }
            Err(why) => Ok(Some(why)),
        }
    }

    /// Call the hooks' `_on_memory(epoch, batch, batch_in_epoch)` at every step's end (or stop).
    fn memory_hook(&mut self, on: bool) {
        self.memory_hook = on;
    }

    /// Judge every step's time against the last `window` steps (see
    /// [`StepTimes`]; the anomaly is taken with `_anomaly_take`); `window`
    /// 0 turns it off.
    /// A slow step must also be `min_excess_ns` slower than the median.
    fn anomaly_detector(&mut self, window: usize, factor: f64, z: f64, min_excess_ns: u64) {
        self.times = (window > 0).then(|| StepTimes::new(window, factor, z, min_excess_ns));
        *ANOMALY.lock().unwrap_or_else(|e| e.into_inner()) = None;
        MEDIAN_NS.store(0, Ordering::Relaxed);
        HOLD.store(0, Ordering::Relaxed);
    }

    /// Start: step 0 begins now, or at the first fetch/`begin_step` (`defer`).
    fn start(&mut self, py: Python<'_>, defer: bool) -> PyResult<()> {
        self.running = true;
        self.origin = (clock::ticks(), clock::monotonic_ns());
        if defer {
            self.step = Step::Pending;
        } else {
            self.open_step(py, true);
        }
        self.raise_pending()
    }

    /// Stop: a deferred optimizer boundary is taken, a due end ends, and the
    /// last step is recorded if anything was fetched into it. A step nothing
    /// fetched into and no boundary ended (the time after the loop, or a
    /// run of no iterations) is no step.
    fn stop(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.running {
            return self.raise_pending();
        }
        if self.opt_pending {
            self.opt_pending = false;
            self.boundary(py);
        }
        self.take_due_end(py);
        if self.step == (Step::Open { fresh: false }) {
            self.end_step(py);
        }
        self.step = Step::Closed;
        self.running = false;
        self.raise_pending()
    }

    #[getter]
    fn state(&self) -> &'static str {
        match self.step {
            Step::Closed => "closed",
            Step::Pending => "pending",
            Step::Open { fresh: true } => "open (fresh)",
            Step::Open { fresh: false } => "open",
            Step::EndDue => "end due",
        }
    }

    #[getter]
    fn explicit(&self) -> bool {
        self.explicit
    }

    /// End the current step (`Profiler.step()`). Raises only what the job's
    /// own code raised in a callback (`SystemExit`, `KeyboardInterrupt`).
    fn step(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.running {
            return self.raise_pending();
        }
        if self.go_explicit(py) {
            if self.opt_pending {
                // The optimizer's step asked for this boundary; taken here, once.
                self.opt_pending = false;
            } else if self.opt_ended {
                // The optimizer's step already ended this step.
                self.opt_ended = false;
                return self.raise_pending();
            }
        }
        self.boundary(py);
        self.raise_pending()
    }

    /// An optimizer step on the training thread (torch's global post hook).
    fn optimizer_step(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.explicit || !self.running {
            return self.raise_pending();
        }
        if self.opt_pending || registry::thread_depth() <= self.depth {
            self.opt_pending = false;
            self.boundary(py);
            self.opt_ended = true;
        } else {
            // Inside a span the user opened within the step (e.g. around
            // optimizer.step()): the boundary waits for the next train fetch,
            // step() call or optimizer step.
            self.opt_pending = true;
        }
        self.raise_pending()
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
        if !self.running {
            return self.raise_pending();
        }
        if framework && self.framework_pass {
            self.in_train_pass = self.in_train_pass.saturating_sub(1);
        }
        self.epoch_len = epoch_len.filter(|&n| n > 0);
        self.train_passes += 1;
        self.take_due_end(py);
        // A new epoch's schedule position: the next step asks Python again.
        self.quiet_left = 0;
        if self.train_passes > 1 {
            match self.step {
                // Begun outside a train pass and nothing fetched: it is this
                // epoch's first step; begin it again at the new position.
                Step::Open { fresh: true } => self.step = Step::Pending,
                Step::Open { fresh: false } => {
                    self.end_step(py);
                    self.step = Step::Closed;
                }
                _ => {}
            }
            self.epoch += 1;
            self.batch_in_epoch = 0;
            self.step = Step::Pending;
        }
        // Epoch 0: step 0 (open since start) begins at the first fetch.
        if framework {
            self.in_train_pass += 1;
            self.framework_pass = true;
        }
        self.raise_pending()
    }

    /// The pass `start_epoch(framework=True)` started is over.
    fn end_epoch(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.framework_pass {
            return self.raise_pending();
        }
        self.in_train_pass = self.in_train_pass.saturating_sub(1);
        self.framework_pass = false;
        if self.running {
            self.take_due_end(py);
            if self.is_open() && self.in_train_pass == 0 {
                self.unbegin();
            }
        }
        self.raise_pending()
    }

    /// The next step begins now if none is open (a framework's fetch).
    fn begin_step(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.running {
            return self.raise_pending();
        }
        self.go_explicit(py);
        let _ = self.on_fetch(py);
        self.raise_pending()
    }

    /// A train loader's pass begins iterating / stops iterating.
    fn enter_pass(&mut self) {
        self.in_train_pass += 1;
    }

    fn exit_pass(&mut self, py: Python<'_>) -> PyResult<()> {
        self.leave_pass(py);
        self.raise_pending()
    }
}

/// `t` ticks in ns, at the rate measured since `origin` (ticks, ns).
fn ticks_to_ns(origin: (u64, u64), t: u64) -> u64 {
    let (t0, n0) = origin;
    let (t1, n1) = (clock::ticks(), clock::monotonic_ns());
    let rate = if t1 > t0 && n1 > n0 {
        (n1 - n0) as f64 / (t1 - t0) as f64
    } else {
        1.0
    };
    (t as f64 * rate).round() as u64
}

/// What a callback left pending in `steps` (when not borrowed).
/// The process's resident set size, read at a step's end.
struct RssAtStepEnd {
    file: std::fs::File,
    page: u64,
    name: u32,
    buf: [u8; 128],
}

impl RssAtStepEnd {
    fn open(name: u32) -> Result<Self, String> {
        let file = std::fs::File::open("/proc/self/statm")
            .map_err(|e| format!("/proc/self/statm: {e}"))?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let mut r = RssAtStepEnd {
            file,
            page: u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096),
            name,
            buf: [0; 128],
        };
        r.read()
            .ok_or_else(|| "/proc/self/statm: no resident size in it".to_string())?;
        Ok(r)
    }

    /// Bytes resident now (one pread of the open file), None if unreadable.
    fn read(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(&mut self.buf, 0).ok()?;
        fastprof_core::sampler::procfs::parse_statm_rss(&self.buf[..n]).map(|p| p * self.page)
    }
}

fn pending(py: Python<'_>, steps: &Option<Py<_StepLoop>>) -> Option<PyErr> {
    let s = steps.as_ref()?;
    let mut s = s.bind(py).try_borrow_mut().ok()?;
    s.pending.take()
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
                    s.leave_pass(py);
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
                        s.enter_pass();
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
                Ok(mut s) if s.running => {
                    let fetch = s.on_fetch(py);
                    s.raise_pending()?;
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
        let item = match it.bind(py).call_method0(pyo3::intern!(py, "__next__")) {
            Ok(item) => item,
            Err(e) => {
                registry::end(false);
                if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) {
                    if fetch != Fetch::Within {
                        // The fetch that would have started a step found the
                        // loader exhausted: that step is none (no phantom
                        // step for a pass of no batches).
                        if let Some(s) = &steps {
                            if let Ok(mut s) = s.bind(py).try_borrow_mut() {
                                s.unbegin();
                            }
                        }
                    }
                    slf.borrow_mut().finish(py);
                    return pending(py, &steps).map_or(Ok(None), Err);
                }
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
                    Ok(mut st) if st.driver_due => {
                        st.driver_due = false;
                        Some(st.hooks.clone_ref(py))
                    }
                    _ => None,
                };
                // The torch step held back for this batch: `_on_fetched`
                // steps torch and says whether its window is live; the step
                // then begins after torch's ProfilerStep boundary.
                if let Some(h) = hooks {
                    match h.bind(py).call_method0("_on_fetched") {
                        Ok(live) if live.is_truthy().unwrap_or(false) => {
                            if let Ok(mut st) = s.bind(py).try_borrow_mut() {
                                st.t0 = clock::ticks();
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
