//! A hot swap on a GPU: whether a new version fits beside the one serving,
//! and what `gpu_swap_policy` does when it does not.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::core::Core;
use super::records::ModelRecord;
use crate::config::{GpuSwapPolicy, ModelConfig};
use crate::drain::InUse;
use crate::model::Model;
use crate::residency::{self, Footprint};

impl Core {
    /// Whether a new version of `name` fits on its GPUs beside the versions
    /// serving (a hot swap keeps them until the new one is READY), counting
    /// it as large as they are together: within `--model-load-gpu-limit`
    /// and within the memory NVML says is free on the device. Only GPUs the
    /// new configuration may use are checked (a move to the CPU needs no
    /// room there; a GPU the model never used is measured at load, as a
    /// first load is). Where it does not fit, [`GpuSwapPolicy`] decides:
    /// refused, or the versions serving are unloaded first. Loading anyway
    /// could run the device out of memory in the middle of the swap.
    ///
    /// Returns whether it unloaded them, once their memory was handed back
    /// (requests in flight on them finish first; at most the load timeout).
    ///
    /// # Errors
    /// Under [`GpuSwapPolicy::Refuse`], a message naming the GPU, both sizes
    /// and the parameter that allows unloading first; under
    /// [`GpuSwapPolicy::UnloadFirst`], when requests still hold the old
    /// versions at the load timeout or the GPU is still short of room.
    pub(super) async fn room_to_swap(
        &self,
        name: &str,
        config: &ModelConfig,
        policy: GpuSwapPolicy,
        record: &mut ModelRecord,
    ) -> Result<bool, String> {
        let serving = self.residency.held(name);
        let wanted: BTreeMap<u32, u64> = serving
            .devices
            .iter()
            .filter(|&(&gpu, &bytes)| bytes > 0 && crate::model::may_use_gpu(config, gpu))
            .map(|(&gpu, &bytes)| (gpu, bytes))
            .collect();
        if wanted.is_empty() {
            return Ok(false);
        }
        // Device memory only: the host budget is settled after the load.
        let both = Footprint { host: 0, devices: wanted.iter().map(|(&gpu, &b)| (gpu, 2 * b)).collect() };
        let budget = self.residency.check_free_on_gpus(name, &both).err();
        let Some(reason) = budget.or_else(|| self.short_of_device_memory(&wanted)) else { return Ok(false) };
        match policy {
            GpuSwapPolicy::Refuse => Err(format!(
                "model '{name}': a new version does not fit beside the one serving ({serving}): {reason}; the version serving \
                 keeps serving (parameter 'gpu_swap_policy: unload_first' unloads it first, at the cost of \
                 503s until the new one is READY)"
            )),
            GpuSwapPolicy::UnloadFirst => {
                tracing::warn!(model = %name, %reason, "unloading the versions serving before the swap (gpu_swap_policy)");
                let old = self.registry.make_way(name);
                self.forget_residency(name);
                record.loaded.clear();
                self.hand_back(old).await.map_err(|e| format!("model '{name}': {e}"))?;
                match self.short_of_device_memory(&wanted) {
                    None => Ok(true),
                    Some(reason) => Err(format!("model '{name}': the versions serving were unloaded, but {reason}")),
                }
            }
        }
    }

    /// The first GPU of `wanted` (bytes by GPU index) where NVML reports
    /// less memory free than wanted there, as a message with both sizes.
    fn short_of_device_memory(&self, wanted: &BTreeMap<u32, u64>) -> Option<String> {
        wanted.iter().find_map(|(&gpu, &bytes)| {
            let free = self.loader.gpu_free_bytes(gpu)?;
            (bytes > free).then(|| {
                format!(
                    "GPU {gpu} has {} free, and the new version needs about {} there",
                    residency::human(free),
                    residency::human(bytes)
                )
            })
        })
    }

    /// Lets go of `old`, taken out of the registry, and waits until the
    /// last request using it has let go too and its instances are dropped
    /// (at most the load timeout), so that its sessions and modules are
    /// destroyed, and their device memory handed back, before this returns.
    ///
    /// # Errors
    /// When requests still hold a version at the timeout (it then leaves
    /// memory with the last of them).
    async fn hand_back(&self, old: Vec<Arc<Model>>) -> Result<(), String> {
        let freed: Vec<InUse> = old.iter().map(|m| m.freed()).collect();
        drop(old);
        let deadline = tokio::time::Instant::now() + self.limits.timeout;
        for version in freed {
            if version.none_by(deadline).await.is_err() {
                return Err(format!(
                    "requests still run on the versions unloaded to make room after {:?} \
                     (--model-load-timeout-secs); the new version was not loaded",
                    self.limits.timeout
                ));
            }
        }
        Ok(())
    }
}
