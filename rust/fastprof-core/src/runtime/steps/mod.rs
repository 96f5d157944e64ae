//! The training loop's step machine: where each step begins and ends, and
//! what the schedule wants at each one.
//!
//! The Profiler asks a step lifecycle question at every batch: does a step
//! begin at this fetch, does one end here, is an optimizer step a boundary.
//! This module answers them with one explicit state ([`Step`]) per loop, an
//! explicit mode for who ends steps ([`Mode`]), and no I/O of its own:
//! everything a transition does outside the machine (ask the schedule,
//! record the step, call the Profiler back) goes through [`StepHost`], which
//! the Python binding implements and the unit tests replace with a log.
//!
//! A step of a quiet stretch of the schedule (no torch window, the same
//! action as the step before) is begun, counted and ended without asking
//! the host's schedule: the host said, at the last step it was asked, for
//! how many following steps it needs no call ([`Plan::quiet`]).
//!
//! Steps tile a train pass: inside a pass a boundary (`step()`, an
//! optimizer step) only makes the open step's end due, and the step ends
//! where the next begins (the next train fetch) or where the pass ends.

mod anomaly;
pub mod rss;
#[cfg(test)]
mod tests;

pub use anomaly::{
    anomaly_take, attention_pending, attention_set, attention_take, hold, median_step_ns, Anomaly,
    StepTimes,
};

use crate::runtime::clock;

/// Where the loop is: the global step, its epoch, and the batch within the
/// epoch of the next step to end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    pub batch: u64,
    pub epoch: u64,
    pub batch_in_epoch: u64,
}

/// The schedule's answer for a step that begins (the host's `begin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The action's level (0 none .. 3 active and save); a change is recorded.
    pub level: i64,
    /// The action's interned name id (the step span's `args.action`).
    pub action: u32,
    /// Following steps that need no `begin` (same action, no window).
    pub quiet: u64,
    /// The torch step waits for this step's batch (the loader's fetch
    /// calls the host once the batch came).
    pub driver_due: bool,
}

/// A step that ended, as the host records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    pub at: Position,
    /// Begin ticks.
    pub t0: u64,
    pub action: u32,
    /// It began without asking the host: it ends without calling it back.
    pub quiet: bool,
}

/// What the machine needs from outside. Every method is called on the
/// training thread, in the order the transitions happen; none may fail
/// (a host reports its own failures and goes on).
pub trait StepHost {
    /// A step begins at `at` (`epoch_len`: the pass's batches when known);
    /// `driver`: torch may be stepped now. None: the host failed to answer
    /// (the step goes on with the previous action).
    fn begin(&mut self, at: Position, epoch_len: Option<u64>, driver: bool) -> Option<Plan>;
    /// The schedule's action level changed.
    fn level(&mut self, level: i64);
    /// Step `batch` began (the recorder's step marker).
    fn mark(&mut self, batch: u64);
    /// A step ended: record it and call back whoever needs it.
    fn ended(&mut self, step: &Ended);
    /// The loop said where its steps end (`step()` or a framework's
    /// `begin_step`), the first time.
    fn explicit(&mut self);
    /// Spans open on the training thread now.
    fn depth(&self) -> u32;
    /// Now, in ticks.
    fn ticks(&self) -> u64 {
        clock::ticks()
    }
}

/// What a train fetch is to the current step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// It began the step.
    Began,
    /// The step was open with nothing fetched into it: its time starts here.
    Starts,
    /// A fetch inside a step that already fetched.
    Within,
}

/// An open step: what its span and args will say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Opened {
    at: Position,
    t0: u64,
    /// Begun without asking the host (a quiet step of the schedule).
    quiet: bool,
    /// Its torch step waits for its batch.
    driver_due: bool,
}

/// Where the current training step is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Not running: before start, after stop.
    Closed,
    /// Running, no step open: the next begins at the next train fetch (or
    /// the next boundary).
    Pending,
    /// A step is open. `fresh`: opened by a boundary or at start, and no
    /// batch fetched into it yet (its time starts at the first fetch).
    Open { fresh: bool, step: Opened },
    /// A step is open and its end is due: it ends where the next begins (the
    /// next train fetch, or where the pass ends), so that steps tile an epoch.
    EndDue(Opened),
}

/// An optimizer step's effect on the step boundaries, while steps are
/// inferred from optimizer steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opt {
    /// Nothing pending.
    Idle,
    /// An optimizer step inside a span the user opened within the step: the
    /// boundary waits for the next train fetch, `step()` or optimizer step.
    Pending,
    /// The last optimizer step ended the step: a `step()` right after is
    /// the same boundary.
    Ended,
}

/// Who ends steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Optimizer steps (until the loop calls `step()`).
    Inferred(Opt),
    /// The loop (`step()`, a framework's `begin_step`); optimizer steps don't.
    Explicit,
}

/// The step lifecycle of one training loop (see the module docs).
pub struct StepMachine {
    step: Step,
    mode: Mode,
    pos: Position,
    epoch_len: Option<u64>,
    /// Train passes started; nested train passes now iterating.
    train_passes: u64,
    in_train_pass: u64,
    /// The current pass was begun by `start_epoch(framework)` (a framework's loop).
    framework_pass: bool,
    /// The span depth at the last step's begin (an optimizer step deeper is
    /// inside a user span).
    depth: u32,
    /// Steps after the open one that need no `begin` (same action, no window).
    quiet_left: u64,
    last_level: i64,
    action: u32,
    /// The slow-step detector, when on.
    times: Option<StepTimes>,
    /// (ticks, CLOCK_MONOTONIC ns) at start, to give an anomaly in ns.
    origin: (u64, u64),
}

impl StepMachine {
    /// A machine whose steps say `action` until the host names one.
    pub fn new(action: u32) -> Self {
        StepMachine {
            step: Step::Closed,
            mode: Mode::Inferred(Opt::Idle),
            pos: Position::default(),
            epoch_len: None,
            train_passes: 0,
            in_train_pass: 0,
            framework_pass: false,
            depth: 0,
            quiet_left: 0,
            last_level: -1,
            action,
            times: None,
            origin: (0, 0),
        }
    }

    // ------------------------------------------------------------ queries

    /// The global step, epoch and batch within the epoch of the next step to end.
    pub fn position(&self) -> Position {
        self.pos
    }

    pub fn train_passes(&self) -> u64 {
        self.train_passes
    }

    /// Between `start` and `stop`.
    pub fn running(&self) -> bool {
        self.step != Step::Closed
    }

    /// The loop ends its steps itself.
    pub fn explicit(&self) -> bool {
        self.mode == Mode::Explicit
    }

    /// The open step's torch step waits for its batch.
    pub fn driver_due(&self) -> bool {
        matches!(self.step, Step::Open { step, .. } | Step::EndDue(step) if step.driver_due)
    }

    /// The state, in words (for tests and error messages).
    pub fn state(&self) -> &'static str {
        match self.step {
            Step::Closed => "closed",
            Step::Pending => "pending",
            Step::Open { fresh: true, .. } => "open (fresh)",
            Step::Open { fresh: false, .. } => "open",
            Step::EndDue(_) => "end due",
        }
    }

    fn is_open(&self) -> bool {
        matches!(self.step, Step::Open { .. } | Step::EndDue(_))
    }

    // -------------------------------------------------------- configuring

    /// Judge every step's time against the last `window` steps (see
    /// [`StepTimes`]); `window` 0 turns it off. Either way the process-wide
    /// anomaly, median and hold start afresh.
    pub fn anomaly_detector(&mut self, window: usize, factor: f64, z: f64, min_excess_ns: u64) {
        self.times = (window > 0).then(|| StepTimes::new(window, factor, z, min_excess_ns));
        anomaly::reset();
    }

    // -------------------------------------------------- the loop's events

    /// Start: step 0 begins now, or at the first fetch/`begin_step` (`defer`).
    pub fn start(&mut self, host: &mut dyn StepHost, defer: bool) {
        self.origin = (clock::ticks(), clock::monotonic_ns());
        if defer {
            self.step = Step::Pending;
        } else {
            self.open_step(host, true);
        }
    }

    /// Stop: a deferred optimizer boundary is taken, a due end ends, and the
    /// last step is recorded if anything was fetched into it. A step nothing
    /// fetched into and no boundary ended (the time after the loop, or a
    /// run of no iterations) is no step.
    pub fn stop(&mut self, host: &mut dyn StepHost) {
        if !self.running() {
            return;
        }
        self.take_pending_optimizer_boundary(host);
        self.take_due_end(host);
        if let Step::Open { fresh: false, step } = self.step {
            self.end_step(host, step);
        }
        self.step = Step::Closed;
    }

    /// End the current step (`Profiler.step()`).
    pub fn step(&mut self, host: &mut dyn StepHost) {
        if !self.running() {
            return;
        }
        // The first call: the optimizer's step may have asked for this very
        // boundary (taken here, once: `Pending`) or already ended this step.
        if let Some(Opt::Ended) = self.go_explicit(host) {
            return;
        }
        self.boundary(host);
    }

    /// An optimizer step on the training thread.
    pub fn optimizer_step(&mut self, host: &mut dyn StepHost) {
        let Mode::Inferred(opt) = self.mode else {
            return;
        };
        if !self.running() {
            return;
        }
        if opt == Opt::Pending || host.depth() <= self.depth {
            self.mode = Mode::Inferred(Opt::Idle);
            self.boundary(host);
            self.mode = Mode::Inferred(Opt::Ended);
        } else {
            self.mode = Mode::Inferred(Opt::Pending);
        }
    }

    /// A train pass starts (a loader's pass, or a framework's epoch:
    /// `framework`); `epoch_len` its number of batches when known.
    pub fn start_epoch(
        &mut self,
        host: &mut dyn StepHost,
        epoch_len: Option<u64>,
        framework: bool,
    ) {
        if !self.running() {
            return;
        }
        if framework && self.framework_pass {
            self.in_train_pass = self.in_train_pass.saturating_sub(1);
        }
        self.epoch_len = epoch_len.filter(|&n| n > 0);
        self.train_passes += 1;
        self.take_due_end(host);
        // A new epoch's schedule position: the next step asks the host again.
        self.quiet_left = 0;
        if self.train_passes > 1 {
            // Begun outside a train pass and nothing fetched: it is this
            // epoch's first step, begun again at the new position; one that
            // fetched ends here.
            if let Step::Open { fresh: false, step } = self.step {
                self.end_step(host, step);
            }
            self.pos.epoch += 1;
            self.pos.batch_in_epoch = 0;
            self.step = Step::Pending;
        }
        // Epoch 0: step 0 (open since start) begins at the first fetch.
        if framework {
            self.in_train_pass += 1;
            self.framework_pass = true;
        }
    }

    /// The pass `start_epoch(framework = true)` started is over.
    pub fn end_epoch(&mut self, host: &mut dyn StepHost) {
        if !self.framework_pass {
            return;
        }
        self.in_train_pass = self.in_train_pass.saturating_sub(1);
        self.framework_pass = false;
        if self.running() {
            self.take_due_end(host);
            if self.is_open() && self.in_train_pass == 0 {
                self.unbegin();
            }
        }
    }

    /// The next step begins now if none is open (a framework's fetch).
    pub fn begin_step(&mut self, host: &mut dyn StepHost) {
        if !self.running() {
            return;
        }
        if let Some(Opt::Pending) = self.go_explicit(host) {
            // The optimizer's deferred boundary, taken before this fetch.
            self.boundary(host);
        }
        let _ = self.fetch(host);
    }

    /// A train loader's pass begins iterating.
    pub fn enter_pass(&mut self) {
        self.in_train_pass += 1;
    }

    /// A train loader's pass stops iterating (exhausted, or the loop left it).
    pub fn exit_pass(&mut self, host: &mut dyn StepHost) {
        self.in_train_pass = self.in_train_pass.saturating_sub(1);
        if self.in_train_pass == 0 && self.running() {
            self.take_due_end(host); // the loop left the pass early (break)
        }
    }

    /// A train loader's `next()` is about to block: what this fetch is to
    /// the step ([`Fetch`]). Not running: [`Fetch::Within`].
    pub fn fetch(&mut self, host: &mut dyn StepHost) -> Fetch {
        if !self.running() {
            return Fetch::Within;
        }
        self.take_pending_optimizer_boundary(host);
        self.take_due_end(host);
        let fetch = match &mut self.step {
            Step::Pending => {
                // Past the loader's known length the fetch may find it
                // exhausted: torch is stepped only once a batch came.
                let driver = self.epoch_len.is_some_and(|n| self.pos.batch_in_epoch < n);
                self.open_step(host, driver);
                Fetch::Began
            }
            Step::Open { fresh: true, step } => {
                // Opened at start (or by a boundary outside a train pass) and
                // nothing fetched yet: the step starts with its first fetch.
                step.t0 = host.ticks();
                Fetch::Starts
            }
            _ => Fetch::Within,
        };
        if let Step::Open { fresh, .. } = &mut self.step {
            *fresh = false;
        }
        if self.mode == Mode::Inferred(Opt::Ended) {
            self.mode = Mode::Inferred(Opt::Idle);
        }
        fetch
    }

    /// The fetch that began a step found the loader exhausted: that step is
    /// no step; it begins again at the next train fetch.
    pub fn unbegin(&mut self) {
        if self.running() {
            self.step = Step::Pending;
        }
    }

    /// The fetch that began the open step came back with its batch: true
    /// when its torch step was waiting for it (and is no longer).
    pub fn take_driver_due(&mut self) -> bool {
        match &mut self.step {
            Step::Open { step, .. } | Step::EndDue(step) => std::mem::take(&mut step.driver_due),
            _ => false,
        }
    }

    /// The open step's time starts now (its torch step just began).
    pub fn restart_clock(&mut self, ticks: u64) {
        if let Step::Open { step, .. } | Step::EndDue(step) = &mut self.step {
            step.t0 = ticks;
        }
    }

    // -------------------------------------------------------- transitions

    /// The loop says where its steps end: the optimizer state it left
    /// behind, the first time (None after).
    fn go_explicit(&mut self, host: &mut dyn StepHost) -> Option<Opt> {
        let Mode::Inferred(opt) = self.mode else {
            return None;
        };
        self.mode = Mode::Explicit;
        host.explicit();
        Some(opt)
    }

    fn take_pending_optimizer_boundary(&mut self, host: &mut dyn StepHost) {
        if self.mode == Mode::Inferred(Opt::Pending) {
            self.mode = Mode::Inferred(Opt::Idle);
            self.boundary(host);
        }
    }

    /// A step begins now. `driver`: torch may be stepped now (else it waits
    /// for the batch: [`Self::take_driver_due`]).
    fn open_step(&mut self, host: &mut dyn StepHost, driver: bool) {
        let quiet = self.quiet_left > 0 && !anomaly::attention_pending();
        let mut driver_due = false;
        if quiet {
            self.quiet_left -= 1;
        } else if let Some(plan) = host.begin(self.pos, self.epoch_len, driver) {
            if plan.level != self.last_level {
                host.level(plan.level);
                self.last_level = plan.level;
            }
            self.action = plan.action;
            self.quiet_left = plan.quiet;
            driver_due = plan.driver_due;
        }
        host.mark(self.pos.batch);
        self.depth = host.depth();
        let t0 = host.ticks();
        self.step = Step::Open {
            fresh: true,
            step: Opened {
                at: self.pos,
                t0,
                quiet,
                driver_due,
            },
        };
    }

    /// `step` ends now (the caller sets the state that follows).
    fn end_step(&mut self, host: &mut dyn StepHost, step: Opened) {
        let judged = self.last_level <= 1 && step.at.batch_in_epoch > 0;
        if judged && self.times.is_some() {
            let d = host.ticks().saturating_sub(step.t0);
            self.judge(step.at.batch, d);
        }
        host.ended(&Ended {
            at: step.at,
            t0: step.t0,
            action: self.action,
            quiet: step.quiet,
        });
        self.pos.batch += 1;
        self.pos.batch_in_epoch += 1;
    }

    /// A judged step of `d` ticks ended: publish it when it is an anomaly.
    fn judge(&mut self, batch: u64, d: u64) {
        let origin = self.origin;
        let Some(t) = self.times.as_mut() else {
            return;
        };
        let min_excess = t.min_excess_ns;
        let found = t.observe(d, |m| anomaly::publish_median(ticks_to_ns(origin, m)));
        let found = found
            .filter(|&(median, _)| ticks_to_ns(origin, d.saturating_sub(median)) >= min_excess);
        if let Some((median, mad)) = found {
            let ns = |t: u64| ticks_to_ns(origin, t);
            anomaly::publish(Anomaly {
                batch,
                duration_ns: ns(d),
                median_ns: ns(median),
                mad_ns: ns(mad),
            });
        }
    }

    fn take_due_end(&mut self, host: &mut dyn StepHost) {
        if let Step::EndDue(step) = self.step {
            self.end_step(host, step);
            self.step = Step::Pending;
        }
    }

    /// The boundary between two steps (a `step()` call or an optimizer step).
    fn boundary(&mut self, host: &mut dyn StepHost) {
        self.take_due_end(host);
        if self.step == Step::Pending {
            // A step whose begin never came (no train fetch since the last
            // boundary): it still counts, as an empty span.
            self.open_step(host, true);
        }
        let Step::Open { step, .. } = self.step else {
            return; // not running
        };
        if self.in_train_pass > 0 {
            // Inside a train pass the step ends where the next begins.
            self.step = Step::EndDue(step);
            return;
        }
        self.end_step(host, step);
        self.open_step(host, true);
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
