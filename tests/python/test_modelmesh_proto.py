"""Plinth's runtime/proto/model_runtime.proto against ModelMesh's published
model-runtime.proto, vendored unchanged in tests/fixtures/modelmesh/: both
compiled by grpcio-tools' protoc into descriptors, which must agree on the
package, every service and method (with their request and response types
and streaming), every message and enum, nested ones included, and every
field's name, number, type, label and message type. File options (Java's
package) and comments are not compared: they do not reach the wire."""

import subprocess
import sys

from google.protobuf import descriptor_pb2

from conftest import HANG_GUARD_S, ROOT

OURS = ROOT / "runtime/proto/model_runtime.proto"
PUBLISHED = ROOT / "tests/fixtures/modelmesh/model-runtime.proto"


def compiled(proto, out):
    """The FileDescriptorProto protoc makes of `proto`."""
    descriptors = out / f"{proto.stem}.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
                    f"--descriptor_set_out={descriptors}", proto.name],
                   check=True, capture_output=True, timeout=HANG_GUARD_S)
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptors.read_bytes()).file
    assert len(files) == 1, [f.name for f in files]
    return files[0]


def enum_shape(enum):
    return {value.name: value.number for value in enum.value}


def message_shape(message):
    """What of `message` reaches the wire or the generated code's names."""
    field = descriptor_pb2.FieldDescriptorProto
    return {
        "fields": {f.name: (f.number, field.Type.Name(f.type), field.Label.Name(f.label), f.type_name)
                   for f in message.field},
        "oneofs": [o.name for o in message.oneof_decl],
        "map_entry": message.options.map_entry,
        "messages": {m.name: message_shape(m) for m in message.nested_type},
        "enums": {e.name: enum_shape(e) for e in message.enum_type},
    }


def shape(file):
    return {
        "syntax": file.syntax,
        "package": file.package,
        "imports": list(file.dependency),
        "services": {s.name: {m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                              for m in s.method} for s in file.service},
        "messages": {m.name: message_shape(m) for m in file.message_type},
        "enums": {e.name: enum_shape(e) for e in file.enum_type},
    }


def differences(ours, theirs, path=""):
    """The places where two shapes differ, one line each."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        lines = []
        for key in sorted(set(ours) | set(theirs)):
            where = f"{path}.{key}" if path else key
            if key not in theirs:
                lines.append(f"{where}: only in Plinth's proto")
            elif key not in ours:
                lines.append(f"{where}: only in ModelMesh's proto")
            else:
                lines += differences(ours[key], theirs[key], where)
        return lines
    return [] if ours == theirs else [f"{path}: Plinth {ours!r}, ModelMesh {theirs!r}"]


def test_plinth_s_model_runtime_proto_is_modelmesh_s(tmp_path):
    ours, theirs = shape(compiled(OURS, tmp_path)), shape(compiled(PUBLISHED, tmp_path))
    assert differences(ours, theirs) == []
    # The comparison has something to compare: the five methods and the
    # fields ModelMesh reads.
    assert set(theirs["services"]["ModelRuntime"]) == {
        "loadModel", "unloadModel", "predictModelSize", "modelSize", "runtimeStatus"}
    assert theirs["messages"]["RuntimeStatusResponse"]["fields"]["allowAnyMethod"][0] == 10
    assert theirs["messages"]["RuntimeStatusResponse"]["messages"]["MethodInfosEntry"]["map_entry"]


def test_the_comparison_sees_a_changed_number_or_name(tmp_path):
    """A field renumbered, a field renamed and a method renamed in a copy of
    Plinth's proto are each reported."""
    text = OURS.read_text()
    changed = (text.replace("uint32 maxConcurrency = 2;", "uint32 maxConcurrency = 3;")
               .replace("string modelKey = 4;\n}\n\nmessage LoadModelResponse", "string modelKeys = 4;\n}\n\n"
                        "message LoadModelResponse")
               .replace("rpc modelSize (", "rpc modelSizes ("))
    assert changed.count("maxConcurrency = 3") == 1 and "modelKeys" in changed and "modelSizes" in changed
    copy = tmp_path / "copy" / "model_runtime.proto"
    copy.parent.mkdir()
    copy.write_text(changed)
    found = differences(shape(compiled(copy, tmp_path)), shape(compiled(PUBLISHED, tmp_path)))
    assert found == [
        "messages.LoadModelRequest.fields.modelKey: only in ModelMesh's proto",
        "messages.LoadModelRequest.fields.modelKeys: only in Plinth's proto",
        "messages.LoadModelResponse.fields.maxConcurrency: Plinth (3, 'TYPE_UINT32', 'LABEL_OPTIONAL', ''), "
        "ModelMesh (2, 'TYPE_UINT32', 'LABEL_OPTIONAL', '')",
        "services.ModelRuntime.modelSize: only in ModelMesh's proto",
        "services.ModelRuntime.modelSizes: only in Plinth's proto",
    ], found
