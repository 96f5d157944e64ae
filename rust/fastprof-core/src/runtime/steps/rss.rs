//! The process's resident memory at steps' ends, within a CPU budget.
//!
//! The only source of the resident set size is a read of `/proc/self/statm`:
//! a syscall, 1.5–4 µs on the 2-vCPU VM we measured (`benches/bench_loop.py`).
//! Waking another thread to read it costs the training thread more (a futex
//! wake of a sleeping thread measured 5–7 µs there), and a read made later
//! by another thread is not the step's end. So the training thread reads it
//! itself, at a step's end, but only when the time since the last read is at
//! least [`BUDGET`] times what a read costs: the reads take at most 1/BUDGET
//! (5%) of the training thread. A step longer than that (every real training
//! step: 1.5 µs × 20 = 30 µs) gets its own reading; steps shorter than that
//! (an empty loop) share one, at the end of the step where it falls due.
//!
//! The cost is a moving average of measured reads, each clamped to four times
//! the average, so one read that was preempted does not stop the readings.

use std::os::unix::fs::FileExt;

/// A read takes at most 1/BUDGET of the training thread's time.
pub const BUDGET: u64 = 20;

/// Where the bytes come from (the real file, or a test's stand-in).
pub trait Resident {
    /// Bytes resident now, None if unreadable.
    fn bytes(&mut self) -> Option<u64>;
}

/// `/proc/self/statm`, kept open, read with one `pread`.
pub struct Statm {
    file: std::fs::File,
    page: u64,
    buf: [u8; 128],
}

impl Statm {
    pub fn open() -> Result<Statm, String> {
        let file = std::fs::File::open("/proc/self/statm")
            .map_err(|e| format!("/proc/self/statm: {e}"))?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Ok(Statm {
            file,
            page: u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096),
            buf: [0; 128],
        })
    }
}

impl Resident for Statm {
    fn bytes(&mut self) -> Option<u64> {
        let n = self.file.read_at(&mut self.buf, 0).ok()?;
        crate::runtime::sampler::procfs::parse_statm_rss(&self.buf[..n]).map(|p| p * self.page)
    }
}

/// Resident bytes at steps' ends, read when the budget allows.
pub struct StepRss<R: Resident = Statm> {
    source: R,
    /// Average cost of a read, in clock units (ticks).
    cost: u64,
    /// No read before this time.
    next: u64,
}

impl StepRss<Statm> {
    /// The real file, read once now (the first cost); why not, if it cannot be.
    pub fn open() -> Result<StepRss<Statm>, String> {
        StepRss::new(Statm::open()?, crate::runtime::clock::ticks)
    }
}

impl<R: Resident> StepRss<R> {
    /// A reader over `source`, read once with `now` to learn its cost.
    pub fn new(mut source: R, mut now: impl FnMut() -> u64) -> Result<StepRss<R>, String> {
        let t0 = now();
        source
            .bytes()
            .ok_or_else(|| "/proc/self/statm: no resident size in it".to_string())?;
        let cost = now().saturating_sub(t0).max(1);
        Ok(StepRss {
            source,
            cost,
            next: 0,
        })
    }

    /// At a step's end (`now()` is read before and after the read): the
    /// resident bytes when a read is due, else None (this step shares the
    /// next reading).
    pub fn at_step_end(&mut self, mut now: impl FnMut() -> u64) -> Option<u64> {
        let t0 = now();
        if t0 < self.next {
            return None;
        }
        let bytes = self.source.bytes();
        let took = now()
            .saturating_sub(t0)
            .clamp(1, self.cost.saturating_mul(4));
        // An average over about 8 reads.
        self.cost = (self.cost * 7 + took).div_ceil(8);
        self.next = t0.saturating_add(self.cost.saturating_mul(BUDGET));
        bytes
    }

    /// The average cost of a read now (clock units).
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Bytes that count up by one page per read.
    struct Counting(u64);
    impl Resident for Counting {
        fn bytes(&mut self) -> Option<u64> {
            self.0 += 4096;
            Some(self.0)
        }
    }

    /// A clock advanced by the test; each read of it may add `per_read`.
    struct Clock {
        t: Cell<u64>,
        per_read: Cell<u64>,
    }
    impl Clock {
        fn new(per_read: u64) -> Clock {
            Clock {
                t: Cell::new(1_000),
                per_read: Cell::new(per_read),
            }
        }
        /// Reads alternate: before a read (as is), after it (+ per_read).
        fn reader(&self) -> impl FnMut() -> u64 + '_ {
            let mut after = false;
            move || {
                if after {
                    self.t.set(self.t.get() + self.per_read.get());
                }
                after = !after;
                self.t.get()
            }
        }
        fn advance(&self, by: u64) {
            self.t.set(self.t.get() + by);
        }
    }

    #[test]
    fn steps_longer_than_the_budget_each_get_a_reading() {
        let clock = Clock::new(100);
        let mut r = StepRss::new(Counting(0), clock.reader()).unwrap();
        assert_eq!(r.cost(), 100);
        for _ in 0..50 {
            clock.advance(100 * BUDGET);
            assert!(r.at_step_end(clock.reader()).is_some());
        }
    }

    #[test]
    fn short_steps_share_a_reading_and_reads_stay_within_the_budget() {
        let clock = Clock::new(100);
        let mut r = StepRss::new(Counting(0), clock.reader()).unwrap();
        let (mut reads, start) = (0u64, clock.t.get());
        for _ in 0..10_000 {
            clock.advance(10); // a step 1/10 of a read
            if r.at_step_end(clock.reader()).is_some() {
                reads += 1;
            }
        }
        let elapsed = clock.t.get() - start;
        assert!(reads > 0);
        // The reads' own time is at most 1/BUDGET of all the time.
        assert!(
            reads * 100 * BUDGET <= elapsed + 100 * BUDGET,
            "{reads} reads in {elapsed}"
        );
        assert!(
            reads * 100 * BUDGET * 2 > elapsed,
            "too few: {reads} reads in {elapsed}"
        );
    }

    #[test]
    fn a_preempted_read_does_not_stop_the_readings() {
        let clock = Clock::new(100);
        let mut r = StepRss::new(Counting(0), clock.reader()).unwrap();
        clock.advance(100 * BUDGET);
        clock.per_read.set(10_000_000); // one read that took 100,000x
        assert!(r.at_step_end(clock.reader()).is_some());
        clock.per_read.set(100);
        assert!(r.cost() <= 100 * 4, "{}", r.cost());
        // Steps of 1000 read costs: each still gets its reading.
        let mut got = 0;
        for _ in 0..20 {
            clock.advance(100 * 1000);
            got += usize::from(r.at_step_end(clock.reader()).is_some());
        }
        assert_eq!(got, 20);
    }

    #[test]
    fn an_unreadable_source_is_said_at_open() {
        struct Gone;
        impl Resident for Gone {
            fn bytes(&mut self) -> Option<u64> {
                None
            }
        }
        let clock = Clock::new(1);
        assert!(StepRss::new(Gone, clock.reader()).is_err());
    }

    #[test]
    fn the_real_file_reads_this_process() {
        let mut r = StepRss::open().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let b = loop {
            std::thread::sleep(std::time::Duration::from_millis(1));
            if let Some(b) = r.at_step_end(crate::runtime::clock::ticks) {
                break b;
            }
            assert!(std::time::Instant::now() < deadline, "no reading in 5 s");
        };
        assert!(b > 1 << 20, "{b}");
    }
}
