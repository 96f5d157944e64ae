//! Strict nesting against torch's `python_function` events.
//!
//! A fastprof span begins inside one Python C call (`span().__enter__`,
//! `Profiler.step()`) and ends inside another. With `with_stack=True`,
//! torch records those calls as `python_function` events on the same OS
//! thread (Kineto's `tid` is the `gettid()` id, as fastprof's is), so the
//! span begins inside one call and ends after it: a partial overlap of a
//! few hundred ns, which Perfetto resolves by dropping slices. torch's own
//! `record_function` annotations (`user_annotation`, `ProfilerStep#N`) have
//! the same shape (begin inside `_record_function_enter_new`, end inside
//! `__exit__` or the next `profile.step()`).
//!
//! The fix moves such an event's ends, never torch's calls:
//! * its begin to the end of the outermost call that contains the begin but
//!   not the end;
//! * its end to the end of the outermost call that contains the end but not
//!   the begin.
//!
//! Both move later, so a span that ends and the next that begins inside
//! one call (`Profiler.step()`) become adjacent, never overlapping, and a
//! parent and its child keep their order. One exception to "the outermost
//! call": the frames already on the stack when torch's tracer started (the
//! `<module>` frame, the training function) are written as starting at the
//! window's first timestamp, not when they were really called. A span that
//! began before a window and ends inside it cannot nest with those frames
//! as written; its begin is first moved to the window's start (then the
//! rule above applies), so its in-window part is kept rather than its end
//! being pushed to the end of the window.
//!
//! Memory: pass 1 keeps every `python_function` interval of the inputs (24
//! bytes each plus a parent index), so this index is bounded by the number
//! of `python_function` events in the torch windows, the one part of a
//! merge that is not constant-memory. Traces without `with_stack` have none.

use std::collections::HashMap;

/// One `python_function` event, input-relative ns, as pass 1 finds it.
#[derive(Debug, Clone, Copy)]
pub struct PyCall {
    pub pid: i64,
    pub tid: i64,
    pub start: i64,
    pub end: i64,
}

const NONE: u32 = u32::MAX;

/// The calls of one (rank, pid, tid) track, epoch ns.
#[derive(Default)]
struct Track {
    /// (start, end), sorted by start, outer first on ties.
    calls: Vec<(i64, i64)>,
    /// Index of the innermost call enclosing each call's start, or [`NONE`].
    parent: Vec<u32>,
    /// (first start, last end) of each torch window on this track.
    windows: Vec<(i64, i64)>,
}

impl Track {
    fn finish(&mut self) {
        self.calls
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        self.parent = Vec::with_capacity(self.calls.len());
        let mut stack: Vec<u32> = Vec::new();
        for (i, &(s, _)) in self.calls.iter().enumerate() {
            while stack.last().is_some_and(|&t| self.calls[t as usize].1 <= s) {
                stack.pop();
            }
            self.parent.push(stack.last().copied().unwrap_or(NONE));
            stack.push(i as u32);
        }
    }

    /// Calls whose start is at most `t` (or before `t` when `strict`),
    /// innermost first: the last such call and its ancestors.
    fn chain(&self, t: i64, strict: bool) -> impl Iterator<Item = (i64, i64)> + '_ {
        let n = self
            .calls
            .partition_point(|c| if strict { c.0 < t } else { c.0 <= t });
        let mut i = if n == 0 { NONE } else { (n - 1) as u32 };
        std::iter::from_fn(move || {
            if i == NONE {
                return None;
            }
            let c = self.calls[i as usize];
            i = self.parent[i as usize];
            Some(c)
        })
    }

    /// End of the outermost call holding `b` (start <= b < end) but not `e`.
    fn begin_only(&self, b: i64, e: i64) -> Option<i64> {
        self.chain(b, false)
            .filter(|&(s, end)| s <= b && b < end && end < e)
            .last()
            .map(|c| c.1)
    }

    /// End of the outermost call holding `e` (start < e <= end) but not `b`.
    fn end_only(&self, b: i64, e: i64) -> Option<i64> {
        self.chain(e, true)
            .filter(|&(s, end)| s < e && e <= end && s > b)
            .last()
            .map(|c| c.1)
    }
}

/// How one event was moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub begin: i64,
    pub end: i64,
    /// Its begin was before a torch window it ends in.
    pub clipped: bool,
}

/// Every track's calls, built once after pass 1.
#[derive(Default)]
pub struct NestIndex {
    tracks: HashMap<(u32, i64, i64), Track>,
}

impl NestIndex {
    /// Add one input's calls; `abs` turns its input-relative ns to epoch ns.
    pub fn add(&mut self, rank: u32, calls: Vec<PyCall>, abs: impl Fn(i64) -> i64) {
        let mut windows: HashMap<(i64, i64), (i64, i64)> = HashMap::new();
        for c in calls {
            let (s, e) = (abs(c.start), abs(c.end));
            let t = self.tracks.entry((rank, c.pid, c.tid)).or_default();
            t.calls.push((s, e));
            let w = windows.entry((c.pid, c.tid)).or_insert((s, e));
            w.0 = w.0.min(s);
            w.1 = w.1.max(e);
        }
        for ((pid, tid), w) in windows {
            if let Some(t) = self.tracks.get_mut(&(rank, pid, tid)) {
                t.windows.push(w);
            }
        }
    }

    /// Sort and link every track; call once, after the last [`Self::add`].
    pub fn finish(&mut self) {
        for t in self.tracks.values_mut() {
            t.finish();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tracks.is_empty()
    }

    /// Calls held, for the summary.
    pub fn calls(&self) -> usize {
        self.tracks.values().map(|t| t.calls.len()).sum()
    }

    /// Where the duration event `[b, e]` (epoch ns) of this track must go
    /// to nest with its calls; None when it already does.
    pub fn fix(&self, rank: u32, pid: i64, tid: i64, b: i64, e: i64) -> Option<Moved> {
        if e <= b {
            return None; // an instant-like slice nests wherever it falls
        }
        let t = self.tracks.get(&(rank, pid, tid))?;
        let (mut nb, mut ne) = (b, e);
        let mut clipped = false;
        for &(w0, w1) in &t.windows {
            if nb < w0 && w0 < ne && ne <= w1 {
                nb = w0;
                clipped = true;
            }
        }
        // Each move makes the event nest with more calls; a few rounds
        // settle calls that touch (one ends where the next begins).
        for _ in 0..8 {
            let mb = t.begin_only(nb, ne);
            let me = t.end_only(nb, ne);
            if mb.is_none() && me.is_none() {
                break;
            }
            if let Some(x) = mb {
                nb = x;
            }
            if let Some(x) = me {
                ne = x;
            }
        }
        (nb != b || ne != e).then_some(Moved {
            begin: nb,
            end: ne,
            clipped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(calls: &[(i64, i64)]) -> NestIndex {
        let mut ix = NestIndex::default();
        let calls = calls
            .iter()
            .map(|&(start, end)| PyCall {
                pid: 1,
                tid: 1,
                start,
                end,
            })
            .collect();
        ix.add(0, calls, |t| t);
        ix.finish();
        ix
    }

    /// Whether two intervals nest or are disjoint.
    fn nests(a: (i64, i64), b: (i64, i64)) -> bool {
        a.1 <= b.0 || b.1 <= a.0 || (a.0 <= b.0 && b.1 <= a.1) || (b.0 <= a.0 && a.1 <= b.1)
    }

    #[test]
    fn begin_and_end_move_to_the_ends_of_their_calls() {
        // module [0, 1000]; __enter__ [10, 20]; __exit__ [500, 510].
        let ix = index(&[(0, 1000), (10, 20), (500, 510)]);
        let m = ix.fix(0, 1, 1, 15, 505).unwrap();
        assert_eq!((m.begin, m.end, m.clipped), (20, 510, false));
        // Already nested: nothing to do; another track: nothing known.
        assert!(ix.fix(0, 1, 1, 25, 400).is_none());
        assert!(ix.fix(0, 1, 2, 15, 505).is_none());
        assert!(ix.fix(1, 1, 1, 15, 505).is_none());
    }

    #[test]
    fn spans_ending_and_beginning_in_one_call_become_adjacent() {
        // step() calls at [100, 130] and [300, 330], each with inner calls.
        let calls = [
            (0, 1000),
            (100, 130),
            (105, 110),
            (120, 125),
            (300, 330),
            (305, 310),
            (320, 325),
        ];
        let ix = index(&calls);
        let a = ix.fix(0, 1, 1, 50, 107).unwrap(); // ends in the first step()
        let b = ix.fix(0, 1, 1, 122, 308).unwrap(); // begins there, ends in the next
        assert_eq!((a.begin, a.end), (50, 130));
        assert_eq!((b.begin, b.end), (130, 330));
        for c in calls {
            assert!(nests((a.begin, a.end), c) && nests((b.begin, b.end), c));
        }
    }

    #[test]
    fn a_span_from_before_the_window_starts_with_it() {
        // The window's <module> frame [100, 1000] (really called earlier);
        // the span began at 50, ends inside a call [500, 510].
        let ix = index(&[(100, 1000), (100, 120), (500, 510)]);
        let m = ix.fix(0, 1, 1, 50, 505).unwrap();
        assert_eq!((m.begin, m.end, m.clipped), (120, 510, true));
        // A span around the whole window is left alone.
        assert!(ix.fix(0, 1, 1, 50, 2000).is_none());
        // One that begins inside and ends after the window begins at its end.
        assert_eq!(ix.fix(0, 1, 1, 700, 2000).unwrap().begin, 1000);
    }

    #[test]
    fn random_spans_always_nest_after_the_fix() {
        // A laminar family of calls and spans built from a seeded walk.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |n: i64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as i64
        };
        let mut calls = vec![(0, 100_000)];
        // Root twice: popping it ends the walk.
        let mut stack = vec![(0i64, 100_000i64), (0, 100_000)];
        let mut t = 1;
        while t < 99_000 && stack.len() > 1 {
            let (_, pe) = *stack.last().unwrap();
            if rnd(3) == 0 && stack.len() > 1 || t + 10 >= pe {
                let (_, end) = stack.pop().unwrap();
                t = t.max(end) + 1 + rnd(3);
                continue;
            }
            let len = 2 + rnd((pe - t - 1).clamp(2, 2000));
            let c = (t, (t + len).min(pe - 1));
            calls.push(c);
            stack.push(c);
            t += 1 + rnd(3);
        }
        let ix = index(&calls);
        for _ in 0..2000 {
            let b = rnd(100_000);
            let e = b + 1 + rnd(5000);
            let (nb, ne) = ix.fix(0, 1, 1, b, e).map_or((b, e), |m| (m.begin, m.end));
            assert!(nb >= b && ne >= e && nb < ne, "{b},{e} -> {nb},{ne}");
            for &c in &calls {
                assert!(nests((nb, ne), c), "{b},{e} -> {nb},{ne} vs {c:?}");
            }
        }
    }
}
