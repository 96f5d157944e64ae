//! NVML readings, with the library loaded at run time. No library, no driver
//! or no device is a normal state: it is reported once (with the reason) in
//! the sampler metadata, never raised and never warned per tick. A field a
//! device does not support is disabled for that device, recorded once.
//! [`probe`] runs the same opening and the same reads once, for
//! `fastprof doctor`: what it reports is what the sampler would see.

use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use serde_json::{json, Value};
use std::time::Instant;

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

/// The fields read per device, in the order of [`FIELDS`].
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
fn unsupported(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_)
    )
}

/// A call that serves two fields: their values, or (unsupported for good?, message).
type PairReading = Result<(f64, f64), (bool, String)>;

/// Per-device state: which fields still work.
pub struct GpuDevice<'n> {
    pub label: String,
    /// `"{label}.{field}"` for each of [`FIELDS`], made once rather than per tick.
    pub metric_names: Vec<String>,
    dev: Device<'n>,
    enabled: [bool; FIELDS.len()],
    pub disabled: Vec<(String, String)>,
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
                out.push(GpuDevice {
                    metric_names: FIELDS
                        .iter()
                        .map(|(_, suffix)| format!("{label}.{suffix}"))
                        .collect(),
                    label,
                    dev,
                    enabled: [true; FIELDS.len()],
                    disabled: Vec::new(),
                });
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
/// sampler does ([`open`], [`devices`], [`metadata`]), then one
/// [`GpuDevice::read`] of every field, PCIe included, so each device's
/// inventory gains `fields`: `supported` (read), `unsupported` (field ->
/// why: the sampler switches these off for good) and `no_reading` (a
/// transient failure: the sampler retries them every tick). Also the library
/// asked for and, when loaded, the file it came from. Never fails: no
/// library, no driver or no device is `available: false` with the reason.
pub fn probe(select: &GpuSelect) -> Value {
    let nvml = open(select);
    let (mut devices, errors) = match &nvml {
        Ok(n) => devices(n, select),
        Err(_) => (Vec::new(), Vec::new()),
    };
    let mut meta = metadata(&nvml, &devices, &errors);
    meta["library"] = json!(NVML_LIBRARY);
    if nvml.is_ok() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        meta["library_path"] = json!(library_in_maps(&maps));
    }
    if let Some(inventory) = meta.get_mut("devices").and_then(Value::as_array_mut) {
        for (d, inv) in devices.iter_mut().zip(inventory.iter_mut()) {
            inv["fields"] = d.probe_fields();
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

impl GpuDevice<'_> {
    /// Which fields one [`GpuDevice::read`] (PCIe included) gets: see [`probe`].
    pub fn probe_fields(&mut self) -> Value {
        let mut got = [false; FIELDS.len()];
        let names = self.metric_names.clone();
        self.read(true, &mut |name, _| {
            if let Some(i) = names.iter().position(|n| n == name) {
                got[i] = true;
            }
        });
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

    /// Static facts for the metadata.
    pub fn inventory(&self) -> Value {
        json!({
            "label": self.label,
            "name": self.dev.name().ok(),
            "uuid": self.dev.uuid().ok(),
            "power_limit_w": self.dev.enforced_power_limit().ok().map(|mw| mw as f64 / 1000.0),
            "memory_total_bytes": self.dev.memory_info().ok().map(|m| m.total),
        })
    }

    /// Read every enabled field (PCIe only when `with_pcie`: that call blocks
    /// ~20 ms in the driver, so it runs on its own slower cadence). Calls
    /// `emit(metric name, value)` per reading; returns ns spent in NVML.
    pub fn read(&mut self, with_pcie: bool, emit: &mut dyn FnMut(&str, f64)) -> u64 {
        let t0 = Instant::now();
        // (unsupported for good?, message): classified once, so one NVML call
        // can serve the two fields it returns.
        let classify = |e: &NvmlError| (unsupported(e), e.to_string());
        let util = (self.enabled[0] || self.enabled[1]).then(|| {
            self.dev
                .utilization_rates()
                .map(|u| (u.gpu as f64, u.memory as f64))
                .map_err(|e| classify(&e))
        });
        let mem = (self.enabled[2] || self.enabled[3]).then(|| {
            self.dev
                .memory_info()
                .map(|m| (m.used as f64, m.total as f64))
                .map_err(|e| classify(&e))
        });
        let pick = |r: &Option<PairReading>, second: bool| match r {
            Some(Ok((a, b))) => Ok(if second { *b } else { *a }),
            Some(Err(e)) => Err(e.clone()),
            None => Err((false, String::new())),
        };
        for (i, (field, suffix)) in FIELDS.iter().enumerate() {
            if !self.enabled[i] {
                continue;
            }
            let r: Result<f64, (bool, String)> = match field {
                Field::Util => pick(&util, false),
                Field::MemUtil => pick(&util, true),
                Field::MemUsed => pick(&mem, false),
                Field::MemTotal => pick(&mem, true),
                Field::PcieRx | Field::PcieTx if !with_pcie => continue,
                other => self.read_one(*other).map_err(|e| classify(&e)),
            };
            match r {
                Ok(v) => emit(&self.metric_names[i], v),
                Err((true, msg)) => {
                    self.enabled[i] = false;
                    self.disabled.push((suffix.to_string(), msg));
                }
                Err((false, _)) => {} // transient (e.g. GPU busy resetting): skip this tick
            }
        }
        t0.elapsed().as_nanos() as u64
    }

    /// One NVML call for the fields that have their own.
    fn read_one(&self, field: Field) -> Result<f64, NvmlError> {
        match field {
            Field::Power => self.dev.power_usage().map(|mw| mw as f64 / 1000.0),
            Field::Energy => self
                .dev
                .total_energy_consumption()
                .map(|mj| mj as f64 / 1000.0),
            Field::SmClock => self.dev.clock_info(Clock::SM).map(|c| c as f64),
            Field::MemClock => self.dev.clock_info(Clock::Memory).map(|c| c as f64),
            Field::Temp => self
                .dev
                .temperature(TemperatureSensor::Gpu)
                .map(|c| c as f64),
            Field::Throttle => self.dev.current_throttle_reasons().map(|r| r.bits() as f64),
            Field::PcieRx => self
                .dev
                .pcie_throughput(PcieUtilCounter::Receive)
                .map(|k| k as f64 * 1024.0),
            Field::PcieTx => self
                .dev
                .pcie_throughput(PcieUtilCounter::Send)
                .map(|k| k as f64 * 1024.0),
            Field::Util | Field::MemUtil | Field::MemUsed | Field::MemTotal => {
                Err(NvmlError::NotSupported)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
