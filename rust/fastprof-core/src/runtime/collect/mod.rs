//! "Collect": the writer thread's half that knows records. It drains every
//! thread's ring, converts ticks to CLOCK_MONOTONIC ns, pairs Begin/End into
//! complete (`X`) events, formats each event's Chrome-trace JSON once, and
//! hands batches of formatted events to the session's sinks
//! ([`crate::runtime::sink`]): the gzip segment files and, when configured, the
//! in-memory window. It also owns what every sink's metadata says (drops,
//! threads, clock anchors and offset, sampler metadata).
//!
//! Spans become events when they end: half as many events as B/E pairs, and
//! whatever a sink keeps stays balanced on its own.
//!
//! * `shared.rs`: [`SessionShared`], what the session handle, the registering threads and the
//!   writer share.
//! * `writer.rs`: the writer thread's loop (`Collector`): build the sinks, drain, flush, stop.
//! * `commands.rs`: requests the writer answers between drains (window dumps, the disk cap).
//! * `events.rs`: per-thread drain state; records to formatted Chrome-trace events.
//! * `meta.rs`: what every sink's `otherData` says; clock anchors; the host name.

mod commands;
mod events;
mod meta;
mod shared;
mod writer;

use crate::error::Result;
use crate::runtime::sink::window::DumpInfo;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc;

pub use shared::SessionShared;
pub(crate) use writer::Collector;

/// Work the writer thread does on request.
pub enum Command {
    /// Write the in-memory window to `path` as a complete trace.
    Dump {
        path: PathBuf,
        reply: mpsc::Sender<Result<DumpInfo>>,
    },
    /// Count `path`, a file written for the session elsewhere (`kind`: a
    /// torch window), under the disk cap; the reply says why when the cap
    /// deleted it at once.
    CountFile {
        path: PathBuf,
        kind: String,
        /// Bytes held for it while it was written, released as it is counted.
        release: u64,
        reply: mpsc::Sender<Option<String>>,
    },
    /// Hold `bytes` more under the disk cap for a file being written on
    /// another thread (see [`crate::runtime::sink::held`]); the reply: granted.
    Hold {
        bytes: u64,
        reply: mpsc::Sender<bool>,
    },
    /// Give back bytes held for a file that was not written.
    Release { bytes: u64 },
}

/// The name of the counter that `Session::mark_step` records.
pub const STEP_COUNTER: &str = crate::contract::STEP_COUNTER;

/// What the writer says when the session stops.
#[derive(Debug, Clone, Default)]
pub struct StopReport {
    pub events_written: u64,
    pub dropped: u64,
    pub dropped_per_thread: BTreeMap<u64, u64>,
    pub segments: Vec<PathBuf>,
    pub unclosed_spans: u64,
    pub bytes_compressed: u64,
    /// The failure that stopped recording early (or lost a sink), if any.
    pub error: Option<String>,
    /// Why the sampler thread stopped early, if it failed.
    pub sampler_error: Option<String>,
    /// Of `dropped`: events whose args/name found the payload budget spent.
    pub payload_dropped: u64,
    /// Warnings for the user gathered during the session.
    pub notices: Vec<String>,
    /// What the disk cap deleted (the last segment's `otherData.rotated`):
    /// None when nothing was.
    pub rotated: Option<Value>,
}
