//! fastprof-core: the pure-Rust half of fastprof (no pyo3).
//!
//! * [`ring`]: lock-free single-producer rings of fixed-size [`record::Record`]s, one per thread,
//!   split into an owned producer and consumer half.
//! * [`registry`]: per-thread ring registration and the hot-path calls
//!   (`begin`/`end`/`instant`/`counter`) into the one recording session.
//! * [`session`]: one recording (start/stop, pause/resume, clock offset, steps, window dump);
//!   owns its writer thread, sinks and sampler.
//! * [`collect`]: the writer thread: drain rings, convert ticks, pair Begin/End, format events.
//! * [`sink`]: where events go: gzip segment files, the in-memory window.
//! * [`trace`]: reading traces back: the streaming scanner, the salvaging
//!   reader and numpy-ready columns ([`reader`] and [`scan`] are re-exported
//!   at the crate root under their old paths).
//! * [`sampler`]: the always-on host / process / NVML sampler thread.
//! * [`steps`]: the training loop's step machine (where steps begin and end) and the slow-step detector.
//! * [`analyze`]: streaming step-time breakdowns for reports.
//! * [`merge`], [`pargz`]: `fastprof merge`, parallel single-member gzip.
//! * [`clock`]: CLOCK_MONOTONIC / CLOCK_REALTIME and anchor pairs.
//! * [`csvout`]: CSV files from columns (a report's per-step tables).

pub mod analyze;
pub mod clock;
pub mod collect;
pub mod config;
pub mod csvout;
pub mod error;
pub mod json;
mod leaked;
pub mod merge;
pub mod names;
pub mod pargz;
pub mod record;
pub mod registry;
pub mod ring;
pub mod sampler;
pub mod session;
pub mod sink;
pub mod steps;
#[cfg(test)]
mod test_support;
pub mod trace;

pub use error::{CoreError, Result};
pub use trace::{reader, scan};

/// The version written into every trace's metadata.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
