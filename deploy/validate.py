"""Validates the manifests in deploy/ without a cluster.

Kubernetes objects (and every container spec inside the KServe resources,
as a Pod) go through kubernetes-validate's bundled API schemas, strictly
(unknown fields are errors). KServe resources are checked against the KServe
Python SDK's models: every field must exist in the model (by its JSON name),
recursively into the Kubernetes types they embed, and the SDK must build the
object (required fields present, types right). KEDA's ScaledObject, whose
CRD neither knows, is checked against a small JSON schema of the fields
deploy/autoscaling/ uses, as strictly (unknown fields are errors), and its
metadata as a Kubernetes object's.

Runs in the venv that holds kserve==0.21.0, kubernetes-validate and jsonschema
(.cache/bench/kserve, made by `make setup`).

usage: validate.py MANIFEST.yaml...   (exit status 1 on the first problem)
"""

import re
import sys

import jsonschema
import kserve.models
import kubernetes.client.models
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.32"
SCALARS = {"str", "int", "bool", "float", "object", "datetime", "date"}
KSERVE_KINDS = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
}

# KEDA's ScaledObject (keda.sh/v1alpha1), the fields of its specification
# that deploy/autoscaling/ uses; the only trigger known is `prometheus`,
# whose metadata, like every trigger's, maps names to strings.
STRING = {"type": "string", "minLength": 1}
COUNT = {"type": "integer", "minimum": 0}
SCALED_OBJECT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object"},  # checked as a Kubernetes object's metadata
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {"apiVersion": STRING, "kind": STRING, "name": STRING},
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": COUNT,
                "minReplicaCount": COUNT,
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"enum": ["prometheus"]},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["serverAddress", "query", "threshold"],
                                "properties": {
                                    "serverAddress": {"type": "string", "pattern": "^https?://"},
                                    "query": STRING,
                                    "threshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def validate_scaled_object(document):
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(SCALED_OBJECT).iter_errors(document))
    if error is not None:
        raise ValueError(f"{'.'.join(str(p) for p in error.absolute_path) or 'document'}: {error.message}")
    spec = document["spec"]
    if spec.get("minReplicaCount", 0) > spec.get("maxReplicaCount", 100):  # KEDA's defaults
        raise ValueError("spec: minReplicaCount is above maxReplicaCount")
    holder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": document["metadata"]}
    kubernetes_validate.validate(holder, KUBERNETES_VERSION, strict=True)


def model_class(name):
    return getattr(kserve.models, name, None) or getattr(kubernetes.client.models, name)


def check_fields(value, type_name, path):
    """Every key of `value` is a field of `type_name`, recursively."""
    if value is None:
        return
    listed = re.fullmatch(r"[lL]ist\[(.+)\]", type_name)
    if listed:
        for i, item in enumerate(value):
            check_fields(item, listed.group(1), f"{path}[{i}]")
        return
    mapped = re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", type_name)
    if mapped:
        for key, item in value.items():
            check_fields(item, mapped.group(1) or mapped.group(2), f"{path}.{key}")
        return
    if type_name in SCALARS:
        return
    cls = model_class(type_name)
    by_json = {json_name: attribute for attribute, json_name in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            raise ValueError(f"{path}: {type_name} has no field '{key}'")
        check_fields(item, cls.openapi_types[by_json[key]], f"{path}.{key}")


def build(value, type_name):
    """Constructs the SDK object, which checks required fields and enums."""
    if value is None or type_name in SCALARS:
        return value
    listed = re.fullmatch(r"[lL]ist\[(.+)\]", type_name)
    if listed:
        return [build(item, listed.group(1)) for item in value]
    mapped = re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", type_name)
    if mapped:
        return {key: build(item, mapped.group(1) or mapped.group(2)) for key, item in value.items()}
    cls = model_class(type_name)
    by_json = {json_name: attribute for attribute, json_name in cls.attribute_map.items()}
    return cls(**{by_json[k]: build(v, cls.openapi_types[by_json[k]]) for k, v in value.items()})


def containers(value):
    """Every `containers` list inside a KServe resource."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "containers":
                yield item
            else:
                yield from containers(item)
    elif isinstance(value, list):
        for item in value:
            yield from containers(item)


def validate(document, where):
    kind = (document.get("apiVersion"), document.get("kind"))
    if kind == ("keda.sh/v1alpha1", "ScaledObject"):
        validate_scaled_object(document)
    elif kind in KSERVE_KINDS:
        check_fields(document, KSERVE_KINDS[kind], where)
        build(document, KSERVE_KINDS[kind])
        for listed in containers(document.get("spec", {})):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"}, "spec": {"containers": listed}}
            kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    else:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def main(paths):
    for path in paths:
        with open(path) as f:
            for i, document in enumerate(yaml.safe_load_all(f)):
                where = f"{path} document {i + 1} ({document.get('kind')})"
                try:
                    validate(document, where)
                except Exception as e:  # the validators raise several types
                    sys.exit(f"{where}: {e}")
                print(f"ok: {where}")


if __name__ == "__main__":
    main(sys.argv[1:])
