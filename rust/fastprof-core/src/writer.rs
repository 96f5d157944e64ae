//! The writer thread: drains every thread's ring, turns records into
//! Chrome-trace JSON and streams it through gzip into segment files.
//!
//! A segment is written as `fastprof.{N}.json.gz.part` and renamed to
//! `fastprof.{N}.json.gz` once closed, so a finished name always means a
//! complete single-member gzip JSON object. The open segment gets a zlib sync
//! flush every flush interval: a killed process leaves a gzip stream that
//! decodes up to that point, and `reader` salvages it.
//!
//! Layout of a segment, chosen so that a salvaged prefix is still useful:
//! `{"baseTimeNanoseconds":B,"traceEvents":[` metadata events first (the
//! static `fastprof_info`, process and thread names), then events, then
//! `],"otherData":{...}}` written at close with the counts and anchors.
//!
//! Spans become complete (`X`) events when they end: half as many events as
//! B/E pairs, and every segment stays balanced on its own.

use crate::clock::{self, Anchor, Calibration};
use crate::error::{CoreError, Result};
use crate::json;
use crate::names;
use crate::record::{Extra, Kind, Record, FLAG_EXCEPTION};
use crate::recorder::{Shared, ThreadEntry};
use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Seconds between periodic clock anchors.
const ANCHOR_EVERY_NS: u64 = 60_000_000_000;
/// Formatted bytes buffered before they are handed to gzip.
const CHUNK: usize = 256 * 1024;

/// What the writer says when it finishes.
#[derive(Debug, Clone, Default)]
pub struct WriterReport {
    pub events_written: u64,
    pub dropped: u64,
    pub dropped_per_thread: BTreeMap<u64, u64>,
    pub segments: Vec<PathBuf>,
    pub unclosed_spans: u64,
    pub bytes_compressed: u64,
    /// The failure that stopped recording early, if any.
    pub error: Option<String>,
}

/// Counts the compressed bytes that reach the file.
struct Counting {
    file: File,
    bytes: u64,
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

struct Segment {
    index: u32,
    part: PathBuf,
    done: PathBuf,
    gz: GzEncoder<Counting>,
    opened_ns: u64,
    events: u64,
}

enum SpanName {
    Id(u32),
    Owned(Box<str>),
}

struct Open {
    name: SpanName,
    /// CLOCK_MONOTONIC ns, converted when the Begin was drained (while the
    /// calibration around it was current).
    ns: u64,
    args: Option<Box<str>>,
}

struct ThreadState {
    entry: Arc<ThreadEntry>,
    stack: Vec<Open>,
    /// Segment in which this thread's `thread_name` was last written.
    named_in: Option<u32>,
}

pub struct Writer {
    shared: Arc<Shared>,
    pid: u32,
    host: String,
    base_ns: u64,
    static_meta: Map<String, Value>,
    seg: Option<Segment>,
    next_index: u32,
    /// Escaped JSON of every interned name, by id.
    names: Vec<Vec<u8>>,
    threads: Vec<ThreadState>,
    thread_names: BTreeMap<u64, String>,
    /// Drop counts of threads that exited and were forgotten.
    retired_drops: BTreeMap<u64, u64>,
    anchors: Vec<(Anchor, &'static str)>,
    buf: Vec<u8>,
    scratch: Vec<Record>,
    /// Ring heads snapshotted before the calibration knot of a drain.
    heads: Vec<u64>,
    report: WriterReport,
    last_flush_ns: u64,
    last_anchor_ns: u64,
    cal: Calibration,
}

fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length.
    let rc = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn anchor_json(a: &Anchor, label: &str) -> Value {
    json!({
        "label": label,
        "realtime_ns": a.realtime_ns,
        "monotonic_ns": a.monotonic_ns,
        "uncertainty_ns": a.uncertainty_ns,
    })
}

impl Writer {
    /// Create the trace directory and open the first segment, so that every
    /// I/O problem surfaces in `start`, before the job relies on recording.
    pub fn create(shared: Arc<Shared>) -> Result<Writer> {
        let cfg = &shared.config;
        std::fs::create_dir_all(&cfg.trace_dir).map_err(|e| CoreError::io(&cfg.trace_dir, e))?;
        let pid = std::process::id();
        let host = hostname();
        let start = shared.start_anchor;
        let extra: Value = serde_json::from_str(&cfg.extra_config_json).unwrap_or(json!({}));
        let mut config = json!({
            "buffer_size": cfg.ring_capacity(),
            "flush_interval_s": cfg.flush_interval_s,
            "segment_size": cfg.segment_size,
            "segment_seconds": cfg.segment_seconds,
            "compression_level": cfg.compression_level,
        });
        if let (Some(c), Value::Object(x)) = (config.as_object_mut(), extra) {
            c.extend(x);
        }
        let static_meta = match json!({
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
                "start": anchor_json(&start, "start"),
            },
        }) {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let mut w = Writer {
            base_ns: start.realtime_ns,
            anchors: vec![(start, "start")],
            last_flush_ns: start.monotonic_ns,
            last_anchor_ns: start.monotonic_ns,
            shared,
            pid,
            host,
            static_meta,
            seg: None,
            next_index: 0,
            names: Vec::new(),
            threads: Vec::new(),
            thread_names: BTreeMap::new(),
            retired_drops: BTreeMap::new(),
            buf: Vec::with_capacity(CHUNK + 4096),
            scratch: Vec::new(),
            heads: Vec::new(),
            report: WriterReport::default(),
            cal: Calibration::new(),
        };
        // Never overwrite: a job resumed under the same run name continues
        // the numbering after the segments already there.
        w.next_index = next_free_index(&w.shared.config.trace_dir)?;
        w.open_segment()?;
        Ok(w)
    }

    /// The writer loop; returns the report when asked to stop (or on failure).
    pub fn run(mut self) -> WriterReport {
        let flush_ns = (self.shared.config.flush_interval_s * 1e9) as u64;
        loop {
            // Sleep until the next flush is due, unless a producer nudges us
            // (its ring filled another quarter) or stop is asked; an unpark
            // that came before this park makes it return at once, so no
            // nudge is lost.
            let due = self.last_flush_ns + flush_ns;
            let now = clock::monotonic_ns();
            if !self.shared.stop.load(Ordering::Acquire) && due > now {
                std::thread::park_timeout(Duration::from_nanos(due - now));
            }
            // Acquire: pairs with stop()'s Release store.
            let stopping = self.shared.stop.load(Ordering::Acquire);
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
        self.report.dropped_per_thread = self.drops();
        self.report.dropped = self.report.dropped_per_thread.values().sum();
        self.report
    }

    fn tick(&mut self, flush_ns: u64) -> io::Result<()> {
        self.adopt_new_threads();
        let now = clock::monotonic_ns();
        let flush_due = now.saturating_sub(self.last_flush_ns) >= flush_ns;
        // Woken before the flush is due means a ring filled another quarter
        // (or, rarely, a spurious wake-up): drain so rings never fill.
        self.drain_all()?;
        if flush_due {
            self.last_flush_ns = now;
            if now.saturating_sub(self.last_anchor_ns) >= ANCHOR_EVERY_NS {
                self.last_anchor_ns = now;
                self.anchors.push((Anchor::take(), "periodic"));
            }
            self.flush_segment()?;
            self.forget_exited_threads();
            if self.rotation_due(now) {
                self.close_segment(false)?;
                self.open_segment().map_err(into_io)?;
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        self.adopt_new_threads();
        self.drain_all()?;
        let stop_ts = match self.shared.stop_ts.load(Ordering::Relaxed) {
            0 => clock::ticks(),
            t => t,
        };
        let stop_ns = self.cal.to_ns(stop_ts);
        for i in 0..self.threads.len() {
            while let Some(open) = self.threads[i].stack.pop() {
                self.write_span(i, open, stop_ns, &[("unclosed", "true")])?;
                self.report.unclosed_spans += 1;
            }
        }
        self.anchors.push((Anchor::take(), "stop"));
        self.close_segment(true)
    }

    /// On failure: stop recording (the job goes on), keep what was written.
    fn fail(&mut self, e: io::Error) {
        self.shared.disable();
        let path = self
            .seg
            .as_ref()
            .map(|s| s.part.display().to_string())
            .unwrap_or_else(|| self.shared.config.trace_dir.display().to_string());
        self.report.error = Some(format!("{path}: {e}; recording stopped"));
        // Best effort: a closed, valid segment is still worth having.
        let _ = self.close_segment(true);
    }

    fn adopt_new_threads(&mut self) {
        let list = self
            .shared
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if list.len() == self.threads.len() {
            return;
        }
        for entry in list.iter().skip(self.threads.len()) {
            self.thread_names.insert(entry.tid, entry.name.clone());
            self.threads.push(ThreadState {
                entry: entry.clone(),
                stack: Vec::new(),
                named_in: None,
            });
        }
    }

    /// Drop threads that exited and whose every event has been written, from
    /// both our list and the shared one (which stays index-aligned with ours);
    /// their drop counts move to `retired_drops`.
    fn forget_exited_threads(&mut self) {
        let gone = |t: &ThreadState| {
            t.entry.exited.load(Ordering::Acquire) && t.entry.ring.is_empty() && t.stack.is_empty()
        };
        if !self.threads.iter().any(gone) {
            return;
        }
        let mut list = self
            .shared
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut i = 0;
        while i < self.threads.len() {
            if gone(&self.threads[i]) {
                let e = &self.threads[i].entry;
                let d = e.drops.load(Ordering::Relaxed);
                if d > 0 {
                    *self.retired_drops.entry(e.tid).or_insert(0) += d;
                }
                self.threads.remove(i);
                list.remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Drops per thread id, live and retired threads together.
    fn drops(&self) -> BTreeMap<u64, u64> {
        let mut m = self.retired_drops.clone();
        for t in &self.threads {
            let n = t.entry.drops.load(Ordering::Relaxed);
            if n > 0 {
                *m.entry(t.entry.tid).or_insert(0) += n;
            }
        }
        m
    }

    fn drain_all(&mut self) -> io::Result<()> {
        // Snapshot every ring's head, then take a calibration knot: every
        // record drained below read its ticks before the knot, so conversion
        // interpolates and never extrapolates (see `Calibration::advance`).
        let mut heads = std::mem::take(&mut self.heads);
        heads.clear();
        heads.extend(self.threads.iter().map(|t| t.entry.ring.published()));
        self.cal.advance();
        let mut scratch = std::mem::take(&mut self.scratch);
        for (i, &upto) in heads.iter().enumerate() {
            scratch.clear();
            // SAFETY: the writer is the only consumer of every ring, and
            // `upto` was published by this ring.
            unsafe { self.threads[i].entry.ring.drain_upto(&mut scratch, upto) };
            for rec in &scratch {
                self.write_record(i, rec)?;
            }
        }
        self.scratch = scratch;
        self.heads = heads;
        Ok(())
    }

    fn write_record(&mut self, ti: usize, rec: &Record) -> io::Result<()> {
        // SAFETY: each drained record is consumed exactly once, here.
        let extra = unsafe { rec.take_extra() }.map(|b| *b);
        let (owned_name, args) = match extra {
            Some(Extra { name, args_json }) => (name, args_json),
            None => (None, None),
        };
        let name = match owned_name {
            Some(n) => SpanName::Owned(n),
            None => SpanName::Id(rec.name),
        };
        match rec.kind() {
            Kind::Begin => {
                let ns = self.cal.to_ns(rec.ts);
                self.threads[ti].stack.push(Open { name, ns, args });
                Ok(())
            }
            Kind::End => match self.threads[ti].stack.pop() {
                Some(open) => {
                    let flags: &[(&str, &str)] = if rec.flags & FLAG_EXCEPTION != 0 {
                        &[("exception", "true")]
                    } else {
                        &[]
                    };
                    let end = self.cal.to_ns(rec.ts);
                    self.write_span(ti, open, end, flags)
                }
                None => Ok(()), // unreachable by the producer's protocol
            },
            Kind::Instant => {
                self.event_head(ti, b"i", &name, self.cal.to_ns(rec.ts))?;
                self.buf.extend_from_slice(b",\"s\":\"t\"");
                write_args(&mut self.buf, args.as_deref(), &[]);
                self.event_tail()
            }
            Kind::Counter => {
                self.event_head(ti, b"C", &name, self.cal.to_ns(rec.ts))?;
                match args {
                    Some(a) => write_args(&mut self.buf, Some(&a), &[]),
                    None => {
                        self.buf.extend_from_slice(b",\"args\":{\"value\":");
                        json::write_f64(&mut self.buf, f64::from_bits(rec.payload));
                        self.buf.push(b'}');
                    }
                }
                self.event_tail()
            }
        }
    }

    /// An X event; `end_ns` in CLOCK_MONOTONIC ns.
    fn write_span(
        &mut self,
        ti: usize,
        open: Open,
        end_ns: u64,
        flags: &[(&str, &str)],
    ) -> io::Result<()> {
        self.event_head(ti, b"X", &open.name, open.ns)?;
        self.buf.extend_from_slice(b",\"dur\":");
        json::write_us(&mut self.buf, end_ns.saturating_sub(open.ns) as i64);
        write_args(&mut self.buf, open.args.as_deref(), flags);
        self.event_tail()
    }

    /// `,\n{"ph":..,"cat":"user","name":..,"pid":..,"tid":..,"ts":..` (no closing
    /// brace); `ns` in CLOCK_MONOTONIC ns.
    fn event_head(&mut self, ti: usize, ph: &[u8], name: &SpanName, ns: u64) -> io::Result<()> {
        let seg_index = self.seg.as_ref().map(|s| s.index);
        if self.threads[ti].named_in != seg_index {
            self.threads[ti].named_in = seg_index;
            let (tid, tname) = (
                self.threads[ti].entry.tid,
                self.threads[ti].entry.name.clone(),
            );
            self.thread_name_event(tid, &tname);
        }
        let tid = self.threads[ti].entry.tid;
        self.buf.extend_from_slice(b",\n{\"ph\":\"");
        self.buf.extend_from_slice(ph);
        self.buf.extend_from_slice(b"\",\"cat\":\"user\",\"name\":");
        match name {
            SpanName::Id(id) => {
                let id = *id as usize;
                if id >= self.names.len() {
                    for n in names::since(self.names.len()) {
                        self.names.push(json::quoted(&n));
                    }
                }
                match self.names.get(id) {
                    Some(q) => self.buf.extend_from_slice(q),
                    None => self.buf.extend_from_slice(b"\"<unknown>\""),
                }
            }
            SpanName::Owned(s) => json::write_str(&mut self.buf, s),
        }
        self.buf.extend_from_slice(b",\"pid\":");
        json::write_int(&mut self.buf, self.pid);
        self.buf.extend_from_slice(b",\"tid\":");
        json::write_int(&mut self.buf, tid);
        self.buf.extend_from_slice(b",\"ts\":");
        let rel = ns as i64 - self.shared.start_anchor.monotonic_ns as i64;
        json::write_us(&mut self.buf, rel);
        Ok(())
    }

    fn event_tail(&mut self) -> io::Result<()> {
        self.buf.push(b'}');
        self.report.events_written += 1;
        if let Some(s) = self.seg.as_mut() {
            s.events += 1;
        }
        if self.buf.len() >= CHUNK {
            self.write_buf()?;
        }
        Ok(())
    }

    fn thread_name_event(&mut self, tid: u64, name: &str) {
        self.buf
            .extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":");
        json::write_int(&mut self.buf, self.pid);
        self.buf.extend_from_slice(b",\"tid\":");
        json::write_int(&mut self.buf, tid);
        self.buf.extend_from_slice(b",\"args\":{\"name\":");
        json::write_str(&mut self.buf, name);
        self.buf.extend_from_slice(b"}}");
    }

    fn write_buf(&mut self) -> io::Result<()> {
        if let Some(s) = self.seg.as_mut() {
            s.gz.write_all(&self.buf)?;
        }
        self.buf.clear();
        Ok(())
    }

    fn flush_segment(&mut self) -> io::Result<()> {
        self.write_buf()?;
        if let Some(s) = self.seg.as_mut() {
            // A zlib sync flush, then the file: everything so far decodes.
            s.gz.flush()?;
        }
        Ok(())
    }

    fn rotation_due(&self, now: u64) -> bool {
        let cfg = &self.shared.config;
        self.seg.as_ref().is_some_and(|s| {
            s.gz.get_ref().bytes >= cfg.segment_size
                || (cfg.segment_seconds > 0.0
                    && now.saturating_sub(s.opened_ns) as f64 >= cfg.segment_seconds * 1e9)
        })
    }

    fn open_segment(&mut self) -> Result<()> {
        let dir = &self.shared.config.trace_dir;
        let index = self.next_index;
        let done = dir.join(format!("fastprof.{index}.json.gz"));
        let part = dir.join(format!("fastprof.{index}.json.gz.part"));
        let file = File::create(&part).map_err(|e| CoreError::io(&part, e))?;
        let level = Compression::new(self.shared.config.compression_level);
        let gz = GzEncoder::new(Counting { file, bytes: 0 }, level);
        self.next_index += 1;
        self.seg = Some(Segment {
            index,
            part,
            done,
            gz,
            opened_ns: clock::monotonic_ns(),
            events: 0,
        });
        self.buf.clear();
        self.buf.extend_from_slice(b"{\"baseTimeNanoseconds\":");
        json::write_int(&mut self.buf, self.base_ns);
        self.buf
            .extend_from_slice(b",\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
        self.buf
            .extend_from_slice(b"{\"ph\":\"M\",\"name\":\"fastprof_info\",\"pid\":");
        json::write_int(&mut self.buf, self.pid);
        self.buf.extend_from_slice(b",\"tid\":0,\"args\":");
        let info = serde_json::to_vec(&self.static_meta).unwrap_or_else(|_| b"{}".to_vec());
        self.buf.extend_from_slice(&info);
        self.buf.push(b'}');
        let cfg = &self.shared.config;
        let pname = format!("rank {} ({} pid {})", cfg.rank, self.host, self.pid);
        self.buf
            .extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":");
        json::write_int(&mut self.buf, self.pid);
        self.buf
            .extend_from_slice(b",\"tid\":0,\"args\":{\"name\":");
        json::write_str(&mut self.buf, &pname);
        self.buf
            .extend_from_slice(b"}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":");
        json::write_int(&mut self.buf, self.pid);
        self.buf
            .extend_from_slice(b",\"tid\":0,\"args\":{\"sort_index\":");
        json::write_int(&mut self.buf, cfg.rank);
        self.buf.extend_from_slice(b"}}");
        // The head reaches the file at once, so even a segment killed before
        // its first flush salvages to a valid (empty) trace.
        self.flush_segment()
            .map_err(|e| CoreError::io(self.seg_path(), e))
    }

    fn seg_path(&self) -> PathBuf {
        self.seg
            .as_ref()
            .map(|s| s.part.clone())
            .unwrap_or_default()
    }

    fn close_segment(&mut self, last: bool) -> io::Result<()> {
        self.write_buf()?;
        let Some(mut seg) = self.seg.take() else {
            return Ok(());
        };
        let mut other = self.static_meta.clone();
        let anchors: Vec<Value> = self
            .anchors
            .iter()
            .map(|(a, l)| anchor_json(a, l))
            .collect();
        let drops = self.drops();
        let total: u64 = drops.values().sum();
        let per_thread: Map<String, Value> = drops
            .iter()
            .map(|(tid, n)| (tid.to_string(), json!(n)))
            .collect();
        other.insert("segment".into(), json!(seg.index));
        other.insert("final".into(), json!(last));
        other.insert(
            "clock".into(),
            json!({"source": "CLOCK_MONOTONIC", "anchors": anchors}),
        );
        other.insert(
            "drops".into(),
            json!({"total": total, "per_thread": per_thread}),
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
        other.insert("events_written".into(), json!(self.report.events_written));
        other.insert("segment_events".into(), json!(seg.events));
        other.insert("unclosed_spans".into(), json!(self.report.unclosed_spans));
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
        let mut tail = b"\n],\"otherData\":".to_vec();
        tail.extend_from_slice(&serde_json::to_vec(&other).unwrap_or_else(|_| b"{}".to_vec()));
        tail.extend_from_slice(b"}\n");
        seg.gz.write_all(&tail)?;
        let counting = seg.gz.finish()?;
        self.report.bytes_compressed += counting.bytes;
        drop(counting);
        std::fs::rename(&seg.part, &seg.done)?;
        self.report.segments.push(seg.done);
        Ok(())
    }
}

/// One past the highest `fastprof.{N}.json.gz[.part]` index in `dir`.
fn next_free_index(dir: &Path) -> Result<u32> {
    let mut next = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| CoreError::io(dir, e))? {
        let name = entry.map_err(|e| CoreError::io(dir, e))?.file_name();
        let name = name.to_string_lossy();
        let index = name
            .strip_prefix("fastprof.")
            .and_then(|r| {
                r.strip_suffix(".json.gz")
                    .or_else(|| r.strip_suffix(".json.gz.part"))
            })
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(i) = index {
            next = next.max(i + 1);
        }
    }
    Ok(next)
}

fn into_io(e: CoreError) -> io::Error {
    match e {
        CoreError::Io { source, .. } => source,
        other => io::Error::other(other.to_string()),
    }
}

/// `,"args":{...}` merging the user's ready-made JSON object with flag fields.
fn write_args(out: &mut Vec<u8>, user: Option<&str>, flags: &[(&str, &str)]) {
    let user = user.map(str::trim).filter(|u| u.len() > 2);
    if user.is_none() && flags.is_empty() {
        return;
    }
    out.extend_from_slice(b",\"args\":{");
    let mut first = true;
    for (k, v) in flags {
        if !first {
            out.push(b',');
        }
        first = false;
        json::write_str(out, k);
        out.push(b':');
        out.extend_from_slice(v.as_bytes());
    }
    if let Some(u) = user {
        // `u` is `{...}` with at least one member: splice its inside.
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(&u.as_bytes()[1..u.len() - 1]);
    }
    out.push(b'}');
}
