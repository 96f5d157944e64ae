//! `fastprof merge`: one aligned timeline from fastprof segments,
//! torch.profiler (Kineto) traces and every rank of a distributed run,
//! streaming in constant memory.
//!
//! Two passes over each input, both streaming through [`crate::trace::scan`]:
//! 1. [`plan`]: base time, rank, clock offset, pids, step markers, time range,
//!    bytes per category. Needed first because Kineto may write
//!    `baseTimeNanoseconds` after `traceEvents`, and windows by step need
//!    every rank's steps before any event is placed.
//! 2. write: each event's raw bytes are copied through with only the fields
//!    merging must change rewritten ([`rewrite`]: `pid`, `ts`, flow/async
//!    `id`s, process names and sort indexes), in ~1 MiB chunks compressed in parallel into a
//!    single-member gzip ([`crate::pargz`]), written to a temporary name and
//!    renamed when complete.
//!
//! Timestamps are parsed as decimal text into integer ns, never through a
//! float, brought to epoch ns (base + ts + the rank's clock offset), and
//! written against one output `baseTimeNanoseconds`.

use crate::trace::inputs;
mod names;
pub mod nest;
pub mod plan;
mod rewrite;
pub mod rotated;

use crate::error::{CoreError, Result};
use crate::json;
use crate::pargz::ParGzWriter;
use crate::trace::scan::{Item, Scanner};
use plan::{InputInfo, Kind};
use rewrite::{rewrite, Counts, Ctx};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Which part of the timeline to keep.
#[derive(Debug, Clone, Default)]
pub enum Window {
    #[default]
    All,
    /// Seconds from the start of the merged timeline.
    Seconds {
        start: Option<f64>,
        end: Option<f64>,
    },
    /// Steps `from..=to` by step markers (torch `ProfilerStep#N`, fastprof `step` spans).
    Steps { from: u64, to: u64 },
}

/// Categories dropped first when `max_bytes` must be met, lowest value first.
pub const LOW_VALUE_CATEGORIES: &[&str] = &[
    "python_function",
    "Trace",
    "cpu_instant_event",
    "fwdbwd",
    "ac2g",
    "cuda_runtime",
    "cuda_driver",
    "gpu_memset",
    "gpu_memcpy",
    "cpu_op",
    "user_annotation",
    "gpu_user_annotation",
    "kernel",
];

#[derive(Debug, Clone)]
pub struct MergeOptions {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    /// Overwrite an existing output.
    pub force: bool,
    /// Keep only these ranks.
    pub ranks: Option<Vec<u32>>,
    pub window: Window,
    /// Keep only events with one of these categories (metadata always kept).
    pub include_categories: Vec<String>,
    pub exclude_categories: Vec<String>,
    /// Upper bound on the uncompressed output; low-value categories are dropped to meet it.
    pub max_bytes: Option<u64>,
    /// Worker threads (0 = every core).
    pub threads: usize,
    pub compression_level: u32,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// Set by another thread (a signal handler, Ctrl-C) to stop the merge:
    /// it then returns [`CoreError::Cancelled`] within a few milliseconds
    /// per worker and leaves neither output nor temporary file.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// Most worker threads a merge accepts: more only costs memory (each
/// compression worker holds chunks in flight) and scheduling.
pub const MAX_THREADS: usize = 256;

impl Default for MergeOptions {
    fn default() -> Self {
        MergeOptions {
            inputs: Vec::new(),
            output: PathBuf::from("trace.json.gz"),
            force: false,
            ranks: None,
            window: Window::All,
            include_categories: Vec::new(),
            exclude_categories: Vec::new(),
            max_bytes: None,
            threads: 0,
            compression_level: 1,
            progress: false,
            cancel: None,
        }
    }
}

/// What a merge did.
#[derive(Debug, Clone, Default)]
pub struct MergeSummary {
    pub output: PathBuf,
    pub files: usize,
    pub skipped_files: Vec<String>,
    /// fastprof's own non-trace JSON met in the input directories (its
    /// `profiler.json`, reports, memory timelines), not read.
    pub own_files: Vec<String>,
    /// Temporary files of dead processes removed from the input directories.
    pub removed_temps: Vec<String>,
    pub ranks: Vec<u32>,
    pub events_in: u64,
    pub events_out: u64,
    /// Input events that were not valid JSON, dropped (each named in a warning).
    pub events_dropped: u64,
    pub metadata_added: u64,
    /// Original `process_sort_index` events, replaced by rank-ordered ones.
    pub metadata_replaced: u64,
    pub filtered_window: u64,
    pub filtered_category: u64,
    pub filtered_rank: u64,
    pub filtered_max_bytes: u64,
    pub dropped_categories: Vec<String>,
    pub salvaged_bytes: u64,
    /// torch `python_function` events indexed for strict nesting.
    pub python_calls: u64,
    /// Duration events moved to nest with them (see [`nest`]).
    pub nest_moved: u64,
    /// Of those, events begun before the torch window they end in.
    pub nest_clipped: u64,
    pub base_ns: i64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub uncertainty_ns: u64,
    pub bytes_uncompressed: u64,
    pub bytes_written: u64,
    pub warnings: Vec<String>,
    /// One JSON object per input: path, kind, rank, base, offset, counts.
    pub inputs_json: Vec<Value>,
    /// Per rank, what the recording's disk cap deleted before the merge
    /// (see [`rotated`]); empty when nothing was.
    pub rotated: Vec<Value>,
}

enum Sink {
    Gz(Box<ParGzWriter>),
    Plain(BufWriter<File>, u64),
}

impl Sink {
    fn write(&mut self, chunk: Vec<u8>) -> std::io::Result<()> {
        match self {
            Sink::Gz(w) => w.write_chunk(chunk),
            Sink::Plain(w, n) => {
                *n += chunk.len() as u64;
                w.write_all(&chunk)
            }
        }
    }

    fn finish(self) -> std::io::Result<(u64, u64)> {
        match self {
            Sink::Gz(w) => (*w).finish(),
            Sink::Plain(mut w, n) => {
                w.flush()?;
                Ok((n, n))
            }
        }
    }
}

const CHUNK: usize = 1 << 20;

fn progress_thread(
    done: Arc<AtomicU64>,
    total: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut stderr = std::io::stderr();
        while !stop.load(Ordering::Relaxed) {
            let d = done.load(Ordering::Relaxed).min(total);
            let frac = if total > 0 {
                d as f64 / total as f64
            } else {
                1.0
            };
            let bar = (frac * 30.0) as usize;
            let _ = write!(
                stderr,
                "\r  merging [{}{}] {:3.0}%  {:.1}/{:.1} MB read ",
                "#".repeat(bar),
                " ".repeat(30 - bar),
                frac * 100.0,
                d as f64 / 2e6,
                total as f64 / 2e6
            );
            let _ = stderr.flush();
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let _ = write!(stderr, "\r{}\r", " ".repeat(72));
    })
}

/// Check the options that do not depend on the inputs.
fn validate(opts: &MergeOptions) -> Result<()> {
    if opts.threads > MAX_THREADS {
        return Err(CoreError::config(
            "threads",
            format!(
                "{} worker threads requested; use 0 (one per core) or 1..={MAX_THREADS}",
                opts.threads
            ),
        ));
    }
    if opts.compression_level > 9 {
        return Err(CoreError::config(
            "compression_level",
            format!("{} is not a gzip level (0..=9)", opts.compression_level),
        ));
    }
    match opts.window {
        Window::Seconds { start, end } => {
            for (name, v) in [("start", start), ("end", end)] {
                if let Some(v) = v {
                    if !v.is_finite() || v < 0.0 {
                        return Err(CoreError::config(
                            name,
                            format!(
                                "{v} is not a number of seconds >= 0 from the start of the run"
                            ),
                        ));
                    }
                }
            }
            if let Some(e) = end {
                let s = start.unwrap_or(0.0);
                if e <= s {
                    return Err(CoreError::config(
                        "end",
                        format!("the window ends ({e} s) before it starts ({s} s)"),
                    ));
                }
            }
        }
        Window::Steps { from, to } if to < from => {
            return Err(CoreError::config(
                "steps",
                format!("step {to} is before step {from}"),
            ));
        }
        _ => {}
    }
    Ok(())
}

/// Run a merge. On error (and when cancelled) nothing is left at `output`
/// and no temporary file remains.
pub fn merge(opts: &MergeOptions) -> Result<MergeSummary> {
    validate(opts)?;
    if opts.output.exists() && !opts.force {
        return Err(CoreError::io(
            &opts.output,
            std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "already exists; pass -f/--force to overwrite",
            ),
        ));
    }
    // Before reading anything: an output directory that is not one fails now.
    if let Err(e) = std::fs::metadata(output_dir(&opts.output)).and_then(|m| {
        if m.is_dir() {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(libc::ENOTDIR))
        }
    }) {
        return Err(output_error(&opts.output, e));
    }
    let out_abs = opts.output.canonicalize().ok();
    let found = inputs::find(&opts.inputs)?;
    let input_warnings = found.warnings;
    let own_files: Vec<String> = found.own.iter().map(|p| p.display().to_string()).collect();
    let removed_temps: Vec<String> = found
        .removed
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let files: Vec<PathBuf> = found
        .files
        .into_iter()
        .filter(|p| {
            out_abs
                .as_ref()
                .is_none_or(|o| p.canonicalize().ok().as_ref() != Some(o))
        })
        .collect();
    if files.is_empty() {
        let mut reason = format!(
            "no trace files (*.json, *.json.gz, fastprof.*.json.gz.part) in {}",
            show_inputs(&opts.inputs)
        );
        if let Some(w) = input_warnings.first() {
            reason.push_str(&format!(" ({w})"));
        }
        return Err(CoreError::NoEvents { reason });
    }
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    } else {
        opts.threads
    };
    let total: u64 = 2 * files
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum::<u64>();
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let bar = opts
        .progress
        .then(|| progress_thread(done.clone(), total, stop.clone()));
    let cancel = opts.cancel.clone().unwrap_or_default();
    let result = plan_all(opts, files, threads, &done, &cancel).and_then(|mut p| {
        p.summary.warnings.splice(0..0, input_warnings);
        p.summary.own_files = own_files;
        p.summary.removed_temps = removed_temps;
        write_all(opts, p, threads, &done, &cancel)
    });
    stop.store(true, Ordering::Relaxed);
    if let Some(b) = bar {
        let _ = b.join();
    }
    result
}

/// The directory the output (and its temporary) goes to.
fn output_dir(output: &Path) -> &Path {
    output
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// An error writing the output, naming the output the user asked for (not
/// our hidden temporary) and its directory.
fn output_error(output: &Path, e: std::io::Error) -> CoreError {
    let text = e.to_string();
    let cause = match (e.raw_os_error(), text.rfind(" (os error ")) {
        (Some(_), Some(i)) => &text[..i],
        _ => &text,
    };
    let dir = output_dir(output);
    CoreError::io(
        output,
        std::io::Error::new(
            e.kind(),
            format!("cannot write the output in {}: {cause}", dir.display()),
        ),
    )
}

/// The user's inputs, for messages: the first few, then how many more.
fn show_inputs(inputs: &[PathBuf]) -> String {
    let mut s: Vec<String> = inputs
        .iter()
        .take(3)
        .map(|p| p.display().to_string())
        .collect();
    if inputs.len() > 3 {
        s.push(format!("and {} more", inputs.len() - 3));
    }
    s.join(", ")
}

/// Open an input, following a rename: a recording closes its open segment
/// `X.part` by renaming it to `X` (same bytes, then more), possibly between
/// the two passes of a merge.
fn open_input(path: &Path) -> Result<Scanner> {
    match Scanner::open(path) {
        Err(CoreError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound
                && path.extension().is_some_and(|e| e == "part") =>
        {
            Scanner::open(&path.with_extension(""))
        }
        other => other,
    }
}

/// Run `f` on each item on up to `threads` threads; results in input order.
/// Once `f` fails for one item, `stop` is set so the others end early.
fn parallel<T: Send, R: Send>(
    items: Vec<T>,
    threads: usize,
    stop: &AtomicBool,
    f: impl Fn(T) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    let n = items.len();
    let queue = Mutex::new(items.into_iter().enumerate().rev().collect::<Vec<_>>());
    let results: Mutex<Vec<Option<Result<R>>>> = Mutex::new((0..n).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.min(n).max(1) {
            s.spawn(|| loop {
                let Some((i, item)) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                    break;
                };
                let r = f(item);
                if r.is_err() {
                    // Relaxed: a hint to stop early; the scope's join orders the rest.
                    stop.store(true, Ordering::Relaxed);
                }
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or(Err(CoreError::Cancelled)))
        .collect()
}

/// The first real error of `results`: an input's own failure rather than
/// the `Cancelled` of the workers it stopped.
fn first_error<R>(results: Vec<Result<R>>) -> Result<Vec<R>> {
    let mut cancelled = false;
    let mut ok = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(CoreError::Cancelled) => cancelled = true,
            Err(e) => return Err(e),
        }
    }
    if cancelled {
        return Err(CoreError::Cancelled);
    }
    Ok(ok)
}

/// What pass 1 decided for pass 2.
struct Plan {
    kept: Vec<InputInfo>,
    summary: MergeSummary,
    window: Option<(i64, i64)>,
    rank_windows: HashMap<u32, (i64, i64)>,
    dropped: Vec<String>,
    pid_maps: HashMap<u32, HashMap<Vec<u8>, i64>>,
    sort_events: Vec<u8>,
    out_base: i64,
    nest: nest::NestIndex,
    /// The output's top-level `distributedInfo` (a single rank's merge only).
    distributed: Option<Value>,
}

fn plan_all(
    opts: &MergeOptions,
    files: Vec<PathBuf>,
    threads: usize,
    done: &Arc<AtomicU64>,
    cancel: &AtomicBool,
) -> Result<Plan> {
    let is_part = |p: &Path| p.extension().is_some_and(|e| e == "part");
    let infos = parallel(files.clone(), threads, cancel, |p| {
        match open_input(&p).and_then(|sc| plan::scan_input(p.clone(), sc, done, cancel)) {
            // An open segment a recording has just created holds no event
            // yet (0 bytes, or part of the gzip header): nothing to merge in it.
            Err(CoreError::Trace { reason, .. }) if is_part(&p) => Ok(Err(reason)),
            other => other.map(Ok),
        }
    });
    let mut summary = MergeSummary {
        output: opts.output.clone(),
        ..Default::default()
    };
    let mut kept: Vec<InputInfo> = Vec::new();
    let mut read = Vec::with_capacity(infos.len());
    for (r, path) in first_error(infos)?.into_iter().zip(&files) {
        match r {
            Ok(info) => read.push(info),
            Err(reason) => {
                summary.warnings.push(format!(
                    "{}: skipped, an open segment with nothing readable yet ({reason})",
                    path.display()
                ));
                summary
                    .skipped_files
                    .push(format!("{} (empty open segment)", path.display()));
            }
        }
    }
    for info in read {
        summary.warnings.extend(info.warnings.iter().cloned());
        if info.merged_output {
            summary
                .skipped_files
                .push(format!("{} (a previous merge output)", info.path.display()));
            continue;
        }
        summary.events_in += info.events;
        summary.events_dropped += info.dropped;
        summary.salvaged_bytes += info.salvaged_bytes;
        kept.push(info);
    }
    if kept.is_empty() {
        return Err(CoreError::NoEvents {
            reason: format!(
                "every trace in {} was skipped: {}",
                show_inputs(&opts.inputs),
                summary.skipped_files.join(", ")
            ),
        });
    }
    // Ranks: from metadata, the path, or else the order of unranked inputs.
    let mut unranked = 0;
    for info in kept.iter_mut() {
        if info.rank.is_none() {
            summary.warnings.push(format!(
                "{}: no rank in metadata or path; taken as rank 0",
                info.path.display()
            ));
            info.rank = Some(0);
            unranked += 1;
        }
    }
    if unranked > 1 {
        summary.warnings.push(format!(
            "{unranked} inputs had no rank; their processes still get distinct pids"
        ));
    }
    // Clock offsets are per rank: inputs of a rank without one take the rank's fastprof offset.
    let mut rank_offset: HashMap<u32, (i64, u64)> = HashMap::new();
    for i in kept.iter().filter(|i| i.kind == Kind::Fastprof) {
        rank_offset
            .entry(i.rank.unwrap_or(0))
            .or_insert((i.offset_ns, i.offset_uncertainty_ns));
    }
    for i in kept.iter_mut().filter(|i| i.kind != Kind::Fastprof) {
        if let Some(&(o, u)) = rank_offset.get(&i.rank.unwrap_or(0)) {
            i.offset_ns = o;
            i.offset_uncertainty_ns = u;
        }
    }
    if let Some(want) = &opts.ranks {
        let before = kept.len();
        let mut gone = 0;
        kept.retain(|i| {
            let keep = want.contains(&i.rank.unwrap_or(0));
            if !keep {
                gone += i.events;
            }
            keep
        });
        summary.filtered_rank = gone;
        if kept.is_empty() {
            return Err(CoreError::config(
                "ranks",
                format!("none of the {before} inputs has a rank in {want:?}"),
            ));
        }
    }
    let ranks: BTreeSet<u32> = kept.iter().map(|i| i.rank.unwrap_or(0)).collect();
    summary.ranks = ranks.iter().copied().collect();
    let start = kept
        .iter()
        .filter_map(|i| i.min_ts.map(|t| i.abs(t)))
        .min()
        .unwrap_or(0);
    let end = kept
        .iter()
        .filter_map(|i| i.max_ts.map(|t| i.abs(t)))
        .max()
        .unwrap_or(start);
    // Per-rank step windows: each rank keeps its own steps A..=B.
    let mut rank_windows: HashMap<u32, (i64, i64)> = HashMap::new();
    let window = match &opts.window {
        Window::All => None,
        Window::Seconds { start: s, end: e } => {
            let s = s.unwrap_or(0.0);
            let span = (end - start) as f64 / 1e9;
            if s > span {
                return Err(CoreError::config(
                    "start",
                    format!(
                        "the window starts at {s} s, after the end of the inputs: they span {span:.3} s"
                    ),
                ));
            }
            Some((
                start.saturating_add((s * 1e9) as i64),
                e.map_or(i64::MAX, |e| start.saturating_add((e * 1e9) as i64)),
            ))
        }
        Window::Steps { from, to } => {
            let sel: Vec<(i64, i64)> = kept
                .iter()
                .flat_map(|i| {
                    i.steps
                        .iter()
                        .filter(|s| s.number >= *from && s.number <= *to)
                        .map(|s| (i.abs(s.start), i.abs(s.end)))
                })
                .collect();
            for i in &kept {
                for st in i
                    .steps
                    .iter()
                    .filter(|s| s.number >= *from && s.number <= *to)
                {
                    let w = rank_windows
                        .entry(i.rank.unwrap_or(0))
                        .or_insert((i64::MAX, i64::MIN));
                    w.0 = w.0.min(i.abs(st.start));
                    w.1 = w.1.max(i.abs(st.end));
                }
            }
            if sel.is_empty() {
                return Err(CoreError::config(
                    "steps",
                    format!("no step markers numbered {from}..={to} (ProfilerStep#N or fastprof 'step' spans) in the inputs"),
                ));
            }
            Some((
                sel.iter().map(|x| x.0).min().unwrap_or(start),
                sel.iter().map(|x| x.1).max().unwrap_or(end),
            ))
        }
    };
    // max_bytes: drop low-value categories until the estimate fits.
    let mut dropped: Vec<String> = Vec::new();
    if let Some(max) = opts.max_bytes {
        let mut estimate: u64 = kept.iter().map(|i| i.bytes).sum();
        let mut by_cat: HashMap<&str, u64> = HashMap::new();
        for i in &kept {
            for (c, n) in &i.cat_bytes {
                *by_cat.entry(c.as_str()).or_insert(0) += n;
            }
        }
        for c in LOW_VALUE_CATEGORIES {
            if estimate <= max {
                break;
            }
            if let Some(n) = by_cat.get(c) {
                estimate = estimate.saturating_sub(*n);
                dropped.push(c.to_string());
            }
        }
        if estimate > max {
            summary.warnings.push(format!(
                "--max-bytes {max}: still ~{estimate} bytes after dropping every low-value category"
            ));
        }
    }
    summary.dropped_categories = dropped.clone();
    // pids: unique per (rank, original pid), numbered so the rank shows,
    // and one name per pid and per thread (see `names`).
    let names::Names {
        pid_maps,
        metadata,
        added,
    } = names::plan(&kept);
    summary.metadata_added += added;
    let sort_events = metadata;
    // The python_function index for strict nesting (bounded by their count).
    let mut nest = nest::NestIndex::default();
    for i in kept.iter_mut() {
        let calls = std::mem::take(&mut i.py_calls);
        if !calls.is_empty() {
            let info: &InputInfo = i;
            nest.add(info.rank.unwrap_or(0), calls, |t| info.abs(t));
        }
    }
    nest.finish();
    summary.python_calls = nest.calls() as u64;
    let distributed = distributed_info(&kept, &summary.ranks);
    let out_base = window.map_or(start, |w| w.0.max(start));
    summary.base_ns = out_base;
    summary.rotated = rotated::by_rank(&kept, out_base);
    summary.start_ns = window.map_or(start, |w| w.0.max(start));
    summary.end_ns = window.map_or(end, |w| w.1.min(end));
    summary.uncertainty_ns = kept
        .iter()
        .map(|i| i.offset_uncertainty_ns + i.anchor_uncertainty_ns)
        .max()
        .unwrap_or(0);
    Ok(Plan {
        kept,
        summary,
        window,
        rank_windows,
        dropped,
        pid_maps,
        sort_events,
        out_base,
        nest,
        distributed,
    })
}

/// The `distributedInfo` of a merge of one rank: that rank's own (a
/// fastprof segment's first, else a Kineto trace's), or one made from the
/// rank and world size the inputs say. A merge of several ranks has none:
/// HTA reads one rank per file (`"rank": N` anywhere in it), so naming one
/// rank there would misattribute the others; per-rank inputs keep theirs.
fn distributed_info(kept: &[InputInfo], ranks: &[u32]) -> Option<Value> {
    let [rank] = ranks else { return None };
    let mut order: Vec<&InputInfo> = kept.iter().collect();
    order.sort_by_key(|i| i.kind != Kind::Fastprof);
    if let Some(d) = order.iter().find_map(|i| i.distributed.clone()) {
        return Some(d);
    }
    let mut d = serde_json::Map::new();
    d.insert("rank".into(), json!(rank));
    if let Some(w) = order.iter().find_map(|i| i.world_size) {
        d.insert("world_size".into(), json!(w));
    }
    Some(Value::Object(d))
}

/// Why a merge that read its inputs selected no event, naming them.
fn no_events_reason(opts: &MergeOptions, s: &MergeSummary, metadata: u64) -> String {
    let inputs = show_inputs(&opts.inputs);
    let filtered = s.filtered_window + s.filtered_category + s.filtered_rank + s.filtered_max_bytes;
    if filtered > 0 {
        format!(
            "every event of {inputs} was filtered out (window {}, category {}, rank {}, max-bytes {})",
            s.filtered_window, s.filtered_category, s.filtered_rank, s.filtered_max_bytes
        )
    } else if s.events_dropped > 0 {
        format!(
            "{inputs}: all {} events are malformed JSON and were dropped",
            s.events_dropped
        )
    } else if metadata > 0 {
        format!("{inputs} hold only metadata events ({metadata}), no trace events")
    } else {
        format!("{inputs} hold no events")
    }
}

fn write_all(
    opts: &MergeOptions,
    plan: Plan,
    threads: usize,
    done: &Arc<AtomicU64>,
    cancel: &AtomicBool,
) -> Result<MergeSummary> {
    let Plan {
        kept,
        mut summary,
        window,
        rank_windows,
        dropped,
        pid_maps,
        sort_events,
        out_base,
        nest,
        distributed,
    } = plan;
    let dir = output_dir(&opts.output);
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        opts.output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let out_err = |e: std::io::Error| output_error(&opts.output, e);
    let file = File::create(&tmp).map_err(out_err)?;
    let gz = !opts.output.to_string_lossy().ends_with(".json");
    let sink = if gz {
        match ParGzWriter::new(Box::new(file), threads, opts.compression_level) {
            Ok(w) => Sink::Gz(Box::new(w)),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(out_err(e));
            }
        }
    } else {
        Sink::Plain(BufWriter::with_capacity(CHUNK, file), 0)
    };
    let sink = Mutex::new(sink);
    let write_result = (|| -> Result<Vec<Counts>> {
        let mut head = b"{\"baseTimeNanoseconds\":".to_vec();
        json::write_int(&mut head, out_base);
        if let Some(Value::Object(d)) = &distributed {
            head.extend_from_slice(b",\"distributedInfo\": ");
            json::write_spaced_object(&mut head, d);
        }
        head.extend_from_slice(b",\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
        head.extend_from_slice(
            b"{\"ph\":\"M\",\"name\":\"fastprof_merge\",\"pid\":0,\"tid\":0,\"args\":{\"inputs\":",
        );
        json::write_int(&mut head, kept.len());
        head.extend_from_slice(b"}}");
        head.extend_from_slice(&sort_events);
        sink.lock()
            .unwrap_or_else(|e| e.into_inner())
            .write(head)
            .map_err(out_err)?;
        let jobs: Vec<(usize, &InputInfo)> = kept.iter().enumerate().collect();
        let results = parallel(jobs, threads, cancel, |(idx, info)| -> Result<Counts> {
            let ctx = Ctx {
                info,
                rank: info.rank.unwrap_or(0),
                id_offset: (idx as i64 + 1) << 40,
                pids: pid_maps.get(&info.rank.unwrap_or(0)),
                out_base,
                window: rank_windows
                    .get(&info.rank.unwrap_or(0))
                    .copied()
                    .or(window),
                nest: (!nest.is_empty()).then_some(&nest),
                include: &opts.include_categories,
                exclude: &opts.exclude_categories,
                dropped: &dropped,
            };
            let mut counts = Counts::default();
            let mut sc = open_input(&info.path)?;
            let mut chunk = Vec::with_capacity(CHUNK + 4096);
            let mut last = 0;
            // Only the events pass 1 planned for: an open segment may have
            // grown (or been closed and renamed) since, with pids and times
            // the plan does not know.
            let mut seen = 0u64;
            loop {
                counts.name_pending(&info.path, sc.offset());
                if seen >= info.events {
                    break;
                }
                let Some(item) = sc.next_item()? else { break };
                if let Item::Event(raw) = item {
                    seen += 1;
                    rewrite(raw, &ctx, &mut counts, &mut chunk);
                    if chunk.len() >= CHUNK {
                        // Relaxed: a request to stop, nothing is published through it.
                        if cancel.load(Ordering::Relaxed) {
                            return Err(CoreError::Cancelled);
                        }
                        let c = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK + 4096));
                        sink.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .write(c)
                            .map_err(out_err)?;
                        let r = sc.compressed_read();
                        done.fetch_add(r.saturating_sub(last), Ordering::Relaxed);
                        last = r;
                    }
                }
            }
            done.fetch_add(sc.compressed_read().saturating_sub(last), Ordering::Relaxed);
            if cancel.load(Ordering::Relaxed) {
                return Err(CoreError::Cancelled);
            }
            if !chunk.is_empty() {
                sink.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .write(chunk)
                    .map_err(out_err)?;
            }
            Ok(counts)
        });
        first_error(results)
    })();
    let counts = match write_result {
        Ok(c) => c,
        Err(e) => {
            drop(sink);
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let mut data_out = 0;
    for (c, info) in counts.iter().zip(&kept) {
        summary.events_out += c.out;
        summary.events_dropped += c.invalid;
        summary.warnings.extend(c.warnings.iter().cloned());
        if c.invalid > rewrite::MAX_INVALID_WARNINGS {
            summary.warnings.push(format!(
                "{}: {} more malformed events dropped",
                info.path.display(),
                c.invalid - rewrite::MAX_INVALID_WARNINGS
            ));
        }
        data_out += c.data;
        summary.metadata_replaced += c.replaced;
        if c.utf8_fixed > 0 {
            summary.warnings.push(format!(
                "{}: invalid UTF-8 in {} events replaced by U+FFFD",
                info.path.display(),
                c.utf8_fixed
            ));
        }
        summary.filtered_window += c.window;
        summary.nest_moved += c.nest_moved;
        summary.nest_clipped += c.nest_clipped;
        summary.filtered_category += c.category;
        summary.filtered_max_bytes += c.max_bytes;
        summary.inputs_json.push(json!({
            "path": info.path.display().to_string(),
            "kind": info.kind.as_str(),
            "rank": info.rank,
            "base_ns": info.base_ns,
            "offset_ns": info.offset_ns,
            "offset_uncertainty_ns": info.offset_uncertainty_ns,
            "events_in": info.events,
            "events_out": c.out,
            "events_dropped": info.dropped + c.invalid,
            "salvaged_bytes": info.salvaged_bytes,
        }));
    }
    if data_out == 0 {
        drop(sink);
        let _ = std::fs::remove_file(&tmp);
        let metadata = summary.events_out;
        return Err(CoreError::NoEvents {
            reason: no_events_reason(opts, &summary, metadata),
        });
    }
    summary.files = kept.len();
    let other = json!({
        "producer": "fastprof merge",
        "version": crate::VERSION,
        "merged": true,
        "inputs": summary.inputs_json,
        "skipped_inputs": summary.skipped_files,
        "ranks": summary.ranks,
        "alignment": {
            "method": "baseTimeNanoseconds (or epoch µs) + per-rank clock offset from fastprof metadata",
            "uncertainty_ns": summary.uncertainty_ns,
        },
        "window": {"start_ns": summary.start_ns, "end_ns": summary.end_ns, "filtered": summary.filtered_window},
        "categories": {
            "include": opts.include_categories,
            "exclude": opts.exclude_categories,
            "filtered": summary.filtered_category,
        },
        "max_bytes": {"limit": opts.max_bytes, "dropped_categories": summary.dropped_categories, "filtered": summary.filtered_max_bytes},
        "filtered_rank": summary.filtered_rank,
        "events_in": summary.events_in,
        "events_out": summary.events_out,
        "events_dropped": summary.events_dropped,
        "metadata_added": summary.metadata_added,
        "metadata_replaced": summary.metadata_replaced,
        "salvaged_bytes": summary.salvaged_bytes,
        "nesting": {
            "python_calls": summary.python_calls,
            "moved": summary.nest_moved,
            "clipped_to_window": summary.nest_clipped,
        },
        "rotated": summary.rotated,
        "warnings": summary.warnings,
    });
    let mut tail = b"\n],\"otherData\":".to_vec();
    tail.extend_from_slice(&serde_json::to_vec(&other).unwrap_or_else(|_| b"{}".to_vec()));
    tail.extend_from_slice(b"}\n");
    let mut sink = sink.into_inner().unwrap_or_else(|e| e.into_inner());
    let finished = sink.write(tail).and_then(|_| sink.finish());
    match finished {
        Ok((u, c)) => {
            summary.bytes_uncompressed = u;
            summary.bytes_written = c;
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(out_err(e));
        }
    }
    if cancel.load(Ordering::Relaxed) {
        let _ = std::fs::remove_file(&tmp);
        return Err(CoreError::Cancelled);
    }
    std::fs::rename(&tmp, &opts.output).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        CoreError::io(&opts.output, e)
    })?;
    Ok(summary)
}

#[cfg(test)]
mod tests;
