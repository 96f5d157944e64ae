//! Pass 2 of a merge: the output written from the [`Plan`]. Each input's
//! events are copied through [`super::rewrite`] by parallel workers in ~1 MiB
//! chunks of whole events, between a head (base time, the merge's own
//! metadata, merged process and thread names) and a tail (`otherData`: what
//! the merge did). All of it goes to a hidden temporary beside the output,
//! renamed onto it only when complete ([`TempOutput`]).

use super::plan::InputInfo;
use super::rewrite::{self, rewrite, Counts, Ctx};
use super::{
    first_error, open_input, output_dir, output_error, parallel, show_inputs, MergeOptions,
    MergeSummary, Plan,
};
use crate::error::{CoreError, Result};
use crate::json;
use crate::offline::pargz::ParGzWriter;
use crate::offline::trace::scan::Item;
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const CHUNK: usize = 1 << 20;

enum Sink {
    Gz(Box<ParGzWriter>),
    Plain(BufWriter<File>, u64),
}

impl Sink {
    /// gzip, in parallel, unless the output is named `.json`.
    fn new(file: File, output: &Path, threads: usize, level: u32) -> std::io::Result<Sink> {
        if output.to_string_lossy().ends_with(".json") {
            Ok(Sink::Plain(BufWriter::with_capacity(CHUNK, file), 0))
        } else {
            let w = ParGzWriter::new(Box::new(file), threads, level)?;
            Ok(Sink::Gz(Box::new(w)))
        }
    }

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

/// One chunk of whole events to the sink the workers share.
fn send(sink: &Mutex<Sink>, chunk: Vec<u8>) -> std::io::Result<()> {
    sink.lock().unwrap_or_else(|e| e.into_inner()).write(chunk)
}

/// The output's temporary: hidden, beside the output so that the final
/// rename stays on one filesystem, and named with our pid. Dropped before
/// [`TempOutput::commit`] renamed it onto the output, it removes the file:
/// every error or cancel of pass 2 just returns, and leaves no temporary.
struct TempOutput {
    path: PathBuf,
    committed: bool,
}

impl TempOutput {
    /// Create the temporary for `output` (nothing to remove if that fails).
    fn create(output: &Path) -> std::io::Result<(TempOutput, File)> {
        let path = output_dir(output).join(format!(
            ".{}.tmp-{}",
            output
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id()
        ));
        let file = File::create(&path)?;
        let temp = TempOutput {
            path,
            committed: false,
        };
        Ok((temp, file))
    }

    /// Rename the complete temporary onto `output`. If the rename fails the
    /// temporary is still removed, on drop.
    fn commit(mut self, output: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, output)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Pass 2: write the output the plan describes and rename it into place.
pub(super) fn write_all(
    opts: &MergeOptions,
    mut plan: Plan,
    threads: usize,
    done: &Arc<AtomicU64>,
    cancel: &AtomicBool,
) -> Result<MergeSummary> {
    // Filled in here; the workers only read the rest of the plan.
    let mut summary = std::mem::take(&mut plan.summary);
    let out_err = |e: std::io::Error| output_error(&opts.output, e);
    // Declared before the sink, so dropped after it: the file is closed,
    // and the compression workers stopped, before it is removed.
    let (temp, file) = TempOutput::create(&opts.output).map_err(out_err)?;
    let sink = Sink::new(file, &opts.output, threads, opts.compression_level).map_err(out_err)?;
    let sink = Mutex::new(sink);
    send(&sink, head(&plan)).map_err(out_err)?;
    let counts = write_inputs(opts, &plan, &sink, threads, done, cancel)?;
    let data_out = fold_counts(&mut summary, &counts, &plan.kept);
    if data_out == 0 {
        let metadata = summary.events_out;
        return Err(CoreError::NoEvents {
            reason: no_events_reason(opts, &summary, metadata),
        });
    }
    summary.files = plan.kept.len();
    let tail = other_data_tail(opts, &summary);
    let mut sink = sink.into_inner().unwrap_or_else(|e| e.into_inner());
    let (u, c) = sink
        .write(tail)
        .and_then(|_| sink.finish())
        .map_err(out_err)?;
    summary.bytes_uncompressed = u;
    summary.bytes_written = c;
    // Relaxed: a request to stop, nothing is published through it.
    if cancel.load(Ordering::Relaxed) {
        return Err(CoreError::Cancelled);
    }
    temp.commit(&opts.output)
        .map_err(|e| CoreError::io(&opts.output, e))?;
    Ok(summary)
}

/// The output up to its first input event: the base every `ts` is written
/// against, a single rank's `distributedInfo`, the merge's own metadata
/// event, and the merged process and thread names.
fn head(plan: &Plan) -> Vec<u8> {
    let mut head = b"{\"baseTimeNanoseconds\":".to_vec();
    json::write_int(&mut head, plan.out_base);
    if let Some(Value::Object(d)) = &plan.distributed {
        head.extend_from_slice(b",\"distributedInfo\": ");
        json::write_spaced_object(&mut head, d);
    }
    head.extend_from_slice(b",\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    head.extend_from_slice(
        b"{\"ph\":\"M\",\"name\":\"fastprof_merge\",\"pid\":0,\"tid\":0,\"args\":{\"inputs\":",
    );
    json::write_int(&mut head, plan.kept.len());
    head.extend_from_slice(b"}}");
    head.extend_from_slice(&plan.sort_events);
    head
}

/// Every input's events, one input per worker at a time; their counts in
/// input order, or the first real error (see [`first_error`]).
fn write_inputs(
    opts: &MergeOptions,
    plan: &Plan,
    sink: &Mutex<Sink>,
    threads: usize,
    done: &AtomicU64,
    cancel: &AtomicBool,
) -> Result<Vec<Counts>> {
    let jobs: Vec<(usize, &InputInfo)> = plan.kept.iter().enumerate().collect();
    let results = parallel(jobs, threads, cancel, |(idx, info)| {
        let ctx = input_ctx(opts, plan, idx, info);
        write_input(&ctx, sink, &opts.output, done, cancel)
    });
    first_error(results)
}

/// What rewriting input `idx` of the plan needs: its rank's pids and window.
fn input_ctx<'a>(
    opts: &'a MergeOptions,
    plan: &'a Plan,
    idx: usize,
    info: &'a InputInfo,
) -> Ctx<'a> {
    let rank = info.rank.unwrap_or(0);
    Ctx {
        info,
        rank,
        id_offset: (idx as i64 + 1) << 40,
        pids: plan.pid_maps.get(&rank),
        out_base: plan.out_base,
        window: plan.rank_windows.get(&rank).copied().or(plan.window),
        nest: (!plan.nest.is_empty()).then_some(&plan.nest),
        include: &opts.include_categories,
        exclude: &opts.exclude_categories,
        dropped: &plan.dropped,
    }
}

/// One input's events, rewritten, to the sink in chunks; `done` counts the
/// compressed bytes read, and `cancel` is checked once per chunk.
fn write_input(
    ctx: &Ctx<'_>,
    sink: &Mutex<Sink>,
    output: &Path,
    done: &AtomicU64,
    cancel: &AtomicBool,
) -> Result<Counts> {
    let info = ctx.info;
    let out_err = |e: std::io::Error| output_error(output, e);
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
            rewrite(raw, ctx, &mut counts, &mut chunk);
            if chunk.len() >= CHUNK {
                // Relaxed: a request to stop, nothing is published through it.
                if cancel.load(Ordering::Relaxed) {
                    return Err(CoreError::Cancelled);
                }
                let c = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK + 4096));
                send(sink, c).map_err(out_err)?;
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
        send(sink, chunk).map_err(out_err)?;
    }
    Ok(counts)
}

/// Add each input's pass-2 counts and warnings into the summary, with the
/// input's line of `inputs_json`. Returns how many events other than
/// metadata were written: none is an error, not an output.
fn fold_counts(summary: &mut MergeSummary, counts: &[Counts], kept: &[InputInfo]) -> u64 {
    let mut data_out = 0;
    for (c, info) in counts.iter().zip(kept) {
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
    data_out
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

/// The output's end: `otherData`, what the merge did, so that a reader of
/// the file alone can tell how it was aligned, filtered and cut.
fn other_data_tail(opts: &MergeOptions, summary: &MergeSummary) -> Vec<u8> {
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
    tail
}
