"""Unzips a slim libtorch folder from PyPI wheels, for linking tch.

torch-sys reads LIBTORCH and needs LIBTORCH/include, LIBTORCH/lib and
LIBTORCH/build-version. Only the CPU libraries are taken from the torch
wheel (a CUDA 13 build); libtorch_cpu.so needs libcudart and libcupti from
the NVIDIA wheels even on a machine without a GPU. libtorch_cuda.so is left
out: Plinth loads it at start where a full PyTorch provides it.

usage: slim_libtorch.py WHEEL_DIR OUT
"""

import pathlib
import shutil
import sys
import zipfile

TORCH_LIBS = ["libtorch_cpu.so", "libc10.so", "libgomp.so.1", "libtorch.so"]
CUDA_LIBS = {"nvidia_cuda_runtime": "libcudart.so.13", "nvidia_cuda_cupti": "libcupti.so.13"}


def main(wheel_dir: str, out: str) -> None:
    wheels = pathlib.Path(wheel_dir)
    out = pathlib.Path(out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "lib").mkdir(parents=True)
    with zipfile.ZipFile(next(wheels.glob("torch-2.11.0-*.whl"))) as z:
        for info in z.infolist():
            name = info.filename
            if name.startswith("torch/include/") and not name.endswith("/"):
                target = tmp / name.removeprefix("torch/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(info))
        for lib in TORCH_LIBS:
            (tmp / "lib" / lib).write_bytes(z.read(f"torch/lib/{lib}"))
    for prefix, lib in CUDA_LIBS.items():
        with zipfile.ZipFile(next(wheels.glob(f"{prefix}-*.whl"))) as z:
            (tmp / "lib" / lib).write_bytes(z.read(f"nvidia/cu13/lib/{lib}"))
    (tmp / "build-version").write_text("2.11.0\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"slim libtorch 2.11.0 in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
