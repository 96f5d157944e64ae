//! The flight-recorder window: the last `seconds` of events and counters
//! (and at most `max_bytes`), kept in memory, compressed, overwrite-oldest.
//! [`Window::dump`] writes it as a complete, valid trace without stopping the
//! session (the collector adds the spans still open, closed at that instant
//! with `args.unclosed`).
//!
//! Events arrive formatted; they are appended to an open block which is
//! deflated once it reaches [`BLOCK`] bytes. Memory is the capacity of every
//! compressed block plus the open block's buffer; blocks are evicted oldest
//! first while that exceeds `max_bytes`, and once their newest event is older
//! than `seconds`. So the window's memory never exceeds its configured bound.

use super::{write_head, write_tail, write_thread_name, Batch, Header, MetaSource, Sink};
use crate::clock;
use flate2::write::{DeflateEncoder, GzEncoder};
use flate2::Compression;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a window dump wrote.
#[derive(Debug, Clone, Default)]
pub struct DumpInfo {
    pub path: PathBuf,
    pub events: u64,
    pub open_spans: u64,
    pub bytes: u64,
    /// CLOCK_MONOTONIC ns of the oldest event kept (0 when empty).
    pub first_ns: u64,
    /// Set when the disk cap deleted the dump as soon as it was written
    /// (it cannot fit under `max_disk`): why.
    pub deleted: Option<String>,
}

/// Uncompressed bytes per block before it is deflated.
pub const BLOCK: usize = 64 * 1024;

struct Block {
    deflated: Vec<u8>,
    events: u64,
    /// CLOCK_MONOTONIC ns at which the newest event of the block ends.
    end_ns: u64,
}

pub struct Window {
    header: Arc<Header>,
    seconds: f64,
    max_bytes: u64,
    open: Vec<u8>,
    open_events: u64,
    open_end_ns: u64,
    blocks: VecDeque<Block>,
    /// Sum of the blocks' `deflated` capacities.
    deflated_bytes: u64,
    threads: BTreeMap<u64, Arc<str>>,
    evicted_events: u64,
    evicted_blocks: u64,
    dumps: u64,
}

impl Window {
    pub fn new(header: Arc<Header>, seconds: f64, max_bytes: u64) -> Window {
        Window {
            header,
            seconds,
            max_bytes,
            open: Vec::with_capacity(BLOCK + BLOCK / 4),
            open_events: 0,
            open_end_ns: 0,
            blocks: VecDeque::new(),
            deflated_bytes: 0,
            threads: BTreeMap::new(),
            evicted_events: 0,
            evicted_blocks: 0,
            dumps: 0,
        }
    }

    /// Bytes of memory holding events now (compressed blocks plus the open
    /// block's buffer): never above the configured `max_bytes` once a write
    /// has returned.
    pub fn memory_bytes(&self) -> u64 {
        self.deflated_bytes + self.open.capacity() as u64
    }

    pub fn events(&self) -> u64 {
        self.blocks.iter().map(|b| b.events).sum::<u64>() + self.open_events
    }

    fn seal(&mut self) -> io::Result<()> {
        if self.open.is_empty() {
            return Ok(());
        }
        let mut enc =
            DeflateEncoder::new(Vec::with_capacity(self.open.len() / 4), Compression::fast());
        enc.write_all(&self.open)?;
        let mut deflated = enc.finish()?;
        deflated.shrink_to_fit();
        self.deflated_bytes += deflated.capacity() as u64;
        self.blocks.push_back(Block {
            deflated,
            events: self.open_events,
            end_ns: self.open_end_ns,
        });
        self.open.clear();
        if self.open.capacity() > 2 * BLOCK {
            self.open.shrink_to(BLOCK + BLOCK / 4);
        }
        self.open_events = 0;
        self.open_end_ns = 0;
        Ok(())
    }

    fn evict(&mut self, now_ns: u64) {
        let horizon = now_ns.saturating_sub((self.seconds * 1e9) as u64);
        while let Some(b) = self.blocks.front() {
            let over = self.deflated_bytes + self.open.capacity() as u64 > self.max_bytes;
            if !over && b.end_ns >= horizon {
                break;
            }
            let b = self.blocks.pop_front().expect("front exists");
            self.deflated_bytes -= b.deflated.capacity() as u64;
            self.evicted_events += b.events;
            self.evicted_blocks += 1;
        }
        if self.blocks.is_empty() && self.open.capacity() as u64 > self.max_bytes {
            // Only reachable with a bound below one block: keep the bound.
            self.evicted_events += self.open_events;
            self.open = Vec::new();
            self.open_events = 0;
        }
    }

    /// Write the window to `path` (gzip, one member, via a temporary name),
    /// followed by `open_spans` (the collector's spans still open, formatted
    /// as closed now).
    pub fn dump(
        &mut self,
        path: &Path,
        open_spans: &Batch,
        meta: &dyn MetaSource,
    ) -> io::Result<DumpInfo> {
        self.evict(clock::monotonic_ns());
        let tmp = path.with_file_name(format!(
            ".{}.tmp-{}",
            path.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            std::process::id()
        ));
        let r = self.write_dump(&tmp, open_spans, meta);
        match r {
            Ok(mut info) => {
                if let Err(e) = std::fs::rename(&tmp, path) {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
                self.dumps += 1;
                info.path = path.to_path_buf();
                Ok(info)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    fn write_dump(
        &self,
        tmp: &Path,
        open_spans: &Batch,
        meta: &dyn MetaSource,
    ) -> io::Result<DumpInfo> {
        let file = std::fs::File::create(tmp)?;
        let mut gz = GzEncoder::new(io::BufWriter::new(file), Compression::fast());
        let mut buf = Vec::with_capacity(BLOCK);
        write_head(&mut buf, &self.header);
        let mut names = self.threads.clone();
        for c in &open_spans.chunks {
            names.entry(c.tid).or_insert_with(|| c.thread_name.clone());
        }
        for (tid, name) in &names {
            write_thread_name(&mut buf, self.header.pid, *tid, name);
        }
        gz.write_all(&buf)?;
        let mut events = 0;
        let mut raw = Vec::with_capacity(BLOCK * 2);
        for b in &self.blocks {
            raw.clear();
            flate2::read::DeflateDecoder::new(&b.deflated[..]).read_to_end(&mut raw)?;
            gz.write_all(&raw)?;
            events += b.events;
        }
        gz.write_all(&self.open)?;
        events += self.open_events;
        gz.write_all(&open_spans.bytes)?;
        events += open_spans.events();
        let mut other = meta.other_data();
        other.insert(
            "window".into(),
            json!({
                "seconds": self.seconds,
                "max_bytes": self.max_bytes,
                "memory_bytes": self.memory_bytes(),
                "blocks": self.blocks.len(),
                "events": events,
                "evicted_events": self.evicted_events,
                "evicted_blocks": self.evicted_blocks,
                "open_spans": open_spans.events(),
                "oldest_block_end_ns": self.blocks.front().map(|b| b.end_ns),
            }),
        );
        other.insert("final".into(), json!(false));
        buf.clear();
        write_tail(&mut buf, &other);
        gz.write_all(&buf)?;
        let file = gz.finish()?.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let bytes = file.metadata()?.len();
        Ok(DumpInfo {
            path: tmp.to_path_buf(),
            events,
            open_spans: 0,
            bytes,
            first_ns: self
                .blocks
                .front()
                .map(|b| b.end_ns)
                .unwrap_or(self.open_end_ns),
            deleted: None,
        })
    }
}

impl Sink for Window {
    fn describe(&self) -> String {
        format!(
            "the in-memory window ({} s, {} bytes)",
            self.seconds, self.max_bytes
        )
    }

    fn write(&mut self, batch: &Batch, _meta: &dyn MetaSource) -> io::Result<()> {
        for c in &batch.chunks {
            self.threads
                .entry(c.tid)
                .or_insert_with(|| c.thread_name.clone());
            self.open.extend_from_slice(&batch.bytes[c.range.clone()]);
            self.open_events += c.events as u64;
            self.open_end_ns = self.open_end_ns.max(c.end_ns);
            if self.open.len() >= BLOCK {
                self.seal()?;
                self.evict(clock::monotonic_ns());
            }
        }
        self.evict(clock::monotonic_ns());
        Ok(())
    }

    fn flush(&mut self, _meta: &dyn MetaSource, now_ns: u64) -> io::Result<()> {
        self.evict(now_ns);
        Ok(())
    }

    fn close(&mut self, _meta: &dyn MetaSource) -> io::Result<()> {
        Ok(())
    }

    fn as_window(&mut self) -> Option<&mut Window> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::ThreadMeta;
    use serde_json::{Map, Value};

    struct NoMeta;
    impl MetaSource for NoMeta {
        fn other_data(&self) -> Map<String, Value> {
            Map::new()
        }
    }

    fn header() -> Arc<Header> {
        Arc::new(Header {
            base_ns: 1_700_000_000_000_000_000,
            start_mono_ns: 0,
            pid: 7,
            rank: 0,
            process_name: "p".into(),
            static_meta: Map::new(),
            distributed: Map::new(),
        })
    }

    fn batch(from: u64, n: u64, meta: &ThreadMeta, end_ns: u64) -> Batch {
        let mut b = Batch::default();
        for i in from..from + n {
            // Incompressible-ish args so that blocks have real size.
            let noise = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            b.bytes.extend_from_slice(
                format!(
                    ",\n{{\"ph\":\"i\",\"s\":\"t\",\"name\":\"e\",\"pid\":7,\"tid\":1,\"ts\":{i}.000,\"args\":{{\"i\":{i},\"n\":\"{noise:x}{:x}\"}}",
                    noise.rotate_left(17)
                )
                .as_bytes(),
            );
            b.event_done(end_ns, end_ns);
        }
        b.end_chunk(meta);
        b
    }

    #[test]
    fn memory_stays_within_the_bound_and_newest_events_survive() {
        let meta = crate::registry::test_meta(1, "main");
        let bound = 1 << 20;
        let mut w = Window::new(header(), 3600.0, bound);
        let now = clock::monotonic_ns();
        let mut next = 0;
        for _ in 0..400 {
            w.write(&batch(next, 500, &meta, now), &NoMeta).unwrap();
            next += 500;
            assert!(w.memory_bytes() <= bound, "{} > {bound}", w.memory_bytes());
        }
        assert!(w.evicted_events > 0, "the bound never forced an eviction");
        assert_eq!(w.events() + w.evicted_events, next);
        let dir = std::env::temp_dir().join(format!("fastprof-window-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("w.json.gz");
        let info = w.dump(&out, &Batch::default(), &NoMeta).unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&out).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        let evs = doc["traceEvents"].as_array().unwrap();
        let ids: Vec<u64> = evs
            .iter()
            .filter(|e| e["ph"] == "i")
            .map(|e| e["args"]["i"].as_u64().unwrap())
            .collect();
        assert_eq!(ids.len() as u64, info.events);
        // Oldest first, contiguous, ending with the newest event written.
        assert_eq!(*ids.last().unwrap(), next - 1);
        assert!(ids.windows(2).all(|p| p[1] == p[0] + 1));
        assert_eq!(
            doc["otherData"]["window"]["evicted_events"],
            json!(w.evicted_events)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn old_blocks_leave_by_age() {
        let meta = crate::registry::test_meta(1, "main");
        let mut w = Window::new(header(), 1.0, 64 << 20);
        let now = clock::monotonic_ns();
        w.write(&batch(0, 2000, &meta, now - 5_000_000_000), &NoMeta)
            .unwrap();
        w.write(&batch(2000, 10, &meta, now), &NoMeta).unwrap();
        w.flush(&NoMeta, now).unwrap();
        assert!(w.evicted_events >= 1000, "{}", w.evicted_events);
        assert!(w.events() >= 10);
    }
}
