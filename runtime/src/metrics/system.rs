//! Triton's CPU families, read from `/proc` at each scrape: the whole
//! machine's, not the process's (in a container, the node's), as Triton's
//! are: `nv_cpu_utilization` (0 to 1, since the previous scrape),
//! `nv_cpu_memory_used_bytes` and `nv_cpu_memory_total_bytes`.

use parking_lot::Mutex;
use prometheus::{Gauge, IntGauge, Registry};

pub struct SystemMetrics {
    utilization: Gauge,
    memory_used: IntGauge,
    memory_total: IntGauge,
    /// (busy, total) CPU jiffies at the previous scrape.
    previous: Mutex<(u64, u64)>,
}

impl SystemMetrics {
    pub fn register(registry: &Registry) -> SystemMetrics {
        let utilization = Gauge::new(
            "nv_cpu_utilization",
            "The whole machine's CPU utilization since the previous scrape, all processes [0.0 - 1.0] (/proc/stat)",
        )
        .expect("valid metric");
        let memory_used = IntGauge::new(
            "nv_cpu_memory_used_bytes",
            "The whole machine's memory in use by all processes, in bytes (MemTotal - MemAvailable of /proc/meminfo)",
        )
        .expect("valid");
        let memory_total = IntGauge::new(
            "nv_cpu_memory_total_bytes",
            "The whole machine's memory, in bytes (MemTotal of /proc/meminfo)",
        )
        .expect("valid");
        for g in [&memory_used, &memory_total] {
            registry.register(Box::new(g.clone())).expect("unique metric");
        }
        registry.register(Box::new(utilization.clone())).expect("unique metric");
        SystemMetrics { utilization, memory_used, memory_total, previous: Mutex::new(cpu_jiffies().unwrap_or((0, 0))) }
    }

    pub fn refresh(&self) {
        if let Some((total, available)) = memory_kib() {
            self.memory_total.set((total * 1024) as i64);
            self.memory_used.set((total.saturating_sub(available) * 1024) as i64);
        }
        if let Some((busy, total)) = cpu_jiffies() {
            let mut previous = self.previous.lock();
            let elapsed = total.saturating_sub(previous.1);
            if elapsed > 0 {
                self.utilization.set(busy.saturating_sub(previous.0) as f64 / elapsed as f64);
            }
            *previous = (busy, total);
        }
    }
}

/// (MemTotal, MemAvailable) from `/proc/meminfo`, in KiB.
fn memory_kib() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// (busy, total) jiffies of all CPUs from the first line of `/proc/stat`.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let values: Vec<u64> = text.lines().next()?.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3)? + values.get(4).unwrap_or(&0);
    Some((total - idle, total))
}
