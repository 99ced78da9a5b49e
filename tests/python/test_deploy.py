"""The manifests in deploy/ validate against the Kubernetes API schemas
(kubernetes-validate) and the KServe SDK's resource models (deploy/validate.py,
run in the venv with kserve), without a cluster; a misspelt field is caught;
the probes and grace period say what the runtime does; and both autoscalers
scale the Deployment on the queue-depth gauge."""

import re
import subprocess

import pytest
import yaml

from conftest import ROOT

PYTHON = ROOT / ".cache/bench/kserve/bin/python"
MANIFESTS = sorted((ROOT / "deploy").glob("*/*.yaml"))


def validate(*paths):
    return subprocess.run([PYTHON, ROOT / "deploy/validate.py", *paths], capture_output=True, text=True)


def test_every_manifest_validates():
    result = validate(*MANIFESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    kinds = re.findall(r"\((\w+)\)", result.stdout)
    assert sorted(kinds) == ["ClusterServingRuntime", "ConfigMap", "Deployment", "HorizontalPodAutoscaler",
                            "InferenceService", "InferenceService", "ScaledObject", "Service", "ServingRuntime"], \
        result.stdout


@pytest.mark.parametrize("file, right, wrong, message", [
    ("kserve/cluster-serving-runtime.yaml", "multiModel: false", "multiModell: false", "has no field 'multiModell'"),
    ("kserve/cluster-serving-runtime.yaml", "failureThreshold: 120", "failureTreshold: 120", "failureTreshold"),
    ("kserve/inference-service.yaml", "runtime: plinth", "runtimes: plinth", "has no field 'runtimes'"),
    ("kubernetes/deployment.yaml", "periodSeconds: 10", "periodSecond: 10", "periodSecond"),
    ("modelmesh/serving-runtime.yaml", "grpcDataEndpoint:", "grpcDataEndPoint:", "has no field 'grpcDataEndPoint'"),
    ("autoscaling/hpa.yaml", "averageValue:", "averageValu:", "'averageValu' was unexpected"),
    ("autoscaling/keda-scaledobject.yaml", "pollingInterval:", "pollingInterva:", "'pollingInterva' was unexpected"),
    ("autoscaling/keda-scaledobject.yaml", "serverAddress:", "serverAdress:", "'serverAdress' was unexpected"),
    ("autoscaling/keda-scaledobject.yaml", 'threshold: "4"', "threshold: 4", "4 is not of type 'string'"),
])
def test_a_misspelt_field_is_caught(tmp_path, file, right, wrong, message):
    text = (ROOT / "deploy" / file).read_text()
    assert right in text
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace(right, wrong, 1))
    result = validate(broken)
    assert result.returncode != 0 and message in result.stdout + result.stderr, result.stdout + result.stderr


def test_probes_and_grace_period_match_the_runtime():
    deployment, _ = yaml.safe_load_all((ROOT / "deploy/kubernetes/deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    runtime = yaml.safe_load((ROOT / "deploy/kserve/cluster-serving-runtime.yaml").read_text())
    for container in [pod["containers"][0], runtime["spec"]["containers"][0]]:
        assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "a long first load is allowed"
        flag = lambda name: next(float(a.split("=")[1]) for a in container["args"] if a.startswith(f"--{name}="))
        if container is pod["containers"][0]:
            # SIGKILL comes after the grace period: draining and finishing must fit.
            assert pod["terminationGracePeriodSeconds"] > flag("drain-delay-secs") + flag("exit-timeout-secs")


def test_the_modelmesh_runtime_serves_both_endpoints_on_its_grpc_port():
    runtime = yaml.safe_load((ROOT / "deploy/modelmesh/serving-runtime.yaml").read_text())
    spec = runtime["spec"]
    args = spec["containers"][0]["args"]
    assert "--model-control-mode=modelmesh" in args
    assert not any(a.startswith("--model-repository") for a in args), "ModelMesh names every model's path"
    port = next(a.split("=")[1] for a in args if a.startswith("--grpc-port="))
    assert spec["grpcEndpoint"] == spec["grpcDataEndpoint"] == f"port:{port}"
    assert spec["multiModel"] and not spec["storageHelper"]["disabled"], "the puller hands Plinth local paths"
    assert "--grpc-address=127.0.0.1" in args, "only the pod's own containers may load and unload"
    resources = spec["containers"][0]["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"], "capacity follows the limit"
    service = yaml.safe_load((ROOT / "deploy/modelmesh/inference-service.yaml").read_text())
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "ModelMesh"
    assert service["spec"]["predictor"]["model"]["runtime"] == runtime["metadata"]["name"]
    # In KServe multiModel marks a ModelMesh runtime, which plain InferenceServices never select.
    plain = yaml.safe_load((ROOT / "deploy/kserve/cluster-serving-runtime.yaml").read_text())
    assert plain["spec"]["multiModel"] is False


def test_both_autoscalers_scale_the_deployment_on_the_queue_depth_gauge():
    deployment, _ = yaml.safe_load_all((ROOT / "deploy/kubernetes/deployment.yaml").read_text())
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    hpa, adapter = yaml.safe_load_all((ROOT / "deploy/autoscaling/hpa.yaml").read_text())
    assert hpa["spec"]["scaleTargetRef"] == target
    pods = hpa["spec"]["metrics"][0]
    assert pods["type"] == "Pods" and pods["pods"]["target"]["type"] == "AverageValue"
    # The adapter serves the gauge per pod under the name the HPA asks for.
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith("nv_inference_pending_request_count{")
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["name"]["as"] == pods["pods"]["metric"]["name"]
    assert "<<.GroupBy>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
    scaled = yaml.safe_load((ROOT / "deploy/autoscaling/keda-scaledobject.yaml").read_text())
    assert scaled["spec"]["scaleTargetRef"] == target
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert "sum by (model) (nv_inference_pending_request_count{" in trigger["metadata"]["query"]
    assert scaled["spec"]["minReplicaCount"] >= 1, "the gauge comes from the pods: at zero no queue is seen"
