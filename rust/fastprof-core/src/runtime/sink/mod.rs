//! Where collected events go. [`crate::runtime::collect`] formats each event's
//! Chrome-trace JSON once and hands [`Batch`]es to every sink of the session
//! through one trait: events in, flush, close with metadata.
//!
//! * [`chrome_gz`]: gzip segment files on disk (`fastprof.{N}.json.gz`).
//! * [`rotation`]: the segment sink's disk cap (`max_disk`, `keep_segments`).
//! * [`held`]: a file written beside the sinks within disk held under the cap.
//! * [`window`]: the last T seconds (at most M bytes) in memory, compressed,
//!   overwrite-oldest, dumped on request as a complete trace.
//!
//! Both write the same document shape (see [`write_head`] / [`write_tail`]),
//! so anything that reads one reads the other.

pub mod chrome_gz;
pub mod held;
pub mod rotation;
pub mod window;

use crate::json;
use crate::runtime::registry::ThreadMeta;
use serde_json::{Map, Value};
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What every output of a session starts with.
pub struct Header {
    /// Epoch ns of the start anchor: the trace's `baseTimeNanoseconds`.
    pub base_ns: u64,
    /// CLOCK_MONOTONIC ns of the same instant: event `ts` are relative to it.
    pub start_mono_ns: u64,
    pub pid: u32,
    pub rank: u32,
    pub process_name: String,
    /// The `fastprof_info` metadata event's args (and the base of `otherData`).
    pub static_meta: Map<String, Value>,
    /// The top-level `distributedInfo` (rank, world size, backend if known),
    /// written as Kineto writes it so that HTA finds the rank.
    pub distributed: Map<String, Value>,
}

/// The metadata a sink writes when it closes a file (`otherData`).
pub trait MetaSource {
    fn other_data(&self) -> Map<String, Value>;
}

/// Events of one thread, contiguous in [`Batch::bytes`].
pub struct Chunk {
    pub tid: u64,
    pub thread_name: Arc<str>,
    pub range: Range<usize>,
    pub events: u32,
    /// CLOCK_MONOTONIC ns at which the oldest event of the chunk begins.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC ns at which the newest event of the chunk ends.
    pub end_ns: u64,
}

/// Formatted events: each is `,\n{...}` (separator first), grouped by thread.
#[derive(Default)]
pub struct Batch {
    pub bytes: Vec<u8>,
    pub chunks: Vec<Chunk>,
    open_from: usize,
    open_events: u32,
    open_start_ns: u64,
    open_end_ns: u64,
}

impl Batch {
    /// Close the event being formatted (its `}`) and count it; it spans
    /// `start_ns..end_ns` (CLOCK_MONOTONIC).
    pub(crate) fn event_done(&mut self, start_ns: u64, end_ns: u64) {
        self.bytes.push(b'}');
        if self.open_events == 0 {
            self.open_start_ns = start_ns;
        }
        self.open_events += 1;
        self.open_start_ns = self.open_start_ns.min(start_ns);
        self.open_end_ns = self.open_end_ns.max(end_ns);
    }

    /// Close the events formatted since the last call as one thread's chunk.
    pub(crate) fn end_chunk(&mut self, meta: &ThreadMeta) {
        if self.open_events > 0 {
            self.chunks.push(Chunk {
                tid: meta.tid,
                thread_name: meta.name.clone(),
                range: self.open_from..self.bytes.len(),
                events: self.open_events,
                start_ns: self.open_start_ns,
                end_ns: self.open_end_ns,
            });
        }
        self.open_from = self.bytes.len();
        self.open_events = 0;
        self.open_start_ns = 0;
        self.open_end_ns = 0;
    }

    pub fn events(&self) -> u64 {
        self.chunks.iter().map(|c| c.events as u64).sum()
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.chunks.clear();
        self.open_from = 0;
        self.open_events = 0;
        self.open_start_ns = 0;
        self.open_end_ns = 0;
    }
}

/// Formatted bytes collected before a batch goes to the sinks (at most;
/// smaller with small segments, see [`batch_limit`]).
pub(crate) const CHUNK: usize = 256 * 1024;

/// Formatted bytes per batch for a segment size: a quarter of it (16 KiB to
/// [`CHUNK`]), so a segment overshoots its size by little more than one
/// compressed batch.
pub(crate) fn batch_limit(segment_size: u64) -> usize {
    (segment_size / 4).clamp(16 * 1024, CHUNK as u64) as usize
}

/// One output of a session.
pub trait Sink: Send {
    /// Where this sink writes, for messages.
    fn describe(&self) -> String;
    /// Take a batch of events (a sink may rotate files here).
    fn write(&mut self, batch: &Batch, meta: &dyn MetaSource) -> io::Result<()>;
    /// Every flush interval: make what was written durable (and rotate by age
    /// or size); `now_ns` is CLOCK_MONOTONIC.
    fn flush(&mut self, meta: &dyn MetaSource, now_ns: u64) -> io::Result<()>;
    /// The session ends: finish with the metadata.
    fn close(&mut self, meta: &dyn MetaSource) -> io::Result<()>;
    /// Files finished and compressed bytes written, taken once at the end.
    fn outputs(&mut self) -> (Vec<PathBuf>, u64) {
        (Vec::new(), 0)
    }
    /// What the disk cap deleted (`otherData.rotated`), if anything.
    fn rotated(&self) -> Option<serde_json::Value> {
        None
    }
    /// Count `path`, a file written for this session outside the sinks (a
    /// flight dump, a torch window: `kind`), under the disk cap, which may
    /// delete older files for it. Returns why when the cap deleted this
    /// one at once (it cannot fit).
    fn adopt_file(&mut self, _path: &Path, _kind: &str) -> Option<String> {
        None
    }
    /// The bytes a file written for this session next may take under the
    /// disk cap (`max_disk`): what the cap leaves beside the open segment
    /// and what its next write may add, older files deleted for it. None
    /// without a byte cap. Short of `want`, the sink may first flush what
    /// its encoder holds (counted at its bound until then).
    fn room_for_file(&mut self, _want: u64) -> Option<u64> {
        None
    }
    /// A file of at most `bytes` is about to be written for this session:
    /// delete the oldest files now, as [`Sink::adopt_file`] would once it
    /// is there, so that the disk stays under the cap while it is written.
    fn make_room(&mut self, _bytes: u64) {}
    /// Hold `bytes` more for a file being written for this session on
    /// another thread (see [`held`]): room made as by [`Sink::make_room`]
    /// and kept out of what later writes may take, until released. False
    /// when the cap cannot leave that much beside the open segment.
    fn hold(&mut self, _bytes: u64) -> bool {
        true
    }
    /// Give back `bytes` held (the file was counted, or abandoned).
    fn release(&mut self, _bytes: u64) {}
    /// The window sink, for dumps.
    fn as_window(&mut self) -> Option<&mut window::Window> {
        None
    }
}

/// `{"baseTimeNanoseconds":B,"distributedInfo": {...},"displayTimeUnit":"ms","traceEvents":[`
/// then the static metadata first (so that a salvaged prefix still says what
/// it is): `fastprof_info`, the process name and sort index.
/// `distributedInfo` is in the first line: HTA reads a file's lines until
/// one matches `"rank":\s+N`.
pub(crate) fn write_head(out: &mut Vec<u8>, h: &Header) {
    out.extend_from_slice(b"{\"baseTimeNanoseconds\":");
    json::write_int(out, h.base_ns);
    if !h.distributed.is_empty() {
        out.extend_from_slice(b",\"distributedInfo\": ");
        json::write_spaced_object(out, &h.distributed);
    }
    out.extend_from_slice(b",\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    out.extend_from_slice(b"{\"ph\":\"M\",\"name\":\"fastprof_info\",\"pid\":");
    json::write_int(out, h.pid);
    out.extend_from_slice(b",\"tid\":0,\"args\":");
    let info = serde_json::to_vec(&h.static_meta).unwrap_or_else(|_| b"{}".to_vec());
    out.extend_from_slice(&info);
    out.push(b'}');
    out.extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":");
    json::write_int(out, h.pid);
    out.extend_from_slice(b",\"tid\":0,\"args\":{\"name\":");
    json::write_str(out, &h.process_name);
    out.extend_from_slice(b"}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":");
    json::write_int(out, h.pid);
    out.extend_from_slice(b",\"tid\":0,\"args\":{\"sort_index\":");
    json::write_int(out, h.rank);
    out.extend_from_slice(b"}}");
}

/// `,\n{"ph":"M","name":"thread_name",...}`.
pub(crate) fn write_thread_name(out: &mut Vec<u8>, pid: u32, tid: u64, name: &str) {
    out.extend_from_slice(b",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":");
    json::write_int(out, pid);
    out.extend_from_slice(b",\"tid\":");
    json::write_int(out, tid);
    out.extend_from_slice(b",\"args\":{\"name\":");
    json::write_str(out, name);
    out.extend_from_slice(b"}}");
}

/// `\n],"otherData":{...}}\n`.
pub(crate) fn write_tail(out: &mut Vec<u8>, other: &Map<String, Value>) {
    out.extend_from_slice(b"\n],\"otherData\":");
    out.extend_from_slice(&serde_json::to_vec(other).unwrap_or_else(|_| b"{}".to_vec()));
    out.extend_from_slice(b"}\n");
}
