//! The fixed-size record that travels through a thread's ring, and the
//! heap-allocated extras that only the slow paths (args, counter mappings,
//! names past the interner's limit) attach to it.

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
    /// A counter sample; `payload` holds the f64 bits unless `EXTRA` is set.
    Counter = 4,
}

/// `flags` bit: `payload` is a `Box<Extra>` pointer whose ownership travels
/// with the record (the consumer frees it; a dropped record frees it at once).
pub const FLAG_EXTRA: u8 = 1;
/// `flags` bit on an `End`: the span's body raised an exception.
pub const FLAG_EXCEPTION: u8 = 2;

/// 24 bytes; the ring copies these by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// Ticks ([`crate::clock::ticks`]); the writer converts them to CLOCK_MONOTONIC ns.
    pub ts: u64,
    /// f64 bits of a counter value, or a `Box<Extra>` pointer (see [`FLAG_EXTRA`]).
    pub payload: u64,
    /// Interned name id ([`crate::names`]); [`NAME_IN_EXTRA`] when the name travels in the extra.
    pub name: u32,
    pub kind: u8,
    pub flags: u8,
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
}

impl Record {
    #[inline(always)]
    pub fn new(kind: Kind, name: u32, ts: u64, payload: u64, flags: u8) -> Record {
        Record {
            ts,
            payload,
            name,
            kind: kind as u8,
            flags,
            _pad: 0,
        }
    }

    /// A record owning `extra`.
    pub fn with_extra(kind: Kind, name: u32, ts: u64, extra: Box<Extra>) -> Record {
        Record::new(kind, name, ts, Box::into_raw(extra) as u64, FLAG_EXTRA)
    }

    pub fn kind(&self) -> Kind {
        match self.kind {
            1 => Kind::Begin,
            2 => Kind::End,
            3 => Kind::Instant,
            _ => Kind::Counter,
        }
    }

    /// Take ownership of the extra, if this record carries one.
    ///
    /// # Safety
    /// Must be called at most once per pushed record (the consumer, or the
    /// producer for a record it failed to push).
    pub unsafe fn take_extra(&self) -> Option<Box<Extra>> {
        if self.flags & FLAG_EXTRA != 0 {
            Some(Box::from_raw(self.payload as *mut Extra))
        } else {
            None
        }
    }
}

const _: () = assert!(std::mem::size_of::<Record>() == 24);
