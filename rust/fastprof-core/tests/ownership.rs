//! Records own their extras: nothing leaks and nothing is freed twice, through
//! pushes, drains, full rings and rings dropped with records still inside.
//! A counting global allocator counts every allocation and free made by the
//! test's own thread (the harness's threads allocate too, concurrently).

use fastprof_core::runtime::record::{Extra, Kind, Record};
use fastprof_core::runtime::ring::{ring, Growth};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Mutex;

struct Counting;

thread_local! {
    // Const-initialised and without a destructor: using it never allocates.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|c| c.set(c.get() + l.size() as isize));
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let _ = LIVE.try_with(|c| c.set(c.get() - l.size() as isize));
        System.dealloc(p, l)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// One at a time, so that neither test's harness output lands in the other's count.
static SERIAL: Mutex<()> = Mutex::new(());

fn extra(i: u64) -> Box<Extra> {
    Box::new(Extra {
        name: Some(format!("name-{i}").into()),
        args_json: Some(format!("{{\"i\":{i}}}").into()),
        ..Default::default()
    })
}

fn live() -> isize {
    LIVE.with(Cell::get)
}

#[test]
fn every_path_frees_each_extra_exactly_once() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::with_capacity(64);
    let before = live();
    {
        let (p, mut c) = ring(16, &Growth::new(0)).unwrap();
        // Pushed then drained and consumed.
        for i in 0..8 {
            assert!(p
                .push(Record::with_extra(Kind::Begin, 0, i, extra(i)), 0)
                .stored());
        }
        c.drain_into(&mut out);
        for mut r in out.drain(..) {
            let x = r.take_extra().expect("extra travels with the record");
            assert!(x.name.is_some());
        }
        // Pushed, drained, and dropped without looking.
        for i in 0..8 {
            assert!(p
                .push(Record::with_extra(Kind::Instant, 0, i, extra(i)), 0)
                .stored());
        }
        c.drain_into(&mut out);
        out.clear();
        // Rejected by a full ring: dropped there, its extra freed.
        for i in 0..16 {
            assert!(p
                .push(Record::with_extra(Kind::Instant, 0, i, extra(i)), 0)
                .stored());
        }
        let full = p.push(Record::with_extra(Kind::Instant, 0, 99, extra(99)), 0);
        assert!(!full.stored());
        // 16 records with extras are still in the ring when both halves drop.
    }
    {
        // A grown ring: records left in two chunks, one half-drained.
        let (p, mut c) = ring(16, &Growth::new(1 << 20)).unwrap();
        for i in 0..40 {
            assert!(p
                .push(Record::with_extra(Kind::Instant, 0, i, extra(i)), 0)
                .stored());
        }
        let mut some = Vec::new();
        c.drain_upto(&mut some, 10);
        assert_eq!(some.len(), 10);
        drop(some);
        drop(c); // the consumer first: the producer's newest chunk outlives it
        drop(p);
    }
    assert_eq!(
        live(),
        before,
        "bytes leaked (or freed twice) across the ring's life"
    );
}

#[test]
fn a_failed_ring_allocation_leaves_nothing_behind() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = live();
    assert!(ring(1 << 60, &Growth::new(0)).is_err());
    assert_eq!(live(), before);
}
