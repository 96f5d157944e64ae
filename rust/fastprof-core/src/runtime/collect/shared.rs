//! [`SessionShared`]: the state the session handle, the threads that register rings and the
//! writer thread share, and the registry's view of it (its [`Target`]).

use super::{Command, STEP_COUNTER};
use crate::runtime::clock::{self, Anchor};
use crate::runtime::config::Config;
use crate::runtime::names;
use crate::runtime::registry::{self, NewThread, Target};
use crate::runtime::ring::{AllocError, Growth};
use crate::runtime::sampler::SamplerShared;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;

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
    /// The last step marked with [`Session::mark_step`](crate::runtime::session::Session::mark_step), and when (CLOCK_MONOTONIC
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
