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
use crate::error::{CoreError, Result};
use crate::trace::columns::FileInfo;
use crate::trace::filemeta::{FileMeta, MetaEvent};
use crate::trace::inputs;
use crate::trace::scan::{self, Fields, Item, Scanner};

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
    /// Runtime calls with a correlation id: `corr -> (start, end)`.
    pub runtimes: HashMap<i64, (i64, i64)>,
    pub profiler_steps: Vec<Step>,
    pub fastprof_steps: Vec<Step>,
}

pub(crate) type HostRoleKey = HostRole;

/// One file's records, in raw time, keyed by pid.
#[derive(Default)]
struct FileRecords {
    host: Vec<(i64, i64, i64, HostRole)>,
    /// `(pid, role) -> index` of the last host interval, to fold nested ones.
    last_host: HashMap<(i64, HostRole), usize>,
    devices: Vec<(i64, Device)>,
    runtimes: Vec<(i64, i64, i64, i64)>,
    steps: Vec<(i64, bool, Step)>,
    step_ordinal: HashMap<i64, i64>,
    /// `deviceProperties`: device id -> SM count.
    sms: HashMap<i64, f32>,
    /// X events left out for a negative, unreadable or out-of-range `dur`.
    bad_dur: u64,
}

pub(crate) struct Reading {
    pub ranks: HashMap<i32, RankData>,
    pub files: Vec<FileInfo>,
    pub warnings: Vec<String>,
    rank_offsets: HashMap<u32, i64>,
}

/// Read `inputs` (files, directories, globs, as `fastprof merge` takes them).
pub(crate) fn read(inputs: &[PathBuf]) -> Result<Reading> {
    let mut files: Vec<(PathBuf, bool)> = Vec::new();
    let mut warnings = Vec::new();
    for input in inputs {
        let from_dir = input.is_dir() || input.to_string_lossy().contains(['*', '?']);
        for f in inputs::expand_warn(std::slice::from_ref(input), &mut warnings)? {
            if !files.iter().any(|(p, _)| *p == f) {
                files.push((f, from_dir));
            }
        }
    }
    // fastprof segments first: a rank's clock offset is known when its
    // torch traces are placed.
    files.sort_by_key(|(p, _)| {
        !p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("fastprof."))
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
    Ok(r)
}

impl Reading {
    /// Scan one file; its records join their ranks only once it has been
    /// read completely (a merge output to skip leaves nothing behind).
    fn file(&mut self, path: &Path, skip_merged: bool) -> Result<FileInfo> {
        let mut sc = Scanner::open(path)?;
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

    /// Records of a read file onto the epoch-ns timeline and into their ranks.
    fn place(&mut self, meta: &FileMeta, recs: FileRecords) {
        let shift = meta.shift();
        for (s, e, pid, role) in recs.host {
            let rd = self.ranks.entry(meta.rank_of(pid)).or_default();
            rd.host
                .entry(role)
                .or_default()
                .push((s.saturating_add(shift), e.saturating_add(shift)));
        }
        for (pid, mut d) in recs.devices {
            d.start = d.start.saturating_add(shift);
            d.end = d.end.saturating_add(shift);
            if d.blocks_per_sm.is_nan() && !d.grid_blocks.is_nan() {
                if let Some(&sms) = recs.sms.get(&d.device).filter(|&&n| n > 0.0) {
                    d.blocks_per_sm = d.grid_blocks / sms;
                }
            }
            self.ranks
                .entry(meta.rank_of(pid))
                .or_default()
                .devices
                .push(d);
        }
        for (pid, corr, s, e) in recs.runtimes {
            self.ranks
                .entry(meta.rank_of(pid))
                .or_default()
                .runtimes
                .insert(corr, (s.saturating_add(shift), e.saturating_add(shift)));
        }
        for (pid, profiler, mut st) in recs.steps {
            st.start = st.start.saturating_add(shift);
            st.end = st.end.saturating_add(shift);
            let rd = self.ranks.entry(meta.rank_of(pid)).or_default();
            if profiler {
                rd.profiler_steps.push(st);
            } else {
                rd.fastprof_steps.push(st);
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
    match classify::classify(&cat, &name, fastprof) {
        Class::Ignored => {}
        Class::ProfilerStep(number) => recs.steps.push((pid, true, Step { number, start, end })),
        Class::FastprofStep => {
            let ordinal = recs.step_ordinal.entry(pid).or_insert(0);
            let number = arg_numbers(get(&f.args), &[b"step", b"batch"])[..]
                .iter()
                .flatten()
                .next()
                .map_or(*ordinal, |&x| x as i64);
            *ordinal += 1;
            recs.steps.push((pid, false, Step { number, start, end }));
        }
        Class::Host(role) => {
            if role == HostRole::Runtime {
                if let Some(corr) = arg_numbers(get(&f.args), &[b"correlation"])[0] {
                    recs.runtimes.push((pid, corr as i64, start, end));
                }
            }
            if end <= start {
                return;
            }
            // Fold an interval into the last one of its (pid, role) when they
            // overlap: nested ops add nothing to a union.
            if let Some(&i) = recs.last_host.get(&(pid, role)) {
                let last = &mut recs.host[i];
                if start >= last.0 && start <= last.1 {
                    last.1 = last.1.max(end);
                    return;
                }
            }
            recs.last_host.insert((pid, role), recs.host.len());
            recs.host.push((start, end, pid, role));
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
            recs.devices.push((pid, d));
        }
    }
}

/// A string token's text (escapes decoded where there are any).
fn text(raw: &[u8]) -> String {
    let inner = scan::str_value(raw).unwrap_or(raw);
    if !inner.contains(&b'\\') {
        return String::from_utf8_lossy(inner).into_owned();
    }
    serde_json::from_slice::<String>(raw)
        .unwrap_or_else(|_| String::from_utf8_lossy(inner).into_owned())
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
