//! Process-wide state behind a pointer to a leaked value, so that a forked
//! child can abandon a value whose lock a vanished thread may hold and
//! install a fresh one (the registry's current session, the name table).

use std::sync::atomic::{AtomicPtr, Ordering};

/// The value behind `slot`, installing `make()` first if it is empty. Values
/// are leaked, never freed, so the reference lives for the whole process.
pub(crate) fn get_or_install<T>(slot: &AtomicPtr<T>, make: impl FnOnce() -> T) -> &'static T {
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: only leaked values are ever stored, so the pointer stays valid.
        return unsafe { &*p };
    }
    let fresh = Box::into_raw(Box::new(make()));
    match slot.compare_exchange(
        std::ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        // SAFETY: we just published `fresh`, which is leaked from here on.
        Ok(_) => unsafe { &*fresh },
        Err(existing) => {
            // SAFETY: `fresh` was never shared; `existing` is leaked.
            unsafe {
                drop(Box::from_raw(fresh));
                &*existing
            }
        }
    }
}
