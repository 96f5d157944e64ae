//! Merged pids and the one name each process and thread gets.
//!
//! Inputs name the same process several times (torch calls the training
//! process `python`, fastprof `rank 0 (host pid N)`, every fastprof segment
//! repeats its names) and Perfetto shows whichever came last. The merge
//! drops every input `process_name`, `thread_name` and `process_sort_index`
//! and writes one of each per merged pid / thread here, so the choice is
//! made once, in rank order:
//! * a rank's recording process: `rank R`;
//! * a DataLoader worker's recording (its `otherData.worker`):
//!   `rank R · <loader> loader worker <id>`, sorted right after its rank's
//!   main process;
//! * any other process (torch's GPU devices, its `Spans` track, a second
//!   recording process of one rank): `rank R · <its own name>`.
//!
//! Threads keep the first name given, fastprof's (the Python thread name)
//! before torch's (`thread N (python)`).

use super::plan::{InputInfo, Kind};
use crate::json;
use crate::offline::trace::scan;
use std::collections::HashMap;

pub(super) struct Names {
    /// Per rank: original pid (raw JSON bytes) -> merged pid.
    pub(super) pid_maps: HashMap<u32, HashMap<Vec<u8>, i64>>,
    /// The metadata events, each as `,\n{...}`.
    pub(super) metadata: Vec<u8>,
    pub(super) added: u64,
}

/// Where an input's processes go within its rank.
fn role(i: &InputInfo) -> (u8, &str, u64) {
    match (&i.worker, i.kind) {
        (None, Kind::Fastprof) => (0, "", 0),
        (Some((loader, id)), Kind::Fastprof) => (1, loader, *id),
        _ => (2, "", 0),
    }
}

/// A pid as a name: its text for a string pid ("Spans"), else `pid N`.
fn shown_pid(p: &[u8]) -> String {
    match scan::str_value(p) {
        Some(b"") => "(unnamed)".to_string(),
        Some(t) => String::from_utf8_lossy(t).into_owned(),
        None => format!("pid {}", String::from_utf8_lossy(p)),
    }
}

fn meta_event(out: &mut Vec<u8>, what: &str, pid: i64, tid: &[u8], key: &str, value: &[u8]) {
    out.extend_from_slice(b",\n{\"ph\":\"M\",\"name\":");
    json::write_str(out, what);
    out.extend_from_slice(b",\"pid\":");
    json::write_int(out, pid);
    out.extend_from_slice(b",\"tid\":");
    out.extend_from_slice(tid);
    out.extend_from_slice(b",\"args\":{");
    json::write_str(out, key);
    out.push(b':');
    out.extend_from_slice(value);
    out.extend_from_slice(b"}}");
}

pub(super) fn plan(kept: &[InputInfo]) -> Names {
    let mut order: Vec<&InputInfo> = kept.iter().collect();
    order.sort_by(|a, b| {
        (a.rank, role(a)).cmp(&(b.rank, role(b))) // stable: input order within a role
    });
    let mut pid_maps: HashMap<u32, HashMap<Vec<u8>, i64>> = HashMap::new();
    let mut mains: HashMap<u32, u32> = HashMap::new();
    // Worker ids repeat when a loader restarts its workers (every epoch
    // without `persistent_workers`): the later ones also show their pid.
    let mut workers: std::collections::HashSet<(u32, &str, u64)> = Default::default();
    let mut out = Vec::new();
    let mut added = 0;
    for i in &order {
        let rank = i.rank.unwrap_or(0);
        let pid_map = pid_maps.entry(rank).or_default();
        for p in &i.pids {
            if pid_map.contains_key(p) {
                continue;
            }
            let new = (rank as i64 + 1) * 100_000 + pid_map.len() as i64;
            pid_map.insert(p.clone(), new);
            let own = i.kind == Kind::Fastprof && i.own_pid.as_ref().is_none_or(|o| o == p);
            let name = match (&i.worker, own) {
                (Some((loader, id)), true) => {
                    if workers.insert((rank, loader, *id)) {
                        format!("rank {rank} · {loader} loader worker {id}")
                    } else {
                        format!(
                            "rank {rank} · {loader} loader worker {id} ({})",
                            shown_pid(p)
                        )
                    }
                }
                (None, true) => {
                    let n = mains.entry(rank).or_insert(0);
                    *n += 1;
                    if *n == 1 {
                        format!("rank {rank}")
                    } else {
                        format!("rank {rank} · {}", shown_pid(p))
                    }
                }
                _ => {
                    let theirs = order
                        .iter()
                        .filter(|k| k.rank == Some(rank) && k.kind != Kind::Fastprof)
                        .chain(order.iter().filter(|k| k.rank == Some(rank)))
                        .find_map(|k| k.process_names.get(p));
                    match theirs {
                        Some(n) => format!("rank {rank} · {n}"),
                        None => format!("rank {rank} · {}", shown_pid(p)),
                    }
                }
            };
            let mut sort = Vec::new();
            json::write_int(&mut sort, new);
            meta_event(
                &mut out,
                "process_sort_index",
                new,
                b"0",
                "sort_index",
                &sort,
            );
            meta_event(
                &mut out,
                "process_name",
                new,
                b"0",
                "name",
                &json::quoted(&name),
            );
            added += 2;
        }
    }
    // Threads: the first name in role order (fastprof's before torch's).
    let mut seen: std::collections::HashSet<(i64, &[u8])> = Default::default();
    for i in &order {
        let rank = i.rank.unwrap_or(0);
        for ((p, t), name) in &i.thread_names {
            let Some(&new) = pid_maps.get(&rank).and_then(|m| m.get(p)) else {
                continue;
            };
            if std::str::from_utf8(t).is_err() {
                continue; // a tid that is a string of bad UTF-8: keep the output strict JSON
            }
            if seen.insert((new, t)) {
                meta_event(&mut out, "thread_name", new, t, "name", &json::quoted(name));
                added += 1;
            }
        }
    }
    Names {
        pid_maps,
        metadata: out,
        added,
    }
}
