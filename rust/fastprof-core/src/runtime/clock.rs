//! Clocks. Records carry *ticks*: the x86 time-stamp counter where it is
//! invariant (`constant_tsc` + `nonstop_tsc`: ~9 ns to read against ~21 ns for
//! `clock_gettime` through the vDSO, and a span reads it twice) and the
//! kernel itself keeps time with it, otherwise CLOCK_MONOTONIC ns. The
//! cpuinfo flags say what the CPU promises; the kernel's clocksource says
//! whether the TSC survived the kernel's own checks on this machine (its
//! watchdog drops a TSC that drifts between cores or sockets, and a
//! hypervisor that does not expose a stable TSC makes it pick kvm-clock,
//! hyperv_clocksource, xen...), so both are required. The writer turns ticks into CLOCK_MONOTONIC ns with a
//! [`Calibration`]: (ticks, monotonic) pairs taken before every drain,
//! interpolated piecewise-linearly, so NTP slewing of CLOCK_MONOTONIC is
//! followed too. Wall time enters only through [`Anchor`] pairs (realtime,
//! monotonic) taken at start, periodically and at stop. `FASTPROF_CLOCK=monotonic`
//! forces the plain clock.

/// Nanoseconds of CLOCK_MONOTONIC.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

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

/// Where the kernel says which clocksource it keeps time with.
pub const CLOCKSOURCE_PATH: &str =
    "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// A tick source and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceChoice {
    pub tsc: bool,
    /// For `otherData.clock.ticks_reason`, e.g. "CLOCK_MONOTONIC: kernel
    /// clocksource is kvm-clock".
    pub reason: String,
}

impl SourceChoice {
    /// The source's name, as `otherData.clock.ticks` gives it.
    pub fn name(&self) -> &'static str {
        if self.tsc {
            "tsc"
        } else {
            "CLOCK_MONOTONIC"
        }
    }
}

/// The decision itself, over the texts it reads: `/proc/cpuinfo`, the
/// kernel's current clocksource (`None`: unreadable) and `FASTPROF_CLOCK`
/// (`"monotonic"` forces the plain clock). Pure, so it is tested with
/// crafted inputs; [`select_source`] feeds it this machine's.
pub fn choose_source(
    cpuinfo: &str,
    clocksource: Option<&str>,
    clock_env: Option<&str>,
) -> SourceChoice {
    let mono = |why: String| SourceChoice {
        tsc: false,
        reason: format!("CLOCK_MONOTONIC: {why}"),
    };
    if clock_env.map(str::trim) == Some("monotonic") {
        return mono("FASTPROF_CLOCK=monotonic".into());
    }
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map_or("", |(_, f)| f);
    let missing: Vec<&str> = ["tsc", "constant_tsc", "nonstop_tsc"]
        .into_iter()
        .filter(|f| !flags.split_whitespace().any(|x| x == *f))
        .collect();
    if !missing.is_empty() {
        return mono(format!(
            "the TSC is not invariant (cpuinfo lacks {})",
            missing.join(", ")
        ));
    }
    match clocksource.map(str::trim) {
        Some("tsc") => SourceChoice {
            tsc: true,
            reason: "tsc: invariant and the kernel's clocksource".into(),
        },
        Some("") | None => mono(format!(
            "kernel clocksource unknown ({CLOCKSOURCE_PATH} unreadable)"
        )),
        Some(other) => mono(format!("kernel clocksource is {other}")),
    }
}

/// The `flags` line of /proc/cpuinfo, read once (the file is long on big
/// hosts and the flags do not change).
fn cpu_flags() -> &'static str {
    static FLAGS: OnceLock<String> = OnceLock::new();
    FLAGS.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let line = info.lines().find(|l| l.starts_with("flags"));
        line.unwrap_or("").to_string()
    })
}

/// Why the last [`select_source`] chose what it chose.
static REASON: Mutex<String> = Mutex::new(String::new());

/// Choose the tick source for the next recording: TSC when usable (see the
/// module docs) and not disabled by `FASTPROF_CLOCK=monotonic`. Returns the
/// source's name; [`ticks_reason`] says why.
pub fn select_source() -> &'static str {
    let c = probe_source();
    USE_TSC.store(c.tsc, Ordering::Relaxed);
    *REASON.lock().unwrap_or_else(|e| e.into_inner()) = c.reason.clone();
    c.name()
}

/// The tick source [`select_source`] would choose now, without choosing it
/// (a recording in progress keeps its own).
pub fn probe_source() -> SourceChoice {
    if cfg!(target_arch = "x86_64") {
        // The clocksource is read afresh: the kernel's watchdog may have
        // dropped the TSC since the last recording.
        let env = std::env::var("FASTPROF_CLOCK").ok();
        let cs = std::fs::read_to_string(CLOCKSOURCE_PATH).ok();
        choose_source(cpu_flags(), cs.as_deref(), env.as_deref())
    } else {
        SourceChoice {
            tsc: false,
            reason: "CLOCK_MONOTONIC: no TSC on this architecture".into(),
        }
    }
}

/// The resolution the kernel states for a clock (`clock_getres`), in ns.
pub fn resolution_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_getres(clock, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The clocks a recording would use here, for `fastprof doctor`: the tick
/// source [`select_source`] would pick and why, the kernel's clocksource,
/// the stated resolution of CLOCK_MONOTONIC (records, the sampler) and
/// CLOCK_REALTIME (the anchors that place a trace in wall time), and how
/// tightly one [`Anchor`] pairs them here.
pub fn describe() -> serde_json::Value {
    let c = probe_source();
    let clocksource = std::fs::read_to_string(CLOCKSOURCE_PATH)
        .ok()
        .map(|s| s.trim().to_string());
    serde_json::json!({
        "ticks": c.name(),
        "ticks_reason": c.reason,
        "clocksource": clocksource,
        "monotonic_resolution_ns": resolution_ns(libc::CLOCK_MONOTONIC),
        "realtime_resolution_ns": resolution_ns(libc::CLOCK_REALTIME),
        "anchor_uncertainty_ns": Anchor::take().uncertainty_ns,
    })
}

/// Why the current (or last) recording's tick source was chosen, for
/// `otherData.clock.ticks_reason`.
pub fn ticks_reason() -> String {
    REASON.lock().unwrap_or_else(|e| e.into_inner()).clone()
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

/// Calibration knots kept: a tick read before the previous knot but published
/// after that drain's snapshot (its thread was preempted between reading the
/// clock and pushing the record) is converted on the segment it lies in, as
/// long as it is younger than the oldest knot kept (16 drains back).
const KNOTS: usize = 16;

/// Converts ticks to CLOCK_MONOTONIC ns between calibration pairs.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    identity: bool,
    /// `knots[..n]`, oldest first; increasing in both coordinates.
    knots: [(u64, u64); KNOTS],
    n: usize,
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
            knots: [p; KNOTS],
            n: 1,
        }
    }

    /// Take a new knot. The caller converts only ticks read before this call
    /// (the writer snapshots every ring's head first), so conversion
    /// interpolates between two knots: the mapping is one continuous,
    /// increasing piecewise-linear function however often the writer drains,
    /// and a record converted in one drain can never land after a later
    /// record converted in the next. A record can still carry a tick older
    /// than the previous knot (read before it, published after the previous
    /// snapshot); it is converted on the older segment it lies in, which the
    /// last [`KNOTS`] knots keep. Knots are kept at least [`MIN_KNOT_GAP_NS`]
    /// apart (waiting out the rest when drains come faster) so pair jitter
    /// (tens of ns) cannot tilt a segment much.
    pub fn advance(&mut self) {
        if self.identity {
            return;
        }
        let since = monotonic_ns().saturating_sub(self.knots[self.n - 1].1);
        if since < MIN_KNOT_GAP_NS {
            std::thread::sleep(std::time::Duration::from_nanos(MIN_KNOT_GAP_NS - since));
        }
        self.push(pair());
    }

    fn push(&mut self, knot: (u64, u64)) {
        if self.n == KNOTS {
            self.knots.copy_within(1.., 0);
            self.n -= 1;
        }
        self.knots[self.n] = knot;
        self.n += 1;
    }

    /// CLOCK_MONOTONIC ns of a tick value.
    #[inline]
    pub fn to_ns(&self, t: u64) -> u64 {
        if self.identity {
            return t;
        }
        if self.n < 2 {
            let (t1, n1) = self.knots[0];
            return n1.wrapping_add(t.wrapping_sub(t1)); // not calibrated yet: ~1 tick/ns
        }
        // The segment holding `t`: nearly always the newest.
        let mut i = self.n - 2;
        while i > 0 && self.knots[i].0 > t {
            i -= 1;
        }
        let (t0, n0) = self.knots[i];
        let (t1, n1) = self.knots[i + 1];
        if t1 <= t0 {
            return n1.wrapping_add(t.wrapping_sub(t1));
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
    fn a_tick_older_than_the_previous_knot_is_converted_on_its_own_segment() {
        let mut c = Calibration {
            identity: false,
            knots: [(1000, 5000); KNOTS],
            n: 1,
        };
        // Two segments with different slopes: 1 ns/tick, then 3 ns/tick.
        c.push((2000, 6000));
        c.push((3000, 9000));
        // A tick from the first segment, converted after the second knot:
        // on its own segment, not extrapolated back along the newer one.
        assert_eq!(c.to_ns(1500), 5500);
        assert_eq!(c.to_ns(2500), 7500);
        // Increasing across the knot, whichever drain converts which.
        let xs: Vec<u64> = (1000..3000).step_by(7).map(|t| c.to_ns(t)).collect();
        assert!(xs.windows(2).all(|w| w[0] <= w[1]));
        // Older than every knot kept: the oldest segment, extrapolated.
        assert_eq!(c.to_ns(900), 4900);
        // The window of knots slides: the oldest go first.
        for k in 0..(KNOTS as u64 + 4) {
            c.push((4000 + k * 1000, 12_000 + k * 1000));
        }
        assert_eq!(c.n, KNOTS);
        assert!(c.knots[..c.n].windows(2).all(|w| w[0].0 < w[1].0));
    }

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

    const FLAGS: &str = "processor\t: 0\nflags\t\t: fpu tsc msr constant_tsc nonstop_tsc rdtscp\n\nprocessor\t: 1\n";

    #[test]
    fn tsc_needs_invariant_flags_and_the_kernel_clocksource() {
        let c = choose_source(FLAGS, Some("tsc\n"), None);
        assert!(c.tsc);
        assert_eq!(c.reason, "tsc: invariant and the kernel's clocksource");
        assert_eq!(c.name(), "tsc");

        // Flags alone are not enough: the kernel kept time with something else.
        let c = choose_source(FLAGS, Some("kvm-clock\n"), None);
        assert!(!c.tsc);
        assert_eq!(c.reason, "CLOCK_MONOTONIC: kernel clocksource is kvm-clock");
        assert_eq!(c.name(), "CLOCK_MONOTONIC");
        let c = choose_source(FLAGS, Some("hpet"), None);
        assert_eq!(c.reason, "CLOCK_MONOTONIC: kernel clocksource is hpet");
        let c = choose_source(FLAGS, None, None);
        assert!(!c.tsc && c.reason.contains("unreadable"), "{}", c.reason);

        // The kernel's clocksource alone is not enough either.
        let no_nonstop = FLAGS.replace(" nonstop_tsc", "");
        let c = choose_source(&no_nonstop, Some("tsc"), None);
        assert!(!c.tsc);
        assert_eq!(
            c.reason,
            "CLOCK_MONOTONIC: the TSC is not invariant (cpuinfo lacks nonstop_tsc)"
        );
        // "constant_tsc" must be a whole flag, not a substring of another.
        let c = choose_source("flags : tsc xconstant_tsc nonstop_tsc\n", Some("tsc"), None);
        assert!(
            !c.tsc && c.reason.contains("lacks constant_tsc"),
            "{}",
            c.reason
        );
        assert!(!choose_source("", Some("tsc"), None).tsc);

        // The override wins over everything.
        let c = choose_source(FLAGS, Some("tsc"), Some("monotonic"));
        assert!(!c.tsc);
        assert_eq!(c.reason, "CLOCK_MONOTONIC: FASTPROF_CLOCK=monotonic");
        assert!(choose_source(FLAGS, Some("tsc"), Some("auto")).tsc);
    }

    #[test]
    fn select_source_follows_this_machine_and_gives_its_reason() {
        let name = select_source();
        let reason = ticks_reason();
        assert!(
            reason.starts_with(&format!("{name}: ")),
            "{name} / {reason}"
        );
        let cs = std::fs::read_to_string(CLOCKSOURCE_PATH).unwrap_or_default();
        if name == "tsc" {
            assert_eq!(cs.trim(), "tsc");
        }
    }

    #[test]
    fn describe_states_the_choice_select_source_makes_and_the_resolutions() {
        let d = describe();
        let name = select_source();
        assert_eq!(d["ticks"], serde_json::json!(name));
        assert_eq!(d["ticks_reason"], serde_json::json!(ticks_reason()));
        // Linux keeps both clocks at 1 ns resolution (high-resolution timers).
        for k in ["monotonic_resolution_ns", "realtime_resolution_ns"] {
            let ns = d[k].as_u64().unwrap_or_else(|| panic!("{k}: {d}"));
            assert!((1..=1_000_000).contains(&ns), "{k} = {ns}");
        }
        assert!(d["anchor_uncertainty_ns"].is_u64(), "{d}");
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
