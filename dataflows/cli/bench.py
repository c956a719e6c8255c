"""``trainguard bench …``: every benchmark and accuracy measurement the docs quote, one command each.

Numbers are printed, never asserted: docs/benchmarks.md records them with the
command that reproduced them. ``latency`` and ``soak-live`` start the tests'
Tansu broker, so they run from a checkout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from trainguard.cli.common import console, fail

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: throughput, detector costs, soaks, latency, accuracy.")


@bench_app.command("replay")
def replay_cmd(
    run: Annotated[
        list[str] | None,
        typer.Option(
            help="A configuration, repeatable: 1 (one worker), tN (N threads), pN (N processes), bare (one worker,"
            " detectors off)."
        ),
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Replay a scenario preset instead of the mix.")] = None,
    seed: Annotated[int, typer.Option(help="The preset's seed.")] = 11,
    jobs: Annotated[int, typer.Option(min=1, help="Jobs of the mix.")] = 16,
    minutes: Annotated[float, typer.Option(min=1, help="Event-time length of the mix.")] = 30.0,
    repeat: Annotated[int, typer.Option(min=1, help="Runs of each configuration; the median is printed.")] = 5,
    mix: Annotated[
        str | None, typer.Option(help="Tilt the mix towards one kind of record: gpu, progress or logs.")
    ] = None,
    split: Annotated[
        bool, typer.Option(help="pN runs read the workload split into N shards, each worker its own share.")
    ] = False,
) -> None:
    """Replay throughput of the real flow, configurations taking turns so they share the machine's moods."""
    from trainguard.benchmarks.bench import parse_config, replay_throughput
    from trainguard.datasets.generator import MIXES, PRESETS

    if preset is not None and preset not in PRESETS:
        raise fail(f"unknown preset {preset!r}; the presets are: {', '.join(PRESETS)}.")
    if mix is not None and mix not in MIXES:
        raise fail(f"unknown --mix {mix!r}; use one of {', '.join(MIXES)}.")
    if mix is not None and preset is not None:
        raise fail("--mix tilts the mix workload; drop --preset to use it.")
    try:
        configs = [parse_config(text) for text in run or ["1"]]
    except ValueError as exc:
        raise fail(str(exc)) from None
    replay_throughput(
        configs, preset=preset, seed=seed, jobs=jobs, minutes=minutes, repeat=repeat, mix=mix, split=split
    )


@bench_app.command("detectors")
def detectors_cmd() -> None:
    """Per-event cost of each detector step, in microseconds, on one core, without Bytewax."""
    from trainguard.benchmarks.microbench import detector_costs

    rows = detector_costs()
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        console.print(f"{name:<{width}}  {us:8.2f} µs", highlight=False)


@bench_app.command("soak")
def soak_cmd(hours: Annotated[int, typer.Option(min=1, help="Simulated hours of the 1,000-GPU cluster.")] = 24) -> None:
    """A simulated day of a 1,000-GPU cluster through the real flow at full speed: rate, batch p99, RSS."""
    from trainguard.benchmarks.soak import soak

    print(json.dumps(soak(hours), indent=2))


@bench_app.command("soak-live")
def soak_live_cmd(minutes: Annotated[float, typer.Option(min=1, help="Wall-clock minutes to publish.")] = 10.0) -> None:
    """The 1,000-GPU cluster published in real time to a real broker, trainguard run consuming."""
    from trainguard.benchmarks.soak_live import soak_live

    try:
        print(json.dumps(soak_live(minutes), indent=2))
    except (RuntimeError, ModuleNotFoundError) as exc:
        raise fail(f"{exc} (the live soak runs from a checkout, with the test support code).") from None


@bench_app.command("latency")
def latency_cmd(lateness: Annotated[float, typer.Option(min=0, help="router.lateness_s for the run.")] = 0.5) -> None:
    """Wall-clock detection latency of a crash and a hang published in real time to a real broker."""
    from trainguard.benchmarks.live_latency import live_latency

    try:
        live_latency(lateness)
    except (RuntimeError, ModuleNotFoundError) as exc:
        raise fail(f"{exc} (the latency benchmark runs from a checkout, with the test support code).") from None


@bench_app.command("realjob")
def realjob_cmd(
    fault: Annotated[
        list[str] | None,
        typer.Option(help="A fault, repeatable: kill, stop, slow, nan, healthy, cancel (default: the first four)."),
    ] = None,
    repeat: Annotated[int, typer.Option(min=1, help="Jobs per fault.")] = 5,
) -> None:
    """Detection latency on a real torchrun job (4 gloo ranks), faults injected from outside (needs torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise fail("a real training job needs torch: pip install -e '.[realjob]'.")
    from trainguard.benchmarks.realjob_faults import FAULTS, bench

    faults = fault or ["kill", "stop", "slow", "nan"]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise fail(f"unknown fault {unknown[0]!r}; the faults are: {', '.join(FAULTS)}.")
    try:
        bench(faults, repeat)
    except (ModuleNotFoundError, RuntimeError) as exc:
        raise fail(f"the real-job benchmark runs from a checkout with the dev extras ({exc}).") from None


@bench_app.command("nab")
def nab_cmd(
    detector: Annotated[str, typer.Option(help="trainguard, windowedGaussian or null.")] = "trainguard",
    nab: Annotated[Path | None, typer.Option(help="NAB's folder (default: shared/datasets/nab).")] = None,
) -> None:
    """The drift detector scored on the Numenta Anomaly Benchmark with NAB's own rules."""
    from trainguard.datasets import nab as nab_module

    directory = nab or nab_module.NAB_DIR
    if not directory.is_dir():
        raise fail(f"no NAB corpus at {directory}: pass --nab with the folder holding data/ and labels/.")
    try:
        nab_module.report(detector, directory)
    except ValueError as exc:
        raise fail(str(exc)) from None
    except (OSError, KeyError) as exc:
        raise fail(f"{directory} is not NAB's layout (data/, labels/combined_windows.json): {exc}.") from None


@bench_app.command("corpus")
def corpus_cmd(
    part: Annotated[str, typer.Argument(help="tune, holdout, or a JSON Lines file of excerpts.")] = "tune",
    gap: Annotated[float, typer.Option(min=0, help="Seconds of event time after the excerpts.")] = 0.0,
    misses: Annotated[bool, typer.Option("--misses", help="List the excerpts scored wrong.")] = False,
) -> None:
    """Real log excerpts replayed one job each through the real flow: fault vs normal, layer, family."""
    from trainguard.benchmarks.corpus import report

    try:
        report(part, gap, misses)
    except FileNotFoundError as exc:
        raise fail(str(exc)) from None
    except (OSError, ValueError, KeyError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        raise fail(f"{part} is not JSON Lines of excerpts with source, text, label and layer ({what}).") from None


@bench_app.command("learnability")
def learnability_cmd(
    part: Annotated[
        list[Path] | None,
        typer.Argument(help="tune or JSON Lines files of open excerpts (default: tune and the open fixtures)."),
    ] = None,
) -> None:
    """Whether a learned reader would catch what the catalogue misses: out-of-group scores on open excerpts."""
    from trainguard.benchmarks.corpus import excerpts_path
    from trainguard.benchmarks.learnability import report

    try:
        report([excerpts_path(str(p)) for p in part] if part else None)
    except ValueError as exc:
        raise fail(str(exc)) from None
    except (OSError, KeyError) as exc:
        raise fail(
            f"could not read the excerpts ({exc}): give JSON Lines files with source, text, label, layer."
        ) from None


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
