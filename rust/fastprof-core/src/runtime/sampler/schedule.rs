//! When each NVML call group is read, and on which thread: a per-device
//! budget of NVML wall time shared out over the groups, a period per group
//! from its measured cost, and a per-tick cap on NVML time. Pure
//! bookkeeping: costs come in from the caller, so it is tested without a GPU.
//!
//! Why. On an H200 (driver 580) the twelve per-device fields read on every
//! tick cost 4.6 ms of wall time per tick on average at 100 Hz (tick wall
//! p50 3.4 ms, p99 15.5 ms, 282 late ticks of 5497): an 8-GPU node would
//! have spent cores on sampling and still missed its ticks. Measured per
//! call there (µs, p50 / max): instant power 5 / 50, utilisation 5 / 10 000,
//! memory 28 / 66, clocks, temperature, throttle 3 / 600, PCIe byte
//! counters 630 / 870, energy 3 200 / 15 000 (the same as a field or as its
//! own call: the driver takes that long), blocking PCIe throughput 21 000.
//! So:
//! * each group has a *desired* period: every tick for what the job does
//!   from one tick to the next (power, energy, utilisation, PCIe counters),
//!   the system rate for the GPU's state (memory, clocks, temperature,
//!   throttle reasons), `pcie_every_s` for blocking PCIe throughput;
//! * the device's budget ([`SamplerConfig::nvml_budget`](super::SamplerConfig),
//!   a fraction of one core's wall time) is split into class pools,
//!   [`FAST_SHARE`] for the every-tick groups, [`PCIE_SHARE`] for blocking
//!   PCIe where a device has it, the rest for the system groups. Within a
//!   pool, groups that need less than an equal part at their desired rate
//!   get what they need and the rest share what remains (water-filling); a
//!   pool not used up goes to the others. A group's *effective* period is
//!   its cost over its allocation, never shorter than desired;
//! * a group may have a *horizon*, a longest period: the PCIe byte counters
//!   are 32 bits and wrap after 4 GiB (67 ms at PCIe 5 x16 speed), so read
//!   less often their rate is wrong, not coarse. Horizon reads are paid
//!   first from the pool;
//! * a group whose calls cost more than [`SLOW_CALL_NS`] is read *apart*,
//!   on a helper thread ([`super::helper`]), so no tick waits for it;
//! * a tick reads the due groups, most overdue first (by elapsed over
//!   period), until its NVML time reaches [`TICK_CAP_NS`]; the rest stay
//!   due, more overdue, for the next tick. One is always read, so none
//!   starves. Periods are re-planned every [`REPLAN_NS`] from the costs
//!   measured since.

/// The part of a device's NVML budget for the every-tick groups.
pub const FAST_SHARE: f64 = 0.6;

/// The part for blocking PCIe throughput, where a device lacks PCIe byte
/// counters (taken out of the system groups' part).
pub const PCIE_SHARE: f64 = 0.1;

/// NVML wall time after which a tick reads no more groups: with /proc
/// readings and publishing on top, the tick stays under a millisecond.
pub const TICK_CAP_NS: u64 = 500_000;

/// A group whose calls cost more than this (mean) is read on the helper
/// thread: half the cap, so that a tick's NVML time stays within one cap
/// and one cheap call.
pub const SLOW_CALL_NS: f64 = 250_000.0;

/// How often the periods are re-planned from the measured costs.
pub const REPLAN_NS: u64 = 1_000_000_000;

/// Weight of the newest cost in a group's running mean (about the last
/// eight reads).
const EWMA_ALPHA: f64 = 0.125;

/// A single reading may move the mean by at most this factor of it: one
/// stall (the GPU busy in a context switch, the thread preempted) must not
/// stretch a period, or send a group to the helper, for many seconds, while
/// a call that really got slower is learnt within a few reads.
const OUTLIER_FACTOR: f64 = 8.0;

/// Which pool of the budget a group draws on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Desired every tick.
    Fast,
    /// Desired at the system rate.
    System,
    /// Blocking PCIe throughput.
    Blocking,
}

const CLASSES: [Class; 3] = [Class::Fast, Class::System, Class::Blocking];

/// Measured cost of one call group: running mean, maximum, count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallStats {
    pub mean_ns: f64,
    pub max_ns: u64,
    pub reads: u64,
}

impl CallStats {
    pub fn record(&mut self, ns: u64) {
        let x = ns as f64;
        self.mean_ns = if self.reads == 0 && self.mean_ns == 0.0 {
            x
        } else {
            let x = x.min(self.mean_ns * OUTLIER_FACTOR);
            self.mean_ns + EWMA_ALPHA * (x - self.mean_ns)
        };
        self.max_ns = self.max_ns.max(ns);
        self.reads += 1;
    }
}

/// `max(desired, cost / share)`: the period at which a call costing `mean_ns`
/// uses at most `share` of one core's wall time. A share of zero or less
/// (no budget) leaves the desired period.
pub fn effective_period_ns(desired_ns: u64, mean_ns: f64, share: f64) -> u64 {
    if share <= 0.0 || !mean_ns.is_finite() {
        return desired_ns;
    }
    desired_ns.max((mean_ns / share).min(u64::MAX as f64 / 2.0) as u64)
}

/// Water-filling: shares of `pool` for groups that each want `need` and
/// must have `floor` (<= need). Everyone under the level gets their need,
/// the others the level, floors first. Returns the level (infinite when all
/// needs fit) and writes nothing: `alloc(level, floor, need)` gives a share.
pub fn water_level(pool: f64, groups: &[(f64, f64)]) -> f64 {
    let total = |l: f64| -> f64 { groups.iter().map(|&(f, n)| alloc(l, f, n)).sum() };
    if total(f64::INFINITY) <= pool {
        return f64::INFINITY;
    }
    let (mut lo, mut hi) = (0.0, groups.iter().map(|g| g.1).fold(0.0, f64::max));
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if total(mid) > pool {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    lo
}

/// A group's share at water `level`: its need if under, its floor if over.
pub fn alloc(level: f64, floor: f64, need: f64) -> f64 {
    level.min(need).max(floor)
}

/// One call group of one device.
#[derive(Debug, Clone)]
pub struct Entry {
    pub device: usize,
    /// The caller's group number on that device.
    pub group: usize,
    pub class: Class,
    pub desired_ns: u64,
    /// Longest period at which the readings are still right (0: none).
    pub horizon_ns: u64,
    pub period_ns: u64,
    /// Off for a group none of whose fields is read (unsupported, or served
    /// by another group).
    pub active: bool,
    /// Read on the helper thread (slow calls), not on the tick.
    pub apart: bool,
    /// Kept on the tick thread, however slow (no helper for it).
    pinned: bool,
    /// When it is next due; `None` before its first read.
    next_ns: Option<u64>,
    pub stats: CallStats,
}

impl Entry {
    /// Whether its cost is known (read, or timed at open).
    fn costed(&self) -> bool {
        self.stats.reads > 0 || self.stats.mean_ns > 0.0
    }
}

/// The plan for every device's call groups.
#[derive(Debug, Clone)]
pub struct Schedule {
    entries: Vec<Entry>,
    devices: usize,
    /// Per device: fraction of one core's wall time for NVML.
    budget: f64,
    tick_ns: u64,
    cap_ns: u64,
    planned_at: Option<u64>,
    /// Due entries of the current tick, most overdue first (reused: no
    /// allocation per tick).
    order: Vec<(f64, usize)>,
}

impl Schedule {
    /// An empty plan for `devices` devices ticking every `tick_ns`, with
    /// `budget` per device and `cap_ns` of NVML per tick.
    pub fn new(devices: usize, tick_ns: u64, budget: f64, cap_ns: u64) -> Schedule {
        Schedule {
            entries: Vec::new(),
            devices,
            budget: if budget.is_finite() {
                budget.max(0.0)
            } else {
                0.0
            },
            tick_ns: tick_ns.max(1),
            cap_ns,
            planned_at: None,
            order: Vec::new(),
        }
    }

    /// Add a group (before the first tick); `horizon_ns` 0 for none.
    pub fn add(
        &mut self,
        device: usize,
        group: usize,
        class: Class,
        desired_ns: u64,
        horizon_ns: u64,
    ) {
        let desired_ns = desired_ns.max(1);
        self.devices = self.devices.max(device + 1);
        self.entries.push(Entry {
            device,
            group,
            class,
            desired_ns,
            horizon_ns: if horizon_ns == 0 {
                0
            } else {
                horizon_ns.max(desired_ns)
            },
            period_ns: desired_ns,
            active: true,
            apart: class == Class::Blocking,
            pinned: false,
            next_ns: None,
            stats: CallStats::default(),
        });
        self.order.reserve(self.entries.len());
    }

    fn find(&mut self, device: usize, group: usize) -> Option<&mut Entry> {
        self.entries
            .iter_mut()
            .find(|e| e.device == device && e.group == group)
    }

    /// Switch a group on or off; re-plans (the shares change) when it changes.
    pub fn set_active(&mut self, device: usize, group: usize, active: bool) {
        let changed = self.find(device, group).is_some_and(|e| {
            let c = e.active != active;
            e.active = active;
            c
        });
        if changed {
            self.plan();
        }
    }

    /// The cost of one call measured at open (not counted as a read).
    pub fn seed(&mut self, device: usize, group: usize, ns: u64) {
        if let Some(e) = self.find(device, group) {
            e.stats.mean_ns = ns as f64;
        }
    }

    /// The cost of a read done apart (its result came back later).
    pub fn report(&mut self, device: usize, group: usize, ns: u64) {
        if let Some(e) = self.find(device, group) {
            e.stats.record(ns);
        }
    }

    /// Read `device`'s groups on the tick thread from now on (the helper
    /// cannot read them). Blocking groups are only ever read apart: the
    /// caller switches them off.
    pub fn keep_on_tick(&mut self, device: usize) {
        for e in self.entries.iter_mut().filter(|e| e.device == device) {
            e.pinned = true;
            if e.class != Class::Blocking {
                e.apart = false;
            }
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Whether any active group is read apart.
    pub fn any_apart(&self) -> bool {
        self.entries.iter().any(|e| e.active && e.apart)
    }

    /// Set every period from the costs measured so far, and send the groups
    /// whose calls are slow apart.
    pub fn plan(&mut self) {
        for e in self.entries.iter_mut() {
            if !e.pinned && e.costed() && e.stats.mean_ns > SLOW_CALL_NS {
                e.apart = true;
            }
        }
        for d in 0..self.devices {
            self.plan_device(d);
        }
    }

    fn plan_device(&mut self, d: usize) {
        let on = |e: &Entry, c: Class| e.device == d && e.active && e.class == c && e.costed();
        // What each group wants (share at its desired rate) and must have
        // (share at its horizon).
        let want = |e: &Entry| {
            let need = e.stats.mean_ns / e.desired_ns as f64;
            let floor = if e.horizon_ns > 0 {
                e.stats.mean_ns / e.horizon_ns as f64
            } else {
                0.0
            };
            (floor, need)
        };
        let has = |c: Class| {
            self.entries
                .iter()
                .any(|e| e.device == d && e.active && e.class == c)
        };
        let base = |c: Class| match c {
            Class::Fast => FAST_SHARE,
            Class::Blocking if has(Class::Blocking) => PCIE_SHARE,
            Class::Blocking => 0.0,
            Class::System => {
                1.0 - FAST_SHARE
                    - if has(Class::Blocking) {
                        PCIE_SHARE
                    } else {
                        0.0
                    }
            }
        };
        let mut pool = CLASSES.map(|c| self.budget * base(c));
        let mut level = [0.0; 3];
        let mut groups: Vec<(f64, f64)> = Vec::new();
        // Pools not used up go to the classes that want more; twice covers
        // three classes.
        for _ in 0..3 {
            let mut spare = 0.0;
            let mut hungry = [false; 3];
            for (k, c) in CLASSES.iter().enumerate() {
                groups.clear();
                groups.extend(self.entries.iter().filter(|e| on(e, *c)).map(want));
                level[k] = water_level(pool[k], &groups);
                if level[k].is_infinite() {
                    let used: f64 = groups.iter().map(|g| g.1).sum();
                    spare += pool[k] - used;
                    pool[k] = used;
                } else {
                    hungry[k] = true;
                }
            }
            let weights: f64 = (0..3)
                .filter(|&k| hungry[k])
                .map(|k| base(CLASSES[k]).max(1e-9))
                .sum();
            if spare <= 0.0 || weights == 0.0 {
                break;
            }
            for k in (0..3).filter(|&k| hungry[k]) {
                pool[k] += spare * base(CLASSES[k]).max(1e-9) / weights;
            }
        }
        for e in self.entries.iter_mut().filter(|e| e.device == d) {
            let k = CLASSES.iter().position(|c| *c == e.class).unwrap_or(0);
            e.period_ns = if !e.costed() || !e.active {
                e.desired_ns
            } else {
                let (floor, need) = want(e);
                let share = alloc(level[k], floor, need);
                let p = effective_period_ns(e.desired_ns, e.stats.mean_ns, share);
                if e.horizon_ns > 0 {
                    p.min(e.horizon_ns)
                } else {
                    p
                }
            };
        }
    }

    /// Re-plan when [`REPLAN_NS`] has passed since the last plan (or there
    /// was none). Returns whether it did.
    pub fn replan_if_due(&mut self, now_ns: u64) -> bool {
        match self.planned_at {
            Some(t) if now_ns.saturating_sub(t) < REPLAN_NS => false,
            _ => {
                self.planned_at = Some(now_ns);
                self.plan();
                true
            }
        }
    }

    /// How overdue an entry is, in periods since its nominal last read (one
    /// period before it is due): 1 when due. Half a tick early counts as on
    /// time (ticks jitter; a group due every tick must not slip to every
    /// other one). Never read: infinitely overdue.
    fn overdue(&self, e: &Entry, now_ns: u64) -> f64 {
        match e.next_ns {
            None => f64::INFINITY,
            Some(next) => {
                let late = (now_ns + self.tick_ns / 2) as f64 - next as f64;
                1.0 + late / e.period_ns as f64
            }
        }
    }

    /// When a group read at `now_ns` is next due: one period after it was
    /// due, so a period that is not a whole number of ticks is kept on
    /// average (25 ms at 100 Hz: 20, 30, 20... ms apart), but never sooner
    /// than half a period from now, so a group held back by the cap
    /// catches up gently and one held back long does not burst.
    fn next_due(e: &Entry, now_ns: u64) -> u64 {
        let nominal = e.next_ns.map_or(now_ns, |n| n) + e.period_ns;
        nominal.max(now_ns + e.period_ns / 2)
    }

    /// One tick at `now_ns`: the due groups, most overdue first, are given to
    /// `read(device, group, apart)`, which returns the ns the call took on
    /// this thread, or `None` for a group handed to the helper (its cost
    /// comes back through [`Schedule::report`]). Stops when this tick's NVML
    /// time reaches the cap (one group is always read). Returns that time.
    pub fn tick(
        &mut self,
        now_ns: u64,
        mut read: impl FnMut(usize, usize, bool) -> Option<u64>,
    ) -> u64 {
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        for (i, e) in self.entries.iter().enumerate() {
            if e.active {
                let r = self.overdue(e, now_ns);
                if r >= 1.0 {
                    order.push((r, i));
                }
            }
        }
        // Most overdue first. Ties (groups read on the same ticks with the
        // same period, and first reads) go to the group read least so far,
        // else a fixed order would always favour the same group over the
        // cap; then in the order groups were added.
        let entries = &self.entries;
        order.sort_unstable_by(|a, b| {
            b.0.total_cmp(&a.0)
                .then(entries[a.1].stats.reads.cmp(&entries[b.1].stats.reads))
                .then(a.1.cmp(&b.1))
        });
        let mut spent = 0u64;
        let mut read_here = false;
        for &(_, i) in order.iter() {
            let e = &mut self.entries[i];
            if !e.apart && read_here && spent >= self.cap_ns {
                continue; // stays due; groups apart cost this tick nothing
            }
            e.next_ns = Some(Self::next_due(e, now_ns));
            if let Some(ns) = read(e.device, e.group, e.apart) {
                e.stats.record(ns);
                spent += ns;
                read_here = true;
            }
        }
        self.order = order;
        spent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    /// One device: two fast groups (0, 1) every 10 ms tick, two system groups
    /// (2, 3) desired every 100 ms; budget 2%.
    fn device_plan() -> Schedule {
        let mut s = Schedule::new(1, 10 * MS, 0.02, TICK_CAP_NS);
        s.add(0, 0, Class::Fast, 10 * MS, 0);
        s.add(0, 1, Class::Fast, 10 * MS, 0);
        s.add(0, 2, Class::System, 100 * MS, 0);
        s.add(0, 3, Class::System, 100 * MS, 0);
        s
    }

    /// Run `ticks` ticks of 10 ms from `t0` where group g costs `cost[g]`,
    /// all read on the tick; returns the reads per group and the NVML ns
    /// per tick.
    fn run(s: &mut Schedule, t0: u64, ticks: u64, cost: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let mut reads = vec![0; cost.len()];
        let mut per_tick = Vec::new();
        for k in 0..ticks {
            let now = t0 + k * 10 * MS;
            s.replan_if_due(now);
            per_tick.push(s.tick(now, |_, g, _| {
                reads[g] += 1;
                Some(cost[g])
            }));
        }
        (reads, per_tick)
    }

    fn periods(s: &Schedule) -> Vec<u64> {
        s.entries().iter().map(|e| e.period_ns).collect()
    }

    #[test]
    fn the_period_is_the_desired_one_or_what_the_budget_allows() {
        assert_eq!(effective_period_ns(10 * MS, 50_000.0, 0.01), 10 * MS);
        // 300 µs at 0.6% of a core: every 50 ms.
        assert_eq!(effective_period_ns(10 * MS, 300_000.0, 0.006), 50 * MS);
        assert_eq!(effective_period_ns(10 * MS, 300_000.0, 0.0), 10 * MS);
        assert_eq!(effective_period_ns(10 * MS, f64::NAN, 0.01), 10 * MS);
    }

    #[test]
    fn water_filling_gives_needs_then_equal_parts_floors_first() {
        // All fit: infinite level, everyone gets its need.
        assert!(water_level(1.0, &[(0.0, 0.2), (0.0, 0.3)]).is_infinite());
        // 0.1 for two wanting 0.01 and 1.0: 0.01 and 0.09.
        let l = water_level(0.1, &[(0.0, 0.01), (0.0, 1.0)]);
        assert!((alloc(l, 0.0, 0.01) - 0.01).abs() < 1e-9);
        assert!((alloc(l, 0.0, 1.0) - 0.09).abs() < 1e-9);
        // A floor of 0.06 over an equal part of 0.05: paid first.
        let l = water_level(0.1, &[(0.06, 1.0), (0.0, 1.0)]);
        assert!((alloc(l, 0.06, 1.0) - 0.06).abs() < 1e-9);
        assert!((alloc(l, 0.0, 1.0) - 0.04).abs() < 1e-9);
        // Floors over the pool: floors, whatever the pool.
        let l = water_level(0.05, &[(0.06, 1.0), (0.0, 1.0)]);
        assert_eq!(alloc(l, 0.06, 1.0), 0.06);
        assert_eq!(alloc(l, 0.0, 1.0), 0.0);
    }

    #[test]
    fn periods_follow_costs_and_the_budget_split() {
        let mut s = device_plan();
        // Cheap calls: every group at its desired period.
        run(&mut s, 0, 300, &[20 * US; 4]);
        assert_eq!(periods(&s), [10 * MS, 10 * MS, 100 * MS, 100 * MS]);

        // Calls of 200 µs: the fast pool (0.02 * 0.6 = 12 ms/s) gives each
        // fast group 6 ms/s, every 33 ms; the system pool (8 ms/s) covers
        // its groups' 2 ms/s each at 100 ms and its 4 ms/s spare goes to
        // the fast groups: 8 ms/s each, every 25 ms.
        let mut s = device_plan();
        let cost = [200 * US; 4];
        run(&mut s, 0, 300, &cost);
        assert_eq!(periods(&s), [25 * MS, 25 * MS, 100 * MS, 100 * MS]);
        // The reads over the next 3 s follow those periods (each read lands
        // on a tick: at most one tick late), within the budget.
        let (reads, _) = run(&mut s, 3000 * MS, 300, &cost);
        assert!((100..=120).contains(&reads[0]), "{reads:?}");
        assert!((27..=30).contains(&reads[2]), "{reads:?}");
        let ns: u64 = reads.iter().zip(cost).map(|(r, c)| r * c).sum();
        assert!(ns as f64 / 3.0 <= 0.02 * 1e9 * 1.01, "{ns}");
    }

    #[test]
    fn a_horizon_is_kept_and_paid_first() {
        // H200-like fast groups: power 5 µs, PCIe counters 630 µs with a
        // 50 ms horizon, energy 4 ms; system groups cheap.
        let mut s = Schedule::new(1, 10 * MS, 0.02, TICK_CAP_NS);
        s.add(0, 0, Class::Fast, 10 * MS, 0);
        s.add(0, 1, Class::Fast, 10 * MS, 50 * MS);
        s.add(0, 2, Class::Fast, 10 * MS, 0);
        s.add(0, 3, Class::System, 100 * MS, 0);
        for (g, ns) in [(0, 5 * US), (1, 630 * US), (2, 4 * MS), (3, 20 * US)] {
            s.seed(0, g, ns);
        }
        s.plan();
        let p = periods(&s);
        assert_eq!(p[0], 10 * MS);
        assert_eq!(p[1], 50 * MS, "{p:?}");
        assert_eq!(p[3], 100 * MS);
        // Energy gets the rest: 20 - 0.5 - 12.6 - 0.2 = 6.7 ms/s, every ~600 ms.
        assert!((590 * MS..=610 * MS).contains(&p[2]), "{p:?}");
        // Slow calls are read apart.
        let apart: Vec<bool> = s.entries().iter().map(|e| e.apart).collect();
        assert_eq!(apart, [false, true, true, false]);
        // A budget too small for the horizon: the horizon still holds.
        let mut s2 = Schedule::new(1, 10 * MS, 0.001, TICK_CAP_NS);
        s2.add(0, 0, Class::Fast, 10 * MS, 50 * MS);
        s2.seed(0, 0, 630 * US);
        s2.plan();
        assert_eq!(periods(&s2), [50 * MS]);
    }

    #[test]
    fn a_blocking_pool_and_an_empty_class_change_the_split() {
        let mut s = Schedule::new(1, 10 * MS, 0.02, TICK_CAP_NS);
        s.add(0, 0, Class::Fast, 10 * MS, 0);
        s.add(0, 1, Class::Blocking, 1000 * MS, 0);
        s.seed(0, 0, 10 * MS); // wants a whole core
        s.seed(0, 1, 42 * MS); // two 21 ms calls: 4.2% at 1 s
        s.plan();
        // No system groups: their 30% (6 ms/s) goes to the others by their
        // parts. Blocking: 2 + 6 * 0.1 / 0.7 = 2.86 ms/s, every 14.7 s;
        // fast: 12 + 6 * 0.6 / 0.7 = 17.1 ms/s, every 583 ms.
        let p = periods(&s);
        assert!((14_650 * MS..=14_750 * MS).contains(&p[1]), "{p:?}");
        assert!((580 * MS..=586 * MS).contains(&p[0]), "{p:?}");
        assert!(s.entries()[1].apart);
    }

    #[test]
    fn a_tick_stops_at_the_cap_and_the_rest_stay_due() {
        let mut s = device_plan();
        // First tick: everything is due (never read); 300 µs calls, so the
        // cap of 500 µs lets two through.
        let mut got = Vec::new();
        let ns = s.tick(0, |_, g, _| {
            got.push(g);
            Some(300 * US)
        });
        assert_eq!(got, [0, 1]);
        assert_eq!(ns, 600 * US);
        // Next tick: the groups not read yet are the most overdue, first.
        got.clear();
        s.tick(10 * MS, |_, g, _| {
            got.push(g);
            Some(300 * US)
        });
        assert_eq!(got, [2, 3]);
    }

    #[test]
    fn groups_apart_are_handed_off_without_counting_against_the_cap() {
        let mut s = device_plan();
        s.seed(0, 1, 3 * MS);
        s.plan();
        assert!(s.entries()[1].apart);
        let mut got = Vec::new();
        let ns = s.tick(0, |_, g, apart| {
            got.push((g, apart));
            (!apart).then_some(200 * US)
        });
        assert_eq!(got, [(0, false), (1, true), (2, false), (3, false)]);
        assert_eq!(ns, 600 * US);
        // Its cost comes back later and counts for its period.
        s.report(0, 1, 3 * MS);
        assert_eq!(s.entries()[1].stats.reads, 1);
    }

    #[test]
    fn one_group_is_read_even_over_the_cap_and_none_starves() {
        // No budget limit (a whole core): periods stay as desired; every
        // call (240 µs, on the tick) alone is over a cap of 100 µs: one
        // group per tick.
        let mut s = Schedule::new(1, 10 * MS, 1.0, 100 * US);
        s.add(0, 0, Class::Fast, 10 * MS, 0);
        s.add(0, 1, Class::Fast, 10 * MS, 0);
        s.add(0, 2, Class::System, 100 * MS, 0);
        s.add(0, 3, Class::System, 100 * MS, 0);
        let (reads, per_tick) = run(&mut s, 0, 400, &[240 * US; 4]);
        assert!(per_tick.iter().all(|&ns| ns == 240 * US), "{per_tick:?}");
        assert_eq!(reads.iter().sum::<u64>(), 400);
        // The fast groups are always overdue, but by ratio to their period:
        // a system group waiting n of its periods goes before a fast one
        // waiting fewer of its own, so it is read, late, not never.
        assert!(reads[2] >= 12 && reads[3] >= 12, "{reads:?}");
        assert!(reads[0] > 150 && reads[1] > 150, "{reads:?}");
    }

    #[test]
    fn replanning_follows_a_change_of_cost_about_once_a_second() {
        let mut s = device_plan();
        let cheap = [20 * US; 4];
        let slow = [240 * US, 20 * US, 20 * US, 20 * US];
        run(&mut s, 0, 200, &cheap);
        assert_eq!(s.entries()[0].period_ns, 10 * MS);
        // The calls get slower (the GPU is under load). Re-planned at 2 s,
        // before the slow reads: the period holds for the rest of that second.
        run(&mut s, 2000 * MS, 50, &slow);
        assert_eq!(s.entries()[0].period_ns, 10 * MS);
        // At the next plan (3 s): 240 µs at 100 Hz is 24 ms/s; the budget
        // less the others' needs (20 µs every 10 ms, twice every 100 ms)
        // leaves it 20 - 2 - 0.4 = 17.6 ms/s: every ~13.6 ms.
        run(&mut s, 2500 * MS, 60, &slow);
        let p = s.entries()[0].period_ns as f64 / MS as f64;
        assert!((13.3..13.9).contains(&p), "{p}");
        // And back when they are cheap again.
        run(&mut s, 5000 * MS, 500, &cheap);
        assert_eq!(s.entries()[0].period_ns, 10 * MS);
    }

    #[test]
    fn one_stall_moves_the_mean_by_a_bounded_step() {
        let mut c = CallStats::default();
        for _ in 0..20 {
            c.record(100 * US);
        }
        c.record(50 * MS);
        assert_eq!(c.max_ns, 50 * MS);
        assert!(c.mean_ns < 200_000.0, "{}", c.mean_ns);
        assert_eq!(c.reads, 21);
    }

    #[test]
    fn inactive_groups_are_not_read_and_devices_share_the_cap() {
        // A whole core of budget: only the cap (400 µs) limits.
        let mut s = Schedule::new(2, 10 * MS, 1.0, 400 * US);
        for d in 0..2 {
            s.add(d, 0, Class::Fast, 10 * MS, 0);
            s.add(d, 1, Class::Fast, 10 * MS, 0);
        }
        s.set_active(1, 1, false);
        let mut reads = [[0u32; 2]; 2];
        for k in 0..100 {
            s.replan_if_due(k * 10 * MS);
            s.tick(k * 10 * MS, |d, g, _| {
                reads[d][g] += 1;
                Some(240 * US)
            });
        }
        assert_eq!(reads[1][1], 0);
        // Three groups of 240 µs: the second read reaches the cap, so two
        // per tick; the most overdue goes first, so all three advance evenly.
        let r = [reads[0][0], reads[0][1], reads[1][0]];
        assert!(r.iter().all(|&x| (60..=70).contains(&x)), "{reads:?}");
    }
}
