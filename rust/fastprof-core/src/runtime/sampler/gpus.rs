//! The tick's NVML work over all devices: their call groups in one
//! [`Schedule`] (one cap per tick, shared by the devices; one budget per
//! device), the [`Helper`] thread for the groups too slow for a tick, and
//! the measured cost of every call group for the metadata.

use super::gpu::{Field, GpuDevice, GROUPS};
use super::helper::Helper;
use super::schedule::{Class, Schedule, TICK_CAP_NS};
use serde_json::{json, Map, Value};

/// Default [`SamplerConfig::nvml_budget`](super::SamplerConfig::nvml_budget).
pub const DEFAULT_NVML_BUDGET: f64 = 0.02;

/// Devices, their schedule and the helper thread.
pub struct GpuSampler<'n> {
    pub devices: Vec<GpuDevice<'n>>,
    sched: Schedule,
    helper: Option<Helper>,
    /// Why the helper thread could not start (then it is not tried again).
    helper_error: Option<String>,
    budget: f64,
}

impl<'n> GpuSampler<'n> {
    /// Plan `devices` for ticks at `hz`, system readings at `system_hz`,
    /// blocking PCIe every `pcie_every_s`, within `budget` (fraction of one
    /// core's wall time per device; not finite or not above 0: the default).
    /// Each group is read twice first, unpublished: the first call of some
    /// pays the driver's setup (0.5-3 ms on the H200), the second gives the
    /// cost the plan starts from, so a slow group goes to the helper before
    /// it can make a tick late. Blocking PCIe is not timed (~40 ms); it is
    /// read apart anyway.
    pub fn new(
        mut devices: Vec<GpuDevice<'n>>,
        hz: f64,
        system_hz: f64,
        pcie_every_s: f64,
        budget: f64,
    ) -> GpuSampler<'n> {
        let budget = if budget.is_finite() && budget > 0.0 {
            budget.min(1.0)
        } else {
            DEFAULT_NVML_BUDGET
        };
        let tick_ns = (1e9 / hz.max(f64::MIN_POSITIVE)) as u64;
        let system_ns = ((1e9 / system_hz.max(f64::MIN_POSITIVE)) as u64).max(tick_ns);
        let pcie_ns = ((pcie_every_s.max(0.0) * 1e9) as u64).max(tick_ns);
        let mut sched = Schedule::new(devices.len(), tick_ns, budget, TICK_CAP_NS);
        for (i, d) in devices.iter_mut().enumerate() {
            for (gi, (g, _, _)) in GROUPS.iter().enumerate() {
                let (class, horizon) = d.class_of(*g);
                let desired = match class {
                    Class::Fast => tick_ns,
                    Class::System => system_ns,
                    Class::Blocking => pcie_ns,
                };
                sched.add(i, gi, class, desired, horizon);
                if class != Class::Blocking && d.group_active(*g) {
                    let ns = (0..2)
                        .map(|_| d.read_group(*g, &mut |_, _, _| {}))
                        .min()
                        .unwrap_or(0);
                    sched.seed(i, gi, ns.max(1));
                }
                sched.set_active(i, gi, d.group_active(*g));
            }
            d.changed = false;
        }
        sched.plan();
        GpuSampler {
            devices,
            sched,
            helper: None,
            helper_error: None,
            budget,
        }
    }

    /// One tick at `mono` (CLOCK_MONOTONIC ns): the due call groups within
    /// the cap (those apart asked of the helper), and the helper's readings
    /// since the last tick. Returns the ns spent in NVML on this thread.
    pub fn tick(&mut self, mono: u64, emit: &mut dyn FnMut(&str, f64)) -> u64 {
        if self.devices.is_empty() {
            return 0;
        }
        self.sched.replan_if_due(mono);
        if self.helper.is_none() && self.helper_error.is_none() && self.sched.any_apart() {
            self.start_helper();
        }
        let devices = &mut self.devices;
        let helper = &self.helper;
        let ns = self.sched.tick(mono, |d, g, apart| {
            if apart {
                if let Some(h) = helper {
                    h.ask(d, g);
                }
                None
            } else {
                Some(devices[d].read_group(GROUPS[g].0, &mut |_, name, v| emit(name, v)))
            }
        });
        for i in 0..self.devices.len() {
            self.collect(i, emit);
            let d = &mut self.devices[i];
            if std::mem::take(&mut d.changed) {
                for (gi, (g, _, _)) in GROUPS.iter().enumerate() {
                    self.sched.set_active(i, gi, d.group_active(*g));
                }
            }
        }
        ns
    }

    fn start_helper(&mut self) {
        match Helper::spawn(self.devices.iter().map(|d| d.template()).collect()) {
            Ok(h) => self.helper = Some(h),
            Err(e) => {
                let why = format!("no thread for the slow NVML calls: {e}");
                for i in 0..self.devices.len() {
                    self.keep_on_tick(i, &why);
                }
                self.helper_error = Some(why);
            }
        }
    }

    /// The helper cannot read device `i`: its groups go back to the tick
    /// thread, blocking PCIe (never read on a tick) is switched off.
    fn keep_on_tick(&mut self, i: usize, why: &str) {
        self.sched.keep_on_tick(i);
        let d = &mut self.devices[i];
        if d.class_of(super::gpu::Group::Pcie).0 == Class::Blocking {
            for f in [Field::PcieRx, Field::PcieTx] {
                d.disable(f, why.to_string());
            }
        }
    }

    /// Device `i`'s readings, costs and news from the helper.
    fn collect(&mut self, i: usize, emit: &mut dyn FnMut(&str, f64)) {
        let Some(h) = &self.helper else { return };
        let (sched, d) = (&mut self.sched, &mut self.devices[i]);
        let mut state = None;
        let mut failed = None;
        let names = &d.metric_names;
        h.take(
            i,
            &mut |f, v| emit(&names[f], v),
            &mut |g, ns| sched.report(i, g, ns),
            &mut |st| state = Some(st),
            &mut |why| failed = Some(why),
        );
        if let Some(st) = state {
            d.adopt(st);
        }
        if let Some(why) = failed {
            self.keep_on_tick(i, &why);
        }
    }

    /// The budget per device in use.
    pub fn budget(&self) -> f64 {
        self.budget
    }

    /// Per device label, per call group read so far or still planned:
    /// `{"mean_us", "max_us", "every_ms", "reads", "thread"}` (`every_ms`:
    /// the period planned now, from the budget and the measured mean;
    /// `thread`: "tick", or "helper" for calls too slow for a tick).
    pub fn calls_json(&self) -> Value {
        let mut out = Map::new();
        for (i, d) in self.devices.iter().enumerate() {
            let mut groups = Map::new();
            for e in self.sched.entries().iter().filter(|e| e.device == i) {
                if e.active || e.stats.reads > 0 {
                    let row = json!({
                        "mean_us": e.stats.mean_ns / 1e3,
                        "max_us": e.stats.max_ns as f64 / 1e3,
                        "every_ms": e.period_ns as f64 / 1e6,
                        "reads": e.stats.reads,
                        "thread": if e.apart { "helper" } else { "tick" },
                    });
                    groups.insert(GROUPS[e.group].1.to_string(), row);
                }
            }
            out.insert(d.label.clone(), Value::Object(groups));
        }
        Value::Object(out)
    }

    /// Per device label: the fraction of one core's wall time its NVML
    /// calls take at the planned periods (both threads), to set against
    /// the budget. Over it only where a horizon needs it.
    pub fn share_json(&self) -> Value {
        let mut out = Map::new();
        for (i, d) in self.devices.iter().enumerate() {
            let share: f64 = self
                .sched
                .entries()
                .iter()
                .filter(|e| e.device == i && e.active && e.stats.mean_ns > 0.0)
                .map(|e| e.stats.mean_ns / e.period_ns as f64)
                .sum();
            out.insert(d.label.clone(), json!(share));
        }
        Value::Object(out)
    }

    /// Why the helper thread could not start, if it could not.
    pub fn helper_error(&self) -> Option<&str> {
        self.helper_error.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{gpu, Sampler, SamplerConfig};
    use super::*;
    use std::time::Duration;

    #[test]
    fn without_devices_a_tick_reads_nothing() {
        let mut g = GpuSampler::new(Vec::new(), 100.0, 10.0, 1.0, f64::NAN);
        assert_eq!(g.budget(), DEFAULT_NVML_BUDGET);
        assert_eq!(g.tick(0, &mut |_, _| panic!("no readings")), 0);
        assert_eq!(g.calls_json(), json!({}));
    }

    /// On a machine with a GPU (run with `--ignored`): all devices at 100 Hz
    /// for 6 s stay within the tick cap with no late tick, the metadata
    /// says where each device's power, energy and PCIe come from and what
    /// each call group costs, and the energy counter agrees with the
    /// integrated instant power.
    #[test]
    #[ignore = "needs a GPU; measures timing"]
    fn on_a_gpu_ticks_stay_short_and_calls_are_accounted() {
        let s = Sampler::start(SamplerConfig {
            hz: 100.0,
            gpus: gpu::GpuSelect::All,
            ..SamplerConfig::default()
        })
        .unwrap();
        std::thread::sleep(Duration::from_secs(6));
        let sh = s.shared.clone();
        assert_eq!(s.stop(), None);
        let meta = sh.meta.lock().unwrap().clone();
        println!("{}", serde_json::to_string_pretty(&meta["nvml"]).unwrap());
        println!(
            "{}",
            serde_json::to_string_pretty(&meta["self_cost"]).unwrap()
        );
        let nv = &meta["nvml"];
        assert_eq!(nv["available"], json!(true), "{nv}");
        let store = sh.store.lock().unwrap();
        for d in nv["devices"].as_array().unwrap() {
            let label = d["label"].as_str().unwrap();
            assert!(d["sources"]["power"].is_string(), "{d}");
            let calls = &nv["calls"][label];
            assert!(calls["util"]["reads"].as_u64().unwrap() > 0, "{calls}");
            // Instant power against the energy counter, between the first
            // and last counter readings after the first second.
            let power = store.series(&format!("{label}.power [W]")).unwrap();
            let energy = store.series(&format!("{label}.energy [J]")).unwrap();
            let start = power.front().unwrap().0 + 1_000_000_000;
            let mut after = energy.iter().filter(|x| x.0 >= start);
            let (a, b) = (*after.next().unwrap(), *energy.back().unwrap());
            let integrated = super::super::series::integrate(power, a.0, b.0);
            println!(
                "{label}: {} power and {} energy readings; counter {:.1} J vs instant power {integrated:.1} J over {:.1} s",
                power.len(),
                energy.len(),
                b.1 - a.1,
                (b.0 - a.0) as f64 / 1e9
            );
            assert!(
                ((b.1 - a.1) / integrated - 1.0).abs() < 0.05,
                "{a:?} {b:?} {integrated}"
            );
        }
        let cost = &meta["self_cost"];
        let p99 = cost["tick_wall_ns_p99"].as_u64().unwrap();
        assert!(p99 <= 1_000_000, "tick p99 {p99} ns");
        assert_eq!(cost["late_ticks"], json!(0), "{cost}");
    }
}
