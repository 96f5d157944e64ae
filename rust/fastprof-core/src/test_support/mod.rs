//! Helpers shared by the crate's unit tests.

mod trickle;

pub use trickle::Trickle;

use crate::{CoreError, Result};
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `text` as one gzip member.
pub fn gzip(text: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(text).unwrap();
    enc.finish().unwrap()
}

/// `(offset, reason)` of a `CoreError::Trace` about `t.json`, failing on anything else.
pub fn trace_error<T: std::fmt::Debug>(result: Result<T>) -> (u64, String) {
    match result {
        Err(CoreError::Trace {
            path,
            offset,
            reason,
        }) => {
            assert_eq!(path, Path::new("t.json"));
            (offset, reason)
        }
        other => panic!("expected a Trace error, got {other:?}"),
    }
}

/// A fresh directory under the system's temporary directory for one test,
/// removed when the test ends, passed or not (a panic unwinds through `Drop`).
pub struct Scratch(PathBuf);

impl Scratch {
    /// `fastprof-{tag}-{pid}-{n}`: unique per process and call, emptied first.
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("fastprof-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl std::ops::Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
