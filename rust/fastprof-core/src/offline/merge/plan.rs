//! Pass 1 of a merge: scan every input once (in parallel, constant memory)
//! for what alignment and filtering need: base time, rank, clock offset,
//! pids and process and thread names, step markers, time range and bytes
//! per category. Nothing is kept per event, except the intervals of torch's
//! `python_function` events (see [`super::nest`]).

use super::nest::PyCall;
use crate::contract;
use crate::error::{CoreError, Result};
use crate::offline::trace::scan::{self, Fields, Item, Scanner};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A thread as an input names it: (pid, tid), raw JSON bytes.
pub type ThreadKey = (Vec<u8>, Vec<u8>);

/// What kind of producer wrote an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Fastprof,
    Kineto,
    Chrome,
}

impl Kind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Fastprof => "fastprof",
            Kind::Kineto => "kineto",
            Kind::Chrome => "chrome",
        }
    }
}

/// A step marker: `ProfilerStep#N` (torch) or a fastprof span named `step`.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub number: u64,
    /// Input-relative ns (add the input's base to get epoch ns).
    pub start: i64,
    pub end: i64,
}

#[derive(Debug, Clone)]
pub struct InputInfo {
    pub path: PathBuf,
    pub kind: Kind,
    pub base_ns: Option<i64>,
    pub rank: Option<u32>,
    /// Per-rank clock offset written by fastprof (clock-sync handshake), added to every ts.
    pub offset_ns: i64,
    pub offset_uncertainty_ns: u64,
    /// Uncertainty of the input's own realtime anchor, where it says.
    pub anchor_uncertainty_ns: u64,
    /// pids in order of first appearance.
    pub pids: Vec<Vec<u8>>,
    pub process_names: HashMap<Vec<u8>, String>,
    /// (pid, tid) -> the first `thread_name` given (raw JSON bytes of both).
    pub thread_names: Vec<(ThreadKey, String)>,
    /// The pid of the `fastprof_info` event: the recording process.
    pub own_pid: Option<Vec<u8>>,
    /// A DataLoader worker's recording: (loader name, worker id).
    pub worker: Option<(String, u64)>,
    pub world_size: Option<u32>,
    /// The input's top-level `distributedInfo` (Kineto's, or fastprof's own).
    pub distributed: Option<Value>,
    /// Its `python_function` events (torch `with_stack`), taken by the merge
    /// for [`super::nest::NestIndex`].
    pub py_calls: Vec<PyCall>,
    pub steps: Vec<Step>,
    /// Input-relative ns.
    pub min_ts: Option<i64>,
    pub max_ts: Option<i64>,
    pub events: u64,
    /// Events the scanner dropped as unreadable (named in `warnings`); pass 2
    /// drops and counts those that break the JSON grammar otherwise.
    pub dropped: u64,
    pub bytes: u64,
    pub cat_bytes: HashMap<String, u64>,
    pub salvaged_bytes: u64,
    pub warnings: Vec<String>,
    /// A previous `fastprof merge` output: skipped.
    pub merged_output: bool,
    /// What the recording's disk cap had deleted when this segment closed
    /// (its `otherData.rotated`), and the recording's pid, which tells its
    /// segments from another recording's in the same directory.
    pub rotated: Option<Value>,
    pub recording_pid: Option<u64>,
}

impl InputInfo {
    /// Epoch ns of an input-relative ns value (base + offset applied).
    pub fn abs(&self, rel: i64) -> i64 {
        self.base_ns.unwrap_or(0) + rel + self.offset_ns
    }
}

fn json_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|x| u32::try_from(x).ok())
}

fn apply_fastprof_meta(info: &mut InputInfo, meta: &Value) {
    info.kind = Kind::Fastprof;
    if let Some(r) = meta.get("rank").and_then(json_u32) {
        info.rank = Some(r);
    }
    if let Some(w) = meta.get("world_size").and_then(json_u32) {
        info.world_size = Some(w);
    }
    // A DataLoader worker's recorder says so at the top of its metadata
    // (or, from older writers, among the recorder's extra config).
    let worker = meta
        .get("worker")
        .or_else(|| meta.get("config").and_then(|c| c.get("worker")));
    if let Some(w) = worker.filter(|w| w.is_object()) {
        let loader = w
            .get("loader")
            .and_then(Value::as_str)
            .unwrap_or("data")
            .to_string();
        info.worker = Some((loader, w.get("id").and_then(Value::as_u64).unwrap_or(0)));
    }
    let clock = meta.get("clock");
    if let Some(off) = clock
        .and_then(|c| c.get("offset_ns"))
        .and_then(Value::as_i64)
    {
        info.offset_ns = off;
    }
    if let Some(u) = clock
        .and_then(|c| c.get("offset_uncertainty_ns"))
        .and_then(Value::as_u64)
    {
        info.offset_uncertainty_ns = u;
    }
    let anchor = clock
        .and_then(|c| c.get("start"))
        .or_else(|| clock.and_then(|c| c.get("anchors")).and_then(|a| a.get(0)));
    if let Some(u) = anchor
        .and_then(|a| a.get("uncertainty_ns"))
        .and_then(Value::as_u64)
    {
        info.anchor_uncertainty_ns = u;
    }
}

/// Scan one input, already opened as `sc`. `progress` counts compressed
/// bytes read; `cancel` set by another thread ends the scan with
/// [`CoreError::Cancelled`].
pub fn scan_input(
    path: PathBuf,
    mut sc: Scanner,
    progress: &AtomicU64,
    cancel: &AtomicBool,
) -> Result<InputInfo> {
    let mut scan = Scan::new(path);
    let mut last_progress = 0;
    while let Some(item) = sc.next_item()? {
        // Relaxed: a request to stop, nothing is published through it.
        if cancel.load(Ordering::Relaxed) {
            return Err(CoreError::Cancelled);
        }
        match item {
            Item::Meta { key, raw } => scan.meta(key, raw),
            Item::Event(raw) => scan.event(raw),
        }
        let read = sc.compressed_read();
        progress.fetch_add(read - last_progress, Ordering::Relaxed);
        last_progress = read;
    }
    let read = sc.compressed_read();
    progress.fetch_add(read.saturating_sub(last_progress), Ordering::Relaxed);
    Ok(scan.finish(&sc))
}

/// One input's scan in progress: what it has learnt, and what it must
/// remember between items to decide which of two sources of a fact wins.
struct Scan {
    info: InputInfo,
    /// The rank came from the file's own metadata (`distributedInfo`,
    /// fastprof's `otherData`), which a `fastprof_info` event read later
    /// must not override.
    rank_from_meta: bool,
    /// fastprof's complete `otherData` was read before the events (a file
    /// that puts it first): it wins over the `fastprof_info` event's args.
    other_data_seen: bool,
    /// fastprof `step` spans met so far: the number of one without
    /// `args.step` (older writers).
    fastprof_steps: u64,
}

impl Scan {
    fn new(path: PathBuf) -> Scan {
        Scan {
            info: InputInfo {
                rank: super::inputs::rank_from_path(&path),
                path,
                kind: Kind::Chrome,
                base_ns: None,
                offset_ns: 0,
                offset_uncertainty_ns: 0,
                anchor_uncertainty_ns: 0,
                pids: Vec::new(),
                process_names: HashMap::new(),
                thread_names: Vec::new(),
                own_pid: None,
                worker: None,
                world_size: None,
                distributed: None,
                py_calls: Vec::new(),
                steps: Vec::new(),
                min_ts: None,
                max_ts: None,
                events: 0,
                dropped: 0,
                bytes: 0,
                cat_bytes: HashMap::new(),
                salvaged_bytes: 0,
                warnings: Vec::new(),
                merged_output: false,
                rotated: None,
                recording_pid: None,
            },
            rank_from_meta: false,
            other_data_seen: false,
            fastprof_steps: 0,
        }
    }

    /// A top-level key other than `traceEvents`.
    fn meta(&mut self, key: &str, raw: &[u8]) {
        match key {
            "baseTimeNanoseconds" => self.info.base_ns = scan::parse_int(raw),
            "distributedInfo" => self.distributed_info(raw),
            "schemaVersion" | "deviceProperties" | "traceName"
                if self.info.kind == Kind::Chrome =>
            {
                self.info.kind = Kind::Kineto;
            }
            "otherData" => self.other_data(raw),
            _ => {}
        }
    }

    fn distributed_info(&mut self, raw: &[u8]) {
        let info = &mut self.info;
        if let Ok(v) = serde_json::from_slice::<Value>(raw) {
            if let Some(r) = v.get("rank").and_then(json_u32) {
                info.rank = Some(r);
                self.rank_from_meta = true;
            }
            if let Some(w) = v.get("world_size").and_then(json_u32) {
                info.world_size = Some(w);
            }
            info.distributed = Some(v);
        }
        // fastprof writes it too (first in the file, before its
        // `fastprof_info`, which says what wrote the file).
        if info.kind == Kind::Chrome {
            info.kind = Kind::Kineto;
        }
    }

    fn other_data(&mut self, raw: &[u8]) {
        let info = &mut self.info;
        if let Ok(v) = serde_json::from_slice::<Value>(raw) {
            if v.get("merged") == Some(&Value::Bool(true)) {
                info.merged_output = true;
            }
            if v.get("producer").and_then(Value::as_str) == Some("fastprof") {
                info.rotated = v.get("rotated").filter(|r| r.is_object()).cloned();
                info.recording_pid = v.get("pid").and_then(Value::as_u64);
                apply_fastprof_meta(info, &v);
                self.rank_from_meta = true;
                self.other_data_seen = true;
            }
        }
    }

    /// One event of `traceEvents`.
    fn event(&mut self, raw: &[u8]) {
        let info = &mut self.info;
        info.events += 1;
        info.bytes += raw.len() as u64 + 2;
        // The fast view: pass 2 checks the JSON grammar of each event
        // it copies (and drops what fails), so that the check is made
        // once, where the bytes are copied.
        let Some(f) = Fields::parse(raw) else {
            return;
        };
        let ph =
            f.ph.clone()
                .and_then(|r| scan::str_value(&raw[r]))
                .unwrap_or(b"");
        if let Some(r) = f.pid.clone() {
            // Few distinct pids per file: a scan beats hashing, and
            // nothing is allocated for the pids already known.
            if !info.pids.iter().any(|p| p[..] == raw[r.clone()]) {
                info.pids.push(raw[r].to_vec());
            }
        }
        if let Some(c) = f.cat.clone().and_then(|r| scan::str_value(&raw[r])) {
            let c = String::from_utf8_lossy(c);
            match info.cat_bytes.get_mut(c.as_ref()) {
                Some(n) => *n += raw.len() as u64,
                None => {
                    info.cat_bytes.insert(c.into_owned(), raw.len() as u64);
                }
            }
        }
        let name = f
            .name
            .clone()
            .and_then(|r| scan::str_value(&raw[r]))
            .unwrap_or(b"");
        if ph == b"M" {
            // Metadata timestamps (Kineto stamps them) are not event times.
            match name {
                b"fastprof_info" => self.fastprof_info(&f, raw),
                b"thread_name" => self.thread_name(&f, raw),
                b"process_name" => self.process_name(&f, raw),
                _ => {}
            }
        } else {
            self.timed(&f, raw, ph, name);
        }
    }

    fn fastprof_info(&mut self, f: &Fields, raw: &[u8]) {
        let info = &mut self.info;
        if info.own_pid.is_none() {
            info.own_pid = f.pid.clone().map(|r| raw[r].to_vec());
        }
        // The complete `otherData` (read first only in a file that puts it
        // first) wins; the rank Kineto's `distributedInfo` gave is kept
        // either way.
        if let Some(a) = f
            .args
            .clone()
            .filter(|_| !self.other_data_seen)
            .and_then(|r| serde_json::from_slice::<Value>(&raw[r]).ok())
        {
            let rank = info.rank.filter(|_| self.rank_from_meta);
            apply_fastprof_meta(info, &a);
            info.rank = rank.or(info.rank);
        }
    }

    /// The first name given to each (pid, tid).
    fn thread_name(&mut self, f: &Fields, raw: &[u8]) {
        let info = &mut self.info;
        if let (Some(p), Some(t), Some(a)) = (f.pid.clone(), f.tid.clone(), f.args.clone()) {
            let key = (raw[p].to_vec(), raw[t].to_vec());
            if !info.thread_names.iter().any(|(k, _)| *k == key) {
                if let Some(n) = serde_json::from_slice::<Value>(&raw[a])
                    .ok()
                    .and_then(|v| v.get("name").and_then(Value::as_str).map(String::from))
                {
                    info.thread_names.push((key, n));
                }
            }
        }
    }

    /// The last name given to each pid.
    fn process_name(&mut self, f: &Fields, raw: &[u8]) {
        if let (Some(p), Some(a)) = (f.pid.clone(), f.args.clone()) {
            if let Ok(v) = serde_json::from_slice::<Value>(&raw[a]) {
                if let Some(n) = v.get("name").and_then(Value::as_str) {
                    self.info
                        .process_names
                        .insert(raw[p].to_vec(), n.to_string());
                }
            }
        }
    }

    /// An event with a time: the input's time range, and the spans pass 2
    /// places by (torch's `python_function` calls, step markers).
    fn timed(&mut self, f: &Fields, raw: &[u8], ph: &[u8], name: &[u8]) {
        let Some(ts) = f.ts_ns(raw) else {
            return;
        };
        let dur = f.dur_ns(raw);
        let info = &mut self.info;
        info.min_ts = Some(info.min_ts.map_or(ts, |m| m.min(ts)));
        info.max_ts = Some(info.max_ts.map_or(ts + dur, |m| m.max(ts + dur)));
        if ph != b"X" {
            return;
        }
        if f.cat
            .clone()
            .and_then(|r| scan::str_value(&raw[r]))
            .is_some_and(|c| c == b"python_function")
        {
            let int = |r: Option<std::ops::Range<usize>>| r.and_then(|r| scan::parse_int(&raw[r]));
            if let (Some(pid), Some(tid)) = (int(f.pid.clone()), int(f.tid.clone())) {
                info.py_calls.push(PyCall {
                    pid,
                    tid,
                    start: ts,
                    end: ts + dur,
                });
            }
        } else if let Some(n) = name.strip_prefix(b"ProfilerStep#") {
            if let Some(number) = std::str::from_utf8(n).ok().and_then(|s| s.parse().ok()) {
                info.steps.push(Step {
                    number,
                    start: ts,
                    end: ts + dur,
                });
            }
        } else if name == contract::STEP_SPAN.as_bytes() && info.kind == Kind::Fastprof {
            let number = f
                .args
                .clone()
                .and_then(|r| serde_json::from_slice::<Value>(&raw[r]).ok())
                .and_then(|a| a.get("step").and_then(Value::as_u64))
                .unwrap_or(self.fastprof_steps);
            self.fastprof_steps += 1;
            info.steps.push(Step {
                number,
                start: ts,
                end: ts + dur,
            });
        }
    }

    /// What the scanner itself found (unreadable events, a salvaged end),
    /// and a warning for times that are not epoch times.
    fn finish(self, sc: &Scanner) -> InputInfo {
        let mut info = self.info;
        info.dropped = sc.dropped();
        info.warnings.extend(sc.warnings().iter().cloned());
        if let Some(s) = sc.salvage() {
            info.salvaged_bytes = s.unused_bytes;
            info.warnings.push(format!(
                "{}: salvaged: {} at byte {}; {} bytes after it unused",
                info.path.display(),
                s.reason,
                s.offset,
                s.unused_bytes
            ));
        }
        if info.kind != Kind::Fastprof && info.base_ns.is_none() {
            // Kineto before torch 2.4 and most Chrome traces: absolute epoch µs.
            if info
                .min_ts
                .is_some_and(|t| t < 1_000_000_000_000_000_000 / 2)
                && info.events > 0
            {
                info.warnings.push(format!(
                    "{}: no baseTimeNanoseconds and timestamps are not epoch times; placed as if they were",
                    info.path.display()
                ));
            }
        }
        info
    }
}
