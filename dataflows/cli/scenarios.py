"""Scenario commands: ``trainguard generate``, ``trainguard score`` and ``trainguard tune``."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from statistics import median
from typing import Annotated, Any

import msgspec
import typer
import yaml
from rich.table import Table

from trainguard.cli.common import (
    DEMO_DIR,
    BrokersOpt,
    ConfigOpt,
    brokers_list,
    console,
    fail,
    settings_from,
)
from trainguard.dataflows.config import ConfigError, Settings
from trainguard.datasets.generator import PRESETS

ProcessesOpt = Annotated[
    int | None,
    typer.Option(min=1, help="Scenarios generated or replayed at once, a worker process each (default: one per core)."),
]


def _processes(processes: int | None) -> int:
    """The worker processes asked for, else one per core this process may run on."""
    if processes:
        return processes
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def generate(
    out: Annotated[Path, typer.Option("--out", "-o", help="Replay directory to write (labels.jsonl included).")],
    preset: Annotated[str, typer.Option(help=f"Scenario preset: {', '.join(PRESETS)}.")] = "default",
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same scenario.")] = 0,
    nodes: Annotated[
        int | None, typer.Option(min=4, help="Cluster size in nodes (8 GPUs each; the mix: two per job).")
    ] = None,
    minutes: Annotated[float | None, typer.Option(min=1, help="Event-time length of the scenario.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    brokers: BrokersOpt = "",
    config: ConfigOpt = None,
) -> None:
    """Write a labelled cluster scenario as a replay directory (or publish it to Kafka with --brokers)."""
    from trainguard.datasets import generator

    if preset not in PRESETS:
        raise fail(f"unknown preset {preset!r}; the presets are: {', '.join(PRESETS)}.")
    if fmt not in ("jsonl", "parquet"):
        raise fail(f"--format must be jsonl or parquet, not {fmt!r}.")
    started = time.perf_counter()
    if brokers:
        from trainguard.dataflows.kafka_io import create_topics, produce_records
        from trainguard.detectors.events import parse_ts

        settings = settings_from(config)
        settings.kafka.brokers = brokers_list(brokers)
        try:
            sim = generator.build(preset, seed, nodes, minutes)
        except ValueError as exc:  # options the preset refuses (the demo is fixed)
            raise fail(str(exc)) from None
        create_topics(settings.kafka)
        enc = msgspec.json.Encoder()
        records = ((parse_ts(r["ts"]), topic, enc.encode(r)) for topic, r in generator.stream(sim))
        counts = produce_records(records, settings.kafka)
        generator.write_labels(sim, out)
        where = f"topics on {brokers} (labels in {out})"
    else:
        try:
            counts = generator.write_scenario(preset, seed, out, nodes, minutes, fmt)
        except ValueError as exc:
            raise fail(str(exc)) from None
        where = str(out)
    elapsed = time.perf_counter() - started
    total = sum(counts.values())
    console.print(
        f"wrote scenario {preset} (seed {seed}): {total:,} records "
        f"({', '.join(f'{n:,} {t}' for t, n in counts.items())}) to {where} in {elapsed:.1f}s"
    )


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_report(report: dict[str, Any]) -> None:
    table = Table(title=f"{report['faults']} labelled faults, {report['anomalies']} anomalies")
    for col in (
        "kind",
        "faults",
        "found",
        "anomalies",
        "precision",
        "recall",
        "F1",
        "latency p50/p90/p99 s",
        "localised",
        "layer",
    ):
        table.add_column(col, justify="right" if col != "kind" else "left")
    for kind, k in report["by_kind"].items():
        latency = "/".join(_fmt(k[f"latency_p{q}_s"], 1) for q in (50, 90, 99))
        table.add_row(
            kind,
            str(k["labelled"]),
            str(k["detected"]),
            str(k["anomalies"]),
            _fmt(k["precision"]),
            _fmt(k["recall"]),
            _fmt(k["f1"]),
            latency,
            _fmt(k["localisation"]),
            _fmt(k["layer_accuracy"]),
        )
    console.print(table)
    for fp in report["false_positives"]:
        console.print(f"  [yellow]false positive[/] {fp['kind']}/{fp['category']} job={fp['job_id']} {fp['nodes']}")
    for miss in report["missed"]:
        console.print(f"  [red]missed[/] {miss['fault_id']} ({miss['kind']}/{miss['category']})")
    benign = report.get("benign_alarms", [])
    console.print(
        f"alarms on benign pauses: {len(benign)}; hang alarms resolved by the job's own progress "
        f"(false alarms): {report.get('false_alarms_resolved', 0)}",
        soft_wrap=True,
    )
    for alarm in benign:
        console.print(f"  [yellow]benign alarm[/] {alarm['kind']} on {alarm['benign']} ({alarm['anomaly_id']})")
    actions = report.get("actions")
    if actions:
        console.print(
            f"drains: {actions['drains']} recommended, {actions['correct_drains']} correct, "
            f"{len(actions['wrongful'])} wrongful, {len(actions['missing_drains'])} faults that need the node "
            "out without a drain"
        )
        for wrong in actions["wrongful"]:
            console.print(f"  [red]wrongful drain[/] {wrong['target']}: {wrong['why']}")


def score(
    labels: Annotated[Path, typer.Option(help="labels.jsonl of the scenario.")],
    anomalies: Annotated[Path, typer.Option(help="The archive (a replay's --out) or its anomalies/ directory.")],
    actions: Annotated[Path | None, typer.Option(help="The archive's actions/ directory.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Score anomalies (and actions) against a scenario's labelled faults."""
    from trainguard.datasets.scoring import load_archive, load_labels
    from trainguard.datasets.scoring import score as score_report

    if not labels.is_file():
        raise fail(f"labels file {labels} does not exist; pass the labels.jsonl that generate wrote.")
    if (anomalies / "anomalies").is_dir():  # the archive root: its anomalies/ (and actions/) inside
        if actions is None and (anomalies / "actions").is_dir():
            actions = anomalies / "actions"
        anomalies = anomalies / "anomalies"
    if not anomalies.is_dir():
        raise fail(f"anomalies directory {anomalies} does not exist; pass OUT/anomalies from a replay.")
    if actions is not None and not actions.is_dir():
        raise fail(f"actions directory {actions} does not exist; pass OUT/actions from a replay.")
    try:
        labelled = load_labels(labels)
    except ValueError as exc:
        raise fail(str(exc)) from None
    report = score_report(labelled, load_archive(anomalies), load_archive(actions) if actions is not None else None)
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        print_report(report)


def apply_overrides(settings: Settings, overrides: dict[str, Any]) -> Settings:
    """Settings with dotted-path overrides (``detectors.hang.floor_s``) applied and validated."""
    data = msgspec.to_builtins(settings)
    for path, value in overrides.items():
        node = data
        parts = path.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"--param {path}: {part!r} is not a settings section.")
            node = node[part]
        if parts[-1] not in node:
            raise ConfigError(f"--param {path}: there is no setting {parts[-1]!r} there.")
        node[parts[-1]] = value
    try:
        return msgspec.convert(data, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"--param: {exc}.") from None


def _nested(overrides: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in overrides.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def tune(
    param: Annotated[list[str], typer.Option(help="PATH=V1,V2,… e.g. detectors.hang.floor_s=45,55,90 (repeatable).")],
    preset: Annotated[str, typer.Option(help="Scenario preset to tune on.")] = "default",
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds to tune on.")] = "1,2",
    out: Annotated[Path, typer.Option("--out", "-o", help="YAML file for the chosen values.")] = Path("tuned.yaml"),
    work: Annotated[Path, typer.Option(help="Where generated scenarios are kept between runs.")] = Path(
        "trainguard-out/tune"
    ),
    minutes: Annotated[float | None, typer.Option(min=10, help="Scenario length (default: the preset's).")] = None,
    processes: ProcessesOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Sweep detector settings by replaying labelled scenarios; print the precision/recall/latency frontier."""
    from trainguard.dataflows.processes import map_in_processes

    base = settings_from(config)
    grid: dict[str, list[Any]] = {}
    for item in param:
        path, sep, values = item.partition("=")
        if not sep or not values:
            raise fail(f"--param {item!r} must look like PATH=V1,V2 (e.g. detectors.hang.floor_s=45,55).")
        grid[path] = [yaml.safe_load(v) for v in values.split(",")]
    combos = [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]
    if len(combos) > 48:
        raise fail(f"{len(combos)} combinations are too many for one sweep; keep it to 48 or fewer.")
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        candidates = [apply_overrides(base, combo) for combo in combos]
    except (ValueError, ConfigError) as exc:
        raise fail(str(exc)) from None
    workers = _processes(processes)
    scenarios = prepare_scenarios(preset, seed_list, work, minutes, workers)
    # Every setting on every scenario, as one list of replays: the worker processes share them all.
    runs = [(d, settings) for settings in candidates for d, _ in scenarios]
    replays = map_in_processes(found_in_replay, runs, workers)
    rows = []
    for i, combo in enumerate(combos):
        report = scored(scenarios, replays[i * len(scenarios) : (i + 1) * len(scenarios)])
        kinds = report["by_kind"].values()
        labelled = sum(k["labelled"] for k in kinds)
        found = sum(k["detected"] for k in kinds)
        anomalies = report["anomalies"]
        precision = (anomalies - len(report["false_positives"])) / anomalies if anomalies else 0.0
        recall = found / labelled if labelled else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        latencies = [k["latency_p50_s"] for k in kinds if k["latency_p50_s"] is not None]
        rows.append((combo, precision, recall, f1, median(latencies) if latencies else float("inf")))
    frontier = [
        r
        for r in rows
        if not any(
            o[1] >= r[1] and o[2] >= r[2] and o[4] <= r[4] and (o[1], o[2], o[4]) != (r[1], r[2], r[4]) for o in rows
        )
    ]
    table = Table(title=f"{preset} seeds {seeds}: {len(rows)} settings")
    for col in (*grid, "precision", "recall", "F1", "median latency s", "frontier"):
        table.add_column(col, justify="right")
    for combo, p, r, f, lat in rows:
        table.add_row(
            *(str(combo[k]) for k in grid),
            f"{p:.3f}",
            f"{r:.3f}",
            f"{f:.3f}",
            f"{lat:.1f}",
            "*" if (combo, p, r, f, lat) in frontier else "",
        )
    console.print(table)
    best = max(rows, key=lambda row: (row[3], -row[4]))
    out.write_text(yaml.safe_dump(_nested(best[0]), sort_keys=True))
    console.print(
        f"chose {best[0]} (F1 {best[3]:.3f}, median latency {best[4]:.1f}s); wrote {out} (use it with --config {out})"
    )


def prepare_scenarios(
    preset: str, seeds: list[int], work: Path, minutes: float | None = None, processes: int = 1
) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Generate (once, ``processes`` at a time; kept in ``work``) and load the labelled scenarios of
    ``preset`` for ``seeds``."""
    from trainguard.dataflows.processes import map_in_processes
    from trainguard.datasets import generator
    from trainguard.datasets.scoring import load_labels

    if preset == "demo":  # one fixed, bundled scenario: the seeds do not apply
        return [(DEMO_DIR, load_labels(DEMO_DIR / "labels.jsonl"))]
    if preset not in PRESETS:
        raise fail(f"unknown preset {preset!r}; the presets are: {', '.join(PRESETS)}.")
    named = [(s, work / f"{preset}-{s}" if minutes is None else work / f"{preset}-{s}-{minutes:g}min") for s in seeds]
    # Each missing scenario once (a seed named twice must not be written by two workers at once).
    missing = {d: (preset, s, d, None, minutes) for s, d in named if not (d / "labels.jsonl").is_file()}
    map_in_processes(generator.write_scenario, list(missing.values()), processes)
    return [(d, load_labels(d / "labels.jsonl")) for _, d in named]


def evaluate_settings(
    settings: Settings, scenarios: list[tuple[Path, list[dict[str, Any]]]], processes: int = 1
) -> dict[str, Any]:
    """Replay every scenario with ``settings`` (``processes`` at once) and score them together."""
    from trainguard.dataflows.processes import map_in_processes

    return scored(scenarios, map_in_processes(found_in_replay, [(d, settings) for d, _ in scenarios], processes))


Found = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # a replay's anomalies and actions, as scoring reads them


def found_in_replay(directory: Path, settings: Settings) -> Found:
    """What scoring needs of one replay (and all a worker process sends back: no dead letters)."""
    from trainguard.dataflows.pipeline import replay_in_process

    anomalies, actions, _dead = replay_in_process(directory, settings)
    return [msgspec.structs.asdict(a) for a in anomalies], [msgspec.structs.asdict(a) for a in actions]


def scored(scenarios: list[tuple[Path, list[dict[str, Any]]]], found: list[Found]) -> dict[str, Any]:
    """The scenarios' labels scored together against what their replays found, scenario by scenario."""
    from trainguard.datasets.scoring import Scorer

    scorer = Scorer()
    for (_, labels), (anomalies, actions) in zip(scenarios, found, strict=True):
        scorer.add([dict(lab) for lab in labels], anomalies, actions)
    return scorer.report()


def evaluate(
    preset: Annotated[str, typer.Option(help="Scenario preset.")] = "default",
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds (hold out the ones you tuned on).")] = "11,12,13",
    work: Annotated[Path, typer.Option(help="Where generated scenarios are kept between runs.")] = Path(
        "trainguard-out/evaluate"
    ),
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    minutes: Annotated[float | None, typer.Option(min=10, help="Scenario length (default: the preset's).")] = None,
    processes: ProcessesOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Generate labelled scenarios for several seeds, replay them all, and score them together."""
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds must be comma-separated integers, not {seeds!r}.") from None
    workers = _processes(processes)
    scenarios = prepare_scenarios(preset, seed_list, work, minutes, workers)
    report = evaluate_settings(settings_from(config), scenarios, workers)
    if as_json:
        typer.echo(json.dumps(report, indent=2, default=str))
    else:
        print_report(report)


def register(app: typer.Typer) -> None:
    app.command()(evaluate)
    app.command()(generate)
    app.command()(score)
    app.command()(tune)
