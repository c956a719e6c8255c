"""Event types of the wire contract and their decoder.

Every input record is one JSON object. :func:`decode` turns the raw bytes of a
record from one topic into a typed event, or into a :class:`DeadLetter` that
keeps the original bytes and says why it was refused. Decoding never raises,
so one bad producer cannot stop the flow.

>>> ev = decode("progress", b'{"ts": "2026-12-02T10:00:00Z", "job_id": 42, '
...             b'"node": "n1", "rank": 0, "step": 7}')
>>> ev.job_id, ev.step, ev.ts
('42', 7, 1796205600.0)
>>> bad = decode("progress", b'{"ts": 1796205600, "node": "n1"}')
>>> bad.reason
'Object missing required field `job_id`'
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from trainguard.detectors.lenient import FIELD_WARNINGS, coerce, parse_loose

# Records larger than this are refused: a 1 MB "log line" is a producer bug
# (a binary dump, a runaway traceback), and passing it on would let one record
# dominate memory in every downstream stage.
MAX_RECORD_BYTES = 256 * 1024

# Timestamps outside this range are certainly wrong (unit mix-ups such as
# milliseconds sent as seconds land far in the future).
MIN_TS = 946_684_800.0  # 2000-01-01T00:00:00Z
MAX_TS = 4_102_444_800.0  # 2100-01-01T00:00:00Z

# "stacks" last: the router breaks timestamp ties by topic index, and the older topics keep theirs.
TOPICS: tuple[str, ...] = ("logs", "progress", "gpu", "scheduler", "stacks")


class _Record(msgspec.Struct, kw_only=True, gc=False):
    """Common base: ``ts`` arrives as RFC 3339 text or epoch seconds.

    ``gc=False``: records hold only scalars and lists of strings, never cycles, so
    the garbage collector need not track the hundreds of thousands in flight.
    """

    ts: float | str


class LogRecord(_Record, kw_only=True):
    job_id: str | int | None = None
    node: str
    rank: int | None = None
    source: Literal["app", "kernel", "scheduler"] = "app"
    line: str


class ProgressRecord(_Record, kw_only=True):
    job_id: str | int
    node: str
    rank: int
    step: int
    step_time_s: float | None = None
    compute_time_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    # Where the rank sits in a pipeline-parallel job, when the producer knows: ranks of one
    # stage are peers; a whole stage slower than the others is a partitioning property.
    dp_rank: int | None = None
    pp_stage: int | None = None
    # The probe's own thread beats every few seconds, step or no step (``beat``: this record is
    # one, and ``step`` repeats the last step reported): a rank whose beats stop while its peers'
    # go on is a frozen or dead process. ``pid`` lets a launcher's "pid 5109 failed" name the rank.
    beat: bool = False
    pid: int | None = None


class GpuSample(_Record, kw_only=True):
    node: str
    gpu: int
    uuid: str | None = None
    pci_bus_id: str | None = None  # lets a kernel line's PCI address be named node/index
    util_pct: float | None = None
    mem_used_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    ecc_sbe_total: int | None = None
    ecc_dbe_total: int | None = None
    remapped_rows_pending: int | None = None
    remapped_rows_failed: int | None = None  # 1: a row could not be remapped (the GPU needs replacing)
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    pcie_replay_total: int | None = None
    nvlink_crc_total: int | None = None
    nvlink_replay_total: int | None = None
    nvlink_recovery_total: int | None = None
    throttle_reasons: int | list[str] | None = None
    xid: int | None = None
    # Set by the router, never by producers: the job the node runs at ``ts``.
    job_id: str | None = None


# One node's GPUs read in one sweep, as one ``gpu`` record: ``node``, ``gpus`` and each of GpuSample's
# metrics as a list aligned with ``gpus`` (null where a GPU did not report one). Derived from GpuSample,
# so the two forms of the topic never drift apart.
GpuSweep = msgspec.defstruct(
    "GpuSweep",
    [("node", str), ("gpus", list[int])]
    + [
        (f.name, list[f.type] | None, None)  # type: ignore[name-defined]
        for f in msgspec.structs.fields(GpuSample)
        if f.name not in ("ts", "node", "gpu", "job_id")
    ],
    bases=(_Record,),
    kw_only=True,
    module=__name__,
)


_SWEEP_COLUMNS = tuple(f for f in GpuSweep.__struct_fields__ if f not in ("ts", "node", "gpus"))
_encode = msgspec.json.Encoder().encode


class JobEvent(_Record, tag_field="kind", tag="job", kw_only=True):
    job_id: str | int
    state: str
    nodes: list[str] = []
    ranks_per_node: int | None = None
    exit_code: int | None = None
    partition: str | None = None


class NodeEvent(_Record, tag_field="kind", tag="node", kw_only=True):
    node: str
    state: str
    reason: str | None = None
    job_id: str | None = None


class StackFrame(msgspec.Struct, kw_only=True, gc=False):
    """One frame of a Python stack, as py-spy reports it (no locals, no addresses)."""

    name: str
    filename: str = ""
    line: int | None = None


class ThreadStack(msgspec.Struct, kw_only=True, gc=False):
    """One thread of a dumped process; ``frames`` innermost first. ``tid``: the OS thread id (the
    main thread's is the process id)."""

    name: str | None = None
    tid: int | None = None
    active: bool | None = None
    owns_gil: bool | None = None
    frames: list[StackFrame] = []


class StacksRecord(_Record, kw_only=True):
    """One process of a job, dumped by ``trainguard collect-stacks`` (py-spy) on its node.

    ``state``: the process state the kernel reports (``running``, ``sleeping``, ``disk``,
    ``stopped``, ``zombie``), or ``gone`` when the rank was expected on the node and no process
    has it. ``error``: why it could not be dumped (then ``threads`` is empty). ``request``: the
    ``diagnose`` action this dump answers, if any.
    """

    job_id: str | int
    node: str
    rank: int | None = None
    pid: int | None = None
    state: str | None = None
    threads: list[ThreadStack] = []
    error: str | None = None
    request: str | None = None


Event = LogRecord | ProgressRecord | GpuSample | JobEvent | NodeEvent | StacksRecord


class DeadLetter(msgspec.Struct, kw_only=True, gc=False):
    """A refused input record: the original bytes, where it came from, and why."""

    topic: str
    partition: int
    offset: int
    reason: str
    payload: bytes
    ts: float | None = None


_TYPES: dict[str, Any] = {
    "logs": LogRecord,
    "progress": ProgressRecord,
    "gpu": GpuSample,
    "scheduler": JobEvent | NodeEvent,
    "stacks": StacksRecord,
}


def _optional_numbers(struct: type) -> dict[str, type]:
    """The optional numeric fields of a record type: the ones read leniently."""
    out: dict[str, type] = {}
    for f in msgspec.structs.fields(struct):
        if f.required or f.name == "ts":
            continue
        if f.type in (float | None, int | None):
            out[f.name] = float if f.type == float | None else int
        elif f.type is bool:  # a flag (a progress record's ``beat``): unclear reads as False
            out[f.name] = bool
        elif f.name == "throttle_reasons":
            out[f.name] = int
    return out


_OPTIONAL: dict[str, dict[str, type]] = {
    "progress": _optional_numbers(ProgressRecord),
    "gpu": _optional_numbers(GpuSample),
}

_DECODERS: dict[str, msgspec.json.Decoder] = {
    "logs": msgspec.json.Decoder(LogRecord),
    "progress": msgspec.json.Decoder(ProgressRecord),
    "gpu": msgspec.json.Decoder(GpuSample),
    "scheduler": msgspec.json.Decoder(JobEvent | NodeEvent),
    "stacks": msgspec.json.Decoder(StacksRecord),
}


# Terminal escape sequences (colours, cursor moves, window titles) that coloured loggers print:
# what a line says is its text, so they never split a word a signature looks for.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[ -/]+[0-~]|[@-Z\\-_])")


def strip_ansi(line: str) -> str:
    """``line`` without terminal escape sequences.

    >>> strip_ansi("\x1b[1;31mRuntimeError\x1b[0m: CUDA error"), strip_ansi("\x1b[31mValueError\x1b(B\x1b[m: bad")
    ('RuntimeError: CUDA error', 'ValueError: bad')
    """
    return _ANSI.sub("", line)


# A log line wrapped in JSON by its transport (Docker's json-file driver and Fluentd put it under
# "log", ``journalctl -o json`` under "MESSAGE"): what it says is the wrapped line. A structured
# logger's own record (python-json-logger, structlog) is left whole: its level, message and
# exception are read together, as they were logged, and a handled warning stays a warning.
_TRANSPORT_KEYS = ("log", "MESSAGE")
_json_object = msgspec.json.Decoder(dict[str, Any])


def unwrap_transport(line: str) -> str:
    """The line a transport's JSON record wraps; any other line unchanged.

    >>> unwrap_transport('{"log":"Killed\\\\n","stream":"stderr","time":"2024-05-01T12:00:00Z"}')
    'Killed'
    >>> unwrap_transport('{"levelname": "ERROR", "message": "step failed"}')
    '{"levelname": "ERROR", "message": "step failed"}'
    >>> unwrap_transport('{"step": 10, "loss": 1.25}'), unwrap_transport("step 10 loss 1.25")
    ('{"step": 10, "loss": 1.25}', 'step 10 loss 1.25')
    >>> unwrap_transport('{"log": broken JSON}')  # not JSON after all: read as it was printed
    '{"log": broken JSON}'
    """
    stripped = line.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return line
    try:
        record = _json_object.decode(stripped)
    except msgspec.DecodeError:
        return line
    for key in _TRANSPORT_KEYS:
        text = record.get(key)
        if type(text) is str:
            return text.rstrip("\r\n")
    return line


def parse_ts(value: float | str) -> float:
    """Return epoch seconds for an RFC 3339 string or a number.

    >>> parse_ts("2026-12-02T10:00:00.5Z")
    1796205600.5
    >>> parse_ts(1796205600)
    1796205600.0
    """
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"`ts` {value[:64]!r} is not RFC 3339 or epoch seconds") from None
        if parsed.tzinfo is None:
            raise ValueError(f"`ts` {value[:64]!r} has no timezone (append Z for UTC)")
        return parsed.timestamp()
    ts = float(value)
    if not math.isfinite(ts):
        raise ValueError("`ts` is not a finite number")
    return ts


def decode(topic: str, payload: bytes | str | None, partition: int = 0, offset: int = 0) -> Event | DeadLetter:
    """Decode one record of ``topic``; never raises. A ``gpu`` record with ``gpus`` is a node's sweep
    (:class:`GpuSweep`): it decodes to a :class:`~trainguard.detectors.frames.GpuFrame`."""
    raw = payload if type(payload) is bytes else (payload.encode() if isinstance(payload, str) else payload or b"")
    if topic == "gpu" and b'"gpus"' in raw:
        return _sweep(raw, partition, offset)
    decoder = _DECODERS.get(topic)
    reason = None
    if decoder is None:
        reason = f"unknown topic {topic!r}; expected one of {', '.join(TOPICS)}"
    elif len(raw) > MAX_RECORD_BYTES:
        reason = f"record is {len(raw)} bytes, over the {MAX_RECORD_BYTES}-byte limit"
    else:
        try:
            try:
                event = decoder.decode(raw)
            except msgspec.DecodeError:
                event = _lenient(topic, raw)
            reason = _settled(event)
        except (msgspec.DecodeError, ValueError, OverflowError) as exc:
            reason = "empty record" if not raw or raw.isspace() else str(exc)
        if reason is None:
            return event
    return DeadLetter(topic=topic, partition=partition, offset=offset, reason=reason, payload=raw)


def _settled(event: Any) -> str | None:
    """A decoded record made ready for the flow (its ``ts`` as epoch seconds, a transport's wrapping and
    colour codes off a log line, a numeric job id as text); or why it is refused. Raises ``ValueError``
    for a timestamp that is not one."""
    ts = event.ts
    if type(ts) is not float:
        ts = parse_ts(ts)
    elif ts != ts or ts in (math.inf, -math.inf):
        raise ValueError("`ts` is not a finite number")
    event.ts = ts
    if not MIN_TS <= ts <= MAX_TS:
        return f"`ts` {ts!r} is outside 2000..2100; is it in milliseconds?"
    if type(event) is LogRecord and (line := event.line) and (line[0] == "{" or "\x1b" in line):
        # Unwrapped first: JSON escapes the colour codes the wrapped line carries.
        line = unwrap_transport(line)
        event.line = strip_ansi(line) if "\x1b" in line else line
    job_id = getattr(event, "job_id", None)
    if job_id is not None and type(job_id) is not str:
        event.job_id = str(job_id)
    return None


def decode_block(topic: str, block: bytes) -> list[Event] | None:
    """Every line of ``block`` (whole lines, each ending in a newline) decoded at once — exactly what
    :func:`decode` gives each line — or ``None`` when some line needs reading on its own (one that is
    not a lone object, or over-long; a sweep; a record the strict decoder refuses or the flow would
    refuse)."""
    decoder = _DECODERS.get(topic)
    if decoder is None or (topic == "gpu" and b'"gpus"' in block):
        return None
    lines = record_lines(block)
    if lines is None:
        return None
    try:
        events = decoder.decode_lines(block)
        if len(events) != lines or not (_all_settled(events) or _each_settled(events)):
            return None
    except (msgspec.DecodeError, ValueError, OverflowError):
        return None
    return events


def record_lines(block: bytes) -> int | None:
    """How many lines ``block`` holds, when a whole-block reader may take it: whole lines, none over the
    record limit, each starting with ``{``, no carriage return; else ``None`` (the record path knows what
    to do with those). A line starting otherwise — blank, spaces, anything before its object — must be
    read on its own: a reader would skip a blank line, and two records glued on another line would then
    make up for it in the count."""
    if b"\r" in block:
        return None
    data = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(data == 10)  # one pass: the lines' count, starts and lengths
    if not len(ends) or ends[-1] != len(block) - 1:
        return None
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if (data[starts] != _OPEN_BRACE).any() or int((ends - starts).max()) > MAX_RECORD_BYTES:
        return None
    return len(ends)


_OPEN_BRACE = ord("{")


def _each_settled(events: list[Any]) -> bool:
    """:func:`_settled` on each record: whether the flow takes every one."""
    return not any(_settled(event) is not None for event in events)


def _all_settled(events: list[Any]) -> bool:
    """Whether records need no settling at all — what :func:`_settled` would find of each, asked of the whole
    block at once: every ``ts`` a number in range, every job id text, no log line. ``False``: ask each."""
    if not events or LogRecord in {type(event) for event in events}:
        return False
    ts = np.array([event.ts for event in events])
    if ts.dtype != np.float64 or not ((ts >= MIN_TS) & (ts <= MAX_TS)).all():  # (NaN fails too; a text ts: not float)
        return False
    return {type(getattr(event, "job_id", None)) for event in events} <= {str, type(None)}


def _sweep(raw: bytes, partition: int, offset: int) -> Any:
    """A node's sweep as one frame: each GPU's record is read as if it had come alone (strictly, else
    with the lenient rules and their counters), so a sweep and its GPUs' records say the same."""
    from trainguard.detectors.frames import GpuFrame

    def refused(reason: str) -> DeadLetter:
        return DeadLetter(topic="gpu", partition=partition, offset=offset, reason=f"GPU sweep: {reason}", payload=raw)

    if len(raw) > MAX_RECORD_BYTES:
        return refused(f"record is {len(raw)} bytes, over the {MAX_RECORD_BYTES}-byte limit")
    try:
        try:
            record = _json_object.decode(raw)
        except msgspec.DecodeError:
            record = parse_loose(raw)  # NaN, Infinity: the GPUs' own records null them
    except (msgspec.DecodeError, ValueError) as exc:
        return refused(str(exc))
    if not isinstance(record, dict):
        return refused("expected a JSON object")
    gpus = record.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return refused("`gpus` must be a non-empty list of GPU indexes")
    columns: dict[str, list[Any]] = {}
    for name in _SWEEP_COLUMNS:
        values = record.get(name)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != len(gpus):
            return refused(f"`{name}` must be a list with one value per GPU ({len(gpus)})")
        # NaN and Infinity go on as text, so each GPU's record nulls and counts them as it would alone.
        columns[name] = [str(v) if isinstance(v, float) and not math.isfinite(v) else v for v in values]
    head = {"ts": record.get("ts"), "node": record.get("node")}
    samples = []
    for i, gpu in enumerate(gpus):
        sample = decode(
            "gpu", _encode({**head, "gpu": gpu, **{k: v[i] for k, v in columns.items()}}), partition, offset
        )
        if type(sample) is DeadLetter:
            return refused(sample.reason)
        samples.append(sample)
    return GpuFrame.from_samples(samples)  # type: ignore[arg-type]


def _lenient(topic: str, raw: bytes) -> Event:
    """The strict decoder refused the record: read it again, coercing or nulling odd optional fields
    (see :mod:`detectors.lenient`); raises the strict error when a required field is unusable."""
    try:
        record = parse_loose(raw)
    except ValueError:
        return _DECODERS[topic].decode(raw)  # not JSON at all: the strict decoder's own error
    if not isinstance(record, dict):
        return _DECODERS[topic].decode(raw)
    optional = _OPTIONAL.get(topic, {})
    if isinstance(record.get("throttle_reasons"), list):
        optional = {k: v for k, v in optional.items() if k != "throttle_reasons"}
    record, notes = coerce(record, optional)
    # A required field that is still unusable raises here, naming that field.
    event: Event = msgspec.convert(record, _TYPES[topic], strict=False)
    for name in notes:
        FIELD_WARNINGS[(topic, name)] += 1
    return event


# ---------------------------------------------------------------- outputs


# The output contract's version: bumped whenever an output record changes shape or meaning
# (docs/schemas/ holds the JSON Schema of every version's records; a test checks both).
# 4: the gpu topic takes a node's sweep as one record; 3: localisation, stack_groups, revised_at, diagnose.
SCHEMA_VERSION = 4

Kind = Literal["crash", "hang", "straggler", "imbalance", "numerics", "gpu_degraded", "node_unhealthy"]
Layer = Literal["hardware", "system", "application", "unknown"]
Severity = Literal["info", "warning", "critical"]
# Categories are open-ended (the signature catalogue grows; every Xid code has its own), so
# they are a pattern, not a list: lowercase words and digits.
Category = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_]+$")]


class StackGroup(msgspec.Struct, kw_only=True, gc=False):
    """Ranks whose Python stacks read the same (see :mod:`detectors.stacks`).

    ``where``: the stack in a few words (``all_reduce ← train_step ← main``); ``frames``: a
    representative stack, innermost first, a few frames; ``state``: ``stopped``, ``gone`` or
    ``zombie`` when the processes are not merely waiting; ``outlier``: this group is blamed.
    """

    ranks: list[int] = []
    nodes: list[str] = []
    processes: int = 0
    where: str = ""
    frames: list[str] = []
    state: str | None = None
    outlier: bool = False


class Anomaly(msgspec.Struct, kw_only=True, gc=False):
    """An anomaly, open or resolved.

    An anomaly is published when it opens and again, under the same ``anomaly_id``, when it
    resolves (``resolved_at`` and ``resolution`` set: progress resumed, the job ended, the node
    returned to service). Consumers keep the latest record per id. ``severity``: only
    ``critical`` anomalies are acted on; ``warning`` and ``info`` ones are notified at most.
    ``remedy``: what the node needs when known (NVIDIA's vocabulary for Xids).

    ``localisation``: what named ``ranks``/``nodes`` when a detector's own view could not
    (``stacks``: the ranks' Python stacks; ``heartbeats``, ``progress``), ``None`` otherwise.
    A hang is published again, still open, when its ranks' stacks arrive (``revised_at`` set,
    ``stack_groups`` filled): a revision, not a new anomaly.
    """

    anomaly_id: str
    detected_at: float
    onset_ts: float | None = None
    kind: Kind
    category: Category
    layer: Layer = "unknown"
    transient: bool | None = None
    job_id: str | None = None
    nodes: list[str] = []
    ranks: list[int] = []
    gpus: list[str] = []
    confidence: float = 0.5
    evidence: list[str] = []
    severity: Severity = "critical"
    remedy: str | None = None
    resolved_at: float | None = None
    resolution: str | None = None
    summary: str = ""  # one line for people (see detectors.describe)
    runbook_url: str | None = None
    localisation: str | None = None
    stack_groups: list[StackGroup] = []
    revised_at: float | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def resolved(self) -> bool:
        return self.resolved_at is not None


class Tick(msgspec.Struct, frozen=True, gc=False):
    """The event-time clock passed ``watermark``: deadlines up to it may fire.

    ``final``: the input has ended (the end of a replay, a clean shutdown). Holds that wait
    for the clock are released; the end of the data is not a hang.
    """

    watermark: float
    final: bool = False
