//! The one pass over the input files: each event is classified as it is
//! scanned and, when it matters to a breakdown, kept as a compact record
//! (an interval, and for GPU activities a few numbers from its args); the
//! event's text is never kept. Host intervals of one role that nest or
//! overlap on a pid are folded into one as they arrive, so a deep operator
//! tree costs one record per top-level op.
//!
//! Records carry raw trace time until the file has been read, then are
//! placed on the epoch-ns timeline with the file's time base and clock
//! offset and handed to their rank ([`super::filemeta::FileMeta`] rules,
//! shared with `read_columns`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::classify::{self, Class, DeviceKind, HostRole, KernelType};
use crate::contract;
use crate::error::{CoreError, Result};
use crate::offline::trace::columns::FileInfo;
use crate::offline::trace::filemeta::{FileMeta, MetaEvent};
use crate::offline::trace::inputs;
use crate::offline::trace::scan::{self, str_text as text, Fields, Item};

/// A GPU activity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Device {
    pub start: i64,
    pub end: i64,
    pub device: i64,
    pub stream: i64,
    /// Correlation id with the runtime call that launched it (-1 none).
    pub corr: i64,
    pub kind: DeviceKind,
    pub ktype: KernelType,
    pub tensor_cores: bool,
    /// Blocks per SM: from `args["blocks per SM"]`, or the grid's blocks
    /// over the device's SM count (resolved at the end of the file); NaN
    /// when unknown.
    pub blocks_per_sm: f32,
    /// Blocks in the grid, until resolved into `blocks_per_sm` (NaN none).
    grid_blocks: f32,
    /// `args["est. achieved occupancy %"]`, NaN when absent.
    pub occupancy: f32,
}

/// A step marker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step {
    pub number: i64,
    pub start: i64,
    pub end: i64,
}

/// Everything kept for one rank.
#[derive(Default)]
pub(crate) struct RankData {
    /// Host intervals by role.
    pub host: HashMap<HostRoleKey, Vec<(i64, i64)>>,
    pub devices: Vec<Device>,
    /// Runtime calls with a correlation id, `(corr, start, end)`, sorted by
    /// `corr`, one per id (the last one read) once [`read`] returns: a
    /// sorted list holds a million launches in 24 MB, a hash map in 50.
    pub runtimes: Vec<(i64, i64, i64)>,
    pub profiler_steps: Vec<Step>,
    pub fastprof_steps: Vec<Step>,
}

impl RankData {
    /// The launch of correlation id `corr`: `(start, end)`.
    pub fn runtime(&self, corr: i64) -> Option<(i64, i64)> {
        let i = self.runtimes.binary_search_by_key(&corr, |r| r.0).ok()?;
        Some((self.runtimes[i].1, self.runtimes[i].2))
    }

    /// Sort the runtimes by id and keep the last one read of each id.
    fn settle(&mut self) {
        self.runtimes.reverse();
        self.runtimes.sort_by_key(|r| r.0);
        self.runtimes.dedup_by_key(|r| r.0);
        self.runtimes.shrink_to_fit();
    }
}

pub(crate) type HostRoleKey = HostRole;

/// One pid's records of a file, in raw time, already in the shape its rank
/// keeps them (so that placing a file's records moves its lists, where it
/// can, instead of copying them).
#[derive(Default)]
struct PidRecords {
    host: HashMap<HostRole, Vec<(i64, i64)>>,
    devices: Vec<Device>,
    runtimes: Vec<(i64, i64, i64)>,
    profiler_steps: Vec<Step>,
    fastprof_steps: Vec<Step>,
    step_ordinal: i64,
}

/// One file's records, by pid.
#[derive(Default)]
struct FileRecords {
    pids: HashMap<i64, PidRecords>,
    /// `deviceProperties`: device id -> SM count.
    sms: HashMap<i64, f32>,
    /// X events left out for a negative, unreadable or out-of-range `dur`.
    bad_dur: u64,
}

/// Append `from` to `to`, moving the list when `to` is empty.
fn join<T>(to: &mut Vec<T>, mut from: Vec<T>) {
    if to.is_empty() {
        *to = from;
    } else {
        to.append(&mut from);
    }
}

pub(crate) struct Reading {
    pub ranks: HashMap<i32, RankData>,
    pub files: Vec<FileInfo>,
    pub warnings: Vec<String>,
    rank_offsets: HashMap<u32, i64>,
}

/// Read `inputs` (files, directories, globs, as `fastprof merge` takes them).
pub(crate) fn read(inputs: &[PathBuf]) -> Result<Reading> {
    let mut warnings = Vec::new();
    let mut files = inputs::expand_each(inputs, &mut warnings)?;
    // fastprof segments first: a rank's clock offset is known when its
    // torch traces are placed.
    files.sort_by_key(|(p, _)| {
        !p.file_name()
            .is_some_and(|n| contract::is_fastprof_file_name(&n.to_string_lossy()))
    });
    let mut r = Reading {
        ranks: HashMap::new(),
        files: Vec::new(),
        warnings,
        rank_offsets: HashMap::new(),
    };
    let several = files.len() > 1;
    let mut merged_skipped = Vec::new();
    for (path, from_dir) in &files {
        match r.file(path, several) {
            Ok(info) => {
                if info.skipped.is_some() && info.kind == "merged" {
                    merged_skipped.push(r.files.len());
                }
                r.files.push(info);
            }
            Err(e @ CoreError::Trace { .. }) if *from_dir => {
                r.warnings.push(format!("skipped, not a trace: {e}"));
                let mut info = FileMeta::new(path).info;
                info.skipped = Some("not a trace".into());
                r.files.push(info);
            }
            Err(e) if *from_dir && inputs::is_gone(&e) => {
                r.warnings.push(inputs::gone_warning(path));
                let mut info = FileMeta::new(path).info;
                info.skipped = Some("gone since listed".into());
                r.files.push(info);
            }
            Err(e) => return Err(e),
        }
    }
    if !merged_skipped.is_empty() && r.files.iter().all(|f| f.skipped.is_some()) {
        // Only merge outputs (and non-traces) here: read those.
        for idx in merged_skipped {
            let path = r.files[idx].path.clone();
            r.files[idx] = r.file(&path, false)?;
        }
    } else {
        for idx in merged_skipped {
            r.warnings.push(format!(
                "{}: skipped, a previous merge output next to its inputs (read it on its own to use it)",
                r.files[idx].path.display()
            ));
        }
    }
    for rd in r.ranks.values_mut() {
        rd.settle();
    }
    Ok(r)
}

impl Reading {
    /// Scan one file; its records join their ranks only once it has been
    /// read completely (a merge output to skip leaves nothing behind).
    fn file(&mut self, path: &Path, skip_merged: bool) -> Result<FileInfo> {
        let mut sc = inputs::open_listed(path)?;
        let mut meta = FileMeta::new(path);
        let mut recs = FileRecords::default();
        while let Some(item) = sc.next_item()? {
            match item {
                Item::Meta { key, raw } => {
                    if key == "deviceProperties" {
                        recs.sms = device_sms(raw);
                    }
                    meta.top_level(key, raw);
                }
                Item::Event(raw) => {
                    let first = meta.info.events == 0;
                    meta.info.events += 1;
                    let Some(f) = Fields::parse(raw) else {
                        continue;
                    };
                    let ph = f.ph.clone().and_then(|r| scan::str_value(&raw[r]));
                    match ph {
                        Some(b"M") => {
                            let marker = meta.metadata_event(&f, raw) == MetaEvent::MergeMarker;
                            if marker && first && skip_merged {
                                meta.info.skipped = Some("a previous merge output".into());
                                return Ok(meta.info);
                            }
                        }
                        Some(b"X") => event(&mut meta, &mut recs, &f, raw),
                        _ => {}
                    }
                }
            }
        }
        self.warnings.extend(sc.warnings().iter().cloned());
        if let Some(s) = sc.salvage() {
            meta.info.salvaged = true;
            self.warnings.push(format!(
                "{}: salvaged: {} at byte {}; {} bytes after it unused",
                path.display(),
                s.reason,
                s.offset,
                s.unused_bytes
            ));
        }
        if recs.bad_dur > 0 {
            self.warnings.push(format!(
                "{}: {} X events with a negative, out-of-range or unreadable dur were left out",
                path.display(),
                recs.bad_dur
            ));
        }
        meta.settle_offset(&mut self.rank_offsets);
        if let Some(w) = meta.time_base_warning() {
            self.warnings.push(w);
        }
        self.place(&meta, recs);
        Ok(meta.info)
    }

    /// Records of a read file onto the epoch-ns timeline and into their
    /// ranks: each pid's lists are shifted in place and moved to the rank
    /// (appended when it has some already).
    fn place(&mut self, meta: &FileMeta, recs: FileRecords) {
        let shift = meta.shift();
        let mut pids: Vec<(i64, PidRecords)> = recs.pids.into_iter().collect();
        pids.sort_unstable_by_key(|(pid, _)| *pid);
        for (pid, mut pr) in pids {
            let rd = self.ranks.entry(meta.rank_of(pid)).or_default();
            let mut roles: Vec<_> = pr.host.drain().collect();
            roles.sort_unstable_by_key(|(role, _)| *role as u8);
            for (role, mut ivs) in roles {
                for iv in &mut ivs {
                    *iv = (iv.0.saturating_add(shift), iv.1.saturating_add(shift));
                }
                join(rd.host.entry(role).or_default(), ivs);
            }
            for d in &mut pr.devices {
                d.start = d.start.saturating_add(shift);
                d.end = d.end.saturating_add(shift);
                if d.blocks_per_sm.is_nan() && !d.grid_blocks.is_nan() {
                    if let Some(&sms) = recs.sms.get(&d.device).filter(|&&n| n > 0.0) {
                        d.blocks_per_sm = d.grid_blocks / sms;
                    }
                }
            }
            join(&mut rd.devices, pr.devices);
            for r in &mut pr.runtimes {
                r.1 = r.1.saturating_add(shift);
                r.2 = r.2.saturating_add(shift);
            }
            join(&mut rd.runtimes, pr.runtimes);
            for (to, mut steps) in [
                (&mut rd.profiler_steps, pr.profiler_steps),
                (&mut rd.fastprof_steps, pr.fastprof_steps),
            ] {
                for st in &mut steps {
                    st.start = st.start.saturating_add(shift);
                    st.end = st.end.saturating_add(shift);
                }
                join(to, steps);
            }
        }
    }
}

/// One `X` event.
fn event(meta: &mut FileMeta, recs: &mut FileRecords, f: &Fields, raw: &[u8]) {
    let get = |r: &Option<std::ops::Range<usize>>| r.clone().map(|r| &raw[r]);
    let Some(ts) = f.ts_ns(raw) else {
        return;
    };
    meta.note_ts(ts);
    // Left out, as the columns leave it out: a bad dur is no 0 s step.
    let Some(dur) = f.dur_checked(raw) else {
        recs.bad_dur += 1;
        return;
    };
    let name = get(&f.name).map(text).unwrap_or_default();
    let cat = get(&f.cat).map(text).unwrap_or_default();
    let fastprof = matches!(meta.info.kind, "fastprof" | "merged");
    let pid = get(&f.pid).and_then(scan::parse_int).unwrap_or(-1);
    let (start, end) = (ts, ts.saturating_add(dur));
    let class = classify::classify(&cat, &name, fastprof);
    if class == Class::Ignored {
        return;
    }
    let pr = recs.pids.entry(pid).or_default();
    match class {
        Class::Ignored => {}
        Class::ProfilerStep(number) => pr.profiler_steps.push(Step { number, start, end }),
        Class::FastprofStep => {
            let number = arg_numbers(get(&f.args), &[b"step", b"batch"])[..]
                .iter()
                .flatten()
                .next()
                .map_or(pr.step_ordinal, |&x| x as i64);
            pr.step_ordinal += 1;
            pr.fastprof_steps.push(Step { number, start, end });
        }
        Class::Host(role) => {
            if role == HostRole::Runtime {
                if let Some(corr) = arg_numbers(get(&f.args), &[b"correlation"])[0] {
                    pr.runtimes.push((corr as i64, start, end));
                }
            }
            if end <= start {
                return;
            }
            // Fold an interval into the last one of its (pid, role) when they
            // overlap: nested ops add nothing to a union.
            let list = pr.host.entry(role).or_default();
            if let Some(last) = list.last_mut() {
                if start >= last.0 && start <= last.1 {
                    last.1 = last.1.max(end);
                    return;
                }
            }
            list.push((start, end));
        }
        Class::Device(kind) => {
            let keys: [&[u8]; 7] = [
                b"device",
                b"stream",
                b"correlation",
                b"blocks per SM",
                b"est. achieved occupancy %",
                b"grid",
                b"blocks",
            ];
            let v = arg_numbers(get(&f.args), &keys);
            let tid = get(&f.tid).and_then(scan::parse_int).unwrap_or(-1);
            let f32_of = |x: Option<f64>| x.map_or(f32::NAN, |x| x as f32);
            let d = Device {
                start,
                end,
                device: v[0].map_or(pid, |x| x as i64),
                stream: v[1].map_or(tid, |x| x as i64),
                corr: v[2].map_or(-1, |x| x as i64),
                kind,
                ktype: classify::kernel_type(kind, &name),
                tensor_cores: kind == DeviceKind::Kernel && classify::uses_tensor_cores(&name),
                blocks_per_sm: f32_of(v[3].filter(|&x| x > 0.0)),
                grid_blocks: f32_of(v[5].or(v[6]).filter(|&x| x > 0.0)),
                occupancy: f32_of(v[4].filter(|&x| x >= 0.0)),
            };
            pr.devices.push(d);
        }
    }
}

/// The numeric values of `keys` in an `args` object (None where absent or
/// not a number); an array of numbers (a grid `[x, y, z]`) gives its product.
fn arg_numbers<const N: usize>(args: Option<&[u8]>, keys: &[&[u8]; N]) -> [Option<f64>; N] {
    let mut out = [None; N];
    let Some(args) = args else {
        return out;
    };
    scan::for_each_entry(args, |k, v| {
        if let Some(i) = keys.iter().position(|key| *key == k) {
            out[i] = number(v);
        }
    });
    out
}

fn number(v: &[u8]) -> Option<f64> {
    if let [b'[', inner @ .., b']'] = v {
        let mut product = 1.0;
        for part in inner.split(|&b| b == b',') {
            product *= std::str::from_utf8(part).ok()?.trim().parse::<f64>().ok()?;
        }
        return Some(product);
    }
    let t = scan::str_value(v).unwrap_or(v);
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// `deviceProperties`: `[{"id": 0, "numSms": 108, ...}, ...]`.
fn device_sms(raw: &[u8]) -> HashMap<i64, f32> {
    let Ok(serde_json::Value::Array(devs)) = serde_json::from_slice(raw) else {
        return HashMap::new();
    };
    devs.iter()
        .filter_map(|d| {
            let id = d.get("id")?.as_i64()?;
            let sms = d.get("numSms")?.as_f64()?;
            Some((id, sms as f32))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_from_args() {
        let args = br#"{"device": 0, "grid": [4, 2, 1], "blocks per SM": "0.5", "x": {"y": 1}}"#;
        let v = arg_numbers(Some(args), &[b"device", b"grid", b"blocks per SM", b"z"]);
        assert_eq!(v, [Some(0.0), Some(8.0), Some(0.5), None]);
        let sms = device_sms(br#"[{"id": 1, "numSms": 132}]"#);
        assert_eq!(sms.get(&1), Some(&132.0));
    }
}
