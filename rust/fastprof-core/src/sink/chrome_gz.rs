//! The segment sink: streams events through gzip into
//! `fastprof.{N}.json.gz.part`, renamed to `fastprof.{N}.json.gz` once
//! closed, so a finished name always means a complete single-member gzip JSON
//! object. The open segment gets a zlib sync flush every flush interval: a
//! killed process leaves a gzip stream that decodes up to that point, and the
//! reader salvages it. Segments rotate by compressed size (checked after every
//! batch, so a busy thread cannot overshoot by a whole flush interval) and by
//! age; each repeats the head metadata and names its threads again.

use super::{write_head, write_tail, write_thread_name, Batch, Header, MetaSource, Sink};
use crate::clock;
use crate::error::{CoreError, Result};
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
}

pub struct ChromeGz {
    header: Arc<Header>,
    dir: PathBuf,
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
    ) -> Result<ChromeGz> {
        std::fs::create_dir_all(&dir).map_err(|e| CoreError::io(&dir, e))?;
        // Never overwrite: a job resumed under the same run name continues
        // the numbering after the segments already there.
        let next_index = next_free_index(&dir)?;
        let mut s = ChromeGz {
            header,
            dir,
            segment_size,
            segment_seconds,
            level: Compression::new(compression_level),
            seg: None,
            next_index,
            named_in: HashMap::new(),
            buf: Vec::with_capacity(4096),
            finished: Vec::new(),
            bytes_compressed: 0,
        };
        s.open_segment()?;
        Ok(s)
    }

    fn open_segment(&mut self) -> Result<()> {
        let index = self.next_index;
        let done = self.dir.join(format!("fastprof.{index}.json.gz"));
        let part = self.dir.join(format!("fastprof.{index}.json.gz.part"));
        let file = File::create(&part).map_err(|e| CoreError::io(&part, e))?;
        let gz = GzEncoder::new(Counting { file, bytes: 0 }, self.level);
        self.next_index += 1;
        let mut seg = Segment {
            index,
            part,
            done,
            gz,
            opened_ns: clock::monotonic_ns(),
            events: 0,
        };
        self.buf.clear();
        write_head(&mut self.buf, &self.header);
        // The head reaches the file at once, so even a segment killed before
        // its first flush salvages to a valid (empty) trace.
        let r = seg.gz.write_all(&self.buf).and_then(|_| seg.gz.flush());
        let path = seg.part.clone();
        self.seg = Some(seg);
        r.map_err(|e| CoreError::io(path, e))
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
        self.open_segment().map_err(|e| match e {
            CoreError::Io { source, .. } => source,
            other => io::Error::other(other.to_string()),
        })
    }

    fn close_segment(&mut self, meta: &dyn MetaSource, last: bool) -> io::Result<()> {
        let Some(mut seg) = self.seg.take() else {
            return Ok(());
        };
        let mut other = meta.other_data();
        other.insert("segment".into(), json!(seg.index));
        other.insert("final".into(), json!(last));
        other.insert("segment_events".into(), json!(seg.events));
        self.buf.clear();
        write_tail(&mut self.buf, &other);
        seg.gz.write_all(&self.buf)?;
        let counting = seg.gz.finish()?;
        self.bytes_compressed += counting.bytes;
        drop(counting);
        std::fs::rename(&seg.part, &seg.done)?;
        self.finished.push(seg.done);
        Ok(())
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
            if self.named_in.get(&c.tid) != Some(&seg.index) {
                self.named_in.insert(c.tid, seg.index);
                self.buf.clear();
                write_thread_name(&mut self.buf, self.header.pid, c.tid, &c.thread_name);
                seg.gz.write_all(&self.buf)?;
            }
            seg.gz.write_all(&batch.bytes[c.range.clone()])?;
            seg.events += c.events as u64;
            if seg.gz.get_ref().bytes >= self.segment_size {
                self.rotate(meta)?;
            }
        }
        Ok(())
    }

    fn flush(&mut self, meta: &dyn MetaSource, now_ns: u64) -> io::Result<()> {
        if let Some(s) = self.seg.as_mut() {
            // A zlib sync flush, then the file: everything so far decodes.
            s.gz.flush()?;
        }
        if self.rotation_due(now_ns) {
            self.rotate(meta)?;
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
