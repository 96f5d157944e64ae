//! One recording: start/stop, pause/resume, the clock offset, the step
//! counter and the flight-recorder dump. A [`Session`] owns its writer
//! thread (which runs [`crate::collect`] and the sinks) and its sampler; its
//! data (sampler history and metadata, the stop report) stays with it after
//! `stop`, so two recordings never see each other's readings. Nothing here is
//! process-wide except the registry's note of which session is recording.
//!
//! At most one session records at a time: the module-level recording calls
//! (`fastprof.span` …) go to it.

use crate::clock::{self, Anchor};
use crate::collect::{Collector, StopReport};
use crate::config::Config;
use crate::error::{CoreError, Result};
use crate::names;
use crate::registry::{self, NewThread, ThreadHooks};
use crate::ring::AllocError;
use crate::sampler::{Sampler, SamplerShared};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

/// The name of the counter that [`Session::mark_step`] records.
pub const STEP_COUNTER: &str = "fastprof.step";

/// Work the writer thread does on request.
pub(crate) enum Command {
    /// Write the in-memory window to `path` as a complete trace.
    Dump {
        path: PathBuf,
        reply: mpsc::Sender<Result<DumpInfo>>,
    },
}

/// What a window dump wrote.
#[derive(Debug, Clone, Default)]
pub struct DumpInfo {
    pub path: PathBuf,
    pub events: u64,
    pub open_spans: u64,
    pub bytes: u64,
    /// CLOCK_MONOTONIC ns of the oldest event kept (0 when empty).
    pub first_ns: u64,
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
    /// Threads that got no ring: (tid, name, reason).
    pub(crate) ringless_threads: Mutex<Vec<(u64, String, String)>>,
    pub(crate) commands: Mutex<Vec<Command>>,
    /// Failures the user should hear about (sampler, sinks), drained by `take_notices`.
    notices: Mutex<Vec<String>>,
    step_name: Option<u32>,
}

impl SessionShared {
    /// Stop recording because of an internal failure: the job goes on, new
    /// events become no-ops.
    pub fn disable(&self) {
        registry::deactivate(self.generation);
    }

    pub(crate) fn writer_thread(&self) -> Thread {
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
    pub(crate) fn ring_alloc_failed(&self, tid: u64, name: &str, e: AllocError) -> Option<String> {
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
            self.notice(msg.clone());
            msg
        })
    }

    pub(crate) fn notice(&self, msg: String) {
        self.notices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg);
    }

    pub fn step(&self) -> (u64, u64) {
        (
            self.step.load(Ordering::Relaxed),
            self.step_ns.load(Ordering::Relaxed),
        )
    }
}

/// A running (or stopped) recording.
pub struct Session {
    shared: Arc<SessionShared>,
    writer: Option<JoinHandle<StopReport>>,
    sampler: Option<Sampler>,
    sampler_data: Option<Arc<SamplerShared>>,
    report: Option<StopReport>,
}

impl Session {
    /// Start recording. Validates `config`, creates the trace directory and
    /// opens the first segment before anything is recorded, so bad options and
    /// unwritable directories fail here.
    pub fn start(config: Config) -> Result<Session> {
        config.validate()?;
        registry::install_fork_handlers();
        let mut cur = registry::lock_current();
        if let Some(r) = cur.as_ref() {
            return Err(CoreError::AlreadyRunning {
                run_dir: r.config.trace_dir.clone(),
            });
        }
        let generation = registry::next_generation();
        let clock_source = clock::select_source();
        let shared = Arc::new(SessionShared {
            generation,
            step_name: names::intern(STEP_COUNTER),
            config,
            new_threads: Mutex::new(Vec::new()),
            writer: OnceLock::new(),
            stop: AtomicBool::new(false),
            stop_ts: AtomicU64::new(0),
            start_anchor: Anchor::take(),
            clock_source,
            sampler: Mutex::new(None),
            clock_offset: Mutex::new(None),
            step: AtomicU64::new(0),
            step_ns: AtomicU64::new(0),
            ringless_drops: AtomicU64::new(0),
            ringless_threads: Mutex::new(Vec::new()),
            commands: Mutex::new(Vec::new()),
            notices: Mutex::new(Vec::new()),
        });
        let collector = Collector::create(shared.clone())?;
        let sh = shared.clone();
        let handle = std::thread::Builder::new()
            .name("fastprof-writer".into())
            .spawn(move || {
                // A bug in the writer must not leave the job recording into
                // rings nobody drains: stop recording and say why.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.run()))
                    .unwrap_or_else(|p| {
                        sh.disable();
                        StopReport {
                            error: Some(writer_panicked(&sh, &*p)),
                            ..StopReport::default()
                        }
                    })
            })
            .map_err(|e| CoreError::io(&shared.config.trace_dir, e))?;
        let _ = shared.writer.set(handle.thread().clone());
        *cur = Some(shared.clone());
        registry::activate(generation);
        drop(cur);
        let mut session = Session {
            shared: shared.clone(),
            writer: Some(handle),
            sampler: None,
            sampler_data: None,
            report: None,
        };
        // The sampler records like any thread, so it starts once recording has.
        if let Some(sc) = shared.config.sampler.clone() {
            match Sampler::start(sc) {
                Ok(s) => {
                    *shared.sampler.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(s.shared.clone());
                    session.sampler_data = Some(s.shared.clone());
                    session.sampler = Some(s);
                }
                Err(e) => {
                    let _ = session.stop();
                    return Err(CoreError::io(&shared.config.trace_dir, e));
                }
            }
        }
        Ok(session)
    }

    pub fn shared(&self) -> &Arc<SessionShared> {
        &self.shared
    }

    /// True while this session records (paused or not) and no failure disabled it.
    pub fn is_active(&self) -> bool {
        self.report.is_none()
            && registry::is_active()
            && registry::lock_current()
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, &self.shared))
    }

    /// Gate new spans, instants and counters until [`Session::resume`]; spans
    /// already open still close. The sampler and step markers go on.
    pub fn pause(&self) -> Result<()> {
        self.require_running()?;
        registry::set_paused(self.shared.generation, true);
        Ok(())
    }

    pub fn resume(&self) -> Result<()> {
        self.require_running()?;
        registry::set_paused(self.shared.generation, false);
        Ok(())
    }

    pub fn is_paused(&self) -> bool {
        self.is_active() && registry::is_paused()
    }

    /// Record that this process's clock must be shifted by `offset_ns` (with
    /// `uncertainty_ns`) to reach the reference clock; written into every
    /// segment's `otherData.clock`, where the merger applies it.
    pub fn set_clock_offset(&self, offset_ns: i64, uncertainty_ns: u64) {
        *self
            .shared
            .clock_offset
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((offset_ns, uncertainty_ns));
    }

    pub fn clock_offset(&self) -> Option<(i64, u64)> {
        *self
            .shared
            .clock_offset
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Mark the start of step `n`: recorded as the counter [`STEP_COUNTER`] on
    /// the calling thread (even while paused), and kept for watchdogs.
    pub fn mark_step(&self, n: u64, hooks: &mut dyn ThreadHooks) {
        self.shared.step.store(n, Ordering::Relaxed);
        self.shared
            .step_ns
            .store(clock::monotonic_ns(), Ordering::Relaxed);
        if let Some(id) = self.shared.step_name {
            if self.is_active() {
                registry::counter_ungated(id, n as f64, hooks);
            }
        }
    }

    /// The last marked step and its CLOCK_MONOTONIC ns (0, 0 before any).
    pub fn step(&self) -> (u64, u64) {
        self.shared.step()
    }

    /// Write the in-memory window (the last `window_seconds`) to `path` as a
    /// complete trace, without stopping the session. Open spans are closed
    /// at this instant with `args.unclosed`.
    pub fn dump_window(&self, path: &Path) -> Result<DumpInfo> {
        self.require_running()?;
        if self.shared.config.window_seconds <= 0.0 {
            return Err(CoreError::config(
                "window_seconds",
                "the in-memory window is off; start the recorder with window_seconds > 0 to dump it",
            ));
        }
        let (tx, rx) = mpsc::channel();
        self.shared
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Command::Dump {
                path: path.to_path_buf(),
                reply: tx,
            });
        self.shared.writer_thread().unpark();
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(r) => r,
            Err(_) => Err(CoreError::io(
                path,
                std::io::Error::other("the writer did not answer the dump request"),
            )),
        }
    }

    /// The sampler's data, kept after stop.
    pub fn sampler(&self) -> Option<&Arc<SamplerShared>> {
        self.sampler_data.as_ref()
    }

    /// Messages for the user (ring allocation failures, …) since the last call.
    pub fn take_notices(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .shared
                .notices
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    fn require_running(&self) -> Result<()> {
        if self.report.is_some() {
            return Err(CoreError::NotRunning);
        }
        Ok(())
    }

    /// Stop recording: drain every ring, close open spans at this instant,
    /// finalize the sinks, and return the report. A writer that failed or
    /// panicked is reported in `report.error`, never as an `Err`: profiling
    /// must not take the job down. `Err(NotRunning)` only when already stopped.
    pub fn stop(&mut self) -> Result<StopReport> {
        if let Some(r) = &self.report {
            let _ = r;
            return Err(CoreError::NotRunning);
        }
        // Sampler first: its last readings still go into the trace.
        let sampler_error: Option<String> = self.sampler.take().and_then(|s| {
            s.stop();
            None
        });
        let sh = &self.shared;
        sh.stop_ts.store(clock::ticks(), Ordering::Relaxed);
        {
            let mut cur = registry::lock_current();
            if cur.as_ref().is_some_and(|s| Arc::ptr_eq(s, sh)) {
                *cur = None;
            }
            sh.disable();
        }
        // Release: the writer's Acquire load sees stop_ts and every push before it.
        sh.stop.store(true, Ordering::Release);
        let mut report = match self.writer.take() {
            Some(h) => {
                h.thread().unpark();
                match h.join() {
                    Ok(r) => r,
                    Err(panic) => StopReport {
                        error: Some(writer_panicked(sh, &*panic)),
                        ..StopReport::default()
                    },
                }
            }
            None => StopReport::default(),
        };
        report.sampler_error = sampler_error;
        report.notices = self.take_notices();
        self.report = Some(report.clone());
        Ok(report)
    }

    /// The report of a stopped session.
    pub fn report(&self) -> Option<&StopReport> {
        self.report.as_ref()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.report.is_none() {
            let _ = self.stop();
        }
    }
}

fn writer_panicked(sh: &SessionShared, p: &(dyn std::any::Any + Send)) -> String {
    format!(
        "{}: the fastprof writer thread panicked ({}); recording stopped, events after its \
         last flush are lost, earlier segments are intact",
        sh.config.trace_dir.display(),
        panic_message(p)
    )
}

/// The text of a panic payload.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
