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
use crate::runtime::clock;
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
    /// Events of the window left out of the file (the oldest) so that it
    /// fits in what the disk cap leaves.
    pub left_out: u64,
    /// Set when nothing was written (not even the newest events fit under
    /// the disk cap): why.
    pub skipped: Option<String>,
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

    /// Plan a dump within `room` bytes (what the disk cap leaves for a new
    /// file beside the open segment; None without a cap): the newest events
    /// that fit, a contiguous suffix of the window (the open block, then the
    /// sealed blocks newest first), and the size the file is then bounded
    /// by ([`DumpPlan::limit`]), which the cap makes room for before a byte
    /// is written. Err says why nothing of the window fits (then no file is
    /// written at all).
    pub fn plan_dump(
        &mut self,
        open_spans: &Batch,
        meta: &dyn MetaSource,
        room: Option<u64>,
    ) -> Result<DumpPlan, String> {
        self.evict(clock::monotonic_ns());
        let all_events = self.events();
        let mut plan = DumpPlan {
            skip: 0,
            with_open: true,
            head: self.head(open_spans),
            other: meta.other_data(),
            events: all_events + open_spans.events(),
            left_out: 0,
            limit: None,
        };
        let Some(room) = room else {
            return Ok(plan);
        };
        // Head, spans and tail are small: zlib's bound. The tail is sized for
        // the whole window (its numbers only shrink with fewer events).
        let tail = self.tail(&plan, open_spans);
        let fixed = GZIP_FRAME
            + deflate_bound(plan.head.len() as u64)
            + deflate_bound(open_spans.bytes.len() as u64)
            + deflate_bound(tail.len() as u64 + 64);
        let too_small = |what: &str| {
            format!(
                "not written: the disk cap (max_disk) leaves {room} bytes beside the open                  segment, too few for {what}"
            )
        };
        if fixed > room {
            return Err(too_small("the dump's head and tail"));
        }
        let mut left = room - fixed;
        // A block is written again through one gzip stream at the level it
        // was deflated with: about its deflated size (a margin for where the
        // stream's own block boundaries fall; the file's limit still holds).
        let cost = |deflated: u64| deflated + deflated / 32 + 64;
        let mut kept = 0u64;
        if !self.open.is_empty() {
            let c = cost(deflated_len(&self.open)?);
            if c > left {
                plan.with_open = false;
            } else {
                left -= c;
                kept += self.open_events;
            }
        }
        let mut keep = 0;
        if plan.with_open {
            for b in self.blocks.iter().rev() {
                let c = cost(b.deflated.len() as u64);
                if c > left {
                    break;
                }
                left -= c;
                kept += b.events;
                keep += 1;
            }
        }
        plan.skip = self.blocks.len() - keep;
        plan.left_out = all_events - kept;
        plan.events = kept + open_spans.events();
        if kept == 0 && all_events > 0 {
            return Err(too_small("the newest of the window's events"));
        }
        plan.limit = Some(room - left);
        Ok(plan)
    }

    /// Write the planned dump to `path` (gzip, one member, via a temporary
    /// name that is never larger than the plan's limit), followed by
    /// `open_spans` (the collector's spans still open, formatted as closed
    /// now). A stream that would pass the limit is abandoned (its temporary
    /// file removed): [`is_over_limit`] tells that error.
    pub fn dump(
        &mut self,
        path: &Path,
        open_spans: &Batch,
        plan: &DumpPlan,
    ) -> io::Result<DumpInfo> {
        let tmp = path.with_file_name(format!(
            ".{}.tmp-{}",
            path.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            std::process::id()
        ));
        let r = self.write_dump(&tmp, open_spans, plan);
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

    fn head(&self, open_spans: &Batch) -> Vec<u8> {
        let mut buf = Vec::with_capacity(4096);
        write_head(&mut buf, &self.header);
        let mut names = self.threads.clone();
        for c in &open_spans.chunks {
            names.entry(c.tid).or_insert_with(|| c.thread_name.clone());
        }
        for (tid, name) in &names {
            write_thread_name(&mut buf, self.header.pid, *tid, name);
        }
        buf
    }

    fn tail(&self, plan: &DumpPlan, open_spans: &Batch) -> Vec<u8> {
        let mut other = plan.other.clone();
        let mut window = json!({
            "seconds": self.seconds,
            "max_bytes": self.max_bytes,
            "memory_bytes": self.memory_bytes(),
            "blocks": self.blocks.len() - plan.skip,
            "events": plan.events,
            "evicted_events": self.evicted_events,
            "evicted_blocks": self.evicted_blocks,
            "open_spans": open_spans.events(),
            "oldest_block_end_ns": self.blocks.get(plan.skip).map(|b| b.end_ns),
        });
        if plan.left_out > 0 {
            // The disk cap left the oldest of the window out of this file.
            window["left_out_for_disk"] = json!({
                "events": plan.left_out,
                "blocks": plan.skip + usize::from(!plan.with_open),
                "limit_bytes": plan.limit,
            });
        }
        other.insert("window".into(), window);
        other.insert("final".into(), json!(false));
        let mut buf = Vec::with_capacity(4096);
        write_tail(&mut buf, &other);
        buf
    }

    fn write_dump(&self, tmp: &Path, open_spans: &Batch, plan: &DumpPlan) -> io::Result<DumpInfo> {
        let file = Limited {
            file: std::fs::File::create(tmp)?,
            left: plan.limit.unwrap_or(u64::MAX),
        };
        let mut gz = GzEncoder::new(io::BufWriter::new(file), Compression::fast());
        gz.write_all(&plan.head)?;
        let mut events = 0;
        if plan.with_open {
            let mut raw = Vec::with_capacity(BLOCK * 2);
            for b in self.blocks.iter().skip(plan.skip) {
                raw.clear();
                flate2::read::DeflateDecoder::new(&b.deflated[..]).read_to_end(&mut raw)?;
                gz.write_all(&raw)?;
                events += b.events;
            }
            gz.write_all(&self.open)?;
            events += self.open_events;
        }
        gz.write_all(&open_spans.bytes)?;
        events += open_spans.events();
        debug_assert_eq!(events, plan.events);
        gz.write_all(&self.tail(plan, open_spans))?;
        let file = gz.finish()?.into_inner().map_err(|e| e.into_error())?.file;
        file.sync_all()?;
        let bytes = file.metadata()?.len();
        Ok(DumpInfo {
            path: tmp.to_path_buf(),
            events,
            open_spans: 0,
            bytes,
            first_ns: if plan.with_open {
                self.blocks
                    .get(plan.skip)
                    .map(|b| b.end_ns)
                    .unwrap_or(self.open_end_ns)
            } else {
                0
            },
            deleted: None,
            left_out: plan.left_out,
            skipped: None,
        })
    }
}

/// A dump planned by [`Window::plan_dump`].
pub struct DumpPlan {
    /// Sealed blocks left out, oldest first.
    skip: usize,
    /// Whether the open block (the newest events) is written; without it no
    /// sealed block is either.
    with_open: bool,
    head: Vec<u8>,
    /// `otherData` as it was when planned.
    other: serde_json::Map<String, serde_json::Value>,
    /// Events the file holds (the open spans included).
    events: u64,
    /// The window's events left out for the disk cap.
    left_out: u64,
    /// The most bytes the file may take (None: no cap).
    pub limit: Option<u64>,
}

impl DumpPlan {
    /// The same dump within a smaller room: what to plan next when the
    /// stream passed this plan's limit.
    pub fn tighter(&self) -> Option<u64> {
        self.limit.map(|l| l - l / 8)
    }
}

/// A gzip member's header and trailer.
const GZIP_FRAME: u64 = 18;

/// zlib's `deflateBound` for `raw` bytes (stored blocks' headers, the
/// stream's own), as the segment sink's reserve takes it.
fn deflate_bound(raw: u64) -> u64 {
    raw + (raw >> 12) + (raw >> 14) + (raw >> 25) + 64
}

fn deflated_len(raw: &[u8]) -> Result<u64, String> {
    let mut enc = DeflateEncoder::new(Vec::with_capacity(raw.len() / 4), Compression::fast());
    enc.write_all(raw)
        .and_then(|_| enc.finish())
        .map(|v| v.len() as u64)
        .map_err(|e| format!("not written: {e}"))
}

/// The file under a dump: refuses to grow past `left` bytes, so a dump
/// never takes more disk than the cap made room for.
struct Limited {
    file: std::fs::File,
    left: u64,
}

/// The error a [`Limited`] file gives at its limit.
#[derive(Debug)]
struct OverLimit;

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the dump would pass the room the disk cap made for it")
    }
}

impl std::error::Error for OverLimit {}

/// Whether `e` is a dump stopped at its limit (see [`Window::dump`]).
pub fn is_over_limit(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<OverLimit>())
}

impl Write for Limited {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(io::Error::other(OverLimit));
        }
        let n = self.file.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
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
    use crate::runtime::registry::ThreadMeta;
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
        let meta = crate::runtime::registry::test_meta(1, "main");
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
        let plan = w.plan_dump(&Batch::default(), &NoMeta, None).unwrap();
        assert_eq!(plan.limit, None);
        let info = w.dump(&out, &Batch::default(), &plan).unwrap();
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
        let meta = crate::runtime::registry::test_meta(1, "main");
        let mut w = Window::new(header(), 1.0, 64 << 20);
        let now = clock::monotonic_ns();
        w.write(&batch(0, 2000, &meta, now - 5_000_000_000), &NoMeta)
            .unwrap();
        w.write(&batch(2000, 10, &meta, now), &NoMeta).unwrap();
        w.flush(&NoMeta, now).unwrap();
        assert!(w.evicted_events >= 1000, "{}", w.evicted_events);
        assert!(w.events() >= 10);
    }

    fn ids_in(path: &Path) -> (Vec<u64>, Value) {
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        let ids = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "i")
            .map(|e| e["args"]["i"].as_u64().unwrap())
            .collect();
        (ids, doc)
    }

    #[test]
    fn a_dump_under_a_room_keeps_the_newest_events_and_never_passes_its_limit() {
        let meta = crate::runtime::registry::test_meta(1, "main");
        let mut w = Window::new(header(), 3600.0, 64 << 20);
        let now = clock::monotonic_ns();
        let mut next = 0;
        for _ in 0..200 {
            w.write(&batch(next, 500, &meta, now), &NoMeta).unwrap();
            next += 500;
        }
        assert!(
            w.deflated_bytes > 1 << 20,
            "the window holds more than the room"
        );
        let dir = std::env::temp_dir().join(format!("fastprof-window-room-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("w.json.gz");
        let room = 256 << 10;
        let plan = w.plan_dump(&Batch::default(), &NoMeta, Some(room)).unwrap();
        let limit = plan.limit.unwrap();
        assert!(limit <= room);
        let info = w.dump(&out, &Batch::default(), &plan).unwrap();
        assert!(info.bytes <= limit, "{} > {limit}", info.bytes);
        assert_eq!(std::fs::metadata(&out).unwrap().len(), info.bytes);
        // Well used: the newest events fill most of the room.
        assert!(info.bytes > room / 2, "{} of {room}", info.bytes);
        let (ids, doc) = ids_in(&out);
        assert_eq!(ids.len() as u64, info.events);
        assert_eq!(*ids.last().unwrap(), next - 1);
        assert!(ids.windows(2).all(|p| p[1] == p[0] + 1));
        assert_eq!(info.left_out + info.events, next);
        assert_eq!(
            doc["otherData"]["window"]["left_out_for_disk"]["events"],
            json!(info.left_out)
        );
        // A room too small for any event: nothing is planned, nothing written.
        let why = w
            .plan_dump(&Batch::default(), &NoMeta, Some(2000))
            .err()
            .unwrap();
        assert!(why.contains("2000 bytes"), "{why}");
        // A stream that passes its limit stops there and leaves no file.
        let mut tight = w.plan_dump(&Batch::default(), &NoMeta, Some(room)).unwrap();
        tight.limit = Some(limit / 2);
        let out2 = dir.join("w2.json.gz");
        let e = w.dump(&out2, &Batch::default(), &tight).err().unwrap();
        assert!(is_over_limit(&e), "{e}");
        assert!(!out2.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
