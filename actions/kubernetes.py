"""The Kubernetes driver, on the official ``kubernetes`` client.

- drain: cordon the node (``spec.unschedulable``) and taint it
  ``trainguard.io/quarantine=<category>:NoSchedule``, with the full reason in an annotation;
- resume: uncordon and remove that taint;
- requeue: delete the job's pods (label ``job-name``) so its controller recreates them —
  the cordon keeps them off the drained nodes;
- hold / release: ``spec.suspend`` on the batch/v1 Job; cancel: delete the Job.

Only unit-tested here (no API server runs on this machine); the calls are the
documented ``CoreV1Api``/``BatchV1Api`` ones.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from trainguard.actions.commands import Attempt, retry, since
from trainguard.actions.drivers import Inventory, JobInfo, NodeInfo

TAINT_KEY = "trainguard.io/quarantine"
REASON_ANNOTATION = "trainguard.io/reason"
PARTITION_LABEL = "trainguard.io/partition"


class KubernetesDriver:
    name = "kubernetes"

    def __init__(self, core: Any, batch: Any, namespace: str = "default", attempts: int = 3, backoff_s: float = 1.0):
        self.core = core
        self.batch = batch
        self.namespace = namespace
        self.attempts = attempts
        self.backoff_s = backoff_s

    @classmethod
    def from_config(cls, namespace: str = "default", context: str | None = None) -> KubernetesDriver:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config(context=context)
        return cls(client.CoreV1Api(), client.BatchV1Api(), namespace)

    def _call(self, what: str, fn: Callable[[], Any]) -> tuple[Any, tuple[Attempt, ...]]:
        def once() -> tuple[Attempt, Any]:
            started = time.monotonic()
            try:
                result = fn()
            except Exception as exc:  # ApiException, urllib3 errors: recorded, retried
                return Attempt((what,), False, getattr(exc, "status", None), str(exc)[:300], since(started)), None
            return Attempt((what,), True, 0, "", since(started)), result

        return retry(what, self.attempts, self.backoff_s, once)

    # ------------------------------------------------------------ reading

    def inventory(self) -> Inventory:
        node_list, _ = self._call("list_node", self.core.list_node)
        nodes: dict[str, NodeInfo] = {}
        for n in node_list.items:
            ready = any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            taints = [t.key for t in (n.spec.taints or [])]
            labels = n.metadata.labels or {}
            nodes[n.metadata.name] = NodeInfo(
                name=n.metadata.name,
                state="ready" if ready else "down",
                partitions=(labels.get(PARTITION_LABEL, "default"),),
                drained=bool(n.spec.unschedulable) or TAINT_KEY in taints,
                reason=(n.metadata.annotations or {}).get(REASON_ANNOTATION, ""),
            )
        job_list, _ = self._call("list_namespaced_job", lambda: self.batch.list_namespaced_job(self.namespace))
        pod_list, _ = self._call("list_namespaced_pod", lambda: self.core.list_namespaced_pod(self.namespace))
        pods_by_job: dict[str, set[str]] = {}
        for pod in pod_list.items:
            job = (pod.metadata.labels or {}).get("job-name")
            if job and pod.spec.node_name:
                pods_by_job.setdefault(job, set()).add(pod.spec.node_name)
        jobs: dict[str, JobInfo] = {}
        for j in job_list.items:
            name = j.metadata.name
            suspended = bool(j.spec.suspend)
            state = "SUSPENDED" if suspended else "RUNNING" if j.status.active else "PENDING"
            if j.status.succeeded and not j.status.active:
                state = "COMPLETED"
            # The Job controller's verdict, when it has given one: Complete or Failed (backoff limit).
            for condition in getattr(j.status, "conditions", None) or ():
                if condition.status == "True" and condition.type in ("Complete", "Failed"):
                    state = "COMPLETED" if condition.type == "Complete" else "FAILED"
            jobs[name] = JobInfo(
                job_id=name,
                name=name,
                state=state,
                partition=(j.metadata.labels or {}).get(PARTITION_LABEL, "default"),
                nodes=tuple(sorted(pods_by_job.get(name, ()))),
                restarts=int(j.status.failed or 0),
                held=suspended,
            )
        return Inventory(nodes=nodes, jobs=jobs)

    # ------------------------------------------------------------ acting

    def drain_node(self, node: str, reason: str) -> tuple[Attempt, ...]:
        current, tried = self._call("read_node", lambda: self.core.read_node(node))
        taints = [_taint_dict(t) for t in (current.spec.taints or []) if t.key != TAINT_KEY]
        taints.append({"key": TAINT_KEY, "value": _label_value(reason), "effect": "NoSchedule"})
        body = {
            "spec": {"unschedulable": True, "taints": taints},
            "metadata": {"annotations": {REASON_ANNOTATION: reason}},
        }
        _, more = self._call("patch_node", lambda: self.core.patch_node(node, body))
        return tried + more

    def resume_node(self, node: str) -> tuple[Attempt, ...]:
        current, tried = self._call("read_node", lambda: self.core.read_node(node))
        taints = [_taint_dict(t) for t in (current.spec.taints or []) if t.key != TAINT_KEY]
        body = {
            "spec": {"unschedulable": False, "taints": taints},
            "metadata": {"annotations": {REASON_ANNOTATION: None}},
        }
        _, more = self._call("patch_node", lambda: self.core.patch_node(node, body))
        return tried + more

    def requeue_job(self, job_id: str, exclude: list[str]) -> tuple[Attempt, ...]:
        # The excluded nodes are cordoned by the drain that comes first; the controller recreates the pods.
        _, tried = self._call(
            "delete_collection_namespaced_pod",
            lambda: self.core.delete_collection_namespaced_pod(self.namespace, label_selector=f"job-name={job_id}"),
        )
        return tried

    def hold_job(self, job_id: str) -> tuple[Attempt, ...]:
        return self._suspend(job_id, True)

    def release_job(self, job_id: str) -> tuple[Attempt, ...]:
        return self._suspend(job_id, False)

    def cancel_job(self, job_id: str) -> tuple[Attempt, ...]:
        _, tried = self._call(
            "delete_namespaced_job",
            lambda: self.batch.delete_namespaced_job(job_id, self.namespace, propagation_policy="Foreground"),
        )
        return tried

    def diagnose(self, job_id: str, nodes: list[str]) -> tuple[Attempt, ...]:
        # The request is the applied action on the actions topic (collect-stacks answers it): no API call.
        return ()

    def _suspend(self, job_id: str, suspend: bool) -> tuple[Attempt, ...]:
        body = {"spec": {"suspend": suspend}}
        _, tried = self._call(
            "patch_namespaced_job", lambda: self.batch.patch_namespaced_job(job_id, self.namespace, body)
        )
        return tried


def _taint_dict(taint: Any) -> dict[str, Any]:
    return {"key": taint.key, "value": taint.value, "effect": taint.effect}


def _label_value(text: str) -> str:
    """A Kubernetes label value (≤ 63 of [A-Za-z0-9._-], alphanumeric at both ends) from free text."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:63]
    return value.strip("._-") or "trainguard"
