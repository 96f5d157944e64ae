//! Reading traces back: one streaming scanner and what is built on it.
//!
//! * [`scan`]: the byte-level walk over a Chrome trace of any size (plain or
//!   gzip, object or array format) in constant memory, yielding each event's
//!   raw bytes; [`scan::Fields`] locates the few keys a consumer needs.
//! * [`reader`]: the whole document as a `serde_json::Value`, salvaging
//!   truncated files (what `fastprof.read_trace` returns).
//!
//! Nothing here imports the recorder, the writer or the sampler; `merge`
//! builds on this module, never the other way round.

pub mod reader;
pub mod scan;
