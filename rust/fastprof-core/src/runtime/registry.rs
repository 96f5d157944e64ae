//! Per-thread ring registration and the hot-path calls (`begin`, `end`,
//! `instant`, `counter`). This is what `fastprof.span` and friends reach; the
//! calls record into the one active [`crate::runtime::session::Session`].
//!
//! The hot path is one relaxed load of [`WORD`], a thread-local access, one
//! tick read and one ring push. No lock, no allocation, no syscall. A thread
//! registers its ring on its first event of a session ("generation"); that
//! slow path takes a mutex and allocates the ring fallibly: a thread that
//! cannot get one has its events counted as dropped (with one warning).
//!
//! `WORD` is `generation << 1 | paused`, 0 when nothing records. A pause gates
//! new Begins, instants and counters; an End of a recorded Begin always
//! passes, so spans open across a pause close correctly. A Begin made while
//! paused is skipped together with everything nested in it (not counted as a
//! drop).
//!
//! Spans nest by construction: an `End` closes the innermost open span of the
//! calling thread. To keep that true when rings fill up, the producer reserves
//! a slot for the `End` of every recorded open span, and once a `Begin` is
//! dropped, everything nested inside it is dropped too (and counted), so the
//! writer never sees an `End` without its `Begin`.

use crate::runtime::clock;
use crate::runtime::record::{Extra, Kind, Record, FLAG_EXCEPTION};
use crate::runtime::ring::{self, AllocError, Consumer, Growth, Producer, Push};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;

/// `generation << 1 | paused`, or 0 when no session records. Hot-path loads
/// are Relaxed: a stale read only means one event more or less around a
/// start/stop/pause, and registration re-checks under the registry mutex.
static WORD: AtomicU64 = AtomicU64::new(0);
/// Generation counter; never reused, so thread-locals from an old session are
/// recognised as stale.
static NEXT_GEN: AtomicU64 = AtomicU64::new(0);

/// What the registering thread can do for the registry: say its name, and
/// show the user a warning (the Python binding raises a `FastprofWarning`).
pub trait ThreadHooks {
    fn thread_name(&mut self) -> String;
    fn warn(&mut self, message: &str) {
        say(message);
    }
}

/// Any closure giving the thread's name serves (warnings go to stderr).
impl<F: FnMut() -> String> ThreadHooks for F {
    fn thread_name(&mut self) -> String {
        self()
    }
}

/// `fastprof: <message>` on stderr in ONE write: several processes (DataLoader
/// workers) share a stderr pipe, and a line written in pieces interleaves
/// with theirs (one write of less than PIPE_BUF bytes is atomic).
pub fn say(message: &str) {
    use std::io::Write;
    let line = format!("fastprof: {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Hooks for Rust threads (the sampler, tests, benches): a fixed name,
/// warnings on stderr.
pub struct Named(pub &'static str);

impl ThreadHooks for Named {
    fn thread_name(&mut self) -> String {
        self.0.to_string()
    }
}

/// One recording thread as the writer sees it.
pub struct ThreadMeta {
    /// OS thread id (what `threading.get_native_id()` returns).
    pub tid: u64,
    pub name: Arc<str>,
    /// Events this thread could not record. Relaxed: a plain counter, read by
    /// the writer for reports; no other memory depends on it.
    pub drops: AtomicU64,
    /// The writer, unparked each time another quarter of this ring fills.
    writer: Thread,
}

/// A ring registered since the writer last looked.
pub struct NewThread {
    pub consumer: Consumer,
    pub meta: Arc<ThreadMeta>,
}

/// The producer side a thread holds for its session.
struct Registered {
    producer: Producer,
    meta: Arc<ThreadMeta>,
    session: Arc<dyn Target>,
}

/// What the registry needs of the session threads register with (the
/// session implements it; the registry never depends on the session).
pub trait Target: Send + Sync {
    fn generation(&self) -> u64;
    /// Slots per ring.
    fn ring_capacity(&self) -> usize;
    /// The writer thread, woken when a ring fills another quarter.
    fn writer(&self) -> Thread;
    /// Hand a new ring's consumer to the writer.
    fn adopt(&self, t: NewThread);
    /// A thread got no ring; returns the warning to show (once per session).
    fn ring_alloc_failed(&self, tid: u64, name: &str, e: AllocError) -> Option<String>;
    /// Events of threads without a ring (counted as dropped). Relaxed counter.
    fn ringless_drops(&self) -> &AtomicU64;
    /// Where the session records (for messages).
    fn describe(&self) -> String;
    /// Messages for the user not yet shown on a Python thread.
    fn take_notices(&self) -> Vec<String>;
    /// Heap bytes of payloads (args, names) in this session's rings; the
    /// writer subtracts what it drains. Relaxed: a budget, not a fence.
    fn payload_in_flight(&self) -> &AtomicU64;
    /// Events dropped because the payload budget was spent. Relaxed counter.
    fn payload_drops(&self) -> &AtomicU64;
    /// The budget this session's rings grow on.
    fn ring_growth(&self) -> &Arc<Growth>;
}

/// Set when the recording session has a message for the user (a failure,
/// a shared directory): the binding's next non-hot API call on a Python
/// thread turns it into a `FastprofWarning`. Relaxed: a hint; the messages
/// themselves are behind the session's mutex.
pub static NOTICES_PENDING: AtomicBool = AtomicBool::new(false);

/// The recording session's pending messages (empty when there are none).
pub fn take_notices() -> Vec<String> {
    if !NOTICES_PENDING.swap(false, Ordering::Relaxed) {
        return Vec::new();
    }
    lock_current()
        .as_ref()
        .map(|t| t.take_notices())
        .unwrap_or_default()
}

/// The session that threads register with. Behind a pointer so that a forked
/// child can drop the whole (possibly locked) thing and start from a fresh one.
type Current = Mutex<Option<Arc<dyn Target>>>;
static CURRENT: AtomicPtr<Current> = AtomicPtr::new(std::ptr::null_mut());

fn current() -> &'static Current {
    crate::runtime::leaked::get_or_install(&CURRENT, || Mutex::new(None))
}

pub(crate) fn lock_current() -> MutexGuard<'static, Option<Arc<dyn Target>>> {
    current().lock().unwrap_or_else(|e| e.into_inner())
}

/// A new, never used generation number.
pub(crate) fn next_generation() -> u64 {
    NEXT_GEN.fetch_add(1, Ordering::Relaxed) + 1
}

/// Make `gen` the recording generation (called with the current-session lock held).
pub(crate) fn activate(gen: u64) {
    // Release: a thread that sees this generation and registers finds the
    // session (it re-reads it under the mutex anyway).
    WORD.store(gen << 1, Ordering::Release);
}

/// Stop recording generation `gen`, paused or not; never touches a newer one.
pub(crate) fn deactivate(gen: u64) {
    for w in [gen << 1, gen << 1 | 1] {
        if WORD
            .compare_exchange(w, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
    }
}

/// Pause or resume generation `gen`; false when it is not the recording one.
pub(crate) fn set_paused(gen: u64, paused: bool) -> bool {
    let (from, to) = if paused {
        (gen << 1, gen << 1 | 1)
    } else {
        (gen << 1 | 1, gen << 1)
    };
    WORD.compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
        || WORD.load(Ordering::Relaxed) == to
}

/// True while a session records (paused or not) and has not been disabled.
pub fn is_active() -> bool {
    WORD.load(Ordering::Relaxed) != 0
}

/// The generation that records now (paused or not), 0 when none does. No
/// lock, so cheap enough for every step: generations are never reused, so a
/// match means that very session still records. Relaxed, as on the hot path:
/// a stale read only moves the answer across a concurrent start or stop.
pub fn recording_generation() -> u64 {
    WORD.load(Ordering::Relaxed) >> 1
}

/// True while the recording session is paused.
pub fn is_paused() -> bool {
    WORD.load(Ordering::Relaxed) & 1 == 1
}

/// Set in a process forked (or, through `FASTPROF_RECORDING_PID`, spawned)
/// from a recording process, e.g. a DataLoader worker: its recording calls
/// record nothing, and the first one says so once instead of staying silent.
pub static FORKED_FROM_RECORDING: AtomicBool = AtomicBool::new(false);
static FORKED_WARNED: AtomicBool = AtomicBool::new(false);

/// A recording call in a child of a recording process: say once that
/// nothing is recorded here.
#[cold]
#[inline(never)]
fn not_recorded_here(hooks: &mut dyn ThreadHooks) {
    if FORKED_FROM_RECORDING.load(Ordering::Relaxed) && !FORKED_WARNED.swap(true, Ordering::Relaxed)
    {
        hooks.warn(&format!(
            "this process (pid {}) was started by a recording process, and its spans, instants \
             and counters are not recorded (DataLoader workers, forked or spawned helpers); \
             time them from the main process, or start a Recorder here with its own rank",
            std::process::id()
        ));
    }
}

/// This process's id, refreshed in a forked child by the fork handler; 0
/// until [`install_fork_handlers`] ran (then every call asks the kernel).
/// Relaxed: the handler runs in the child before any of its other code.
static PID: AtomicU32 = AtomicU32::new(0);

/// This process's id without a system call once the fork handlers are
/// installed (the step loop asks at every step whether it was forked).
#[inline(always)]
pub fn current_pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => std::process::id(),
        p => p,
    }
}

/// Install the process's fork handlers (once): the name table is held still
/// across `fork()` and copied consistently into the child, and the child
/// forgets the parent's recording. Every fork counts, also those made by
/// torch's DataLoader or by C code, not only `os.fork()`.
pub fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        extern "C" fn prepare() {
            crate::runtime::names::prepare_fork();
        }
        extern "C" fn parent() {
            crate::runtime::names::parent_after_fork();
        }
        extern "C" fn child() {
            // getpid is async-signal-safe, as a fork child handler needs.
            PID.store(std::process::id(), Ordering::Relaxed);
            crate::runtime::names::child_after_fork();
            after_fork_in_child();
        }
        // SAFETY: the handlers are plain functions that live for the whole
        // process; pthread_atfork only records them.
        let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if rc == 0 {
            PID.store(std::process::id(), Ordering::Relaxed);
        }
    });
}

/// Forget all recording state in a freshly forked child: the writer thread
/// does not exist there and any mutex may be held by a thread that vanished.
/// The old state is leaked on purpose: freeing it could touch a lock held by
/// a thread that does not exist in this process.
fn after_fork_in_child() {
    if WORD.load(Ordering::Relaxed) != 0 {
        FORKED_FROM_RECORDING.store(true, Ordering::Relaxed);
    }
    WORD.store(0, Ordering::Release);
    CURRENT.store(std::ptr::null_mut(), Ordering::Release);
}

// ---------------------------------------------------------------- thread-local

struct Local {
    generation: Cell<u64>,
    /// Borrowed view of `owner`, valid while `generation` matches; null when
    /// this thread could not get a ring in this generation.
    reg: Cell<*const Registered>,
    owner: RefCell<Option<Box<Registered>>>,
    /// The session, when this thread has no ring (its drops are counted there).
    ringless: RefCell<Option<Arc<dyn Target>>>,
    /// Spans this thread has begun (recorded or not) and not ended.
    depth: Cell<u32>,
    /// Recorded `Begin`s whose `End` is still due: slots reserved in the ring.
    open_recorded: Cell<u32>,
    /// Depth of the outermost skipped span, 0 if none: everything inside is skipped.
    floor: Cell<u32>,
    /// Whether skips under `floor` are drops (ring full) or gated (paused).
    floor_counts: Cell<bool>,
    /// The step context this thread's ring last carried in this generation
    /// (epoch, its first step, action); `NO_STEP_CONTEXT` before any.
    step_context: Cell<(u64, u64, u32)>,
}

const NO_STEP_CONTEXT: (u64, u64, u32) = (u64::MAX, u64::MAX, u32::MAX);

thread_local! {
    static LOCAL: Local = const {
        Local {
            generation: Cell::new(0),
            reg: Cell::new(std::ptr::null()),
            owner: RefCell::new(None),
            ringless: RefCell::new(None),
            depth: Cell::new(0),
            open_recorded: Cell::new(0),
            floor: Cell::new(0),
            floor_counts: Cell::new(false),
            step_context: Cell::new(NO_STEP_CONTEXT),
        }
    };
}

/// Spans this thread has begun in the current recording and not yet ended
/// (recorded or gated); 0 when it has not recorded in this one. The Python
/// profiler compares it with the depth at which it opened its step span, so
/// that a step boundary never closes a span the user opened inside the step.
pub fn thread_depth() -> u32 {
    let gen = WORD.load(Ordering::Relaxed) >> 1;
    LOCAL.with(|l| {
        if l.generation.get() == gen {
            l.depth.get()
        } else {
            0
        }
    })
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

/// Slow path: give this thread a ring in generation `gen`. False when that
/// generation no longer records.
#[cold]
#[inline(never)]
fn register(l: &Local, gen: u64, hooks: &mut dyn ThreadHooks) -> bool {
    let name: Arc<str> = hooks.thread_name().into();
    let cur = lock_current();
    let Some(session) = cur.as_ref().filter(|s| s.generation() == gen).cloned() else {
        return false;
    };
    drop(cur);
    // Outside the lock: a large ring is an mmap and must not stall others.
    let ring = ring::ring(session.ring_capacity(), session.ring_growth());
    // A previous generation's ring goes now: its consumer sees the producer gone.
    drop(l.owner.take());
    l.ringless.replace(None);
    l.generation.set(gen);
    l.depth.set(0);
    l.open_recorded.set(0);
    l.floor.set(0);
    l.floor_counts.set(false);
    l.step_context.set(NO_STEP_CONTEXT);
    match ring {
        Ok((producer, consumer)) => {
            let meta = Arc::new(ThreadMeta {
                tid: native_tid(),
                name,
                drops: AtomicU64::new(0),
                writer: session.writer(),
            });
            session.adopt(NewThread {
                consumer,
                meta: meta.clone(),
            });
            let reg = Box::new(Registered {
                producer,
                meta,
                session: session.clone(),
            });
            l.reg.set(&*reg);
            *l.owner.borrow_mut() = Some(reg);
        }
        Err(e) => {
            l.reg.set(std::ptr::null());
            if let Some(msg) = session.ring_alloc_failed(native_tid(), &name, e) {
                hooks.warn(&msg);
            }
            *l.ringless.borrow_mut() = Some(session);
        }
    }
    true
}

/// Run `f` with this thread's ring, registering it first if needed. `w` is
/// the state word the caller loaded (non-zero). `None` when the generation no
/// longer records or this thread has no ring.
#[inline(always)]
fn with_reg<R>(
    w: u64,
    hooks: &mut dyn ThreadHooks,
    f: impl FnOnce(&Local, &Registered) -> R,
) -> Option<R> {
    let gen = w >> 1;
    LOCAL
        .try_with(|l| {
            if l.generation.get() != gen && !register(l, gen, hooks) {
                return None;
            }
            let r = l.reg.get();
            if r.is_null() {
                ringless_drop(l);
                return None;
            }
            // SAFETY: `owner` keeps the registration alive while `reg` is set.
            Some(f(l, unsafe { &*r }))
        })
        .ok()
        .flatten()
}

/// An event of a thread that has no ring: counted as dropped on the session.
#[cold]
fn ringless_drop(l: &Local) {
    if let Some(s) = l.ringless.borrow().as_ref() {
        s.ringless_drops().fetch_add(1, Ordering::Relaxed);
    }
}

/// Push; false when the ring was full (the record is gone, its extra freed).
#[inline(always)]
fn push(r: &Registered, rec: Record, reserve: u64) -> bool {
    if rec.has_extra() {
        return push_extra(r, rec, reserve);
    }
    match r.producer.push(rec, reserve) {
        Push::Done => true,
        Push::Nudge => {
            nudge(r);
            true
        }
        Push::Full => false,
    }
}

/// A record carrying args or a name: pushed only while the session's payload
/// budget ([`crate::runtime::record::MAX_PAYLOAD_IN_FLIGHT`]) has room.
#[inline(never)]
fn push_extra(r: &Registered, rec: Record, reserve: u64) -> bool {
    let bytes = rec.extra_bytes();
    let budget = r.session.payload_in_flight();
    if budget.fetch_add(bytes, Ordering::Relaxed) + bytes
        > crate::runtime::record::MAX_PAYLOAD_IN_FLIGHT
    {
        budget.fetch_sub(bytes, Ordering::Relaxed);
        r.session.payload_drops().fetch_add(1, Ordering::Relaxed);
        return false; // `rec` is dropped here, freeing its extra
    }
    let stored = match r.producer.push(rec, reserve) {
        Push::Done => true,
        Push::Nudge => {
            nudge(r);
            true
        }
        Push::Full => false,
    };
    if !stored {
        budget.fetch_sub(bytes, Ordering::Relaxed);
    }
    stored
}

/// Wake the writer: this thread's ring has filled another quarter.
#[cold]
#[inline(never)]
fn nudge(r: &Registered) {
    r.meta.writer.unpark();
}

/// Count a record that could not be recorded (dropping it frees its extra).
#[cold]
#[inline(never)]
fn count_drop(r: &Registered) {
    r.meta.drops.fetch_add(1, Ordering::Relaxed);
}

/// Open a span on this thread's ring. `make` builds the Begin only when it is
/// pushed: a Begin skipped (paused, or nested in a dropped or skipped span)
/// costs no clock read, and the record goes straight into the ring slot.
#[inline(always)]
fn begin_record(l: &Local, r: &Registered, paused: bool, make: impl FnOnce() -> Record) {
    let depth = l.depth.get() + 1;
    l.depth.set(depth);
    if l.floor.get() != 0 {
        if l.floor_counts.get() {
            count_drop(r);
        }
        return; // `make` goes unused, freeing any extra it holds
    }
    if paused {
        l.floor.set(depth);
        l.floor_counts.set(false);
        return;
    }
    let open = l.open_recorded.get();
    // Reserve the slot for this span's own End plus every End already due.
    if push(r, make(), open as u64 + 1) {
        l.open_recorded.set(open + 1);
    } else {
        l.floor.set(depth);
        l.floor_counts.set(true);
        count_drop(r);
    }
}

/// Begin: registered threads track depth even while paused (so the matching
/// End is recognised); an unregistered thread skips a paused Begin entirely
/// (its End then finds depth 0 and is ignored too).
#[inline(always)]
fn begin_with(hooks: &mut dyn ThreadHooks, make: impl FnOnce() -> Record) {
    let w = WORD.load(Ordering::Relaxed);
    if w == 0 {
        if FORKED_FROM_RECORDING.load(Ordering::Relaxed) {
            not_recorded_here(hooks);
        }
        return;
    }
    if w & 1 != 0 {
        begin_paused(w >> 1, make);
        return;
    }
    with_reg(w, hooks, |l, r| begin_record(l, r, false, make));
}

#[cold]
#[inline(never)]
fn begin_paused(gen: u64, make: impl FnOnce() -> Record) {
    let _ = LOCAL.try_with(|l| {
        let r = l.reg.get();
        if l.generation.get() == gen && !r.is_null() {
            // SAFETY: `owner` keeps the registration alive while `reg` is set.
            begin_record(l, unsafe { &*r }, true, make);
        }
    });
}

/// Open a span named by interned id `name` on this thread.
///
/// The common case (recording, not paused, this thread registered in this
/// generation) goes straight to [`begin_record`] and is kept small so that it
/// inlines into the binding's method; everything else (registration, pause,
/// the forked child) goes through `begin_with`.
#[inline(always)]
pub fn begin(name: u32, hooks: &mut dyn ThreadHooks) {
    let w = WORD.load(Ordering::Relaxed);
    if w == 0 {
        if FORKED_FROM_RECORDING.load(Ordering::Relaxed) {
            not_recorded_here(hooks);
        }
        return;
    }
    let fast = LOCAL.try_with(|l| {
        let r = l.reg.get();
        if w & 1 != 0 || l.generation.get() != w >> 1 || r.is_null() {
            return false;
        }
        // SAFETY: `owner` keeps the registration alive while `reg` is set.
        let r = unsafe { &*r };
        begin_record(l, r, false, || {
            Record::new(Kind::Begin, name, clock::ticks(), 0)
        });
        true
    });
    if fast != Ok(true) {
        begin_slow(name, hooks);
    }
}

#[cold]
#[inline(never)]
fn begin_slow(name: u32, hooks: &mut dyn ThreadHooks) {
    begin_with(hooks, || Record::new(Kind::Begin, name, clock::ticks(), 0));
}

/// Open a span carrying args and/or an un-interned name (slow path).
pub fn begin_extra(name: u32, extra: Box<Extra>, hooks: &mut dyn ThreadHooks) {
    begin_with(hooks, || {
        Record::with_extra(Kind::Begin, name, clock::ticks(), extra)
    });
}

/// A span that began at `begin_ticks` (a [`clock::ticks`] reading taken
/// earlier on this thread) and ends now, pushed as its Begin and End at once.
/// The profiler records its step spans this way: a step's end (a
/// `Profiler.step()` call, an optimizer step) may come while spans the user
/// opened inside the step are still open, where a plain `end` would close
/// theirs. Collect pairs the two records as usual; the span's time may
/// enclose events recorded before it.
pub fn complete(
    name: u32,
    begin_ticks: u64,
    extra: Option<Box<Extra>>,
    hooks: &mut dyn ThreadHooks,
) {
    complete_with(begin_ticks, hooks, |t| match extra {
        Some(x) => Record::with_extra(Kind::Begin, name, t, x),
        None => Record::new(Kind::Begin, name, t, 0),
    });
}

/// Push `begin(ticks)` (its Begin, at `begin_ticks` but never after now)
/// and its End, now: what [`complete`] and [`step_complete`] record.
#[inline(always)]
fn complete_with(begin_ticks: u64, hooks: &mut dyn ThreadHooks, begin: impl FnOnce(u64) -> Record) {
    let begin_ticks = begin_ticks.min(clock::ticks());
    begin_with(hooks, || begin(begin_ticks));
    end(false);
}

/// Where a training step is, as its span's args say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepArgs {
    pub epoch: u64,
    pub batch: u64,
    pub batch_in_epoch: u64,
    /// The schedule action's interned name id.
    pub action: u32,
}

/// A training step's span, from `begin_ticks` to now, as [`complete`]
/// records one, with args `{"epoch", "batch", "batch_in_epoch", "action"}`
/// that the writer thread formats: the training thread pushes the step's
/// global step in the Begin and, when the epoch or action changed since
/// this thread's last step, one [`Kind::StepContext`] record before it. No
/// heap, no formatting here.
pub fn step_complete(name: u32, begin_ticks: u64, args: StepArgs, hooks: &mut dyn ThreadHooks) {
    super::hang::beat(args.batch);
    let context = (
        args.epoch,
        args.batch.saturating_sub(args.batch_in_epoch),
        args.action,
    );
    let w = WORD.load(Ordering::Relaxed);
    if w != 0 && w & 1 == 0 {
        let sent = with_reg(w, hooks, |l, r| {
            if l.step_context.get() == context || l.floor.get() != 0 {
                return true;
            }
            // Room for the context, the step's Begin and End, and every End due.
            let reserve = l.open_recorded.get() as u64 + 2;
            let (epoch, first, action) = context;
            let ok = push(r, Record::step_context(epoch, first, action), reserve);
            if ok {
                l.step_context.set(context);
            }
            ok
        });
        if sent == Some(false) {
            // The ring is full and the context did not go: the step goes
            // without args (if it gets in at all), never with another
            // step's. The next step sends the context again.
            complete_with(begin_ticks, hooks, |t| Record::new(Kind::Begin, name, t, 0));
            return;
        }
    }
    complete_with(begin_ticks, hooks, |t| {
        Record::step_begin(name, t, args.batch)
    });
}

/// A span from `begin_ticks` to `end_ticks` (both [`clock::ticks`]
/// readings taken earlier on this thread; neither after now, the begin not
/// after the end), pushed as its Begin and End at once: a span measured
/// earlier and recorded later (the step anatomy records a step's phases at
/// the step's end).
pub fn complete_between(name: u32, begin_ticks: u64, end_ticks: u64, hooks: &mut dyn ThreadHooks) {
    let end_ticks = end_ticks.min(clock::ticks());
    let begin_ticks = begin_ticks.min(end_ticks);
    begin_with(hooks, || Record::new(Kind::Begin, name, begin_ticks, 0));
    end_with(false, || end_ticks);
}

/// Close this thread's innermost open span (`exception`: its body raised).
#[inline(always)]
pub fn end(exception: bool) {
    end_with(exception, clock::ticks);
}

/// [`end`], its time read by `now` only when the End is pushed.
#[inline(always)]
fn end_with(exception: bool, now: impl FnOnce() -> u64) {
    let w = WORD.load(Ordering::Relaxed);
    if w == 0 {
        return;
    }
    let gen = w >> 1;
    let _ = LOCAL.try_with(|l| {
        let depth = l.depth.get();
        if l.generation.get() != gen || depth == 0 {
            // Nothing of this generation is open on this thread (the span
            // began before this thread registered, or in an older session).
            return;
        }
        l.depth.set(depth - 1);
        let floor = l.floor.get();
        if floor != 0 {
            if depth == floor {
                l.floor.set(0);
            }
            return; // its Begin was skipped (dropped and counted, or gated)
        }
        let r = l.reg.get();
        if r.is_null() {
            return;
        }
        // SAFETY: `owner` keeps the registration alive while `reg` is set.
        let r = unsafe { &*r };
        let flags = if exception { FLAG_EXCEPTION } else { 0 };
        // The slot was reserved when the Begin was pushed.
        if !push(r, Record::new(Kind::End, 0, now(), flags), 0) {
            end_slot_missing(r);
        }
        l.open_recorded.set(l.open_recorded.get().saturating_sub(1));
    });
}

/// The reserved End slot was not there: a broken invariant. Debug builds
/// stop; release builds count it (reported in the metadata) and go on.
#[cold]
#[inline(never)]
fn end_slot_missing(r: &Registered) {
    debug_assert!(false, "reserved End slot missing");
    END_SLOT_MISSING.fetch_add(1, Ordering::Relaxed);
    count_drop(r);
}

/// Values a recording call could not record as given (text Python cannot
/// encode, an object whose `str()` fails, a counter value that is not a
/// number): replaced or dropped, never raised, and counted here (written into
/// every segment's `otherData.replaced_values`). Relaxed counter.
pub static REPLACED_VALUES: AtomicU64 = AtomicU64::new(0);

/// Count one replaced or dropped value.
#[cold]
pub fn note_replaced() {
    REPLACED_VALUES.fetch_add(1, Ordering::Relaxed);
}

/// Violations of the reserved-End invariant since the process started.
/// Relaxed: a plain counter for reports.
pub static END_SLOT_MISSING: AtomicU64 = AtomicU64::new(0);

#[inline(always)]
fn point(hooks: &mut dyn ThreadHooks, gated: bool, make: impl FnOnce() -> Record) {
    let w = WORD.load(Ordering::Relaxed);
    if w == 0 || (gated && w & 1 != 0) {
        if w == 0 && FORKED_FROM_RECORDING.load(Ordering::Relaxed) {
            not_recorded_here(hooks);
        }
        return;
    }
    with_reg(w, hooks, |l, r| {
        if !push(r, make(), l.open_recorded.get() as u64) {
            count_drop(r);
        }
    });
}

/// A point event.
#[inline]
pub fn instant(name: u32, extra: Option<Box<Extra>>, hooks: &mut dyn ThreadHooks) {
    match extra {
        None => point(hooks, true, || {
            Record::new(Kind::Instant, name, clock::ticks(), 0)
        }),
        Some(x) => point(hooks, true, || {
            Record::with_extra(Kind::Instant, name, clock::ticks(), x)
        }),
    }
}

/// A counter sample of one value.
#[inline]
pub fn counter(name: u32, value: f64, hooks: &mut dyn ThreadHooks) {
    point(hooks, true, || Record::counter(name, clock::ticks(), value));
}

/// A counter sample that a pause does not gate (step markers: the schedule
/// must be visible in the trace whether or not events are being recorded).
pub fn counter_ungated(name: u32, value: f64, hooks: &mut dyn ThreadHooks) {
    point(hooks, false, || {
        Record::counter(name, clock::ticks(), value)
    });
}

/// Counter samples at one tick time, pushed under one thread-local lookup
/// (the sampler publishes a tick's readings this way). Not gated by a pause:
/// the sampler runs for the whole session.
pub fn counters_at(items: &[(u32, f64)], ticks: u64, hooks: &mut dyn ThreadHooks) {
    let w = WORD.load(Ordering::Relaxed);
    if items.is_empty() || w == 0 {
        return;
    }
    with_reg(w, hooks, |l, r| {
        for &(name, value) in items {
            if !push(
                r,
                Record::counter(name, ticks, value),
                l.open_recorded.get() as u64,
            ) {
                count_drop(r);
            }
        }
    });
}

/// An async span's begin or end (`extra.async_id` keys it: spans of one key
/// nest, spans of different keys may interleave on one thread). A begin is
/// gated by a pause; an end always passes (the writer drops an end whose
/// begin it never saw).
pub fn async_event(begin: bool, name: u32, extra: Box<Extra>, hooks: &mut dyn ThreadHooks) {
    let kind = if begin {
        Kind::AsyncBegin
    } else {
        Kind::AsyncEnd
    };
    point(hooks, begin, || {
        Record::with_extra(kind, name, clock::ticks(), extra)
    });
}

/// A counter sample of several series (`extra.args_json` is the mapping).
pub fn counter_extra(name: u32, extra: Box<Extra>, hooks: &mut dyn ThreadHooks) {
    point(hooks, true, || {
        Record::with_extra(Kind::Counter, name, clock::ticks(), extra)
    });
}

/// A thread description for sink tests.
#[cfg(test)]
pub(crate) fn test_meta(tid: u64, name: &str) -> ThreadMeta {
    ThreadMeta {
        tid,
        name: name.into(),
        drops: AtomicU64::new(0),
        writer: std::thread::current(),
    }
}
