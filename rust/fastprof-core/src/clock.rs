//! Clocks. Records carry CLOCK_MONOTONIC nanoseconds (cheap through the vDSO,
//! never jumps); wall time enters only through [`Anchor`] pairs that the
//! writer takes at start, periodically and at stop, so that a trace can be put
//! on the epoch time line and drift between the two clocks can be seen.

/// Nanoseconds of CLOCK_MONOTONIC.
#[inline(always)]
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME).
#[inline]
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

#[inline(always)]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clock ids exist on every
    // Linux and macOS kernel we support, so the call cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One (CLOCK_REALTIME, CLOCK_MONOTONIC) pair taken as close together as we can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    pub realtime_ns: u64,
    pub monotonic_ns: u64,
    /// How far apart the two monotonic reads around the realtime read were:
    /// the uncertainty of this pair.
    pub uncertainty_ns: u64,
}

impl Anchor {
    /// Take an anchor: the realtime read bracketed by two monotonic reads,
    /// best (tightest) of a few tries, so that a preemption between the reads
    /// does not skew it.
    pub fn take() -> Anchor {
        let mut best = Anchor {
            realtime_ns: 0,
            monotonic_ns: 0,
            uncertainty_ns: u64::MAX,
        };
        for _ in 0..5 {
            let m0 = monotonic_ns();
            let r = realtime_ns();
            let m1 = monotonic_ns();
            let gap = m1 - m0;
            if gap < best.uncertainty_ns {
                best = Anchor {
                    realtime_ns: r,
                    monotonic_ns: m0 + gap / 2,
                    uncertainty_ns: gap,
                };
            }
        }
        best
    }

    /// Epoch ns of a monotonic timestamp, through this anchor.
    pub fn to_epoch_ns(&self, mono: u64) -> i128 {
        self.realtime_ns as i128 + (mono as i128 - self.monotonic_ns as i128)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_never_goes_back() {
        let mut last = monotonic_ns();
        for _ in 0..10_000 {
            let now = monotonic_ns();
            assert!(now >= last);
            last = now;
        }
    }

    #[test]
    fn anchor_is_tight_and_consistent_with_realtime() {
        let a = Anchor::take();
        assert!(
            a.uncertainty_ns < 1_000_000,
            "anchor gap {} ns",
            a.uncertainty_ns
        );
        let mono = monotonic_ns();
        let real = realtime_ns() as i128;
        let est = a.to_epoch_ns(mono);
        assert!(
            (real - est).abs() < 5_000_000,
            "estimate off by {} ns",
            real - est
        );
    }
}
