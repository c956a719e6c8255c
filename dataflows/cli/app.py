"""The ``trainguard`` command line."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trainguard.actions.audit import read_entries
from trainguard.actions.records import Action
from trainguard.agents.logimport import LogImportError, import_logs
from trainguard.cli.agents import register as register_agent_commands
from trainguard.cli.audit import register as register_audit_command
from trainguard.cli.bench import register as register_bench_commands
from trainguard.cli.common import (
    DEMO_DIR,
    BrokersOpt,
    ConfigOpt,
    ProcessesOpt,
    WorkersOpt,
    brokers_list,
    console,
    err_console,
    fail,
    kafka_settings,
    parse_time,
    settings_from,
    writable_dir,
)
from trainguard.cli.config_cmds import register as register_config_commands
from trainguard.cli.explain import register as register_explain_command
from trainguard.cli.scenarios import register as register_scenario_commands
from trainguard.cli.silence import register as register_silence_commands
from trainguard.cli.stacks import register as register_stacks_command
from trainguard.cli.templates import register as register_templates_command
from trainguard.dataflows import pipeline
from trainguard.dataflows.archive import flush_open_archives
from trainguard.dataflows.config import ConfigError
from trainguard.dataflows.replay import ReplayError, ReplaySource, count_records
from trainguard.dataflows.replay_shards import ShardedReplaySource
from trainguard.dataflows.replay_split import holds_topics, is_split, shard_folder, split_records
from trainguard.detectors.events import TOPICS, Anomaly, DeadLetter
from trainguard.detectors.lenient import FIELD_WARNINGS
from trainguard.detectors.lifecycle import is_false_alarm

app = typer.Typer(
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    no_args_is_help=True,
    help="Streaming anomaly detection and recovery actions for GPU training jobs.",
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"trainguard {version('trainguard')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Streaming anomaly detection and recovery actions for GPU training jobs."""


class RunReport:
    """Collects a run's outputs in-process for the console and the summary."""

    def __init__(self, echo: bool) -> None:
        self.anomalies: list[Anomaly] = []  # as opened
        self.resolutions: dict[str, Anomaly] = {}  # anomaly id -> its resolution record
        self.actions: list[Action] = []
        self.dead = Counter[str]()
        self.echo = echo
        self._lock = threading.Lock()

    def on_anomalies(self, items: list[Anomaly]) -> None:
        with self._lock:
            revised = {a.anomaly_id: a for a in items if not a.resolved and a.revised_at is not None}
            self.anomalies = [revised.pop(a.anomaly_id, a) for a in self.anomalies]  # a revision replaces its record
            self.anomalies.extend(a for a in items if not a.resolved and a.revised_at is None)
            self.anomalies.extend(revised.values())  # revised before its opening was collected: keep it
            self.resolutions.update((a.anomaly_id, a) for a in items if a.resolved)
        if self.echo:
            for a in items:
                if a.resolved:
                    console.print(f"[green]resolved[/] {a.kind}/{a.category}: {a.resolution} [dim]{a.anomaly_id}[/]")
                    continue
                if a.revised_at is not None:
                    where = ", ".join(f"rank {r}" for r in a.ranks) or "nobody stands out"
                    console.print(
                        f"[cyan]localised[/] {a.kind}/{a.category} by {a.localisation or 'stacks'}: {where} "
                        f"({', '.join(a.nodes) or '-'}) [dim]{a.anomaly_id}[/]"
                    )
                    continue
                where = ", ".join(a.nodes) or "-"
                console.print(
                    f"[bold yellow]anomaly[/] {a.kind}/{a.category} job={a.job_id or '-'} "
                    f"nodes={where} layer={a.layer} [dim]{a.anomaly_id}[/]"
                )

    def on_actions(self, items: list[Action]) -> None:
        with self._lock:
            self.actions.extend(items)

    def on_dead_letters(self, items: list[DeadLetter]) -> None:
        with self._lock:
            self.dead.update(f"{d.topic}: {d.reason.split(' - at ')[0][:70]}" for d in items)

    def outputs(self, archive: Path | None, kafka: bool = False) -> Any:
        from trainguard.dataflows.flow import Outputs

        return Outputs(
            archive=archive,
            kafka=kafka,
            on_anomalies=self.on_anomalies,
            on_actions=self.on_actions,
            on_dead_letters=self.on_dead_letters,
        )

    def print_json(self) -> None:
        """JSON Lines: each anomaly record (opened, then resolved), each action, then one summary line."""
        encode = msgspec.json.Encoder().encode
        for a in self.anomalies:
            typer.echo(encode({"record": "anomaly", **msgspec.structs.asdict(a)}))
        for r in self.resolutions.values():
            typer.echo(encode({"record": "anomaly", **msgspec.structs.asdict(r)}))
        for x in self.actions:
            typer.echo(encode({"record": "action", **msgspec.structs.asdict(x)}))
        summary = {
            "record": "summary",
            "anomalies": len(self.anomalies),
            "resolved": len(self.resolutions),
            "actions": len(self.actions),
            "dead_lettered": sum(self.dead.values()),
            "dead_letter_reasons": dict(self.dead),
        }
        typer.echo(encode(summary))

    def print_summary(self, archive: Path | None, audit_log: Path | None = None) -> None:
        table = Table(title="Anomalies")
        table.add_column("id", no_wrap=True)
        table.add_column("anomaly", no_wrap=True)
        table.add_column("layer")
        table.add_column("job")
        table.add_column("where")
        table.add_column("latency", justify="right")
        table.add_column("actions")
        table.add_column("status")
        for a in sorted(self.anomalies, key=lambda a: a.detected_at):
            latency = "" if a.onset_ts is None else f"{a.detected_at - a.onset_ts:.1f}s"
            where = ", ".join(a.nodes) + (f" rank {', '.join(map(str, a.ranks))}" if a.ranks else "")
            recs = "; ".join(
                f"{x.action} {x.target}" + ("" if x.status == "recommended" else f" ({x.status})")
                for x in self.actions
                if x.anomaly_id == a.anomaly_id
            )
            resolved = self.resolutions.get(a.anomaly_id)
            status = f"resolved: {resolved.resolution}" if resolved is not None else "open"
            table.add_row(
                a.anomaly_id,
                f"{a.kind}/{a.category}",
                a.layer,
                a.job_id or "-",
                where or "-",
                latency,
                recs or "-",
                status,
            )
        console.print(table)
        dead = sum(self.dead.values())
        statuses = Counter(f"{a.status} ({a.mode})" for a in self.actions)
        actions = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items())) or "none"
        if not self.actions and audit_log is not None:
            ids = {a.anomaly_id for a in self.anomalies}
            before = sum(1 for e in read_entries(audit_log) if e.get("anomaly_id") in ids)
            if before:  # a re-run: the executor's idempotency keys found them already decided
                actions = f"none new ({before} entries for these anomalies already in {audit_log}: a re-run)"
        false_alarms = sum(is_false_alarm(a.kind, a.resolution) for a in self.resolutions.values())
        console.print(
            f"{len(self.anomalies)} anomalies ({len(self.resolutions)} resolved, {false_alarms} false alarms "
            f"resolved by progress), actions: {actions}, {dead} dead-lettered records",
            soft_wrap=True,
        )
        for reason, n in self.dead.most_common(8):
            console.print(f"  [dim]{n:>6} × {reason}[/]")
        if FIELD_WARNINGS:
            fields = ", ".join(f"{topic}.{field} ×{n}" for (topic, field), n in FIELD_WARNINGS.most_common(8))
            console.print(f"optional fields coerced or nulled (records kept): {fields}")
        if archive is not None:
            console.print(f"Parquet archive: [bold]{archive}[/] (anomalies/, actions/, dead_letter/)")


def _replay(
    directory: Path,
    out: Path | None,
    speed: float | None,
    config: Path | None,
    workers: int,
    quiet: bool,
    processes: int = 1,
    audit_log: Path | None = None,
) -> RunReport:
    from trainguard.dataflows.flow import build_flow

    settings = settings_from(config)
    if audit_log is not None:
        settings.audit_log = str(audit_log)
    if processes > 1 and workers > 1:
        raise fail("use --processes or --workers, not both: a worker process runs one worker.")
    if out is not None:
        writable_dir(out)
    try:
        if is_split(directory):  # each worker process reads its own shard's file
            shard_folder(directory, 0, processes)  # split into as many shards as there are processes
            source: ReplaySource | ShardedReplaySource = ShardedReplaySource(directory, speed)
            total = split_records(directory)
        else:
            source = ReplaySource(directory, speed=speed) if processes == 1 else ShardedReplaySource(directory, speed)
            total = count_records(directory)
    except ReplayError as exc:
        raise fail(str(exc)) from None
    report = RunReport(echo=not quiet)
    started = time.perf_counter()
    if isinstance(source, ShardedReplaySource):
        from trainguard.dataflows.processes import WorkerProcessError, run_processes

        if not quiet:
            console.print(f"replaying {total} records on {processes} worker processes …")
        try:
            run_processes(lambda outputs: build_flow(source, settings, outputs), processes, report.outputs(out))
        except WorkerProcessError as exc:
            raise fail(f"{exc}.") from None
    else:
        columns = (TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True, disable=quiet) as progress:
            task = progress.add_task("replay", total=total)
            source.on_progress = lambda n: progress.advance(task, n)
            pipeline.run(build_flow(source, settings, report.outputs(out)), workers)
    elapsed = time.perf_counter() - started
    if not quiet:
        console.print(f"replayed {total} records in {elapsed:.2f}s ({total / max(elapsed, 1e-9):,.0f} records/s)")
    return report


@app.command()
def replay(
    directory: Annotated[
        Path, typer.Argument(help="Replay directory: logs/progress/gpu/scheduler .jsonl or .parquet.")
    ],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", envvar="TRAINGUARD_OUT", help="Archive directory for Parquet outputs.")
    ] = None,
    speed: Annotated[
        float | None, typer.Option(help="Event-time speed-up, e.g. 60; default: as fast as possible.")
    ] = None,
    config: ConfigOpt = None,
    workers: WorkersOpt = 1,
    processes: ProcessesOpt = 1,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the summary.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON Lines on stdout: every anomaly and action record, then a summary.")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 3 when any input record was dead-lettered.")] = False,
) -> None:
    """Replay recorded topics through the dataflow and summarise what was found.

    Exit status: 0 when the replay ran, 2 for a usage or input error, 3 with --strict when records were
    dead-lettered (the replay still completes and archives them).
    """
    report = _replay(directory, out, speed, config, workers, quiet or as_json, processes)
    if as_json:
        report.print_json()
    else:
        report.print_summary(out)
    if strict and report.dead:
        if not as_json:
            err_console.print(f"error: {sum(report.dead.values())} input records were dead-lettered (--strict).")
        raise typer.Exit(3)


@app.command("split-replay")
def split_replay_command(
    directory: Annotated[Path, typer.Argument(help="Replay directory to split.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the shards.")],
    shards: Annotated[int, typer.Option("--shards", "-n", help="Shards: the worker processes that will replay it.")],
) -> None:
    """Split a replay directory by router shard once, so that `replay OUT --processes N` has each worker
    read its own share only (the same anomalies as replaying the original with one worker)."""
    from trainguard.dataflows.replay_split import split_replay

    writable_dir(out)
    if is_split(out) or holds_topics(out):
        raise fail(f"{out} already holds a replay: split into an empty directory.")
    started = time.perf_counter()
    try:
        held = split_replay(directory, shards, out)
    except ReplayError as exc:
        raise fail(str(exc)) from None
    shares = ", ".join(f"{n:,}" for n in held)
    took = time.perf_counter() - started
    console.print(f"split into {shards} shards in {took:.1f}s: {shares} records (job records go to every shard)")
    console.print(f"replay it with: trainguard replay {out} --processes {shards}")


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Archive directory.")] = Path("trainguard-out/demo"),
) -> None:
    """Replay the bundled scenario (a crash, a hang, a straggler, a failing idle GPU) with no broker needed."""
    writable_dir(out)
    console.print(f"Replaying the bundled scenario from {DEMO_DIR} …")
    audit_log = out / "audit.jsonl"  # beside the archive: `trainguard audit`, `explain` and a re-run read it
    had_audit = audit_log.is_file()
    report = _replay(DEMO_DIR, out, None, None, 1, quiet=False, audit_log=audit_log)
    report.print_summary(out, audit_log if had_audit else None)
    console.print(f"Audit log: [bold]{audit_log}[/]; explain an anomaly: trainguard explain ID --archive {out}")
    console.print(f"Open the console on it: [bold]trainguard console --archive {out} --dev[/]")
    from trainguard.datasets.scoring import fault_table, load_labels

    # The scorer's own matching rule (place, kind, time window), as `trainguard score` applies it.
    labels = load_labels(DEMO_DIR / "labels.jsonl")
    rows = fault_table(labels, [msgspec.to_builtins(a) for a in report.anomalies])
    nodes = {lab["fault_id"]: lab["nodes"] for lab in labels}
    found = [r for r in rows if r["detected"]]
    console.print(
        f"Found {len(found)} of the {len(rows)} labelled faults: "
        + ", ".join(f"{r['kind']} on {', '.join(nodes[r['fault_id']]) or 'job ' + str(r['job_id'])}" for r in found)
    )
    if len(found) != len(rows):
        raise typer.Exit(1)


@app.command()
def run(
    brokers: BrokersOpt = "",
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", help="Map a stream to a topic name: STREAM=TOPIC (e.g. logs=prod.train.logs)."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", envvar="TRAINGUARD_OUT", help="Archive directory for Parquet outputs.")
    ] = None,
    config: ConfigOpt = None,
    workers: WorkersOpt = 1,
    metrics_port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            envvar="TRAINGUARD_METRICS_PORT",
            help="Serve /metrics and /healthz here (0: off). TRAINGUARD_METRICS_TOKEN: a bearer token for /metrics.",
        ),
    ] = 9464,
    metrics_host: Annotated[str, typer.Option(help="Address for the metrics endpoint.")] = "127.0.0.1",
    recovery: Annotated[
        Path | None,
        typer.Option(help="Snapshot state and Kafka offsets here; a restart resumes from the last snapshot."),
    ] = None,
    snapshot_s: Annotated[float, typer.Option(min=0.1, help="Seconds between snapshots (Bytewax epochs).")] = 10.0,
    addresses: Annotated[
        str,
        typer.Option(
            envvar="TRAINGUARD_ADDRESSES",
            help="Run as one process of several: every process's host:port, ';'-separated, the same list everywhere.",
        ),
    ] = "",
    process_id: Annotated[
        int, typer.Option(min=0, envvar="TRAINGUARD_PROCESS_ID", help="This process's place in --addresses (from 0).")
    ] = 0,
) -> None:
    """Run live against Kafka: consume the input topics, publish anomalies and actions."""
    from trainguard.dataflows.kafka_io import LagMonitor

    settings = settings_from(config)
    if brokers:
        settings.kafka.brokers = brokers_list(brokers)
    cluster = [a.strip() for a in addresses.split(";") if a.strip()]
    if cluster and process_id >= len(cluster):
        raise fail(f"--process-id {process_id} has no entry in --addresses ({len(cluster)} given); count from 0.")
    if len(cluster) > 1 and settings.router.shards == 1:
        settings.router.shards = len(cluster) * workers  # one router shard per worker (see scale-out.md)
    for mapping in topic or []:
        stream, sep, name = mapping.partition("=")
        if not sep or stream not in TOPICS or not name:
            raise fail(f"--topic {mapping!r} must look like STREAM=TOPIC with STREAM one of {', '.join(TOPICS)}.")
        settings.kafka.topics[stream] = name
    report = RunReport(echo=True)
    stopping = threading.Event()
    try:
        live = pipeline.live_flow(settings, report.outputs(out, kafka=True), stopping)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    inputs = live.inputs
    server = None
    if metrics_port:
        from trainguard.dataflows.metrics import MetricsServer

        try:
            server = MetricsServer(metrics_port, metrics_host, token=os.environ.get("TRAINGUARD_METRICS_TOKEN") or None)
        except OSError as exc:
            raise fail(
                f"cannot serve metrics on {metrics_host}:{metrics_port} ({exc.strerror}); "
                "pick another --metrics-port or 0 to turn them off."
            ) from None
        console.print(f"metrics on http://{metrics_host}:{server.port}/metrics, health on /healthz")
    console.print(
        f"consuming {', '.join(inputs.topics)} from {','.join(settings.kafka.brokers)}; "
        f"publishing to {settings.kafka.anomalies_topic}, {settings.kafka.actions_topic}"
    )
    lag = (
        LagMonitor(settings.kafka, live.mapper, inputs.topics)
        if server is not None and workers == 1 and len(cluster) <= 1
        else None
    )

    def stop(signum: int, frame: object) -> None:
        # A service manager's stop is a clean stop: end the input, so the flow releases what it holds
        # (held lines are reported) and flushes its sinks. A second signal stops at once.
        if stopping.is_set():
            raise KeyboardInterrupt
        stopping.set()
        console.print("stopping: draining the flow (send the signal again to stop at once)")

    signal.signal(signal.SIGTERM, stop)
    try:
        pipeline.run(live.flow, workers, recovery, snapshot_s, cluster, process_id)
    except KeyboardInterrupt:
        pass
    except Exception:
        # The interrupt may land inside a Bytewax callback and come back wrapped.
        if not stopping.is_set():
            raise
    finally:
        flush_open_archives()
        if lag is not None:
            lag.close()
        if server is not None:
            server.close()
    report.print_summary(out)


@app.command()
def produce(
    directory: Annotated[Path, typer.Argument(help="Replay directory to publish.")],
    brokers: BrokersOpt = "",
    speed: Annotated[float | None, typer.Option(help="Event-time speed-up; default: as fast as possible.")] = None,
    create: Annotated[bool, typer.Option("--create-topics", help="Create missing topics first.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Publish a replay directory's records to the Kafka input topics, in event-time order."""
    from trainguard.dataflows.kafka_io import create_topics, produce_replay

    settings = kafka_settings(config, brokers)
    if speed is not None and speed <= 0:
        raise fail(f"--speed must be a positive number, got {speed}.")
    try:
        if create:
            create_topics(settings.kafka)
        counts = produce_replay(directory, settings.kafka, speed)
    except ReplayError as exc:
        raise fail(str(exc)) from None
    console.print("published " + ", ".join(f"{n} {t}" for t, n in counts.items()))


@app.command("console")
def console_cmd(
    archive: Annotated[
        Path | None, typer.Option(help="Parquet archive of the run to show (trainguard run/replay --out).")
    ] = None,
    progress: Annotated[
        Path | None, typer.Option(help="Replay directory whose progress records draw job timelines.")
    ] = None,
    brokers: Annotated[
        str, typer.Option(envvar="TRAINGUARD_BROKERS", help="Also read the anomalies and progress topics live.")
    ] = "",
    host: Annotated[str | None, typer.Option(help="Address to listen on (default: console.host, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (default: console.port, 8765).")] = None,
    dev: Annotated[
        bool,
        typer.Option(
            "--dev", help="On this machine only, no users to configure: prints a one-time sign-in link (an operator)."
        ),
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Serve the live dashboard: anomaly feed, job timelines, nodes, audit trail, approvals."""
    import secrets

    import uvicorn

    from trainguard.console.app import create_app
    from trainguard.console.data import ConsoleData
    from trainguard.dataflows.action_step import make_executor
    from trainguard.dataflows.config import ConsoleUser

    settings = settings_from(config)
    one_time = None
    if dev:
        if (host or settings.console.host) not in ("127.0.0.1", "localhost", "::1"):
            raise fail("--dev serves this machine only: drop --host (or use 127.0.0.1), or configure console.users.")
        settings.console.users = [ConsoleUser(name="dev", role="operator")]
        one_time = secrets.token_urlsafe(24)
        if settings.audit_log is None and archive is not None and (archive / "audit.jsonl").is_file():
            settings.audit_log = str(archive / "audit.jsonl")  # the demo's: approvals go through it
    if not settings.console.users:
        raise fail(
            "the console needs at least one user under console.users in the config "
            "(name, role, and password_scrypt from `trainguard hash-password` or token_sha256)."
        )
    from trainguard.console.passwords import check_format

    for user in settings.console.users:
        why = check_format(user.password_scrypt) if user.password_scrypt else None
        if why is not None:
            raise fail(f"console user {user.name!r}: password_scrypt {why}.")
    if settings.audit_log is None and archive is None and not brokers:
        raise fail("give --archive DIR, --brokers, or audit_log in the config: the console shows a run's outputs.")
    audit_path = Path(settings.audit_log) if settings.audit_log else None
    # Approvals go through the same executor (driver, audit log, silences) as the flow's.
    executor = make_executor(settings) if audit_path is not None else None
    data = ConsoleData(audit_path, archive, progress)
    data.refresh()
    if brokers:
        from trainguard.console.kafka_tail import KafkaTail

        settings.kafka.brokers = brokers_list(brokers)
        KafkaTail(settings.kafka, data)
    bind_host, bind_port = host or settings.console.host, port or settings.console.port
    console.print(f"trainguard console on http://{bind_host}:{bind_port}/")
    if one_time is not None:
        link = f"http://{bind_host}:{bind_port}/login?token={one_time}"
        console.print(f"open {link} (the link works once)", soft_wrap=True)
    uvicorn.run(
        create_app(settings, data, executor, one_time_token=one_time),
        host=bind_host,
        port=bind_port,
        log_level="warning",
        access_log=False,
    )


@app.command("hash-password")
def hash_password_cmd() -> None:
    """Print a console password's scrypt hash for console.users[].password_scrypt (read from the terminal or stdin)."""
    import getpass

    from trainguard.console.passwords import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise fail("the two passwords differ; run it again.")
    else:  # piped: never from argv, where it would land in shell history and `ps`
        password = sys.stdin.readline().rstrip("\r\n")
    if len(password) < 12:
        raise fail("use a password of at least 12 characters.")
    typer.echo(hash_password(password))


@app.command("import-logs")
def import_logs_cmd(
    files: Annotated[list[Path], typer.Argument(help="Plain-text log files, e.g. slurm-1234.out.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Replay directory to write logs.jsonl into.")],
    job: Annotated[str | None, typer.Option(help="Job id (default: from slurm-<job>.out names).")] = None,
    node: Annotated[
        str | None, typer.Option(help="Node the logs came from (default: the one the log names, else 'unknown').")
    ] = None,
    year: Annotated[
        int | None,
        typer.Option(help="Year for glog/syslog stamps (default: from the log's full stamps, else the file's mtime)."),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(help="Stamp the lines in order from this time (ISO-8601 or epoch seconds), ignoring theirs."),
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between lines with --start.")] = 1.0,
) -> None:
    """Turn raw training logs into a replay directory's logs.jsonl."""
    if interval <= 0:
        raise fail(f"--interval must be a positive number of seconds, not {interval:g}.")
    warnings: list[str] = []
    try:
        path, count = import_logs(
            files,
            out,
            job_id=job,
            node=node,
            year=year,
            start=None if start is None else parse_time(start, "--start"),
            interval=interval,
            warnings=warnings,
        )
    except LogImportError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"cannot write {out}: {exc.strerror or exc}.") from None
    for warning in warnings:
        err_console.print(f"warning: {warning}", soft_wrap=True)
    console.print(f"wrote {count} log records to {path}")


def main() -> None:
    app()


register_scenario_commands(app)
register_audit_command(app)
register_templates_command(app)
register_config_commands(app)
register_explain_command(app)
register_silence_commands(app)
register_stacks_command(app)
register_agent_commands(app)
register_bench_commands(app)
