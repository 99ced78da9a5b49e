//! Triton's GPU families, read from NVML at each scrape and labelled
//! `gpu_uuid` (Triton's `docs/user_guide/metrics.md`, "GPU Metrics"):
//! `nv_gpu_utilization` (0 to 1), `nv_gpu_memory_total_bytes`,
//! `nv_gpu_memory_used_bytes`, `nv_gpu_power_usage` and `nv_gpu_power_limit`
//! (watts), and the counter `nv_energy_consumption` (joules since the
//! server started). Registered only where NVML lists at least one GPU, so a
//! machine without one exports none of them.

use std::sync::Arc;

use prometheus::{CounterVec, GaugeVec, Opts, Registry};

use super::register;
use crate::gpu::Gpus;

/// Triton's GPU families, kept in step with NVML by [`GpuMetrics::refresh`].
pub struct GpuMetrics {
    gpus: Arc<Gpus>,
    /// Each device's energy counter (joules) when the server started, by
    /// index; `None` where NVML does not report it.
    energy_at_start: Vec<Option<f64>>,
    utilization: GaugeVec,
    memory_total: GaugeVec,
    memory_used: GaugeVec,
    power_usage: GaugeVec,
    power_limit: GaugeVec,
    energy: CounterVec,
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
            energy: register(
                registry,
                CounterVec::new(
                    Opts::new(
                        "nv_energy_consumption",
                        "GPU energy consumption since the server started, in joules (NVML)",
                    ),
                    &["gpu_uuid"],
                )
                .expect("valid metric"),
            ),
            energy_at_start: gpus
                .devices()
                .iter()
                .map(|d| gpus.sample(d.index).and_then(|s| s.energy_joules))
                .collect(),
            gpus,
        })
    }

    /// Reads every device now. A value NVML cannot give now is left out
    /// rather than reported as 0 or as an old reading.
    pub fn refresh(&self) {
        for (device, energy_at_start) in self.gpus.devices().iter().zip(&self.energy_at_start) {
            let labels = [device.uuid.as_str()];
            let sample = self.gpus.sample(device.index);
            let optional = [
                (&self.memory_total, sample.map(|s| s.memory_total as f64)),
                (&self.memory_used, sample.map(|s| s.memory_used as f64)),
                (&self.utilization, sample.and_then(|s| s.utilization)),
                (&self.power_usage, sample.and_then(|s| s.power_watts)),
                (&self.power_limit, sample.and_then(|s| s.power_limit_watts)),
            ];
            for (family, value) in optional {
                match value {
                    Some(value) => family.with_label_values(&labels).set(value),
                    None => {
                        let _ = family.remove_label_values(&labels);
                    }
                }
            }
            // A counter only grows: it takes what was used since the last
            // scrape.
            if let (Some(start), Some(now)) = (energy_at_start, sample.and_then(|s| s.energy_joules)) {
                let counter = self.energy.with_label_values(&labels);
                let grown = (now - start) - counter.get();
                if grown > 0.0 {
                    counter.inc_by(grown);
                }
            }
        }
    }
}
