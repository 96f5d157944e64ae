//! Where the step rows go as they are computed: breakdown.csv written a row
//! at a time, each rank's summary and its step bars accumulated, and the
//! rows themselves kept as columns only when asked. A million-step report
//! so holds a few numbers per rank, not a million rows.

use std::path::Path;

use super::{StepColumns, StepRow};
use crate::error::Result;
use crate::offline::csvout::RowWriter;

/// The plugin's roles in priority order: breakdown.csv's and the bars' names.
pub const ROLES: [&str; 8] = [
    "kernel_ns",
    "memcpy_ns",
    "memset_ns",
    "communication_ns",
    "runtime_ns",
    "dataloader_ns",
    "cpu_exec_ns",
    "other_ns",
];

/// breakdown.csv's columns after the roles, all empty without GPU activity.
const GPU_HEADERS: [&str; 14] = [
    "gpu_util",
    "sm_efficiency",
    "occupancy",
    "tensor_core_share",
    "compute_ns",
    "non_compute_ns",
    "idle_ns",
    "idle_host_wait_ns",
    "idle_kernel_wait_ns",
    "idle_other_ns",
    "kernel_communication_ns",
    "kernel_computation_ns",
    "kernel_memory_ns",
    "overlap_pct",
];

/// One rank over all its steps: the report's `breakdown.per_rank` entry.
/// Means are over the steps with GPU activity, NaN left out (NaN when none).
#[derive(Debug, Clone, PartialEq)]
pub struct RankSummary {
    pub rank: i32,
    pub steps: u64,
    pub duration_ns: i64,
    pub step_mean_ns: f64,
    /// numpy's default ("linear") percentiles of the step durations.
    pub step_p50_ns: f64,
    pub step_p95_ns: f64,
    pub step_max_ns: i64,
    /// Sums of [`ROLES`] over the steps.
    pub parts: [i64; 8],
    pub gpu_steps: u64,
    pub gpu_util: f64,
    pub sm_efficiency: f64,
    pub occupancy: f64,
    pub tensor_core_share: f64,
    pub overlap_pct: f64,
    /// Where the steps came from ("ProfilerStep", "step").
    pub source: &'static str,
}

/// A rank's steps as at most `max_bars` bars, in order of start: each bar
/// the mean of `per` consecutive steps (the last may hold fewer), placed at
/// its first step's number.
#[derive(Debug, Clone, PartialEq)]
pub struct RankBars {
    pub rank: i32,
    pub per: u64,
    pub step: Vec<i64>,
    /// Mean ns of each of [`ROLES`] per bar.
    pub parts: [Vec<f64>; 8],
}

#[derive(Default)]
struct Mean {
    sum: f64,
    n: u64,
}

impl Mean {
    fn add(&mut self, x: f64) {
        if !x.is_nan() {
            self.sum += x;
            self.n += 1;
        }
    }

    fn get(&self) -> f64 {
        if self.n > 0 {
            self.sum / self.n as f64
        } else {
            f64::NAN
        }
    }
}

/// The rank being filled.
struct Open {
    rank: i32,
    source: &'static str,
    durations: Vec<i64>,
    parts: [i64; 8],
    gpu_steps: u64,
    means: [Mean; 5],
    bars: RankBars,
    in_bar: u64,
    bar_sums: [i64; 8],
}

/// The sink of [`super::breakdown::rank_rows`].
pub struct Rows {
    pub(crate) kept: Option<StepColumns>,
    csv: Option<RowWriter>,
    max_bars: usize,
    open: Option<Open>,
    pub(crate) summaries: Vec<RankSummary>,
    pub(crate) bars: Vec<RankBars>,
}

impl Rows {
    /// `csv`: write breakdown.csv there; `keep`: keep every row as columns;
    /// `max_bars`: bars per rank (at least 1).
    pub fn new(csv: Option<&Path>, keep: bool, max_bars: usize) -> Result<Rows> {
        let csv = match csv {
            None => None,
            Some(p) => {
                let mut headers = vec!["step", "rank", "source", "start_ns", "duration_ns"];
                headers.extend(ROLES);
                headers.extend(GPU_HEADERS);
                Some(RowWriter::create(p, &headers)?)
            }
        };
        Ok(Rows {
            kept: keep.then(StepColumns::default),
            csv,
            max_bars: max_bars.max(1),
            open: None,
            summaries: Vec::new(),
            bars: Vec::new(),
        })
    }

    pub(crate) fn reserve(&mut self, n: usize) {
        if let Some(k) = &mut self.kept {
            k.reserve(n);
        }
    }

    /// The next rank's `n` steps follow.
    pub(crate) fn begin_rank(&mut self, rank: i32, source: &'static str, n: usize) {
        let per = n.div_ceil(self.max_bars).max(1) as u64;
        self.open = Some(Open {
            rank,
            source,
            durations: Vec::with_capacity(n),
            parts: [0; 8],
            gpu_steps: 0,
            means: Default::default(),
            bars: RankBars {
                rank,
                per,
                step: Vec::new(),
                parts: Default::default(),
            },
            in_bar: 0,
            bar_sums: [0; 8],
        });
    }

    pub(crate) fn push(&mut self, r: &StepRow) -> Result<()> {
        if let Some(k) = &mut self.kept {
            k.push(r);
        }
        let parts = [
            r.kernel_ns,
            r.memcpy_ns,
            r.memset_ns,
            r.communication_ns,
            r.runtime_ns,
            r.dataloader_ns,
            r.cpu_exec_ns,
            r.other_ns,
        ];
        if let Some(o) = &mut self.open {
            o.durations.push(r.end_ns - r.start_ns);
            for (sum, p) in o.parts.iter_mut().zip(parts) {
                *sum = sum.saturating_add(p);
            }
            if r.has_gpu {
                o.gpu_steps += 1;
                let ratios = [
                    r.gpu_utilization,
                    r.sm_efficiency,
                    r.achieved_occupancy,
                    r.tensor_core_share,
                    r.comm_overlap_pct,
                ];
                for (m, x) in o.means.iter_mut().zip(ratios) {
                    m.add(x);
                }
            }
            if o.in_bar == 0 {
                o.bars.step.push(r.step);
            }
            for (sum, p) in o.bar_sums.iter_mut().zip(parts) {
                *sum = sum.saturating_add(p);
            }
            o.in_bar += 1;
            if o.in_bar == o.bars.per {
                close_bar(o);
            }
        }
        let Some(w) = &mut self.csv else {
            return Ok(());
        };
        w.int(r.step);
        w.int(i64::from(r.rank));
        w.text(r.source);
        w.int(r.start_ns);
        w.int(r.end_ns - r.start_ns);
        for p in parts {
            w.int(p);
        }
        if r.has_gpu {
            for x in [
                r.gpu_utilization,
                r.sm_efficiency,
                r.achieved_occupancy,
                r.tensor_core_share,
            ] {
                w.float(x);
            }
            for v in [
                r.compute_ns,
                r.non_compute_ns,
                r.idle_ns,
                r.idle_host_wait_ns,
                r.idle_kernel_wait_ns,
                r.idle_other_ns,
                r.kernel_communication_ns,
                r.kernel_computation_ns,
                r.kernel_memory_ns,
            ] {
                w.int(v);
            }
            w.float(r.comm_overlap_pct);
        } else {
            for _ in GPU_HEADERS {
                w.empty();
            }
        }
        w.end()
    }

    /// The rank's steps are all in: its summary and bars.
    pub(crate) fn end_rank(&mut self) {
        let Some(mut o) = self.open.take() else {
            return;
        };
        if o.in_bar > 0 {
            close_bar(&mut o);
        }
        let d = &mut o.durations;
        if d.is_empty() {
            return;
        }
        let total: i64 = d.iter().fold(0i64, |a, &x| a.saturating_add(x));
        d.sort_unstable();
        let m = &o.means;
        self.summaries.push(RankSummary {
            rank: o.rank,
            steps: d.len() as u64,
            duration_ns: total,
            step_mean_ns: d.iter().map(|&x| x as f64).sum::<f64>() / d.len() as f64,
            step_p50_ns: percentile(d, 0.5),
            step_p95_ns: percentile(d, 0.95),
            step_max_ns: *d.last().expect("not empty"),
            parts: o.parts,
            gpu_steps: o.gpu_steps,
            gpu_util: m[0].get(),
            sm_efficiency: m[1].get(),
            occupancy: m[2].get(),
            tensor_core_share: m[3].get(),
            overlap_pct: m[4].get(),
            source: o.source,
        });
        self.bars.push(o.bars);
    }

    /// Flush breakdown.csv.
    pub(crate) fn finish(&mut self) -> Result<()> {
        match self.csv.take() {
            Some(w) => w.finish(),
            None => Ok(()),
        }
    }
}

fn close_bar(o: &mut Open) {
    let n = o.in_bar as f64;
    for (col, sum) in o.bars.parts.iter_mut().zip(&mut o.bar_sums) {
        col.push(*sum as f64 / n);
        *sum = 0;
    }
    o.in_bar = 0;
}

/// numpy's default ("linear") percentile `q` (0..1) of sorted values,
/// interpolated as numpy does it (from the nearer end past the midpoint).
fn percentile(sorted: &[i64], q: f64) -> f64 {
    let pos = (sorted.len() - 1) as f64 * q;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let (a, b, t) = (sorted[lo] as f64, sorted[hi] as f64, pos - lo as f64);
    let diff = b - a;
    if t >= 0.5 {
        b - diff * (1.0 - t)
    } else {
        a + diff * t
    }
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_as_numpy_gives_them() {
        // np.percentile([1, 2, 3, 4, 10], [50, 95]) -> [3.0, 8.8]
        let v = [1, 2, 3, 4, 10];
        assert_eq!(percentile(&v, 0.5), 3.0);
        assert!((percentile(&v, 0.95) - 8.8).abs() < 1e-12);
        assert_eq!(percentile(&[7], 0.95), 7.0);
    }
}
