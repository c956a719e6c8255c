"""The Kubernetes manifests load into the official client's models (unknown fields refused), and the
engine's RBAC grants exactly what the Kubernetes driver calls."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT
from tests.unit.actions.test_actions import FakeBatch, FakeCore
from trainguard.actions.kubernetes import KubernetesDriver

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is in the dev extras")
models = kubernetes.client.models

MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))


class UnknownField(ValueError):
    pass


def load(value: Any, type_name: str, where: str) -> Any:
    """``value`` as the client's ``type_name`` (``V1StatefulSet``, ``List[V1Container]``, ``Dict[str, str]`` …)."""
    if type_name.startswith(("List[", "list[")):
        assert isinstance(value, list), f"{where}: a list expected"
        return [load(v, type_name[5:-1], f"{where}[{i}]") for i, v in enumerate(value)]
    if type_name.startswith(("Dict[", "dict(")):
        assert isinstance(value, dict), f"{where}: a mapping expected"
        inner = type_name[5:-1].split(", ", 1)[1]
        return {k: load(v, inner, f"{where}.{k}") for k, v in value.items()}
    if type_name in ("str", "int", "bool", "float", "object", "datetime"):
        expected = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object, "datetime": str}
        assert isinstance(value, expected[type_name]), f"{where}: {type_name} expected, got {value!r}"
        return value
    cls = getattr(models, type_name)
    by_key = {key: attr for attr, key in cls.attribute_map.items()}
    assert isinstance(value, dict), f"{where}: a {type_name} mapping expected"
    fields = {}
    for key, item in value.items():
        if key not in by_key:
            raise UnknownField(f"{where}: {type_name} has no field {key!r}")
        fields[by_key[key]] = load(item, cls.openapi_types[by_key[key]], f"{where}.{key}")
    return cls(**fields)  # the model checks its required fields


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_every_manifest_loads_into_the_clients_models():
    kinds = []
    for name, doc in documents():
        version = doc["apiVersion"].split("/")[-1]
        model = f"{version.capitalize()}{doc['kind']}"
        load(doc, model, f"{name}:{doc['kind']}/{doc['metadata']['name']}")
        kinds.append(doc["kind"])
    expected = {"StatefulSet", "DaemonSet", "Deployment", "ClusterRole", "Role", "ServiceAccount", "ConfigMap"}
    assert expected <= set(kinds)


def test_an_unknown_field_is_refused():
    statefulset = next(doc for _, doc in documents() if doc["kind"] == "StatefulSet")
    statefulset["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(UnknownField, match="imagePullPolicyy"):
        load(statefulset, "V1StatefulSet", "engine")


class Recorder:
    """Records which client methods the driver calls."""

    def __init__(self, inner: object, group: str, calls: list[tuple[str, str]]) -> None:
        self._inner, self._group, self._calls = inner, group, calls

    def __getattr__(self, name: str) -> Any:
        self._calls.append((self._group, name))
        return getattr(self._inner, name, lambda *a, **k: NS(items=[]))


_VERBS = {"list": "list", "read": "get", "patch": "patch", "delete_collection": "deletecollection", "delete": "delete"}
_VERBS |= {"create": "create", "replace": "update"}


def permission(group: str, method: str) -> tuple[str, str, str, bool]:
    """``(apiGroup, resource, verb, namespaced)`` of a client method, by the client's naming."""
    match = re.fullmatch(r"(delete_collection|list|read|patch|delete|create|replace)_(namespaced_)?(\w+)", method)
    assert match, f"unexpected client method {method}"
    return group, match[3] + "s", _VERBS[match[1]], bool(match[2])


def _calls(use: Callable[[KubernetesDriver], object]) -> set[tuple[str, str, str, bool]]:
    """The permissions the client calls that ``use`` makes through a driver need."""
    calls: list[tuple[str, str]] = []
    driver = KubernetesDriver(Recorder(FakeCore(), "", calls), Recorder(FakeBatch(), "batch", calls), "training")
    use(driver)
    return {permission(group, method) for group, method in calls}


def _every_action(driver: KubernetesDriver) -> None:
    driver.inventory()
    driver.drain_node("gpu-node-01", "trainguard: crash/xid_79 (an-1)")
    driver.resume_node("gpu-node-01")
    driver.requeue_job("train-1", ["gpu-node-01"])
    driver.hold_job("train-1")
    driver.release_job("train-1")
    driver.cancel_job("train-1")
    driver.diagnose("train-1", ["gpu-node-01"])


def _granted(account: str, docs: list[dict[str, Any]], namespace: str) -> set[tuple[str, str, str, bool]]:
    """What the roles bound to ``account`` grant: ``(apiGroup, resource, verb, namespaced)``."""
    bound = {
        (d["roleRef"]["kind"], d["roleRef"]["name"], d["metadata"].get("namespace"))
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(s["name"] == account for s in d["subjects"])
    }
    granted = set()
    for d in docs:
        key = (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
        if d["kind"] not in ("Role", "ClusterRole") or key not in bound:
            continue
        assert d["kind"] == "ClusterRole" or d["metadata"]["namespace"] == namespace  # the jobs' namespace
        for rule in d["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb, d["kind"] == "Role"))
    return granted


def test_each_service_account_is_granted_exactly_what_its_code_calls():
    from trainguard.agents.kubernetes_watcher import KubernetesWatcher

    docs = [doc for _, doc in documents()]
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["trainguard.yaml"])
    namespace = config["scheduler"]["namespace"]
    assert _granted("trainguard-engine", docs, namespace) == _calls(_every_action)
    assert _granted("trainguard-watcher", docs, namespace) == _calls(lambda d: KubernetesWatcher(d).poll())
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ("Role", "ClusterRole")}
    bindings = {(d["roleRef"]["kind"], d["roleRef"]["name"]) for d in docs if d["kind"].endswith("Binding")}
    assert roles == bindings  # no role left unbound, no binding to a missing role

    workloads = ("StatefulSet", "DaemonSet", "Deployment")
    accounts = {d["kind"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] in workloads}
    assert accounts["StatefulSet"]["serviceAccountName"] == "trainguard-engine"
    assert accounts["Deployment"]["serviceAccountName"] == "trainguard-watcher"
    assert accounts["DaemonSet"]["automountServiceAccountToken"] is False  # the node agents get no API access


def test_the_containers_run_commands_and_options_that_exist():
    from typer.testing import CliRunner

    from trainguard.cli.app import app

    for _, doc in documents():
        if doc["kind"] not in ("StatefulSet", "DaemonSet", "Deployment"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            command, *options = container["args"]
            shown = CliRunner().invoke(app, [command, "--help"], terminal_width=200).output
            for option in options:
                assert option.split("=")[0] in shown, f"{container['name']}: trainguard {command} has no {option}"


def test_the_manifests_are_where_the_docs_say(tmp_path: Path):
    page = (ROOT / "docs" / "deploy-kubernetes.md").read_text()
    for path in MANIFESTS:
        assert f"deploy/kubernetes/{path.name}" in page
