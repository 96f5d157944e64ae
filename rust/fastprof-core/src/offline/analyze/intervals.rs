//! Half-open `[start, end)` interval lists in ns: union, clipping,
//! intersection, subtraction and lengths. A "set" here is sorted by start,
//! with disjoint, non-empty, non-touching intervals (what [`union`] returns).

pub(crate) type Iv = (i64, i64);

/// The union of `ivs` as a set (empty intervals dropped), merged in place
/// in `ivs`'s own allocation.
pub(crate) fn union(mut ivs: Vec<Iv>) -> Vec<Iv> {
    ivs.retain(|&(s, e)| e > s);
    ivs.sort_unstable();
    let mut w = 0;
    for r in 0..ivs.len() {
        let (s, e) = ivs[r];
        if w > 0 && s <= ivs[w - 1].1 {
            ivs[w - 1].1 = ivs[w - 1].1.max(e);
        } else {
            ivs[w] = (s, e);
            w += 1;
        }
    }
    ivs.truncate(w);
    ivs.shrink_to_fit();
    ivs
}

/// The part of the set `set` inside `[s, e)`.
pub(crate) fn clip(set: &[Iv], s: i64, e: i64) -> Vec<Iv> {
    let from = set.partition_point(|iv| iv.1 <= s);
    set[from..]
        .iter()
        .take_while(|iv| iv.0 < e)
        .map(|&(a, b)| (a.max(s), b.min(e)))
        .filter(|iv| iv.1 > iv.0)
        .collect()
}

/// Intersection of two sets.
pub(crate) fn intersect(a: &[Iv], b: &[Iv]) -> Vec<Iv> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if e > s {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// `a` minus `b`, both sets.
pub(crate) fn subtract(a: &[Iv], b: &[Iv]) -> Vec<Iv> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(s, e) in a {
        let mut cur = s;
        while j < b.len() && b[j].1 <= cur {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            if b[k].0 > cur {
                out.push((cur, b[k].0));
            }
            cur = cur.max(b[k].1);
            k += 1;
        }
        if cur < e {
            out.push((cur, e));
        }
    }
    out
}

/// Total length of a set.
pub(crate) fn len(set: &[Iv]) -> i64 {
    set.iter().map(|iv| iv.1 - iv.0).sum()
}

/// Length of `[a, b)` ∩ `[s, e)`.
pub(crate) fn overlap(a: i64, b: i64, s: i64, e: i64) -> i64 {
    (b.min(e) - a.max(s)).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_merges_overlapping_and_touching() {
        let u = union(vec![(5, 7), (0, 2), (1, 3), (3, 4), (9, 9)]);
        assert_eq!(u, [(0, 4), (5, 7)]);
        assert_eq!(len(&u), 6);
    }

    #[test]
    fn clip_intersect_subtract() {
        let a = [(0, 10), (20, 30)];
        assert_eq!(clip(&a, 5, 25), [(5, 10), (20, 25)]);
        assert_eq!(clip(&a, 10, 20), Vec::<Iv>::new());
        let b = [(2, 4), (8, 22), (29, 40)];
        assert_eq!(intersect(&a, &b), [(2, 4), (8, 10), (20, 22), (29, 30)]);
        assert_eq!(subtract(&a, &b), [(0, 2), (4, 8), (22, 29)]);
        assert_eq!(subtract(&a, &[]), a);
        assert_eq!(overlap(0, 10, 5, 20), 5);
        assert_eq!(overlap(0, 10, 10, 20), 0);
    }
}
