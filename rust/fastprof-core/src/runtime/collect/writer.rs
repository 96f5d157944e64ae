//! The writer thread's loop: [`Collector::create`] builds the header and the sinks,
//! [`Collector::run`] drains every ring each flush interval, hands the formatted batches to the
//! sinks, keeps the clock anchors and answers commands, and closes everything at stop.

use super::events::{write_args, State};
use super::meta::{anchor_json, hostname, push_anchor, ANCHOR_EVERY_NS};
use super::{SessionShared, StopReport};
use crate::error::Result;
use crate::runtime::clock::{self, Anchor, Calibration};
use crate::runtime::record::Record;
use crate::runtime::sink::chrome_gz::ChromeGz;
use crate::runtime::sink::window::Window;
use crate::runtime::sink::{Batch, Header, Sink};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct Collector {
    pub(super) st: State,
    pub(super) sinks: Vec<Box<dyn Sink>>,
    pub(super) window: Option<usize>,
    pub(super) batch: Batch,
    pub(super) scratch: Vec<Record>,
    /// Ring heads snapshotted before the calibration knot of a drain.
    pub(super) heads: Vec<u64>,
    pub(super) last_flush_ns: u64,
    pub(super) last_anchor_ns: u64,
    pub(super) segments: Vec<PathBuf>,
    pub(super) bytes_compressed: u64,
    pub(super) rotated: Option<Value>,
    /// Formatted bytes per batch ([`crate::runtime::sink::batch_limit`]).
    pub(super) batch_limit: usize,
    /// Test-only fault injection (`FASTPROF_TEST_FAULT=writer_panic`).
    pub(super) panic_at_flush: bool,
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

    pub(super) fn tick(&mut self, flush_ns: u64) -> io::Result<()> {
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

    pub(super) fn finish(&mut self) -> io::Result<()> {
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
    pub(super) fn each_sink(
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

    pub(super) fn collect_outputs(&mut self, s: &mut dyn Sink) {
        let (files, bytes) = s.outputs();
        self.segments.extend(files);
        self.bytes_compressed += bytes;
        if let Some(r) = s.rotated() {
            self.rotated = Some(r);
        }
    }

    pub(super) fn close_sinks(&mut self) -> io::Result<()> {
        let r = self.each_sink(|s, st| s.close(st));
        let mut sinks = std::mem::take(&mut self.sinks);
        for s in sinks.iter_mut() {
            self.collect_outputs(&mut **s);
        }
        r
    }

    /// On failure: stop recording (the job goes on), keep what was written.
    pub(super) fn fail(&mut self, e: io::Error) {
        self.st.shared.disable();
        let _ = e; // each failed sink already said what and where
        let _ = self.close_sinks();
    }

    pub(super) fn drain_all(&mut self) -> io::Result<()> {
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

    pub(super) fn end_chunk(&mut self, ti: usize) {
        self.batch.end_chunk(&self.st.threads[ti].meta);
    }

    pub(super) fn send_batch(&mut self) -> io::Result<()> {
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
