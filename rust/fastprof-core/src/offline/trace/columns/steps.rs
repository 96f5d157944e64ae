//! Which training step each row falls in, from the step markers of the
//! traces read:
//!
//! * fastprof `step` spans (X events named `step`; the number from
//!   `args.step` or `args.batch`, else their order on the pid): `[ts, ts+dur)`;
//! * torch `ProfilerStep#N` spans: `[ts, ts+dur)`;
//! * `fastprof.step` counters (`args.value = N`, written by `mark_step(n)`):
//!   step N from that counter's ts up to the next such counter on the pid.
//!
//! A row takes the step of the marker covering its ts on its own (rank, pid);
//! a pid with no markers (a torch GPU stream, a DataLoader worker) takes the
//! markers of its whole rank; outside every step it gets -1. Where markers
//! nest (a `ProfilerStep#N` inside a `step` span), the innermost covering one
//! wins. Markers are sorted once per pid and each row is one hash lookup and
//! one binary search.

use std::collections::HashMap;

/// A marker as read, in epoch ns; `end` None for a `fastprof.step` counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Marker {
    pub rank: i32,
    pub pid: i64,
    pub start: i64,
    pub end: Option<i64>,
    pub number: i64,
}

/// `(start, end, number)`, sorted by start.
type Intervals = Vec<(i64, i64, i64)>;

pub(super) struct Index {
    by_pid: HashMap<(i32, i64), Intervals>,
    by_rank: HashMap<i32, Intervals>,
}

/// How many of the markers starting before a row are tried for one covering
/// it: enough for any real nesting, and a bound on the work per row.
const NESTING: usize = 8;

impl Index {
    pub fn new(markers: Vec<Marker>) -> Index {
        let mut groups: HashMap<(i32, i64), Vec<Marker>> = HashMap::new();
        for m in markers {
            groups.entry((m.rank, m.pid)).or_default().push(m);
        }
        let mut by_pid = HashMap::new();
        let mut by_rank: HashMap<i32, Intervals> = HashMap::new();
        for (key, mut ms) in groups {
            ms.sort_by_key(|m| m.start);
            // A counter's step lasts until the next counter of the pid.
            let mut next_counter = i64::MAX;
            let mut list: Intervals = Vec::with_capacity(ms.len());
            for m in ms.iter().rev() {
                let end = match m.end {
                    Some(e) => e,
                    None => std::mem::replace(&mut next_counter, m.start),
                };
                list.push((m.start, end, m.number));
            }
            list.reverse();
            by_rank.entry(key.0).or_default().extend(&list);
            by_pid.insert(key, list);
        }
        for list in by_rank.values_mut() {
            list.sort_unstable();
        }
        Index { by_pid, by_rank }
    }

    /// The step at `ts` on `pid` of `rank`, or -1.
    pub fn step(&self, rank: i32, pid: i64, ts: i64) -> i64 {
        let Some(list) = self
            .by_pid
            .get(&(rank, pid))
            .or_else(|| self.by_rank.get(&rank))
        else {
            return -1;
        };
        let before = list.partition_point(|m| m.0 <= ts);
        list[..before]
            .iter()
            .rev()
            .take(NESTING)
            .find(|m| ts < m.1)
            .map_or(-1, |m| m.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(pid: i64, start: i64, end: i64, number: i64) -> Marker {
        Marker {
            rank: 0,
            pid,
            start,
            end: Some(end),
            number,
        }
    }

    fn counter(pid: i64, start: i64, number: i64) -> Marker {
        Marker {
            rank: 0,
            pid,
            start,
            end: None,
            number,
        }
    }

    #[test]
    fn spans_are_half_open_and_gaps_are_outside() {
        let idx = Index::new(vec![span(1, 100, 200, 7), span(1, 250, 300, 8)]);
        let got: Vec<i64> = [99, 100, 199, 200, 249, 250, 299, 300]
            .iter()
            .map(|&t| idx.step(0, 1, t))
            .collect();
        assert_eq!(got, [-1, 7, 7, -1, -1, 8, 8, -1]);
    }

    #[test]
    fn counters_open_a_step_until_the_next_counter_of_their_pid() {
        // Out of order on purpose: markers are sorted, not trusted.
        let idx = Index::new(vec![
            counter(1, 500, 3),
            counter(1, 100, 2),
            counter(2, 300, 9),
        ]);
        assert_eq!(idx.step(0, 1, 99), -1);
        assert_eq!(idx.step(0, 1, 100), 2);
        assert_eq!(idx.step(0, 1, 499), 2);
        assert_eq!(idx.step(0, 1, 500), 3);
        assert_eq!(idx.step(0, 1, i64::MAX - 1), 3);
        assert_eq!(idx.step(0, 2, 400), 9, "pid 2 has its own");
    }

    #[test]
    fn innermost_nested_marker_wins_and_the_outer_one_covers_the_rest() {
        let idx = Index::new(vec![span(1, 0, 100, 5), span(1, 10, 90, 50)]);
        assert_eq!(idx.step(0, 1, 5), 5);
        assert_eq!(idx.step(0, 1, 50), 50);
        assert_eq!(idx.step(0, 1, 95), 5, "after the inner marker ended");
    }

    #[test]
    fn pids_without_markers_use_their_rank() {
        let mut m = span(1, 100, 200, 4);
        m.rank = 3;
        let idx = Index::new(vec![m, span(1, 100, 200, 9)]);
        assert_eq!(idx.step(3, 77, 150), 4, "a GPU stream of rank 3");
        assert_eq!(idx.step(0, 77, 150), 9);
        assert_eq!(idx.step(5, 1, 150), -1, "rank 5 has no markers");
        assert_eq!(Index::new(Vec::new()).step(0, 1, 0), -1);
    }
}
