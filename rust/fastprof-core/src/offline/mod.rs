//! The offline half: streaming readers and writers of finished (or still growing) traces, on
//! disk or in a bucket. Nothing here records, owns a thread beyond one call, or touches the
//! in-process [`crate::runtime`] half; it uses only the crate's shared leaves ([`crate::error`],
//! [`crate::json`]).
//!
//! * [`trace`]: reading traces back: the streaming scanner, the salvaging reader,
//!   numpy-ready columns, the one input walker and remote (object-store) inputs.
//! * [`analyze`]: streaming step-time breakdowns for reports.
//! * [`merge`], [`pargz`]: `fastprof merge`, parallel single-member gzip.
//! * [`csvout`]: CSV files from columns (a report's per-step tables).

pub mod analyze;
pub mod csvout;
pub mod merge;
pub mod pargz;
pub mod trace;
