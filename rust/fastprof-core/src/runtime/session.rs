//! One recording: start/stop, pause/resume, the clock offset, the step
//! counter and the flight-recorder dump. A [`Session`] owns its writer
//! thread (which runs [`crate::runtime::collect`] and the sinks) and its sampler; its
//! data (sampler history and metadata, the stop report) stays with it after
//! `stop`, so two recordings never see each other's readings. Nothing here is
//! process-wide except the registry's note of which session is recording.
//!
//! At most one session records at a time: the module-level recording calls
//! (`fastprof.span` …) go to it.
//!
//! Dependencies point one way: ring/record/clock/names <- registry <- sinks
//! <- collect <- session. The registry sees the session only through its
//! [`registry::Target`] trait.

use crate::error::{CoreError, Result};
use crate::runtime::clock;
use crate::runtime::collect::{Collector, Command, SessionShared, StopReport};
use crate::runtime::config::Config;
use crate::runtime::registry::{self, ThreadHooks};
use crate::runtime::sampler::{Sampler, SamplerShared};
use crate::runtime::sink::window::DumpInfo;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

pub use crate::runtime::collect::STEP_COUNTER;

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
                run_dir: r.describe().into(),
            });
        }
        let generation = registry::next_generation();
        let shared = Arc::new(SessionShared::new(generation, config));
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
        shared.set_writer(handle.thread().clone());
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
    /// Lock-free ([`Session::mark_step`] asks every step): a disabled, stopped
    /// or superseded session no longer owns the recording generation.
    pub fn is_active(&self) -> bool {
        self.report.is_none() && registry::recording_generation() == self.shared.generation
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
        self.shared.mark_step(n);
        if let Some(id) = self.shared.step_name() {
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

    /// Count `path`, a file written for this recording outside it (`kind`:
    /// "torch" for a torch.profiler window), under the disk cap
    /// (`max_disk`): the writer thread deletes the oldest files for it,
    /// segments and such files alike, and says so in `otherData.rotated`.
    /// Returns once it has (so that whoever announces the file next finds
    /// the cap kept), with why when the cap deleted this file at once;
    /// without a cap the file is not tracked.
    pub fn count_file(&self, path: &Path, kind: &str) -> Result<Option<String>> {
        self.count_file_held(path, kind, 0)
    }

    /// [`Session::count_file`] for a file written within disk held for it
    /// ([`DiskHolder`]): the `release` bytes held are given back as the
    /// file takes their place, in one step of the writer thread.
    pub fn count_file_held(&self, path: &Path, kind: &str, release: u64) -> Result<Option<String>> {
        self.require_running()?;
        if self.shared.config.max_disk == 0 {
            return Ok(None);
        }
        let (tx, rx) = mpsc::channel();
        self.shared
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Command::CountFile {
                path: path.to_path_buf(),
                kind: kind.to_string(),
                release,
                reply: tx,
            });
        self.shared.writer_thread().unpark();
        // A writer stuck on a slow disk: the file is counted when it gets to it.
        Ok(rx.recv_timeout(Duration::from_secs(10)).unwrap_or(None))
    }

    /// What a thread writing a file for this recording beside its sinks
    /// asks the disk cap through ([`crate::runtime::sink::held`]).
    pub fn disk_holder(&self) -> DiskHolder {
        DiskHolder {
            shared: self.shared.clone(),
        }
    }

    /// The sampler's data, kept after stop.
    pub fn sampler(&self) -> Option<&Arc<SamplerShared>> {
        self.sampler_data.as_ref()
    }

    /// Messages for the user (ring allocation failures, …) since the last call.
    pub fn take_notices(&self) -> Vec<String> {
        self.shared.take_notices()
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
        let sampler_error = self.sampler.take().and_then(|s| s.stop());
        let sh = &self.shared;
        sh.stop_ts.store(clock::ticks(), Ordering::Relaxed);
        {
            let mut cur = registry::lock_current();
            if cur
                .as_ref()
                .is_some_and(|s| s.generation() == sh.generation)
            {
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

/// Holds disk under a session's cap (`max_disk`) for a file written on
/// another thread (a torch window's gzip): each hold is a writer command,
/// answered once the oldest files are deleted for it. Without a cap every
/// hold is granted at once, and so once the session is stopping: the cap
/// ends with the recording, as [`Session::count_file`] counts nothing then.
#[derive(Clone)]
pub struct DiskHolder {
    shared: Arc<SessionShared>,
}

impl DiskHolder {
    /// Give back `bytes` held for a file that was not written.
    pub fn release(&self, bytes: u64) {
        if self.shared.config.max_disk == 0 || bytes == 0 {
            return;
        }
        self.shared
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Command::Release { bytes });
        self.shared.writer_thread().unpark();
    }
}

impl crate::runtime::sink::held::Hold for DiskHolder {
    fn hold(&self, bytes: u64) -> bool {
        if self.shared.config.max_disk == 0 {
            return true;
        }
        // Acquire: pairs with stop's store.
        if self.shared.stop.load(Ordering::Acquire) {
            return true;
        }
        let (tx, rx) = mpsc::channel();
        self.shared
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Command::Hold { bytes, reply: tx });
        self.shared.writer_thread().unpark();
        // A writer stopped meanwhile answers what was asked before its end
        // and never what came after: granted then, as above. One stuck (a
        // slow disk) grants nothing it has not made room for.
        let mut waited = Duration::ZERO;
        let slice = Duration::from_millis(100);
        loop {
            match rx.recv_timeout(slice) {
                Ok(granted) => return granted,
                Err(mpsc::RecvTimeoutError::Disconnected) => return true,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    waited += slice;
                    if self.shared.stop.load(Ordering::Acquire) && waited >= Duration::from_secs(2)
                    {
                        return true;
                    }
                    if waited >= Duration::from_secs(30) {
                        return false;
                    }
                }
            }
        }
    }

    fn max_disk(&self) -> u64 {
        self.shared.config.max_disk
    }
}
