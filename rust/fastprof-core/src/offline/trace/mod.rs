//! Reading traces back: one streaming scanner and what is built on it.
//!
//! * [`scan`]: the byte-level walk over a Chrome trace of any size (plain or
//!   gzip, object or array format) in constant memory, yielding each event's
//!   raw bytes; [`scan::Fields`] locates the few keys a consumer needs.
//! * [`reader`]: the whole document as a `serde_json::Value`, salvaging
//!   truncated files (what `fastprof.read_trace` returns).
//! * `filemeta`: a file's kind, rank, time base and clock offset, as
//!   columns and the analysis both read them.
//! * [`inputs`]: the one walker that decides what in a run directory is a
//!   trace (merge, columns and the analysis all take their files from it):
//!   hidden and temporary files never are, fastprof's own non-trace JSON
//!   (`profiler.json`, `report.json`, memory timelines) is skipped and named.
//! * [`remote`]: inputs named by URL (`s3://...`), listed and streamed
//!   through the storage backend the Python package registers.
//! * [`columns`]: spans, instants and counters as numpy-ready columns, with
//!   filters, epoch-ns timestamps, ranks and steps, in memory proportional
//!   to the rows kept.
//! * [`step_args`]: the `step` spans' args the columns leave out (each
//!   step's epoch), for `fastprof export`'s step table.
//!
//! Everything that reads a trace goes through [`scan::Scanner`], so a
//! malformed event is dropped and the walk resynchronises on the next one in
//! the same way everywhere (the merger included). Nothing here imports the
//! recorder, the writer or the sampler. `merge` builds on the scanner and
//! takes its files from [`inputs`], as `columns` and `analyze` do, so that all
//! see the same files.

pub mod columns;
pub(crate) mod filemeta;
pub mod inputs;
pub mod reader;
pub mod remote;
pub mod scan;
pub mod step_args;
