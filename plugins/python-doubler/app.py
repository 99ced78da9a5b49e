"""A Plinth plugin in Python, built into a WASI 0.2 component with
componentize-py against wit/v0.2 (world `plugin`): the contract is
language-neutral. It serves a model y = f(x) on FP32 rows: `preprocess`
reads a JSON body {"data": [numbers]} into the first input (one row),
`postprocess` answers {"outputs": [numbers]} from the first output.

Build (scripts/setup.sh does it):
    componentize-py -d wit/v0.2 -w plugin componentize app -o python_doubler.wasm
"""

import json
import struct

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports.types import (
    Datatype, Error_BadInput, Error_Internal, ModelInfo, Request, Response, Tensor,
)


class Handler(exports.Handler):
    def init(self, info: ModelInfo) -> None:
        if not info.inputs or info.inputs[0].datatype != Datatype.FP32:
            raise Err(Error_Internal("the model's first input must be FP32"))
        global INFO
        INFO = info

    def preprocess(self, req: Request) -> list[Tensor]:
        try:
            data = [float(v) for v in json.loads(req.body)["data"]]
        except (ValueError, KeyError, TypeError) as e:
            raise Err(Error_BadInput(f"expected {{\"data\": [numbers]}}: {e}"))
        shape = [1, len(data)] if INFO.max_batch_size > 0 else [len(data)]
        return [Tensor(INFO.inputs[0].name, Datatype.FP32, shape, struct.pack(f"<{len(data)}f", *data))]

    def postprocess(self, req: Request, outputs: list[Tensor]) -> Response:
        out = next((t for t in outputs if t.name == INFO.outputs[0].name), None)
        if out is None or out.datatype != Datatype.FP32:
            raise Err(Error_Internal("the model returned no FP32 first output"))
        values = struct.unpack(f"<{len(out.data) // 4}f", out.data)
        return Response("application/json", json.dumps({"outputs": list(values)}).encode())


INFO: ModelInfo
