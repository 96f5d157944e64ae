//! The disk cap of what a session writes for its rank (`max_disk` bytes,
//! and/or `keep_segments` closed segment files): a ledger of the closed
//! segments this session wrote and of the other files written for it (its
//! flight-recorder dumps, the Profiler's torch.profiler windows, counted
//! once written: [`Rotation::adopt`]), oldest first, and of those it
//! deleted to stay under the cap. The segment sink ([`super::chrome_gz`])
//! calls it on the writer thread, the one owner of the cap, so deleting
//! never waits on the GIL or a training thread.
//!
//! `max_disk` bounds them all, oldest first; `keep_segments` counts
//! segments only. A file that cannot fit at all (larger than the room the
//! cap leaves beside the open segment) is deleted at once, and the older
//! files are left as they are: deleting them could not make it fit.
//!
//! Only this session's own files are counted and deleted, never the open
//! segment, nor files another process (or an earlier recording of a
//! resumed job) left in the directory: those are not ours to delete.
//!
//! The ledger also keeps what was deleted, written into the `otherData` of
//! every segment closed afterwards (`rotated`), so that a merge or a report
//! can say which part of the run is gone: a summary (count, bytes, events,
//! the time range in trace time) and the newest [`LOG_KEEP`] deletions one
//! by one.

use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;

/// Deletions listed one by one in `otherData.rotated.deleted`; older ones
/// are only in the summary, so the metadata stays small in a week-long job.
pub const LOG_KEEP: usize = 64;

/// A closed segment of this session, or another file written for it, still
/// on disk.
struct Closed {
    /// The segment's index; None for another file.
    index: Option<u32>,
    /// What the file is, for the log: "segment", "flight" (a flight
    /// dump), "torch" (a torch.profiler window).
    kind: String,
    /// How the log names it: a segment's file name, another file's path
    /// relative to the rank directory.
    name: String,
    path: PathBuf,
    bytes: u64,
    events: u64,
    /// CLOCK_MONOTONIC ns of its oldest event's start and newest event's end
    /// (segments only: another file's events are not on the segments' timeline).
    range: Option<(u64, u64)>,
}

pub struct Rotation {
    max_disk: u64,
    keep: u32,
    /// CLOCK_MONOTONIC ns of the trace's `baseTimeNanoseconds`: trace time 0.
    start_mono_ns: u64,
    /// Oldest first: segments as they closed, other files as they were adopted.
    closed: VecDeque<Closed>,
    closed_bytes: u64,
    /// Of `closed`: the segments (what `keep` counts).
    segments_kept: usize,
    deleted: u64,
    deleted_bytes: u64,
    deleted_events: u64,
    /// Other files deleted (flight dumps, torch windows), and their bytes.
    deleted_files: u64,
    deleted_file_bytes: u64,
    deleted_range: Option<(u64, u64)>,
    log: VecDeque<Value>,
    /// Deletions that failed (other than a file already gone): named here
    /// and in the metadata; the segment is then no longer counted.
    failures: Vec<String>,
}

impl Rotation {
    pub fn new(max_disk: u64, keep: u32, start_mono_ns: u64) -> Rotation {
        Rotation {
            max_disk,
            keep,
            start_mono_ns,
            closed: VecDeque::new(),
            closed_bytes: 0,
            segments_kept: 0,
            deleted: 0,
            deleted_bytes: 0,
            deleted_events: 0,
            deleted_files: 0,
            deleted_file_bytes: 0,
            deleted_range: None,
            log: VecDeque::new(),
            failures: Vec::new(),
        }
    }

    /// The byte cap (0: none).
    pub fn max_disk(&self) -> u64 {
        self.max_disk
    }

    /// Whether a cap is set at all (without one nothing is tracked).
    pub fn is_on(&self) -> bool {
        self.max_disk > 0 || self.keep > 0
    }

    /// Note a segment just closed (and renamed to `path`).
    pub fn closed(
        &mut self,
        index: u32,
        path: PathBuf,
        bytes: u64,
        events: u64,
        range: Option<(u64, u64)>,
    ) {
        if !self.is_on() {
            return;
        }
        self.closed_bytes += bytes;
        self.segments_kept += 1;
        self.closed.push_back(Closed {
            index: Some(index),
            kind: "segment".into(),
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            path,
            bytes,
            events,
            range,
        });
    }

    /// Count a file written for this session elsewhere than the segments (a
    /// flight dump, a torch window: `kind`) under `max_disk`, as the newest;
    /// `name` is how the log names it. A file adopted again (rewritten under
    /// its name) is counted once, at its new size. When it cannot fit at all
    /// beside the open segment's `open_bytes` and `reserve`, it is deleted
    /// at once (and logged): returns why. Call [`Rotation::enforce`] next.
    pub fn adopt(
        &mut self,
        path: PathBuf,
        name: String,
        kind: &str,
        bytes: u64,
        open_bytes: u64,
        reserve: u64,
    ) -> Option<String> {
        if self.max_disk == 0 {
            return None;
        }
        if let Some(i) = self.closed.iter().position(|c| c.path == path) {
            if let Some(old) = self.closed.remove(i) {
                self.closed_bytes -= old.bytes;
            }
        }
        let c = Closed {
            index: None,
            kind: kind.into(),
            name,
            path,
            bytes,
            events: 0,
            range: None,
        };
        let room = self.max_disk.saturating_sub(open_bytes + reserve);
        if bytes > room {
            if let Err(e) = remove_if_there(&c.path) {
                self.failures
                    .push(format!("{}: could not delete: {e}", c.path.display()));
                return Some(format!(
                    "larger than the disk cap leaves room for, and could not be deleted: {e}"
                ));
            }
            self.log_deleted(&c);
            return Some(format!(
                "deleted by the disk cap as soon as written: {bytes} bytes, more than the {room} \
                 that max_disk ({}) leaves beside the open segment",
                self.max_disk
            ));
        }
        self.closed_bytes += bytes;
        self.closed.push_back(c);
        None
    }

    /// Delete the oldest files while more than `keep` closed segments are
    /// kept (the oldest segment then), or while the files, the open
    /// segment's `open_bytes` and `reserve` (what the next write may add at
    /// most) exceed `max_disk`. Returns the paths deleted.
    pub fn enforce(&mut self, open_bytes: u64, reserve: u64) -> Vec<PathBuf> {
        let mut gone = Vec::new();
        let mut vanished_checked = false;
        loop {
            let too_many = self.keep > 0 && self.segments_kept > self.keep as usize;
            let too_big =
                self.max_disk > 0 && self.closed_bytes + open_bytes + reserve > self.max_disk;
            if !(too_many || too_big) {
                break;
            }
            if !vanished_checked {
                // Another file removed meanwhile (torch's num_traces_to_keep,
                // by hand) takes no disk: forgotten rather than counted, so
                // nothing else is deleted for it (a handful of stats, only
                // when a deletion is due).
                vanished_checked = true;
                if self.forget_vanished() {
                    continue;
                }
            }
            let at = if too_big {
                0
            } else {
                match self.closed.iter().position(|c| c.index.is_some()) {
                    Some(i) => i,
                    None => break,
                }
            };
            let Some(c) = self.closed.remove(at) else {
                break;
            };
            self.closed_bytes -= c.bytes;
            if c.index.is_some() {
                self.segments_kept -= 1;
            }
            // Already gone (removed by hand): it no longer takes disk either.
            if let Err(e) = remove_if_there(&c.path) {
                self.failures
                    .push(format!("{}: could not delete: {e}", c.path.display()));
                continue;
            }
            self.log_deleted(&c);
            gone.push(c.path);
        }
        gone
    }

    /// Forget the files no longer on disk; true when any was.
    fn forget_vanished(&mut self) -> bool {
        let before = self.closed.len();
        let mut freed = 0;
        let mut segments = 0;
        self.closed.retain(|c| {
            // A segment gone too: sent to object storage and freed from the
            // spool by the uploader, or removed by hand. Either way it takes
            // no disk, and deleting it again would count as data lost.
            let keep = c.path.exists();
            if !keep {
                freed += c.bytes;
                segments += usize::from(c.index.is_some());
            }
            keep
        });
        self.closed_bytes -= freed;
        self.segments_kept -= segments;
        self.closed.len() != before
    }

    fn log_deleted(&mut self, c: &Closed) {
        let Some(index) = c.index else {
            self.deleted_files += 1;
            self.deleted_file_bytes += c.bytes;
            self.log.push_back(json!({
                "kind": c.kind,
                "file": c.name,
                "bytes": c.bytes,
            }));
            if self.log.len() > LOG_KEEP {
                self.log.pop_front();
            }
            return;
        };
        self.deleted += 1;
        self.deleted_bytes += c.bytes;
        self.deleted_events += c.events;
        if let Some((s, e)) = c.range {
            self.deleted_range = Some(match self.deleted_range {
                Some((s0, e0)) => (s0.min(s), e0.max(e)),
                None => (s, e),
            });
        }
        let (ts_start, ts_end) = self.trace_time(c.range);
        self.log.push_back(json!({
            "kind": c.kind,
            "segment": index,
            "file": c.name,
            "bytes": c.bytes,
            "events": c.events,
            "ts_start": ts_start,
            "ts_end": ts_end,
        }));
        if self.log.len() > LOG_KEEP {
            self.log.pop_front();
        }
    }

    /// A CLOCK_MONOTONIC range as trace time (µs from `baseTimeNanoseconds`,
    /// like the events' `ts`); null when the segment held no event.
    fn trace_time(&self, range: Option<(u64, u64)>) -> (Value, Value) {
        let us = |ns: u64| {
            let rel = ns as i64 - self.start_mono_ns as i64;
            json!(rel as f64 / 1000.0)
        };
        match range {
            Some((s, e)) => (us(s), us(e)),
            None => (Value::Null, Value::Null),
        }
    }

    /// `otherData.rotated`: what was deleted so far; None when nothing was.
    /// `segments`, `bytes`, `events` and the time range are the segments'
    /// (the part of the timeline gone); `files` and `files_bytes` the
    /// other files' (flight dumps, torch windows).
    pub fn to_json(&self) -> Option<Value> {
        if self.deleted == 0 && self.deleted_files == 0 && self.failures.is_empty() {
            return None;
        }
        let (ts_start, ts_end) = self.trace_time(self.deleted_range);
        let mut v = json!({
            "segments": self.deleted,
            "bytes": self.deleted_bytes,
            "events": self.deleted_events,
            "files": self.deleted_files,
            "files_bytes": self.deleted_file_bytes,
            "ts_start": ts_start,
            "ts_end": ts_end,
            "max_disk": self.max_disk,
            "keep_segments": self.keep,
            "deleted": self.log,
            "not_listed": self.deleted + self.deleted_files - self.log.len() as u64,
        });
        if !self.failures.is_empty() {
            v["delete_failures"] = json!(self.failures);
        }
        Some(v)
    }
}

/// Delete `path`; one already gone is no error (it takes no disk either).
fn remove_if_there(path: &std::path::Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fastprof-rot-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn file(d: &std::path::Path, i: u32, bytes: usize) -> PathBuf {
        let p = d.join(format!("fastprof.{i}.json.gz"));
        std::fs::write(&p, vec![0u8; bytes]).unwrap();
        p
    }

    fn on_disk(d: &std::path::Path) -> u64 {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn oldest_go_first_and_the_cap_holds() {
        let d = dir("cap");
        let mut r = Rotation::new(1000, 0, 1_000_000);
        for i in 0..10u32 {
            let p = file(&d, i, 300);
            let t = 1_000_000 + u64::from(i) * 10_000;
            r.closed(i, p, 300, 5, Some((t, t + 5_000)));
            // The open segment holds 100 bytes and may grow by 100 more.
            r.enforce(100, 100);
            assert!(on_disk(&d) + 200 <= 1000, "{} on disk", on_disk(&d));
        }
        // 2 of 300 bytes fit beside 200: segments 8 and 9 are kept.
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        let mut left = left;
        left.sort();
        assert_eq!(left, ["fastprof.8.json.gz", "fastprof.9.json.gz"]);
        let j = r.to_json().unwrap();
        assert_eq!(j["segments"], 8);
        assert_eq!(j["bytes"], 2400);
        assert_eq!(j["events"], 40);
        // Trace time: µs from start_mono_ns; segment 0 began at 0, 7 ended at 75 µs.
        assert_eq!(j["ts_start"], 0.0);
        assert_eq!(j["ts_end"], 75.0);
        let listed: Vec<u64> = j["deleted"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["segment"].as_u64().unwrap())
            .collect();
        assert_eq!(listed, (0..8).collect::<Vec<_>>());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn keep_segments_and_a_bounded_log() {
        let d = dir("keep");
        let mut r = Rotation::new(0, 3, 0);
        let n = LOG_KEEP as u32 + 10;
        for i in 0..n {
            r.closed(i, file(&d, i, 10), 10, 1, None);
            assert!(r.enforce(0, 0).len() <= 1);
        }
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 3);
        let j = r.to_json().unwrap();
        assert_eq!(j["segments"], u64::from(n - 3));
        assert_eq!(j["deleted"].as_array().unwrap().len(), LOG_KEEP);
        assert_eq!(j["not_listed"], u64::from(n - 3) - LOG_KEEP as u64);
        // No event in them: no time range rather than a made-up one.
        assert!(j["ts_start"].is_null());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn off_tracks_nothing_and_a_segment_removed_by_hand_is_forgotten() {
        let d = dir("off");
        let mut off = Rotation::new(0, 0, 0);
        off.closed(0, file(&d, 0, 10), 10, 1, None);
        assert!(off.enforce(u64::MAX / 2, 0).is_empty());
        assert!(off.to_json().is_none());
        let mut r = Rotation::new(0, 1, 0);
        let p0 = file(&d, 1, 10);
        r.closed(1, p0.clone(), 10, 1, None);
        r.closed(2, file(&d, 2, 10), 10, 1, None);
        std::fs::remove_file(&p0).unwrap();
        // Gone already (by hand, or sent to the store by the uploader): not an
        // error, and not a deletion of the cap's (nothing was lost by it).
        assert!(r.enforce(0, 0).is_empty());
        assert!(r.to_json().is_none());
        assert_eq!(r.segments_kept, 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn other(d: &std::path::Path, name: &str, bytes: usize) -> PathBuf {
        let p = d.join(name);
        std::fs::write(&p, vec![0u8; bytes]).unwrap();
        p
    }

    fn names(d: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn other_files_share_the_cap_oldest_first() {
        let d = dir("adopt");
        let mut r = Rotation::new(1000, 0, 0);
        r.closed(0, file(&d, 0, 300), 300, 5, Some((10, 20)));
        assert!(r
            .adopt(
                other(&d, "dump-a", 300),
                "dump-a".into(),
                "flight",
                300,
                0,
                0
            )
            .is_none());
        r.enforce(0, 0);
        r.closed(1, file(&d, 1, 300), 300, 5, Some((30, 40)));
        assert!(r
            .adopt(other(&d, "win-b", 300), "win-b".into(), "torch", 300, 0, 0)
            .is_none());
        // 1200 bytes: the oldest (segment 0) goes; then all fits.
        r.enforce(0, 0);
        assert!(on_disk(&d) <= 1000);
        assert_eq!(names(&d), ["dump-a", "fastprof.1.json.gz", "win-b"]);
        r.closed(2, file(&d, 2, 300), 300, 5, Some((50, 60)));
        r.enforce(0, 0);
        // The flight dump was next oldest: files and segments alike.
        assert_eq!(
            names(&d),
            ["fastprof.1.json.gz", "fastprof.2.json.gz", "win-b"]
        );
        let j = r.to_json().unwrap();
        assert_eq!(
            (j["segments"].as_u64(), j["bytes"].as_u64()),
            (Some(1), Some(300))
        );
        assert_eq!(
            (j["files"].as_u64(), j["files_bytes"].as_u64()),
            (Some(1), Some(300))
        );
        // The time range is the segments' alone.
        assert_eq!(j["ts_end"], 0.02);
        let log = j["deleted"].as_array().unwrap();
        assert_eq!(log[0]["kind"], "segment");
        assert_eq!(log[0]["segment"], 0);
        assert_eq!(log[1]["kind"], "flight");
        assert_eq!(log[1]["file"], "dump-a");
        assert!(log[1].get("segment").is_none());
        assert_eq!(j["not_listed"], 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_that_cannot_fit_is_deleted_at_once_and_the_rest_kept() {
        let d = dir("toobig");
        let mut r = Rotation::new(1000, 0, 0);
        r.closed(0, file(&d, 0, 300), 300, 5, None);
        let big = other(&d, "dump-big", 900);
        // 900 bytes beside an open segment of 100 that may grow by 100: no room.
        let why = r.adopt(big.clone(), "dump-big".into(), "flight", 900, 100, 100);
        assert!(why.unwrap().contains("800"));
        assert!(!big.exists());
        assert!(r.enforce(100, 100).is_empty());
        assert_eq!(names(&d), ["fastprof.0.json.gz"]);
        let j = r.to_json().unwrap();
        assert_eq!(
            (j["segments"].as_u64(), j["files"].as_u64()),
            (Some(0), Some(1))
        );
        // Without a byte cap nothing else is tracked (keep_segments counts segments).
        let mut k = Rotation::new(0, 1, 0);
        assert!(k
            .adopt(other(&d, "w", 10), "w".into(), "torch", 10, 0, 0)
            .is_none());
        k.closed(1, file(&d, 1, 10), 10, 1, None);
        k.closed(2, file(&d, 2, 10), 10, 1, None);
        assert_eq!(k.enforce(0, 0), vec![d.join("fastprof.1.json.gz")]);
        assert!(d.join("w").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn keep_segments_counts_segments_and_vanished_or_rewritten_files_count_once() {
        let d = dir("mixed");
        let mut r = Rotation::new(10_000, 2, 0);
        let w = other(&d, "win", 100);
        r.adopt(w.clone(), "win".into(), "torch", 100, 0, 0);
        for i in 0..3 {
            r.closed(i, file(&d, i, 10), 10, 1, None);
        }
        // Three segments, one too many: the oldest segment goes, not the older window.
        assert_eq!(r.enforce(0, 0), vec![d.join("fastprof.0.json.gz")]);
        assert!(w.exists());
        // Rewritten under its name: counted at its new size, once.
        r.adopt(w.clone(), "win".into(), "torch", 5000, 0, 0);
        assert_eq!(r.closed_bytes, 5020);
        // Removed by someone else: forgotten, and nothing is deleted for it.
        std::fs::remove_file(&w).unwrap();
        assert!(r.enforce(0, 5500).is_empty());
        assert_eq!(r.closed_bytes, 20);
        assert_eq!(r.to_json().unwrap()["files"], 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_segment_freed_by_the_uploader_is_forgotten_not_counted_as_deleted() {
        // With out_dir a URL, the uploader removes each segment from the
        // spool once it is in the store: the cap must not count it as lost.
        let d = dir("uploaded");
        let mut r = Rotation::new(35, 2, 0);
        for i in 0..3 {
            r.closed(i, file(&d, i, 10), 10, 1, None);
        }
        std::fs::remove_file(d.join("fastprof.0.json.gz")).unwrap();
        std::fs::remove_file(d.join("fastprof.1.json.gz")).unwrap();
        assert!(r.enforce(10, 0).is_empty());
        assert!(r.to_json().is_none_or(|j| j["segments"] == 0));
        assert_eq!(r.segments_kept, 1);
        // Later segments are counted as before.
        r.closed(3, file(&d, 3, 10), 10, 1, None);
        r.closed(4, file(&d, 4, 10), 10, 1, None);
        assert_eq!(r.enforce(0, 0), vec![d.join("fastprof.2.json.gz")]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
