//! Recorder configuration and its validation. Defaults suit always-on use in
//! long jobs; every field can be overridden from Python (and from
//! `FASTPROF_*` environment variables, resolved in the Python layer).

use crate::error::{CoreError, Result};
use crate::runtime::sampler::SamplerConfig;
use std::path::PathBuf;

/// Everything a recorder needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory for this rank's segments (`<out>/<run>/rank{R}`); created if missing.
    pub trace_dir: PathBuf,
    /// Run name, written into the metadata.
    pub run_name: String,
    /// This process's rank and the world size, written into the metadata.
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    /// Events per thread ring (rounded up to a power of two). Larger rings
    /// survive longer bursts without drops but reserve 24 bytes per slot per
    /// recording thread (pages are committed as they are first used).
    pub buffer_size: usize,
    /// Bytes that the session's rings may hold together beyond their
    /// `buffer_size` (0 = never grow): a full ring grows into it instead of
    /// dropping (see `ring`), and gives it back once the writer caught up.
    pub buffer_growth: u64,
    /// Seconds between writer flushes. A killed process loses at most this
    /// much; shorter intervals cost more syscalls and slightly worse gzip.
    pub flush_interval_s: f64,
    /// Compressed bytes after which the segment is closed and a new one begun.
    /// Smaller segments bound what one corrupt file can take with it; each
    /// segment repeats the metadata.
    pub segment_size: u64,
    /// Seconds after which a segment is closed regardless of size (0 = never).
    pub segment_seconds: f64,
    /// Most bytes this session's segment files may take on disk together (0
    /// = unbounded). Over it, the oldest closed segments are deleted (never
    /// the open one): a long job keeps its newest data in bounded disk and
    /// loses its oldest. At least two segments' worth: one open, one closed.
    pub max_disk: u64,
    /// Most closed segments kept besides the open one (0 = all); the oldest
    /// are deleted first, as for `max_disk`.
    pub keep_segments: u32,
    /// gzip level (1 = fastest, 9 = smallest). The writer runs on its own
    /// thread, so this trades that thread's CPU against disk.
    pub compression_level: u32,
    /// Extra JSON object merged into `otherData.config` (what the Python layer knows).
    pub extra_config_json: String,
    /// The always-on sampler; `None` turns it off.
    pub sampler: Option<SamplerConfig>,
    /// Seconds of events the in-memory window keeps for a flight-recorder
    /// dump (0 = no window). Costs the writer thread one more copy and a
    /// deflate of every event, and `window_bytes` of memory.
    pub window_seconds: f64,
    /// Most bytes the window may hold (compressed blocks plus one open
    /// block); older events are evicted first.
    pub window_bytes: u64,
}

/// Smallest segment size we accept: below it the per-segment metadata dominates.
pub const MIN_SEGMENT_SIZE: u64 = 64 * 1024;
/// Upper bound for a ring: 2^26 slots is 1.5 GiB per thread, surely a typo beyond.
pub const MAX_BUFFER_SIZE: usize = 1 << 26;
/// Window bounds: below 1 MiB a window holds a few blocks at most.
pub const MIN_WINDOW_BYTES: u64 = 1 << 20;
pub const MAX_WINDOW_BYTES: u64 = 16 << 30;

impl Default for Config {
    fn default() -> Self {
        Config {
            trace_dir: PathBuf::from("fastprof_runs/run/rank0"),
            run_name: "run".into(),
            rank: 0,
            world_size: 1,
            local_rank: 0,
            buffer_size: 1 << 20,
            buffer_growth: crate::runtime::ring::DEFAULT_GROWTH_BYTES,
            flush_interval_s: 1.0,
            segment_size: 256 << 20,
            segment_seconds: 0.0,
            max_disk: 0,
            keep_segments: 0,
            compression_level: 1,
            extra_config_json: "{}".into(),
            sampler: None,
            window_seconds: 0.0,
            window_bytes: 64 << 20,
        }
    }
}

impl Config {
    /// Check every field; the first bad one is reported by name.
    pub fn validate(&self) -> Result<()> {
        if self.buffer_size < 16 || self.buffer_size > MAX_BUFFER_SIZE {
            return Err(CoreError::config(
                "buffer_size",
                format!(
                    "must be between 16 and {MAX_BUFFER_SIZE} events per thread, got {}",
                    self.buffer_size
                ),
            ));
        }
        if !(self.flush_interval_s.is_finite()
            && self.flush_interval_s >= 0.001
            && self.flush_interval_s <= 3600.0)
        {
            return Err(CoreError::config(
                "flush_interval",
                format!(
                    "must be between 0.001 and 3600 seconds, got {}",
                    self.flush_interval_s
                ),
            ));
        }
        if self.segment_size < MIN_SEGMENT_SIZE {
            return Err(CoreError::config(
                "segment_size",
                format!(
                    "must be at least {MIN_SEGMENT_SIZE} bytes, got {}",
                    self.segment_size
                ),
            ));
        }
        if !(self.segment_seconds.is_finite() && self.segment_seconds >= 0.0) {
            return Err(CoreError::config(
                "segment_seconds",
                format!("must be >= 0 (0 = off), got {}", self.segment_seconds),
            ));
        }
        if self.max_disk != 0 && self.max_disk < self.segment_size.saturating_mul(2) {
            return Err(CoreError::config(
                "max_disk",
                format!(
                    "must be 0 (unbounded) or room for at least two segments of segment_size \
                     ({} bytes each, so at least {} bytes), got {}; raise max_disk or lower \
                     segment_size",
                    self.segment_size,
                    self.segment_size.saturating_mul(2),
                    self.max_disk
                ),
            ));
        }
        if !(1..=9).contains(&self.compression_level) {
            return Err(CoreError::config(
                "compression_level",
                format!("must be 1..9, got {}", self.compression_level),
            ));
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(CoreError::config(
                "rank",
                format!(
                    "rank {} is not below world_size {}",
                    self.rank, self.world_size
                ),
            ));
        }
        if !(self.window_seconds.is_finite()
            && (self.window_seconds == 0.0 || (1.0..=86_400.0).contains(&self.window_seconds)))
        {
            return Err(CoreError::config(
                "window_seconds",
                format!(
                    "must be 0 (off) or between 1 and 86400 seconds, got {}",
                    self.window_seconds
                ),
            ));
        }
        if !(MIN_WINDOW_BYTES..=MAX_WINDOW_BYTES).contains(&self.window_bytes) {
            return Err(CoreError::config(
                "window_bytes",
                format!(
                    "must be between {MIN_WINDOW_BYTES} and {MAX_WINDOW_BYTES} bytes, got {}",
                    self.window_bytes
                ),
            ));
        }
        if let Some(sc) = &self.sampler {
            if !(sc.hz.is_finite() && (1.0..=1000.0).contains(&sc.hz)) {
                return Err(CoreError::config(
                    "sample_hz",
                    format!(
                        "must be between 1 and 1000 (or 0 to turn sampling off), got {}",
                        sc.hz
                    ),
                ));
            }
            if sc.history < 2 {
                return Err(CoreError::config(
                    "sample_history",
                    format!("must be at least 2 samples, got {}", sc.history),
                ));
            }
        }
        if serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(
            &self.extra_config_json,
        )
        .is_err()
        {
            return Err(CoreError::config(
                "extra_config_json",
                "must be a JSON object",
            ));
        }
        Ok(())
    }

    /// Ring capacity actually used: `buffer_size` rounded up to a power of two.
    pub fn ring_capacity(&self) -> usize {
        self.buffer_size.next_power_of_two()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn bad_values_name_the_option() {
        let cases: Vec<(Config, &str)> = vec![
            (
                Config {
                    buffer_size: 0,
                    ..Default::default()
                },
                "buffer_size",
            ),
            (
                Config {
                    flush_interval_s: -1.0,
                    ..Default::default()
                },
                "flush_interval",
            ),
            (
                Config {
                    flush_interval_s: f64::NAN,
                    ..Default::default()
                },
                "flush_interval",
            ),
            (
                Config {
                    segment_size: 10,
                    ..Default::default()
                },
                "segment_size",
            ),
            (
                Config {
                    segment_seconds: -2.0,
                    ..Default::default()
                },
                "segment_seconds",
            ),
            (
                Config {
                    max_disk: 256 << 20,
                    ..Default::default()
                },
                "max_disk",
            ),
            (
                Config {
                    compression_level: 0,
                    ..Default::default()
                },
                "compression_level",
            ),
            (
                Config {
                    rank: 2,
                    world_size: 2,
                    ..Default::default()
                },
                "rank",
            ),
        ];
        for (cfg, name) in cases {
            match cfg.validate() {
                Err(CoreError::Config { option, .. }) => assert_eq!(option, name),
                other => panic!("{name}: expected a config error, got {other:?}"),
            }
        }
    }

    #[test]
    fn capacity_is_power_of_two() {
        let cfg = Config {
            buffer_size: 1000,
            ..Default::default()
        };
        assert_eq!(cfg.ring_capacity(), 1024);
    }
}
