//! The sampler's in-memory history: the last `history` samples per metric,
//! for `Recorder.counters()` and for energy over an interval (the trace
//! keeps every sample).

use std::collections::VecDeque;

/// Bounded per-metric sample history.
pub struct SeriesStore {
    names: Vec<String>,
    data: Vec<VecDeque<(u64, f64)>>,
    cap: usize,
}

impl SeriesStore {
    pub(super) fn new(cap: usize) -> SeriesStore {
        SeriesStore {
            names: Vec::new(),
            data: Vec::new(),
            cap: cap.max(2),
        }
    }

    pub(super) fn ensure(&mut self, id: usize, name: &str) {
        while self.names.len() <= id {
            self.names.push(String::new());
            self.data.push(VecDeque::new());
        }
        if self.names[id].is_empty() {
            self.names[id] = name.to_string();
        }
    }

    pub(super) fn push(&mut self, id: usize, ts: u64, v: f64) {
        let q = &mut self.data[id];
        if q.len() == self.cap {
            q.pop_front();
        }
        q.push_back((ts, v));
    }

    /// Every metric: (name, CLOCK_MONOTONIC ns, values).
    pub fn snapshot(&self) -> Vec<(String, Vec<u64>, Vec<f64>)> {
        self.names
            .iter()
            .zip(&self.data)
            .map(|(n, q)| {
                (
                    n.clone(),
                    q.iter().map(|x| x.0).collect(),
                    q.iter().map(|x| x.1).collect(),
                )
            })
            .collect()
    }

    pub(super) fn series(&self, name: &str) -> Option<&VecDeque<(u64, f64)>> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| &self.data[i])
    }

    /// Joules a GPU used between two CLOCK_MONOTONIC instants: the driver's
    /// energy counter where supported, else power integrated over time.
    /// Returns (joules, source). The counter is read at the pace the NVML
    /// budget allows (on an H200 a read costs 4 ms of CPU: about every
    /// 1-2 s at the default budget), power every tick, so the counter is
    /// taken at its readings and power gives its shape in between
    /// (`energy_at`).
    pub fn energy_between(&self, gpu: &str, t0: u64, t1: u64) -> Option<(f64, &'static str)> {
        let power = self
            .series(&format!("{gpu}.power [W]"))
            .filter(|q| q.len() >= 2);
        if let Some(q) = self
            .series(&format!("{gpu}.energy [J]"))
            .filter(|q| q.len() >= 2)
        {
            let (a, b) = (energy_at(q, power, t0)?, energy_at(q, power, t1)?);
            return Some((b - a, "energy_counter"));
        }
        Some((integrate(power?, t0, t1), "integrated_power"))
    }
}

/// The energy counter's value at `t`. Between two readings, their
/// difference shared out in proportion to the power integrated from the
/// first reading to `t` (a burst inside a gap gets its energy where it
/// happened, not spread linearly over the gap); beyond the readings, the
/// nearest one plus or minus the integrated power. Without power (or none
/// in the gap), linear between readings and clamped to their ends.
fn energy_at(
    e: &VecDeque<(u64, f64)>,
    power: Option<&VecDeque<(u64, f64)>>,
    t: u64,
) -> Option<f64> {
    let (first, last) = (*e.front()?, *e.back()?);
    let Some(p) = power else {
        return interp(e, t);
    };
    if t <= first.0 {
        return Some(first.1 - integrate(p, t, first.0));
    }
    if t >= last.0 {
        return Some(last.1 + integrate(p, last.0, t));
    }
    let i = e.partition_point(|x| x.0 <= t);
    let (a, b) = (e[i - 1], e[i]);
    let whole = integrate(p, a.0, b.0);
    if whole <= 0.0 {
        return interp(e, t);
    }
    Some(a.1 + (b.1 - a.1) * integrate(p, a.0, t) / whole)
}

/// Linear interpolation of a series at `t` (clamped to its ends).
fn interp(q: &VecDeque<(u64, f64)>, t: u64) -> Option<f64> {
    let (first, last) = (q.front()?, q.back()?);
    if t <= first.0 {
        return Some(first.1);
    }
    if t >= last.0 {
        return Some(last.1);
    }
    let i = q.partition_point(|x| x.0 <= t);
    let (a, b) = (q[i - 1], q[i]);
    Some(a.1 + (b.1 - a.1) * (t - a.0) as f64 / (b.0 - a.0) as f64)
}

/// Trapezoid integral (value × seconds) of a series over [t0, t1].
pub(super) fn integrate(q: &VecDeque<(u64, f64)>, t0: u64, t1: u64) -> f64 {
    if t1 <= t0 {
        return 0.0;
    }
    let mut pts: Vec<(u64, f64)> = vec![(t0, interp(q, t0).unwrap_or(0.0))];
    pts.extend(q.iter().copied().filter(|x| x.0 > t0 && x.0 < t1));
    pts.push((t1, interp(q, t1).unwrap_or(0.0)));
    pts.windows(2)
        .map(|w| (w[1].0 - w[0].0) as f64 / 1e9 * (w[0].1 + w[1].1) / 2.0)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn energy_from_counter_and_from_power() {
        let mut s = SeriesStore::new(16);
        s.ensure(0, "gpu0.energy [J]");
        s.ensure(1, "gpu1.power [W]");
        for i in 0..5u64 {
            s.push(0, i * 1_000_000_000, 100.0 + 50.0 * i as f64);
            s.push(1, i * 1_000_000_000, 200.0);
        }
        let (j, src) = s
            .energy_between("gpu0", 1_000_000_000, 3_500_000_000)
            .unwrap();
        assert!((j - 125.0).abs() < 1e-9 && src == "energy_counter");
        let (j, src) = s
            .energy_between("gpu1", 500_000_000, 2_500_000_000)
            .unwrap();
        assert!((j - 400.0).abs() < 1e-6 && src == "integrated_power", "{j}");
        assert!(s.energy_between("gpu7", 0, 1).is_none());
    }

    #[test]
    fn sparse_energy_readings_take_their_shape_from_power() {
        // Counter read at 0 s and 4 s (100 J, 1300 J); power every 0.1 s:
        // 100 W idle, then 500 W from 1 s to 3 s (a burst inside the gap).
        let mut s = SeriesStore::new(128);
        s.ensure(0, "gpu0.energy [J]");
        s.ensure(1, "gpu0.power [W]");
        s.push(0, 0, 100.0);
        s.push(0, 4_000_000_000, 1300.0);
        for k in 0..=50u64 {
            let t = k * 100_000_000;
            let w = if (1_000_000_000..3_000_000_000).contains(&t) {
                500.0
            } else {
                100.0
            };
            s.push(1, t, w);
        }
        // The burst's 2 s hold (nearly) all of the 1200 J beyond idle: a
        // linear share of the gap would give it 600 J.
        let (j, src) = s
            .energy_between("gpu0", 1_000_000_000, 3_000_000_000)
            .unwrap();
        assert_eq!(src, "energy_counter");
        assert!((j - 1000.0).abs() < 25.0, "{j}");
        // The whole gap is the counter's own difference, exactly.
        let (j, _) = s.energy_between("gpu0", 0, 4_000_000_000).unwrap();
        assert!((j - 1200.0).abs() < 1e-9, "{j}");
        // After the last reading: its value plus the power since (1 s at 100 W).
        let (j, _) = s
            .energy_between("gpu0", 4_000_000_000, 5_000_000_000)
            .unwrap();
        assert!((j - 100.0).abs() < 1e-6, "{j}");
    }

    #[test]
    fn history_is_bounded() {
        let mut s = SeriesStore::new(4);
        s.ensure(0, "x");
        for i in 0..10 {
            s.push(0, i, i as f64);
        }
        let snap = s.snapshot();
        assert_eq!(snap[0].1, vec![6, 7, 8, 9]);
    }
}
