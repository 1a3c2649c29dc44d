"""The README's Kubernetes recipe (docs/kubernetes/grade_on_kubernetes.py), as far as it runs without a cluster (#43).

Its DaskCluster resource is validated against the schema dask-kubernetes ships for its operator's CRD (the Helm
chart's, with every Kubernetes type resolved): each value of its type, and every field a known one, since the API
server drops unknown fields of a structural schema without a word. It found one: that schema's PodSpec has no
``hostUsers``, so the pods would stay in the host's user namespace, where bubblewrap may not make its own (the
workers then refuse, saying why; README). The operator, the pods and the grading are not run.
"""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "docs" / "kubernetes" / "grade_on_kubernetes.py"
kubernetes = pytest.importorskip("dask_kubernetes", reason="dask-kubernetes is not installed: pip install "
                                 "\"labkit[kubernetes]\" (make setup does)")


def _recipe():
    spec = importlib.util.spec_from_file_location("grade_on_kubernetes", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _schema() -> dict:
    import yaml

    crd = Path(kubernetes.__file__).parent / "operator/deployment/helm/dask-kubernetes-operator/crds/daskcluster.yaml"
    return yaml.safe_load(crd.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


ROOT_FIELDS = {"apiVersion", "kind", "metadata"}  # every resource's, checked by the API server itself
# Found by this test (dask-kubernetes 2026.3.0): its DaskCluster schema resolves an older Kubernetes PodSpec that has
# no hostUsers (Kubernetes 1.25 on), so the API server drops the recipe's hostUsers: false (README, "Kubernetes").
PRUNED = [".spec.worker.spec.hostUsers"]


def _unknown_fields(value, schema: dict, path: str = "") -> list[str]:
    """Paths in ``value`` that ``schema`` does not name (what the API server would prune)."""
    if path == "" and isinstance(value, dict):
        value = {key: item for key, item in value.items() if key not in ROOT_FIELDS}
    if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(value, (dict, list)):
        return []
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in _unknown_fields(item, schema.get("items", {}),
                                                                                      f"{path}[{i}]")]
    properties = schema.get("properties")
    if properties is None:  # a map (additionalProperties) or an untyped object
        extra = schema.get("additionalProperties")
        return [found for key, item in value.items()
                for found in _unknown_fields(item, extra if isinstance(extra, dict) else {}, f"{path}.{key}")]
    return [found for key, item in value.items()
            for found in ([f"{path}.{key}"] if key not in properties
                          else _unknown_fields(item, properties[key], f"{path}.{key}"))]


def _without_nulls(value):
    """The resource as the API server stores it: a null field is an absent one (make_cluster_spec writes
    ``"resources": None`` and the like for what it was not given)."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def test_the_recipes_cluster_spec_is_a_valid_daskcluster_whose_every_field_but_host_users_is_known():
    import jsonschema

    spec = _without_nulls(_recipe().labkit_cluster_spec("registry.example/labkit-grader:0.1.0", 16))
    schema = _schema()
    jsonschema.Draft4Validator(schema).validate(spec)  # types, enums, required fields
    assert _unknown_fields(spec, schema) == PRUNED
    pod = spec["spec"]["worker"]["spec"]
    worker = pod["containers"][0]
    assert pod["hostUsers"] is False and worker["securityContext"] == {"procMount": "Unmasked"}
    assert worker["args"][:6] == ["dask", "worker", "--nthreads", "1", "--memory-limit", "0"]
    assert spec["spec"]["worker"]["replicas"] == 16 and worker["resources"]["limits"] == {"cpu": "1"}
    scheduler_env = {item["name"]: item["value"] for item in spec["spec"]["scheduler"]["spec"]["containers"][0]["env"]}
    assert scheduler_env["DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION"] == "1.0"
    assert worker["volumeMounts"][0]["mountPath"] + "/secret" == _recipe().SECRET_MOUNT


def test_a_misspelt_field_is_found_and_a_wrong_type_refused():
    import jsonschema

    spec = _without_nulls(_recipe().labkit_cluster_spec("registry.example/labkit-grader:0.1.0", 2))
    spec["spec"]["worker"]["spec"]["hostUser"] = False
    assert _unknown_fields(spec, _schema()) == [*PRUNED, ".spec.worker.spec.hostUser"]
    spec["spec"]["worker"]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="'two' is not of type 'integer'"):
        jsonschema.Draft4Validator(_schema()).validate(spec)
