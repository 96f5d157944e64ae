//! The helper thread: reads the call groups too slow for a tick (on an
//! H200, energy at 3-15 ms and the PCIe counters at 0.6 ms; everywhere,
//! blocking PCIe throughput at ~40 ms), when the tick's schedule asks for
//! them, and leaves the readings for the tick thread to publish on its
//! next tick. The schedule stays on the tick thread: it decides when each
//! group is due, here they are only read. Started on the first group sent
//! apart; stopped and joined on drop.
//!
//! It opens NVML and its devices itself (the library counts
//! initialisations), so nothing borrows across threads; what it learns
//! about a device (a field switched off, a source fallen back) goes back as
//! a [`DeviceState`].

use super::gpu::{DeviceState, GpuDevice, Template, GROUPS};
use nvml_wrapper::Nvml;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::JoinHandle;

/// What the helper leaves for the tick thread, per device.
#[derive(Debug, Default)]
pub struct Slot {
    /// Readings not yet taken: (field index, value).
    pub readings: Vec<(usize, f64)>,
    /// Reads done, not yet reported: (group, ns).
    pub costs: Vec<(usize, u64)>,
    /// The device's state after a read changed it.
    pub state: Option<DeviceState>,
    /// Why the helper cannot read this device at all.
    pub failed: Option<String>,
}

struct Shared {
    /// Set by [`Helper`]'s drop. Release/Acquire: the flag carries no data;
    /// the thread only has to see it once woken.
    stop: AtomicBool,
    /// One per (device, group): asked for and not read yet. The flag is the
    /// whole message (no data rides on it), so Release on the ask and
    /// AcqRel on the take only order it against the unpark that follows.
    asked: Vec<AtomicBool>,
    slots: Vec<Mutex<Slot>>,
}

/// The helper thread and its slots.
pub struct Helper {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Helper {
    /// Start reading, on request, the devices `templates` describe (in the
    /// tick thread's device order).
    pub fn spawn(templates: Vec<Template>) -> std::io::Result<Helper> {
        let n = templates.len();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            asked: (0..n * GROUPS.len())
                .map(|_| AtomicBool::new(false))
                .collect(),
            slots: (0..n).map(|_| Mutex::new(Slot::default())).collect(),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fastprof-nvml".into())
            .spawn(move || {
                let body = std::panic::AssertUnwindSafe(|| read_loop(templates, &sh));
                if let Err(p) = std::panic::catch_unwind(body) {
                    let why = format!(
                        "the NVML helper thread failed: {}",
                        super::panic_message(&*p)
                    );
                    fail_all(&sh, &why);
                }
            })?;
        Ok(Helper {
            shared,
            thread: Some(thread),
        })
    }

    /// Ask for group `group` of device `device` (no effect while asked).
    pub fn ask(&self, device: usize, group: usize) {
        if let Some(f) = self.shared.asked.get(device * GROUPS.len() + group) {
            f.store(true, Ordering::Release);
            if let Some(t) = &self.thread {
                t.thread().unpark();
            }
        }
    }

    /// Hand device `device`'s new readings, costs, state and failure to the
    /// callbacks. Never waits: while the helper holds the slot, they wait
    /// for the next tick.
    pub fn take(
        &self,
        device: usize,
        reading: &mut dyn FnMut(usize, f64),
        cost: &mut dyn FnMut(usize, u64),
        state: &mut dyn FnMut(DeviceState),
        failed: &mut dyn FnMut(String),
    ) {
        let Some(m) = self.shared.slots.get(device) else {
            return;
        };
        let mut s = match m.try_lock() {
            Ok(s) => s,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        for (i, v) in s.readings.drain(..) {
            reading(i, v);
        }
        for (g, ns) in s.costs.drain(..) {
            cost(g, ns);
        }
        if let Some(st) = s.state.take() {
            state(st);
        }
        if let Some(why) = s.failed.take() {
            failed(why);
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            // A panic was caught in the thread and recorded in the slots.
            let _ = t.join();
        }
    }
}

fn fail_all(sh: &Shared, why: &str) {
    for m in &sh.slots {
        m.lock().unwrap_or_else(|e| e.into_inner()).failed = Some(why.to_string());
    }
}

fn read_loop(templates: Vec<Template>, sh: &Shared) {
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => {
            return fail_all(
                sh,
                &format!("NVML could not start on the helper thread: {e}"),
            )
        }
    };
    let mut devs: Vec<Option<GpuDevice<'_>>> = Vec::with_capacity(templates.len());
    for (i, t) in templates.into_iter().enumerate() {
        let label = t.label.clone();
        match GpuDevice::from_template(&nvml, t) {
            Ok(d) => devs.push(Some(d)),
            Err(e) => {
                let why = format!("{label} could not be opened on the helper thread: {e}");
                sh.slots[i].lock().unwrap_or_else(|e| e.into_inner()).failed = Some(why);
                devs.push(None);
            }
        }
    }
    // Readings of one read, gathered before the slot is locked, so the tick
    // thread never waits behind an NVML call.
    let mut buf: Vec<(usize, f64)> = Vec::with_capacity(4);
    while !sh.stop.load(Ordering::Acquire) {
        let mut any = false;
        for (d, dev) in devs.iter_mut().enumerate() {
            for (g, (group, _, _)) in GROUPS.iter().enumerate() {
                if !sh.asked[d * GROUPS.len() + g].swap(false, Ordering::AcqRel) {
                    continue;
                }
                any = true;
                let Some(dev) = dev.as_mut() else { continue };
                buf.clear();
                let ns = dev.read_group(*group, &mut |i, _, v| buf.push((i, v)));
                let mut s = sh.slots[d].lock().unwrap_or_else(|e| e.into_inner());
                s.readings.extend_from_slice(&buf);
                s.costs.push((g, ns));
                if std::mem::take(&mut dev.changed) {
                    s.state = Some(dev.state());
                }
            }
        }
        if !any {
            // Woken by an ask or the stop (an unpark before the park makes
            // it return at once).
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_helper_without_devices_stops_at_once() {
        let h = Helper::spawn(Vec::new()).unwrap();
        h.ask(0, 0); // no such device: ignored
        drop(h);
    }

    #[test]
    fn a_helper_for_a_device_that_does_not_exist_says_why() {
        let t = Template {
            label: "gpu9".into(),
            metric_names: Vec::new(),
            id: "GPU-00000000-0000-0000-0000-000000000000".into(),
            state: DeviceState {
                enabled: [true; super::super::gpu::FIELDS.len()],
                sources: super::super::gpu::Sources {
                    power_instant: true,
                    energy_field: true,
                    pcie_counters: true,
                },
                disabled: Vec::new(),
                fallbacks: Vec::new(),
            },
        };
        let h = Helper::spawn(vec![t]).unwrap();
        let mut why = None;
        let t0 = Instant::now();
        while why.is_none() && t0.elapsed() < Duration::from_secs(20) {
            h.take(
                0,
                &mut |_, _| panic!("no readings"),
                &mut |_, _| {},
                &mut |_| {},
                &mut |w| why = Some(w),
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // No NVML here (CI): why it could not start; with a driver: the device.
        let why = why.expect("a failure is reported");
        assert!(why.contains("NVML") || why.contains("gpu9"), "{why}");
    }
}
