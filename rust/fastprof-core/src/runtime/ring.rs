//! A single-producer / single-consumer ring of [`Record`]s that grows under
//! a burst.
//!
//! [`ring`] returns the two halves: one [`Producer`] (owned by the recording
//! thread) and one [`Consumer`] (owned by the writer). Neither half is
//! `Clone`; the producer is `!Sync` (its cached state is in `Cell`s), so the
//! single-producer rule is held by the types and both operations are safe.
//! Neither side blocks.
//!
//! **Growth.** A ring is a chain of chunks. The producer writes into the
//! newest; the consumer drains the oldest and moves on once it is empty and
//! a newer one exists (the old chunk is then freed). When the newest chunk
//! is full, the producer allocates one twice its size and links it: a burst
//! that the writer cannot keep up with (a 10^6-step loop of 0.6 µs steps
//! writes ~6M records in 0.6 s; the writer formats ~2M events/s) is held
//! instead of dropped. The chunks beyond a ring's first size are charged to
//! a [`Growth`] budget that all rings of a recording session share
//! (`Config::buffer_growth`, [`DEFAULT_GROWTH_BYTES`] by default); past it,
//! the largest chunk that still fits is taken, and then a full chunk drops
//! the record and the caller counts the drop, as a bounded ring does.
//! Once the writer has caught up (checked at each quarter-chunk nudge), the
//! producer links a fresh chunk of the first size, so a grown chunk is freed
//! as soon as it is drained and memory goes back to the first size.
//! Allocation (rare: one per doubling) happens on the recording thread; it is
//! fallible ([`ring`] returns an error instead of aborting, a failed growth is
//! a drop), so a process under an address-space limit (`ulimit -v`) keeps
//! running.
//!
//! Memory ordering: within a chunk, `head` is written only by the producer
//! and `tail` only by the consumer. The producer writes a slot, then
//! publishes it with a `Release` store of `head`; the consumer's `Acquire`
//! load of `head` makes the slot contents visible before it reads them.
//! Symmetrically the consumer moves slots out, then frees them with a
//! `Release` store of `tail`; the producer's `Acquire` load of `tail`
//! guarantees the move finished before the slot is overwritten. A chunk's
//! `next` is set once (`OnceLock`: a `Release` completion, an `Acquire`
//! read) after the producer's last store to that chunk's `head`, so the
//! consumer that sees `next` also sees the chunk's final `head`. Indices are
//! global across chunks (a new chunk starts at the head where the last one
//! ended), grow without wrapping (u64 would take centuries to overflow) and
//! are masked on access. Records left in a chunk when both halves are gone
//! are dropped by the chunk's `Drop`.

use crate::runtime::record::Record;
use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The default growth budget a recording session gives all its rings
/// together (the bytes of chunks beyond a ring's first size alive at one
/// time; `Config::buffer_growth`).
pub const DEFAULT_GROWTH_BYTES: u64 = 256 << 20;

/// A growth budget shared by rings (a session's), and what they drew on it.
#[derive(Debug, Default)]
pub struct Growth {
    limit: u64,
    held: AtomicU64,
    peak: AtomicU64,
    chunks: AtomicU64,
}

impl Growth {
    /// A budget of `limit` bytes (0: the rings never grow).
    pub fn new(limit: u64) -> Arc<Growth> {
        Arc::new(Growth {
            limit,
            ..Growth::default()
        })
    }

    /// Chunks allocated past a ring's first size.
    pub fn chunks(&self) -> u64 {
        self.chunks.load(Ordering::Relaxed)
    }

    /// The budget, in bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit
    }

    /// The most bytes grown chunks held at one time.
    pub fn peak_bytes(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Bytes grown chunks hold now.
    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    fn charge(&self, bytes: u64) -> bool {
        let was = self.held.fetch_add(bytes, Ordering::Relaxed);
        if was + bytes > self.limit {
            self.held.fetch_sub(bytes, Ordering::Relaxed);
            return false;
        }
        self.peak.fetch_max(was + bytes, Ordering::Relaxed);
        true
    }
}

/// Keeps the producer's and the consumer's index on separate cache lines so
/// that the two threads do not false-share.
#[repr(align(128))]
struct Padded(AtomicU64);

/// What [`Producer::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Stored.
    Done,
    /// Stored, and another quarter of the chunk has filled since the last
    /// nudge (or the ring just grew): the producer should wake the consumer.
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

/// One chunk of a ring.
struct Buf {
    slots: Box<[UnsafeCell<MaybeUninit<Record>>]>,
    mask: u64,
    /// `head & nudge_mask == 0` after a push: another quarter of the chunk has
    /// been written since the last such push, time to wake the consumer.
    nudge_mask: u64,
    head: Padded,
    tail: Padded,
    /// The chunk the producer went on in, once this one was full (or grown
    /// and drained).
    next: OnceLock<Arc<Buf>>,
    /// Bytes charged to the ring's growth budget (0 for a chunk of the
    /// ring's first size).
    charged: u64,
    growth: Arc<Growth>,
}

// SAFETY: the slots are only touched under the SPSC protocol described in the
// module header, and only one Producer and one Consumer exist per ring: the
// producer writes slots in [head, tail + cap) of its newest chunk, which the
// consumer never reads, the consumer reads slots in [tail, head) of the
// oldest, which the producer never writes (it writes no older chunk again).
unsafe impl Sync for Buf {}
unsafe impl Send for Buf {}

impl Buf {
    /// A chunk of `capacity` slots whose first index is `start`.
    fn new(
        capacity: usize,
        start: u64,
        charged: u64,
        growth: &Arc<Growth>,
    ) -> Result<Arc<Buf>, AllocError> {
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
        Ok(Arc::new(Buf {
            slots: v.into_boxed_slice(),
            mask: capacity as u64 - 1,
            nudge_mask: (capacity as u64 / 4).max(1) - 1,
            head: Padded(AtomicU64::new(start)),
            tail: Padded(AtomicU64::new(start)),
            next: OnceLock::new(),
            charged,
            growth: growth.clone(),
        }))
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // Both halves are done with this chunk (we hold the last Arc): nobody
        // else touches the slots. Records still in [tail, head) are
        // initialised and owned here.
        let head = *self.head.0.get_mut();
        let tail = *self.tail.0.get_mut();
        for i in tail..head {
            let slot = &mut self.slots[(i & self.mask) as usize];
            // SAFETY: every slot in [tail, head) was written by a push and not
            // yet moved out by a drain.
            unsafe { slot.get_mut().assume_init_drop() };
        }
        if self.charged > 0 {
            self.growth.held.fetch_sub(self.charged, Ordering::Relaxed);
        }
    }
}

/// The recording thread's half. The fields the push path reads are copied
/// out of the newest chunk (which `buf` keeps alive), so a push is one hop
/// from the thread's registration to the slot.
pub struct Producer {
    slots: Cell<*const UnsafeCell<MaybeUninit<Record>>>,
    mask: Cell<u64>,
    nudge_mask: Cell<u64>,
    /// Private copy of `tail`, refreshed only when the chunk looks full, so
    /// the common push touches no shared line but its own `head`.
    cached_tail: Cell<u64>,
    /// Private copy of `head` (only this half writes it).
    head: Cell<u64>,
    /// The newest chunk; replaced only by `switch_to`, which no reference
    /// obtained through `chunk()` outlives.
    buf: UnsafeCell<Arc<Buf>>,
    /// The newest chunk's first index.
    start: Cell<u64>,
    /// The ring's first size (what it shrinks back to).
    first: u64,
    /// Held while the producer lives ([`Consumer::producer_gone`]).
    _alive: Arc<()>,
}

// SAFETY: the raw pointers point into the chunk `buf` keeps alive, and may be
// used from whichever single thread owns the Producer. It is deliberately not
// Sync (the Cells): one producer per ring.
unsafe impl Send for Producer {}

/// The writer's half.
pub struct Consumer {
    /// The oldest chunk not yet drained.
    buf: Arc<Buf>,
    alive: Arc<()>,
}

/// A ring of `capacity` slots at first (a power of two, at least 2) that
/// grows on `growth`'s budget, split in halves.
pub fn ring(capacity: usize, growth: &Arc<Growth>) -> Result<(Producer, Consumer), AllocError> {
    let buf = Buf::new(capacity, 0, 0, growth)?;
    let alive = Arc::new(());
    let producer = Producer {
        slots: Cell::new(buf.slots.as_ptr()),
        mask: Cell::new(buf.mask),
        nudge_mask: Cell::new(buf.nudge_mask),
        cached_tail: Cell::new(0),
        head: Cell::new(0),
        start: Cell::new(0),
        buf: UnsafeCell::new(buf.clone()),
        first: capacity as u64,
        _alive: alive.clone(),
    };
    Ok((producer, Consumer { buf, alive }))
}

impl Producer {
    /// The newest chunk's capacity.
    pub fn capacity(&self) -> u64 {
        self.mask.get() + 1
    }

    /// Push `rec` if, after it, at least `reserve` further slots stay free
    /// (the recorder reserves room for the `End` of every open span, so that
    /// a recorded `Begin` is never left without its end). A full chunk grows
    /// the ring (see the module docs); when it cannot, the record is dropped,
    /// freeing what it owns, and the push says [`Push::Full`].
    #[inline(always)]
    pub fn push(&self, rec: Record, reserve: u64) -> Push {
        let head = self.head.get();
        let need = head + 1 + reserve;
        let cap = self.mask.get() + 1;
        let mut grew = false;
        if need - self.cached_tail.get() > cap && !self.room_after_refresh(need, cap) {
            if !self.grow(reserve) {
                drop_full(rec);
                return Push::Full;
            }
            grew = true;
        }
        // SAFETY: `slots` points at the newest chunk's slots (kept alive by
        // `buf`); this is the only producer (not Clone, not Sync), and the
        // slot at `head` is outside [tail, head), which the consumer reads.
        unsafe {
            let slot = (*self.slots.get().add((head & self.mask.get()) as usize)).get();
            rec.write_into((*slot).as_mut_ptr());
        }
        self.head.set(head + 1);
        // Release: publishes the slot written above to the consumer.
        self.chunk().head.0.store(head + 1, Ordering::Release);
        if (head + 1) & self.nudge_mask.get() == 0 {
            self.shrink_if_drained();
            Push::Nudge
        } else if grew {
            Push::Nudge
        } else {
            Push::Done
        }
    }

    #[cold]
    #[inline(never)]
    fn room_after_refresh(&self, need: u64, cap: u64) -> bool {
        self.refresh_tail();
        need - self.cached_tail.get() <= cap
    }

    fn refresh_tail(&self) {
        // Acquire: pairs with the consumer's Release store of tail, so the
        // slots it freed are no longer being read.
        self.cached_tail
            .set(self.chunk().tail.0.load(Ordering::Acquire));
    }

    /// The newest chunk.
    #[inline(always)]
    fn chunk(&self) -> &Buf {
        // SAFETY: only `switch_to` replaces the Arc, and no reference from
        // here is held across it (the Producer is not Sync: one thread).
        unsafe { &*self.buf.get() }
    }

    /// The newest chunk is full: go on in one twice its size, if the
    /// process's growth budget has room and the memory is there.
    #[cold]
    #[inline(never)]
    fn grow(&self, reserve: u64) -> bool {
        let cap = self.mask.get() + 1;
        let least = (self.first * 2).max((reserve + 2).next_power_of_two());
        let growth = self.chunk().growth.clone();
        // Twice the full chunk; when the budget has no room for that, the
        // largest chunk that fits (still larger than the first size, so that
        // the shrink back to it stays a step down), so the budget is used up
        // before a record is dropped.
        let mut new_cap = (cap * 2).max(least);
        let bytes = loop {
            let bytes = new_cap * std::mem::size_of::<Record>() as u64;
            if growth.charge(bytes) {
                break bytes;
            }
            if new_cap / 2 < least {
                return false;
            }
            new_cap /= 2;
        };
        match Buf::new(new_cap as usize, self.head.get(), bytes, &growth) {
            Ok(next) => {
                growth.chunks.fetch_add(1, Ordering::Relaxed);
                self.switch_to(next);
                true
            }
            Err(_) => {
                growth.held.fetch_sub(bytes, Ordering::Relaxed);
                false
            }
        }
    }

    /// At a nudge: a grown chunk that the consumer keeps pace with again
    /// gives way to a fresh chunk of the first size (the grown one is freed once
    /// drained).
    fn shrink_if_drained(&self) {
        if self.mask.get() < self.first {
            return;
        }
        self.refresh_tail();
        // The consumer is in this chunk (its tail moved past the start) and
        // has drained all but the last quarter-chunk since the last nudge:
        // it keeps pace again.
        let tail = self.cached_tail.get();
        let quarter = self.nudge_mask.get() + 1;
        if tail <= self.start.get() || self.head.get() - tail > quarter {
            return;
        }
        let growth = self.chunk().growth.clone();
        if let Ok(next) = Buf::new(self.first as usize, self.head.get(), 0, &growth) {
            self.switch_to(next);
        }
    }

    fn switch_to(&self, next: Arc<Buf>) {
        self.slots.set(next.slots.as_ptr());
        self.mask.set(next.mask);
        self.nudge_mask.set(next.nudge_mask);
        self.cached_tail.set(self.head.get());
        self.start.set(self.head.get());
        // SAFETY: see `chunk`; no reference into the old chunk is live here.
        let old = std::mem::replace(unsafe { &mut *self.buf.get() }, next.clone());
        // After the last Release store of old's head: the consumer that reads
        // `next` reads old's final head.
        let _ = old.next.set(next);
    }
}

#[cold]
#[inline(never)]
fn drop_full(rec: Record) {
    drop(rec);
}

impl Consumer {
    /// The capacity of the chunk being drained.
    pub fn capacity(&self) -> u64 {
        self.buf.mask + 1
    }

    /// How far the producer has published (to drain up to): the newest
    /// chunk's head.
    pub fn published(&self) -> u64 {
        let mut b = &self.buf;
        while let Some(n) = b.next.get() {
            b = n;
        }
        // Acquire: pairs with the producer's Release store of head, so every
        // slot below the value read is visible to the drain that follows.
        b.head.0.load(Ordering::Acquire)
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
        Arc::strong_count(&self.alive) == 1
    }

    /// Move every available record into `out`; returns how many.
    pub fn drain_into(&mut self, out: &mut Vec<Record>) -> usize {
        let upto = self.published();
        self.drain_upto(out, upto)
    }

    /// Move the records below `upto` (a value returned by [`Consumer::published`];
    /// larger values are clamped to it) into `out`; returns how many.
    pub fn drain_upto(&mut self, out: &mut Vec<Record>, upto: u64) -> usize {
        let mut n = 0;
        loop {
            // `next` first (Acquire): once it is set, the head read after it
            // is the chunk's final one.
            let next = self.buf.next.get().cloned();
            let head = self.buf.head.0.load(Ordering::Acquire);
            let end = self.drain_chunk(out, upto.min(head));
            n += end.1;
            match next {
                Some(next) if end.0 == head => self.buf = next,
                _ => return n,
            }
        }
    }

    /// Drain the current chunk up to `upto`; (its tail after, records moved).
    fn drain_chunk(&mut self, out: &mut Vec<Record>, upto: u64) -> (u64, usize) {
        let b = &*self.buf;
        // Relaxed: only the consumer writes tail.
        let tail = b.tail.0.load(Ordering::Relaxed);
        let head = upto.max(tail);
        let n = (head - tail) as usize;
        if n == 0 {
            return (tail, 0);
        }
        out.reserve(n);
        let cap = (b.mask + 1) as usize;
        let start = (tail & b.mask) as usize;
        let first = n.min(cap - start);
        // The slots are `UnsafeCell<MaybeUninit<Record>>`, laid out as `Record`.
        let src = b.slots.as_ptr() as *const Record;
        // SAFETY: [tail, head) was published by the producer (Acquire in the
        // caller) and is moved out exactly once: the records are copied
        // bitwise into `out`'s reserved spare capacity (at most two runs,
        // around the wrap), `out` takes ownership through set_len, and tail
        // moves past them below so neither the chunk nor its Drop touches
        // them again.
        unsafe {
            let dst = out.as_mut_ptr().add(out.len());
            std::ptr::copy_nonoverlapping(src.add(start), dst, first);
            std::ptr::copy_nonoverlapping(src, dst.add(first), n - first);
            out.set_len(out.len() + n);
        }
        // Release: the reads above complete before the producer may reuse the slots.
        b.tail.0.store(head, Ordering::Release);
        (head, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::record::{Extra, Kind};

    /// A ring that never grows: the bounded behaviour.
    fn bounded(capacity: usize) -> Result<(Producer, Consumer), AllocError> {
        ring(capacity, &Growth::new(0))
    }

    fn rec(i: u64) -> Record {
        Record::counter(0, i, i as f64)
    }

    #[test]
    fn fills_then_drops_then_frees() {
        let (p, mut c) = bounded(8).unwrap();
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
        let (p, _c) = bounded(4).unwrap();
        assert!(p.push(rec(0), 2).stored()); // 1 used, 2 kept free
        assert!(!p.push(rec(1), 3).stored()); // 2 used + 3 free > 4
        assert!(p.push(rec(1), 2).stored()); // 2 used + 2 free = 4
        assert!(!p.push(rec(2), 2).stored());
        assert!(p.push(rec(2), 1).stored());
    }

    #[test]
    fn nudges_once_per_quarter() {
        let (p, mut c) = bounded(16).unwrap();
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
        let _ = bounded(6);
    }

    #[test]
    fn impossible_allocation_is_an_error_not_an_abort() {
        // More slots than the address space can hold: try_reserve refuses.
        let r = bounded(1 << 60);
        assert!(r.is_err());
    }

    #[test]
    fn drains_across_the_wrap_in_order() {
        let (p, mut c) = bounded(8).unwrap();
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
        let (p, c) = bounded(4).unwrap();
        assert!(!c.producer_gone());
        drop(p);
        assert!(c.producer_gone());
    }

    #[test]
    fn records_left_in_a_dropped_ring_are_dropped() {
        let (p, c) = bounded(8).unwrap();
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
        let (p, mut c) = bounded(1024).unwrap();
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

    fn drain_all(c: &mut Consumer) -> Vec<u64> {
        let mut out = Vec::new();
        c.drain_into(&mut out);
        out.iter().map(|r| r.ts).collect()
    }

    #[test]
    fn a_full_ring_grows_and_the_consumer_follows_in_order() {
        let growth = Growth::new(1 << 20);
        let (p, mut c) = ring(8, &growth).unwrap();
        let mut nudges = 0;
        for i in 0..100 {
            match p.push(rec(i), 0) {
                Push::Full => panic!("dropped {i} with budget left"),
                Push::Nudge => nudges += 1,
                Push::Done => {}
            }
        }
        // 8 + 16 + 32 + 64 slots: three chunks past the first, all alive.
        assert_eq!(growth.chunks(), 3);
        assert_eq!(p.capacity(), 64);
        assert_eq!(growth.held_bytes(), (16 + 32 + 64) * 24);
        assert_eq!(growth.peak_bytes(), growth.held_bytes());
        assert!(nudges >= 3, "each growth wakes the consumer");
        assert_eq!(c.len(), 100);
        assert_eq!(c.published(), 100);
        assert_eq!(drain_all(&mut c), (0..100).collect::<Vec<_>>());
        // The drained chunks are freed; the newest stays (the producer's).
        assert_eq!(growth.held_bytes(), 64 * 24);
        drop(p);
        assert!(c.producer_gone());
        drop(c);
        assert_eq!(growth.held_bytes(), 0);
    }

    #[test]
    fn drain_upto_stops_inside_a_chunk_and_goes_on_later() {
        let growth = Growth::new(1 << 20);
        let (p, mut c) = ring(4, &growth).unwrap();
        for i in 0..20 {
            assert!(p.push(rec(i), 0).stored());
        }
        let mut out = Vec::new();
        assert_eq!(c.drain_upto(&mut out, 6), 6);
        assert_eq!(c.len(), 14);
        assert_eq!(c.drain_upto(&mut out, 13), 7);
        assert_eq!(c.drain_into(&mut out), 7);
        assert_eq!(
            out.iter().map(|r| r.ts).collect::<Vec<_>>(),
            (0..20).collect::<Vec<_>>()
        );
    }

    #[test]
    fn past_the_budget_a_full_ring_drops() {
        // Room for one growth (16 slots) only.
        let growth = Growth::new(16 * 24);
        let (p, mut c) = ring(8, &growth).unwrap();
        let stored = (0..40).filter(|&i| p.push(rec(i), 0).stored()).count();
        assert_eq!(stored, 8 + 16);
        assert_eq!(growth.chunks(), 1);
        assert_eq!(drain_all(&mut c), (0..24).collect::<Vec<_>>());
        // Drained: the grown chunk has room again, and no new growth is needed.
        assert!(p.push(rec(40), 0).stored());
        assert_eq!(drain_all(&mut c), vec![40]);
    }

    #[test]
    fn the_budget_is_used_up_in_smaller_chunks_before_a_drop() {
        // Room for 16 + 16 slots, not for the 32 a doubling asks next.
        let growth = Growth::new(32 * 24);
        let (p, mut c) = ring(8, &growth).unwrap();
        let stored = (0..60).filter(|&i| p.push(rec(i), 0).stored()).count();
        assert_eq!(stored, 8 + 16 + 16);
        assert_eq!(growth.chunks(), 2);
        assert_eq!(growth.peak_bytes(), 32 * 24);
        assert_eq!(drain_all(&mut c), (0..40).collect::<Vec<_>>());
    }

    #[test]
    fn two_rings_share_one_budget() {
        let growth = Growth::new(16 * 24);
        let (p1, _c1) = ring(8, &growth).unwrap();
        let (p2, _c2) = ring(8, &growth).unwrap();
        assert_eq!((0..9).filter(|&i| p1.push(rec(i), 0).stored()).count(), 9);
        // p1's growth took the whole budget: p2 stays at its first size.
        assert_eq!((0..20).filter(|&i| p2.push(rec(i), 0).stored()).count(), 8);
    }

    #[test]
    fn a_grown_ring_shrinks_back_once_drained() {
        let growth = Growth::new(1 << 20);
        let (p, mut c) = ring(16, &growth).unwrap();
        for i in 0..100 {
            assert!(p.push(rec(i), 0).stored());
        }
        assert_eq!(p.capacity(), 64); // 16 + 32 + 64
        assert_eq!(drain_all(&mut c).len(), 100);
        // The next quarter-chunk nudge sees the consumer caught up: the
        // producer goes on in a chunk of the first size, and the grown one
        // is freed once drained.
        let mut i = 100;
        while p.capacity() != 16 {
            assert!(p.push(rec(i), 0).stored());
            i += 1;
            assert!(i < 200, "never shrank");
        }
        assert_eq!(drain_all(&mut c), (100..i).collect::<Vec<_>>());
        assert_eq!(growth.held_bytes(), 0);
    }

    #[test]
    fn reserve_is_kept_in_a_grown_chunk() {
        let growth = Growth::new(1 << 20);
        let (p, _c) = ring(4, &growth).unwrap();
        // A reserve larger than the first chunk: the growth makes room for it.
        assert!(p.push(rec(0), 10).stored());
        assert!(p.capacity() >= 16);
    }

    #[test]
    fn concurrent_growth_loses_nothing_and_keeps_order() {
        let growth = Growth::new(64 << 20);
        let (p, mut c) = ring(64, &growth).unwrap();
        let n = 1_000_000u64;
        let t = std::thread::spawn(move || (0..n).filter(|&i| !p.push(rec(i), 0).stored()).count());
        let mut next = 0u64;
        let mut got = Vec::new();
        loop {
            let done = t.is_finished();
            got.clear();
            c.drain_into(&mut got);
            for x in &got {
                assert_eq!(x.ts, next, "out of order or lost");
                assert_eq!(x.value(), next as f64, "torn record");
                next += 1;
            }
            if done && c.is_empty() {
                break;
            }
            // A slow writer: the ring has to grow.
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        assert_eq!(t.join().unwrap(), 0);
        assert_eq!(next, n);
        assert!(growth.chunks() > 0);
        drop(c);
        assert_eq!(growth.held_bytes(), 0);
    }
}
