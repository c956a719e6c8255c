"""From the demo to the console in one printed command: ``--dev``'s one-time sign-in link."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

from typer.testing import CliRunner

from tests.conftest import stop_process
from tests.support.tansu import free_port, start_trainguard
from trainguard.cli.app import app


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _get(url: str, cookie: str | None = None) -> tuple[int, Message, bytes]:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_the_demo_prints_the_console_command_and_its_one_time_link_signs_in_once(tmp_path: Path):
    out = tmp_path / "demo"
    demo = CliRunner().invoke(app, ["demo", "--out", str(out)], terminal_width=200)
    assert demo.exit_code == 0, demo.output
    (command,) = re.findall(r"trainguard (console --archive \S+ --dev)", demo.output)
    port = free_port()
    args = [*command.split(), "--port", str(port)]
    console = start_trainguard(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert console.stdout is not None
        deadline, link = time.monotonic() + 30, None
        while link is None and time.monotonic() < deadline:
            line = console.stdout.readline().decode()
            link = next(iter(re.findall(r"(http://127\.0\.0\.1:\d+/login\?token=\S+)", line)), None)
        assert link is not None
        base = link.split("/login")[0]
        for _ in range(50):  # until uvicorn listens
            try:
                status, _, _ = _get(f"{base}/healthz")
                break
            except OSError:
                time.sleep(0.2)
        assert _get(f"{base}/api/anomalies")[0] == 401  # nobody signed in
        assert _get(f"{base}/login?token=wrong")[0] == 401
        status, headers, _ = _get(link)
        assert status == 303 and headers["Location"] == "/"
        cookie = headers["Set-Cookie"].split(";")[0]
        assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=strict" in headers["Set-Cookie"]
        status, _, body = _get(f"{base}/api/anomalies", cookie)
        assert status == 200 and b"anomaly_id" in body  # the demo's archive
        status, _, body = _get(f"{base}/api/me", cookie)
        assert status == 200 and b'"role":"operator"' in body
        assert _get(link)[0] == 401  # the link worked once
        assert _get(f"{base}/api/anomalies", cookie.replace("dev.", "dev.0"))[0] == 401  # a forged cookie
    finally:
        stop_process(console)


def test_dev_mode_refuses_to_listen_beyond_this_machine(tmp_path: Path):
    result = CliRunner().invoke(app, ["console", "--archive", str(tmp_path), "--dev", "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--dev serves this machine only" in result.output
