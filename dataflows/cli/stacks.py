"""``trainguard collect-stacks``: dump a job's Python stacks on this node (py-spy), once or on request.

Options only; the work is :mod:`trainguard.agents.stacks`.
"""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path
from typing import Annotated

import typer

from trainguard.agents.publisher import RecordPublisher
from trainguard.agents.stacks import PySpyMissing, StackAgent, dump_job, find_py_spy, serve
from trainguard.cli.common import BrokersOpt, ConfigOpt, console, fail, publishing_settings
from trainguard.detectors.stacks import localise


def collect_stacks(
    job: Annotated[
        str | None, typer.Option(help="The job whose processes to dump (SLURM_JOB_ID, TORCHELASTIC_RUN_ID …).")
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Dump now and exit, instead of waiting for requests.")] = False,
    brokers: BrokersOpt = "",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Append JSON Lines here instead of Kafka.")] = None,
    node: Annotated[str | None, typer.Option(help="Node name to report (default: this host's name).")] = None,
    py_spy: Annotated[
        Path | None, typer.Option("--py-spy", help="The py-spy to run (default: next to this Python, else PATH).")
    ] = None,
    min_interval: Annotated[
        float, typer.Option(min=0.0, help="Seconds between two dumps of one job, whatever asks.")
    ] = 30.0,
    config: ConfigOpt = None,
) -> None:
    """Dump the Python stacks of a job's ranks on this node with py-spy and publish them as stacks records.

    --once dumps --job now; without it, it answers diagnose actions (confirmed hangs) from the actions topic.
    """
    if once and job is None:
        raise fail("--once dumps one job: give --job ID.")
    if not once and out is not None:
        raise fail("waiting for diagnose requests reads them from Kafka: give --brokers, or --once with --out.")
    try:
        spy = find_py_spy(py_spy)
    except PySpyMissing as exc:
        raise fail(str(exc)) from None
    settings = publishing_settings(config, brokers, out)
    here = node or socket.gethostname().split(".")[0]
    publisher = RecordPublisher(settings, out)
    try:
        if once:
            assert job is not None
            records = dump_job(job, here, spy)
            for record in records:
                publisher.publish("stacks", record, key=job)
            _print_round(job, here, records)
            return
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        agent = StackAgent(here, lambda j, n, request: dump_job(j, n, spy, request=request), job, min_interval)
        console.print(f"waiting for diagnose actions on {settings.kafka.actions_topic} for {here}")

        def publish(record: dict) -> None:
            publisher.publish("stacks", record, key=str(record["job_id"]))
            publisher.flush()

        try:
            published = serve(
                agent, settings.kafka.brokers, settings.kafka.actions_topic, publish, stop, settings.kafka.extra
            )
        except KeyboardInterrupt:
            published = 0
        console.print(f"published {published} stacks record(s)")
    finally:
        publisher.close()


def _print_round(job: str, node: str, records: list[dict]) -> None:
    if not records:
        console.print(f"no process of job {job} on {node}")
        return
    console.print(f"dumped {len(records)} process(es) of job {job} on {node}:")
    for line in localise(records).evidence():
        console.print(f"  {line}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("collect-stacks")(collect_stacks)
