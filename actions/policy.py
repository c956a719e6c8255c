"""From anomaly to actions: the rules, the retry budgets and the cooldowns.

The rules follow operators' practice (NVSentinel's monitor → quarantine → drain →
remediate; Mission Control's "transient faults are retried without quarantine"):

- only ``critical`` anomalies are acted on; a ``warning`` (a novelty score alone,
  an Xid NVIDIA says to ignore, a pipeline imbalance) or ``info`` is notified;
- persistent hardware, or any fault whose remedy needs the node out of service
  (NVIDIA's ``RESET_GPU``, ``RESTART_BM``, ``CONTACT_SUPPORT`` …) → drain the
  suspect nodes and requeue the job without them;
- a transient fault (system, or hardware that recovers: one IB completion error,
  a contained ECC error) → requeue, no quarantine;
- an application fault → hold the job (or cancel, or only notify) and never drain;
- a straggler → notify, or drain and requeue when it is persistent and the policy
  says so; an unhealthy node with no job → drain it before a job lands there.
- a confirmed hang of a job also asks the job's nodes for their ranks' Python stacks
  (``diagnose``: read-only, so it is carried out in monitor mode too; see ``trainguard
  collect-stacks``);
- a resolution or a revision (the same anomaly published again, resolved or better
  localised) decides nothing new.

:class:`Policy` is pure and runs on event time, so a replay decides exactly what
the live run decided. Whether a decision is *executed* (the mode of its scope,
the inventory check, the circuit breaker) is the executor's business.

>>> from trainguard.detectors.events import Anomaly
>>> a = Anomaly(anomaly_id="an-1", detected_at=10.0, kind="crash", category="xid_79",
...             layer="hardware", transient=False, job_id="42", nodes=["n3"])
>>> policy = Policy(PolicyConfig())
>>> [(x.action, x.target, x.params, x.status) for x in policy.decide(a)]
[('drain_node', 'n3', {}, 'recommended'), ('requeue_job', '42', {'exclude': 'n3'}, 'recommended')]
>>> b = Anomaly(anomaly_id="an-2", detected_at=20.0, kind="crash", category="xid_79",
...             layer="hardware", transient=False, job_id="42", nodes=["n3"])
>>> [(x.action, x.status) for x in policy.decide(b)]  # within the cooldown: already decided
[('drain_node', 'suppressed'), ('requeue_job', 'suppressed')]
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

import msgspec

from trainguard.actions.records import Action
from trainguard.detectors.events import Anomaly
from trainguard.detectors.ids import action_id
from trainguard.detectors.xid import NODE_REMEDIES

Mode = Literal["monitor", "enforce"]
_Fraction = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
_Count = Annotated[int, msgspec.Meta(ge=0)]
_Seconds = Annotated[float, msgspec.Meta(ge=0.0)]


class Scope(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A mode for part of the cluster: a partition, and/or jobs whose id or name match a glob."""

    mode: Mode
    partition: str | None = None
    job: str | None = None


class Rules(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    application: Literal["hold", "cancel", "notify"] = "hold"
    straggler: Literal["notify", "drain_requeue"] = "notify"
    drain_idle_unhealthy_nodes: bool = True


class RetryBudget(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max_requeues_per_job: _Count = 3
    max_requeues_per_root_cause: _Count = 3
    cooldown_s: _Seconds = 300.0


class Breaker(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    max_partition_fraction: _Fraction = 0.10
    max_drains_per_hour: _Count = 10


class PolicyConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The ``policy:`` section of the config file. Monitor mode unless a scope says otherwise."""

    mode: Mode = "monitor"
    scopes: list[Scope] = []
    rules: Rules = msgspec.field(default_factory=Rules)
    retry: RetryBudget = msgspec.field(default_factory=RetryBudget)
    breaker: Breaker = msgspec.field(default_factory=Breaker)

    def __post_init__(self) -> None:
        for i, scope in enumerate(self.scopes):
            if scope.partition is None and scope.job is None:
                raise ValueError(f"policy.scopes[{i}] names neither a partition nor a job pattern")

    @property
    def may_enforce(self) -> bool:
        """Whether any action could be enforced (the cluster's mode or any scope's is ``enforce``)."""
        return self.mode == "enforce" or any(scope.mode == "enforce" for scope in self.scopes)


_RESTARTABLE_KINDS = ("crash", "hang", "gpu_degraded")


class Policy:
    """Decides the actions for each anomaly and keeps the budgets and cooldowns (event time)."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._last: dict[tuple[str, str], float] = {}  # (action, target) -> when last decided
        self._requeues_per_job: Counter[str] = Counter()
        self._requeues_per_cause: Counter[tuple[str, str]] = Counter()

    def decide(self, anomaly: Anomaly) -> list[Action]:
        """The actions this anomaly calls for, budgets and cooldowns applied (none for a resolution
        or a revision: what was decided when it opened stands, and must not spend a budget twice)."""
        if anomaly.resolved_at is not None or anomaly.revised_at is not None:
            return []
        return [self._limit(anomaly, action) for action in self._rules(anomaly)]

    # ------------------------------------------------------------ rules

    def _rules(self, anomaly: Anomaly) -> list[Action]:
        out = self._remedies(anomaly)
        if anomaly.kind == "hang" and anomaly.severity == "critical" and anomaly.job_id is not None:
            # Where a hang sits is in its ranks' stacks: ask the nodes' agents (named: the suspects;
            # every node running the job answers, since the healthy ranks are the comparison). First,
            # so the request is out before a requeue ends the processes.
            why = f"trainguard: {anomaly.kind}/{anomaly.category} ({anomaly.anomaly_id}): dump the ranks' stacks"
            out.insert(
                0,
                Action(
                    action_id=action_id(anomaly.anomaly_id, "diagnose", anomaly.job_id),
                    anomaly_id=anomaly.anomaly_id,
                    decided_at=anomaly.detected_at,
                    action="diagnose",
                    target=anomaly.job_id,
                    params={"nodes": ",".join(anomaly.nodes)},
                    reason=why,
                ),
            )
        return out

    def _remedies(self, anomaly: Anomaly) -> list[Action]:
        rules = self.config.rules
        why = f"{anomaly.kind}/{anomaly.category} ({anomaly.anomaly_id})"
        if anomaly.remedy:
            why += f", remedy {anomaly.remedy}"
        job, nodes, kind = anomaly.job_id, anomaly.nodes, anomaly.kind

        def act(name: str, target: str, **params: str) -> Action:
            reason = f"trainguard: {why}"
            return Action(
                action_id=action_id(anomaly.anomaly_id, name, target),
                anomaly_id=anomaly.anomaly_id,
                decided_at=anomaly.detected_at,
                action=name,
                target=target,
                params=params,
                reason=reason,
            )

        if anomaly.severity != "critical":
            return [act("notify", job or ",".join(nodes) or "cluster")]
        persistent_straggler = kind == "straggler" and anomaly.transient is False and rules.straggler != "notify"
        needs_node_out = anomaly.remedy in NODE_REMEDIES or (
            anomaly.layer == "hardware" and anomaly.transient is not True
        )
        if needs_node_out and nodes and (kind != "straggler" or persistent_straggler):
            if job is None and not rules.drain_idle_unhealthy_nodes:
                return [act("notify", ",".join(nodes))]
            out = [act("drain_node", node) for node in nodes]
            if job is not None and (kind in _RESTARTABLE_KINDS or persistent_straggler):
                out.append(act("requeue_job", job, exclude=",".join(nodes)))
            return out
        if job is not None and kind in ("crash", "hang") and anomaly.layer == "application":
            if rules.application == "notify" or anomaly.transient is not False:  # first time: the user's call
                return [act("notify", job)]
            return [act(f"{rules.application}_job", job), act("notify", job)]
        if job is not None and kind in ("crash", "hang") and (anomaly.transient or kind == "hang"):
            return [act("requeue_job", job)]  # transient: retried without quarantine
        return [act("notify", job or ",".join(nodes) or "cluster")]

    # ------------------------------------------------------------ budgets and cooldowns

    def _limit(self, anomaly: Anomaly, action: Action) -> Action:
        if action.action == "notify":
            return action
        retry = self.config.retry
        key = (action.action, action.target)
        last = self._last.get(key)
        if last is not None and action.decided_at - last < retry.cooldown_s:
            return _suppressed(
                action, f"cooldown: {action.action} {action.target} decided {action.decided_at - last:.0f} s ago"
            )
        if action.action == "requeue_job":
            cause = (action.target, anomaly.category)
            if self._requeues_per_job[action.target] >= retry.max_requeues_per_job:
                return _suppressed(
                    action, f"retry budget spent: job {action.target} requeued {retry.max_requeues_per_job} times"
                )
            if self._requeues_per_cause[cause] >= retry.max_requeues_per_root_cause:
                return _suppressed(
                    action,
                    f"retry budget spent: {anomaly.category} requeued job {action.target} "
                    f"{retry.max_requeues_per_root_cause} times",
                )
            self._requeues_per_job[action.target] += 1
            self._requeues_per_cause[cause] += 1
        self._last[key] = action.decided_at
        return action


def _suppressed(action: Action, why: str) -> Action:
    return msgspec.structs.replace(action, status="suppressed", reason=f"{action.reason}; {why}")
