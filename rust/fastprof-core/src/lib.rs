//! fastprof-core: the pure-Rust half of fastprof (no pyo3).
//!
//! * [`ring`]: lock-free single-producer rings of fixed-size [`record::Record`]s, one per thread.
//! * [`recorder`]: the process-wide recorder: thread registration, the hot-path calls
//!   (`begin`/`end`/`instant`/`counter`), start and stop.
//! * [`writer`]: the writer thread that drains rings into gzip Chrome-trace segments.
//! * [`trace`]: reading traces back: the streaming scanner, the salvaging
//!   reader and numpy-ready columns ([`reader`] and [`scan`] are re-exported
//!   at the crate root under their old paths).
//! * [`sampler`]: the always-on host / process / NVML sampler thread.
//! * [`merge`], [`pargz`]: `fastprof merge`, parallel single-member gzip.
//! * [`clock`]: CLOCK_MONOTONIC / CLOCK_REALTIME and anchor pairs.

pub mod clock;
pub mod config;
pub mod error;
pub mod json;
pub mod merge;
pub mod names;
pub mod pargz;
pub mod record;
pub mod recorder;
pub mod ring;
pub mod sampler;
#[cfg(test)]
mod test_support;
pub mod trace;
pub mod writer;

pub use error::{CoreError, Result};
pub use trace::{reader, scan};

/// The version written into every trace's metadata.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
