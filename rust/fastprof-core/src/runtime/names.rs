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
/// move the table onto a fresh lock (see `prepare_fork`).
static TABLE: AtomicPtr<RwLock<Table>> = AtomicPtr::new(std::ptr::null_mut());

fn table() -> &'static RwLock<Table> {
    crate::runtime::leaked::get_or_install(&TABLE, || RwLock::new(Table::default()))
}

// Fork: `prepare_fork` (in the forking thread, before fork) takes the
// table's write lock, so no other thread is half-way through interning when
// the address space is copied; the parent releases it again, the child copies
// the (consistent) table onto a fresh lock and forgets the held one. Before
// this, a child forked while the sampler interned a metric could find the
// lock taken and start with an empty table, so new ids collided with names
// the Python side had cached.
thread_local! {
    static FORK_GUARD: std::cell::RefCell<Option<std::sync::RwLockWriteGuard<'static, Table>>> =
        const { std::cell::RefCell::new(None) };
}

/// Before fork: hold the table still.
pub(crate) fn prepare_fork() {
    let g = table().write().unwrap_or_else(|e| e.into_inner());
    FORK_GUARD.with(|f| *f.borrow_mut() = Some(g));
}

/// After fork, in the parent: let go.
pub(crate) fn parent_after_fork() {
    FORK_GUARD.with(|f| drop(f.borrow_mut().take()));
}

/// After fork, in the child: the same ids, on a lock no vanished thread holds.
pub(crate) fn child_after_fork() {
    let copy = FORK_GUARD.with(|f| {
        f.borrow_mut().take().map(|g| {
            let t = g.clone();
            // The old lock is abandoned with the old table (both leaked).
            std::mem::forget(g);
            t
        })
    });
    if let Some(t) = copy {
        TABLE.store(Box::into_raw(Box::new(RwLock::new(t))), Ordering::Release);
    }
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
