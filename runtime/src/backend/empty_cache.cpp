// at::accelerator::emptyCache() is inline in ATen's headers, so Rust cannot
// call it directly; this C entry point compiles it against the same libtorch
// headers the binary links with. A no-op where no accelerator (CUDA) backend
// is loaded; exceptions must not cross into Rust.
#include <ATen/DeviceAccelerator.h>

extern "C" void plinth_empty_accelerator_cache() {
    try {
        if (at::accelerator::getAccelerator(false).has_value()) {
            at::accelerator::emptyCache();
        }
    } catch (...) {
    }
}
