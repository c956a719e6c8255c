"""``trainguard console``: the operators' live dashboard (Starlette, server-sent events, no CDN).

Every page and API call needs a configured user (bearer token or basic auth), or the
session cookie that ``--dev``'s printed one-time link sets;
approving or rejecting a recommendation needs the ``operator`` role and a CSRF
token (an HMAC of the user name with a per-process secret) in the
``X-CSRF-Token`` header — a cross-site form cannot set it. Approvals go through
the same executor as enforce mode: inventory check, breaker, intent/outcome audit,
with the user's name on every entry.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import math
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from trainguard.actions.executor import ActionExecutor, ApprovalError
from trainguard.actions.silences import SilenceError, Silences, parse_duration
from trainguard.console.data import ConsoleData
from trainguard.console.passwords import verify_password
from trainguard.dataflows.config import ConsoleUser, Settings

STATIC = Path(__file__).resolve().parent / "static"
INVENTORY_TTL_S = 2.0  # a scheduler inventory read serves every view of one page refresh
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


SESSION_COOKIE = "trainguard_session"


class Auth:
    """Resolves a request's user from ``Authorization`` (Bearer or Basic) or a session cookie;
    constant-time comparisons.

    A session cookie is given once, by ``/login?token=…``, for the one-time token that
    ``trainguard console --dev`` prints (like Jupyter's): the token works a single time, the
    cookie for as long as this process runs (it is an HMAC under the process's secret).
    """

    def __init__(self, users: list[ConsoleUser], one_time_token: str | None = None) -> None:
        self.users = users
        self.secret = secrets.token_bytes(32)
        self._one_time = sha256_hex(one_time_token) if one_time_token else None
        # A browser sends the password with every request, and scrypt takes ~50 ms on
        # purpose: remember the passwords already verified, as HMACs under this
        # process's secret (never the passwords themselves).
        self._verified: set[bytes] = set()

    def sign_in(self, token: str) -> ConsoleUser | None:
        """The first user, for the one-time token (which then stops working); ``None`` otherwise."""
        if self._one_time is None or not token or not self.users:
            return None
        if not hmac.compare_digest(self._one_time, sha256_hex(token)):
            return None
        self._one_time = None
        return self.users[0]

    def session(self, user: ConsoleUser) -> str:
        mac = hmac.new(self.secret, b"session\0" + user.name.encode(), hashlib.sha256).hexdigest()
        return f"{user.name}.{mac}"

    def user(self, request: Request) -> ConsoleUser | None:
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            name = cookie.rpartition(".")[0]
            found = next((u for u in self.users if u.name == name), None)
            if found is not None and hmac.compare_digest(cookie, self.session(found)):
                return found
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value:
            digest = sha256_hex(value.strip())
            return next((u for u in self.users if u.token_sha256 and hmac.compare_digest(u.token_sha256, digest)), None)
        if scheme.lower() == "basic" and value:
            try:
                name, _, password = base64.b64decode(value).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            return next((u for u in self.users if u.name == name and self._password_ok(u, password)), None)
        return None

    def _password_ok(self, user: ConsoleUser, password: str) -> bool:
        if user.password_scrypt:
            seen = hmac.new(self.secret, f"{user.name}\0{password}".encode(), hashlib.sha256).digest()
            if seen in self._verified:
                return True
            if not verify_password(user.password_scrypt, password):
                return False
            if len(self._verified) > 1024:
                self._verified.clear()
            self._verified.add(seen)
            return True
        if not user.password_sha256:
            return False
        return hmac.compare_digest(user.password_sha256, sha256_hex(password))

    def csrf(self, user: ConsoleUser) -> str:
        return hmac.new(self.secret, user.name.encode(), hashlib.sha256).hexdigest()


class _Headers(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: Any) -> Response:
        response = await call_next(request)
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response


def create_app(
    settings: Settings,
    data: ConsoleData,
    executor: ActionExecutor | None,
    poll_s: float = 0.5,
    one_time_token: str | None = None,
) -> Starlette:
    """The console; ``one_time_token``: ``/login?token=`` signs the first user in once (``--dev``)."""
    auth = Auth(settings.console.users, one_time_token)
    lock = asyncio.Lock()  # one approval at a time: the executor is not re-entrant

    def silences() -> Silences | None:  # the executor's: the same file the flow reads
        return getattr(executor, "silences", None) if executor is not None else None

    def guarded(handler: Any, operator: bool = False) -> Any:
        async def endpoint(request: Request) -> Response:
            user = await run_in_threadpool(auth.user, request)  # scrypt must not stall the event loop
            if user is None:
                return JSONResponse(
                    {"error": "sign in"}, status_code=401, headers={"WWW-Authenticate": 'Basic realm="trainguard"'}
                )
            if operator:
                if user.role != "operator":
                    return JSONResponse({"error": f"{user.name} is a viewer; this needs the operator role"}, 403)
                if not hmac.compare_digest(request.headers.get("x-csrf-token", ""), auth.csrf(user)):
                    return JSONResponse({"error": "missing or wrong X-CSRF-Token"}, status_code=403)
            return await handler(request, user)

        return endpoint

    async def login(request: Request) -> Response:
        user = auth.sign_in(request.query_params.get("token", ""))
        if user is None:
            return JSONResponse(
                {"error": "this sign-in link is wrong or was already used; start trainguard console --dev again"},
                status_code=401,
            )
        response = Response(status_code=303, headers={"Location": "/"})
        response.set_cookie(SESSION_COOKIE, auth.session(user), httponly=True, samesite="strict", path="/")
        return response

    async def index(request: Request, user: ConsoleUser) -> Response:
        return FileResponse(STATIC / "index.html")

    async def me(request: Request, user: ConsoleUser) -> Response:
        modes = [{"scope": "cluster", "mode": settings.policy.mode}] + [
            {"scope": f"partition {s.partition}" if s.partition else f"jobs {s.job}", "mode": s.mode}
            for s in settings.policy.scopes
        ]
        return JSONResponse(
            {
                "user": user.name,
                "role": user.role,
                "csrf": auth.csrf(user),
                "modes": modes,
                "driver": settings.scheduler.driver,
            }
        )

    inventory_lock = asyncio.Lock()
    inventory_read: list[Any] = [-math.inf, None, None]  # when, the inventory, the error

    async def scheduler_inventory() -> tuple[Any, str | None]:
        """The scheduler's own view (``None, None`` without a driver), read at most once every
        ``INVENTORY_TTL_S``: one page refresh asks for it twice (the overview and the cluster map)."""
        if executor is None or executor.driver is None:
            return None, None
        async with inventory_lock:
            if time.monotonic() - inventory_read[0] > INVENTORY_TTL_S:
                try:
                    inventory_read[1:] = [await asyncio.to_thread(executor.inventory), None]
                except Exception as exc:
                    inventory_read[1:] = [None, str(exc)[:200]]
                inventory_read[0] = time.monotonic()
            return inventory_read[1], inventory_read[2]

    async def overview(request: Request, user: ConsoleUser) -> Response:
        summary = data.overview()
        inventory, error = await scheduler_inventory()
        if error is not None:
            summary["scheduler"] = {"error": error}
        elif inventory is not None:  # the scheduler's own view, when the console can reach it
            summary["scheduler"] = {
                "jobs_running": sum(1 for j in inventory.jobs.values() if j.state == "RUNNING"),
                "nodes": len(inventory.nodes),
                "nodes_unavailable": sum(1 for n in inventory.nodes.values() if n.unavailable),
            }
        return JSONResponse(summary)

    async def anomalies(request: Request, user: ConsoleUser) -> Response:
        return JSONResponse(data.feed(int(request.query_params.get("limit", "100"))))

    async def job(request: Request, user: ConsoleUser) -> Response:
        return JSONResponse(data.job(request.path_params["job_id"]))

    async def nodes(request: Request, user: ConsoleUser) -> Response:
        return JSONResponse(data.nodes())

    async def incidents(request: Request, user: ConsoleUser) -> Response:
        q = request.query_params
        try:
            offset = max(0, int(q.get("offset", "0")))
            limit = min(200, max(1, int(q.get("limit", "25"))))
            since = float(q["since"]) if q.get("since") else None
        except ValueError:
            return JSONResponse({"error": "offset and limit are whole numbers, since is epoch seconds"}, 400)
        filters = {k: q[k] for k in ("kind", "layer", "node", "job", "status") if q.get(k)}
        if filters.get("status") not in (None, "open", "resolved"):
            return JSONResponse({"error": "status is open or resolved"}, status_code=400)
        return JSONResponse(data.incidents(filters, since, offset, limit))

    async def trends(request: Request, user: ConsoleUser) -> Response:
        try:
            since = float(request.query_params["since"]) if request.query_params.get("since") else None
        except ValueError:
            return JSONResponse({"error": "since is epoch seconds"}, status_code=400)
        return JSONResponse(data.trends(since))

    async def cluster(request: Request, user: ConsoleUser) -> Response:
        view = data.cluster_map()
        view["scheduler"] = None
        inventory, error = await scheduler_inventory()  # the scheduler's own word on each node
        if error is not None:
            view["scheduler"] = {"error": error}
        elif inventory is not None and executor is not None and executor.driver is not None:
            view["scheduler"] = {"driver": executor.driver.name}
            for row in view["nodes"]:
                info = inventory.nodes.get(row["node"])
                drained = " (drained)" if info is not None and info.drained else ""
                row["scheduler_state"] = None if info is None else info.state + drained
        return JSONResponse(view)

    async def node(request: Request, user: ConsoleUser) -> Response:
        return JSONResponse(data.node(request.path_params["node"]))

    async def audit(request: Request, user: ConsoleUser) -> Response:
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
            limit = min(500, max(1, int(request.query_params.get("limit", "50"))))
        except ValueError:
            return JSONResponse({"error": "offset and limit are whole numbers"}, status_code=400)
        return JSONResponse(data.audit_trail(offset, limit))

    async def pending(request: Request, user: ConsoleUser) -> Response:
        return JSONResponse(data.pending())

    async def decide(request: Request, user: ConsoleUser) -> Response:
        verb = request.path_params["verb"]
        if verb not in ("approve", "reject"):
            return JSONResponse({"error": "no such decision: use approve or reject"}, status_code=404)
        if executor is None:
            return JSONResponse({"error": "the console has no audit log to act through"}, status_code=409)
        decision = data.decision(request.path_params["action_id"])
        if decision is None:
            return JSONResponse({"error": "no such action"}, status_code=404)
        try:
            body = await request.json() if verb == "reject" else {}
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, status_code=400)
        anomaly, action = decision
        async with lock:
            try:
                if verb == "approve":
                    done = await asyncio.to_thread(executor.approve, anomaly, action, user.name)
                else:
                    done = executor.reject(anomaly, action, user.name, str(body.get("reason", ""))[:500])
            except ApprovalError as exc:
                return JSONResponse({"error": str(exc)}, status_code=409)
        data.refresh()
        return JSONResponse(msgspec.to_builtins(done))

    async def silence_list(request: Request, user: ConsoleUser) -> Response:
        store = silences()
        if store is None:
            return JSONResponse([])
        now = time.time()
        return JSONResponse([{**msgspec.to_builtins(s), "active": s.active(now)} for s in store.all()])

    async def silence_add(request: Request, user: ConsoleUser) -> Response:
        store = silences()
        if store is None:
            return JSONResponse({"error": "the console has no audit log, so no silences file"}, status_code=409)
        try:
            body = await request.json()
            matchers = {k: str(body[k])[:200] for k in ("node", "job", "kind", "partition") if body.get(k)}
            silence = store.add(
                duration_s=parse_duration(str(body.get("duration", ""))),
                reason=str(body.get("reason", ""))[:500],
                by=user.name,
                **matchers,
            )
        except (ValueError, AttributeError) as exc:  # SilenceError is a ValueError; so is a body that is not JSON
            return JSONResponse({"error": str(exc) or "the body must be JSON"}, status_code=400)
        data.refresh()
        return JSONResponse(msgspec.to_builtins(silence))

    async def silence_expire(request: Request, user: ConsoleUser) -> Response:
        store = silences()
        if store is None:
            return JSONResponse({"error": "the console has no audit log, so no silences file"}, status_code=409)
        try:
            silence = store.expire(request.path_params["silence_id"], by=user.name)
        except SilenceError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        data.refresh()
        return JSONResponse(msgspec.to_builtins(silence))

    async def events(request: Request, user: ConsoleUser) -> Response:
        async def stream() -> AsyncIterator[bytes]:
            seen, quiet = -1, 0.0
            while not await request.is_disconnected():
                if data.version != seen:
                    seen, quiet = data.version, 0.0
                    yield f"event: update\ndata: {seen}\n\n".encode()
                elif quiet >= 5.0:  # a sign of life the page can see: it tells "live" from "stale"
                    quiet = 0.0
                    yield f"event: tick\ndata: {seen}\n\n".encode()
                else:
                    yield b": keep-alive\n\n"
                await asyncio.sleep(poll_s)
                quiet += poll_s

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})

    async def healthz(request: Request) -> Response:
        return Response("ok\n", media_type="text/plain")

    async def refresher() -> None:
        while True:
            await asyncio.to_thread(data.refresh)
            await asyncio.sleep(poll_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(refresher())
        try:
            yield
        finally:
            task.cancel()

    routes = [
        Route("/", guarded(index)),
        Route("/healthz", healthz),
        Route("/login", login),
        Route("/api/me", guarded(me)),
        Route("/api/overview", guarded(overview)),
        Route("/api/anomalies", guarded(anomalies)),
        Route("/api/jobs/{job_id}", guarded(job)),
        Route("/api/nodes", guarded(nodes)),
        Route("/api/cluster", guarded(cluster)),
        Route("/api/incidents", guarded(incidents)),
        Route("/api/trends", guarded(trends)),
        Route("/api/nodes/{node}", guarded(node)),
        Route("/api/audit", guarded(audit)),
        Route("/api/pending", guarded(pending)),
        Route("/api/actions/{action_id}/{verb:str}", guarded(decide, operator=True), methods=["POST"]),
        Route("/api/silences", guarded(silence_list)),
        Route("/api/silences", guarded(silence_add, operator=True), methods=["POST"]),
        Route("/api/silences/{silence_id}/expire", guarded(silence_expire, operator=True), methods=["POST"]),
        Route("/api/events", guarded(events)),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_Headers)], lifespan=lifespan)
