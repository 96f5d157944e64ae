//! Pass 2's per-event work: rewrite one event's raw bytes for the merged
//! timeline (pid, ts, flow/async ids, and ts/dur of the duration events
//! [`super::nest`] moves) or say why it is left out (window, categories,
//! byte budget, not readable, or process/thread metadata that
//! [`super::names`] writes once instead). Only numbers and
//! strings this module formats are spliced into events the scanner has
//! already checked against the JSON grammar, so the output stays JSON.

use super::nest::NestIndex;
use super::plan::{InputInfo, Kind};
use crate::json;
use crate::offline::trace::scan::{self, Fields};
use std::collections::HashMap;
use std::ops::Range;

/// What rewriting one input's events needs to know.
pub(super) struct Ctx<'a> {
    pub(super) info: &'a InputInfo,
    pub(super) rank: u32,
    /// Added to numeric flow / async ids so they never join across inputs.
    pub(super) id_offset: i64,
    /// This rank's original pid (raw JSON bytes) -> merged pid.
    pub(super) pids: Option<&'a HashMap<Vec<u8>, i64>>,
    pub(super) out_base: i64,
    /// Epoch-ns window for this input's rank (a step window is per rank).
    pub(super) window: Option<(i64, i64)>,
    /// torch's python_function calls, when there are any.
    pub(super) nest: Option<&'a NestIndex>,
    pub(super) include: &'a [String],
    pub(super) exclude: &'a [String],
    pub(super) dropped: &'a [String],
}

/// What became of one input's events.
#[derive(Default)]
pub(super) struct Counts {
    pub(super) out: u64,
    /// Of `out`, events other than metadata (`ph` "M").
    pub(super) data: u64,
    /// Events that are not valid JSON, dropped.
    pub(super) invalid: u64,
    /// The last such event, until the caller names it: (its length, where
    /// in it and why). Only the scanner knows where the event ended.
    pub(super) pending: Option<(usize, usize, &'static str)>,
    /// One line per dropped event (up to [`MAX_INVALID_WARNINGS`]), naming
    /// the file and byte offset.
    pub(super) warnings: Vec<String>,
    pub(super) replaced: u64,
    pub(super) utf8_fixed: u64,
    pub(super) window: u64,
    pub(super) category: u64,
    pub(super) max_bytes: u64,
    pub(super) nest_moved: u64,
    pub(super) nest_clipped: u64,
}

/// Invalid events named one by one per input; later ones are counted.
pub(super) const MAX_INVALID_WARNINGS: u64 = 64;

impl Counts {
    /// Name the invalid event just met, now that `end` (the scanner's offset
    /// just past it) is known.
    pub(super) fn name_pending(&mut self, path: &std::path::Path, end: u64) {
        if let Some((len, off, why)) = self.pending.take() {
            if self.invalid <= MAX_INVALID_WARNINGS {
                let at = end - len as u64;
                self.warnings.push(format!(
                    "{}: dropped the malformed event at byte {at} ({why} at byte {})",
                    path.display(),
                    at + off as u64
                ));
            }
        }
    }
}

/// Whether one of an event's comma-separated categories is in `set`; no
/// allocation, and nothing to do when the set is empty (the usual case).
fn any_cat_in(cats: &[u8], set: &[String]) -> bool {
    !set.is_empty()
        && cats
            .split(|&b| b == b',')
            .any(|c| set.iter().any(|s| s.as_bytes() == c.trim_ascii()))
}

/// Rewrite one event into `out` (prefixed by `,\n`), or count why it was left out.
/// Invalid UTF-8 (torch writes such names with `with_stack`) is replaced by
/// U+FFFD so the output is always strict JSON.
pub(super) fn rewrite(raw: &[u8], ctx: &Ctx<'_>, counts: &mut Counts, out: &mut Vec<u8>) {
    if std::str::from_utf8(raw).is_err() {
        let fixed = String::from_utf8_lossy(raw).into_owned();
        counts.utf8_fixed += 1;
        return rewrite_valid(fixed.as_bytes(), ctx, counts, out);
    }
    rewrite_valid(raw, ctx, counts, out)
}

fn rewrite_valid(raw: &[u8], ctx: &Ctx<'_>, counts: &mut Counts, out: &mut Vec<u8>) {
    let f = match Fields::parse_checked(raw) {
        Ok(f) => f,
        // Not valid JSON: never copied through, one such event would make
        // the whole output unreadable.
        Err((off, why)) => {
            counts.invalid += 1;
            counts.pending = Some((raw.len(), off, why));
            return;
        }
    };
    let ph =
        f.ph.clone()
            .and_then(|r| scan::str_value(&raw[r]))
            .unwrap_or(b"");
    let name = f
        .name
        .clone()
        .and_then(|r| scan::str_value(&raw[r]))
        .unwrap_or(b"");
    let meta = ph == b"M";
    if meta
        && matches!(
            name,
            b"process_sort_index" | b"process_name" | b"thread_name"
        )
    {
        counts.replaced += 1; // ours, one per pid / thread in rank order, are written instead
        return;
    }
    if !meta {
        let cats = f
            .cat
            .clone()
            .and_then(|r| scan::str_value(&raw[r]))
            .unwrap_or(b"");
        if any_cat_in(cats, ctx.dropped) {
            counts.max_bytes += 1;
            return;
        }
        if (!ctx.include.is_empty() && !any_cat_in(cats, ctx.include))
            || any_cat_in(cats, ctx.exclude)
        {
            counts.category += 1;
            return;
        }
    }
    let ts = f.ts_ns(raw);
    if let (false, Some((w0, w1)), Some(t)) = (meta, ctx.window, ts) {
        let start = ctx.info.abs(t);
        let dur = f.dur_ns(raw);
        // Overlap, not mere contact: a span ending where the window begins
        // (the previous step) is outside; an instant on the edge is inside.
        let outside = if dur > 0 {
            start + dur <= w0 || start >= w1
        } else {
            start < w0 || start > w1
        };
        if outside {
            counts.window += 1;
            return;
        }
    }
    let mut reps: Vec<(Range<usize>, Vec<u8>)> = Vec::with_capacity(4);
    if let Some(r) = f.pid.clone() {
        if let Some(&p) = ctx.pids.and_then(|m| m.get(&raw[r.clone()])) {
            let mut v = Vec::new();
            json::write_int(&mut v, p);
            reps.push((r, v));
        }
    }
    if let (Some(r), Some(t)) = (f.ts.clone(), ts) {
        let mut v = Vec::new();
        json::write_us(&mut v, ctx.info.abs(t) - ctx.out_base);
        reps.push((r, v));
    }
    let flowish = matches!(
        ph,
        b"s" | b"t" | b"f" | b"b" | b"e" | b"n" | b"S" | b"T" | b"F" | b"O" | b"N" | b"D"
    );
    for r in [if flowish { f.id.clone() } else { None }, f.bind_id.clone()]
        .into_iter()
        .flatten()
    {
        let v = match scan::parse_int(&raw[r.clone()]) {
            Some(id) => {
                let mut v = Vec::new();
                json::write_int(&mut v, id.wrapping_add(ctx.id_offset));
                v
            }
            None => match scan::str_value(&raw[r.clone()]) {
                // A string id: its text (escapes and all) goes into a new string.
                Some(inner) => {
                    let mut v = format!("\"r{}:", ctx.id_offset >> 40).into_bytes();
                    v.extend_from_slice(inner);
                    v.push(b'"');
                    v
                }
                // Anything else (a float, an object): its JSON text, as a string.
                None => {
                    let text = String::from_utf8_lossy(&raw[r.clone()]);
                    let mut v = Vec::new();
                    json::write_str(&mut v, &format!("r{}:{text}", ctx.id_offset >> 40));
                    v
                }
            },
        };
        reps.push((r, v));
    }
    if let (Some(nest), true, Some(t), Some(d)) = (ctx.nest, ph == b"X", ts, f.dur.clone()) {
        // fastprof's spans, and torch's own annotations (`record_function`,
        // `ProfilerStep#N`), move to nest with the python calls they straddle.
        let movable = ctx.info.kind == Kind::Fastprof
            || f.cat
                .clone()
                .and_then(|r| scan::str_value(&raw[r]))
                .is_some_and(|c| c == b"user_annotation");
        let int = |r: Option<Range<usize>>| r.and_then(|r| scan::parse_int(&raw[r]));
        let dur = scan::parse_us_to_ns(&raw[d.clone()]);
        if let (true, Some(pid), Some(tid), Some(dur)) =
            (movable, int(f.pid.clone()), int(f.tid.clone()), dur)
        {
            let b = ctx.info.abs(t);
            if let Some(m) = nest.fix(ctx.rank, pid, tid, b, b.saturating_add(dur)) {
                counts.nest_moved += 1;
                counts.nest_clipped += u64::from(m.clipped);
                for (r, ns) in [
                    (f.ts.clone(), m.begin - ctx.out_base),
                    (Some(d), m.end - m.begin),
                ] {
                    if let Some(r) = r {
                        let mut v = Vec::new();
                        json::write_us(&mut v, ns);
                        reps.retain(|(x, _)| *x != r);
                        reps.push((r, v));
                    }
                }
            }
        }
    }
    reps.sort_by_key(|(r, _)| r.start);
    out.extend_from_slice(b",\n");
    let mut at = 0;
    for (r, v) in reps {
        if r.start < at {
            continue; // overlapping ranges: keep the first rewrite
        }
        out.extend_from_slice(&raw[at..r.start]);
        out.extend_from_slice(&v);
        at = r.end;
    }
    out.extend_from_slice(&raw[at..]);
    counts.out += 1;
    counts.data += u64::from(!meta);
}
