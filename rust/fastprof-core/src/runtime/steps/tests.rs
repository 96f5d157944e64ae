//! Every transition of the step machine against a host that logs what it
//! is asked, in the loop shapes the Profiler drives: a profiled loader with
//! `step()`, `step()` alone, steps inferred from optimizer steps, a
//! framework's epochs, and the exits out of the middle of each.

use super::*;
use std::collections::VecDeque;
use std::sync::Mutex;

/// The attention flag and the anomaly slots are process-wide: tests that
/// touch them (or begin steps, which read attention) run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const NONE: u32 = 100;
const ACTIVE: u32 = 101;

#[derive(Default)]
struct Log {
    events: Vec<String>,
    ended: Vec<Ended>,
    /// Answers for the next `begin`s; when empty: level 0, NONE, quiet 0, no driver due.
    plans: VecDeque<Option<Plan>>,
    depth: u32,
    now: u64,
}

impl Log {
    fn plan(&mut self, p: Option<Plan>) -> &mut Self {
        self.plans.push_back(p);
        self
    }
    fn take(&mut self) -> Vec<String> {
        std::mem::take(&mut self.events)
    }
    /// (batch, epoch, batch in epoch) of each step recorded so far.
    fn steps(&self) -> Vec<(u64, u64, u64)> {
        self.ended
            .iter()
            .map(|e| (e.at.batch, e.at.epoch, e.at.batch_in_epoch))
            .collect()
    }
}

fn plan(level: i64, action: u32, quiet: u64, driver_due: bool) -> Plan {
    Plan {
        level,
        action,
        quiet,
        driver_due,
    }
}

impl StepHost for Log {
    fn begin(&mut self, at: Position, epoch_len: Option<u64>, driver: bool) -> Option<Plan> {
        self.events.push(format!(
            "begin {} e{} b{} len{:?} driver={driver}",
            at.batch, at.epoch, at.batch_in_epoch, epoch_len
        ));
        self.plans
            .pop_front()
            .unwrap_or(Some(plan(0, NONE, 0, false)))
    }
    fn level(&mut self, level: i64) {
        self.events.push(format!("level {level}"));
    }
    fn mark(&mut self, batch: u64) {
        self.events.push(format!("mark {batch}"));
    }
    fn ended(&mut self, s: &Ended) {
        self.events.push(format!(
            "end {} action={} quiet={}",
            s.at.batch, s.action, s.quiet
        ));
        self.ended.push(*s);
    }
    fn explicit(&mut self) {
        self.events.push("explicit".into());
    }
    fn depth(&self) -> u32 {
        self.depth
    }
    fn ticks(&self) -> u64 {
        self.now
    }
}

fn running(h: &mut Log, defer: bool) -> StepMachine {
    let mut m = StepMachine::new(NONE);
    m.start(h, defer);
    m
}

/// Running, inside a train pass of `epoch_len` batches (as a loader's first `next()` finds it).
fn in_pass(h: &mut Log, defer: bool, epoch_len: Option<u64>) -> StepMachine {
    let mut m = running(h, defer);
    m.start_epoch(h, epoch_len, false);
    m.enter_pass();
    m
}

/// `for b in prof.loader(range(n)): prof.step()`, the loader's protocol.
fn loader_pass(
    m: &mut StepMachine,
    h: &mut Log,
    n: u64,
    mut body: impl FnMut(&mut StepMachine, &mut Log, u64),
) {
    m.start_epoch(h, Some(n), false);
    m.enter_pass();
    for i in 0..=n {
        let f = m.fetch(h);
        if i == n {
            if f != Fetch::Within {
                m.unbegin();
            }
            break;
        }
        body(m, h, i);
    }
    m.exit_pass(h);
}

#[test]
fn not_running_every_call_is_a_no_op() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = StepMachine::new(NONE);
    m.step(&mut h);
    m.optimizer_step(&mut h);
    m.start_epoch(&mut h, Some(3), true);
    m.end_epoch(&mut h);
    m.begin_step(&mut h);
    assert_eq!(m.fetch(&mut h), Fetch::Within);
    m.unbegin();
    m.stop(&mut h);
    assert!(h.take().is_empty());
    assert_eq!(
        (m.state(), m.running(), m.position()),
        ("closed", false, Position::default())
    );
}

#[test]
fn start_opens_step_zero_now_or_at_the_first_fetch() {
    let _s = serial();
    let mut h = Log::default();
    let m = running(&mut h, false);
    assert_eq!(m.state(), "open (fresh)");
    assert_eq!(
        h.take(),
        ["begin 0 e0 b0 lenNone driver=true", "level 0", "mark 0"]
    );
    let mut h = Log::default();
    let m = running(&mut h, true);
    assert_eq!((m.state(), h.events.len()), ("pending", 0));
}

#[test]
fn a_run_of_no_iterations_records_no_step() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = running(&mut h, false);
    loader_pass(&mut m, &mut h, 0, |_, _, _| {});
    m.stop(&mut h);
    assert!(h.ended.is_empty(), "{:?}", h.events);
    assert_eq!(m.state(), "closed");
}

#[test]
fn loader_and_step_tile_the_epoch() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = running(&mut h, false);
    h.take();
    h.now = 10;
    loader_pass(&mut m, &mut h, 3, |m, h, i| {
        h.now += 100;
        m.step(h);
        // Inside a pass a boundary only makes the end due.
        assert_eq!(m.state(), "end due", "step {i}");
    });
    m.stop(&mut h);
    assert_eq!(h.steps(), [(0, 0, 0), (1, 0, 1), (2, 0, 2)]);
    // Step 0 starts at its first fetch (t=10), not at start (t=0); each
    // later step at the fetch that began it.
    assert_eq!(
        h.ended.iter().map(|e| e.t0).collect::<Vec<_>>(),
        [10, 110, 210]
    );
    let ev = h.take();
    assert_eq!(ev[0], "explicit");
    assert!(
        ev.contains(&"begin 1 e0 b1 lenSome(3) driver=true".to_string()),
        "{ev:?}"
    );
    // The fetch past the end asks the host (it may have a batch) but does
    // not step torch, and finding the loader exhausted records no step 3.
    assert!(
        ev.contains(&"begin 3 e0 b3 lenSome(3) driver=false".to_string()),
        "{ev:?}"
    );
    assert!(
        !ev.iter().any(|e| e.starts_with("end 3")),
        "a phantom step: {ev:?}"
    );
    assert_eq!(m.position().batch, 3);
}

#[test]
fn the_fetch_past_the_known_length_does_not_step_torch() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = in_pass(&mut h, true, Some(1));
    assert_eq!(m.fetch(&mut h), Fetch::Began);
    m.step(&mut h);
    assert_eq!(m.fetch(&mut h), Fetch::Began); // past the length: may be exhausted
    let ev = h.take();
    assert!(
        ev.contains(&"begin 1 e0 b1 lenSome(1) driver=false".to_string()),
        "{ev:?}"
    );
    m.unbegin(); // it was
    assert_eq!(m.state(), "pending");
    m.exit_pass(&mut h);
    m.stop(&mut h);
    assert_eq!(h.steps(), [(0, 0, 0)]);
}

#[test]
fn step_alone_outside_a_pass_ends_and_begins_at_once() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = running(&mut h, false);
    for _ in 0..3 {
        m.step(&mut h);
        assert_eq!(m.state(), "open (fresh)");
    }
    m.stop(&mut h); // the fresh step after the last step() is no step
    assert_eq!(h.steps(), [(0, 0, 0), (1, 0, 1), (2, 0, 2)]);
}

#[test]
fn optimizer_steps_end_steps_until_the_loop_calls_step() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = in_pass(&mut h, false, None);
    m.fetch(&mut h);
    m.optimizer_step(&mut h);
    assert_eq!(m.state(), "end due");
    assert_eq!(m.fetch(&mut h), Fetch::Began);
    assert_eq!(h.steps(), [(0, 0, 0)]);
    // step() right after an optimizer step is that same boundary, and from
    // then on the loop ends its steps.
    m.optimizer_step(&mut h);
    m.step(&mut h);
    assert!(m.explicit());
    assert_eq!(m.fetch(&mut h), Fetch::Began);
    assert_eq!(h.steps(), [(0, 0, 0), (1, 0, 1)]);
    m.optimizer_step(&mut h); // ignored now
    assert_eq!(m.state(), "open");
    m.step(&mut h);
    m.exit_pass(&mut h);
    m.stop(&mut h);
    assert_eq!(h.steps().len(), 3);
}

#[test]
fn an_optimizer_step_inside_a_user_span_waits_for_the_next_fetch() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = in_pass(&mut h, false, None);
    m.fetch(&mut h);
    h.depth = 1; // `with fastprof.span("opt"): optimizer.step()`
    m.optimizer_step(&mut h);
    assert_eq!(m.state(), "open", "no boundary inside the span");
    h.depth = 0;
    assert_eq!(m.fetch(&mut h), Fetch::Began);
    assert_eq!(h.steps(), [(0, 0, 0)]);
    // Deferred, then the loop's first step() takes it (once).
    h.depth = 1;
    m.optimizer_step(&mut h);
    h.depth = 0;
    m.step(&mut h);
    assert_eq!(m.state(), "end due");
    m.fetch(&mut h);
    assert_eq!(h.steps().len(), 2);
}

#[test]
fn a_deferred_optimizer_boundary_is_taken_at_stop_and_by_a_framework_fetch() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = running(&mut h, false);
    m.fetch(&mut h);
    h.depth = 2;
    m.optimizer_step(&mut h);
    m.stop(&mut h);
    assert_eq!(h.steps(), [(0, 0, 0)]);

    let mut h = Log::default();
    let mut m = running(&mut h, true);
    m.start_epoch(&mut h, Some(4), true);
    m.begin_step(&mut h);
    h.depth = 2;
    m.optimizer_step(&mut h); // explicit already: ignored
    assert_eq!(m.state(), "open");
    h.take();
    let mut h2 = Log::default();
    let mut m2 = running(&mut h2, true);
    m2.fetch(&mut h2);
    h2.depth = 2;
    m2.optimizer_step(&mut h2);
    m2.begin_step(&mut h2); // first explicit call takes the deferred boundary
    assert_eq!(h2.steps(), [(0, 0, 0)]);
    assert_eq!(m2.state(), "open");
}

#[test]
fn quiet_steps_do_not_ask_the_host_until_attention_is_asked() {
    let _s = serial();
    let _ = attention_take();
    let mut h = Log::default();
    h.plan(Some(plan(0, NONE, 2, false)));
    let mut m = running(&mut h, false);
    for _ in 0..3 {
        m.step(&mut h);
    }
    let begins = |ev: &[String]| ev.iter().filter(|e| e.starts_with("begin")).count();
    let ev = h.take();
    assert_eq!(begins(&ev), 2, "{ev:?}"); // step 0 asks, 1 and 2 are quiet, 3 asks
    assert_eq!(
        h.ended.iter().map(|e| e.quiet).collect::<Vec<_>>(),
        [false, true, true]
    );
    h.plan(Some(plan(0, NONE, 5, false)));
    m.step(&mut h);
    attention_set();
    m.step(&mut h);
    assert!(attention_take());
    assert_eq!(begins(&h.take()), 2, "attention ends a quiet stretch");
    m.stop(&mut h);
}

#[test]
fn a_new_epoch_asks_the_host_again_and_restarts_batch_in_epoch() {
    let _s = serial();
    let mut h = Log::default();
    h.plan(Some(plan(0, NONE, 100, false)));
    let mut m = running(&mut h, false);
    for _ in 0..2 {
        loader_pass(&mut m, &mut h, 2, |m, h, _| m.step(h));
    }
    m.stop(&mut h);
    assert_eq!(h.steps(), [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
    let ev = h.take();
    assert!(
        ev.contains(&"begin 2 e1 b0 lenSome(2) driver=true".to_string()),
        "{ev:?}"
    );
}

#[test]
fn an_epoch_that_ends_mid_step_ends_that_step() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = in_pass(&mut h, false, None);
    m.fetch(&mut h);
    m.exit_pass(&mut h); // `break` out of the loop, no step() called
    assert_eq!(m.state(), "open");
    m.start_epoch(&mut h, None, false);
    assert_eq!(h.steps(), [(0, 0, 0)]);
    assert_eq!((m.state(), m.position().epoch), ("pending", 1));
}

#[test]
fn breaking_out_of_a_pass_ends_the_due_step() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = in_pass(&mut h, false, Some(10));
    m.fetch(&mut h);
    m.step(&mut h);
    assert_eq!(m.state(), "end due");
    m.exit_pass(&mut h);
    assert_eq!((m.state(), h.steps().len()), ("pending", 1));
    m.stop(&mut h);
    assert_eq!(h.steps().len(), 1);
}

#[test]
fn a_framework_epoch_begins_steps_and_drops_an_unfetched_one_at_its_end() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = running(&mut h, true);
    for _ in 0..2 {
        m.start_epoch(&mut h, Some(2), true);
        for _ in 0..2 {
            m.begin_step(&mut h);
            m.step(&mut h);
        }
        m.end_epoch(&mut h);
        assert_eq!(m.state(), "pending");
    }
    m.stop(&mut h);
    assert_eq!(h.steps(), [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]);
    assert_eq!(h.events.iter().filter(|e| *e == "explicit").count(), 1);
}

#[test]
fn a_failed_begin_keeps_the_previous_action_and_the_loop_goes_on() {
    let _s = serial();
    let mut h = Log::default();
    h.plan(Some(plan(3, ACTIVE, 0, true)));
    h.plan(None);
    let mut m = running(&mut h, false);
    assert!(m.driver_due());
    m.step(&mut h);
    assert!(!m.driver_due(), "no torch step due after a failed begin");
    m.step(&mut h);
    m.stop(&mut h);
    assert_eq!(
        h.ended.iter().map(|e| e.action).collect::<Vec<_>>(),
        [ACTIVE, ACTIVE]
    );
    let levels: Vec<_> = h.events.iter().filter(|e| e.starts_with("level")).collect();
    assert_eq!(levels, ["level 3", "level 0"]);
}

#[test]
fn the_driver_due_is_taken_once_and_restarts_the_clock() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = in_pass(&mut h, true, Some(5));
    h.plan(Some(plan(2, ACTIVE, 0, true)));
    h.now = 5;
    assert_eq!(m.fetch(&mut h), Fetch::Began);
    assert!(m.take_driver_due());
    assert!(!m.take_driver_due());
    m.restart_clock(42);
    m.step(&mut h);
    m.fetch(&mut h);
    assert_eq!(h.ended[0].t0, 42);
}

#[test]
fn stop_is_final_and_idempotent() {
    let _s = serial();
    let mut h = Log::default();
    let mut m = running(&mut h, false);
    m.fetch(&mut h);
    m.stop(&mut h);
    m.stop(&mut h);
    m.step(&mut h);
    assert_eq!((h.steps().len(), m.state()), (1, "closed"));
}

#[test]
fn the_detector_finds_every_slow_step_of_a_burst() {
    let _s = serial();
    let mut t = StepTimes::new(16, 3.0, 5.0, 0);
    let mut medians = Vec::new();
    for _ in 0..16 {
        assert_eq!(
            t.observe(1000 + (medians.len() as u64 % 3), |m| medians.push(m)),
            None
        );
    }
    assert!(medians.iter().all(|&m| (1000..=1002).contains(&m)));
    assert!(t.observe(10_000, |_| {}).is_some(), "a 10x step");
    // The burst's next step too: the Profiler, which knows each one's cause,
    // counts the burst once at its first step the host did not slow.
    assert!(t.observe(10_000, |_| {}).is_some(), "the burst's next step");
    assert!(t.observe(1000, |_| {}).is_none());
    hold(1);
    assert!(t.observe(50_000, |_| {}).is_none(), "held");
    assert!(t.observe(50_000, |_| {}).is_some());
}

#[test]
fn a_slow_step_of_a_running_machine_is_published_with_attention() {
    let _s = serial();
    let _ = attention_take();
    let mut h = Log::default();
    let mut m = running(&mut h, false);
    m.anomaly_detector(16, 3.0, 5.0, 0);
    loader_pass(&mut m, &mut h, 40, |m, h, i| {
        h.now += if i == 30 { 50_000 } else { 1_000 };
        m.step(h);
    });
    m.stop(&mut h);
    let a = anomaly_take().expect("step 30 found");
    assert_eq!(a.batch, 30);
    assert!(attention_take());
    assert!(median_step_ns() > 0);
    assert_eq!(anomaly_take(), None);
}
