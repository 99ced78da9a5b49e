//! Triton's GPU families, read from NVML at each scrape and labelled
//! `gpu_uuid` (Triton's `docs/user_guide/metrics.md`, "GPU Metrics"):
//! `nv_gpu_utilization` (0 to 1), `nv_gpu_memory_total_bytes`,
//! `nv_gpu_memory_used_bytes`, `nv_gpu_power_usage` and `nv_gpu_power_limit`
//! (watts), `nv_energy_consumption` (joules). Registered only where NVML
//! lists at least one GPU, so a machine without one exports none of them.

use std::sync::Arc;

use prometheus::{GaugeVec, Opts, Registry};

use super::register;
use crate::gpu::Gpus;

pub struct GpuMetrics {
    gpus: Arc<Gpus>,
    utilization: GaugeVec,
    memory_total: GaugeVec,
    memory_used: GaugeVec,
    power_usage: GaugeVec,
    power_limit: GaugeVec,
    energy: GaugeVec,
}

impl GpuMetrics {
    /// The families for `gpus`, registered with `registry`; `None` when
    /// there is no GPU.
    pub fn register(registry: &Registry, gpus: Arc<Gpus>) -> Option<GpuMetrics> {
        if gpus.count() == 0 {
            return None;
        }
        let family = |name: &str, help: &str| {
            register(registry, GaugeVec::new(Opts::new(name, help), &["gpu_uuid"]).expect("valid metric"))
        };
        Some(GpuMetrics {
            utilization: family("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0) (NVML)"),
            memory_total: family("nv_gpu_memory_total_bytes", "GPU total memory, in bytes (NVML)"),
            memory_used: family("nv_gpu_memory_used_bytes", "GPU used memory by all processes, in bytes (NVML)"),
            power_usage: family("nv_gpu_power_usage", "GPU power usage, in watts (NVML)"),
            power_limit: family("nv_gpu_power_limit", "GPU power management limit, in watts (NVML)"),
            energy: family("nv_energy_consumption", "GPU energy consumption since the driver loaded, in joules (NVML)"),
            gpus,
        })
    }

    /// Reads every device now. A value NVML cannot give is left out rather
    /// than reported as 0.
    pub fn refresh(&self) {
        for device in self.gpus.devices() {
            let Some(sample) = self.gpus.sample(device.index) else { continue };
            let labels = [device.uuid.as_str()];
            self.memory_total.with_label_values(&labels).set(sample.memory_total as f64);
            self.memory_used.with_label_values(&labels).set(sample.memory_used as f64);
            let optional = [
                (&self.utilization, sample.utilization),
                (&self.power_usage, sample.power_watts),
                (&self.power_limit, sample.power_limit_watts),
                (&self.energy, sample.energy_joules),
            ];
            for (family, value) in optional {
                if let Some(value) = value {
                    family.with_label_values(&labels).set(value);
                }
            }
        }
    }
}
