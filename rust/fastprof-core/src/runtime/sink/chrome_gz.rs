//! The segment sink: streams events through gzip into
//! `fastprof.{N}.json.gz.part`, renamed to `fastprof.{N}.json.gz` once
//! closed, so a finished name always means a complete single-member gzip JSON
//! object. The open segment gets a zlib sync flush every flush interval: a
//! killed process leaves a gzip stream that decodes up to that point, and the
//! reader salvages it. Segments rotate by compressed size (checked after every
//! batch, so a busy thread cannot overshoot by a whole flush interval) and by
//! age; each repeats the head metadata and names its threads again.
//!
//! With a disk cap (`max_disk`, `keep_segments`) the oldest closed segments
//! are deleted to stay under it ([`super::rotation`]), checked after every
//! write, so the files never take more than the cap; every segment closed
//! afterwards says what was deleted in `otherData.rotated`. The session's
//! other files (flight dumps, torch windows) are counted under `max_disk`
//! too once written ([`Sink::adopt_file`]): one ledger, oldest first.
//!
//! Several processes may write into one rank directory by mistake (no RANK
//! in the environment and a shared run name: `mp.spawn`, custom launchers).
//! Segment files are therefore created exclusively (`O_EXCL`) and renamed
//! without replacing (`RENAME_NOREPLACE`, or a hard link): no process ever
//! overwrites another's segment. A lock file (`.fastprof.lock`, `flock`)
//! detects the sharing, which the session reports once.

use super::rotation::Rotation;
use super::{write_head, write_tail, write_thread_name, Batch, Header, MetaSource, Sink};
use crate::contract;
use crate::error::{CoreError, Result};
use crate::runtime::clock;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::json;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    /// CLOCK_MONOTONIC ns of the oldest event start and newest event end written.
    range: Option<(u64, u64)>,
    /// Uncompressed bytes given to the encoder since its last sync flush:
    /// what it may still hold and emit with the next write.
    pending: u64,
}

pub struct ChromeGz {
    header: Arc<Header>,
    dir: PathBuf,
    /// Held (flock) while this session writes here; released when dropped.
    _lock: Option<File>,
    /// Set when another live process holds the directory's lock.
    shared_with: Option<String>,
    segment_size: u64,
    segment_seconds: f64,
    level: Compression,
    seg: Option<Segment>,
    next_index: u32,
    /// Segment in which each thread's `thread_name` was last written.
    named_in: HashMap<u64, u32>,
    buf: Vec<u8>,
    finished: Vec<PathBuf>,
    bytes_compressed: u64,
    rotation: Rotation,
    /// Most compressed bytes one write, flush or close has added to a file
    /// so far (a close's tail can pass the encoder's bound; see `reserve`).
    max_step: u64,
    /// `dir` resolved, to name adopted files relative to it.
    dir_resolved: Option<PathBuf>,
    /// Bytes held for files being written on other threads ([`Sink::hold`]):
    /// counted as if on disk until released.
    held: u64,
}

impl ChromeGz {
    /// Create the directory and open the first segment, so that every I/O
    /// problem surfaces when the session starts.
    pub fn create(
        header: Arc<Header>,
        dir: PathBuf,
        segment_size: u64,
        segment_seconds: f64,
        compression_level: u32,
        max_disk: u64,
        keep_segments: u32,
    ) -> Result<ChromeGz> {
        let existed = dir.is_dir();
        std::fs::create_dir_all(&dir).map_err(|e| CoreError::io(&dir, e))?;
        // Never overwrite: a job resumed under the same run name continues
        // the numbering after the segments already there.
        let next_index = next_free_index(&dir)?;
        let (lock, shared_with) = lock_dir(&dir, header.pid);
        let mut s = ChromeGz {
            _lock: lock,
            shared_with,
            dir: dir.clone(),
            segment_size,
            segment_seconds,
            level: Compression::new(compression_level),
            seg: None,
            next_index,
            named_in: HashMap::new(),
            buf: Vec::with_capacity(4096),
            finished: Vec::new(),
            bytes_compressed: 0,
            rotation: Rotation::new(max_disk, keep_segments, header.start_mono_ns),
            // Until measured, `reserve` holds a batch's worth anyway.
            max_step: 0,
            dir_resolved: std::fs::canonicalize(&dir).ok(),
            held: 0,
            header,
        };
        if let Err(e) = s.open_segment() {
            // Leave nothing half-made: no empty `.part`, no directory we made.
            drop(s);
            if !existed {
                let _ = std::fs::remove_file(dir_lock_path(&dir));
                let _ = std::fs::remove_dir(&dir);
            }
            return Err(e);
        }
        Ok(s)
    }

    /// Another live process records into the same directory: what to tell the user.
    pub fn shared_with(&self) -> Option<&str> {
        self.shared_with.as_deref()
    }

    fn open_segment(&mut self) -> Result<()> {
        // The first free index whose segment and `.part` exist under no
        // process: the `.part` is created exclusively, so two processes in
        // one directory can never pick the same file.
        let (index, part, done, file) = loop {
            let index = self.next_index;
            self.next_index += 1;
            let done = self.dir.join(contract::segment_name(index.into(), false));
            let part = self.dir.join(contract::segment_name(index.into(), true));
            if done.exists() {
                continue;
            }
            match File::options().write(true).create_new(true).open(&part) {
                Ok(f) => break (index, part, done, f),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(CoreError::io(&part, e)),
            }
        };
        let gz = GzEncoder::new(Counting { file, bytes: 0 }, self.level);
        let mut seg = Segment {
            index,
            part,
            done,
            gz,
            opened_ns: clock::monotonic_ns(),
            events: 0,
            range: None,
            pending: 0,
        };
        self.buf.clear();
        write_head(&mut self.buf, &self.header);
        // The head reaches the file at once, so even a segment killed before
        // its first flush salvages to a valid (empty) trace.
        if let Err(e) = seg.gz.write_all(&self.buf).and_then(|_| seg.gz.flush()) {
            let path = seg.part.clone();
            drop(seg);
            let _ = std::fs::remove_file(&path);
            return Err(CoreError::io(path, e));
        }
        self.seg = Some(seg);
        Ok(())
    }

    /// The open segment's file must still be there: a deleted run directory
    /// (or segment) is a failure now, not hours later at stop.
    fn check_still_there(&self) -> io::Result<()> {
        let Some(s) = &self.seg else {
            return Ok(());
        };
        use std::os::unix::fs::MetadataExt;
        if s.gz.get_ref().file.metadata()?.nlink() == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the segment file (or the run directory) was deleted while recording",
            ));
        }
        Ok(())
    }

    fn rotation_due(&self, now: u64) -> bool {
        self.seg.as_ref().is_some_and(|s| {
            s.gz.get_ref().bytes >= self.segment_size
                || (self.segment_seconds > 0.0
                    && now.saturating_sub(s.opened_ns) as f64 >= self.segment_seconds * 1e9)
        })
    }

    fn rotate(&mut self, meta: &dyn MetaSource) -> io::Result<()> {
        self.close_segment(meta, false)?;
        // Delete before the next segment exists: never more than
        // `keep_segments` closed files beside an open one.
        self.enforce_cap();
        self.open_segment().map_err(|e| match e {
            CoreError::Io { source, .. } => source,
            other => io::Error::other(other.to_string()),
        })?;
        self.enforce_cap();
        Ok(())
    }

    fn close_segment(&mut self, meta: &dyn MetaSource, last: bool) -> io::Result<()> {
        let Some(mut seg) = self.seg.take() else {
            return Ok(());
        };
        let mut other = meta.other_data();
        other.insert("segment".into(), json!(seg.index));
        other.insert("final".into(), json!(last));
        other.insert("segment_events".into(), json!(seg.events));
        if let Some(r) = self.rotation.to_json() {
            other.insert("rotated".into(), r);
        }
        self.buf.clear();
        write_tail(&mut self.buf, &other);
        let before = seg.gz.get_ref().bytes;
        seg.gz.write_all(&self.buf)?;
        let counting = seg.gz.finish()?;
        self.max_step = self.max_step.max(counting.bytes - before);
        self.bytes_compressed += counting.bytes;
        let bytes = counting.bytes;
        drop(counting);
        let done = rename_noreplace_free(&seg.part, seg.done, &self.dir, &mut self.next_index)?;
        self.rotation
            .closed(seg.index, done.clone(), bytes, seg.events, seg.range);
        self.finished.push(done);
        Ok(())
    }

    /// What the next write, flush or close may add to the open file at most:
    /// the most one has added so far, or, when more is waiting in the
    /// encoder (a writer held up on a loaded machine takes a larger batch
    /// than any before), zlib's bound for what it holds plus the next batch.
    fn reserve(&self) -> u64 {
        let pending = self.seg.as_ref().map_or(0, |s| s.pending);
        let raw = pending + super::batch_limit(self.segment_size) as u64 + 1024;
        // deflateBound: stored blocks' headers, the stream's own.
        let bound = raw + (raw >> 12) + (raw >> 14) + (raw >> 25) + 64;
        self.max_step.max(bound)
    }

    /// Keep under the disk cap: delete the oldest closed segments while the
    /// files and what the next write may add exceed it.
    fn enforce_cap(&mut self) {
        if !self.rotation.is_on() {
            return;
        }
        let open = self.seg.as_ref().map_or(0, |s| s.gz.get_ref().bytes);
        for gone in self.rotation.enforce(open, self.reserve() + self.held) {
            self.finished.retain(|p| *p != gone);
        }
    }
}

impl Sink for ChromeGz {
    fn describe(&self) -> String {
        match &self.seg {
            Some(s) => s.part.display().to_string(),
            None => self.dir.display().to_string(),
        }
    }

    fn write(&mut self, batch: &Batch, meta: &dyn MetaSource) -> io::Result<()> {
        for c in &batch.chunks {
            let Some(seg) = self.seg.as_mut() else {
                return Ok(());
            };
            let before = seg.gz.get_ref().bytes;
            if self.named_in.get(&c.tid) != Some(&seg.index) {
                self.named_in.insert(c.tid, seg.index);
                self.buf.clear();
                write_thread_name(&mut self.buf, self.header.pid, c.tid, &c.thread_name);
                seg.gz.write_all(&self.buf)?;
                seg.pending += self.buf.len() as u64;
            }
            seg.gz.write_all(&batch.bytes[c.range.clone()])?;
            seg.pending += c.range.len() as u64;
            seg.events += c.events as u64;
            seg.range = Some(match seg.range {
                Some((s, e)) => (s.min(c.start_ns), e.max(c.end_ns)),
                None => (c.start_ns, c.end_ns),
            });
            let after = seg.gz.get_ref().bytes;
            self.max_step = self.max_step.max(after - before);
            if after >= self.segment_size {
                self.rotate(meta)?;
            } else {
                self.enforce_cap();
            }
        }
        Ok(())
    }

    fn flush(&mut self, meta: &dyn MetaSource, now_ns: u64) -> io::Result<()> {
        if let Some(s) = self.seg.as_mut() {
            // A zlib sync flush, then the file: everything so far decodes.
            let before = s.gz.get_ref().bytes;
            s.gz.flush()?;
            s.pending = 0;
            self.max_step = self.max_step.max(s.gz.get_ref().bytes - before);
        }
        self.check_still_there()?;
        if self.rotation_due(now_ns) {
            self.rotate(meta)?;
        } else {
            self.enforce_cap();
        }
        Ok(())
    }

    fn close(&mut self, meta: &dyn MetaSource) -> io::Result<()> {
        self.close_segment(meta, true)
    }

    fn outputs(&mut self) -> (Vec<PathBuf>, u64) {
        (
            std::mem::take(&mut self.finished),
            std::mem::take(&mut self.bytes_compressed),
        )
    }

    fn rotated(&self) -> Option<serde_json::Value> {
        self.rotation.to_json()
    }

    fn room_for_file(&mut self, want: u64) -> Option<u64> {
        let cap = self.rotation.max_disk();
        if cap == 0 {
            return None;
        }
        let room = |s: &Self| {
            let open = s.seg.as_ref().map_or(0, |s| s.gz.get_ref().bytes);
            cap.saturating_sub(open + s.reserve() + s.held)
        };
        if room(self) >= want || self.seg.as_ref().is_none_or(|s| s.pending == 0) {
            return Some(room(self));
        }
        // Right after a burst the encoder holds much, counted at zlib's
        // bound: flushed now (as the next flush interval would), the open
        // segment takes what it adds and the reserve falls to a batch's.
        // A failed flush is the next write's to report.
        if let Some(seg) = self.seg.as_mut() {
            let before = seg.gz.get_ref().bytes;
            if seg.gz.flush().is_ok() {
                seg.pending = 0;
                self.max_step = self.max_step.max(seg.gz.get_ref().bytes - before);
            }
        }
        Some(room(self))
    }

    fn make_room(&mut self, bytes: u64) {
        if self.rotation.max_disk() == 0 {
            return;
        }
        let open = self.seg.as_ref().map_or(0, |s| s.gz.get_ref().bytes);
        for gone in self
            .rotation
            .enforce(open, self.reserve() + self.held + bytes)
        {
            self.finished.retain(|p| *p != gone);
        }
    }

    fn hold(&mut self, bytes: u64) -> bool {
        match self.room_for_file(bytes) {
            None => true,
            Some(room) if bytes <= room => {
                self.make_room(bytes);
                self.held += bytes;
                true
            }
            Some(_) => false,
        }
    }

    fn release(&mut self, bytes: u64) {
        self.held -= bytes.min(self.held);
    }

    fn adopt_file(&mut self, path: &Path, kind: &str) -> Option<String> {
        if !self.rotation.is_on() {
            return None;
        }
        let bytes = match std::fs::metadata(path) {
            Ok(m) if m.is_file() => m.len(),
            _ => return None, // gone already, or not a file: nothing on disk to count
        };
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let name = self
            .dir_resolved
            .as_deref()
            .and_then(|d| resolved.strip_prefix(d).ok())
            .unwrap_or(&resolved)
            .display()
            .to_string();
        let open = self.seg.as_ref().map_or(0, |s| s.gz.get_ref().bytes);
        let reserve = self.reserve() + self.held;
        let why = self
            .rotation
            .adopt(resolved, name, kind, bytes, open, reserve);
        self.enforce_cap();
        why
    }
}

/// A hidden file in a rank directory holding the first segment index to use:
/// a run resumed on another node, whose earlier segments are in object
/// storage and not on this disk, continues their numbering (written by the
/// Python side, which lists the store; see `fastprof.storage.spool`).
pub const FIRST_INDEX_FILE: &str = contract::FIRST_INDEX_FILE;

/// One past the highest `fastprof.{N}.json.gz[.part]` index in `dir`, and
/// at least the index [`FIRST_INDEX_FILE`] names.
fn next_free_index(dir: &Path) -> Result<u32> {
    let mut next = std::fs::read_to_string(dir.join(FIRST_INDEX_FILE))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .unwrap_or(0);
    for entry in std::fs::read_dir(dir).map_err(|e| CoreError::io(dir, e))? {
        let name = entry.map_err(|e| CoreError::io(dir, e))?.file_name();
        let name = name.to_string_lossy();
        let index = name
            .strip_prefix(contract::SEGMENT_PREFIX)
            .and_then(|r| {
                let closed = r.strip_suffix(contract::OPEN_SUFFIX).unwrap_or(r);
                closed.strip_suffix(contract::SEGMENT_SUFFIX)
            })
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(i) = index {
            next = next.max(i + 1);
        }
    }
    Ok(next)
}

fn dir_lock_path(dir: &Path) -> PathBuf {
    dir.join(".fastprof.lock")
}

/// Take the directory's lock (`flock`, released when the file closes, also
/// when the process dies). Returns the held file, or, when another live
/// process holds it, what to tell the user. Failing to lock at all (a
/// filesystem without flock) is not an error: exclusive file creation
/// still keeps the segments apart.
fn lock_dir(dir: &Path, pid: u32) -> (Option<File>, Option<String>) {
    use std::os::fd::AsRawFd;
    let path = dir_lock_path(dir);
    let Ok(mut f) = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
    else {
        return (None, None);
    };
    // SAFETY: a valid open fd; flock has no other preconditions.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        let _ = f.set_len(0);
        let _ = f.write_all(format!("{pid}\n").as_bytes());
        return (Some(f), None);
    }
    let mut other = String::new();
    let _ = std::io::Read::read_to_string(&mut f, &mut other);
    let other = other.trim();
    let who = if other.is_empty() {
        "another process".to_string()
    } else {
        format!("process {other}")
    };
    (
        None,
        Some(format!(
            "{who} is also recording into {}: each process keeps its own segment files, but \
             ranks sharing a directory cannot be told apart when merged; give each process its \
             own rank (RANK or FASTPROF_RANK) or run_name",
            dir.display()
        )),
    )
}

/// Rename `part` to `done` without ever replacing a file; if `done` was
/// taken meanwhile (another process in the same directory), use the next
/// free index instead. Returns the name used.
fn rename_noreplace_free(
    part: &Path,
    done: PathBuf,
    dir: &Path,
    next: &mut u32,
) -> io::Result<PathBuf> {
    let mut target = done;
    loop {
        match rename_noreplace(part, &target) {
            Ok(()) => return Ok(target),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let i = *next;
                *next += 1;
                target = dir.join(contract::segment_name(i.into(), false));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(target_os = "linux")]
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them
    // relative to the working directory like rename(2).
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // Filesystems without RENAME_NOREPLACE: a hard link never replaces either.
        Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => link_then_unlink(from, to),
        _ => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    link_then_unlink(from, to)
}

fn link_then_unlink(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::hard_link(from, to)?;
    std::fs::remove_file(from)
}
