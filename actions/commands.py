"""Running scheduler commands: argv lists only, a timeout, retries with backoff, every attempt recorded.

Nothing here ever goes through a shell. Over SSH, the remote side *does* run a
shell, so each argument is quoted for it (and ``BatchMode``/host-key checking keep
ssh from prompting or trusting a stranger).

>>> runner = CommandRunner(timeout_s=5, attempts=2, backoff_s=0.0)
>>> runner.run(["echo", "gpu-node-01; rm -rf /"]).stdout
'gpu-node-01; rm -rf /\\n'
>>> [a.ok for a in runner.last_attempts]
[True]
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Attempt:
    """One try of one command: what ran, how it ended, how long it took."""

    argv: tuple[str, ...]
    ok: bool
    returncode: int | None
    detail: str
    duration_s: float

    def as_dict(self) -> dict[str, object]:
        return {
            "argv": list(self.argv),
            "ok": self.ok,
            "returncode": self.returncode,
            "detail": self.detail,
            "duration_s": round(self.duration_s, 4),
        }


@dataclass(frozen=True)
class Completed:
    stdout: str
    attempts: tuple[Attempt, ...]


class CommandFailed(RuntimeError):
    """A command failed on every attempt; ``attempts`` says how each one ended."""

    def __init__(self, message: str, attempts: Sequence[Attempt]) -> None:
        super().__init__(message)
        self.attempts = tuple(attempts)


class GiveUp(Exception):
    """Raised by an attempt that retrying cannot help."""

    def __init__(self, attempt: Attempt) -> None:
        super().__init__(attempt.detail)
        self.attempt = attempt


def retry(
    what: str, attempts: int, backoff_s: float, once: Callable[[], tuple[Attempt, T]]
) -> tuple[T, tuple[Attempt, ...]]:
    """Call ``once`` until its attempt is ok: ``attempts`` tries, the wait doubling from ``backoff_s``."""
    tried: list[Attempt] = []
    delay = backoff_s
    for n in range(max(1, attempts)):
        if n:
            time.sleep(delay)
            delay *= 2
        try:
            attempt, result = once()
        except GiveUp as stop:
            tried.append(stop.attempt)
            break
        tried.append(attempt)
        if attempt.ok:
            return result, tuple(tried)
    raise CommandFailed(f"{what} failed after {len(tried)} attempt(s): {tried[-1].detail}", tried)


@dataclass
class CommandRunner:
    """Runs argv lists with a timeout and retries (``attempts`` tries, backoff doubling from ``backoff_s``)."""

    timeout_s: float = 30.0
    attempts: int = 3
    backoff_s: float = 1.0
    ssh_host: str | None = None
    bin_dir: str | None = None  # where the scheduler's tools live (default: PATH)
    env: Mapping[str, str] | None = None
    last_attempts: list[Attempt] = field(default_factory=list)

    def argv_for(self, argv: Sequence[str]) -> list[str]:
        if self.bin_dir is not None:
            argv = [f"{self.bin_dir.rstrip('/')}/{argv[0]}", *argv[1:]]
        if self.ssh_host is None:
            return list(argv)
        remote = " ".join(shlex.quote(a) for a in argv)
        return ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "--", self.ssh_host, remote]

    def run(self, argv: Sequence[str]) -> Completed:
        """Run until one attempt succeeds; raise :class:`CommandFailed` when all have failed."""
        full = tuple(self.argv_for(argv))

        def once() -> tuple[Attempt, str]:
            started = time.monotonic()
            try:
                proc = subprocess.run(
                    full, capture_output=True, text=True, timeout=self.timeout_s, env=self._env(), check=False
                )
            except subprocess.TimeoutExpired:
                return Attempt(full, False, None, f"timed out after {self.timeout_s:g} s", since(started)), ""
            except OSError as exc:  # the binary is missing: retrying will not help
                raise GiveUp(
                    Attempt(full, False, None, f"cannot run {full[0]}: {exc.strerror}", since(started))
                ) from None
            detail = (proc.stderr or proc.stdout).strip()[-300:]
            return Attempt(full, proc.returncode == 0, proc.returncode, detail, since(started)), proc.stdout

        try:
            stdout, tried = retry(" ".join(argv[:3]), self.attempts, self.backoff_s, once)
        except CommandFailed as exc:
            self.last_attempts = list(exc.attempts)
            raise
        self.last_attempts = list(tried)
        return Completed(stdout, tried)

    def _env(self) -> dict[str, str] | None:
        if self.env is None:
            return None
        import os

        return {**os.environ, **self.env}


def since(started: float) -> float:
    """Seconds on the monotonic clock since ``started``."""
    return time.monotonic() - started
