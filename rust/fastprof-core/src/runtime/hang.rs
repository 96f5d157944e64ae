//! The hang watchdog (issue #37): a thread that notices when no training step has ended for
//! too long, and asks for the rank's evidence.
//!
//! It never takes the GIL: a rank may be hung precisely because one of its threads holds it in
//! a C call (a regular expression backtracking, a C extension spinning), and a Python watchdog
//! would then be as stuck as the training thread. The training thread tells it of progress
//! through one relaxed store per step ([`beat`], from `registry::step_complete`); the thread
//! polls it (and the rank's request file, written by `fastprof trigger --stacks`) every
//! `poll`. When a stall passes its timeout, or a request comes, it:
//!
//! 1. has every Python thread's stack written into a text file by a [`StackDumper`] (the binding
//!    uses CPython's own dumper, the one `faulthandler` calls from its watchdog thread, which
//!    reads the thread states without the GIL);
//! 2. queues an [`Event`] for the Python side (a helper thread waiting in [`Watchdog::next`]
//!    without the GIL), which gathers the full evidence when it can run and [`Watchdog::claim`]s
//!    the event;
//! 3. when nobody claimed it within `grace`, writes `hang-<n>.json` itself from the stacks text,
//!    saying that Python did not answer (the GIL is held), and, with `abort_status`, ends the
//!    process after `abort_after`.

use std::collections::VecDeque;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The last ended step's global index plus one (0: no step ended yet). Relaxed on both sides:
/// the watchdog only compares successive values; nothing else is published through it.
static BEAT: AtomicU64 = AtomicU64::new(0);

/// A training step ended (its global index). One relaxed store: the training thread's whole
/// cost of the watchdog.
#[inline(always)]
pub fn beat(batch: u64) {
    BEAT.store(batch.wrapping_add(1), Ordering::Relaxed);
}

/// The last ended step's global index, None before the first.
pub fn last_step() -> Option<u64> {
    BEAT.load(Ordering::Relaxed).checked_sub(1)
}

/// The request file `fastprof trigger --stacks` writes in a rank's directory.
pub const REQUEST_FILE: &str = crate::contract::HANG_REQUEST_FILE;

/// The default rule's numbers (`timeout: None`): before two steps have ended, a stall is
/// reported after [`FIRST_STEPS_TIMEOUT`] (the first steps compile and warm up); after that,
/// after `max(FLOOR, FACTOR x the median recent step)`. A job with 1 s steps is reported
/// within a minute and a half; a job whose steps become twice as slow never is.
pub const FIRST_STEPS_TIMEOUT: Duration = Duration::from_secs(300);
pub const FLOOR: Duration = Duration::from_secs(60);
pub const FACTOR: u32 = 20;

/// The watchdog's options.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where `hang-<n>.json`, the stacks files and the request file are.
    pub rank_dir: PathBuf,
    pub rank: u32,
    /// A fixed stall timeout; None: the default rule (see [`FLOOR`]). Short timeouts report
    /// long checkpoints and evaluations as hangs; long ones keep a hung job's GPUs longer.
    pub timeout: Option<Duration>,
    /// How long the Python side gets to claim an event before this thread writes the evidence
    /// itself: longer gives a briefly busy interpreter its chance, shorter answers sooner
    /// when a thread holds the GIL.
    pub grace: Duration,
    /// How often progress and the request file are looked at (one atomic load and one stat).
    pub poll: Duration,
    /// `hang_action=abort`: the exit status, and how long after writing a stall's evidence
    /// itself (Python not answering) the process waits for the other ranks before it ends.
    /// A request's evidence never ends it.
    pub abort_status: Option<i32>,
    pub abort_after: Duration,
    /// Hook SIGTERM ([`super::hang_sigterm`]): a SIGTERM that Python's handler does not take
    /// within `grace` (the main thread waits in C: a collective's wait) while the rank has
    /// stalled past [`sigterm_stall`] gets its evidence from this thread's event.
    pub sigterm_hook: bool,
    /// Then end the process by SIGTERM's default action (the job's disposition under
    /// fastprof's handler was the default), once the evidence is written (at most
    /// `abort_after` waited for the Python side).
    pub sigterm_default: bool,
}

/// How long a rank must have stalled for a SIGTERM to write the evidence: ten typical steps
/// and at least 10 s (a rank stopped mid-step by a SIGTERM is not a hang).
pub fn sigterm_stall(typical_step_s: Option<f64>) -> Duration {
    let ten = Duration::from_secs(10);
    match typical_step_s {
        Some(s) => ten.max(Duration::from_secs_f64((s * 10.0).clamp(0.0, 1e9))),
        None => ten,
    }
}

/// What the thread saw, for the Python side.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// This rank's hang number (1, 2, ...): the evidence goes to `hang-<n>.json`.
    pub n: u64,
    /// `"stalled"`, `"request"` or `"sigterm"` (a SIGTERM Python's handler did not take).
    pub reason: &'static str,
    /// A request's id (the request file's content), if any.
    pub request: Option<String>,
    /// The last ended step, None before the first.
    pub step: Option<u64>,
    /// Since the last step ended (or the watchdog started), seconds.
    pub stalled_s: f64,
    /// The timeout in force, seconds.
    pub timeout_s: f64,
    /// The median recent step, seconds (None before two steps).
    pub typical_step_s: Option<f64>,
    /// The text file the stacks were dumped into (None: the dumper failed).
    pub stacks: Option<PathBuf>,
    /// Wall-clock time of the event, seconds since the epoch.
    pub time: f64,
}

/// Writes every Python thread's stack, in `faulthandler`'s text format, into `fd`, without
/// the GIL. False when it cannot.
pub trait StackDumper: Send + Sync {
    fn dump(&self, fd: i32) -> bool;
}

#[derive(Default)]
struct State {
    pending: VecDeque<Event>,
    /// The numbers claimed (by Python or by this thread), most recent last; bounded.
    claimed: VecDeque<u64>,
    /// The numbers whose evidence the Python side has written ([`Watchdog::done`]); bounded.
    done: VecDeque<u64>,
    stopping: bool,
    /// The stall clock as of the last poll: since when no step ended, the median recent step.
    since: Option<Instant>,
    typical: Option<f64>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

/// A running watchdog thread; stopped and joined on drop.
pub struct Watchdog {
    shared: Arc<Shared>,
    /// Taken by the first [`Watchdog::stop`]: a handle shared by threads (one waiting in
    /// [`Watchdog::next`] while another stops it) needs `stop(&self)`.
    thread: Mutex<Option<JoinHandle<()>>>,
    /// This watchdog put the SIGTERM hook in (and takes it out on stop).
    hooked: bool,
}

impl Watchdog {
    pub fn start(config: Config, dumper: Box<dyn StackDumper>) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let s = shared.clone();
        // The stall clock starts here, on the starting thread: a new run's
        // steps count from 0 (not from an earlier run's last step in this
        // process), and steps that end before the new thread first runs
        // (late, on a loaded machine) count too. Else the start-up timeout
        // ([`FIRST_STEPS_TIMEOUT`]) stayed in force through a real stall.
        BEAT.store(0, Ordering::Relaxed);
        let progress = Progress::new(Instant::now());
        let hooked = config.sigterm_hook && super::hang_sigterm::install();
        let thread = std::thread::Builder::new()
            .name("fastprof-hang".into())
            .spawn(move || run(config, dumper, s, progress));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                if hooked {
                    super::hang_sigterm::uninstall();
                }
                return Err(e);
            }
        };
        Ok(Watchdog {
            shared,
            thread: Mutex::new(Some(thread)),
            hooked,
        })
    }

    /// Whether SIGTERM is hooked (see [`Config::sigterm_hook`]).
    pub fn sigterm_hooked(&self) -> bool {
        self.hooked && super::hang_sigterm::installed()
    }

    /// The Python side wrote event `n`'s evidence.
    pub fn done(&self, n: u64) {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        st.done.push_back(n);
        if st.done.len() > 64 {
            st.done.pop_front();
        }
        self.shared.cv.notify_all();
    }

    /// The next event, waiting at most `wait` (None: none came or the watchdog stops).
    pub fn next(&self, wait: Duration) -> Option<Event> {
        let deadline = Instant::now() + wait;
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if st.stopping {
                return None;
            }
            if let Some(e) = st.pending.pop_front() {
                return Some(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Seconds since a step last ended (or the watchdog started), as of the last poll, and
    /// the median recent step (None before two steps).
    pub fn stall(&self) -> (f64, Option<f64>) {
        let st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let since = st.since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        (since, st.typical)
    }

    /// Take event `n` for the Python side: false when this thread already wrote its evidence.
    pub fn claim(&self, n: u64) -> bool {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let ok = claim_in(&mut st, n);
        self.shared.cv.notify_all();
        ok
    }

    /// Stop and join the thread (idempotent); a waiter in [`Watchdog::next`] gets None.
    pub fn stop(&self) {
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.stopping = true;
            self.shared.cv.notify_all();
        }
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
            if self.hooked {
                super::hang_sigterm::uninstall();
            }
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn claim_in(st: &mut State, n: u64) -> bool {
    if st.claimed.contains(&n) {
        return false;
    }
    st.claimed.push_back(n);
    if st.claimed.len() > 64 {
        st.claimed.pop_front();
    }
    true
}

/// The stall clock: progress seen through [`BEAT`], the recent steps' durations.
struct Progress {
    beat: u64,
    /// A step has ended since the watchdog started.
    stepped: bool,
    since: Instant,
    recent: VecDeque<f64>,
    /// The beat a stall was reported at (one report per stall).
    reported: Option<u64>,
}

impl Progress {
    fn new(now: Instant) -> Self {
        Progress {
            beat: BEAT.load(Ordering::Relaxed),
            stepped: false,
            since: now,
            recent: VecDeque::new(),
            reported: None,
        }
    }

    fn observe(&mut self, beat: u64, now: Instant) {
        if beat == self.beat {
            return;
        }
        if self.beat != 0 && beat > self.beat {
            let per = now.duration_since(self.since).as_secs_f64() / (beat - self.beat) as f64;
            self.recent.push_back(per);
            if self.recent.len() > 32 {
                self.recent.pop_front();
            }
        }
        self.beat = beat;
        self.stepped = true;
        self.since = now;
        self.reported = None;
    }

    fn typical(&self) -> Option<f64> {
        if self.recent.len() < 2 {
            return None;
        }
        let mut v: Vec<f64> = self.recent.iter().copied().collect();
        v.sort_by(|a, b| a.total_cmp(b));
        Some(v[v.len() / 2])
    }
}

/// The timeout in force: the fixed one, or the default rule. Until a step
/// has ended under this watchdog (`stepped`), a fixed timeout is at least
/// [`FIRST_STEPS_TIMEOUT`]: the job's start-up (imports, the process group,
/// the first step's compilation) is not a hang, however short the timeout
/// set for its steps.
pub fn timeout_for(
    fixed: Option<Duration>,
    typical_step_s: Option<f64>,
    stepped: bool,
) -> Duration {
    if let Some(t) = fixed {
        return if stepped {
            t
        } else {
            t.max(FIRST_STEPS_TIMEOUT)
        };
    }
    match typical_step_s {
        None => FIRST_STEPS_TIMEOUT,
        Some(s) => FLOOR.max(Duration::from_secs_f64((s * FACTOR as f64).min(1e9))),
    }
}

fn run(config: Config, dumper: Box<dyn StackDumper>, shared: Arc<Shared>, mut progress: Progress) {
    let mut n = existing_hangs(&config.rank_dir);
    let request_path = config.rank_dir.join(REQUEST_FILE);
    // When this thread first saw a SIGTERM that Python's handler has not taken.
    let mut sigterm_seen: Option<Instant> = None;
    loop {
        {
            let st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            let (st, _) = shared
                .cv
                .wait_timeout_while(st, config.poll, |s| !s.stopping)
                .unwrap_or_else(|e| e.into_inner());
            if st.stopping {
                return;
            }
        }
        let now = Instant::now();
        progress.observe(BEAT.load(Ordering::Relaxed), now);
        let typical = progress.typical();
        {
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.since = Some(progress.since);
            st.typical = typical;
        }
        let timeout = timeout_for(config.timeout, typical, progress.stepped);
        let stalled = now.duration_since(progress.since);
        let sigterm =
            config.sigterm_hook && sigterm_due(&mut sigterm_seen, now, &config, stalled, typical);
        let request = if sigterm {
            None
        } else {
            take_request(&request_path)
        };
        let stalled_now =
            !sigterm && stalled >= timeout && progress.reported != Some(progress.beat);
        if request.is_none() && !stalled_now && !sigterm {
            continue;
        }
        if stalled_now {
            progress.reported = Some(progress.beat);
        }
        n += 1;
        let stacks = dump_stacks(&config.rank_dir, n, dumper.as_ref());
        let event = Event {
            n,
            reason: if sigterm {
                "sigterm"
            } else if request.is_some() {
                "request"
            } else {
                "stalled"
            },
            request,
            step: progress.beat.checked_sub(1),
            stalled_s: stalled.as_secs_f64(),
            timeout_s: timeout.as_secs_f64(),
            typical_step_s: typical,
            stacks,
            time: epoch_s(),
        };
        let wrote = answer_or_write(&config, &shared, event);
        if sigterm {
            if config.sigterm_default {
                if !wrote {
                    wait_done(&shared, n, config.abort_after.max(Duration::from_secs(10)));
                }
                super::hang_sigterm::die_by_sigterm();
            }
            continue;
        }
        // Only a stall ends the process: a request (`fastprof trigger --stacks`) asked for
        // stacks, and a job that answers it is not hung.
        if wrote && stalled_now {
            if let Some(status) = config.abort_status {
                std::thread::sleep(config.abort_after);
                // SAFETY: _exit ends the process at once; nothing here is left half-written
                // (the evidence was renamed into place before).
                unsafe { libc::_exit(status) };
            }
        }
    }
}

/// Whether a SIGTERM that Python's handler did not take is now the watchdog's to answer: seen
/// for `grace` without Python taking it (the main thread is in C), with the rank stalled past
/// [`sigterm_stall`]. Then taken (Python's handler, should it run later, does not write the
/// evidence again).
fn sigterm_due(
    seen: &mut Option<Instant>,
    now: Instant,
    config: &Config,
    stalled: Duration,
    typical: Option<f64>,
) -> bool {
    if !super::hang_sigterm::pending() {
        *seen = None;
        return false;
    }
    let first = *seen.get_or_insert(now);
    if now.duration_since(first) < config.grace || stalled < sigterm_stall(typical) {
        return false;
    }
    super::hang_sigterm::take_watchdog()
}

/// Wait at most `wait` for the Python side to have written event `n`'s evidence.
fn wait_done(shared: &Shared, n: u64, wait: Duration) {
    let deadline = Instant::now() + wait;
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    while !st.done.contains(&n) && !st.stopping {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        st = shared
            .cv
            .wait_timeout(st, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Queue `event` and wait `grace` for Python to claim it; if nobody did, write the evidence
/// here. True when this thread wrote it.
fn answer_or_write(config: &Config, shared: &Shared, event: Event) -> bool {
    let n = event.n;
    let deadline = Instant::now() + config.grace;
    let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
    st.pending.push_back(event.clone());
    shared.cv.notify_all();
    while !st.claimed.contains(&n) && !st.stopping {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        st = shared
            .cv
            .wait_timeout(st, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    if st.stopping || !claim_in(&mut st, n) {
        return false;
    }
    st.pending.retain(|e| e.n != n);
    drop(st);
    let doc = fallback_evidence(config, &event);
    write_atomic(
        &config
            .rank_dir
            .join(format!("{}{n}.json", crate::contract::HANG_EVIDENCE_PREFIX)),
        doc.as_bytes(),
    )
    .is_ok()
}

/// The highest `hang-<n>.json` already in the rank's directory (a restarted Profiler goes on
/// numbering).
fn existing_hangs(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let s = name.to_str()?;
            s.strip_prefix(crate::contract::HANG_EVIDENCE_PREFIX)?
                .strip_suffix(".json")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0)
}

/// A request file's content (its id), the file taken (removed); only a regular file is read.
fn take_request(path: &Path) -> Option<String> {
    let meta = fs::symlink_metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let text = fs::read(path).ok()?;
    let _ = fs::remove_file(path);
    let text = String::from_utf8_lossy(&text[..text.len().min(256)])
        .trim()
        .to_string();
    Some(text)
}

fn dump_stacks(dir: &Path, n: u64, dumper: &dyn StackDumper) -> Option<PathBuf> {
    let path = dir.join(format!(".hang-{n}.stacks.txt"));
    let mut f = fs::File::create(&path).ok()?;
    let ok = dumper.dump(f.as_raw_fd());
    let _ = f.flush();
    ok.then_some(path)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path)
}

fn epoch_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One thread of a `faulthandler` dump: its id, whether it was the dumping thread, its frames
/// innermost first (file, line, function).
#[derive(Debug, PartialEq)]
pub struct DumpedThread {
    pub id: String,
    pub current: bool,
    pub frames: Vec<(String, u64, String)>,
}

/// Parse `faulthandler`'s text: `Thread 0x... (most recent call first):` (or `Current thread`)
/// then `  File "path", line N in func` lines. Lines it does not know are skipped.
pub fn parse_dump(text: &str) -> Vec<DumpedThread> {
    let mut out: Vec<DumpedThread> = Vec::new();
    for line in text.lines() {
        let l = line.trim_start();
        let header = l
            .strip_prefix("Current thread ")
            .map(|r| (true, r))
            .or_else(|| l.strip_prefix("Thread ").map(|r| (false, r)));
        if let Some((current, rest)) = header {
            let id = rest.split_whitespace().next().unwrap_or("").to_string();
            out.push(DumpedThread {
                id,
                current,
                frames: Vec::new(),
            });
            continue;
        }
        let Some(rest) = l.strip_prefix("File \"") else {
            continue;
        };
        let Some((file, rest)) = rest.rsplit_once("\", line ") else {
            continue;
        };
        let (num, func) = match rest.split_once(" in ") {
            Some((a, b)) => (a, b.trim().to_string()),
            None => (rest, String::new()),
        };
        let Ok(num) = num.trim().parse::<u64>() else {
            continue;
        };
        if out.is_empty() {
            out.push(DumpedThread {
                id: String::new(),
                current: false,
                frames: Vec::new(),
            });
        }
        if let Some(t) = out.last_mut() {
            t.frames.push((file.to_string(), num, func));
        }
    }
    out
}

/// The evidence this thread writes when Python did not answer: the stacks from the dump, the
/// step clock, and what is missing and why.
fn fallback_evidence(config: &Config, e: &Event) -> String {
    let text = e
        .stacks
        .as_ref()
        .and_then(|p| fs::read(p).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let threads: Vec<serde_json::Value> = parse_dump(&text)
        .into_iter()
        .map(|t| {
            let frames: Vec<serde_json::Value> = t
                .frames
                .into_iter()
                .map(|(file, line, function)| {
                    serde_json::json!({"file": file, "line": line, "function": function})
                })
                .collect();
            serde_json::json!({"id": t.id, "name": null, "frames": frames})
        })
        .collect();
    let doc = serde_json::json!({
        "kind": "fastprof.hang",
        "version": 1,
        "rank": config.rank,
        "n": e.n,
        "pid": std::process::id(),
        "time": e.time,
        "reason": e.reason,
        "request": e.request,
        "step": e.step,
        "stalled_s": e.stalled_s,
        "timeout_s": e.timeout_s,
        "typical_step_s": e.typical_step_s,
        "answered_by": "watchdog",
        "python": format!(
            "no answer within {:.1} s: a thread holds the GIL (stacks read without it)",
            config.grace.as_secs_f64()
        ),
        "threads": threads,
        "workers": null,
        "collectives": null,
        "flight_recorder": null,
    });
    doc.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_faulthandler_dump() {
        let text = "Thread 0x00007f0000000001 (most recent call first):\n  File \"/a/b.py\", line 12 in spin\n  File \"/a/main.py\", line 3 in <module>\n\nCurrent thread 0x00007f0000000002 (most recent call first):\n  <no Python frame>\n";
        let t = parse_dump(text);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].id, "0x00007f0000000001");
        assert!(!t[0].current);
        assert_eq!(t[0].frames[0], ("/a/b.py".into(), 12, "spin".into()));
        assert_eq!(t[0].frames[1].2, "<module>");
        assert!(t[1].current && t[1].frames.is_empty());
    }

    #[test]
    fn default_rule() {
        assert_eq!(timeout_for(None, None, false), FIRST_STEPS_TIMEOUT);
        assert_eq!(timeout_for(None, Some(1.0), true), FLOOR);
        assert_eq!(
            timeout_for(None, Some(10.0), true),
            Duration::from_secs(200)
        );
        assert_eq!(
            timeout_for(Some(Duration::from_secs(5)), Some(10.0), true),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn a_fixed_timeout_waits_out_the_start_up() {
        let five = Some(Duration::from_secs(5));
        assert_eq!(timeout_for(five, None, false), FIRST_STEPS_TIMEOUT);
        assert_eq!(timeout_for(five, None, true), Duration::from_secs(5));
        let long = Some(Duration::from_secs(900));
        assert_eq!(timeout_for(long, None, false), Duration::from_secs(900));
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        assert!(!p.stepped);
        p.observe(p.beat, t0 + Duration::from_secs(1));
        assert!(!p.stepped);
        p.observe(p.beat + 1, t0 + Duration::from_secs(2));
        assert!(p.stepped);
    }

    #[test]
    fn progress_measures_steps_and_resets_the_report() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        p.beat = 1;
        p.reported = Some(1);
        p.observe(3, t0 + Duration::from_secs(2));
        p.observe(4, t0 + Duration::from_secs(3));
        assert_eq!(p.reported, None);
        assert_eq!(p.typical(), Some(1.0));
    }

    struct Fake;
    impl StackDumper for Fake {
        fn dump(&self, fd: i32) -> bool {
            let s = b"Thread 0x1 (most recent call first):\n  File \"x.py\", line 7 in f\n";
            // SAFETY: fd is open for writing for the duration of this call.
            unsafe { libc::write(fd, s.as_ptr().cast(), s.len()) == s.len() as isize }
        }
    }

    /// A fresh directory of this test process, `tag` telling the tests apart, holding a
    /// request file that asks `request`.
    fn dir_with_request(tag: &str, request: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fastprof-hang-test-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(REQUEST_FILE), request).unwrap();
        dir
    }

    /// `path` once it exists (10 s at most).
    fn written(path: PathBuf) -> PathBuf {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !path.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        path
    }

    /// The watchdog tests share [`BEAT`] (a watchdog's start resets it).
    static WATCHDOGS: Mutex<()> = Mutex::new(());

    /// A watchdog of rank `rank` writing into `dir`, quick to poll, no
    /// abort, no SIGTERM hook.
    fn test_config(dir: &Path, rank: u32, timeout: Duration) -> Config {
        Config {
            rank_dir: dir.to_path_buf(),
            rank,
            timeout: Some(timeout),
            grace: Duration::from_millis(50),
            poll: Duration::from_millis(10),
            abort_status: None,
            abort_after: Duration::ZERO,
            sigterm_hook: false,
            sigterm_default: false,
        }
    }

    #[test]
    fn steps_before_the_thread_runs_count_and_an_earlier_runs_do_not() {
        let _one = WATCHDOGS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("fastprof-hang-test-b-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        // An earlier run in this process ended its step 2.
        beat(2);
        let cfg = test_config(&dir, 0, Duration::from_millis(200));
        let w = Watchdog::start(cfg, Box::new(Fake)).unwrap();
        // This run's steps 0-2 end at once (before the thread's first poll),
        // leaving the beat where the earlier run left it; then it stalls.
        for b in 0..3 {
            beat(b);
        }
        let e = w.next(Duration::from_secs(20)).expect("a stall reported");
        assert_eq!((e.reason, e.step), ("stalled", Some(2)));
        assert!(
            e.timeout_s < 1.0,
            "the start-up timeout stayed: {}",
            e.timeout_s
        );
        drop(w);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_request_unclaimed_is_written_by_the_thread() {
        let _one = WATCHDOGS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = dir_with_request("a", "req-1");
        let cfg = test_config(&dir, 3, Duration::from_secs(3600));
        let w = Watchdog::start(cfg, Box::new(Fake)).unwrap();
        let e = w.next(Duration::from_secs(10)).expect("an event");
        assert_eq!(
            (e.n, e.reason, e.request.as_deref()),
            (1, "request", Some("req-1"))
        );
        let path = written(dir.join("hang-1.json"));
        assert!(
            !w.claim(1),
            "the thread wrote it: Python's claim comes too late"
        );
        let doc: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(doc["rank"], 3);
        assert_eq!(doc["answered_by"], "watchdog");
        assert_eq!(doc["threads"][0]["frames"][0]["line"], 7);
        drop(w);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_request_unclaimed_under_abort_does_not_end_the_process() {
        // hang_action=abort ends a stalled rank after its evidence; a request is no stall.
        // Were it to end the process, this test binary would exit with status 71.
        let _one = WATCHDOGS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = dir_with_request("c", "req-2");
        let mut cfg = test_config(&dir, 0, Duration::from_secs(3600));
        cfg.abort_status = Some(71);
        cfg.abort_after = Duration::from_millis(20);
        let w = Watchdog::start(cfg, Box::new(Fake)).unwrap();
        let e = w.next(Duration::from_secs(10)).expect("an event");
        assert_eq!((e.reason, e.request.as_deref()), ("request", Some("req-2")));
        assert!(
            written(dir.join("hang-1.json")).exists(),
            "the thread wrote no evidence"
        );
        // Past abort_after, and another request is still answered.
        std::thread::sleep(Duration::from_millis(300));
        fs::write(dir.join(REQUEST_FILE), "req-3").unwrap();
        let e = w.next(Duration::from_secs(10)).expect("a second event");
        assert_eq!((e.n, e.request.as_deref()), (2, Some("req-3")));
        drop(w);
        let _ = fs::remove_dir_all(&dir);
    }
}
