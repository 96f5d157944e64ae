//! `fastprof merge`: one aligned timeline from fastprof segments,
//! torch.profiler (Kineto) traces and every rank of a distributed run,
//! streaming in constant memory.
//!
//! Two passes over each input, both streaming through [`crate::offline::trace::scan`]:
//! 1. [`plan`]: base time, rank, clock offset, pids, step markers, time range,
//!    bytes per category. Needed first because Kineto may write
//!    `baseTimeNanoseconds` after `traceEvents`, and windows by step need
//!    every rank's steps before any event is placed.
//! 2. `write`: each event's raw bytes are copied through with only the fields
//!    merging must change rewritten ([`rewrite`]: `pid`, `ts`, flow/async
//!    `id`s, process names and sort indexes), in ~1 MiB chunks compressed in parallel into a
//!    single-member gzip ([`crate::offline::pargz`]), written to a temporary name and
//!    renamed when complete.
//!
//! Timestamps are parsed as decimal text into integer ns, never through a
//! float, brought to epoch ns (base + ts + the rank's clock offset), and
//! written against one output `baseTimeNanoseconds`.

use crate::offline::trace::inputs;
mod names;
pub mod nest;
pub mod plan;
mod rewrite;
pub mod rotated;
mod write;

use crate::error::{CoreError, Result};
use crate::offline::trace::scan::Scanner;
use plan::{InputInfo, Kind};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use write::write_all;

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
            output: PathBuf::from(crate::contract::UNIFIED_TRACE),
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
        .map(|p| inputs::input_len(p, &found.listed))
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

/// Open an input, following a rename between the listing (or pass 1) and
/// this open ([`inputs::open_listed`]).
fn open_input(path: &Path) -> Result<Scanner> {
    inputs::open_listed(path)
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

/// An epoch-ns interval of the merged timeline: (start, end).
type Span = (i64, i64);

/// What pass 1 decided for pass 2.
struct Plan {
    kept: Vec<InputInfo>,
    summary: MergeSummary,
    window: Option<Span>,
    rank_windows: HashMap<u32, Span>,
    dropped: Vec<String>,
    pid_maps: HashMap<u32, HashMap<Vec<u8>, i64>>,
    sort_events: Vec<u8>,
    out_base: i64,
    nest: nest::NestIndex,
    /// The output's top-level `distributedInfo` (a single rank's merge only).
    distributed: Option<Value>,
}

/// Pass 1 over every input, then what pass 2 needs decided across them:
/// ranks and clock offsets, the rank filter, the window, the byte budget,
/// merged pids and names, and the nesting index.
fn plan_all(
    opts: &MergeOptions,
    files: Vec<PathBuf>,
    threads: usize,
    done: &Arc<AtomicU64>,
    cancel: &AtomicBool,
) -> Result<Plan> {
    let mut summary = MergeSummary {
        output: opts.output.clone(),
        ..Default::default()
    };
    let read = read_inputs(files, threads, done, cancel, &mut summary)?;
    let mut kept = keep_inputs(opts, read, &mut summary)?;
    assign_ranks(&mut kept, &mut summary.warnings);
    share_rank_offsets(&mut kept);
    if let Some(want) = &opts.ranks {
        summary.filtered_rank = filter_ranks(&mut kept, want)?;
    }
    let ranks: BTreeSet<u32> = kept.iter().map(|i| i.rank.unwrap_or(0)).collect();
    summary.ranks = ranks.iter().copied().collect();
    let (start, end) = time_range(&kept);
    let (window, rank_windows) = choose_window(&opts.window, &kept, start, end)?;
    let dropped = match opts.max_bytes {
        Some(max) => category_budget(max, &kept, &mut summary.warnings),
        None => Vec::new(),
    };
    summary.dropped_categories = dropped.clone();
    // pids: unique per (rank, original pid), numbered so the rank shows,
    // and one name per pid and per thread (see `names`).
    let names::Names {
        pid_maps,
        metadata: sort_events,
        added,
    } = names::plan(&kept);
    summary.metadata_added += added;
    let nest = nest_index(&mut kept);
    summary.python_calls = nest.calls() as u64;
    let distributed = distributed_info(&kept, &summary.ranks);
    let out_base = window.map_or(start, |w| w.0.max(start));
    summary.base_ns = out_base;
    summary.rotated = rotated::by_rank(&kept, out_base);
    summary.start_ns = out_base;
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

/// Pass 1 ([`plan::scan_input`]) over every input in parallel, in input
/// order. An open segment a recording has just created holds no event yet
/// (0 bytes, or part of the gzip header): it is skipped with a warning, not
/// an error, since there is nothing to merge in it.
fn read_inputs(
    files: Vec<PathBuf>,
    threads: usize,
    done: &Arc<AtomicU64>,
    cancel: &AtomicBool,
    summary: &mut MergeSummary,
) -> Result<Vec<InputInfo>> {
    let is_part = |p: &Path| p.extension().is_some_and(|e| e == "part");
    let infos = parallel(files.clone(), threads, cancel, |p| {
        match open_input(&p).and_then(|sc| plan::scan_input(p.clone(), sc, done, cancel)) {
            Err(CoreError::Trace { reason, .. }) if is_part(&p) => Ok(Err(Some(reason))),
            Err(e) if inputs::is_gone(&e) => Ok(Err(None)),
            other => other.map(Ok),
        }
    });
    let mut read = Vec::with_capacity(infos.len());
    for (r, path) in first_error(infos)?.into_iter().zip(&files) {
        match r {
            Ok(info) => read.push(info),
            Err(Some(reason)) => {
                summary.warnings.push(format!(
                    "{}: skipped, an open segment with nothing readable yet ({reason})",
                    path.display()
                ));
                summary
                    .skipped_files
                    .push(format!("{} (empty open segment)", path.display()));
            }
            Err(None) => {
                summary.warnings.push(inputs::gone_warning(path));
                summary
                    .skipped_files
                    .push(format!("{} (gone since listed)", path.display()));
            }
        }
    }
    Ok(read)
}

/// The inputs read that are merged: all but previous merge outputs (a run
/// directory holds its merged trace beside the segments it was made from).
/// Counts what pass 1 read of them; none left is an error naming what was
/// skipped.
fn keep_inputs(
    opts: &MergeOptions,
    read: Vec<InputInfo>,
    summary: &mut MergeSummary,
) -> Result<Vec<InputInfo>> {
    let mut kept: Vec<InputInfo> = Vec::new();
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
    Ok(kept)
}

/// Ranks come from metadata or the path; an input with neither is taken as
/// rank 0, with a warning, since pass 2 places every event by its rank.
fn assign_ranks(kept: &mut [InputInfo], warnings: &mut Vec<String>) {
    let mut unranked = 0;
    for info in kept.iter_mut() {
        if info.rank.is_none() {
            warnings.push(format!(
                "{}: no rank in metadata or path; taken as rank 0",
                info.path.display()
            ));
            info.rank = Some(0);
            unranked += 1;
        }
    }
    if unranked > 1 {
        warnings.push(format!(
            "{unranked} inputs had no rank; their processes still get distinct pids"
        ));
    }
}

/// Clock offsets are per rank, but only fastprof measures one: a rank's
/// other inputs (its torch traces) take the offset of its first fastprof input.
fn share_rank_offsets(kept: &mut [InputInfo]) {
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
}

/// Keep only the inputs of the ranks in `want`; returns how many events
/// the others held. None left is an error: the ranks asked for are not there.
fn filter_ranks(kept: &mut Vec<InputInfo>, want: &[u32]) -> Result<u64> {
    let before = kept.len();
    let mut gone = 0;
    kept.retain(|i| {
        let keep = want.contains(&i.rank.unwrap_or(0));
        if !keep {
            gone += i.events;
        }
        keep
    });
    if kept.is_empty() {
        return Err(CoreError::config(
            "ranks",
            format!("none of the {before} inputs has a rank in {want:?}"),
        ));
    }
    Ok(gone)
}

/// The epoch-ns range the inputs' events cover: (first start, last end).
fn time_range(kept: &[InputInfo]) -> Span {
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
    (start, end)
}

/// The epoch-ns window of events to keep (None: all), and for a window by
/// steps each rank's own (see [`step_windows`]).
fn choose_window(
    window: &Window,
    kept: &[InputInfo],
    start: i64,
    end: i64,
) -> Result<(Option<Span>, HashMap<u32, Span>)> {
    match window {
        Window::All => Ok((None, HashMap::new())),
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
            let w = (
                start.saturating_add((s * 1e9) as i64),
                e.map_or(i64::MAX, |e| start.saturating_add((e * 1e9) as i64)),
            );
            Ok((Some(w), HashMap::new()))
        }
        Window::Steps { from, to } => step_windows(kept, *from, *to),
    }
}

/// A window by steps `from..=to`: overall from the first selected step's
/// start to the last one's end, and per rank over that rank's own steps,
/// since ranks reach a step at different times and each keeps its own.
fn step_windows(
    kept: &[InputInfo],
    from: u64,
    to: u64,
) -> Result<(Option<Span>, HashMap<u32, Span>)> {
    let mut overall: Option<Span> = None;
    let mut rank_windows: HashMap<u32, Span> = HashMap::new();
    for i in kept {
        for st in i
            .steps
            .iter()
            .filter(|s| s.number >= from && s.number <= to)
        {
            let (s, e) = (i.abs(st.start), i.abs(st.end));
            let w = rank_windows
                .entry(i.rank.unwrap_or(0))
                .or_insert((i64::MAX, i64::MIN));
            w.0 = w.0.min(s);
            w.1 = w.1.max(e);
            overall = Some(overall.map_or((s, e), |(a, b)| (a.min(s), b.max(e))));
        }
    }
    let Some(w) = overall else {
        return Err(CoreError::config(
            "steps",
            format!("no step markers numbered {from}..={to} (ProfilerStep#N or fastprof 'step' spans) in the inputs"),
        ));
    };
    Ok((Some(w), rank_windows))
}

/// The categories `max_bytes` drops: low-value ones, lowest first, until
/// pass 1's estimate of the output fits (a warning when even all of them
/// are not enough).
fn category_budget(max: u64, kept: &[InputInfo], warnings: &mut Vec<String>) -> Vec<String> {
    let mut dropped: Vec<String> = Vec::new();
    let mut estimate: u64 = kept.iter().map(|i| i.bytes).sum();
    let mut by_cat: HashMap<&str, u64> = HashMap::new();
    for i in kept {
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
        warnings.push(format!(
            "--max-bytes {max}: still ~{estimate} bytes after dropping every low-value category"
        ));
    }
    dropped
}

/// The python_function index for strict nesting (bounded by their count);
/// the calls move from the inputs into it.
fn nest_index(kept: &mut [InputInfo]) -> nest::NestIndex {
    let mut nest = nest::NestIndex::default();
    for i in kept.iter_mut() {
        let calls = std::mem::take(&mut i.py_calls);
        if !calls.is_empty() {
            let info: &InputInfo = i;
            nest.add(info.rank.unwrap_or(0), calls, |t| info.abs(t));
        }
    }
    nest.finish();
    nest
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

#[cfg(test)]
mod tests;
