//! PCIe traffic per device, from one of two sources:
//! * byte counters (`NVML_FI_DEV_PCIE_COUNT_{RX,TX}_BYTES`, 630 µs for both
//!   on an H200): cumulative, turned into a rate between two readings by
//!   [`Counter`]. They are 32 bits wide (and nvml-wrapper truncates an
//!   `unsigned long` value to 32 bits too), so they wrap every 4 GiB: a
//!   wrap between two readings is taken as exactly one, which holds when
//!   they are read within [`super::gpu::PCIE_COUNTER_HORIZON_NS`]; a
//!   driver reload looks like a wrap, and gives one wrong rate;
//! * where a device lacks them, `nvmlDeviceGetPcieThroughput` ([`throughput`]),
//!   which blocks ~20 ms in the driver per direction while it samples: read
//!   on the helper thread only ([`super::helper`]).

use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Device;

/// A cumulative byte counter turned into bytes per second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    /// The previous reading: (CLOCK_MONOTONIC ns, bytes).
    prev: Option<(u64, u64)>,
}

impl Counter {
    /// The rate since the previous reading of a counter `bits` wide (32 or
    /// 64). `None` for the first reading and for a reading at the same
    /// instant or earlier (the baseline stays). A 32-bit counter below its
    /// previous value wrapped once; a 64-bit one went backwards (reset by a
    /// driver reload): no rate, and the reading is the new baseline.
    pub fn update(&mut self, now_ns: u64, bytes: u64, bits: u32) -> Option<f64> {
        let Some((t, b)) = self.prev else {
            self.prev = Some((now_ns, bytes));
            return None;
        };
        if now_ns <= t {
            return None;
        }
        self.prev = Some((now_ns, bytes));
        let delta = if bits == 32 {
            Some((bytes as u32).wrapping_sub(b as u32) as u64)
        } else {
            bytes.checked_sub(b)
        };
        delta.map(|d| d as f64 * 1e9 / (now_ns - t) as f64)
    }
}

/// One blocking throughput read in bytes per second (NVML gives KB/s).
pub fn throughput(dev: &Device<'_>, rx: bool) -> Result<f64, NvmlError> {
    let which = if rx {
        PcieUtilCounter::Receive
    } else {
        PcieUtilCounter::Send
    };
    dev.pcie_throughput(which).map(|k| k as f64 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_gives_rates_between_readings() {
        let mut c = Counter::default();
        assert_eq!(c.update(1_000_000_000, 5_000, 64), None);
        // 1 MB over 10 ms: 100 MB/s.
        assert_eq!(c.update(1_010_000_000, 1_005_000, 64), Some(1e8));
        // Nothing moved: zero, not nothing.
        assert_eq!(c.update(1_020_000_000, 1_005_000, 64), Some(0.0));
    }

    #[test]
    fn a_32_bit_counter_wraps_once_between_readings() {
        let mut c = Counter::default();
        let near_top = u32::MAX as u64 - 999;
        c.update(0, near_top, 32);
        // 1000 bytes to the top, 500 after the wrap: 1500 bytes in 1 µs.
        assert_eq!(c.update(1_000, 500, 32), Some(1.5e9));
        assert_eq!(c.update(2_000, 1_500, 32), Some(1e9));
    }

    #[test]
    fn a_64_bit_counter_going_back_or_a_repeated_instant_gives_no_rate() {
        let mut c = Counter::default();
        c.update(1_000, 10_000, 64);
        // Same instant: no rate, the baseline stays.
        assert_eq!(c.update(1_000, 20_000, 64), None);
        assert_eq!(c.update(2_000, 20_000, 64), Some(10_000.0 * 1e9 / 1_000.0));
        // Reset (the driver reloaded): skipped, and a new baseline.
        assert_eq!(c.update(3_000, 100, 64), None);
        assert_eq!(c.update(4_000, 1_100, 64), Some(1e9));
        // A clock going back (it does not, but a caller's might): skipped.
        assert_eq!(c.update(3_500, 2_000, 64), None);
        assert_eq!(c.update(5_000, 2_100, 64), Some(1e9));
    }
}
