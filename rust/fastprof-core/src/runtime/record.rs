//! The fixed-size record that travels through a thread's ring, and the
//! heap-allocated extras that only the slow paths (args, counter mappings,
//! names past the interner's limit) attach to it.
//!
//! A record may own a `Box<Extra>` (its pointer travels in `payload`). The
//! type is therefore neither `Copy` nor `Clone`, its payload is private, and
//! `Drop` frees an extra it still owns: a record moved into a ring and out
//! again is consumed exactly once, a record that could not be pushed frees its
//! extra when it goes out of scope, and a ring dropped with records still in it
//! frees theirs. Double frees and leaks are not representable by safe code.

/// Most heap bytes of args and names (the slow path's payloads) a session
/// holds in its rings at once. Slots bound the records in flight, not their
/// payloads: without this, instants with 10 KB of args filled the default
/// rings with 0.7-0.9 GB. Past it, such events are dropped and counted
/// (`drops.payload_events`) until the writer catches up.
pub const MAX_PAYLOAD_IN_FLIGHT: u64 = 64 << 20;

/// What a record means.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A span opens on this thread.
    Begin = 1,
    /// The innermost open span of this thread closes.
    End = 2,
    /// A point in time.
    Instant = 3,
    /// A counter sample; the value is [`Record::value`] unless it carries an extra.
    Counter = 4,
    /// An async span opens (a coroutine's body starts); always carries an
    /// extra holding its key (`Extra::async_id`, the asyncio task).
    AsyncBegin = 5,
    /// The innermost open async span of the same key closes.
    AsyncEnd = 6,
    /// Not an event: the context of this thread's following step spans
    /// ([`FLAG_STEP`]): the epoch in `ts`, the epoch's first global step in
    /// the payload, the action's interned name id in `name`. Sent when it
    /// changes, so that a step's args cost the training thread no heap.
    StepContext = 7,
}

/// `flags` bit: `payload` is a `Box<Extra>` pointer owned by this record.
const FLAG_EXTRA: u8 = 1;
/// `flags` bit on an `End`: the span's body raised an exception.
pub const FLAG_EXCEPTION: u8 = 2;
/// `flags` bit on a `Begin`: a training step's span; the payload is its
/// global step, and its args are written by the writer thread from the
/// thread's last [`Kind::StepContext`].
pub const FLAG_STEP: u8 = 4;

/// 24 bytes; rings move these by value.
#[repr(C)]
#[derive(Debug)]
pub struct Record {
    /// Ticks ([`crate::runtime::clock::ticks`]); the writer converts them to CLOCK_MONOTONIC ns.
    pub ts: u64,
    /// f64 bits of a counter value, or a `Box<Extra>` pointer (when `FLAG_EXTRA`).
    payload: u64,
    /// Interned name id ([`crate::runtime::names`]); [`NAME_IN_EXTRA`] when the name travels in the extra.
    pub name: u32,
    kind: u8,
    flags: u8,
    _pad: u16,
}

/// Name id meaning "the name is in `Extra::name`".
pub const NAME_IN_EXTRA: u32 = u32::MAX;

/// Slow-path data carried by a record.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Extra {
    /// The name, when it was not interned.
    pub name: Option<Box<str>>,
    /// A ready-to-write JSON object (`{"k":v,...}`) for the event's `args`.
    pub args_json: Option<Box<str>>,
    /// The key of an async span (which asyncio task it belongs to).
    pub async_id: u64,
}

// SAFETY: the only non-plain data is an owned `Box<Extra>`, which is Send.
unsafe impl Send for Record {}

impl Extra {
    /// Heap bytes this extra holds (itself, its name and its args).
    pub fn bytes(&self) -> u64 {
        (std::mem::size_of::<Extra>()
            + self.name.as_ref().map_or(0, |n| n.len())
            + self.args_json.as_ref().map_or(0, |a| a.len())) as u64
    }
}

impl Record {
    /// A record without an extra; `flags` may carry [`FLAG_EXCEPTION`].
    #[inline(always)]
    pub fn new(kind: Kind, name: u32, ts: u64, flags: u8) -> Record {
        Record {
            ts,
            payload: 0,
            name,
            kind: kind as u8,
            flags: flags & !FLAG_EXTRA,
            _pad: 0,
        }
    }

    /// A counter sample of one value.
    #[inline(always)]
    pub fn counter(name: u32, ts: u64, value: f64) -> Record {
        Record {
            ts,
            payload: value.to_bits(),
            name,
            kind: Kind::Counter as u8,
            flags: 0,
            _pad: 0,
        }
    }

    /// A training step's Begin (see [`FLAG_STEP`]).
    #[inline(always)]
    pub fn step_begin(name: u32, ts: u64, batch: u64) -> Record {
        Record {
            ts,
            payload: batch,
            name,
            kind: Kind::Begin as u8,
            flags: FLAG_STEP,
            _pad: 0,
        }
    }

    /// The context of the following step spans (see [`Kind::StepContext`]).
    pub fn step_context(epoch: u64, first_batch: u64, action: u32) -> Record {
        Record {
            ts: epoch,
            payload: first_batch,
            name: action,
            kind: Kind::StepContext as u8,
            flags: 0,
            _pad: 0,
        }
    }

    /// The payload of a record without an extra (a step's global step, a
    /// step context's first step); 0 for one with an extra.
    pub fn plain_payload(&self) -> u64 {
        if self.has_extra() {
            0
        } else {
            self.payload
        }
    }

    /// A record owning `extra`.
    pub fn with_extra(kind: Kind, name: u32, ts: u64, extra: Box<Extra>) -> Record {
        Record {
            ts,
            payload: Box::into_raw(extra) as u64,
            name,
            kind: kind as u8,
            flags: FLAG_EXTRA,
            _pad: 0,
        }
    }

    pub fn kind(&self) -> Kind {
        match self.kind {
            1 => Kind::Begin,
            2 => Kind::End,
            3 => Kind::Instant,
            5 => Kind::AsyncBegin,
            6 => Kind::AsyncEnd,
            7 => Kind::StepContext,
            _ => Kind::Counter,
        }
    }

    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// True when the record owns an extra (the slow path).
    #[inline(always)]
    pub fn has_extra(&self) -> bool {
        self.flags & FLAG_EXTRA != 0
    }

    /// Heap bytes owned through the extra (0 without one).
    pub fn extra_bytes(&self) -> u64 {
        if !self.has_extra() {
            return 0;
        }
        // SAFETY: FLAG_EXTRA means `payload` is a live `Box<Extra>` this
        // record owns; reading it through a shared reference is fine.
        unsafe { &*(self.payload as *const Extra) }.bytes()
    }

    /// The counter value (meaningless for other kinds, and 0 when the record
    /// carries an extra).
    pub fn value(&self) -> f64 {
        if self.flags & FLAG_EXTRA != 0 {
            0.0
        } else {
            f64::from_bits(self.payload)
        }
    }

    /// Move this record into `dst` field by field. One 24-byte copy through
    /// the stack made the compiler re-read two 8-byte stores as one 16-byte
    /// load, a failed store-to-load forward that tripled a ring push.
    ///
    /// # Safety
    /// `dst` must be valid for writes and properly aligned; whatever it held
    /// is overwritten without being dropped.
    #[inline(always)]
    pub(crate) unsafe fn write_into(self, dst: *mut Record) {
        let me = std::mem::ManuallyDrop::new(self);
        std::ptr::addr_of_mut!((*dst).ts).write(me.ts);
        std::ptr::addr_of_mut!((*dst).payload).write(me.payload);
        std::ptr::addr_of_mut!((*dst).name).write(me.name);
        std::ptr::addr_of_mut!((*dst).kind).write(me.kind);
        std::ptr::addr_of_mut!((*dst).flags).write(me.flags);
        std::ptr::addr_of_mut!((*dst)._pad).write(0);
    }

    /// Take the extra out of this record, if it carries one; the record no
    /// longer owns it afterwards.
    pub fn take_extra(&mut self) -> Option<Box<Extra>> {
        if self.flags & FLAG_EXTRA == 0 {
            return None;
        }
        self.flags &= !FLAG_EXTRA;
        let p = std::mem::replace(&mut self.payload, 0) as *mut Extra;
        // SAFETY: FLAG_EXTRA was set only by `with_extra`, whose pointer came
        // from `Box::into_raw`; clearing the flag first makes this the one
        // place that turns it back into a Box.
        Some(unsafe { Box::from_raw(p) })
    }
}

impl Drop for Record {
    #[inline]
    fn drop(&mut self) {
        if self.flags & FLAG_EXTRA != 0 {
            drop(self.take_extra());
        }
    }
}

const _: () = assert!(std::mem::size_of::<Record>() == 24);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_is_taken_once_and_freed_on_drop() {
        let x = Box::new(Extra {
            name: Some("n".into()),
            args_json: Some("{\"a\":1}".into()),
            ..Default::default()
        });
        let mut r = Record::with_extra(Kind::Instant, NAME_IN_EXTRA, 5, x);
        assert_eq!(r.value(), 0.0);
        let got = r.take_extra().unwrap();
        assert_eq!(got.name.as_deref(), Some("n"));
        assert!(r.take_extra().is_none(), "taken twice");
        drop(r); // must not free again (tests/ownership.rs counts allocations)
    }

    #[test]
    fn counter_value_roundtrips() {
        let r = Record::counter(3, 9, -2.5);
        assert_eq!(r.kind(), Kind::Counter);
        assert_eq!(r.value(), -2.5);
        assert_eq!(
            Record::new(Kind::End, 0, 1, FLAG_EXCEPTION).flags(),
            FLAG_EXCEPTION
        );
    }
}
