//! Streaming analysis for reports: the step-time breakdown per (rank, step).
//!
//! One pass of the [`Scanner`](crate::trace::scan::Scanner) over each input
//! (fastprof segments, torch.profiler traces, run directories or a merged
//! trace; time base, clock offsets and ranks as
//! [`read_columns`](crate::trace::columns::read_columns) places them) keeps
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
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use crate::error::Result;
use crate::trace::columns::FileInfo;

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
    /// Sorted by (rank, step start).
    pub steps: Vec<StepRow>,
    pub devices: Vec<DeviceRow>,
    pub files: Vec<FileInfo>,
    pub warnings: Vec<String>,
}

/// The step-time breakdown of `inputs` (files, directories, globs, as
/// `fastprof merge` takes them). Errors as `read_columns`.
pub fn analyze_steps(inputs: &[PathBuf]) -> Result<Analysis> {
    let r = read::read(inputs)?;
    let mut ranks: Vec<_> = r.ranks.into_iter().collect();
    ranks.sort_by_key(|(rank, _)| *rank);
    let mut out = Analysis {
        files: r.files,
        warnings: r.warnings,
        ..Analysis::default()
    };
    for (rank, data) in ranks {
        let (rows, devices) = breakdown::rank_rows(rank, data);
        out.steps.extend(rows);
        out.devices.extend(devices);
    }
    if out.steps.is_empty() {
        out.warnings
            .push("no steps: neither ProfilerStep#N nor fastprof step spans were found".into());
    }
    Ok(out)
}
