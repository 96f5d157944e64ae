//! NVML readings, with the library loaded at run time. No library, no driver
//! or no device is a normal state: it is reported once (with the reason) in
//! the sampler metadata, never raised and never warned per tick. A field a
//! device does not support is disabled for that device, recorded once.
//! [`probe`] runs the same opening and the same reads once, for
//! `fastprof doctor`: what it reports is what the sampler would see.
//!
//! The fields are read in call groups ([`GROUPS`]), one NVML call each
//! (two for blocking PCIe throughput), timed, and scheduled against a
//! budget by [`super::gpus::GpuSampler`] (see [`super::schedule`] for the
//! costs measured on an H200 and the plan they led to). Power, energy and
//! PCIe come from `nvmlDeviceGetFieldValues` where the device has the fields:
//! * power: `NVML_FI_DEV_POWER_INSTANT` (5 µs on the H200; updated about
//!   every 100 ms), where `nvmlDeviceGetPowerUsage` is a ~1 s average on
//!   Hopper: integrated over a 4 s burst it disagreed with the energy
//!   counter by 11.6%;
//! * energy: `NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ);
//! * PCIe: `NVML_FI_DEV_PCIE_COUNT_{RX,TX}_BYTES`, cumulative 32-bit byte
//!   counters, a rate between two readings ([`super::pcie::Counter`]), where
//!   `nvmlDeviceGetPcieThroughput` blocks ~20 ms per direction.
//!
//! They are separate calls, not one: the driver's cost is per field (power
//! 5 µs, PCIe counters 630 µs, energy 3.2 ms and up to 15 ms on the H200,
//! the same as a field or as its own call), so one call would cost the sum,
//! at the pace of the slowest. Which fields a device has is probed once at
//! open, in one call of all four; a field that fails there falls back to its
//! own call (averaged power, the energy call, blocking throughput). The
//! choice is in each device's inventory (`sources`).

use super::pcie::{self, Counter};
use super::schedule::Class;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_POWER_INSTANT,
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
};
use nvml_wrapper::{Device, Nvml};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Which devices to sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuSelect {
    /// No NVML at all.
    None,
    /// All visible devices.
    All,
    /// Devices by NVML index or UUID (what CUDA_VISIBLE_DEVICES and LOCAL_RANK point to).
    Some(Vec<String>),
}

/// The fields read per device, in the order of [`FIELDS`] (`field as usize`
/// is its index there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Util,
    MemUtil,
    MemUsed,
    MemTotal,
    Power,
    Energy,
    SmClock,
    MemClock,
    Temp,
    Throttle,
    PcieRx,
    PcieTx,
}

/// (field, metric suffix with unit) for every per-device metric.
pub const FIELDS: [(Field, &str); 12] = [
    (Field::Util, "util [%]"),
    (Field::MemUtil, "mem_util [%]"),
    (Field::MemUsed, "mem_used [B]"),
    (Field::MemTotal, "mem_total [B]"),
    (Field::Power, "power [W]"),
    (Field::Energy, "energy [J]"),
    (Field::SmClock, "sm_clock [MHz]"),
    (Field::MemClock, "mem_clock [MHz]"),
    (Field::Temp, "temperature [C]"),
    (Field::Throttle, "throttle_reasons"),
    (Field::PcieRx, "pcie_rx [B/s]"),
    (Field::PcieTx, "pcie_tx [B/s]"),
];

/// Why a reading failed: unsupported fields are switched off for good. A
/// driver too old to have the function at all reports `FailedToLoadSymbol`.
pub(super) fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

/// One NVML call each (blocking PCIe throughput: two), in [`GROUPS`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// Instant power (a field), else averaged power.
    Power,
    /// The energy field, else the energy call.
    Energy,
    /// PCIe byte counters (a field-values call), else blocking throughput.
    Pcie,
    /// Utilisation of SMs and memory.
    Util,
    /// Memory used and total.
    Mem,
    SmClock,
    MemClock,
    Temp,
    Throttle,
}

/// (group, label in the metadata's `calls`, budget class): what the job does
/// from one tick to the next is read every tick, the GPU's state around it
/// at the system rate. PCIe is [`Class::Fast`] with byte counters and
/// [`Class::Blocking`] without ([`GpuDevice::class_of`]).
pub const GROUPS: [(Group, &str, Class); 9] = [
    (Group::Power, "power", Class::Fast),
    (Group::Energy, "energy", Class::Fast),
    (Group::Pcie, "pcie", Class::Fast),
    (Group::Util, "util", Class::Fast),
    (Group::Mem, "mem", Class::System),
    (Group::SmClock, "sm_clock", Class::System),
    (Group::MemClock, "mem_clock", Class::System),
    (Group::Temp, "temperature", Class::System),
    (Group::Throttle, "throttle", Class::System),
];

/// The group that reads a field.
pub fn group_of(field: Field) -> Group {
    match field {
        Field::Util | Field::MemUtil => Group::Util,
        Field::MemUsed | Field::MemTotal => Group::Mem,
        Field::Power => Group::Power,
        Field::Energy => Group::Energy,
        Field::SmClock => Group::SmClock,
        Field::MemClock => Group::MemClock,
        Field::Temp => Group::Temp,
        Field::Throttle => Group::Throttle,
        Field::PcieRx | Field::PcieTx => Group::Pcie,
    }
}

/// Longest time between two readings of the PCIe byte counters: they are
/// 32 bits, so at most one wrap (4 GiB) may pass between readings for the
/// rate to be right, and PCIe 5 x16 moves ~64 GB/s per direction (67 ms).
pub const PCIE_COUNTER_HORIZON_NS: u64 = 50_000_000;

const POWER_IDS: [FieldId; 1] = [FieldId(NVML_FI_DEV_POWER_INSTANT)];
const ENERGY_IDS: [FieldId; 1] = [FieldId(NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)];
/// [rx, tx], in the order of [`Field::PcieRx`], [`Field::PcieTx`].
const PCIE_IDS: [FieldId; 2] = [
    FieldId(NVML_FI_DEV_PCIE_COUNT_RX_BYTES),
    FieldId(NVML_FI_DEV_PCIE_COUNT_TX_BYTES),
];

/// Where power, energy and PCIe come from on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    /// `NVML_FI_DEV_POWER_INSTANT`, else `nvmlDeviceGetPowerUsage` (averaged).
    pub power_instant: bool,
    /// The energy field, else `nvmlDeviceGetTotalEnergyConsumption`.
    pub energy_field: bool,
    /// The byte counters, else blocking throughput (on the helper thread).
    pub pcie_counters: bool,
}

impl Sources {
    pub fn json(&self) -> Value {
        json!({
            "power": if self.power_instant { "instant" } else { "average" },
            "energy": if self.energy_field { "field" } else { "call" },
            "pcie": if self.pcie_counters { "counters" } else { "throughput (blocks ~20 ms)" },
        })
    }
}

/// What a device knows about its fields, handed between the tick thread
/// and the helper thread (each has its own handle on the device).
#[derive(Debug, Clone)]
pub struct DeviceState {
    pub enabled: [bool; FIELDS.len()],
    pub sources: Sources,
    pub disabled: Vec<(String, String)>,
    pub fallbacks: Vec<(&'static str, String)>,
}

/// How to open a device again on another thread, as it is now.
#[derive(Debug, Clone)]
pub struct Template {
    pub label: String,
    pub metric_names: Vec<String>,
    /// UUID, else index.
    pub id: String,
    pub state: DeviceState,
}

/// Per-device state: which fields still work, and from where.
pub struct GpuDevice<'n> {
    pub label: String,
    /// `"{label}.{field}"` for each of [`FIELDS`], made once rather than per tick.
    pub metric_names: Vec<String>,
    dev: Device<'n>,
    /// How another thread finds this device (UUID, else index).
    id: String,
    enabled: [bool; FIELDS.len()],
    pub disabled: Vec<(String, String)>,
    sources: Sources,
    /// Why a source is not the field ("power" -> the field's error).
    fallbacks: Vec<(&'static str, String)>,
    /// PCIe byte counters, [rx, tx].
    counters: [Counter; 2],
    /// Set when a group may have switched on or off, or a source fell back:
    /// the schedule asks again, the other thread is told.
    pub changed: bool,
}

/// The library the loader asks for (nvml-wrapper's default): the
/// versioned name the driver package installs, not the `-dev` symlink.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Open NVML and the selected devices. Err = why NVML is unavailable.
pub fn open(select: &GpuSelect) -> Result<Nvml, String> {
    if *select == GpuSelect::None {
        return Err("disabled by configuration".into());
    }
    Nvml::init().map_err(|e| match e {
        NvmlError::LibloadingError(l) => format!("NVML library not found ({l})"),
        other => format!("NVML could not start: {other}"),
    })
}

/// The selected devices, each with its sources probed (one field-values
/// call), and the errors of those that did not open.
pub fn devices<'n>(nvml: &'n Nvml, select: &GpuSelect) -> (Vec<GpuDevice<'n>>, Vec<String>) {
    let mut errors = Vec::new();
    let ids: Vec<String> = match select {
        GpuSelect::Some(ids) => ids.clone(),
        _ => match nvml.device_count() {
            Ok(n) => (0..n).map(|i| i.to_string()).collect(),
            Err(e) => {
                errors.push(format!("device count: {e}"));
                Vec::new()
            }
        },
    };
    let mut out = Vec::new();
    for id in ids {
        let dev = match id.parse::<u32>() {
            Ok(i) => nvml.device_by_index(i),
            Err(_) => nvml.device_by_uuid(id.as_str()),
        };
        match dev {
            Ok(dev) => {
                let index = dev.index().map(|i| i.to_string()).unwrap_or(id.clone());
                let label = format!("gpu{index}");
                let mut d = GpuDevice {
                    metric_names: FIELDS
                        .iter()
                        .map(|(_, suffix)| format!("{label}.{suffix}"))
                        .collect(),
                    label,
                    id: dev.uuid().unwrap_or(id),
                    dev,
                    enabled: [true; FIELDS.len()],
                    disabled: Vec::new(),
                    sources: Sources {
                        power_instant: false,
                        energy_field: false,
                        pcie_counters: false,
                    },
                    fallbacks: Vec::new(),
                    counters: [Counter::default(); 2],
                    changed: false,
                };
                d.choose_sources();
                out.push(d);
            }
            Err(e) => errors.push(format!("device {id}: {e}")),
        }
    }
    (out, errors)
}

/// The sampler's NVML metadata: whether it samples, why not, the driver,
/// each device's inventory and the devices that failed to open.
pub fn metadata(
    nvml: &Result<Nvml, String>,
    devices: &[GpuDevice<'_>],
    errors: &[String],
) -> Value {
    match nvml {
        Ok(n) => json!({
            "available": !devices.is_empty(),
            "reason": if devices.is_empty() { Value::from("no device selected or visible") } else { Value::Null },
            "driver": n.sys_driver_version().ok(),
            "devices": devices.iter().map(|d| d.inventory()).collect::<Vec<_>>(),
            "errors": errors,
        }),
        Err(reason) => json!({"available": false, "reason": reason}),
    }
}

/// What the sampler would find here: NVML opened and devices chosen as the
/// sampler does ([`open`], [`devices`], [`metadata`]: each device's
/// `sources` included), then every call group read once, blocking PCIe
/// included (the counters twice, 20 ms apart, for a rate), so each device's
/// inventory gains `fields`: `supported` (read), `unsupported` (field ->
/// why: the sampler switches these off for good) and `no_reading` (a
/// transient failure: the sampler retries them). Also the library asked
/// for and, when loaded, the file it came from. Never fails: no library,
/// no driver or no device is `available: false` with the reason.
pub fn probe(select: &GpuSelect) -> Value {
    let nvml = open(select);
    let (mut devices, errors) = match &nvml {
        Ok(n) => devices(n, select),
        Err(_) => (Vec::new(), Vec::new()),
    };
    // Fields first: a source that falls back in the reads shows in the
    // inventory.
    let fields: Vec<Value> = devices.iter_mut().map(|d| d.probe_fields()).collect();
    let mut meta = metadata(&nvml, &devices, &errors);
    meta["library"] = json!(NVML_LIBRARY);
    if nvml.is_ok() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        meta["library_path"] = json!(library_in_maps(&maps));
    }
    if let Some(inventory) = meta.get_mut("devices").and_then(Value::as_array_mut) {
        for (f, inv) in fields.into_iter().zip(inventory.iter_mut()) {
            inv["fields"] = f;
        }
    }
    meta
}

/// The file of the loaded NVML library, from the text of /proc/self/maps
/// (the loader resolved the name through its own search path; this is where
/// it landed).
fn library_in_maps(maps: &str) -> Option<String> {
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            path.starts_with('/')
                && path
                    .rsplit('/')
                    .next()
                    .is_some_and(|f| f.starts_with("libnvidia-ml.so"))
        })
        .map(str::to_string)
}

/// A field value as a number.
fn sample_f64(v: &SampleValue) -> f64 {
    match *v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => x as f64,
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    }
}

/// A counter value and its width in bits (nvml-wrapper gives 32-bit and
/// `unsigned long` values as `U32`: either way, what we get wraps at 2^32).
fn sample_counter(v: &SampleValue) -> Option<(u64, u32)> {
    match *v {
        SampleValue::U32(x) => Some((x as u64, 32)),
        SampleValue::U64(x) => Some((x, 64)),
        SampleValue::I64(x) => u64::try_from(x).ok().map(|x| (x, 64)),
        SampleValue::F64(_) => None,
    }
}

/// Run `f` and time it.
fn timed<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let t0 = Instant::now();
    let r = f();
    (r, t0.elapsed().as_nanos() as u64)
}

/// Where a reading goes: `(field index in FIELDS, metric name, value)`.
pub type Emit<'a> = dyn FnMut(usize, &str, f64) + 'a;

impl<'n> GpuDevice<'n> {
    /// Open a device on `nvml` (another thread's handle) as `t` describes it.
    pub fn from_template(nvml: &'n Nvml, t: Template) -> Result<GpuDevice<'n>, NvmlError> {
        let dev = match t.id.parse::<u32>() {
            Ok(i) => nvml.device_by_index(i),
            Err(_) => nvml.device_by_uuid(t.id.as_str()),
        }?;
        Ok(GpuDevice {
            label: t.label,
            metric_names: t.metric_names,
            dev,
            id: t.id,
            enabled: t.state.enabled,
            disabled: t.state.disabled,
            sources: t.state.sources,
            fallbacks: t.state.fallbacks,
            counters: [Counter::default(); 2],
            changed: false,
        })
    }
}

impl GpuDevice<'_> {
    /// Ask once, in one call, which of the fields the device has; a field
    /// that fails (the call, or its own sample) falls back to its own call.
    /// The PCIe counters go as a pair: both, or blocking throughput for both.
    fn choose_sources(&mut self) {
        let all = [
            POWER_IDS[0].clone(),
            ENERGY_IDS[0].clone(),
            PCIE_IDS[0].clone(),
            PCIE_IDS[1].clone(),
        ];
        let mut why: [Option<String>; 4] = Default::default();
        match self.dev.field_values_for(&all) {
            Err(e) => why = std::array::from_fn(|_| Some(e.to_string())),
            Ok(samples) => {
                for (k, w) in why.iter_mut().enumerate() {
                    *w = match samples.get(k) {
                        Some(Ok(s)) => s.value.as_ref().err().map(|e| e.to_string()),
                        Some(Err(e)) => Some(e.to_string()),
                        None => Some("no value returned".into()),
                    };
                }
            }
        }
        let pcie_why = why[2].clone().or(why[3].clone());
        self.sources = Sources {
            power_instant: why[0].is_none(),
            energy_field: why[1].is_none(),
            pcie_counters: pcie_why.is_none(),
        };
        for (name, w) in [("power", &why[0]), ("energy", &why[1]), ("pcie", &pcie_why)] {
            if let Some(w) = w {
                self.fallbacks.push((name, w.clone()));
            }
        }
    }

    /// The budget class of a group on this device, and its horizon (ns, 0
    /// for none): PCIe is blocking without byte counters.
    pub fn class_of(&self, group: Group) -> (Class, u64) {
        match group {
            Group::Pcie if self.sources.pcie_counters => (Class::Fast, PCIE_COUNTER_HORIZON_NS),
            Group::Pcie => (Class::Blocking, 0),
            g => (
                GROUPS
                    .iter()
                    .find(|x| x.0 == g)
                    .map_or(Class::System, |x| x.2),
                0,
            ),
        }
    }

    /// Whether any field `group` serves is still read.
    pub fn group_active(&self, group: Group) -> bool {
        let on = |f: Field| self.enabled[f as usize];
        match group {
            Group::Power => on(Field::Power),
            Group::Energy => on(Field::Energy),
            Group::Pcie => on(Field::PcieRx) || on(Field::PcieTx),
            Group::Util => on(Field::Util) || on(Field::MemUtil),
            Group::Mem => on(Field::MemUsed) || on(Field::MemTotal),
            Group::SmClock => on(Field::SmClock),
            Group::MemClock => on(Field::MemClock),
            Group::Temp => on(Field::Temp),
            Group::Throttle => on(Field::Throttle),
        }
    }

    /// What the device knows now, for the other thread.
    pub fn state(&self) -> DeviceState {
        DeviceState {
            enabled: self.enabled,
            sources: self.sources,
            disabled: self.disabled.clone(),
            fallbacks: self.fallbacks.clone(),
        }
    }

    /// How to open this device on another thread.
    pub fn template(&self) -> Template {
        Template {
            label: self.label.clone(),
            metric_names: self.metric_names.clone(),
            id: self.id.clone(),
            state: self.state(),
        }
    }

    /// Take in what the other thread learnt: fields it switched off and
    /// sources it fell back from (both only ever go one way).
    pub fn adopt(&mut self, st: DeviceState) {
        for (i, (f, _)) in FIELDS.iter().enumerate() {
            if self.enabled[i] && !st.enabled[i] {
                let why = st
                    .disabled
                    .iter()
                    .find(|d| d.0 == FIELDS[i].1)
                    .map(|d| d.1.clone());
                self.disable(*f, why.unwrap_or_else(|| "unsupported".into()));
            }
        }
        self.sources.power_instant &= st.sources.power_instant;
        self.sources.energy_field &= st.sources.energy_field;
        self.sources.pcie_counters &= st.sources.pcie_counters;
        for f in st.fallbacks {
            if !self.fallbacks.iter().any(|x| x.0 == f.0) {
                self.fallbacks.push(f);
            }
        }
    }

    /// Which fields one read of every group (blocking PCIe included) gets:
    /// see [`probe`].
    pub fn probe_fields(&mut self) -> Value {
        let seen: [std::cell::Cell<bool>; FIELDS.len()] = Default::default();
        let mut mark = |i: usize, _: &str, _| seen[i].set(true);
        for (g, _, _) in GROUPS {
            if self.group_active(g) {
                self.read_group(g, &mut mark);
            }
        }
        // A second read where a field got nothing and is still on: a rate
        // needs two counter readings (20 ms apart here), a source that fell
        // back in the first read gives its value from its own call, and a
        // transient failure is retried as the sampler would.
        std::thread::sleep(Duration::from_millis(20));
        for (g, _, _) in GROUPS {
            let missing = FIELDS
                .iter()
                .enumerate()
                .any(|(i, (f, _))| self.enabled[i] && !seen[i].get() && group_of(*f) == g);
            if missing && self.group_active(g) {
                self.read_group(g, &mut mark);
            }
        }
        let got = seen.map(|c| c.get());
        let unsupported: serde_json::Map<String, Value> = self
            .disabled
            .iter()
            .map(|(field, why)| (field.clone(), json!(why)))
            .collect();
        let suffixes = FIELDS.iter().map(|(_, suffix)| *suffix);
        let supported: Vec<&str> = suffixes
            .clone()
            .zip(got)
            .filter(|(_, g)| *g)
            .map(|(s, _)| s)
            .collect();
        let no_reading: Vec<&str> = suffixes
            .zip(got)
            .filter(|(s, g)| !*g && !unsupported.contains_key(*s))
            .map(|(s, _)| s)
            .collect();
        json!({"supported": supported, "unsupported": unsupported, "no_reading": no_reading})
    }

    /// Static facts for the metadata, and where power, energy and PCIe come
    /// from (with why a source is not the field, where it is not).
    pub fn inventory(&self) -> Value {
        json!({
            "label": self.label,
            "name": self.dev.name().ok(),
            "uuid": self.dev.uuid().ok(),
            "power_limit_w": self.dev.enforced_power_limit().ok().map(|mw| mw as f64 / 1000.0),
            "memory_total_bytes": self.dev.memory_info().ok().map(|m| m.total),
            "sources": self.sources.json(),
            "source_fallbacks": self.fallbacks_json(),
        })
    }

    pub fn sources_json(&self) -> Value {
        self.sources.json()
    }

    pub fn fallbacks_json(&self) -> Value {
        Value::Object(
            self.fallbacks
                .iter()
                .map(|(k, why)| (k.to_string(), json!(why)))
                .collect(),
        )
    }

    /// Read one call group, calling `emit` per reading. Returns the ns the
    /// NVML call(s) took. Blocking PCIe throughput blocks ~40 ms: only on a
    /// thread that may wait (the helper, the probe).
    pub fn read_group(&mut self, group: Group, emit: &mut Emit<'_>) -> u64 {
        let (field, r, ns) = match group {
            Group::Util => {
                let (r, ns) = timed(|| self.dev.utilization_rates());
                let r = r.map(|u| (u.gpu as f64, u.memory as f64));
                self.take_pair(Field::Util, Field::MemUtil, r, emit);
                return ns;
            }
            Group::Mem => {
                let (r, ns) = timed(|| self.dev.memory_info());
                let r = r.map(|m| (m.used as f64, m.total as f64));
                self.take_pair(Field::MemUsed, Field::MemTotal, r, emit);
                return ns;
            }
            Group::Pcie if self.sources.pcie_counters => return self.read_pcie_counters(emit),
            Group::Pcie => {
                let mut ns = 0;
                for (f, rx) in [(Field::PcieRx, true), (Field::PcieTx, false)] {
                    if self.enabled[f as usize] {
                        let (r, t) = timed(|| pcie::throughput(&self.dev, rx));
                        ns += t;
                        self.take(f, r, emit);
                    }
                }
                return ns;
            }
            Group::Power if self.sources.power_instant => {
                let (r, ns) = timed(|| self.dev.field_values_for(&POWER_IDS));
                (Field::Power, self.one_field(Field::Power, r), ns)
            }
            Group::Power => {
                let (r, ns) = timed(|| self.dev.power_usage());
                (Field::Power, r.map(|mw| mw as f64), ns)
            }
            Group::Energy if self.sources.energy_field => {
                let (r, ns) = timed(|| self.dev.field_values_for(&ENERGY_IDS));
                (Field::Energy, self.one_field(Field::Energy, r), ns)
            }
            Group::Energy => {
                let (r, ns) = timed(|| self.dev.total_energy_consumption());
                (Field::Energy, r.map(|mj| mj as f64), ns)
            }
            Group::SmClock => {
                let (r, ns) = timed(|| self.dev.clock_info(Clock::SM));
                (Field::SmClock, r.map(|c| c as f64), ns)
            }
            Group::MemClock => {
                let (r, ns) = timed(|| self.dev.clock_info(Clock::Memory));
                (Field::MemClock, r.map(|c| c as f64), ns)
            }
            Group::Temp => {
                let (r, ns) = timed(|| self.dev.temperature(TemperatureSensor::Gpu));
                (Field::Temp, r.map(|c| c as f64), ns)
            }
            Group::Throttle => {
                let (r, ns) = timed(|| self.dev.current_throttle_reasons());
                (Field::Throttle, r.map(|b| b.bits() as f64), ns)
            }
        };
        // Power in mW and energy in mJ, from either source.
        let r = match field {
            Field::Power | Field::Energy => r.map(|x| x / 1000.0),
            _ => r,
        };
        self.take(field, r, emit);
        ns
    }

    /// The value of a one-field call. A field that stops being supported
    /// falls back to its own call, from the next read on (no error then:
    /// this read is skipped).
    fn one_field(
        &mut self,
        field: Field,
        r: Result<
            Vec<Result<nvml_wrapper::struct_wrappers::device::FieldValueSample, NvmlError>>,
            NvmlError,
        >,
    ) -> Result<f64, NvmlError> {
        let v = r.and_then(|mut s| match s.pop() {
            Some(Ok(s)) => s.value,
            Some(Err(e)) => Err(e),
            None => Err(NvmlError::Unknown),
        });
        match v {
            Ok(v) => Ok(sample_f64(&v)),
            Err(e) if unsupported(&e) => {
                let (name, why) = (
                    if field == Field::Power {
                        "power"
                    } else {
                        "energy"
                    },
                    e.to_string(),
                );
                if field == Field::Power {
                    self.sources.power_instant = false;
                } else {
                    self.sources.energy_field = false;
                }
                self.fallbacks.push((name, why));
                self.changed = true;
                Err(NvmlError::Unknown) // transient for `take`: not switched off
            }
            Err(e) => Err(e),
        }
    }

    /// The PCIe byte counters: a rate per direction from the second reading on.
    fn read_pcie_counters(&mut self, emit: &mut Emit<'_>) -> u64 {
        // Rates over the instants of the calls, not of the ticks (a group's
        // place in a tick varies).
        let mono = crate::runtime::clock::monotonic_ns();
        let (r, ns) = timed(|| self.dev.field_values_for(&PCIE_IDS));
        let samples = match r {
            Ok(s) => s,
            Err(e) => {
                if unsupported(&e) {
                    self.counters_lost(&e.to_string());
                }
                return ns;
            }
        };
        for (k, s) in samples.iter().enumerate().take(2) {
            let field = if k == 0 { Field::PcieRx } else { Field::PcieTx };
            match s.as_ref().map(|s| &s.value) {
                Ok(Ok(v)) => {
                    let rate = sample_counter(v)
                        .and_then(|(b, bits)| self.counters[k].update(mono, b, bits));
                    let i = field as usize;
                    if let (Some(rate), true) = (rate, self.enabled[i]) {
                        emit(i, &self.metric_names[i], rate);
                    }
                }
                Ok(Err(e)) if unsupported(e) => {
                    let why = e.to_string();
                    self.counters_lost(&why);
                }
                _ => {} // transient, or a value type we do not know
            }
        }
        ns
    }

    /// The counters stopped being supported while running: PCIe is off
    /// (the blocking reads are chosen at open only).
    fn counters_lost(&mut self, why: &str) {
        for f in [Field::PcieRx, Field::PcieTx] {
            self.disable(f, format!("the PCIe byte counters stopped: {why}"));
        }
    }

    /// Switch a field off for good, with why.
    pub fn disable(&mut self, field: Field, why: String) {
        let i = field as usize;
        if self.enabled[i] {
            self.enabled[i] = false;
            self.disabled.push((FIELDS[i].1.to_string(), why));
            self.changed = true;
        }
    }

    /// Emit a reading, or switch the field off when it is unsupported; a
    /// transient failure (e.g. GPU busy resetting) skips this read.
    fn take(&mut self, field: Field, r: Result<f64, NvmlError>, emit: &mut Emit<'_>) {
        let i = field as usize;
        if !self.enabled[i] {
            return;
        }
        match r {
            Ok(v) => emit(i, &self.metric_names[i], v),
            Err(e) if unsupported(&e) => self.disable(field, e.to_string()),
            Err(_) => {}
        }
    }

    /// [`GpuDevice::take`] for a call that serves two fields.
    fn take_pair(
        &mut self,
        a: Field,
        b: Field,
        r: Result<(f64, f64), NvmlError>,
        emit: &mut Emit<'_>,
    ) {
        match r {
            Ok((x, y)) => {
                self.take(a, Ok(x), emit);
                self.take(b, Ok(y), emit);
            }
            Err(e) if unsupported(&e) => {
                self.disable(a, e.to_string());
                self.disable(b, e.to_string());
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_indexed_by_their_order_and_every_group_serves_one() {
        for (i, (f, _)) in FIELDS.iter().enumerate() {
            assert_eq!(*f as usize, i);
        }
        for (g, _, _) in GROUPS {
            assert!(FIELDS.iter().any(|(f, _)| group_of(*f) == g), "{g:?}");
        }
    }

    #[test]
    fn the_library_path_is_found_in_the_process_maps() {
        let maps = "\
7f1c2a000000-7f1c2a021000 r--p 00000000 08:01 1234  /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2b000000-7f1c2b0e1000 r-xp 00000000 08:01 5678  /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15
7f1c2c000000-7f1c2c001000 rw-p 00000000 00:00 0
7ffd1e000000-7ffd1e021000 rw-p 00000000 00:00 0     [stack]
";
        assert_eq!(
            library_in_maps(maps).as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")
        );
        // A directory that merely mentions the name is not the library.
        let other = "7f-7f r--p 0 08:01 1 /opt/libnvidia-ml.so.d/notes.txt\n";
        assert_eq!(library_in_maps(other), None);
        assert_eq!(library_in_maps(""), None);
    }

    #[test]
    fn the_probe_reports_why_nvml_is_off_or_every_field_of_every_device() {
        let off = probe(&GpuSelect::None);
        assert_eq!(off["available"], json!(false));
        assert_eq!(off["reason"], json!("disabled by configuration"));
        assert_eq!(off["library"], json!(NVML_LIBRARY));

        // Without a driver (CI) the loader's reason; with one, each device's
        // fields split into the three lists, every field exactly once.
        let all = probe(&GpuSelect::All);
        match all["devices"].as_array() {
            None => {
                assert_eq!(all["available"], json!(false));
                let reason = all["reason"].as_str().unwrap();
                assert!(reason.contains("NVML"), "{reason}");
            }
            Some(devices) => {
                assert!(all["library_path"].is_string(), "{all}");
                for d in devices {
                    let f = &d["fields"];
                    let mut seen: Vec<String> = f["supported"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .chain(f["no_reading"].as_array().unwrap())
                        .map(|v| v.as_str().unwrap().to_string())
                        .chain(f["unsupported"].as_object().unwrap().keys().cloned())
                        .collect();
                    seen.sort();
                    let mut want: Vec<String> = FIELDS.iter().map(|(_, s)| s.to_string()).collect();
                    want.sort();
                    assert_eq!(seen, want, "{d}");
                }
            }
        }
    }
}
