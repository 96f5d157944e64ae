//! How long one thread (the training thread) waited for a CPU while it was
//! runnable: the kernel's `run_delay` (`/proc/self/task/<tid>/schedstat`,
//! second field, ns) and its involuntary context switches (`status`,
//! `nonvoluntary_ctxt_switches`), read by a watcher thread of its own
//! (issue #36, item 1).
//!
//! Why a thread and not the step path: a quiet step never makes a syscall,
//! so the training thread cannot read the counter at each step's begin.
//! The watcher reads it every `period` (10 ms by default: one 1.3 µs pread
//! of a kept-open file; `status`, ~9 µs, every [`STATUS_EVERY`]th reading)
//! into a ring, and the training thread reads the counter itself only when a
//! step is already suspect ([`RunWait::waited`]).
//!
//! The wait is the step's own: of the reading interval that straddles the
//! step's begin, no more than the part after the begin counts (the counter
//! only says how much that interval waited, not when), and every interval
//! after it counts whole. A step shorter than one period, inside one
//! interval, is thus credited with all that interval's wait up to its own
//! duration: the most it can have waited (a preemption is lumpy).
//! [`Waited::from_ns`] says where the interval began. Why not the sampler's
//! tick: at its 10 Hz default the bracket would be 100 ms, the size of what
//! it must resolve.
//!
//! The thread's time on a CPU (`schedstat`'s first field) is counted over
//! the step too, but of the straddling interval only what cannot fit before
//! the begin: a step's time neither on a CPU nor waiting for one is time it
//! slept or was blocked (a collective, I/O), and the busy steps before a
//! blocked one must not fill its blocked time with their CPU (issue #36: a
//! rank that waited 300 ms in a gloo all-reduce was credited 5 ms of the
//! steps before it, and its "own" time became a slow step). The wait, the
//! most, and this, the least, never sum to more than the step: what the
//! straddling interval holds of both fits in it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::procfs::{nums, ProcFile};
use crate::runtime::clock;

/// `status` is read every this many readings (it is ~7x the cost of
/// `schedstat`, and the switch count only supports the wait).
pub const STATUS_EVERY: u64 = 5;

/// One reading: CLOCK_MONOTONIC ns, cumulative run delay ns, cumulative
/// time on a CPU ns, cumulative involuntary switches (None when `status` was
/// not read this time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub t_ns: u64,
    pub run_delay_ns: u64,
    pub on_cpu_ns: u64,
    pub involuntary: Option<u64>,
}

/// The thread's wait for a CPU over the step that began at `begin_ns` and
/// ended by `to_ns` (now), from the readings since `from_ns` (the last one
/// at or before the begin).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Waited {
    pub run_delay_ns: u64,
    /// The step's time on a CPU: of the straddling interval, the least that
    /// can be the step's, so that the wait (the most) and this never sum to
    /// more than the step.
    pub on_cpu_ns: u64,
    pub begin_ns: u64,
    pub from_ns: u64,
    pub to_ns: u64,
    /// Involuntary switches from `involuntary_from_ns` to `to_ns`.
    pub involuntary: Option<u64>,
    pub involuntary_from_ns: u64,
    /// The usual wait before the step: the median, over the intervals
    /// between the readings of the `baseline_ns` up to `from_ns`, of the
    /// share of the interval the thread waited (a burst that fills less than
    /// half the baseline does not move it), and the span those intervals
    /// cover (0 when nothing was kept before: the rate is then 0).
    pub usual_rate: f64,
    pub usual_span_ns: u64,
}

/// (on-CPU ns, run_delay ns) from a `schedstat` file's text
/// ("<on-cpu ns> <run_delay ns> <timeslices>").
pub fn parse_schedstat(text: &[u8]) -> Option<(u64, u64)> {
    let mut it = nums(text);
    let on_cpu = it.next()?;
    Some((on_cpu, it.next()?))
}

/// `nonvoluntary_ctxt_switches` from a `status` file's text.
pub fn parse_involuntary(text: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"nonvoluntary_ctxt_switches:";
    text.split(|&b| b == b'\n')
        .find(|l| l.starts_with(KEY))
        .and_then(|l| nums(&l[KEY.len()..]).next())
}

/// The readings kept: a ring, oldest overwritten.
struct Ring {
    buf: Vec<Reading>,
    next: usize,
    filled: usize,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            buf: Vec::with_capacity(cap.max(2)),
            next: 0,
            filled: 0,
        }
    }

    fn push(&mut self, r: Reading) {
        let cap = self.buf.capacity();
        if self.buf.len() < cap {
            self.buf.push(r);
        } else {
            self.buf[self.next] = r;
        }
        self.next = (self.next + 1) % cap;
        self.filled = (self.filled + 1).min(cap);
    }

    /// Oldest first.
    fn iter(&self) -> impl DoubleEndedIterator<Item = &Reading> {
        let (a, b) = self.buf.split_at(if self.buf.len() < self.buf.capacity() {
            0
        } else {
            self.next
        });
        b.iter().chain(a.iter())
    }
}

/// The last reading at or before `t` (else the oldest, which is after `t`),
/// and the last one at or before `t` that has a switch count.
fn before(ring: &Ring, t: u64) -> (Option<Reading>, Option<Reading>) {
    let mut delay = None;
    let mut switches = None;
    for r in ring.iter().rev() {
        if r.t_ns <= t {
            delay.get_or_insert(*r);
            if r.involuntary.is_some() {
                switches = Some(*r);
                break;
            }
        }
    }
    if delay.is_none() {
        delay = ring.iter().next().copied();
    }
    if switches.is_none() {
        switches = ring.iter().find(|r| r.involuntary.is_some()).copied();
    }
    (delay, switches)
}

/// The first reading after `t` (else `now`).
fn after(ring: &Ring, t: u64, now: Reading) -> Reading {
    ring.iter()
        .find(|r| r.t_ns > t && r.t_ns <= now.t_ns)
        .copied()
        .unwrap_or(now)
}

/// A cumulative counter's growth over `[begin, now]`: whole from the first
/// reading after `begin`; of the interval `[d, a]` that straddles the begin,
/// the most that can lie after the begin (`most`: the wait, lumpy) or the
/// least (the time on a CPU: all of it that fits before the begin is put
/// there).
fn within(
    d: &Reading,
    a: &Reading,
    now: &Reading,
    begin: u64,
    most: bool,
    get: fn(&Reading) -> u64,
) -> u64 {
    let straddle = get(a).saturating_sub(get(d));
    let before = begin
        .saturating_sub(d.t_ns)
        .min(a.t_ns.saturating_sub(d.t_ns));
    let inside = a.t_ns.saturating_sub(begin.max(d.t_ns));
    let part = if most {
        straddle.min(inside)
    } else {
        straddle.saturating_sub(before).min(inside)
    };
    get(now).saturating_sub(get(a)) + part
}

/// The wait over the step from `begin_ns` to `now` (see the module's
/// header), and the usual wait over the `baseline_ns` before the step.
fn combine(ring: &Ring, begin_ns: u64, baseline_ns: u64, now: Reading) -> Option<Waited> {
    let (d, s) = before(ring, begin_ns);
    let d = d?;
    let a = after(ring, begin_ns.max(d.t_ns), now);
    let since = d.t_ns.saturating_sub(baseline_ns);
    let mut rates: Vec<f64> = Vec::new();
    let mut prev: Option<Reading> = None;
    let mut first = d.t_ns;
    for r in ring.iter().filter(|r| r.t_ns >= since && r.t_ns <= d.t_ns) {
        if let Some(p) = prev {
            let dt = r.t_ns.saturating_sub(p.t_ns);
            if dt > 0 {
                rates.push(r.run_delay_ns.saturating_sub(p.run_delay_ns) as f64 / dt as f64);
            }
        } else {
            first = r.t_ns;
        }
        prev = Some(*r);
    }
    let usual_rate = if rates.is_empty() {
        0.0
    } else {
        let mid = rates.len() / 2;
        let (_, m, _) = rates.select_nth_unstable_by(mid, f64::total_cmp);
        m.clamp(0.0, 1.0)
    };
    let (involuntary, involuntary_from_ns) = match (
        s.and_then(|s| s.involuntary.map(|n| (s, n))),
        now.involuntary,
    ) {
        (Some((s, then)), Some(n)) => (Some(n.saturating_sub(then)), s.t_ns),
        _ => (None, 0),
    };
    Some(Waited {
        run_delay_ns: within(&d, &a, &now, begin_ns, true, |r| r.run_delay_ns),
        on_cpu_ns: within(&d, &a, &now, begin_ns, false, |r| r.on_cpu_ns),
        begin_ns,
        from_ns: d.t_ns,
        to_ns: now.t_ns,
        involuntary,
        involuntary_from_ns,
        usual_rate,
        usual_span_ns: d.t_ns - first,
    })
}

struct Shared {
    ring: Mutex<Ring>,
    /// Relaxed: a flag polled by the watcher; `unpark` wakes it, and the
    /// join that follows orders everything after.
    stop: AtomicBool,
    /// The watcher's own CPU time, ns (relaxed: a statistic).
    cpu_ns: AtomicU64,
    /// Readings taken (relaxed: a statistic).
    readings: AtomicU64,
}

/// The watcher of one thread's wait for a CPU. Stopped on drop.
pub struct RunWait {
    tid: i32,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
    period: Duration,
}

fn task_path(tid: i32, file: &str) -> String {
    format!("/proc/self/task/{tid}/{file}")
}

/// A reading of thread `tid` now (None: the thread or the file is gone).
fn read_now(sched: &mut ProcFile, status: Option<&mut ProcFile>) -> Option<Reading> {
    let (on_cpu_ns, run_delay_ns) = sched.read().and_then(parse_schedstat)?;
    let t_ns = clock::monotonic_ns();
    let involuntary = status.and_then(|f| f.read().and_then(parse_involuntary));
    Some(Reading {
        t_ns,
        run_delay_ns,
        on_cpu_ns,
        involuntary,
    })
}

impl RunWait {
    /// Watch thread `tid` of this process every `period`, keeping `keep` of
    /// history (a step longer than that is counted from the oldest reading).
    /// Err: the kernel keeps no `schedstat` for it (no CONFIG_SCHED_INFO,
    /// not Linux).
    pub fn start(tid: i32, period: Duration, keep: Duration) -> std::io::Result<RunWait> {
        let path = task_path(tid, "schedstat");
        let mut sched = ProcFile::open(&path).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{path}: not readable"),
            )
        })?;
        let mut status = ProcFile::open(task_path(tid, "status"));
        let first = read_now(&mut sched, status.as_mut()).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{path}: no run_delay"),
            )
        })?;
        let period = period.max(Duration::from_millis(1));
        let cap = (keep.as_nanos() / period.as_nanos()).clamp(2, 1 << 20) as usize;
        let mut ring = Ring::new(cap);
        ring.push(first);
        let shared = Arc::new(Shared {
            ring: Mutex::new(ring),
            stop: AtomicBool::new(false),
            cpu_ns: AtomicU64::new(0),
            readings: AtomicU64::new(1),
        });
        let s = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("fastprof-runwait".into())
            .spawn(move || watch(s, sched, status, period))?;
        Ok(RunWait {
            tid,
            shared,
            handle: Some(handle),
            period,
        })
    }

    pub fn tid(&self) -> i32 {
        self.tid
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// The watched thread's wait for a CPU over the last `step_ns` up to
    /// now, and its usual wait over the `baseline_ns` before, reading the counters now (on the caller's thread: call it only
    /// for a step already suspect). None: the thread's files are gone.
    pub fn waited(&self, step_ns: u64, baseline_ns: u64) -> Option<Waited> {
        let mut sched = ProcFile::open(task_path(self.tid, "schedstat"))?;
        let mut status = ProcFile::open(task_path(self.tid, "status"));
        let now = read_now(&mut sched, status.as_mut())?;
        let ring = self.shared.ring.lock().unwrap_or_else(|e| e.into_inner());
        combine(&ring, now.t_ns.saturating_sub(step_ns), baseline_ns, now)
    }

    /// (readings taken, the watcher's own CPU ns so far).
    pub fn cost(&self) -> (u64, u64) {
        (
            self.shared.readings.load(Ordering::Relaxed),
            self.shared.cpu_ns.load(Ordering::Relaxed),
        )
    }

    /// Stop the watcher and wait for it.
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

impl Drop for RunWait {
    fn drop(&mut self) {
        self.stop();
    }
}

fn watch(s: Arc<Shared>, mut sched: ProcFile, mut status: Option<ProcFile>, period: Duration) {
    let mut n: u64 = 0;
    while !s.stop.load(Ordering::Relaxed) {
        std::thread::park_timeout(period);
        if s.stop.load(Ordering::Relaxed) {
            break;
        }
        n += 1;
        let st = if n % STATUS_EVERY == 0 {
            status.as_mut()
        } else {
            None
        };
        let Some(r) = read_now(&mut sched, st) else {
            break; // the thread exited
        };
        s.ring.lock().unwrap_or_else(|e| e.into_inner()).push(r);
        s.readings.fetch_add(1, Ordering::Relaxed);
        s.cpu_ns.store(super::thread_cpu_ns(), Ordering::Relaxed);
    }
    s.cpu_ns.store(super::thread_cpu_ns(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(t: u64, d: u64, s: Option<u64>) -> Reading {
        Reading {
            t_ns: t,
            run_delay_ns: d,
            on_cpu_ns: 0,
            involuntary: s,
        }
    }

    #[test]
    fn parses_the_kernels_files() {
        assert_eq!(
            parse_schedstat(b"937929 250000000 12\n"),
            Some((937_929, 250_000_000))
        );
        assert_eq!(parse_schedstat(b"937929\n"), None);
        let status =
            b"Name:\tpython\nvoluntary_ctxt_switches:\t7\nnonvoluntary_ctxt_switches:\t42\n";
        assert_eq!(parse_involuntary(status), Some(42));
        assert_eq!(parse_involuntary(b"Name:\tx\n"), None);
    }

    #[test]
    fn the_wait_is_counted_from_the_last_reading_before_the_begin() {
        let mut ring = Ring::new(4);
        for (t, d, s) in [
            (10, 0, Some(1)),
            (20, 5, None),
            (30, 7, None),
            (40, 100, Some(9)),
        ] {
            ring.push(r(t, d, s));
        }
        let w = combine(&ring, 25, 10, r(50, 107, Some(12))).unwrap();
        assert_eq!((w.run_delay_ns, w.from_ns, w.to_ns), (102, 20, 50));
        // The usual wait: the one interval from the reading 10 before the one at 20.
        assert_eq!((w.usual_rate, w.usual_span_ns), (0.5, 10));
        // Switches from the last reading before the begin that has them.
        assert_eq!((w.involuntary, w.involuntary_from_ns), (Some(11), 10));
        // A step that began at 35: of the interval 30..40, which waited 93,
        // only the 5 after the begin can be the step's (issue #36: a burst
        // before the step was counted as the step's own wait).
        let w = combine(&ring, 35, 10, r(50, 107, None)).unwrap();
        assert_eq!((w.run_delay_ns, w.from_ns, w.begin_ns), (5 + 7, 30, 35));
        // A step inside one interval (no reading since its begin): at most
        // its own duration of that interval's wait.
        let w = combine(&ring, 45, 10, r(50, 107, None)).unwrap();
        assert_eq!((w.run_delay_ns, w.from_ns), (5, 40));
        let w = combine(&ring, 45, 10, r(50, 101, None)).unwrap();
        assert_eq!(w.run_delay_ns, 1);
        // The ring wrapped: (10, ..) is gone, the oldest is (20, ..).
        ring.push(r(45, 101, None));
        let w = combine(&ring, 5, 100, r(50, 107, None)).unwrap();
        assert_eq!((w.run_delay_ns, w.from_ns), (102, 20));
        // Nothing kept before the oldest: no usual wait to speak of.
        assert_eq!((w.usual_rate, w.usual_span_ns), (0.0, 0));
        assert_eq!(w.involuntary, None);
    }

    #[test]
    fn the_cpu_of_the_steps_before_a_blocked_one_is_not_its_own() {
        // 0..20: the thread on a CPU 10 (the busy steps before), waiting 2;
        // the step begins at 12 and is blocked from then on; 20..40 blocked.
        let mut ring = Ring::new(4);
        let at = |t, d, c| Reading {
            t_ns: t,
            run_delay_ns: d,
            on_cpu_ns: c,
            involuntary: None,
        };
        ring.push(at(0, 0, 0));
        ring.push(at(20, 2, 10));
        let w = combine(&ring, 12, 0, at(40, 2, 10)).unwrap();
        // 12 of the interval lie before the begin: the 10 on a CPU fit there.
        assert_eq!(w.on_cpu_ns, 0, "{w:?}");
        // The wait: the most that can be the step's (the 2 fit after the begin).
        assert_eq!(w.run_delay_ns, 2, "{w:?}");
        // A CPU share that cannot fit before the begin is the step's.
        let mut ring = Ring::new(4);
        ring.push(at(0, 0, 0));
        ring.push(at(20, 0, 18));
        let w = combine(&ring, 12, 0, at(40, 0, 25)).unwrap();
        assert_eq!(w.on_cpu_ns, (18 - 12) + 7, "{w:?}");
        // Both estimates of a step inside one interval fit in the step.
        let mut ring = Ring::new(4);
        ring.push(at(0, 0, 0));
        let w = combine(&ring, 15, 0, at(20, 9, 11)).unwrap();
        assert!(w.run_delay_ns + w.on_cpu_ns <= 5, "{w:?}");
        assert_eq!((w.run_delay_ns, w.on_cpu_ns), (5, 0));
    }

    #[test]
    fn a_burst_in_the_baseline_does_not_make_the_usual_wait() {
        // Ten intervals of 10 ns: three wholly waiting (a burst), seven at 20%.
        let mut ring = Ring::new(16);
        let mut delay = 0;
        for i in 0..=10u64 {
            ring.push(r(i * 10, delay, None));
            delay += if (4..7).contains(&i) { 10 } else { 2 };
        }
        let w = combine(&ring, 100, 1000, r(110, delay + 10, None)).unwrap();
        assert_eq!(w.from_ns, 100);
        assert!((w.usual_rate - 0.2).abs() < 1e-9, "{w:?}");
        assert_eq!(w.usual_span_ns, 100);
    }

    #[test]
    fn a_thread_that_sleeps_is_neither_on_a_cpu_nor_waiting() {
        let tid = unsafe { libc::gettid() };
        let Ok(w) = RunWait::start(tid, Duration::from_millis(2), Duration::from_secs(5)) else {
            return; // no schedstat on this kernel
        };
        std::thread::sleep(Duration::from_millis(20));
        let t0 = clock::monotonic_ns();
        std::thread::sleep(Duration::from_millis(200));
        let waited = w.waited(clock::monotonic_ns() - t0, 1_000_000_000).unwrap();
        let step = waited.to_ns - waited.begin_ns;
        // Asleep: most of the step is neither (a loaded host may make the
        // waking thread wait for a CPU, which counts as waiting).
        assert!(waited.on_cpu_ns * 4 < step, "{waited:?}");
    }

    #[test]
    fn a_thread_that_waits_for_a_cpu_is_seen_waiting() {
        // This thread and a spinner pinned to one CPU: each waits while the
        // other runs, and the watcher sees this thread's run delay grow.
        let tid = unsafe { libc::gettid() };
        let Ok(w) = RunWait::start(tid, Duration::from_millis(2), Duration::from_secs(5)) else {
            return; // no schedstat on this kernel
        };
        let pin = || unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        assert_eq!(pin(), 0);
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = Arc::clone(&stop);
        let spinner = std::thread::spawn(move || {
            assert_eq!(pin(), 0);
            while !s2.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let t0 = clock::monotonic_ns();
        let mut x = 0u64;
        while clock::monotonic_ns() - t0 < 300_000_000 {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let waited = w.waited(clock::monotonic_ns() - t0, 1_000_000_000).unwrap();
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        assert!(x > 0);
        // Sharing one CPU with a spinner, a good part of the 300 ms is spent
        // waiting (the exact share is the scheduler's).
        let span = waited.to_ns - waited.from_ns;
        assert!(waited.run_delay_ns * 5 > span, "{waited:?}");
        assert!(waited.involuntary.unwrap_or(1) > 0);
        // Spinning, it was on a CPU whenever it was not waiting for one: no
        // time slept or blocked beyond the readings' grain.
        let step = waited.to_ns - waited.begin_ns;
        let blocked = step.saturating_sub(waited.run_delay_ns + waited.on_cpu_ns);
        assert!(blocked * 10 < step, "{waited:?}");
        let _ = span;
        let (readings, _) = w.cost();
        assert!(readings > 1);
    }
}
