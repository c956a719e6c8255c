"""The agents' commands: ``collect-gpu``, ``watch-slurm``, ``watch-kubernetes``, ``ship-logs``, ``import-prometheus``.

Each parses its options, builds one agent and hands it to :func:`trainguard.agents.loop.run_agent`;
the loops themselves live with the agents.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from trainguard.agents.loop import Agent, DeliveryFailed, SourceUnavailable, run_agent
from trainguard.agents.publisher import RecordPublisher
from trainguard.cli.common import BrokersOpt, ConfigOpt, console, err_console, fail, publishing_settings
from trainguard.dataflows.config import Settings

OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Append JSON Lines here instead of Kafka.")]
CountOpt = Annotated[int | None, typer.Option(min=1, help="Stop after this many polls (default: run until stopped).")]
MetricsPortOpt = Annotated[
    int,
    typer.Option(
        min=0,
        max=65535,
        help="Serve this agent's /metrics and /healthz here (0: off); TRAINGUARD_METRICS_TOKEN guards /metrics.",
    ),
]
MetricsHostOpt = Annotated[str, typer.Option(help="Address for the metrics endpoint.")]


def _run(
    agent: Agent,
    settings: Settings,
    out: Path | None,
    interval: float,
    count: int | None,
    metrics: tuple[int, str] = (0, "127.0.0.1"),
) -> int:
    """Run ``agent`` until stopped; the number of records published."""
    server = None
    if metrics[0]:
        import os

        from trainguard.dataflows.metrics import MetricsServer

        try:
            server = MetricsServer(metrics[0], metrics[1], token=os.environ.get("TRAINGUARD_METRICS_TOKEN") or None)
        except OSError as exc:
            where = f"{metrics[1]}:{metrics[0]}"
            raise fail(f"cannot serve metrics on {where} ({exc.strerror}); pick another --metrics-port.") from None
    publisher = RecordPublisher(settings, out)
    try:
        run = run_agent(
            agent,
            publisher,
            interval_s=interval,
            count=count,
            warn=lambda message: err_console.print(f"[yellow]warning:[/] {message}", soft_wrap=True),
        )
    except SourceUnavailable as exc:
        raise fail(str(exc)) from None
    except DeliveryFailed as exc:
        raise fail(f"{exc} ({','.join(settings.kafka.brokers)})") from None
    finally:
        agent.close()
        publisher.close()
        if server is not None:
            server.close()
    return run.published


def collect_gpu(
    brokers: BrokersOpt = "",
    out: OutOpt = None,
    dcgm_exporter: Annotated[
        str | None,
        typer.Option(
            "--dcgm-exporter",
            help="Scrape dcgm-exporter instead of NVML: host:port or URL, comma-separated, or @FILE (one per line).",
        ),
    ] = None,
    node: Annotated[str | None, typer.Option(help="Node name to report (default: this host's name).")] = None,
    interval: Annotated[
        float, typer.Option(min=0.5, help="Seconds between samples; Xid events are awaited in between.")
    ] = 10.0,
    sweeps: Annotated[
        bool, typer.Option("--sweeps", help="Send a node's GPUs of one poll as one record (the gpu_sweep form).")
    ] = False,
    count: CountOpt = None,
    config: ConfigOpt = None,
    metrics_port: MetricsPortOpt = 0,
    metrics_host: MetricsHostOpt = "127.0.0.1",
) -> None:
    """Sample every GPU of this node through NVML (or scrape dcgm-exporter) and publish gpu records."""
    settings = publishing_settings(config, brokers, out)
    agent: Agent
    if dcgm_exporter is not None:
        from trainguard.agents.dcgm import DcgmExporterScraper, read_targets

        try:
            agent = DcgmExporterScraper(read_targets(dcgm_exporter))
        except (ValueError, OSError) as exc:
            raise fail(f"--dcgm-exporter: {exc}.") from None
    else:
        from trainguard.agents.nvml_collector import GpuCollector, NvmlUnavailable

        try:
            agent = GpuCollector(node or socket.gethostname().split(".")[0])
        except NvmlUnavailable as exc:
            raise fail(str(exc)) from None
    if sweeps:
        from trainguard.agents.sweeps import Sweeps

        agent = Sweeps(agent)
    published = _run(agent, settings, out, interval, count, (metrics_port, metrics_host))
    console.print(f"published {published} GPU record(s) ({agent.name})")


def watch_slurm(
    brokers: BrokersOpt = "",
    out: OutOpt = None,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between polls of squeue and sinfo.")] = 5.0,
    count: CountOpt = None,
    config: ConfigOpt = None,
    metrics_port: MetricsPortOpt = 0,
    metrics_host: MetricsHostOpt = "127.0.0.1",
) -> None:
    """Poll Slurm (squeue/sinfo --json) and publish job and node state changes as scheduler records."""
    from trainguard.actions.commands import CommandRunner
    from trainguard.agents.slurm_watcher import SlurmWatcher

    settings = publishing_settings(config, brokers, out)
    s = settings.scheduler
    runner = CommandRunner(s.timeout_s, s.attempts, s.backoff_s, ssh_host=s.ssh_host, bin_dir=s.bin_dir)
    published = _run(SlurmWatcher(runner), settings, out, interval, count, (metrics_port, metrics_host))
    console.print(f"published {published} scheduler record(s)")


def watch_kubernetes(
    brokers: BrokersOpt = "",
    out: OutOpt = None,
    namespace: Annotated[
        str | None, typer.Option(help="Namespace of the training Jobs (default: scheduler.namespace of the config).")
    ] = None,
    interval: Annotated[float, typer.Option(min=0.2, help="Seconds between looks at the API server.")] = 5.0,
    count: CountOpt = None,
    config: ConfigOpt = None,
    metrics_port: MetricsPortOpt = 0,
    metrics_host: MetricsHostOpt = "127.0.0.1",
) -> None:
    """Watch Kubernetes batch Jobs, their pods' nodes and node state; publish changes as scheduler records."""
    from trainguard.agents.kubernetes_watcher import KubernetesWatcher

    settings = publishing_settings(config, brokers, out)
    s = settings.scheduler
    try:
        from trainguard.actions.kubernetes import KubernetesDriver

        driver = KubernetesDriver.from_config(namespace or s.namespace, s.kube_context)
    except ModuleNotFoundError:
        raise fail('the kubernetes client is missing: pip install "trainguard[kubernetes]".') from None
    except Exception as exc:  # the client raises its own ConfigException when no kubeconfig is found
        raise fail(f"cannot load a Kubernetes configuration ({exc}); run in a pod or set KUBECONFIG.") from None
    watcher = KubernetesWatcher(driver)
    published = _run(watcher, settings, out, interval, count, (metrics_port, metrics_host))
    console.print(f"published {published} scheduler record(s)")


def ship_logs(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Log files to follow, e.g. /shared/logs/slurm-*.out; quote a glob ('logs/**/std*.log', torchrun's "
            "--log-dir layout) to pick up files that appear later."
        ),
    ],
    brokers: BrokersOpt = "",
    state: Annotated[Path, typer.Option(help="Where shipped offsets are kept between runs.")] = Path(
        ".trainguard-ship-state.json"
    ),
    node: Annotated[str | None, typer.Option(help="Node the logs come from (default: this host).")] = None,
    job: Annotated[str | None, typer.Option(help="Job id (default: from slurm-<job>.out names).")] = None,
    rank_base: Annotated[
        int, typer.Option(min=0, help="This node's first rank, added to torchrun's local ranks (node_rank × nproc).")
    ] = 0,
    interval: Annotated[float, typer.Option(min=0.05, help="Seconds between polls.")] = 0.5,
    once: Annotated[bool, typer.Option("--once", help="Ship what is there now, then exit.")] = False,
    config: ConfigOpt = None,
    metrics_port: MetricsPortOpt = 0,
    metrics_host: MetricsHostOpt = "127.0.0.1",
) -> None:
    """Follow growing log files and publish their lines to the logs topic (at least once, resumable)."""
    from trainguard.agents.shipper import LogTailer

    settings = publishing_settings(config, brokers, None)
    tailer = LogTailer(
        [Path(p) for p in paths],
        state,
        node=node or socket.gethostname().split(".")[0],
        job_id=job,
        rank_base=rank_base,
    )
    shipped = _run(tailer, settings, None, interval, 1 if once else None, (metrics_port, metrics_host))
    console.print(f"shipped {shipped} log lines to {settings.kafka.topic_for('logs')}")


def import_prometheus(
    url: Annotated[str, typer.Argument(help="Prometheus server, e.g. http://prometheus:9090.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Replay directory to write gpu/part-*.parquet into.")],
    start: Annotated[str, typer.Option(help="First time to import (ISO-8601 or epoch seconds).")],
    end: Annotated[str | None, typer.Option(help="Last time to import (default: now).")] = None,
    step: Annotated[str, typer.Option(help="Time between samples: your scrape interval, e.g. 15s.")] = "15s",
    match: Annotated[
        str, typer.Option(help="Regular expression of the dcgm-exporter metric names to import.")
    ] = "DCGM_FI_DEV_.*",
    chunk_steps: Annotated[
        int, typer.Option(min=1, max=11_000, help="Steps per query (and per Parquet file): bounds memory.")
    ] = 120,
) -> None:
    """Import dcgm-exporter history from Prometheus as a replay directory of GPU samples (Parquet)."""
    import time

    from trainguard.agents.prometheus_import import PrometheusImportError, parse_step
    from trainguard.agents.prometheus_import import import_prometheus as run_import
    from trainguard.cli.common import parse_time, writable_dir

    try:
        seconds = parse_step(step)
        first = parse_time(start, "--start")
        last = time.time() if end is None else parse_time(end, "--end")
        imported = run_import(url, writable_dir(out), first, last, seconds, match=match, chunk_steps=chunk_steps)
    except PrometheusImportError as exc:
        raise fail(str(exc)) from None
    console.print(
        f"wrote {imported.samples} GPU samples from {imported.series} series ({len(imported.metrics)} metrics) "
        f"to {imported.directory}/gpu ({imported.files} Parquet file(s))"
    )


def register(app: typer.Typer) -> None:
    app.command("collect-gpu")(collect_gpu)
    app.command("watch-slurm")(watch_slurm)
    app.command("watch-kubernetes")(watch_kubernetes)
    app.command("ship-logs")(ship_logs)
    app.command("import-prometheus")(import_prometheus)
