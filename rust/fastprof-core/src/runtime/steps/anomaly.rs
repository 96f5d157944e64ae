//! The slow-step detector (issue #17's anomaly trigger) and the
//! process-wide flags the step machine shares with the triggers.
//!
//! Process-wide because the things that set or take them live outside any
//! one step machine: a signal handler or a trigger-file poller asks for
//! attention, the Profiler takes an anomaly from inside the machine's own
//! callback (where the machine is borrowed), and a window's export asks the
//! detector to hold its judgement.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Something outside the step loop wants the Profiler at the next step
/// boundary (a trigger: a signal, a trigger file, another rank through the
/// store). Set from any thread or a signal handler; read with one relaxed
/// load at each step's begin, so that a quiet stretch of the schedule (no
/// Python per step) still answers it at the next boundary. Release on set,
/// acquire on take: whatever the setter wrote before is visible to the taker.
static ATTENTION: AtomicBool = AtomicBool::new(false);

/// The last anomaly found and not yet taken.
static ANOMALY: Mutex<Option<Anomaly>> = Mutex::new(None);
/// The median of the recent judged steps, ns (0 before enough steps).
/// Relaxed: a statistic read for display, never to order other memory.
static MEDIAN_NS: AtomicU64 = AtomicU64::new(0);
/// Steps not to judge (a window just ended: its export competes for the
/// CPU). Relaxed: a count, not a publication.
static HOLD: AtomicU64 = AtomicU64::new(0);

/// A slow step: its global index, its duration, and the recent steps'
/// median and median absolute deviation, all in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Anomaly {
    pub batch: u64,
    pub duration_ns: u64,
    pub median_ns: u64,
    pub mad_ns: u64,
}

/// Ask for the Profiler's attention at the next step boundary.
pub fn attention_set() {
    ATTENTION.store(true, Ordering::Release);
}

/// True while attention is asked for (not taken).
#[inline(always)]
pub fn attention_pending() -> bool {
    ATTENTION.load(Ordering::Relaxed)
}

/// Take the request: true when one was pending (and clear it).
pub fn attention_take() -> bool {
    ATTENTION.load(Ordering::Relaxed) && ATTENTION.swap(false, Ordering::AcqRel)
}

/// The last anomaly found and not yet taken.
pub fn anomaly_take() -> Option<Anomaly> {
    ANOMALY.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The median step time of the recent judged steps in ns (0 before enough).
pub fn median_step_ns() -> u64 {
    MEDIAN_NS.load(Ordering::Relaxed)
}

/// Judge none of the next `steps` steps.
pub fn hold(steps: u64) {
    HOLD.fetch_max(steps, Ordering::Relaxed);
}

/// A new detector: no anomaly pending, no median, nothing held.
pub(crate) fn reset() {
    *ANOMALY.lock().unwrap_or_else(|e| e.into_inner()) = None;
    MEDIAN_NS.store(0, Ordering::Relaxed);
    HOLD.store(0, Ordering::Relaxed);
}

pub(crate) fn publish_median(ns: u64) {
    MEDIAN_NS.store(ns, Ordering::Relaxed);
}

/// Found: kept for the Profiler, which is asked to look at the next boundary.
pub(crate) fn publish(a: Anomaly) {
    *ANOMALY.lock().unwrap_or_else(|e| e.into_inner()) = Some(a);
    attention_set();
}

/// One held step is used up: true when this step is not to be judged.
fn held() -> bool {
    if HOLD.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let _ = HOLD.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| h.checked_sub(1));
    true
}

/// A rolling window of step durations (ticks), its median and median
/// absolute deviation recomputed every [`StepTimes::EVERY`] steps
/// (O(window) each time, select-nth on a copy). A step beyond both
/// `factor` x median and median + `z` x 1.4826 x MAD is an anomaly.
///
/// Every slow step is published, a burst's too: the Profiler, which knows
/// each slow step's cause, counts a burst once, at its first step that the
/// host did not slow (issue #36: a slow step right after a host contention
/// step was taken as that burst's and never judged).
pub struct StepTimes {
    ring: Vec<u64>,
    next: usize,
    filled: usize,
    since: u32,
    median: u64,
    mad: u64,
    factor: f64,
    z: f64,
    scratch: Vec<u64>,
    /// A slow step must also be this much (ns) slower than the median: a
    /// loop of microsecond steps is noise at 3x, not an anomaly.
    pub(crate) min_excess_ns: u64,
}

impl StepTimes {
    const EVERY: u32 = 8;

    /// A window of `window` steps (at least 8).
    pub fn new(window: usize, factor: f64, z: f64, min_excess_ns: u64) -> Self {
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
    /// `recomputed` is called with the new median when it changed.
    pub fn observe(&mut self, d: u64, recomputed: impl FnOnce(u64)) -> Option<(u64, u64)> {
        if held() {
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
        if self.filled < cap || self.since >= Self::EVERY {
            self.since = 0;
            self.recompute();
            recomputed(self.median);
        }
        slow.then_some((median, mad))
    }
}
