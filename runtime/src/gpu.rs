//! The machine's NVIDIA GPUs as NVML (the NVIDIA Management Library,
//! `libnvidia-ml.so.1`, part of the driver) reports them: how many there
//! are, their UUIDs, and each one's memory, utilization and power at the
//! moment of asking. The library is loaded at run time, so the same binary
//! starts on a machine without a driver; there [`Gpus::count`] is 0 and
//! [`Gpus::absence`] says why.
//!
//! NVML counts memory per device, for every process on it; a model's share
//! is what its load added (see `model::instances`), measured while no other
//! load runs on that device.
//!
//! A GPU's index is its CUDA device ordinal, the number `instance_group`'s
//! `gpus` and the frameworks use. NVML numbers devices by PCI bus; CUDA
//! does too with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (`scripts/gpu_env.sh` sets
//! it). `CUDA_VISIBLE_DEVICES` (indices or `GPU-` UUIDs) is applied here as
//! CUDA applies it, so the two agree on which device an index means.

use nvml_wrapper::Nvml;

/// One GPU, as NVML names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// The CUDA device ordinal (see the module's documentation).
    pub index: u32,
    /// NVML's index of the same device.
    pub nvml_index: u32,
    /// `GPU-…`: Triton's `gpu_uuid` metric label.
    pub uuid: String,
    /// The product name (`NVIDIA H200`).
    pub name: String,
    /// Installed device memory, in bytes.
    pub memory_total: u64,
}

/// One device's state at the moment of asking.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuSample {
    /// Share of the last sample period (NVML's, about 1/6 s to 1 s) in which
    /// a kernel ran, 0.0 to 1.0; `None` where NVML cannot say.
    pub utilization: Option<f64>,
    /// Device memory allocated by all processes, in bytes.
    pub memory_used: u64,
    /// Installed device memory, in bytes.
    pub memory_total: u64,
    /// Power draw, in watts; `None` where the board does not report it.
    pub power_watts: Option<f64>,
    /// The enforced power limit, in watts; `None` where not reported.
    pub power_limit_watts: Option<f64>,
    /// Energy used since the driver last loaded, in joules; `None` where not
    /// reported (before Volta).
    pub energy_joules: Option<f64>,
}

/// NVML and the devices it found at start.
pub struct Gpus {
    nvml: Option<Nvml>,
    devices: Vec<GpuDevice>,
    absence: Option<String>,
}

impl Gpus {
    /// Loads NVML and lists the devices. Never fails: without a driver (no
    /// `libnvidia-ml.so.1`, or NVML cannot start) the list is empty and
    /// [`Gpus::absence`] holds NVML's reason.
    pub fn probe() -> Gpus {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let listed = |nvml: &Nvml| list(nvml).map(|all| cuda_visible(all, visible.as_deref()));
        match Nvml::init().map_err(|e| e.to_string()).and_then(|nvml| listed(&nvml).map(|devices| (nvml, devices))) {
            Ok((nvml, devices)) => {
                let absence = devices.is_empty().then(|| "NVML lists no GPU".to_owned());
                Gpus { nvml: Some(nvml), devices, absence }
            }
            Err(e) => Gpus::none(format!("NVML cannot start (libnvidia-ml.so.1, the NVIDIA driver's library): {e}")),
        }
    }

    /// No GPUs, for `reason` (tests, and machines where NVML is not wanted).
    pub fn none(reason: String) -> Gpus {
        Gpus { nvml: None, devices: Vec::new(), absence: Some(reason) }
    }

    /// The devices found at start, by index.
    pub fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    /// How many devices there are.
    pub fn count(&self) -> usize {
        self.devices.len()
    }

    /// Why there are none, when there are none.
    pub fn absence(&self) -> Option<&str> {
        self.absence.as_deref()
    }

    /// Device memory in use on device `index` by all processes, in bytes;
    /// `None` for an index NVML does not know or when it cannot say.
    pub fn memory_used(&self, index: u32) -> Option<u64> {
        self.device(index)?.memory_info().map(|m| m.used).ok()
    }

    /// NVML's handle of the device with CUDA ordinal `index`.
    fn device(&self, index: u32) -> Option<nvml_wrapper::Device<'_>> {
        let nvml_index = self.devices.iter().find(|d| d.index == index)?.nvml_index;
        self.nvml.as_ref()?.device_by_index(nvml_index).ok()
    }

    /// Device `index`'s utilization, memory and power now; `None` for an
    /// index NVML does not know or when it cannot read the memory.
    pub fn sample(&self, index: u32) -> Option<GpuSample> {
        let device = self.device(index)?;
        let memory = device.memory_info().ok()?;
        let milliwatts = |r: Result<u32, _>| r.ok().map(|mw| f64::from(mw) / 1000.0);
        Some(GpuSample {
            utilization: device.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
            memory_used: memory.used,
            memory_total: memory.total,
            power_watts: milliwatts(device.power_usage()),
            power_limit_watts: milliwatts(device.enforced_power_limit()),
            energy_joules: device.total_energy_consumption().ok().map(|mj| mj as f64 / 1000.0),
        })
    }
}

/// The CUDA runtime both ONNX Runtime's CUDA provider and libtorch 2.11
/// use (both are CUDA 13 builds).
const CUDA_RUNTIME: &std::ffi::CStr = c"libcudart.so.13";

/// Makes device `index`'s primary CUDA context (the one the CUDA runtime,
/// and so ONNX Runtime and libtorch, share) if it does not exist yet.
/// Making it costs hundreds of MiB of device memory that no unload hands
/// back; doing it before a load is measured keeps that cost out of the
/// first model's count.
///
/// # Errors
/// When `libcudart.so.13` cannot be loaded or the CUDA runtime refuses
/// the device, with its error number.
pub fn init_context(index: u32) -> Result<(), String> {
    type SetDevice = unsafe extern "C" fn(libc::c_int) -> libc::c_int;
    type Free = unsafe extern "C" fn(*mut libc::c_void) -> libc::c_int;
    // SAFETY: dlopen with a valid C string; the handle stays open for the
    // life of the process (the frameworks load the same library).
    let handle = unsafe { libc::dlopen(CUDA_RUNTIME.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        return Err("libcudart.so.13 is not on the library path".to_owned());
    }
    // SAFETY: symbols of the CUDA runtime with these C signatures.
    let (set_device, free) = unsafe {
        let set = libc::dlsym(handle, c"cudaSetDevice".as_ptr());
        let free = libc::dlsym(handle, c"cudaFree".as_ptr());
        if set.is_null() || free.is_null() {
            return Err("libcudart.so.13 lacks cudaSetDevice or cudaFree".to_owned());
        }
        (std::mem::transmute::<*mut libc::c_void, SetDevice>(set), std::mem::transmute::<*mut libc::c_void, Free>(free))
    };
    let device = libc::c_int::try_from(index).map_err(|_| format!("GPU {index} does not exist"))?;
    // SAFETY: cudaSetDevice then cudaFree(NULL), the CUDA runtime's way to
    // make the current device's context; both only return an error code.
    match unsafe { (set_device(device), free(std::ptr::null_mut())) } {
        (0, 0) => Ok(()),
        (set, free) => Err(format!("CUDA error {set}/{free} making GPU {index}'s context")),
    }
}

fn list(nvml: &Nvml) -> Result<Vec<GpuDevice>, String> {
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    (0..count)
        .map(|index| {
            let device = nvml.device_by_index(index).map_err(|e| format!("GPU {index}: {e}"))?;
            Ok(GpuDevice {
                index,
                nvml_index: index,
                uuid: device.uuid().map_err(|e| format!("GPU {index}: {e}"))?,
                name: device.name().unwrap_or_default(),
                memory_total: device.memory_info().map(|m| m.total).unwrap_or(0),
            })
        })
        .collect()
}

/// The devices CUDA sees under `CUDA_VISIBLE_DEVICES` (`visible`), in its
/// order, numbered from 0: a comma-separated list of indices or `GPU-` UUID
/// prefixes, read up to the first entry that names no device, as CUDA
/// reads it. All of them, as listed, when it is not set.
fn cuda_visible(all: Vec<GpuDevice>, visible: Option<&str>) -> Vec<GpuDevice> {
    let Some(visible) = visible else { return all };
    let mut chosen: Vec<GpuDevice> = Vec::new();
    for entry in visible.split(',').map(str::trim) {
        let found = match entry.parse::<u32>() {
            Ok(n) => all.iter().find(|d| d.nvml_index == n),
            Err(_) => all.iter().find(|d| !entry.is_empty() && d.uuid.starts_with(entry)),
        };
        match found {
            Some(device) if !chosen.iter().any(|c| c.nvml_index == device.nvml_index) => {
                let index = chosen.len() as u32;
                chosen.push(GpuDevice { index, ..device.clone() });
            }
            _ => break,
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_visible_devices_renumbers_as_cuda_does() {
        let gpu = |n: u32| GpuDevice {
            index: n,
            nvml_index: n,
            uuid: format!("GPU-{n}aaa"),
            name: "H200".into(),
            memory_total: 1,
        };
        let all = vec![gpu(0), gpu(1), gpu(2)];
        let seen = |v: Option<&str>| -> Vec<(u32, u32)> {
            cuda_visible(all.clone(), v).iter().map(|d| (d.index, d.nvml_index)).collect()
        };
        assert_eq!(seen(None), [(0, 0), (1, 1), (2, 2)]);
        assert_eq!(seen(Some("2,0")), [(0, 2), (1, 0)]);
        assert_eq!(seen(Some("GPU-1,7,0")), [(0, 1)], "read up to the first entry naming no device");
        assert_eq!(seen(Some("")), []);
    }

    #[test]
    fn a_machine_without_a_driver_has_no_gpus_and_says_why() {
        let gpus = Gpus::probe();
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return; // a GPU machine: nothing to check here
        }
        assert_eq!(gpus.count(), 0);
        assert!(gpus.absence().unwrap().contains("libnvidia-ml.so.1"), "{:?}", gpus.absence());
        assert_eq!(gpus.memory_used(0), None);
        assert_eq!(gpus.sample(0), None);
    }
}
