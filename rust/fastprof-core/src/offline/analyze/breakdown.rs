//! Per-rank step rows from the records of [`super::read`]: step windows, the
//! plugin's priority breakdown, GPU metrics and HTA's breakdowns.

use std::collections::HashMap;

use super::classify::{DeviceKind, HostRole, KernelType};
use super::intervals::{self as iv, Iv};
use super::read::{Device, RankData, Step};
use super::rows::Rows;
use super::{DeviceRow, StepRow, KERNEL_WAIT_NS, STEP_SOURCES};
use crate::error::Result;

/// The rows of one rank, handed to `out`; returns its per-device totals
/// over its steps.
pub(crate) fn rank_rows(rank: i32, mut rd: RankData, out: &mut Rows) -> Result<Vec<DeviceRow>> {
    let (mut steps, source) = if rd.profiler_steps.is_empty() {
        (std::mem::take(&mut rd.fastprof_steps), STEP_SOURCES[1])
    } else {
        (std::mem::take(&mut rd.profiler_steps), "ProfilerStep")
    };
    steps.sort_by_key(|s| (s.start, s.end, s.number));
    steps.dedup_by_key(|s| (s.start, s.end, s.number));
    if steps.is_empty() {
        return Ok(Vec::new());
    }
    rd.devices.sort_by_key(|d| (d.start, d.end));
    extend_to_device(&mut steps, &rd);

    let host =
        |role: HostRole, rd: &mut RankData| iv::union(rd.host.remove(&role).unwrap_or_default());
    let devs_of = |pred: &dyn Fn(&Device) -> bool| -> Vec<Iv> {
        iv::union(
            rd.devices
                .iter()
                .filter(|d| pred(d))
                .map(|d| (d.start, d.end))
                .collect(),
        )
    };
    let kernel = devs_of(&|d| d.kind == DeviceKind::Kernel);
    let comm_kernel = devs_of(&|d| d.kind == DeviceKind::CommKernel);
    let memcpy = devs_of(&|d| d.kind == DeviceKind::Memcpy);
    let memset = devs_of(&|d| d.kind == DeviceKind::Memset);
    // A list equal to one already built is not kept twice (on a rank of
    // compute kernels only, all four are one list of a million intervals).
    let all_kernels_own = if comm_kernel.is_empty() {
        None
    } else {
        Some(devs_of(&|d| {
            matches!(d.kind, DeviceKind::Kernel | DeviceKind::CommKernel)
        }))
    };
    let all_kernels: &[Iv] = all_kernels_own.as_deref().unwrap_or(&kernel);
    let busy_own = if memcpy.is_empty() && memset.is_empty() {
        None
    } else {
        Some(devs_of(&|_| true))
    };
    let busy: &[Iv] = busy_own.as_deref().unwrap_or(all_kernels);
    let compute_own = {
        let c = devs_of(&|d| d.ktype == KernelType::Computation);
        if c.as_slice() == kernel.as_slice() {
            None
        } else {
            Some(c)
        }
    };
    let compute: &[Iv] = compute_own.as_deref().unwrap_or(&kernel);
    let mut comm = comm_kernel.clone();
    let cpu_comm = host(HostRole::Communication, &mut rd);
    comm.extend(cpu_comm);
    let comm = iv::union(comm);
    let runtime = host(HostRole::Runtime, &mut rd);
    let loader = host(HostRole::DataLoader, &mut rd);
    let cpu = host(HostRole::CpuExec, &mut rd);
    // The plugin's priority: each instant goes to the first role covering it.
    let roles: [&[Iv]; 7] = [&kernel, &memcpy, &memset, &comm, &runtime, &loader, &cpu];
    let has_gpu = !rd.devices.is_empty();
    let mut gaps = stream_gaps(&rd);
    gaps.sort_unstable();
    // Launch times are used up (step windows, host-wait gaps).
    rd.runtimes = Vec::new();
    // Steps come in order of start (extend_to_device keeps it), so what
    // overlaps each is found by a sweep: linear in steps + activities, where
    // scanning every activity for every step was quadratic.
    let mut dev_sweep = Sweep::new(&rd.devices, |d: &Device| (d.start, d.end));
    let mut gap_sweep = Sweep::new(&gaps, |g: &(i64, i64, u8)| (g.0, g.1));

    out.begin_rank(rank, source, steps.len());
    for st in &steps {
        let (s, e) = (st.start, st.end);
        let mut parts = [0i64; 8];
        let mut slots: Vec<Iv> = if e > s { vec![(s, e)] } else { Vec::new() };
        for (i, role) in roles.iter().enumerate() {
            let taken = iv::intersect(&iv::clip(role, s, e), &slots);
            parts[i] = iv::len(&taken);
            slots = iv::subtract(&slots, &taken);
        }
        parts[7] = iv::len(&slots);
        let dur = e - s;
        let mut row = StepRow {
            rank,
            step: st.number,
            source,
            start_ns: s,
            end_ns: e,
            kernel_ns: parts[0],
            memcpy_ns: parts[1],
            memset_ns: parts[2],
            communication_ns: parts[3],
            runtime_ns: parts[4],
            dataloader_ns: parts[5],
            cpu_exec_ns: parts[6],
            other_ns: parts[7],
            has_gpu,
            gpu_utilization: f64::NAN,
            sm_efficiency: f64::NAN,
            achieved_occupancy: f64::NAN,
            tensor_core_share: f64::NAN,
            comm_overlap_pct: f64::NAN,
            ..StepRow::default()
        };
        if has_gpu {
            let in_step: Vec<&Device> = dev_sweep.overlapping(s, e);
            let m = gpu_metrics(&in_step, s, e, all_kernels);
            row.gpu_utilization = m.0;
            row.sm_efficiency = m.1;
            row.achieved_occupancy = m.2;
            row.tensor_core_share = m.3;
            row.gpu_busy_ns = iv::len(&iv::clip(busy, s, e));
            row.compute_ns = iv::len(&iv::clip(compute, s, e));
            row.non_compute_ns = row.gpu_busy_ns - row.compute_ns;
            row.idle_ns = dur - row.gpu_busy_ns;
            for d in &in_step {
                let t = iv::overlap(d.start, d.end, s, e);
                match d.ktype {
                    KernelType::Communication => row.kernel_communication_ns += t,
                    KernelType::Computation => row.kernel_computation_ns += t,
                    KernelType::Memory => row.kernel_memory_ns += t,
                    KernelType::Other => row.kernel_other_ns += t,
                }
            }
            for &&(a, b, cat) in &gap_sweep.overlapping(s, e) {
                let t = iv::overlap(a, b, s, e);
                match cat {
                    0 => row.idle_host_wait_ns += t,
                    1 => row.idle_kernel_wait_ns += t,
                    _ => row.idle_other_ns += t,
                }
            }
            let comm_k = iv::clip(&comm_kernel, s, e);
            row.comm_kernel_ns = iv::len(&comm_k);
            row.comm_overlap_ns = iv::len(&iv::intersect(&comm_k, &iv::clip(&kernel, s, e)));
            row.comm_overlap_pct = if row.comm_kernel_ns > 0 {
                100.0 * row.comm_overlap_ns as f64 / row.comm_kernel_ns as f64
            } else {
                f64::NAN
            };
        }
        out.push(&row)?;
    }
    out.end_rank();
    Ok(device_rows(rank, &rd.devices, &steps))
}

/// Items sorted by start, asked in turn which of them overlap windows
/// `[s, e)` whose starts never decrease: each item enters the active set
/// once (when a window's end passes its start) and leaves it once (when a
/// window starts at or after its end), so a pass over all windows costs the
/// items plus the overlaps, not items x windows.
pub(crate) struct Sweep<'a, T> {
    items: &'a [T],
    span: fn(&T) -> (i64, i64),
    next: usize,
    active: Vec<usize>,
    last_start: i64,
}

impl<'a, T> Sweep<'a, T> {
    pub(crate) fn new(items: &'a [T], span: fn(&T) -> (i64, i64)) -> Self {
        Sweep {
            items,
            span,
            next: 0,
            active: Vec::new(),
            last_start: i64::MIN,
        }
    }

    /// The items with `start < e` and `end > s`, in the order of `items`.
    pub(crate) fn overlapping(&mut self, s: i64, e: i64) -> Vec<&'a T> {
        debug_assert!(s >= self.last_start, "windows must come in order of start");
        self.last_start = s;
        let (items, span) = (self.items, self.span);
        while self.next < items.len() && span(&items[self.next]).0 < e {
            self.active.push(self.next);
            self.next += 1;
        }
        // An item ended by this window's start ends before every later one.
        self.active.retain(|&i| span(&items[i]).1 > s);
        self.active
            .iter()
            .map(|&i| &items[i])
            .filter(|t| span(t).0 < e)
            .collect()
    }
}

/// `(utilisation, SM efficiency, occupancy, tensor-core share)` over `[s, e)`
/// for the given activities (the caller picks the devices): kernel busy
/// time (the union, `kernels` a set) over the window; blocks-per-SM
/// weighted time over the window (overlapping kernels add up, capped at one
/// SM-full), NaN when no kernel says its blocks; occupancy weighted by
/// kernel time, NaN when no kernel has it; tensor-core kernels' share of
/// kernel time, NaN without kernel time.
fn gpu_metrics(devs: &[&Device], s: i64, e: i64, kernels: &[Iv]) -> (f64, f64, f64, f64) {
    let dur = (e - s) as f64;
    let util = if dur > 0.0 {
        iv::len(&iv::clip(kernels, s, e)) as f64 / dur
    } else {
        f64::NAN
    };
    let is_kernel = |d: &&&Device| matches!(d.kind, DeviceKind::Kernel | DeviceKind::CommKernel);
    // Sweep of blocks-per-SM values, capped at 1.
    let mut edges: Vec<(i64, f64)> = Vec::new();
    for d in devs
        .iter()
        .filter(is_kernel)
        .filter(|d| !d.blocks_per_sm.is_nan())
    {
        let (a, b) = (d.start.max(s), d.end.min(e));
        if b > a {
            let v = f64::from(d.blocks_per_sm).min(1.0);
            edges.push((a, v));
            edges.push((b, -v));
        }
    }
    let sm = if edges.is_empty() || dur <= 0.0 {
        f64::NAN
    } else {
        edges.sort_by_key(|x| x.0);
        let (mut level, mut area, mut at) = (0.0f64, 0.0f64, edges[0].0);
        for (t, dv) in edges {
            area += level.clamp(0.0, 1.0) * (t - at) as f64;
            level += dv;
            at = t;
        }
        area / dur
    };
    let (mut occ_sum, mut occ_time, mut k_time, mut tc_time) = (0.0, 0i64, 0i64, 0i64);
    for d in devs.iter().filter(is_kernel) {
        let t = iv::overlap(d.start, d.end, s, e);
        k_time += t;
        if d.tensor_cores {
            tc_time += t;
        }
        if !d.occupancy.is_nan() {
            occ_sum += f64::from(d.occupancy) * t as f64;
            occ_time += t;
        }
    }
    let occ = if occ_time > 0 {
        occ_sum / occ_time as f64
    } else {
        f64::NAN
    };
    let tc = if k_time > 0 {
        tc_time as f64 / k_time as f64
    } else {
        f64::NAN
    };
    (util, sm, occ, tc)
}

/// HTA's idle intervals: on each (device, stream), the gap before each
/// activity after the previous one's end, as `(start, end, category)`:
/// 0 host wait (the runtime call launching it began after the previous
/// activity ended), 1 kernel wait (shorter than [`KERNEL_WAIT_NS`]), 2 other.
fn stream_gaps(rd: &RankData) -> Vec<(i64, i64, u8)> {
    let mut by_stream: HashMap<(i64, i64), Vec<&Device>> = HashMap::new();
    for d in &rd.devices {
        by_stream.entry((d.device, d.stream)).or_default().push(d);
    }
    let mut gaps = Vec::new();
    for list in by_stream.values() {
        // `rd.devices` is sorted by start, so each list is too.
        for w in list.windows(2) {
            let (prev_end, next) = (w[0].end, w[1]);
            if next.start <= prev_end {
                continue;
            }
            let launched = rd.runtime(next.corr).map(|r| r.0);
            let cat = if launched.is_some_and(|t| t > prev_end) {
                0
            } else if next.start - prev_end < KERNEL_WAIT_NS {
                1
            } else {
                2
            };
            gaps.push((prev_end, next.start, cat));
        }
    }
    gaps
}

/// The plugin's step windows on a GPU: a step lasts until the last activity
/// launched by runtime calls inside it ends, and starts no earlier than the
/// previous step's end (the first step no earlier than the end of
/// activities launched before it that end before its own first one).
fn extend_to_device(steps: &mut [Step], rd: &RankData) {
    if rd.devices.is_empty() || rd.runtimes.is_empty() {
        return;
    }
    // (start, end, index into rd.runtimes), by start.
    let mut launches: Vec<(i64, i64, u32)> = rd
        .runtimes
        .iter()
        .enumerate()
        .map(|(i, &(_, s, e))| (s, e, i as u32))
        .collect();
    launches.sort_unstable();
    // Per launch (as rd.runtimes orders them): the step whose host window
    // holds it, NONE for none.
    const NONE: u32 = u32::MAX;
    let mut step_of: Vec<u32> = vec![NONE; rd.runtimes.len()];
    for (i, st) in steps.iter().enumerate() {
        let from = launches.partition_point(|l| l.0 < st.start);
        for &(_, e, at) in launches[from..].iter().take_while(|l| l.0 < st.end) {
            if e <= st.end {
                step_of[at as usize] = i as u32;
            }
        }
    }
    drop(launches);
    let step_of_corr = |corr: i64| {
        rd.runtimes
            .binary_search_by_key(&corr, |r| r.0)
            .ok()
            .map(|at| step_of[at])
            .filter(|&i| i != NONE)
    };
    let mut dev_span: Vec<Option<(i64, i64)>> = vec![None; steps.len()];
    for d in &rd.devices {
        if let Some(i) = step_of_corr(d.corr) {
            let span = dev_span[i as usize].get_or_insert((d.start, d.end));
            span.0 = span.0.min(d.start);
            span.1 = span.1.max(d.end);
        }
    }
    if dev_span.iter().all(Option::is_none) {
        return;
    }
    let mut prev_end = steps[0].start;
    if let Some((first_dev, _)) = dev_span[0] {
        for d in &rd.devices {
            if step_of_corr(d.corr).is_none() && d.end < first_dev {
                prev_end = prev_end.max(d.end);
            }
        }
    }
    for (st, span) in steps.iter_mut().zip(dev_span) {
        let start = prev_end.max(st.start);
        let end = match span {
            None => st.end.max(start),
            Some((_, dev_end)) => st.end.max(dev_end).max(start),
        };
        st.start = start;
        st.end = end;
        prev_end = end;
    }
}

/// Per (rank, device) over all the rank's steps: utilisation, SM
/// efficiency and occupancy as the plugin's GPU summary gives them.
fn device_rows(rank: i32, devices: &[Device], steps: &[Step]) -> Vec<DeviceRow> {
    let mut ids: Vec<i64> = devices.iter().map(|d| d.device).collect();
    ids.sort_unstable();
    ids.dedup();
    let total: i64 = steps.iter().map(|s| s.end - s.start).sum();
    ids.into_iter()
        .map(|id| {
            let kernels = iv::union(
                devices
                    .iter()
                    .filter(|d| d.device == id)
                    .filter(|d| matches!(d.kind, DeviceKind::Kernel | DeviceKind::CommKernel))
                    .map(|d| (d.start, d.end))
                    .collect(),
            );
            let (mut busy, mut sm_area, mut sm_any, mut occ_sum, mut occ_time) =
                (0i64, 0.0, false, 0.0, 0.0);
            // The rank's activities, this device's picked from each step's
            // (no copy of the device's list).
            let mut sweep = Sweep::new(devices, |d: &Device| (d.start, d.end));
            for st in steps {
                let mut in_step = sweep.overlapping(st.start, st.end);
                in_step.retain(|d| d.device == id);
                let (u, sm, occ, _) = gpu_metrics(&in_step, st.start, st.end, &kernels);
                let dur = (st.end - st.start) as f64;
                if !u.is_nan() {
                    busy += (u * dur).round() as i64;
                }
                if !sm.is_nan() {
                    sm_area += sm * dur;
                    sm_any = true;
                }
                if !occ.is_nan() {
                    let t: i64 = in_step
                        .iter()
                        .filter(|d| !d.occupancy.is_nan())
                        .filter(|d| matches!(d.kind, DeviceKind::Kernel | DeviceKind::CommKernel))
                        .map(|d| iv::overlap(d.start, d.end, st.start, st.end))
                        .sum();
                    occ_sum += occ * t as f64;
                    occ_time += t as f64;
                }
            }
            let ratio = |x: f64, sure: bool| {
                if total > 0 && sure {
                    x / total as f64
                } else {
                    f64::NAN
                }
            };
            DeviceRow {
                rank,
                device: id,
                gpu_utilization: ratio(busy as f64, true),
                sm_efficiency: ratio(sm_area, sm_any),
                achieved_occupancy: if occ_time > 0.0 {
                    occ_sum / occ_time
                } else {
                    f64::NAN
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Iv, Sweep};

    #[test]
    fn sweep_finds_what_a_scan_per_window_finds() {
        // Nested, overlapping, touching, empty and long items; windows with
        // gaps between them, nested windows and a window inside another.
        let items: Vec<Iv> = vec![
            (0, 100),
            (1, 3),
            (2, 2),
            (2, 50),
            (3, 4),
            (10, 11),
            (10, 30),
            (12, 13),
            (29, 31),
            (40, 41),
            (45, 90),
            (60, 61),
            (61, 62),
            (70, 200),
            (95, 96),
            (150, 151),
        ];
        let windows: [Iv; 9] = [
            (0, 5),
            (2, 12),
            (2, 3),
            (20, 25),
            (30, 60),
            (35, 40),
            (61, 61),
            (80, 150),
            (300, 400),
        ];
        let mut sw = Sweep::new(&items, |iv| *iv);
        for &(s, e) in &windows {
            let got: Vec<Iv> = sw.overlapping(s, e).into_iter().copied().collect();
            let want: Vec<Iv> = items
                .iter()
                .copied()
                .filter(|iv| iv.0 < e && iv.1 > s)
                .collect();
            assert_eq!(got, want, "window [{s}, {e})");
        }
    }
}
