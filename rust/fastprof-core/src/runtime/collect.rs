//! "Collect": the writer thread's half that knows records. It drains every
//! thread's ring, converts ticks to CLOCK_MONOTONIC ns, pairs Begin/End into
//! complete (`X`) events, formats each event's Chrome-trace JSON once, and
//! hands batches of formatted events to the session's sinks
//! ([`crate::runtime::sink`]): the gzip segment files and, when configured, the
//! in-memory window. It also owns what every sink's metadata says (drops,
//! threads, clock anchors and offset, sampler metadata).
//!
//! Spans become events when they end: half as many events as B/E pairs, and
//! whatever a sink keeps stays balanced on its own.

use crate::error::CoreError;
use crate::error::Result;
use crate::json;
use crate::runtime::clock::{self, Anchor, Calibration};
use crate::runtime::config::Config;
use crate::runtime::names;
use crate::runtime::record::{Kind, Record, FLAG_EXCEPTION, FLAG_STEP};
use crate::runtime::registry::{self, NewThread, Target, ThreadMeta, END_SLOT_MISSING};
use crate::runtime::ring::AllocError;
use crate::runtime::ring::{Consumer, Growth};
use crate::runtime::sampler::SamplerShared;
use crate::runtime::sink::chrome_gz::ChromeGz;
use crate::runtime::sink::window::{is_over_limit, DumpInfo, Window};
use crate::runtime::sink::{Batch, Header, MetaSource, Sink};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::Duration;

/// Work the writer thread does on request.
pub enum Command {
    /// Write the in-memory window to `path` as a complete trace.
    Dump {
        path: PathBuf,
        reply: mpsc::Sender<Result<DumpInfo>>,
    },
    /// Count `path`, a file written for the session elsewhere (`kind`: a
    /// torch window), under the disk cap; the reply says why when the cap
    /// deleted it at once.
    CountFile {
        path: PathBuf,
        kind: String,
        /// Bytes held for it while it was written, released as it is counted.
        release: u64,
        reply: mpsc::Sender<Option<String>>,
    },
    /// Hold `bytes` more under the disk cap for a file being written on
    /// another thread (see [`crate::runtime::sink::held`]); the reply: granted.
    Hold {
        bytes: u64,
        reply: mpsc::Sender<bool>,
    },
    /// Give back bytes held for a file that was not written.
    Release { bytes: u64 },
}

/// State shared between the session handle, the registering threads and the writer.
pub struct SessionShared {
    pub generation: u64,
    pub config: Config,
    /// Rings registered since the writer last adopted them.
    new_threads: Mutex<Vec<NewThread>>,
    /// The writer thread, set once it is spawned (threads unpark it).
    writer: OnceLock<Thread>,
    /// Set (then the writer unparked) to ask the writer to finish.
    pub(crate) stop: AtomicBool,
    /// Ticks when stop was requested: open spans are closed there.
    pub(crate) stop_ts: AtomicU64,
    pub start_anchor: Anchor,
    /// What record timestamps are ("tsc" or "CLOCK_MONOTONIC").
    pub clock_source: &'static str,
    /// The sampler's metadata and readings, when sampling is on.
    pub(crate) sampler: Mutex<Option<Arc<SamplerShared>>>,
    /// (offset ns, uncertainty ns) to add to this process's clock to reach the
    /// reference clock (rank 0's), from a clock-sync handshake.
    pub(crate) clock_offset: Mutex<Option<(i64, u64)>>,
    /// The last step marked with [`Session::mark_step`], and when (CLOCK_MONOTONIC
    /// ns). Relaxed: read by watchdogs and reports, nothing depends on order.
    step: AtomicU64,
    step_ns: AtomicU64,
    /// Events of threads that got no ring (allocation failed). Relaxed counter.
    pub(crate) ringless_drops: AtomicU64,
    /// Heap bytes of payloads in the rings, and events dropped for want of
    /// budget (see `record::MAX_PAYLOAD_IN_FLIGHT`). Relaxed counters.
    pub(crate) payload_in_flight: AtomicU64,
    pub(crate) payload_drops: AtomicU64,
    /// The budget every ring of the session grows on (see `ring`).
    pub(crate) ring_growth: Arc<Growth>,
    /// Threads that got no ring: (tid, name, reason).
    pub(crate) ringless_threads: Mutex<Vec<(u64, String, String)>>,
    pub(crate) commands: Mutex<Vec<Command>>,
    /// Failures the user should hear about (sampler, sinks), drained by `take_notices`.
    notices: Mutex<Vec<String>>,
    step_name: Option<u32>,
}

impl SessionShared {
    pub(crate) fn new(generation: u64, config: Config) -> SessionShared {
        let ring_growth = Growth::new(config.buffer_growth);
        SessionShared {
            generation,
            step_name: names::intern(STEP_COUNTER),
            config,
            new_threads: Mutex::new(Vec::new()),
            writer: OnceLock::new(),
            stop: AtomicBool::new(false),
            stop_ts: AtomicU64::new(0),
            start_anchor: Anchor::take(),
            clock_source: clock::select_source(),
            sampler: Mutex::new(None),
            clock_offset: Mutex::new(None),
            step: AtomicU64::new(0),
            step_ns: AtomicU64::new(0),
            ringless_drops: AtomicU64::new(0),
            payload_in_flight: AtomicU64::new(0),
            payload_drops: AtomicU64::new(0),
            ring_growth,
            ringless_threads: Mutex::new(Vec::new()),
            commands: Mutex::new(Vec::new()),
            notices: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn set_writer(&self, t: Thread) {
        let _ = self.writer.set(t);
    }

    pub(crate) fn step_name(&self) -> Option<u32> {
        self.step_name
    }

    pub(crate) fn take_notices(&self) -> Vec<String> {
        std::mem::take(&mut *self.notices.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn mark_step(&self, n: u64) {
        self.step.store(n, Ordering::Relaxed);
        self.step_ns.store(clock::monotonic_ns(), Ordering::Relaxed);
    }
    /// Stop recording because of an internal failure: the job goes on, new
    /// events become no-ops.
    pub fn disable(&self) {
        registry::deactivate(self.generation);
    }

    pub fn writer_thread(&self) -> Thread {
        self.writer
            .get()
            .cloned()
            .unwrap_or_else(std::thread::current)
    }

    pub(crate) fn adopt(&self, t: NewThread) {
        self.new_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(t);
    }

    pub(crate) fn take_new_threads(&self, into: &mut Vec<NewThread>) {
        into.append(&mut self.new_threads.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Record that a thread got no ring; returns the warning to show, once per session.
    fn alloc_failed(&self, tid: u64, name: &str, e: AllocError) -> Option<String> {
        let mut v = self
            .ringless_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        v.push((tid, name.to_string(), e.to_string()));
        (v.len() == 1).then(|| {
            let msg = format!(
                "thread {name:?} (tid {tid}) {e} (buffer_size={}); its events are counted as \
                 dropped. Lower buffer_size or raise the address-space limit (ulimit -v)",
                self.config.ring_capacity()
            );
            msg
        })
    }

    /// A message for the user, said on stderr now and as a warning by the
    /// next API call on a Python thread.
    pub(crate) fn notice(&self, msg: String) {
        registry::say(&msg);
        self.notices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg);
        registry::NOTICES_PENDING.store(true, Ordering::Relaxed);
    }

    pub fn step(&self) -> (u64, u64) {
        (
            self.step.load(Ordering::Relaxed),
            self.step_ns.load(Ordering::Relaxed),
        )
    }
}

impl Target for SessionShared {
    fn generation(&self) -> u64 {
        self.generation
    }
    fn ring_capacity(&self) -> usize {
        self.config.ring_capacity()
    }
    fn writer(&self) -> Thread {
        self.writer_thread()
    }
    fn adopt(&self, t: NewThread) {
        SessionShared::adopt(self, t)
    }
    fn ring_alloc_failed(&self, tid: u64, name: &str, e: AllocError) -> Option<String> {
        self.alloc_failed(tid, name, e)
    }
    fn ringless_drops(&self) -> &AtomicU64 {
        &self.ringless_drops
    }
    fn describe(&self) -> String {
        self.config.trace_dir.display().to_string()
    }
    fn take_notices(&self) -> Vec<String> {
        SessionShared::take_notices(self)
    }
    fn payload_in_flight(&self) -> &AtomicU64 {
        &self.payload_in_flight
    }
    fn payload_drops(&self) -> &AtomicU64 {
        &self.payload_drops
    }
    fn ring_growth(&self) -> &Arc<Growth> {
        &self.ring_growth
    }
}

/// The name of the counter that `Session::mark_step` records.
pub const STEP_COUNTER: &str = "fastprof.step";

/// Clock anchors kept in the metadata: the start anchor and the newest
/// periodic ones (an hour's worth at one a minute).
const MAX_ANCHORS: usize = 64;

/// Seconds between periodic clock anchors.
const ANCHOR_EVERY_NS: u64 = 60_000_000_000;

/// What the writer says when the session stops.
#[derive(Debug, Clone, Default)]
pub struct StopReport {
    pub events_written: u64,
    pub dropped: u64,
    pub dropped_per_thread: BTreeMap<u64, u64>,
    pub segments: Vec<PathBuf>,
    pub unclosed_spans: u64,
    pub bytes_compressed: u64,
    /// The failure that stopped recording early (or lost a sink), if any.
    pub error: Option<String>,
    /// Why the sampler thread stopped early, if it failed.
    pub sampler_error: Option<String>,
    /// Of `dropped`: events whose args/name found the payload budget spent.
    pub payload_dropped: u64,
    /// Warnings for the user gathered during the session.
    pub notices: Vec<String>,
    /// What the disk cap deleted (the last segment's `otherData.rotated`):
    /// None when nothing was.
    pub rotated: Option<Value>,
}

#[derive(Clone)]
enum SpanName {
    Id(u32),
    Owned(Box<str>),
}

/// An async span whose end has not been drained yet.
struct OpenAsync {
    id: u64,
    name: SpanName,
    ti: usize,
}

struct Open {
    name: SpanName,
    /// CLOCK_MONOTONIC ns, converted when the Begin was drained (while the
    /// calibration around it was current).
    ns: u64,
    args: OpenArgs,
}

/// A span's args, as its Begin carried them.
enum OpenArgs {
    None,
    /// A ready JSON object (the slow path's extra).
    Json(Box<str>),
    /// A training step's numbers, resolved against the thread's step
    /// context when the Begin was drained, formatted here.
    Step {
        epoch: u64,
        batch: u64,
        batch_in_epoch: u64,
        action: u32,
    },
}

struct ThreadState {
    consumer: Consumer,
    meta: Arc<ThreadMeta>,
    stack: Vec<Open>,
    /// The last `StepContext` this thread's ring carried: (epoch, its first
    /// global step, action name id).
    step_context: (u64, u64, u32),
}

/// Everything but the sinks, so that sinks can read the metadata (through
/// [`MetaSource`]) while the collector hands them batches.
pub(crate) struct State {
    shared: Arc<SessionShared>,
    header: Arc<Header>,
    threads: Vec<ThreadState>,
    adopted: Vec<NewThread>,
    thread_names: BTreeMap<u64, String>,
    /// Drop counts of threads that exited and were forgotten.
    retired_drops: BTreeMap<u64, u64>,
    anchors: Vec<(Anchor, &'static str)>,
    /// Periodic anchors dropped to keep [`MAX_ANCHORS`].
    anchors_dropped: u64,
    /// Escaped JSON of every interned name, by id.
    names: Vec<Vec<u8>>,
    /// Async spans begun and not yet ended, oldest first.
    open_async: Vec<OpenAsync>,
    events_written: u64,
    unclosed_spans: u64,
    sink_errors: Vec<String>,
    cal: Calibration,
}

pub(crate) struct Collector {
    st: State,
    sinks: Vec<Box<dyn Sink>>,
    window: Option<usize>,
    batch: Batch,
    scratch: Vec<Record>,
    /// Ring heads snapshotted before the calibration knot of a drain.
    heads: Vec<u64>,
    last_flush_ns: u64,
    last_anchor_ns: u64,
    segments: Vec<PathBuf>,
    bytes_compressed: u64,
    rotated: Option<Value>,
    /// Formatted bytes per batch ([`crate::runtime::sink::batch_limit`]).
    batch_limit: usize,
    /// Test-only fault injection (`FASTPROF_TEST_FAULT=writer_panic`).
    panic_at_flush: bool,
}

pub(crate) fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length.
    let rc = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Keep a periodic anchor: the start anchor (first) stays, as the merge
/// reads it; past [`MAX_ANCHORS`] the oldest periodic one goes and
/// `dropped` counts it (every segment repeats the list, and a week's run
/// would carry 10,000 of them).
fn push_anchor(anchors: &mut Vec<(Anchor, &'static str)>, dropped: &mut u64, a: Anchor) {
    anchors.push((a, "periodic"));
    if anchors.len() > MAX_ANCHORS {
        anchors.remove(1);
        *dropped += 1;
    }
}

pub(crate) fn anchor_json(a: &Anchor, label: &str) -> Value {
    json!({
        "label": label,
        "realtime_ns": a.realtime_ns,
        "monotonic_ns": a.monotonic_ns,
        "uncertainty_ns": a.uncertainty_ns,
    })
}

impl Collector {
    /// Build the header and the sinks; the segment sink creates the trace
    /// directory and its first file here, so I/O problems surface in `start`.
    pub fn create(shared: Arc<SessionShared>) -> Result<Collector> {
        let cfg = &shared.config;
        let pid = std::process::id();
        let host = hostname();
        let start = shared.start_anchor;
        let mut extra: Value = serde_json::from_str(&cfg.extra_config_json).unwrap_or(json!({}));
        // Two keys of the extra metadata are not configuration: the caller's
        // `distributedInfo` (with the backend, which only Python knows) is
        // written top-level like Kineto's, and a DataLoader worker's `worker`
        // role goes to the top of `otherData`, where the merge looks for it.
        let taken = |x: &mut Value, k: &str| x.as_object_mut().and_then(|m| m.remove(k));
        let distributed = match taken(&mut extra, "distributedInfo") {
            Some(Value::Object(d)) => d,
            _ => {
                let mut d = Map::new();
                d.insert("rank".into(), json!(cfg.rank));
                d.insert("world_size".into(), json!(cfg.world_size));
                d
            }
        };
        let worker = taken(&mut extra, "worker");
        let mut config = json!({
            "buffer_size": cfg.ring_capacity(),
            "flush_interval_s": cfg.flush_interval_s,
            "segment_size": cfg.segment_size,
            "segment_seconds": cfg.segment_seconds,
            "max_disk": cfg.max_disk,
            "keep_segments": cfg.keep_segments,
            "compression_level": cfg.compression_level,
            "window_seconds": cfg.window_seconds,
            "window_bytes": cfg.window_bytes,
        });
        if let (Some(c), Value::Object(x)) = (config.as_object_mut(), extra) {
            c.extend(x);
        }
        let mut static_meta = match json!({
            "producer": "fastprof",
            "version": crate::VERSION,
            "host": host,
            "pid": pid,
            "rank": cfg.rank,
            "world_size": cfg.world_size,
            "local_rank": cfg.local_rank,
            "run_name": cfg.run_name,
            "config": config,
            "clock": {
                "source": "CLOCK_MONOTONIC",
                "ticks": shared.clock_source,
                "ticks_reason": clock::ticks_reason(),
                "start": anchor_json(&start, "start"),
            },
        }) {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        if let Some(w) = worker {
            static_meta.insert("worker".into(), w);
        }
        let header = Arc::new(Header {
            base_ns: start.realtime_ns,
            start_mono_ns: start.monotonic_ns,
            pid,
            rank: cfg.rank,
            process_name: format!("rank {} ({} pid {})", cfg.rank, host, pid),
            static_meta,
            distributed,
        });
        let segments = ChromeGz::create(
            header.clone(),
            cfg.trace_dir.clone(),
            cfg.segment_size,
            cfg.segment_seconds,
            cfg.compression_level,
            cfg.max_disk,
            cfg.keep_segments,
        )?;
        if let Some(msg) = segments.shared_with() {
            shared.notice(msg.to_string());
        }
        let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(segments)];
        let mut window = None;
        if cfg.window_seconds > 0.0 {
            window = Some(sinks.len());
            sinks.push(Box::new(Window::new(
                header.clone(),
                cfg.window_seconds,
                cfg.window_bytes,
            )));
        }
        Ok(Collector {
            st: State {
                anchors: vec![(start, "start")],
                anchors_dropped: 0,
                header,
                shared: shared.clone(),
                threads: Vec::new(),
                adopted: Vec::new(),
                thread_names: BTreeMap::new(),
                retired_drops: BTreeMap::new(),
                names: Vec::new(),
                open_async: Vec::new(),
                events_written: 0,
                unclosed_spans: 0,
                sink_errors: Vec::new(),
                cal: Calibration::new(),
            },
            sinks,
            window,
            batch: Batch::default(),
            scratch: Vec::new(),
            heads: Vec::new(),
            last_flush_ns: start.monotonic_ns,
            last_anchor_ns: start.monotonic_ns,
            segments: Vec::new(),
            bytes_compressed: 0,
            rotated: None,
            batch_limit: crate::runtime::sink::batch_limit(cfg.segment_size),
            panic_at_flush: std::env::var("FASTPROF_TEST_FAULT").is_ok_and(|v| v == "writer_panic"),
        })
    }

    /// The writer loop; returns the report when asked to stop (or on failure).
    pub fn run(mut self) -> StopReport {
        let flush_ns = (self.st.shared.config.flush_interval_s * 1e9) as u64;
        loop {
            // Sleep until the next flush is due, unless a producer nudges us
            // (its ring filled another quarter), a command arrives, or stop is
            // asked; an unpark that came before this park makes it return at
            // once, so no nudge is lost.
            let due = self.last_flush_ns + flush_ns;
            let now = clock::monotonic_ns();
            if !self.st.shared.stop.load(Ordering::Acquire) && due > now {
                std::thread::park_timeout(Duration::from_nanos(due - now));
            }
            // Acquire: pairs with stop()'s Release store.
            let stopping = self.st.shared.stop.load(Ordering::Acquire);
            let step = if stopping {
                self.finish()
            } else {
                self.tick(flush_ns)
            };
            if let Err(e) = step {
                self.fail(e);
                break;
            }
            if stopping {
                break;
            }
        }
        self.answer_commands(true);
        let dropped_per_thread = self.st.drops();
        let mut error = None;
        if !self.st.sink_errors.is_empty() {
            error = Some(self.st.sink_errors.join("; "));
        }
        StopReport {
            events_written: self.st.events_written,
            dropped: dropped_per_thread.values().sum::<u64>()
                + self.st.shared.ringless_drops.load(Ordering::Relaxed),
            dropped_per_thread,
            segments: self.segments,
            unclosed_spans: self.st.unclosed_spans,
            bytes_compressed: self.bytes_compressed,
            error,
            sampler_error: None,
            payload_dropped: self.st.shared.payload_drops.load(Ordering::Relaxed),
            notices: Vec::new(),
            rotated: self.rotated,
        }
    }

    fn tick(&mut self, flush_ns: u64) -> io::Result<()> {
        self.st.adopt_new_threads();
        let now = clock::monotonic_ns();
        let flush_due = now.saturating_sub(self.last_flush_ns) >= flush_ns;
        // Woken before the flush is due means a ring filled another quarter,
        // a command arrived (or, rarely, a spurious wake-up): drain so rings
        // never fill.
        self.drain_all()?;
        if flush_due {
            if self.panic_at_flush {
                panic!("injected writer fault (FASTPROF_TEST_FAULT=writer_panic)");
            }
            self.last_flush_ns = now;
            if now.saturating_sub(self.last_anchor_ns) >= ANCHOR_EVERY_NS {
                self.last_anchor_ns = now;
                push_anchor(
                    &mut self.st.anchors,
                    &mut self.st.anchors_dropped,
                    Anchor::take(),
                );
            }
            self.each_sink(|s, st| s.flush(st, now))?;
            self.st.forget_exited_threads();
        }
        self.answer_commands(false);
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        self.st.adopt_new_threads();
        self.drain_all()?;
        let stop_ts = match self.st.shared.stop_ts.load(Ordering::Relaxed) {
            0 => clock::ticks(),
            t => t,
        };
        let stop_ns = self.st.cal.to_ns(stop_ts);
        for i in 0..self.st.threads.len() {
            while let Some(open) = self.st.threads[i].stack.pop() {
                self.st
                    .format_span(&mut self.batch, i, &open, stop_ns, &[("unclosed", "true")]);
                self.st.unclosed_spans += 1;
            }
            self.end_chunk(i);
        }
        while let Some(open) = self.st.open_async.pop() {
            let ti = open.ti.min(self.st.threads.len().saturating_sub(1));
            self.st
                .async_head(&mut self.batch, ti, b"e", &open.name, open.id, stop_ns);
            write_args(&mut self.batch.bytes, None, &[("unclosed", "true")]);
            self.batch.event_done(stop_ns, stop_ns);
            self.st.unclosed_spans += 1;
            self.end_chunk(ti);
        }
        self.send_batch()?;
        self.st.anchors.push((Anchor::take(), "stop"));
        self.answer_commands(false);
        self.close_sinks()
    }

    /// Run `f` on every sink; a sink that fails is closed (best effort),
    /// removed and reported. Recording stops only when no sink is left.
    fn each_sink(
        &mut self,
        mut f: impl FnMut(&mut dyn Sink, &State) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut i = 0;
        while i < self.sinks.len() {
            if let Err(e) = f(&mut *self.sinks[i], &self.st) {
                let mut dead = self.sinks.remove(i);
                let where_ = dead.describe();
                let _ = dead.close(&self.st);
                self.collect_outputs(&mut *dead);
                let last = self.sinks.is_empty();
                if last {
                    // Recording stops before anyone hears that it did.
                    self.st.shared.disable();
                }
                let msg = format!(
                    "{where_}: {e}; {}",
                    if last {
                        "recording stopped (the training job goes on)"
                    } else {
                        "that output stopped, recording goes on"
                    }
                );
                self.st.shared.notice(msg.clone());
                self.st.sink_errors.push(msg);
                if let Some(w) = self.window {
                    self.window = match w.cmp(&i) {
                        std::cmp::Ordering::Equal => None,
                        std::cmp::Ordering::Greater => Some(w - 1),
                        std::cmp::Ordering::Less => Some(w),
                    };
                }
                if self.sinks.is_empty() {
                    return Err(io::Error::other("no output left"));
                }
                continue;
            }
            i += 1;
        }
        Ok(())
    }

    fn collect_outputs(&mut self, s: &mut dyn Sink) {
        let (files, bytes) = s.outputs();
        self.segments.extend(files);
        self.bytes_compressed += bytes;
        if let Some(r) = s.rotated() {
            self.rotated = Some(r);
        }
    }

    fn close_sinks(&mut self) -> io::Result<()> {
        let r = self.each_sink(|s, st| s.close(st));
        let mut sinks = std::mem::take(&mut self.sinks);
        for s in sinks.iter_mut() {
            self.collect_outputs(&mut **s);
        }
        r
    }

    /// On failure: stop recording (the job goes on), keep what was written.
    fn fail(&mut self, e: io::Error) {
        self.st.shared.disable();
        let _ = e; // each failed sink already said what and where
        let _ = self.close_sinks();
    }

    fn answer_commands(&mut self, stopped: bool) {
        let cmds = std::mem::take(
            &mut *self
                .st
                .shared
                .commands
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for c in cmds {
            match c {
                Command::Dump { path, reply } => {
                    let r = if stopped {
                        Err(CoreError::NotRunning)
                    } else {
                        self.dump(&path)
                    };
                    let _ = reply.send(r);
                }
                Command::CountFile {
                    path,
                    kind,
                    release,
                    reply,
                } => {
                    for s in self.sinks.iter_mut() {
                        s.release(release);
                    }
                    let why = if stopped {
                        None
                    } else {
                        self.adopt_file(&path, &kind)
                    };
                    let _ = reply.send(why);
                }
                Command::Hold { bytes, reply } => {
                    // Stopped: the cap ends with the recording (count_file
                    // counts nothing then either).
                    let granted = stopped || self.sinks.iter_mut().all(|s| s.hold(bytes));
                    let _ = reply.send(granted);
                }
                Command::Release { bytes } => {
                    for s in self.sinks.iter_mut() {
                        s.release(bytes);
                    }
                }
            }
        }
    }

    /// Count a file under the disk cap (the segment sink keeps it); why, when
    /// the cap deleted it at once.
    fn adopt_file(&mut self, path: &std::path::Path, kind: &str) -> Option<String> {
        let mut why = None;
        for s in self.sinks.iter_mut() {
            why = why.or(s.adopt_file(path, kind));
        }
        why
    }

    fn dump(&mut self, path: &std::path::Path) -> Result<DumpInfo> {
        self.drain_all().map_err(|e| CoreError::io(path, e))?;
        let Some(w) = self.window else {
            return Err(CoreError::io(
                path,
                io::Error::other("the in-memory window is not running"),
            ));
        };
        // Open spans, closed at this instant (they stay open in the session).
        let now = self.st.cal.to_ns(clock::ticks()).max(clock::monotonic_ns());
        let mut open = Batch::default();
        let mut n_open = 0;
        for i in 0..self.st.threads.len() {
            let stack = std::mem::take(&mut self.st.threads[i].stack);
            for o in &stack {
                self.st
                    .format_span(&mut open, i, o, now, &[("unclosed", "true")]);
                n_open += 1;
            }
            self.st.threads[i].stack = stack;
            open.end_chunk(&self.st.threads[i].meta);
        }
        // Planned within what the disk cap leaves, and room made for it
        // first: the disk stays under the cap while the file is written,
        // not only once it is counted.
        let want = self.sinks[w]
            .as_window()
            .map_or(0, |win| win.memory_bytes() + open.bytes.len() as u64);
        let mut room = self
            .sinks
            .iter_mut()
            .filter_map(|s| s.room_for_file(want))
            .min();
        let mut info = loop {
            let window = self.sinks[w]
                .as_window()
                .expect("the window index points at the window sink");
            let plan = match window.plan_dump(&open, &self.st, room) {
                Ok(plan) => plan,
                Err(why) => {
                    return Ok(DumpInfo {
                        path: path.to_path_buf(),
                        open_spans: n_open,
                        skipped: Some(why),
                        ..DumpInfo::default()
                    })
                }
            };
            if let Some(limit) = plan.limit {
                for s in self.sinks.iter_mut() {
                    s.make_room(limit);
                }
            }
            let window = self.sinks[w]
                .as_window()
                .expect("the window index points at the window sink");
            match window.dump(path, &open, &plan) {
                Ok(info) => break info,
                // Compressed larger than planned: fewer events, same room.
                Err(e) if is_over_limit(&e) => room = plan.tighter(),
                Err(e) => return Err(CoreError::io(path, e)),
            }
        };
        info.open_spans = n_open;
        // Written for this rank: under the same disk cap as the segments.
        info.deleted = self.adopt_file(path, "flight");
        Ok(info)
    }

    fn drain_all(&mut self) -> io::Result<()> {
        // Snapshot every ring's head, then take a calibration knot: every
        // record drained below read its ticks before the knot, so conversion
        // interpolates and never extrapolates (see `Calibration::advance`).
        let mut heads = std::mem::take(&mut self.heads);
        heads.clear();
        heads.extend(self.st.threads.iter().map(|t| t.consumer.published()));
        self.st.cal.advance();
        let mut scratch = std::mem::take(&mut self.scratch);
        for (i, &upto) in heads.iter().enumerate() {
            scratch.clear();
            self.st.threads[i].consumer.drain_upto(&mut scratch, upto);
            for rec in scratch.drain(..) {
                self.st.format_record(&mut self.batch, i, rec);
                if self.batch.bytes.len() >= self.batch_limit {
                    self.end_chunk(i);
                    self.send_batch()?;
                }
            }
            self.end_chunk(i);
        }
        self.scratch = scratch;
        self.heads = heads;
        self.send_batch()
    }

    fn end_chunk(&mut self, ti: usize) {
        self.batch.end_chunk(&self.st.threads[ti].meta);
    }

    fn send_batch(&mut self) -> io::Result<()> {
        if self.batch.chunks.is_empty() {
            self.batch.clear();
            return Ok(());
        }
        self.st.events_written += self.batch.events();
        let batch = std::mem::take(&mut self.batch);
        let r = self.each_sink(|s, st| s.write(&batch, st));
        self.batch = batch;
        self.batch.clear();
        r
    }
}

impl State {
    fn adopt_new_threads(&mut self) {
        self.shared.take_new_threads(&mut self.adopted);
        for t in self.adopted.drain(..) {
            self.thread_names
                .insert(t.meta.tid, t.meta.name.to_string());
            self.threads.push(ThreadState {
                consumer: t.consumer,
                meta: t.meta,
                stack: Vec::new(),
                step_context: (0, 0, u32::MAX),
            });
        }
    }

    /// Free the rings of threads that exited and whose every event has been
    /// written; their drop counts move to `retired_drops`.
    fn forget_exited_threads(&mut self) {
        let retired = &mut self.retired_drops;
        self.threads.retain(|t| {
            let gone = t.consumer.producer_gone() && t.consumer.is_empty() && t.stack.is_empty();
            if gone {
                let d = t.meta.drops.load(Ordering::Relaxed);
                if d > 0 {
                    *retired.entry(t.meta.tid).or_insert(0) += d;
                }
            }
            !gone
        });
    }

    /// Drops per thread id, live and retired threads together.
    fn drops(&self) -> BTreeMap<u64, u64> {
        let mut m = self.retired_drops.clone();
        for t in &self.threads {
            let n = t.meta.drops.load(Ordering::Relaxed);
            if n > 0 {
                *m.entry(t.meta.tid).or_insert(0) += n;
            }
        }
        m
    }

    fn format_record(&mut self, batch: &mut Batch, ti: usize, mut rec: Record) {
        let (owned_name, args, async_id) = match rec.take_extra() {
            Some(x) => {
                self.shared
                    .payload_in_flight
                    .fetch_sub(x.bytes(), Ordering::Relaxed);
                (x.name, x.args_json, x.async_id)
            }
            None => (None, None, 0),
        };
        let name = match owned_name {
            Some(n) => SpanName::Owned(n),
            None => SpanName::Id(rec.name),
        };
        let ns = self.cal.to_ns(rec.ts);
        match rec.kind() {
            Kind::Begin => {
                let t = &mut self.threads[ti];
                let args = match args {
                    Some(a) => OpenArgs::Json(a),
                    None if rec.flags() & FLAG_STEP != 0 => {
                        let (epoch, first, action) = t.step_context;
                        let batch = rec.plain_payload();
                        OpenArgs::Step {
                            epoch,
                            batch,
                            batch_in_epoch: batch.saturating_sub(first),
                            action,
                        }
                    }
                    None => OpenArgs::None,
                };
                t.stack.push(Open { name, ns, args })
            }
            Kind::StepContext => {
                self.threads[ti].step_context = (rec.ts, rec.plain_payload(), rec.name);
            }
            Kind::End => {
                if let Some(open) = self.threads[ti].stack.pop() {
                    let flags: &[(&str, &str)] = if rec.flags() & FLAG_EXCEPTION != 0 {
                        &[("exception", "true")]
                    } else {
                        &[]
                    };
                    self.format_span(batch, ti, &open, ns, flags);
                } // else: unreachable by the producer's protocol
            }
            Kind::Instant => {
                self.event_head(batch, ti, b"i", &name, ns);
                batch.bytes.extend_from_slice(b",\"s\":\"t\"");
                write_args(&mut batch.bytes, args.as_deref(), &[]);
                batch.event_done(ns, ns);
            }
            Kind::AsyncBegin => {
                self.async_head(batch, ti, b"b", &name, async_id, ns);
                write_args(&mut batch.bytes, args.as_deref(), &[]);
                batch.event_done(ns, ns);
                self.open_async.push(OpenAsync {
                    id: async_id,
                    name,
                    ti,
                });
            }
            Kind::AsyncEnd => {
                // The innermost open span of this key; none means its begin
                // was gated by a pause or dropped: then the end goes too.
                if let Some(i) = self.open_async.iter().rposition(|o| o.id == async_id) {
                    let open = self.open_async.remove(i);
                    self.async_head(batch, ti, b"e", &open.name, async_id, ns);
                    // The end's own args: `exception` when the body raised.
                    write_args(&mut batch.bytes, args.as_deref(), &[]);
                    batch.event_done(ns, ns);
                }
            }
            Kind::Counter => {
                self.event_head(batch, ti, b"C", &name, ns);
                match args {
                    Some(a) => write_args(&mut batch.bytes, Some(&a), &[]),
                    None => {
                        batch.bytes.extend_from_slice(b",\"args\":{\"value\":");
                        json::write_f64(&mut batch.bytes, rec.value());
                        batch.bytes.push(b'}');
                    }
                }
                batch.event_done(ns, ns);
            }
        }
    }

    /// An X event; `end_ns` in CLOCK_MONOTONIC ns.
    fn format_span(
        &mut self,
        batch: &mut Batch,
        ti: usize,
        open: &Open,
        end_ns: u64,
        flags: &[(&str, &str)],
    ) {
        self.event_head(batch, ti, b"X", &open.name, open.ns);
        batch.bytes.extend_from_slice(b",\"dur\":");
        json::write_us(&mut batch.bytes, end_ns.saturating_sub(open.ns) as i64);
        match &open.args {
            OpenArgs::None => write_args(&mut batch.bytes, None, flags),
            OpenArgs::Json(a) => write_args(&mut batch.bytes, Some(a), flags),
            &OpenArgs::Step {
                epoch,
                batch: step,
                batch_in_epoch,
                action,
            } => {
                let members = |b: &mut Vec<u8>| {
                    b.extend_from_slice(b"\"epoch\":");
                    json::write_int(b, epoch);
                    b.extend_from_slice(b",\"batch\":");
                    json::write_int(b, step);
                    b.extend_from_slice(b",\"batch_in_epoch\":");
                    json::write_int(b, batch_in_epoch);
                    b.extend_from_slice(b",\"action\":");
                    self.write_name(b, action);
                };
                write_args_with(&mut batch.bytes, flags, Some(members));
            }
        }
        batch.event_done(open.ns, end_ns);
    }

    /// An async event's head: `cat` "async" and the key as a hex `id`.
    fn async_head(
        &mut self,
        batch: &mut Batch,
        ti: usize,
        ph: &[u8],
        name: &SpanName,
        id: u64,
        ns: u64,
    ) {
        self.head_with_cat(batch, ti, ph, b"async", name, ns);
        batch.bytes.extend_from_slice(b",\"id\":\"0x");
        let _ = std::io::Write::write_fmt(&mut batch.bytes, format_args!("{id:x}"));
        batch.bytes.push(b'"');
    }

    /// `,\n{"ph":..,"cat":"user","name":..,"pid":..,"tid":..,"ts":..` (no
    /// closing brace); `ns` in CLOCK_MONOTONIC ns.
    fn event_head(&mut self, batch: &mut Batch, ti: usize, ph: &[u8], name: &SpanName, ns: u64) {
        self.head_with_cat(batch, ti, ph, b"user", name, ns);
    }

    fn head_with_cat(
        &mut self,
        batch: &mut Batch,
        ti: usize,
        ph: &[u8],
        cat: &[u8],
        name: &SpanName,
        ns: u64,
    ) {
        let b = &mut batch.bytes;
        b.extend_from_slice(b",\n{\"ph\":\"");
        b.extend_from_slice(ph);
        b.extend_from_slice(b"\",\"cat\":\"");
        b.extend_from_slice(cat);
        b.extend_from_slice(b"\",\"name\":");
        match name {
            SpanName::Id(id) => self.write_name(b, *id),
            SpanName::Owned(s) => json::write_str(b, s),
        }
        b.extend_from_slice(b",\"pid\":");
        json::write_int(b, self.header.pid);
        b.extend_from_slice(b",\"tid\":");
        json::write_int(b, self.threads[ti].meta.tid);
        b.extend_from_slice(b",\"ts\":");
        json::write_us(b, ns as i64 - self.header.start_mono_ns as i64);
    }

    /// The interned name `id` as a JSON string (from the writer's cache).
    fn write_name(&mut self, b: &mut Vec<u8>, id: u32) {
        let id = id as usize;
        if id >= self.names.len() {
            for n in names::since(self.names.len()) {
                self.names.push(json::quoted(&n));
            }
        }
        match self.names.get(id) {
            Some(q) => b.extend_from_slice(q),
            None => b.extend_from_slice(b"\"<unknown>\""),
        }
    }
}

impl MetaSource for State {
    fn other_data(&self) -> Map<String, Value> {
        let mut other = self.header.static_meta.clone();
        let anchors: Vec<Value> = self
            .anchors
            .iter()
            .map(|(a, l)| anchor_json(a, l))
            .collect();
        // Extend the static clock object (source, ticks, start) rather than
        // replacing it: readers rely on both.
        let mut clock = other
            .get("clock")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        clock.insert("anchors".into(), Value::Array(anchors));
        if self.anchors_dropped > 0 {
            clock.insert("anchors_dropped".into(), Value::from(self.anchors_dropped));
        }
        if let Some((off, unc)) = *self
            .shared
            .clock_offset
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        {
            clock.insert("offset_ns".into(), json!(off));
            clock.insert("offset_uncertainty_ns".into(), json!(unc));
        }
        other.insert("clock".into(), Value::Object(clock));
        let drops = self.drops();
        let ringless = self.shared.ringless_drops.load(Ordering::Relaxed);
        let total: u64 = drops.values().sum::<u64>() + ringless;
        let per_thread: Map<String, Value> = drops
            .iter()
            .map(|(tid, n)| (tid.to_string(), json!(n)))
            .collect();
        let ringless_threads: Vec<Value> = self
            .shared
            .ringless_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(tid, name, why)| json!({"tid": tid, "name": name, "reason": why}))
            .collect();
        other.insert(
            "drops".into(),
            json!({
                "total": total,
                "per_thread": per_thread,
                "ringless_events": ringless,
                "payload_events": self.shared.payload_drops.load(Ordering::Relaxed),
                "ringless_threads": ringless_threads,
                "end_slot_missing": END_SLOT_MISSING.load(Ordering::Relaxed),
            }),
        );
        let growth = &self.shared.ring_growth;
        other.insert(
            "ring_growth".into(),
            json!({
                "chunks": growth.chunks(),
                "peak_bytes": growth.peak_bytes(),
                "limit_bytes": growth.limit_bytes(),
            }),
        );
        other.insert(
            "threads".into(),
            Value::Object(
                self.thread_names
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(v)))
                    .collect(),
            ),
        );
        other.insert("events_written".into(), json!(self.events_written));
        other.insert(
            "replaced_values".into(),
            json!(registry::REPLACED_VALUES.load(Ordering::Relaxed)),
        );
        other.insert("unclosed_spans".into(), json!(self.unclosed_spans));
        let (step, step_ns) = self.shared.step();
        if step_ns > 0 {
            other.insert(
                "last_step".into(),
                json!({"step": step, "monotonic_ns": step_ns}),
            );
        }
        if !self.sink_errors.is_empty() {
            other.insert("output_errors".into(), json!(self.sink_errors));
        }
        let sampler = self
            .shared
            .sampler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(s) = sampler {
            let meta = s.meta.lock().unwrap_or_else(|e| e.into_inner()).clone();
            other.insert("sampler".into(), meta);
        }
        other
    }
}

/// `,"args":{...}` merging the user's ready-made JSON object with flag fields.
fn write_args(out: &mut Vec<u8>, user: Option<&str>, flags: &[(&str, &str)]) {
    let user = user.map(str::trim).filter(|u| u.len() > 2);
    // `u` is `{...}` with at least one member: splice its inside.
    let members =
        user.map(|u| move |out: &mut Vec<u8>| out.extend_from_slice(&u.as_bytes()[1..u.len() - 1]));
    write_args_with(out, flags, members);
}

/// `,"args":{<flags>,<members>}`, where `members` writes one or more
/// `"key":value` members; nothing when there are neither.
fn write_args_with(
    out: &mut Vec<u8>,
    flags: &[(&str, &str)],
    members: Option<impl FnOnce(&mut Vec<u8>)>,
) {
    if members.is_none() && flags.is_empty() {
        return;
    }
    out.extend_from_slice(b",\"args\":{");
    for (i, (k, v)) in flags.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        json::write_str(out, k);
        out.push(b':');
        out.extend_from_slice(v.as_bytes());
    }
    if let Some(m) = members {
        if !flags.is_empty() {
            out.push(b',');
        }
        m(out);
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anchor(n: u64) -> Anchor {
        Anchor {
            realtime_ns: 1_000_000 + n,
            monotonic_ns: n,
            uncertainty_ns: 1,
        }
    }

    #[test]
    fn anchors_keep_the_start_and_the_newest_periodic_ones() {
        let mut anchors = vec![(anchor(0), "start")];
        let mut dropped = 0;
        for n in 1..=(MAX_ANCHORS as u64 - 1) {
            push_anchor(&mut anchors, &mut dropped, anchor(n));
        }
        assert_eq!((anchors.len(), dropped), (MAX_ANCHORS, 0));
        let extra = 1000;
        for n in MAX_ANCHORS as u64..MAX_ANCHORS as u64 + extra {
            push_anchor(&mut anchors, &mut dropped, anchor(n));
        }
        assert_eq!((anchors.len(), dropped), (MAX_ANCHORS, extra));
        assert_eq!(anchors[0], (anchor(0), "start"));
        // The periodic ones left are the newest, in order.
        let kept: Vec<u64> = anchors[1..].iter().map(|(a, _)| a.monotonic_ns).collect();
        let newest: Vec<u64> = (extra + 1..MAX_ANCHORS as u64 + extra).collect();
        assert_eq!(kept, newest);
        assert!(anchors[1..].iter().all(|(_, l)| *l == "periodic"));
    }
}
