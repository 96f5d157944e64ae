//! The disk cap of a session's segment files (`max_disk` bytes and/or
//! `keep_segments` closed files): a ledger of the closed segments this
//! session wrote, oldest first, and of those it deleted to stay under the
//! cap. The segment sink ([`super::chrome_gz`]) calls it on the writer
//! thread, so deleting never waits on the GIL or a training thread.
//!
//! Only this session's own closed segments are counted and deleted, never
//! the open one, nor files another process (or an earlier recording of a
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

/// A closed segment of this session, still on disk.
struct Closed {
    index: u32,
    path: PathBuf,
    bytes: u64,
    events: u64,
    /// CLOCK_MONOTONIC ns of its oldest event's start and newest event's end.
    range: Option<(u64, u64)>,
}

pub struct Rotation {
    max_disk: u64,
    keep: u32,
    /// CLOCK_MONOTONIC ns of the trace's `baseTimeNanoseconds`: trace time 0.
    start_mono_ns: u64,
    closed: VecDeque<Closed>,
    closed_bytes: u64,
    deleted: u64,
    deleted_bytes: u64,
    deleted_events: u64,
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
            deleted: 0,
            deleted_bytes: 0,
            deleted_events: 0,
            deleted_range: None,
            log: VecDeque::new(),
            failures: Vec::new(),
        }
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
        self.closed.push_back(Closed {
            index,
            path,
            bytes,
            events,
            range,
        });
    }

    /// Delete the oldest closed segments while more than `keep` are kept, or
    /// while the closed ones, the open one's `open_bytes` and `reserve` (what
    /// the next write may add at most) exceed `max_disk`. Returns the paths
    /// deleted.
    pub fn enforce(&mut self, open_bytes: u64, reserve: u64) -> Vec<PathBuf> {
        let mut gone = Vec::new();
        loop {
            let too_many = self.keep > 0 && self.closed.len() > self.keep as usize;
            let too_big =
                self.max_disk > 0 && self.closed_bytes + open_bytes + reserve > self.max_disk;
            if !(too_many || too_big) {
                break;
            }
            let Some(c) = self.closed.pop_front() else {
                break;
            };
            self.closed_bytes -= c.bytes;
            match std::fs::remove_file(&c.path) {
                // Already gone (removed by hand): it no longer takes disk either.
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    self.failures
                        .push(format!("{}: could not delete: {e}", c.path.display()));
                    continue;
                }
            }
            self.log_deleted(&c);
            gone.push(c.path);
        }
        gone
    }

    fn log_deleted(&mut self, c: &Closed) {
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
            "segment": c.index,
            "file": c.path.file_name().map(|n| n.to_string_lossy().into_owned()),
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
    pub fn to_json(&self) -> Option<Value> {
        if self.deleted == 0 && self.failures.is_empty() {
            return None;
        }
        let (ts_start, ts_end) = self.trace_time(self.deleted_range);
        let mut v = json!({
            "segments": self.deleted,
            "bytes": self.deleted_bytes,
            "events": self.deleted_events,
            "ts_start": ts_start,
            "ts_end": ts_end,
            "max_disk": self.max_disk,
            "keep_segments": self.keep,
            "deleted": self.log,
            "not_listed": self.deleted - self.log.len() as u64,
        });
        if !self.failures.is_empty() {
            v["delete_failures"] = json!(self.failures);
        }
        Some(v)
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
    fn off_tracks_nothing_and_a_file_removed_by_hand_is_not_an_error() {
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
        assert_eq!(r.enforce(0, 0), vec![p0]);
        assert_eq!(r.to_json().unwrap()["segments"], 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
