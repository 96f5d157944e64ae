//! Streaming analysis for reports: the step-time breakdown per (rank, step).
//!
//! One pass of the [`Scanner`](crate::offline::trace::scan::Scanner) over each input
//! (fastprof segments, torch.profiler traces, run directories or a merged
//! trace; time base, clock offsets and ranks as
//! [`read_columns`](crate::offline::trace::columns::read_columns) places them) keeps
//! a compact record per event that matters (nested host ops of one role are
//! folded as they arrive), never the document; the breakdown is computed per
//! rank once everything is read.
//!
//! Steps are `ProfilerStep#N` where a rank has any, else fastprof `step`
//! spans. Per step:
//!
//! * the TensorBoard PyTorch-profiler plugin's breakdown: each instant of the
//!   step goes to the first role covering it in the order Kernel > Memcpy >
//!   Memset > Communication > Runtime > DataLoader > CPU Exec, the rest is
//!   Other, so the parts sum to the step exactly. On a GPU the step window is
//!   the plugin's: it ends when the last activity launched from inside it
//!   ends, and starts no earlier than the previous step's end;
//! * GPU utilisation (kernel busy time / step), estimated SM efficiency
//!   (time weighted by min(blocks per SM, 1)), estimated achieved occupancy
//!   (weighted by kernel time), tensor-core kernels' share of kernel time;
//! * HolisticTraceAnalysis's temporal breakdown (compute / non-compute /
//!   idle on the GPU), idle-time breakdown (host wait / kernel wait / other,
//!   gaps between consecutive activities on each stream), kernel types
//!   (communication / computation / memory / other) and the share of
//!   communication kernel time overlapped by computation kernels.
//!
//! A rank without GPU activity gets `has_gpu == false` and NaN / zero GPU
//! fields; its host breakdown is complete.

mod breakdown;
mod classify;
mod intervals;
mod read;
mod rows;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

pub use rows::{RankBars, RankSummary, ROLES};

use crate::error::Result;
use crate::offline::trace::columns::FileInfo;

/// HTA's `consecutive_kernel_delay` default (30 in trace time units, µs):
/// a gap between two activities on a stream shorter than this is launch
/// overhead ("kernel wait").
pub const KERNEL_WAIT_NS: i64 = 30_000;

/// One step of one rank. Times are epoch ns; every `*_ns` part of the
/// plugin's breakdown sums to `end_ns - start_ns`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepRow {
    pub rank: i32,
    pub step: i64,
    /// "ProfilerStep" or "step" (fastprof's step spans).
    pub source: &'static str,
    pub start_ns: i64,
    pub end_ns: i64,
    pub kernel_ns: i64,
    pub memcpy_ns: i64,
    pub memset_ns: i64,
    pub communication_ns: i64,
    pub runtime_ns: i64,
    pub dataloader_ns: i64,
    pub cpu_exec_ns: i64,
    pub other_ns: i64,
    /// The rank has GPU activity; when false every field below is 0 or NaN.
    pub has_gpu: bool,
    pub gpu_utilization: f64,
    pub sm_efficiency: f64,
    /// Percent, as Kineto writes it.
    pub achieved_occupancy: f64,
    pub tensor_core_share: f64,
    /// Union of all GPU activities in the step; `compute_ns` +
    /// `non_compute_ns` + `idle_ns` = step duration.
    pub gpu_busy_ns: i64,
    pub compute_ns: i64,
    pub non_compute_ns: i64,
    pub idle_ns: i64,
    pub idle_host_wait_ns: i64,
    pub idle_kernel_wait_ns: i64,
    pub idle_other_ns: i64,
    pub kernel_communication_ns: i64,
    pub kernel_computation_ns: i64,
    pub kernel_memory_ns: i64,
    pub kernel_other_ns: i64,
    /// Communication kernel time (union) and the part of it overlapped by
    /// other kernels; `comm_overlap_pct` NaN without communication.
    pub comm_kernel_ns: i64,
    pub comm_overlap_ns: i64,
    pub comm_overlap_pct: f64,
}

/// The sources a step can come from, as [`StepColumns::source`] codes.
pub const STEP_SOURCES: [&str; 2] = ["ProfilerStep", crate::contract::STEP_SPAN];

macro_rules! step_columns {
    ($($f:ident: $t:ty),* $(,)?) => {
        /// [`StepRow`]s column by column (a million-step run's rows as
        /// structs, then again as arrays, were most of a report's memory):
        /// each `Vec` becomes a numpy array without a copy. `source` is an
        /// index into [`STEP_SOURCES`].
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct StepColumns {
            pub source: Vec<u8>,
            $(pub $f: Vec<$t>,)*
        }

        impl StepColumns {
            pub fn len(&self) -> usize {
                self.step.len()
            }

            pub fn is_empty(&self) -> bool {
                self.step.is_empty()
            }

            pub(crate) fn reserve(&mut self, n: usize) {
                self.source.reserve_exact(n);
                $(self.$f.reserve_exact(n);)*
            }

            pub(crate) fn push(&mut self, r: &StepRow) {
                let code = STEP_SOURCES.iter().position(|s| *s == r.source).unwrap_or(0);
                self.source.push(code as u8);
                $(self.$f.push(r.$f);)*
            }

            /// Row `i` as a [`StepRow`].
            pub fn row(&self, i: usize) -> StepRow {
                StepRow {
                    source: STEP_SOURCES[usize::from(self.source[i])],
                    $($f: self.$f[i],)*
                }
            }

            /// Every row (tests and small runs).
            pub fn rows(&self) -> Vec<StepRow> {
                (0..self.len()).map(|i| self.row(i)).collect()
            }
        }
    };
}

step_columns!(
    rank: i32,
    step: i64,
    start_ns: i64,
    end_ns: i64,
    kernel_ns: i64,
    memcpy_ns: i64,
    memset_ns: i64,
    communication_ns: i64,
    runtime_ns: i64,
    dataloader_ns: i64,
    cpu_exec_ns: i64,
    other_ns: i64,
    has_gpu: bool,
    gpu_utilization: f64,
    sm_efficiency: f64,
    achieved_occupancy: f64,
    tensor_core_share: f64,
    gpu_busy_ns: i64,
    compute_ns: i64,
    non_compute_ns: i64,
    idle_ns: i64,
    idle_host_wait_ns: i64,
    idle_kernel_wait_ns: i64,
    idle_other_ns: i64,
    kernel_communication_ns: i64,
    kernel_computation_ns: i64,
    kernel_memory_ns: i64,
    kernel_other_ns: i64,
    comm_kernel_ns: i64,
    comm_overlap_ns: i64,
    comm_overlap_pct: f64,
);

/// One GPU of one rank, over all of the rank's steps.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceRow {
    pub rank: i32,
    pub device: i64,
    pub gpu_utilization: f64,
    pub sm_efficiency: f64,
    pub achieved_occupancy: f64,
}

/// What [`analyze_steps`] returns.
#[derive(Debug, Clone, Default)]
pub struct Analysis {
    /// Sorted by (rank, step start); empty unless rows were kept.
    pub steps: StepColumns,
    /// Per rank with steps, by rank.
    pub summaries: Vec<RankSummary>,
    pub bars: Vec<RankBars>,
    /// Steps over all ranks.
    pub step_count: u64,
    pub devices: Vec<DeviceRow>,
    pub files: Vec<FileInfo>,
    pub warnings: Vec<String>,
}

/// What [`analyze_steps_with`] keeps and writes.
#[derive(Debug, Clone)]
pub struct AnalyzeOptions<'a> {
    /// Write breakdown.csv here, a row at a time.
    pub csv: Option<&'a Path>,
    /// Keep every row as [`StepColumns`] (a report does not: 240 bytes a step).
    pub keep_rows: bool,
    /// Bars per rank in [`Analysis::bars`].
    pub max_bars: usize,
}

/// The step-time breakdown of `inputs` (files, directories, globs, as
/// `fastprof merge` takes them), every row kept. Errors as `read_columns`.
pub fn analyze_steps(inputs: &[PathBuf]) -> Result<Analysis> {
    analyze_steps_with(
        inputs,
        &AnalyzeOptions {
            csv: None,
            keep_rows: true,
            max_bars: 1000,
        },
    )
}

/// [`analyze_steps`], writing and keeping what `opts` says. A failure to
/// write the CSV is an error naming it.
pub fn analyze_steps_with(inputs: &[PathBuf], opts: &AnalyzeOptions<'_>) -> Result<Analysis> {
    let r = read::read(inputs)?;
    let mut ranks: Vec<_> = r.ranks.into_iter().collect();
    ranks.sort_by_key(|(rank, _)| *rank);
    let mut out = Analysis {
        files: r.files,
        warnings: r.warnings,
        ..Analysis::default()
    };
    // At most this many rows (duplicate steps are dropped): the columns
    // are allocated once, never regrown by doubling.
    let most: usize = ranks
        .iter()
        .map(|(_, d)| d.profiler_steps.len().max(d.fastprof_steps.len()))
        .sum();
    let mut rows = rows::Rows::new(opts.csv, opts.keep_rows, opts.max_bars)?;
    rows.reserve(most);
    for (rank, data) in ranks {
        let devices = breakdown::rank_rows(rank, data, &mut rows)?;
        out.devices.extend(devices);
    }
    rows.finish()?;
    out.steps = rows.kept.take().unwrap_or_default();
    out.summaries = std::mem::take(&mut rows.summaries);
    out.bars = std::mem::take(&mut rows.bars);
    out.step_count = out.summaries.iter().map(|s| s.steps).sum();
    if out.step_count == 0 {
        out.warnings
            .push("no steps: neither ProfilerStep#N nor fastprof step spans were found".into());
    }
    Ok(out)
}
