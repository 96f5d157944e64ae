//! What every sink's metadata (`otherData`) says, read through [`MetaSource`]: drops,
//! threads, clock anchors and offset, the sampler's metadata; and the anchors' bounded list.

use super::events::State;
use crate::runtime::clock::Anchor;
use crate::runtime::registry::{self, END_SLOT_MISSING};
use crate::runtime::sink::MetaSource;
use serde_json::{json, Map, Value};
use std::sync::atomic::Ordering;

/// Clock anchors kept in the metadata: the start anchor and the newest
/// periodic ones (an hour's worth at one a minute).
pub(super) const MAX_ANCHORS: usize = 64;

/// Seconds between periodic clock anchors.
pub(super) const ANCHOR_EVERY_NS: u64 = 60_000_000_000;

pub(super) fn hostname() -> String {
    let mut b = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length.
    let rc = unsafe { libc::gethostname(b.as_mut_ptr().cast(), b.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Keep a periodic anchor: the start anchor (first) stays, as the merge
/// reads it; past [`MAX_ANCHORS`] the oldest periodic one goes and
/// `dropped` counts it (every segment repeats the list, and a week's run
/// would carry 10,000 of them).
pub(super) fn push_anchor(anchors: &mut Vec<(Anchor, &'static str)>, dropped: &mut u64, a: Anchor) {
    anchors.push((a, "periodic"));
    if anchors.len() > MAX_ANCHORS {
        anchors.remove(1);
        *dropped += 1;
    }
}

pub(super) fn anchor_json(a: &Anchor, label: &str) -> Value {
    json!({
        "label": label,
        "realtime_ns": a.realtime_ns,
        "monotonic_ns": a.monotonic_ns,
        "uncertainty_ns": a.uncertainty_ns,
    })
}

impl MetaSource for State {
    fn other_data(&self) -> Map<String, Value> {
        let mut other = self.header.static_meta.clone();
        let anchors: Vec<Value> = self
            .anchors
            .iter()
            .map(|(a, l)| anchor_json(a, l))
            .collect();
        // Extend the static clock object (source, ticks, start) rather than
        // replacing it: readers rely on both.
        let mut clock = other
            .get("clock")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        clock.insert("anchors".into(), Value::Array(anchors));
        if self.anchors_dropped > 0 {
            clock.insert("anchors_dropped".into(), Value::from(self.anchors_dropped));
        }
        if let Some((off, unc)) = *self
            .shared
            .clock_offset
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        {
            clock.insert("offset_ns".into(), json!(off));
            clock.insert("offset_uncertainty_ns".into(), json!(unc));
        }
        other.insert("clock".into(), Value::Object(clock));
        let drops = self.drops();
        let ringless = self.shared.ringless_drops.load(Ordering::Relaxed);
        let total: u64 = drops.values().sum::<u64>() + ringless;
        let per_thread: Map<String, Value> = drops
            .iter()
            .map(|(tid, n)| (tid.to_string(), json!(n)))
            .collect();
        let ringless_threads: Vec<Value> = self
            .shared
            .ringless_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(tid, name, why)| json!({"tid": tid, "name": name, "reason": why}))
            .collect();
        other.insert(
            "drops".into(),
            json!({
                "total": total,
                "per_thread": per_thread,
                "ringless_events": ringless,
                "payload_events": self.shared.payload_drops.load(Ordering::Relaxed),
                "ringless_threads": ringless_threads,
                "end_slot_missing": END_SLOT_MISSING.load(Ordering::Relaxed),
            }),
        );
        let growth = &self.shared.ring_growth;
        other.insert(
            "ring_growth".into(),
            json!({
                "chunks": growth.chunks(),
                "peak_bytes": growth.peak_bytes(),
                "limit_bytes": growth.limit_bytes(),
            }),
        );
        other.insert(
            "threads".into(),
            Value::Object(
                self.thread_names
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(v)))
                    .collect(),
            ),
        );
        other.insert("events_written".into(), json!(self.events_written));
        other.insert(
            "replaced_values".into(),
            json!(registry::REPLACED_VALUES.load(Ordering::Relaxed)),
        );
        other.insert("unclosed_spans".into(), json!(self.unclosed_spans));
        let (step, step_ns) = self.shared.step();
        if step_ns > 0 {
            other.insert(
                "last_step".into(),
                json!({"step": step, "monotonic_ns": step_ns}),
            );
        }
        if !self.sink_errors.is_empty() {
            other.insert("output_errors".into(), json!(self.sink_errors));
        }
        let sampler = self
            .shared
            .sampler
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(s) = sampler {
            let meta = s.meta.lock().unwrap_or_else(|e| e.into_inner()).clone();
            other.insert("sampler".into(), meta);
        }
        other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn anchor(n: u64) -> Anchor {
        Anchor {
            realtime_ns: 1_000_000 + n,
            monotonic_ns: n,
            uncertainty_ns: 1,
        }
    }

    #[test]
    pub(super) fn anchors_keep_the_start_and_the_newest_periodic_ones() {
        let mut anchors = vec![(anchor(0), "start")];
        let mut dropped = 0;
        for n in 1..=(MAX_ANCHORS as u64 - 1) {
            push_anchor(&mut anchors, &mut dropped, anchor(n));
        }
        assert_eq!((anchors.len(), dropped), (MAX_ANCHORS, 0));
        let extra = 1000;
        for n in MAX_ANCHORS as u64..MAX_ANCHORS as u64 + extra {
            push_anchor(&mut anchors, &mut dropped, anchor(n));
        }
        assert_eq!((anchors.len(), dropped), (MAX_ANCHORS, extra));
        assert_eq!(anchors[0], (anchor(0), "start"));
        // The periodic ones left are the newest, in order.
        let kept: Vec<u64> = anchors[1..].iter().map(|(a, _)| a.monotonic_ns).collect();
        let newest: Vec<u64> = (extra + 1..MAX_ANCHORS as u64 + extra).collect();
        assert_eq!(kept, newest);
        assert!(anchors[1..].iter().all(|(_, l)| *l == "periodic"));
    }
}
