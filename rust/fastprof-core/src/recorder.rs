//! The process-wide recorder: start/stop, per-thread registration and the
//! hot-path calls. This is what `fastprof.span` and friends reach.
//!
//! The hot path is one relaxed load of [`ACTIVE_GEN`] (0 = not recording),
//! a thread-local access, one CLOCK_MONOTONIC read and one ring push. No
//! lock, no allocation, no syscall. A thread registers its ring on its first
//! event of a recording "generation"; that slow path takes a mutex.
//!
//! Spans nest by construction: an `End` closes the innermost open span of the
//! calling thread. To keep that true when rings fill up, the producer reserves
//! a slot for the `End` of every recorded open span, and once a `Begin` is
//! dropped, everything nested inside it is dropped too (and counted), so the
//! writer never sees an `End` without its `Begin`.
//!
//! Fork safety: the state a forked child inherits may be mid-update by a
//! thread that does not exist in the child, so [`after_fork_in_child`] never
//! touches it: it abandons the old state (leaking it) and starts clean.

use crate::clock::{self, Anchor};
use crate::config::Config;
use crate::error::{CoreError, Result};
use crate::record::{Extra, Kind, Record, FLAG_EXCEPTION};
use crate::ring::{Push, Ring};
use crate::sampler::{Sampler, SamplerShared};
use crate::writer::{Writer, WriterReport};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};

/// The generation being recorded, or 0 when no recorder runs. Hot-path loads
/// are Relaxed: a stale read only means one event more or less around a
/// start/stop, and registration re-checks under the state mutex.
static ACTIVE_GEN: AtomicU64 = AtomicU64::new(0);
/// Generation counter; never reused, so thread-locals from an old run are
/// recognised as stale.
static NEXT_GEN: AtomicU64 = AtomicU64::new(0);

/// One recording thread as the writer sees it.
pub struct ThreadEntry {
    pub ring: Ring,
    /// OS thread id (what `threading.get_native_id()` returns).
    pub tid: u64,
    pub name: String,
    /// Events this thread could not record. Relaxed: a plain counter, read by
    /// the writer for reports; no other memory depends on it.
    pub drops: AtomicU64,
    /// Set by the thread-local destructor; Release so that the writer, seeing
    /// it with Acquire, also sees every record pushed before the exit.
    pub exited: AtomicBool,
    /// The writer, unparked each time another quarter of this ring fills.
    pub writer: Thread,
}

/// State shared between the recorder handle, the registering threads and the writer.
pub struct Shared {
    pub generation: u64,
    pub config: Config,
    pub threads: Mutex<Vec<Arc<ThreadEntry>>>,
    /// Set (then the writer unparked) to ask the writer to finish. The writer
    /// sleeps until its next flush is due or a producer nudges it (a ring has
    /// filled another quarter), so an idle recorder wakes once per flush
    /// interval instead of polling.
    pub stop: AtomicBool,
    /// Ticks when stop was requested: open spans are closed there.
    pub stop_ts: AtomicU64,
    pub start_anchor: Anchor,
    /// What record timestamps are ("tsc" or "CLOCK_MONOTONIC").
    pub clock_source: &'static str,
    /// The sampler's metadata and readings, when sampling is on.
    pub sampler: Mutex<Option<Arc<SamplerShared>>>,
}

impl Shared {
    /// Stop recording because of an internal failure (called by the writer):
    /// the job goes on, new events become no-ops.
    pub fn disable(&self) {
        // Only clear our own generation, never a newer run's.
        let _ =
            ACTIVE_GEN.compare_exchange(self.generation, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}

struct Running {
    shared: Arc<Shared>,
    writer: JoinHandle<WriterReport>,
    sampler: Option<Sampler>,
}

/// The sampler of the running or most recently stopped recorder, so that its
/// readings stay available to Python after `stop`.
static LAST_SAMPLER: Mutex<Option<Arc<SamplerShared>>> = Mutex::new(None);

/// The running (or last) recorder's sampler data, if it sampled.
pub fn sampler() -> Option<Arc<SamplerShared>> {
    LAST_SAMPLER
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

type State = Mutex<Option<Running>>;

/// The recorder state lives behind a pointer so that a forked child can drop
/// the whole (possibly locked) thing and start from a fresh one.
static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());

fn state() -> &'static State {
    let p = STATE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: states are leaked, never freed, so the pointer stays valid.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(Mutex::new(None)));
    match STATE.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: we just published `fresh`, which is leaked.
        Ok(_) => unsafe { &*fresh },
        Err(existing) => {
            // SAFETY: `fresh` was never shared; `existing` is leaked like all states.
            unsafe {
                drop(Box::from_raw(fresh));
                &*existing
            }
        }
    }
}

fn lock_state() -> std::sync::MutexGuard<'static, Option<Running>> {
    state().lock().unwrap_or_else(|e| e.into_inner())
}

/// Start recording. Validates `config`, creates the trace directory and opens
/// the first segment before anything is recorded, so bad options and
/// unwritable directories fail here.
pub fn start(config: Config) -> Result<()> {
    config.validate()?;
    let mut st = lock_state();
    if let Some(r) = st.as_ref() {
        return Err(CoreError::AlreadyRunning {
            run_dir: r.shared.config.trace_dir.clone(),
        });
    }
    let generation = NEXT_GEN.fetch_add(1, Ordering::Relaxed) + 1;
    let clock_source = clock::select_source();
    let shared = Arc::new(Shared {
        generation,
        config,
        threads: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        stop_ts: AtomicU64::new(0),
        start_anchor: Anchor::take(),
        clock_source,
        sampler: Mutex::new(None),
    });
    let writer = Writer::create(shared.clone())?;
    let handle = std::thread::Builder::new()
        .name("fastprof-writer".into())
        .spawn(move || writer.run())
        .map_err(|e| CoreError::io(&shared.config.trace_dir, e))?;
    *st = Some(Running {
        shared: shared.clone(),
        writer: handle,
        sampler: None,
    });
    // Release: a thread that sees this generation and registers finds the
    // state above (it re-reads it under the mutex anyway).
    ACTIVE_GEN.store(generation, Ordering::Release);
    // The sampler records like any thread, so it starts once recording has.
    if let Some(sc) = shared.config.sampler.clone() {
        match Sampler::start(sc) {
            Ok(s) => {
                *shared.sampler.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.shared.clone());
                *LAST_SAMPLER.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.shared.clone());
                if let Some(r) = st.as_mut() {
                    r.sampler = Some(s);
                }
            }
            Err(e) => {
                drop(st);
                let _ = stop();
                return Err(CoreError::io(&shared.config.trace_dir, e));
            }
        }
    } else {
        *LAST_SAMPLER.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
    Ok(())
}

/// Stop recording: drain every ring, close open spans at this instant,
/// finalize the segment, and return the writer's report.
pub fn stop() -> Result<WriterReport> {
    let mut running = lock_state().take().ok_or(CoreError::NotRunning)?;
    // Sampler first: its last readings still go into the trace.
    if let Some(s) = running.sampler.take() {
        s.stop();
    }
    let sh = &running.shared;
    sh.stop_ts.store(clock::ticks(), Ordering::Relaxed);
    sh.disable();
    // Release: the writer's Acquire load sees stop_ts and every push before it.
    sh.stop.store(true, Ordering::Release);
    running.writer.thread().unpark();
    running.writer.join().map_err(|_| CoreError::Io {
        path: sh.config.trace_dir.clone(),
        source: std::io::Error::other("the fastprof writer thread panicked"),
    })
}

/// True while a recorder runs and has not been disabled by a failure.
pub fn is_active() -> bool {
    ACTIVE_GEN.load(Ordering::Relaxed) != 0
}

/// Forget all recorder state in a freshly forked child: the writer thread does
/// not exist there and any mutex may be held by a thread that vanished.
pub fn after_fork_in_child() {
    ACTIVE_GEN.store(0, Ordering::Release);
    // The old state is leaked on purpose: freeing it could touch a lock held by
    // a thread that does not exist in this process.
    STATE.store(std::ptr::null_mut(), Ordering::Release);
    crate::names::after_fork_in_child();
}

// ---------------------------------------------------------------- thread-local

struct Local {
    generation: Cell<u64>,
    /// Borrowed view of `owner`'s entry, valid while `generation` matches.
    entry: Cell<*const ThreadEntry>,
    owner: RefCell<Option<Arc<ThreadEntry>>>,
    /// Spans this thread has begun (recorded or not) and not ended.
    depth: Cell<u32>,
    /// Recorded `Begin`s whose `End` is still due: slots reserved in the ring.
    open_recorded: Cell<u32>,
    /// Depth of the outermost dropped span, 0 if none: everything inside is dropped.
    drop_floor: Cell<u32>,
    /// Producer's private copy of the ring's tail (see `Ring::push`).
    cached_tail: Cell<u64>,
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(e) = self.owner.get_mut().take() {
            e.exited.store(true, Ordering::Release);
        }
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            generation: Cell::new(0),
            entry: Cell::new(std::ptr::null()),
            owner: RefCell::new(None),
            depth: Cell::new(0),
            open_recorded: Cell::new(0),
            drop_floor: Cell::new(0),
            cached_tail: Cell::new(0),
        }
    };
}

#[cfg(target_os = "linux")]
fn native_tid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

#[cfg(not(target_os = "linux"))]
fn native_tid() -> u64 {
    let mut tid: u64 = 0;
    // SAFETY: null thread = the calling thread; `tid` is writable.
    unsafe { libc::pthread_threadid_np(0, &mut tid) };
    tid
}

/// Slow path: give this thread a ring in generation `gen`.
#[cold]
fn register(l: &Local, gen: u64, thread_name: &mut dyn FnMut() -> String) -> bool {
    let name = thread_name();
    let st = lock_state();
    let Some(running) = st.as_ref() else {
        return false;
    };
    if running.shared.generation != gen {
        return false;
    }
    let entry = Arc::new(ThreadEntry {
        ring: Ring::new(running.shared.config.ring_capacity()),
        tid: native_tid(),
        name,
        drops: AtomicU64::new(0),
        exited: AtomicBool::new(false),
        writer: running.writer.thread().clone(),
    });
    running
        .shared
        .threads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(entry.clone());
    drop(st);
    if let Some(old) = l.owner.replace(Some(entry.clone())) {
        old.exited.store(true, Ordering::Release);
    }
    l.entry.set(Arc::as_ptr(&entry));
    l.generation.set(gen);
    l.depth.set(0);
    l.open_recorded.set(0);
    l.drop_floor.set(0);
    l.cached_tail.set(0);
    true
}

/// Run `f` with this thread's entry, registering it first if needed. `None`
/// when not recording.
#[inline(always)]
fn with_entry<R>(
    thread_name: &mut dyn FnMut() -> String,
    f: impl FnOnce(&Local, &ThreadEntry) -> R,
) -> Option<R> {
    let gen = ACTIVE_GEN.load(Ordering::Relaxed);
    if gen == 0 {
        return None;
    }
    LOCAL
        .try_with(|l| {
            if l.generation.get() != gen && !register(l, gen, thread_name) {
                return None;
            }
            // SAFETY: `owner` keeps the entry alive for as long as `entry` is set.
            let e = unsafe { &*l.entry.get() };
            Some(f(l, e))
        })
        .ok()
        .flatten()
}

#[inline(always)]
fn push(l: &Local, e: &ThreadEntry, rec: Record, reserve: u64) -> bool {
    let mut ct = l.cached_tail.get();
    // SAFETY: only this thread pushes into its own ring.
    let r = unsafe { e.ring.push(rec, reserve, &mut ct) };
    l.cached_tail.set(ct);
    if r == Push::Nudge {
        nudge(e);
    }
    r.stored()
}

/// Wake the writer: this thread's ring has filled another quarter.
#[cold]
#[inline(never)]
fn nudge(e: &ThreadEntry) {
    e.writer.unpark();
}

#[cold]
fn count_drop(e: &ThreadEntry, rec: &Record) {
    e.drops.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the record was never pushed, so we still own its extra.
    drop(unsafe { rec.take_extra() });
}

fn begin_record(l: &Local, e: &ThreadEntry, rec: Record) {
    let depth = l.depth.get() + 1;
    l.depth.set(depth);
    if l.drop_floor.get() != 0 {
        count_drop(e, &rec);
        return;
    }
    let open = l.open_recorded.get();
    // Reserve the slot for this span's own End plus every End already due.
    if push(l, e, rec, open as u64 + 1) {
        l.open_recorded.set(open + 1);
    } else {
        l.drop_floor.set(depth);
        count_drop(e, &rec);
    }
}

/// Open a span named by interned id `name` on this thread.
#[inline]
pub fn begin(name: u32, thread_name: &mut dyn FnMut() -> String) {
    with_entry(thread_name, |l, e| {
        begin_record(l, e, Record::new(Kind::Begin, name, clock::ticks(), 0, 0))
    });
}

/// Open a span carrying args and/or an un-interned name (slow path).
pub fn begin_extra(name: u32, extra: Box<Extra>, thread_name: &mut dyn FnMut() -> String) {
    with_entry(thread_name, |l, e| {
        begin_record(
            l,
            e,
            Record::with_extra(Kind::Begin, name, clock::ticks(), extra),
        )
    });
}

/// Close this thread's innermost open span (`exception`: its body raised).
#[inline]
pub fn end(exception: bool) {
    let gen = ACTIVE_GEN.load(Ordering::Relaxed);
    if gen == 0 {
        return;
    }
    let _ = LOCAL.try_with(|l| {
        if l.generation.get() != gen {
            return; // nothing of this generation is open on this thread
        }
        let depth = l.depth.get();
        if depth == 0 {
            return; // the span began before recording started
        }
        l.depth.set(depth - 1);
        let floor = l.drop_floor.get();
        if floor != 0 {
            if depth == floor {
                l.drop_floor.set(0);
            }
            return; // its Begin was dropped (and counted)
        }
        // SAFETY: `owner` keeps the entry alive while the generation matches.
        let e = unsafe { &*l.entry.get() };
        let flags = if exception { FLAG_EXCEPTION } else { 0 };
        let ok = push(l, e, Record::new(Kind::End, 0, clock::ticks(), 0, flags), 0);
        // The slot was reserved when the Begin was pushed.
        debug_assert!(ok, "reserved End slot missing");
        l.open_recorded.set(l.open_recorded.get().saturating_sub(1));
    });
}

fn point_record(l: &Local, e: &ThreadEntry, rec: Record) {
    if !push(l, e, rec, l.open_recorded.get() as u64) {
        count_drop(e, &rec);
    }
}

/// A point event.
#[inline]
pub fn instant(name: u32, extra: Option<Box<Extra>>, thread_name: &mut dyn FnMut() -> String) {
    match extra {
        None => with_entry(thread_name, |l, e| {
            point_record(l, e, Record::new(Kind::Instant, name, clock::ticks(), 0, 0))
        }),
        Some(x) => with_entry(thread_name, |l, e| {
            point_record(
                l,
                e,
                Record::with_extra(Kind::Instant, name, clock::ticks(), x),
            )
        }),
    };
}

/// A counter sample of one value.
#[inline]
pub fn counter(name: u32, value: f64, thread_name: &mut dyn FnMut() -> String) {
    with_entry(thread_name, |l, e| {
        point_record(
            l,
            e,
            Record::new(Kind::Counter, name, clock::ticks(), value.to_bits(), 0),
        )
    });
}

/// Counter samples at one tick time, pushed under one thread-local lookup
/// (the sampler publishes a tick's readings this way).
pub fn counters_at(items: &[(u32, f64)], ticks: u64, thread_name: &mut dyn FnMut() -> String) {
    if items.is_empty() {
        return;
    }
    with_entry(thread_name, |l, e| {
        for &(name, value) in items {
            point_record(
                l,
                e,
                Record::new(Kind::Counter, name, ticks, value.to_bits(), 0),
            );
        }
    });
}

/// A counter sample of several series (`extra.args_json` is the mapping).
pub fn counter_extra(name: u32, extra: Box<Extra>, thread_name: &mut dyn FnMut() -> String) {
    with_entry(thread_name, |l, e| {
        point_record(
            l,
            e,
            Record::with_extra(Kind::Counter, name, clock::ticks(), extra),
        )
    });
}
