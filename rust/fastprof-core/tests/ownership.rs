//! Records own their extras: nothing leaks and nothing is freed twice, through
//! pushes, drains, full rings and rings dropped with records still inside.
//! A counting global allocator sees every allocation of this test binary.

use fastprof_core::record::{Extra, Kind, Record};
use fastprof_core::ring::ring;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::SeqCst);
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::SeqCst);
        System.dealloc(p, l)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Tests in this binary share the counter: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn extra(i: u64) -> Box<Extra> {
    Box::new(Extra {
        name: Some(format!("name-{i}").into()),
        args_json: Some(format!("{{\"i\":{i}}}").into()),
    })
}

fn live() -> isize {
    LIVE.load(Ordering::SeqCst)
}

#[test]
fn every_path_frees_each_extra_exactly_once() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::with_capacity(64);
    let before = live();
    {
        let (p, mut c) = ring(16).unwrap();
        // Pushed then drained and consumed.
        for i in 0..8 {
            p.push(Record::with_extra(Kind::Begin, 0, i, extra(i)), 0)
                .unwrap();
        }
        c.drain_into(&mut out);
        for mut r in out.drain(..) {
            let x = r.take_extra().expect("extra travels with the record");
            assert!(x.name.is_some());
        }
        // Pushed, drained, and dropped without looking.
        for i in 0..8 {
            p.push(Record::with_extra(Kind::Instant, 0, i, extra(i)), 0)
                .unwrap();
        }
        c.drain_into(&mut out);
        out.clear();
        // Rejected by a full ring: handed back, dropped by the caller.
        for i in 0..16 {
            p.push(Record::with_extra(Kind::Instant, 0, i, extra(i)), 0)
                .unwrap();
        }
        let back = p
            .push(Record::with_extra(Kind::Instant, 0, 99, extra(99)), 0)
            .unwrap_err();
        drop(back);
        // 16 records with extras are still in the ring when both halves drop.
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
    assert!(ring(1 << 60).is_err());
    assert_eq!(live(), before);
}
