//! The core's one error type. Every fallible core function returns
//! [`Result<T>`]; the binding crate maps each variant to one Python exception
//! class (see `rust/fastprof-py/src/errors.rs`).

use std::path::PathBuf;

/// Everything that can go wrong in the core.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A configuration value is out of range or inconsistent.
    #[error("invalid option {option}: {reason}")]
    Config {
        option: &'static str,
        reason: String,
    },

    /// `start` while a recorder is already running in this process.
    #[error("a fastprof recorder is already running in this process (started at {run_dir}); call fastprof.stop() first")]
    AlreadyRunning { run_dir: PathBuf },

    /// An operation that needs a running recorder found none.
    #[error("no fastprof recorder is running")]
    NotRunning,

    /// An I/O failure on a named file.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A merge found nothing to write: no trace files, or no event left
    /// after skipping and filtering. Says which inputs and why.
    #[error("nothing to merge: {reason}")]
    NoEvents { reason: String },

    /// The caller asked a long operation (a merge) to stop; nothing was written.
    #[error("interrupted")]
    Cancelled,

    /// A trace file that cannot be read: names the file and the byte offset
    /// (in the decompressed JSON text) where reading failed.
    #[error("{path}: {reason} at byte {offset}")]
    Trace {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
}

impl CoreError {
    /// Wrap an `io::Error` with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CoreError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(option: &'static str, reason: impl Into<String>) -> Self {
        CoreError::Config {
            option,
            reason: reason.into(),
        }
    }
}

/// Result alias used throughout the core.
pub type Result<T> = std::result::Result<T, CoreError>;
