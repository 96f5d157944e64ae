//! A bounded single-producer / single-consumer ring of [`Record`]s.
//!
//! Each recording thread owns the producer side of exactly one ring; the
//! writer thread is the only consumer. Neither side ever blocks or allocates:
//! a full ring makes `push` return `false` and the caller counts a drop.
//!
//! Memory ordering: `head` is written only by the producer and `tail` only by
//! the consumer. The producer writes a slot, then publishes it with a
//! `Release` store of `head`; the consumer's `Acquire` load of `head` makes the
//! slot contents visible before it reads them. Symmetrically the consumer
//! copies slots out, then frees them with a `Release` store of `tail`; the
//! producer's `Acquire` load of `tail` guarantees the copy finished before the
//! slot is overwritten. Indices grow without wrapping (u64 would take
//! centuries to overflow) and are masked on access.

use crate::record::Record;
use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

/// Keeps the producer's and the consumer's index on separate cache lines so
/// that the two threads do not false-share.
#[repr(align(128))]
struct Padded(AtomicU64);

/// What [`Ring::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// No room: the record was not stored.
    Dropped,
    /// Stored.
    Done,
    /// Stored, and another quarter of the ring has filled since the last
    /// nudge: the producer should wake the consumer.
    Nudge,
}

impl Push {
    pub fn stored(self) -> bool {
        self != Push::Dropped
    }
}

pub struct Ring {
    slots: Box<[UnsafeCell<MaybeUninit<Record>>]>,
    mask: u64,
    /// `head & nudge_mask == 0` after a push: another quarter of the ring has
    /// been written since the last such push, time to wake the consumer.
    nudge_mask: u64,
    head: Padded,
    tail: Padded,
}

// SAFETY: the slots are only touched under the SPSC protocol described in the
// module header: the producer writes slots in [head, tail + cap) which the
// consumer never reads, the consumer reads slots in [tail, head) which the
// producer never writes.
unsafe impl Sync for Ring {}
unsafe impl Send for Ring {}

impl Ring {
    /// A ring of `capacity` slots; `capacity` must be a power of two.
    pub fn new(capacity: usize) -> Ring {
        assert!(
            capacity.is_power_of_two() && capacity >= 2,
            "ring capacity must be a power of two >= 2, got {capacity}"
        );
        // Zeroed allocation: the kernel commits pages lazily, so a large ring
        // that a quiet thread never fills costs address space, not memory.
        let slots: Box<[UnsafeCell<MaybeUninit<Record>>]> = (0..capacity)
            .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
            .collect();
        Ring {
            slots,
            mask: capacity as u64 - 1,
            nudge_mask: (capacity as u64 / 4).max(1) - 1,
            head: Padded(AtomicU64::new(0)),
            tail: Padded(AtomicU64::new(0)),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Records currently held (a snapshot; exact only on the producer thread).
    pub fn len(&self) -> u64 {
        // Relaxed is enough for a fill-level estimate used for scheduling.
        let head = self.head.0.load(Ordering::Relaxed);
        let tail = self.tail.0.load(Ordering::Relaxed);
        head.saturating_sub(tail)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Producer only. Push `rec` if, after it, at least `reserve` further
    /// slots stay free (the recorder reserves room for the `End` of every
    /// open span, so that a recorded `Begin` is never left without its end).
    /// `cached_tail` is the producer's private copy of `tail`, refreshed only
    /// when the ring looks full, so the common push touches no shared line
    /// but its own `head`.
    ///
    /// # Safety
    /// Only one thread may ever call `push` on a given ring.
    ///
    /// Returns [`Push::Dropped`] when the ring has no room, else
    /// [`Push::Nudge`] once every quarter of the capacity (the consumer, which
    /// otherwise sleeps until its flush interval, should be woken) and
    /// [`Push::Done`] the rest of the time.
    #[inline(always)]
    pub unsafe fn push(&self, rec: Record, reserve: u64, cached_tail: &mut u64) -> Push {
        // Relaxed: only this thread writes head.
        let head = self.head.0.load(Ordering::Relaxed);
        let need = head + 1 + reserve;
        if need - *cached_tail > self.capacity() {
            // Acquire: pairs with the consumer's Release store of tail, so the
            // slots it freed are no longer being read.
            *cached_tail = self.tail.0.load(Ordering::Acquire);
            if need - *cached_tail > self.capacity() {
                return Push::Dropped;
            }
        }
        let slot = &self.slots[(head & self.mask) as usize];
        (*slot.get()).write(rec);
        // Release: publishes the slot written above to the consumer.
        self.head.0.store(head + 1, Ordering::Release);
        if (head + 1) & self.nudge_mask == 0 {
            Push::Nudge
        } else {
            Push::Done
        }
    }

    /// Consumer only: how far the producer has published (to drain up to).
    pub fn published(&self) -> u64 {
        // Acquire: pairs with the producer's Release store of head, so every
        // slot below the value read is visible to the drain that follows.
        self.head.0.load(Ordering::Acquire)
    }

    /// Consumer only: append every available record to `out`; returns how many.
    ///
    /// # Safety
    /// Only one thread at a time may drain a given ring.
    pub unsafe fn drain_into(&self, out: &mut Vec<Record>) -> usize {
        self.drain_upto(out, self.published())
    }

    /// Consumer only: append the records below `upto` (a value returned by
    /// [`Ring::published`]) to `out`; returns how many.
    ///
    /// # Safety
    /// Only one thread at a time may drain a given ring, and `upto` must come
    /// from `published` on this ring.
    pub unsafe fn drain_upto(&self, out: &mut Vec<Record>, upto: u64) -> usize {
        // Relaxed: only the consumer writes tail.
        let tail = self.tail.0.load(Ordering::Relaxed);
        let head = upto.max(tail);
        let n = (head - tail) as usize;
        out.reserve(n);
        for i in tail..head {
            let slot = &self.slots[(i & self.mask) as usize];
            out.push((*slot.get()).assume_init_read());
        }
        // Release: the reads above complete before the producer may reuse the slots.
        self.tail.0.store(head, Ordering::Release);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Kind;
    use std::sync::Arc;

    fn rec(i: u64) -> Record {
        Record::new(Kind::Instant, 0, i, i, 0)
    }

    #[test]
    fn fills_then_drops_then_frees() {
        let r = Ring::new(8);
        let mut ct = 0;
        for i in 0..8 {
            assert!(unsafe { r.push(rec(i), 0, &mut ct) }.stored());
        }
        assert!(!unsafe { r.push(rec(8), 0, &mut ct) }.stored());
        let mut out = Vec::new();
        assert_eq!(unsafe { r.drain_into(&mut out) }, 8);
        assert_eq!(
            out.iter().map(|r| r.ts).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        assert!(unsafe { r.push(rec(9), 0, &mut ct) }.stored());
    }

    #[test]
    fn reserve_keeps_room() {
        let r = Ring::new(4);
        let mut ct = 0;
        assert!(unsafe { r.push(rec(0), 2, &mut ct) }.stored()); // 1 used, 2 kept free
        assert!(!unsafe { r.push(rec(1), 3, &mut ct) }.stored()); // 2 used + 3 free > 4
        assert!(unsafe { r.push(rec(1), 2, &mut ct) }.stored()); // 2 used + 2 free = 4
        assert!(!unsafe { r.push(rec(2), 2, &mut ct) }.stored());
        assert!(unsafe { r.push(rec(2), 1, &mut ct) }.stored());
    }

    #[test]
    fn nudges_once_per_quarter() {
        let r = Ring::new(16);
        let mut ct = 0;
        let mut out = Vec::new();
        let mut nudges = Vec::new();
        for i in 0..40u64 {
            if unsafe { r.push(rec(i), 0, &mut ct) } == Push::Nudge {
                nudges.push(i);
            }
            if i % 8 == 7 {
                unsafe { r.drain_into(&mut out) };
            }
        }
        assert_eq!(nudges, vec![3, 7, 11, 15, 19, 23, 27, 31, 35, 39]);
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn rejects_odd_capacity() {
        Ring::new(6);
    }

    #[test]
    fn concurrent_producer_consumer_loses_nothing() {
        let r = Arc::new(Ring::new(1024));
        let n = 2_000_000u64;
        let p = {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut ct = 0;
                let mut dropped = 0u64;
                for i in 0..n {
                    if !unsafe { r.push(rec(i), 0, &mut ct) }.stored() {
                        dropped += 1;
                    }
                }
                dropped
            })
        };
        let mut got = Vec::new();
        let mut last: Option<u64> = None;
        let mut received = 0u64;
        loop {
            let done = p.is_finished();
            got.clear();
            unsafe { r.drain_into(&mut got) };
            for x in &got {
                if let Some(l) = last {
                    assert!(x.ts > l, "out of order {} after {}", x.ts, l);
                }
                assert_eq!(x.ts, x.payload, "torn record");
                last = Some(x.ts);
                received += 1;
            }
            if done && r.is_empty() {
                break;
            }
        }
        let dropped = p.join().unwrap();
        assert_eq!(received + dropped, n);
        assert!(received > 0);
    }
}
