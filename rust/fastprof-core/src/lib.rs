//! fastprof-core: the pure-Rust half of fastprof (no pyo3), in two halves split along the
//! runtime boundary, and the leaves both use.
//!
//! * [`runtime`]: the in-process, thread-owning half that records a running job: rings,
//!   the registry and its hot-path calls, the session with its writer thread, sinks and
//!   sampler, the clock and the step machine.
//! * [`offline`]: the streaming half that reads what was written, in this process or another:
//!   the trace scanner, reader and columns, the step analysis, `fastprof merge`, parallel gzip
//!   and CSV. It never uses [`runtime`] (tests/unit/test_core_module_cycles.py checks), so
//!   reading a run never starts or reaches a recording.
//! * [`error`], [`json`]: the one error enum and allocation-free JSON formatting, used by both.
//! * [`contract`]: the names a recording writes and its readers read (spans, counters, files)
//!   and the URL rule, used by both and exported to the Python package by the binding.

pub mod contract;
pub mod error;
pub mod json;
pub mod offline;
pub mod runtime;
#[cfg(test)]
mod test_support;

pub use error::{CoreError, Result};

/// The version written into every trace's metadata.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
