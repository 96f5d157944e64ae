//! What the recordings' disk caps deleted (`max_disk`, `keep_segments`), per
//! rank, for the unified trace's `otherData.rotated` and the merge summary:
//! a merge of a rotated run must say which part of the timeline is gone
//! (the segments), and which flight dumps and torch windows (the files).
//!
//! Each closed segment carries its recording's `rotated` ledger as it stood
//! then, so the newest segment of a recording (the one whose ledger counts
//! the most deletions) knows them all. Recordings are told apart by
//! (rank, pid, baseTimeNanoseconds): a resumed job writes a second recording
//! into the same rank directory.

use super::plan::InputInfo;
use serde_json::{json, Value};
use std::collections::BTreeMap;

fn count(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// How much a ledger has seen: a later ledger of one recording counts more.
fn seen(v: &Value) -> u64 {
    count(v, "segments") + count(v, "files")
}

/// One entry per rank whose recordings deleted segments, ranks in order:
/// totals, the deleted time range as epoch ns and as seconds from
/// `out_base` (the unified trace's `baseTimeNanoseconds`; negative when
/// before it), and each recording's own ledger.
pub fn by_rank(kept: &[InputInfo], out_base: i64) -> Vec<Value> {
    // (rank, pid, base) -> the input with the most complete ledger.
    let mut latest: BTreeMap<(u32, u64, i64), &InputInfo> = BTreeMap::new();
    for i in kept {
        let Some(r) = &i.rotated else { continue };
        let key = (
            i.rank.unwrap_or(0),
            i.recording_pid.unwrap_or(0),
            i.base_ns.unwrap_or(0),
        );
        let better = latest
            .get(&key)
            .is_none_or(|cur| seen(r) > seen(cur.rotated.as_ref().unwrap_or(&Value::Null)));
        if better {
            latest.insert(key, i);
        }
    }
    let mut ranks: BTreeMap<u32, Vec<&InputInfo>> = BTreeMap::new();
    for ((rank, _, _), i) in latest {
        ranks.entry(rank).or_default().push(i);
    }
    let mut out = Vec::new();
    for (rank, infos) in ranks {
        let (mut segments, mut bytes, mut events) = (0, 0, 0);
        let (mut files, mut files_bytes) = (0, 0);
        let mut range: Option<(i64, i64)> = None;
        let mut recordings = Vec::new();
        for i in infos {
            let r = i.rotated.as_ref().expect("kept only inputs with a ledger");
            segments += count(r, "segments");
            bytes += count(r, "bytes");
            events += count(r, "events");
            files += count(r, "files");
            files_bytes += count(r, "files_bytes");
            // Trace time (µs from the input's base) to epoch ns, offset applied.
            let abs = |key: &str| {
                r.get(key)
                    .and_then(Value::as_f64)
                    .map(|us| i.abs((us * 1000.0).round() as i64))
            };
            if let (Some(s), Some(e)) = (abs("ts_start"), abs("ts_end")) {
                range = Some(range.map_or((s, e), |(s0, e0)| (s0.min(s), e0.max(e))));
            }
            let mut rec = r.clone();
            rec["pid"] = json!(i.recording_pid);
            rec["source"] = json!(i.path.display().to_string());
            recordings.push(rec);
        }
        let secs = |ns: i64| (ns - out_base) as f64 / 1e9;
        out.push(json!({
            "rank": rank,
            "segments": segments,
            "bytes": bytes,
            "events": events,
            "files": files,
            "files_bytes": files_bytes,
            "start_ns": range.map(|r| r.0),
            "end_ns": range.map(|r| r.1),
            "start_s": range.map(|r| secs(r.0)),
            "end_s": range.map(|r| secs(r.1)),
            "recordings": recordings,
        }));
    }
    out
}
