//! Clocks. Records carry *ticks*: the x86 time-stamp counter where it is
//! invariant (`constant_tsc` + `nonstop_tsc`: ~9 ns to read against ~21 ns for
//! `clock_gettime` through the vDSO, and a span reads it twice), otherwise
//! CLOCK_MONOTONIC ns. The writer turns ticks into CLOCK_MONOTONIC ns with a
//! [`Calibration`]: (ticks, monotonic) pairs taken before every drain,
//! interpolated piecewise-linearly, so NTP slewing of CLOCK_MONOTONIC is
//! followed too. Wall time enters only through [`Anchor`] pairs (realtime,
//! monotonic) taken at start, periodically and at stop. `FASTPROF_CLOCK=monotonic`
//! forces the plain clock.

/// Nanoseconds of CLOCK_MONOTONIC.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

#[inline(always)]
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME).
#[inline]
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

#[inline(always)]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clock ids exist on every
    // Linux and macOS kernel we support, so the call cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// True when records hold TSC ticks. Set only by the recorder's `start`,
/// while no generation is active, so a run never mixes units; Relaxed
/// suffices because the generation's Release/Acquire publishes it.
static USE_TSC: AtomicBool = AtomicBool::new(false);

/// Choose the tick source for the next recording: TSC when usable and not
/// disabled by `FASTPROF_CLOCK=monotonic`. Returns the source's name.
pub fn select_source() -> &'static str {
    let want = std::env::var("FASTPROF_CLOCK")
        .map(|v| v != "monotonic")
        .unwrap_or(true);
    let tsc = want && tsc_usable();
    USE_TSC.store(tsc, Ordering::Relaxed);
    if tsc {
        "tsc"
    } else {
        "CLOCK_MONOTONIC"
    }
}

/// Why the last [`select_source`] chose what it chose.
pub fn source_reason() -> &'static str {
    if USE_TSC.load(Ordering::Relaxed) {
        "tsc: invariant (constant_tsc, nonstop_tsc)"
    } else {
        "CLOCK_MONOTONIC"
    }
}

/// Whether the TSC ticks at a constant rate through frequency changes and
/// idle states, on every core (Linux reports it in /proc/cpuinfo).
fn tsc_usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        if !cfg!(target_arch = "x86_64") {
            return false;
        }
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        has("constant_tsc") && has("nonstop_tsc")
    })
}

/// The record timestamp: TSC ticks or CLOCK_MONOTONIC ns (see module docs).
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if USE_TSC.load(Ordering::Relaxed) {
        // SAFETY: rdtsc exists on every x86_64 CPU and has no preconditions.
        return unsafe { core::arch::x86_64::_rdtsc() };
    }
    monotonic_ns()
}

/// Smallest time between two calibration knots.
pub const MIN_KNOT_GAP_NS: u64 = 100_000;

/// Converts ticks to CLOCK_MONOTONIC ns between calibration pairs.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    identity: bool,
    prev: (u64, u64),
    cur: (u64, u64),
}

impl Calibration {
    /// Start calibrating for the source chosen by [`select_source`].
    pub fn new() -> Calibration {
        let p = if USE_TSC.load(Ordering::Relaxed) {
            pair()
        } else {
            (0, 0)
        };
        Calibration {
            identity: !USE_TSC.load(Ordering::Relaxed),
            prev: p,
            cur: p,
        }
    }

    /// Take a new knot. The caller converts only ticks read before this call
    /// (the writer snapshots every ring's head first), so conversion always
    /// interpolates between two knots and never extrapolates: the mapping is
    /// one continuous, increasing piecewise-linear function however often the
    /// writer drains, and a record converted in one drain can never land after
    /// a later record converted in the next. Knots are kept at least
    /// [`MIN_KNOT_GAP_NS`] apart (waiting out the rest when drains come faster)
    /// so pair jitter (tens of ns) cannot tilt a segment much.
    pub fn advance(&mut self) {
        if self.identity {
            return;
        }
        let since = monotonic_ns().saturating_sub(self.cur.1);
        if since < MIN_KNOT_GAP_NS {
            std::thread::sleep(std::time::Duration::from_nanos(MIN_KNOT_GAP_NS - since));
        }
        self.prev = self.cur;
        self.cur = pair();
    }

    /// CLOCK_MONOTONIC ns of a tick value.
    #[inline]
    pub fn to_ns(&self, t: u64) -> u64 {
        if self.identity {
            return t;
        }
        let (t0, n0) = self.prev;
        let (t1, n1) = self.cur;
        if t1 <= t0 {
            return n1.wrapping_add(t.wrapping_sub(t1)); // not calibrated yet: ~1 tick/ns
        }
        let slope = (n1 - n0) as f64 / (t1 - t0) as f64;
        let dt = t as i128 - t0 as i128;
        (n0 as i128 + (dt as f64 * slope) as i128).max(0) as u64
    }
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration::new()
    }
}

/// A (ticks, monotonic ns) pair, tightest of a few tries.
fn pair() -> (u64, u64) {
    let mut best = (0, 0, u64::MAX);
    for _ in 0..5 {
        let m0 = monotonic_ns();
        let t = ticks();
        let m1 = monotonic_ns();
        if m1 - m0 < best.2 {
            best = (t, m0 + (m1 - m0) / 2, m1 - m0);
        }
    }
    (best.0, best.1)
}

/// One (CLOCK_REALTIME, CLOCK_MONOTONIC) pair taken as close together as we can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    pub realtime_ns: u64,
    pub monotonic_ns: u64,
    /// How far apart the two monotonic reads around the realtime read were:
    /// the uncertainty of this pair.
    pub uncertainty_ns: u64,
}

impl Anchor {
    /// Take an anchor: the realtime read bracketed by two monotonic reads,
    /// best (tightest) of a few tries, so that a preemption between the reads
    /// does not skew it.
    pub fn take() -> Anchor {
        let mut best = Anchor {
            realtime_ns: 0,
            monotonic_ns: 0,
            uncertainty_ns: u64::MAX,
        };
        for _ in 0..5 {
            let m0 = monotonic_ns();
            let r = realtime_ns();
            let m1 = monotonic_ns();
            let gap = m1 - m0;
            if gap < best.uncertainty_ns {
                best = Anchor {
                    realtime_ns: r,
                    monotonic_ns: m0 + gap / 2,
                    uncertainty_ns: gap,
                };
            }
        }
        best
    }

    /// Epoch ns of a monotonic timestamp, through this anchor.
    pub fn to_epoch_ns(&self, mono: u64) -> i128 {
        self.realtime_ns as i128 + (mono as i128 - self.monotonic_ns as i128)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_never_goes_back() {
        let mut last = monotonic_ns();
        for _ in 0..10_000 {
            let now = monotonic_ns();
            assert!(now >= last);
            last = now;
        }
    }

    #[test]
    fn tsc_calibration_tracks_monotonic() {
        select_source();
        let mut cal = Calibration::new();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let t = ticks();
        let m = monotonic_ns();
        cal.advance();
        let est = cal.to_ns(t) as i64;
        assert!(
            (est - m as i64).abs() < 200_000,
            "off by {} ns",
            est - m as i64
        );
        // Knots in quick succession (drains back to back) still give one
        // increasing mapping: a tick converted before a knot never lands
        // after a later tick converted after it.
        let mut last = 0;
        for _ in 0..50 {
            let (a, b) = (ticks(), ticks());
            let na = cal.to_ns(a);
            cal.advance();
            let nb = cal.to_ns(b);
            assert!(na >= last && nb >= na, "{last} {na} {nb}");
            last = nb;
        }
    }

    #[test]
    fn anchor_is_tight_and_consistent_with_realtime() {
        let a = Anchor::take();
        assert!(
            a.uncertainty_ns < 1_000_000,
            "anchor gap {} ns",
            a.uncertainty_ns
        );
        let mono = monotonic_ns();
        let real = realtime_ns() as i128;
        let est = a.to_epoch_ns(mono);
        assert!(
            (real - est).abs() < 5_000_000,
            "estimate off by {} ns",
            real - est
        );
    }
}
