//! The process-wide name interner. A span name is interned once (the Python
//! binding caches the id per `str` object), after which records carry a
//! 4-byte id and the writer formats each name's escaped JSON once.
//!
//! Ids are never reused and survive recorder restarts. The table is bounded:
//! past [`MAX_NAMES`] new names are not interned and travel with their record
//! on the slow path instead, so a script that makes a fresh name per step
//! (`f"step {i}"`) cannot grow memory without bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, RwLock};

/// Most names the interner keeps.
pub const MAX_NAMES: usize = 100_000;

#[derive(Default, Clone)]
struct Table {
    by_id: Vec<Arc<str>>,
    by_name: HashMap<Arc<str>, u32>,
}

/// Behind a pointer (leaked tables, never freed) so that a forked child can
/// replace a table whose lock a vanished thread may hold.
static TABLE: AtomicPtr<RwLock<Table>> = AtomicPtr::new(std::ptr::null_mut());

fn table() -> &'static RwLock<Table> {
    let p = TABLE.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: tables are leaked, so the pointer stays valid forever.
        return unsafe { &*p };
    }
    install(Table::default(), std::ptr::null_mut())
}

fn install(t: Table, expected: *mut RwLock<Table>) -> &'static RwLock<Table> {
    let fresh = Box::into_raw(Box::new(RwLock::new(t)));
    match TABLE.compare_exchange(expected, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `fresh` is leaked from here on.
        Ok(_) => unsafe { &*fresh },
        Err(existing) => {
            // SAFETY: `fresh` was never published; `existing` is leaked.
            unsafe {
                drop(Box::from_raw(fresh));
                &*existing
            }
        }
    }
}

/// In a forked child: keep the ids the parent handed out (the Python side
/// caches them) but on a lock no vanished thread can hold. The parent only
/// ever writes the table while holding the GIL, which the forking thread
/// holds, so a read succeeds unless a non-Python thread was interning; then
/// the child starts with an empty table and un-interned names take the slow
/// path (`get` of an unknown id falls back to a placeholder in the writer).
pub fn after_fork_in_child() {
    let p = TABLE.load(Ordering::Acquire);
    if p.is_null() {
        return;
    }
    // SAFETY: leaked table, valid forever.
    let copy = unsafe { &*p }
        .try_read()
        .map(|t| t.clone())
        .unwrap_or_default();
    TABLE.store(
        Box::into_raw(Box::new(RwLock::new(copy))),
        Ordering::Release,
    );
}

/// The id of `name`, interning it if needed; `None` once the table is full.
pub fn intern(name: &str) -> Option<u32> {
    if let Some(&id) = table()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .by_name
        .get(name)
    {
        return Some(id);
    }
    let mut t = table().write().unwrap_or_else(|e| e.into_inner());
    if let Some(&id) = t.by_name.get(name) {
        return Some(id);
    }
    if t.by_id.len() >= MAX_NAMES {
        return None;
    }
    let id = t.by_id.len() as u32;
    let s: Arc<str> = Arc::from(name);
    t.by_id.push(s.clone());
    t.by_name.insert(s, id);
    Some(id)
}

/// The name of `id`.
pub fn get(id: u32) -> Option<Arc<str>> {
    table()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .by_id
        .get(id as usize)
        .cloned()
}

/// Names with ids `from..`, for the writer's cache.
pub fn since(from: usize) -> Vec<Arc<str>> {
    let t = table().read().unwrap_or_else(|e| e.into_inner());
    t.by_id.get(from..).map(|s| s.to_vec()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_same_id() {
        let a = intern("names-test-a").unwrap();
        let b = intern("names-test-b").unwrap();
        assert_ne!(a, b);
        assert_eq!(intern("names-test-a"), Some(a));
        assert_eq!(&*get(b).unwrap(), "names-test-b");
        assert!(since(0).len() > b as usize);
    }
}
