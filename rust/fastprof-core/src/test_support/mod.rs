//! Helpers shared by the crate's unit tests.

mod trickle;

pub use trickle::Trickle;

use crate::{CoreError, Result};
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::Write;
use std::path::Path;

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
