//! What one trace file says about itself while it is scanned: its kind
//! (fastprof segment, Kineto, plain Chrome, a merge output), its rank, its
//! time base and clock offset, and in a merged trace the rank of each pid.
//!
//! Shared by [`super::columns`] and [`crate::offline::analyze`] so that both place
//! events on the same epoch-ns timeline and give them the same ranks:
//!
//! * time: `baseTimeNanoseconds` + relative µs (Kineto, torch >= 2.4, and
//!   fastprof), else absolute epoch µs (older Kineto, most Chrome traces),
//!   plus the rank's clock offset (`otherData.clock.offset_ns`);
//! * rank: fastprof metadata (`otherData.rank`, or `fastprof_info` of a
//!   segment cut before its end), Kineto's `distributedInfo.rank`, a
//!   `rank{R}` path component; in a merged trace the `rank R` / `rank R · ...`
//!   process names, else the merge's pid scheme `(rank + 1) * 100000 + n`.
//!
//! Kineto may write `baseTimeNanoseconds` and `distributedInfo` after its
//! events, so a consumer keeps raw µs-as-ns and applies [`FileMeta::shift`]
//! and [`FileMeta::rank_of`] once the file has been read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::scan::{self, Fields};
use crate::offline::trace::inputs;

/// One input file and what was learnt about it.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInfo {
    pub path: PathBuf,
    /// "fastprof", "kineto", "chrome" or "merged".
    pub kind: &'static str,
    pub rank: Option<u32>,
    pub base_ns: Option<i64>,
    pub offset_ns: i64,
    /// Events the scanner yielded.
    pub events: u64,
    pub salvaged: bool,
    /// Where a salvaged file was cut: the byte of the decompressed text just
    /// after the last value used, and why reading stopped there.
    pub cut: Option<(u64, String)>,
    /// Spans left out for a hostile `dur` (negative, not a number in range,
    /// or longer than [`scan::MAX_DUR_NS`]; an E before its B): (name, count), by
    /// name. Left out rather than read as 0 s, which would pass for a real
    /// (and very fast) span in every statistic.
    pub bad_dur: Vec<(String, u64)>,
    /// Why the file was not used (a previous merge output next to its
    /// inputs, or a file in a directory that is not a trace).
    pub skipped: Option<String>,
    /// What a recording's disk cap had deleted (`otherData.rotated`): a
    /// fastprof segment's ledger (an object, times in its own trace time),
    /// or a merged trace's per-rank list (epoch ns).
    pub rotated: Option<Value>,
}

pub(crate) struct FileMeta {
    pub info: FileInfo,
    /// The rank came from the file's own metadata (not its path).
    pub rank_from_meta: bool,
    /// A complete fastprof `otherData` was read (it wins over `fastprof_info`).
    pub other_data_seen: bool,
    /// Merged traces: rank of each pid, from `rank R` / `rank R · ...` process names.
    pub pid_rank: HashMap<i64, u32>,
    /// Smallest raw timestamp seen (to recognise absolute epoch µs).
    pub min_ts: Option<i64>,
}

/// What an `M` event meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetaEvent {
    /// `fastprof_merge`: the file is a merge output.
    MergeMarker,
    Other,
}

impl FileMeta {
    pub fn new(path: &Path) -> FileMeta {
        FileMeta {
            info: FileInfo {
                rank: inputs::rank_from_path(path),
                ..FileInfo::new(path.to_path_buf())
            },
            rank_from_meta: false,
            other_data_seen: false,
            pid_rank: HashMap::new(),
            min_ts: None,
        }
    }

    pub fn note_ts(&mut self, ts: i64) {
        self.min_ts = Some(self.min_ts.map_or(ts, |m| m.min(ts)));
    }

    /// A top-level value other than the events.
    pub fn top_level(&mut self, key: &str, raw: &[u8]) {
        match key {
            "baseTimeNanoseconds" => self.info.base_ns = scan::parse_int(raw),
            "distributedInfo" => {
                if self.info.kind == "chrome" {
                    self.info.kind = "kineto";
                }
                let v = serde_json::from_slice::<Value>(raw).ok();
                if let Some(r) = v.as_ref().and_then(|v| v.get("rank")).and_then(json_u32) {
                    self.info.rank = Some(r);
                    self.rank_from_meta = true;
                }
            }
            "schemaVersion" | "deviceProperties" | "traceName" if self.info.kind == "chrome" => {
                self.info.kind = "kineto";
            }
            "otherData" => {
                let Ok(v) = serde_json::from_slice::<Value>(raw) else {
                    return;
                };
                self.info.rotated = v
                    .get("rotated")
                    .filter(|r| r.is_object() || r.as_array().is_some_and(|a| !a.is_empty()))
                    .cloned();
                if v.get("merged") == Some(&Value::Bool(true)) {
                    self.info.kind = "merged";
                } else if v.get("producer").and_then(Value::as_str) == Some("fastprof") {
                    self.apply_fastprof(&v);
                    self.rank_from_meta = true;
                    self.other_data_seen = true;
                }
            }
            _ => {}
        }
    }

    /// An `M` (metadata) event, given its parsed fields.
    pub fn metadata_event(&mut self, f: &Fields, raw: &[u8]) -> MetaEvent {
        let get = |r: &Option<std::ops::Range<usize>>| r.clone().map(|r| &raw[r]);
        let name = get(&f.name).and_then(scan::str_value).unwrap_or(b"");
        if name == b"fastprof_merge" {
            self.info.kind = "merged";
            return MetaEvent::MergeMarker;
        }
        let args = || get(&f.args).and_then(|a| serde_json::from_slice::<Value>(a).ok());
        // A merged trace carries every input's fastprof_info: not its own.
        // fastprof's own `distributedInfo` comes before it: its rank is
        // kept, the rest (kind, clock offset) still comes from here.
        if name == b"fastprof_info" && !self.other_data_seen && self.info.kind != "merged" {
            if let Some(a) = args() {
                let rank = self.info.rank.filter(|_| self.rank_from_meta);
                self.apply_fastprof(&a);
                self.info.rank = rank.or(self.info.rank);
            }
        } else if name == b"process_name" && self.info.kind == "merged" {
            let pid = get(&f.pid).and_then(scan::parse_int);
            let rank = args().and_then(|a| {
                // "rank R", "rank R · <role>" (and older merges' "rank R: <name>").
                let n = a.get("name")?.as_str()?.strip_prefix("rank ")?;
                let end = n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len());
                n[..end].parse::<u32>().ok()
            });
            if let (Some(p), Some(r)) = (pid, rank) {
                self.pid_rank.insert(p, r);
            }
        }
        MetaEvent::Other
    }

    /// fastprof metadata (`otherData`, or the `fastprof_info` event of a segment
    /// cut before its end): the rank and the clock offset, as the merge reads them.
    fn apply_fastprof(&mut self, meta: &Value) {
        self.info.kind = "fastprof";
        if let Some(r) = meta.get("rank").and_then(json_u32) {
            self.info.rank = Some(r);
        }
        if let Some(off) = meta
            .get("clock")
            .and_then(|c| c.get("offset_ns"))
            .and_then(Value::as_i64)
        {
            self.info.offset_ns = off;
        }
    }

    /// After the file: take the clock offset of the rank's fastprof segments
    /// (a torch trace has none of its own), or record this segment's.
    pub fn settle_offset(&mut self, rank_offsets: &mut HashMap<u32, i64>) {
        let info = &mut self.info;
        if info.kind != "fastprof" && info.kind != "merged" {
            if let Some(&o) = info.rank.and_then(|r| rank_offsets.get(&r)) {
                info.offset_ns = o;
            }
        } else if let Some(r) = info.rank {
            rank_offsets.entry(r).or_insert(info.offset_ns);
        }
    }

    /// A warning when a file without `baseTimeNanoseconds` does not hold
    /// epoch times either.
    pub fn time_base_warning(&self) -> Option<String> {
        let info = &self.info;
        (info.base_ns.is_none()
            && info.kind != "fastprof"
            && self.min_ts.is_some_and(|t| t < 1_000_000_000_000_000_000 / 2))
        .then(|| {
            format!(
                "{}: no baseTimeNanoseconds and timestamps are not epoch times; read as if they were",
                info.path.display()
            )
        })
    }

    /// What to add to a raw timestamp (µs as ns) to get epoch ns.
    pub fn shift(&self) -> i64 {
        self.info
            .base_ns
            .unwrap_or(0)
            .saturating_add(self.info.offset_ns)
    }

    /// The rank of an event of `pid` in this file, -1 unknown.
    pub fn rank_of(&self, pid: i64) -> i32 {
        let file_rank = self.info.rank.map_or(-1, |r| r as i32);
        if self.pid_rank.is_empty() {
            return file_rank;
        }
        match self.pid_rank.get(&pid) {
            Some(&r) => r as i32,
            // The merge numbers pids (rank + 1) * 100000 + n.
            None if pid >= 100_000 => (pid / 100_000 - 1) as i32,
            None => file_rank,
        }
    }
}

fn json_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|x| u32::try_from(x).ok())
}
