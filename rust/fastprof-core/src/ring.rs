//! A bounded single-producer / single-consumer ring of [`Record`]s.
//!
//! [`ring`] returns the two halves: one [`Producer`] (owned by the recording
//! thread) and one [`Consumer`] (owned by the writer). Neither half is
//! `Clone`; the producer is `!Sync` (its cached tail is a `Cell`), so the
//! single-producer rule is held by the types and both operations are safe.
//! Neither side blocks or allocates: a full ring hands the record back and the
//! caller counts a drop (dropping the record frees any extra it owns).
//!
//! Allocation is fallible ([`ring`] returns an error instead of aborting), so
//! a process under an address-space limit (`ulimit -v`) keeps running and the
//! thread that got no ring has its events counted as dropped.
//!
//! Memory ordering: `head` is written only by the producer and `tail` only by
//! the consumer. The producer writes a slot, then publishes it with a
//! `Release` store of `head`; the consumer's `Acquire` load of `head` makes the
//! slot contents visible before it reads them. Symmetrically the consumer
//! moves slots out, then frees them with a `Release` store of `tail`; the
//! producer's `Acquire` load of `tail` guarantees the move finished before the
//! slot is overwritten. Indices grow without wrapping (u64 would take
//! centuries to overflow) and are masked on access. Records left in the ring
//! when both halves are gone are dropped by the shared buffer's `Drop`.

use crate::record::Record;
use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Keeps the producer's and the consumer's index on separate cache lines so
/// that the two threads do not false-share.
#[repr(align(128))]
struct Padded(AtomicU64);

/// What [`Producer::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Stored.
    Done,
    /// Stored, and another quarter of the ring has filled since the last
    /// nudge: the producer should wake the consumer.
    Nudge,
    /// No room: the record was dropped (freeing any extra it owned).
    Full,
}

impl Push {
    #[inline(always)]
    pub fn stored(self) -> bool {
        self != Push::Full
    }
}

/// The ring's memory could not be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocError {
    pub bytes: usize,
}

impl std::fmt::Display for AllocError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "could not allocate a {} byte event ring", self.bytes)
    }
}

struct Buf {
    slots: Box<[UnsafeCell<MaybeUninit<Record>>]>,
    mask: u64,
    /// `head & nudge_mask == 0` after a push: another quarter of the ring has
    /// been written since the last such push, time to wake the consumer.
    nudge_mask: u64,
    head: Padded,
    tail: Padded,
}

// SAFETY: the slots are only touched under the SPSC protocol described in the
// module header, and only one Producer and one Consumer exist per Buf: the
// producer writes slots in [head, tail + cap) which the consumer never reads,
// the consumer reads slots in [tail, head) which the producer never writes.
unsafe impl Sync for Buf {}
unsafe impl Send for Buf {}

impl Drop for Buf {
    fn drop(&mut self) {
        // Both halves are gone (we hold the last Arc): nobody else touches the
        // slots. Records still in [tail, head) are initialised and owned here.
        let head = *self.head.0.get_mut();
        let tail = *self.tail.0.get_mut();
        for i in tail..head {
            let slot = &mut self.slots[(i & self.mask) as usize];
            // SAFETY: every slot in [tail, head) was written by a push and not
            // yet moved out by a drain.
            unsafe { slot.get_mut().assume_init_drop() };
        }
    }
}

/// The recording thread's half. The fields the push path reads are copied
/// out of the shared buffer (which `buf` keeps alive), so a push is one hop
/// from the thread's registration to the slot.
pub struct Producer {
    slots: *const UnsafeCell<MaybeUninit<Record>>,
    mask: u64,
    nudge_mask: u64,
    /// Private copy of `tail`, refreshed only when the ring looks full, so
    /// the common push touches no shared line but its own `head`.
    cached_tail: Cell<u64>,
    /// Private copy of `head` (only this half writes it).
    head: Cell<u64>,
    buf: Arc<Buf>,
}

// SAFETY: the raw slot pointer points into `buf`, which the Producer keeps
// alive and may be used from whichever single thread owns the Producer. It is
// deliberately not Sync (the Cells): one producer per ring.
unsafe impl Send for Producer {}

/// The writer's half.
pub struct Consumer {
    buf: Arc<Buf>,
}

/// A ring of `capacity` slots (a power of two, at least 2), split in halves.
pub fn ring(capacity: usize) -> Result<(Producer, Consumer), AllocError> {
    assert!(
        capacity.is_power_of_two() && capacity >= 2,
        "ring capacity must be a power of two >= 2, got {capacity}"
    );
    let bytes = capacity.saturating_mul(std::mem::size_of::<Record>());
    let mut v: Vec<UnsafeCell<MaybeUninit<Record>>> = Vec::new();
    // Fallible: under an address-space limit this fails instead of aborting.
    // Large allocations are mmap'd, so pages are committed only as used.
    v.try_reserve_exact(capacity)
        .map_err(|_| AllocError { bytes })?;
    // SAFETY: capacity reserved above; MaybeUninit slots need no initialisation.
    unsafe { v.set_len(capacity) };
    let buf = Arc::new(Buf {
        slots: v.into_boxed_slice(),
        mask: capacity as u64 - 1,
        nudge_mask: (capacity as u64 / 4).max(1) - 1,
        head: Padded(AtomicU64::new(0)),
        tail: Padded(AtomicU64::new(0)),
    });
    Ok((
        Producer {
            slots: buf.slots.as_ptr(),
            mask: buf.mask,
            nudge_mask: buf.nudge_mask,
            cached_tail: Cell::new(0),
            head: Cell::new(0),
            buf: buf.clone(),
        },
        Consumer { buf },
    ))
}

impl Producer {
    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Push `rec` if, after it, at least `reserve` further slots stay free
    /// (the recorder reserves room for the `End` of every open span, so that
    /// a recorded `Begin` is never left without its end). A full ring drops
    /// the record, freeing what it owns, and says [`Push::Full`].
    #[inline(always)]
    pub fn push(&self, rec: Record, reserve: u64) -> Push {
        let head = self.head.get();
        let need = head + 1 + reserve;
        let cap = self.mask + 1;
        if need - self.cached_tail.get() > cap && !self.room_after_refresh(need, cap) {
            drop_full(rec);
            return Push::Full;
        }
        // SAFETY: `slots` points at `buf`'s `cap` slots (kept alive by
        // `buf`); this is the only producer (not Clone, not Sync), and the
        // slot at `head` is outside [tail, head), which the consumer reads.
        unsafe {
            let slot = (*self.slots.add((head & self.mask) as usize)).get();
            rec.write_into((*slot).as_mut_ptr());
        }
        self.head.set(head + 1);
        // Release: publishes the slot written above to the consumer.
        self.buf.head.0.store(head + 1, Ordering::Release);
        if (head + 1) & self.nudge_mask == 0 {
            Push::Nudge
        } else {
            Push::Done
        }
    }

    #[cold]
    #[inline(never)]
    fn room_after_refresh(&self, need: u64, cap: u64) -> bool {
        // Acquire: pairs with the consumer's Release store of tail, so the
        // slots it freed are no longer being read.
        self.cached_tail
            .set(self.buf.tail.0.load(Ordering::Acquire));
        need - self.cached_tail.get() <= cap
    }
}

#[cold]
#[inline(never)]
fn drop_full(rec: Record) {
    drop(rec);
}

impl Consumer {
    pub fn capacity(&self) -> u64 {
        self.buf.mask + 1
    }

    /// How far the producer has published (to drain up to).
    pub fn published(&self) -> u64 {
        // Acquire: pairs with the producer's Release store of head, so every
        // slot below the value read is visible to the drain that follows.
        self.buf.head.0.load(Ordering::Acquire)
    }

    /// Records currently held (a snapshot).
    pub fn len(&self) -> u64 {
        let tail = self.buf.tail.0.load(Ordering::Relaxed);
        self.published().saturating_sub(tail)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once the producer half is gone (its thread exited or re-registered):
    /// after a last drain, nothing more can arrive.
    pub fn producer_gone(&self) -> bool {
        Arc::strong_count(&self.buf) == 1
    }

    /// Move every available record into `out`; returns how many.
    pub fn drain_into(&mut self, out: &mut Vec<Record>) -> usize {
        let upto = self.published();
        self.drain_upto(out, upto)
    }

    /// Move the records below `upto` (a value returned by [`Consumer::published`];
    /// larger values are clamped to it) into `out`; returns how many.
    pub fn drain_upto(&mut self, out: &mut Vec<Record>, upto: u64) -> usize {
        let b = &*self.buf;
        // Relaxed: only the consumer writes tail.
        let tail = b.tail.0.load(Ordering::Relaxed);
        let head = upto.min(self.published()).max(tail);
        let n = (head - tail) as usize;
        if n == 0 {
            return 0;
        }
        out.reserve(n);
        let cap = (b.mask + 1) as usize;
        let start = (tail & b.mask) as usize;
        let first = n.min(cap - start);
        // The slots are `UnsafeCell<MaybeUninit<Record>>`, laid out as `Record`.
        let src = b.slots.as_ptr() as *const Record;
        // SAFETY: [tail, head) was published by the producer (Acquire above)
        // and is moved out exactly once: the records are copied bitwise into
        // `out`'s reserved spare capacity (at most two runs, around the wrap),
        // `out` takes ownership through set_len, and tail moves past them
        // below so neither the ring nor its Drop touches them again.
        unsafe {
            let dst = out.as_mut_ptr().add(out.len());
            std::ptr::copy_nonoverlapping(src.add(start), dst, first);
            std::ptr::copy_nonoverlapping(src, dst.add(first), n - first);
            out.set_len(out.len() + n);
        }
        // Release: the reads above complete before the producer may reuse the slots.
        b.tail.0.store(head, Ordering::Release);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Extra, Kind};

    fn rec(i: u64) -> Record {
        Record::counter(0, i, i as f64)
    }

    #[test]
    fn fills_then_drops_then_frees() {
        let (p, mut c) = ring(8).unwrap();
        for i in 0..8 {
            assert!(p.push(rec(i), 0).stored());
        }
        assert_eq!(p.push(rec(8), 0), Push::Full);
        let mut out = Vec::new();
        assert_eq!(c.drain_into(&mut out), 8);
        assert_eq!(
            out.iter().map(|r| r.ts).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
        assert!(p.push(rec(9), 0).stored());
    }

    #[test]
    fn reserve_keeps_room() {
        let (p, _c) = ring(4).unwrap();
        assert!(p.push(rec(0), 2).stored()); // 1 used, 2 kept free
        assert!(!p.push(rec(1), 3).stored()); // 2 used + 3 free > 4
        assert!(p.push(rec(1), 2).stored()); // 2 used + 2 free = 4
        assert!(!p.push(rec(2), 2).stored());
        assert!(p.push(rec(2), 1).stored());
    }

    #[test]
    fn nudges_once_per_quarter() {
        let (p, mut c) = ring(16).unwrap();
        let mut out = Vec::new();
        let mut nudges = Vec::new();
        for i in 0..40u64 {
            if p.push(rec(i), 0) == Push::Nudge {
                nudges.push(i);
            }
            if i % 8 == 7 {
                c.drain_into(&mut out);
            }
        }
        assert_eq!(nudges, vec![3, 7, 11, 15, 19, 23, 27, 31, 35, 39]);
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn rejects_odd_capacity() {
        let _ = ring(6);
    }

    #[test]
    fn impossible_allocation_is_an_error_not_an_abort() {
        // More slots than the address space can hold: try_reserve refuses.
        let r = ring(1 << 60);
        assert!(r.is_err());
    }

    #[test]
    fn drains_across_the_wrap_in_order() {
        let (p, mut c) = ring(8).unwrap();
        let mut out = Vec::new();
        let mut next = 0u64;
        for round in 0..20u64 {
            for _ in 0..(round % 7 + 1) {
                assert!(p.push(rec(next), 0).stored());
                next += 1;
            }
            c.drain_into(&mut out);
        }
        assert_eq!(out.len() as u64, next);
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, r)| r.ts == i as u64 && r.value() == i as f64));
    }

    #[test]
    fn producer_gone_is_seen_by_the_consumer() {
        let (p, c) = ring(4).unwrap();
        assert!(!c.producer_gone());
        drop(p);
        assert!(c.producer_gone());
    }

    #[test]
    fn records_left_in_a_dropped_ring_are_dropped() {
        let (p, c) = ring(8).unwrap();
        for i in 0..5 {
            let x = Box::new(Extra {
                name: Some(format!("n{i}").into()),
                args_json: None,
                ..Default::default()
            });
            assert!(p
                .push(Record::with_extra(Kind::Instant, 0, i, x), 0)
                .stored());
        }
        drop(p);
        drop(c); // frees the five extras (tests/ownership.rs counts the bytes)
    }

    #[test]
    fn concurrent_producer_consumer_loses_nothing() {
        let (p, mut c) = ring(1024).unwrap();
        let n = 2_000_000u64;
        let t = std::thread::spawn(move || {
            let mut dropped = 0u64;
            for i in 0..n {
                if !p.push(rec(i), 0).stored() {
                    dropped += 1;
                }
            }
            dropped
        });
        let mut got = Vec::new();
        let mut last: Option<u64> = None;
        let mut received = 0u64;
        loop {
            let done = t.is_finished();
            got.clear();
            c.drain_into(&mut got);
            for x in &got {
                if let Some(l) = last {
                    assert!(x.ts > l, "out of order {} after {}", x.ts, l);
                }
                assert_eq!(x.ts as f64, x.value(), "torn record");
                last = Some(x.ts);
                received += 1;
            }
            if done && c.is_empty() {
                break;
            }
        }
        let dropped = t.join().unwrap();
        assert_eq!(received + dropped, n);
        assert!(received > 0);
    }
}
