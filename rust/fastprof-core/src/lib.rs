//! fastprof-core: the pure-Rust half of fastprof (no pyo3).
//!
//! * [`ring`]: lock-free single-producer rings of fixed-size [`record::Record`]s, one per thread.
//! * [`recorder`]: the process-wide recorder: thread registration, the hot-path calls
//!   (`begin`/`end`/`instant`/`counter`), start and stop.
//! * [`writer`]: the writer thread that drains rings into gzip Chrome-trace segments.
//! * [`reader`]: reads traces back, salvaging truncated ones.
//! * [`sampler`]: the always-on host / process / NVML sampler thread.
//! * [`scan`], [`merge`], [`pargz`]: the streaming scanner, `fastprof merge`, parallel single-member gzip.
//! * [`clock`]: CLOCK_MONOTONIC / CLOCK_REALTIME and anchor pairs.

pub mod clock;
pub mod config;
pub mod error;
pub mod json;
pub mod merge;
pub mod names;
pub mod pargz;
pub mod reader;
pub mod record;
pub mod recorder;
pub mod ring;
pub mod sampler;
pub mod scan;
#[cfg(test)]
mod test_support;
pub mod writer;

pub use error::{CoreError, Result};

/// The version written into every trace's metadata.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
