"""Any environment over HTTP, in OpenEnv's protocol (``episodes.env.type: http``), so an OpenEnv server plugs
in unchanged.

OpenEnv (PyPI ``openenv`` 0.10, ``openenv.core.env_server``) keeps an episode's state in a WebSocket session at
``{url}/ws`` (its HTTP ``/reset`` and ``/step`` make a fresh environment per request, so they cannot carry an
episode): messages ``{"type": "reset", "data": {"seed", "episode_id", …}}``, ``{"type": "step", "data":
action}``, ``{"type": "state"}``, ``{"type": "close"}``; replies ``{"type": "observation", "data":
{"observation": {…}, "reward": float | null, "done": bool}}``, ``{"type": "state", "data": {"episode_id",
"step_count", …}}`` or ``{"type": "error", "data": {"message", "code"}}``. ``GET {url}/schema`` gives the
action's JSON schema (the chat format's tool description). Ours, beside it: ``POST {url}/verify`` with the
episode's transcript, answered ``{"reward": float}`` — called by us after the episode when ``verify`` is on,
never a tool the model can reach.

One session per episode, opened at the episode's start, closed at its end. The model never talks to the
server: we sample, parse its call (trainer.episodes' one parser), send the action and append the observation
as tokens with loss 0. The server is untrusted: its URL passes the operator's allow-list (trainer.envs.net,
every resolved address checked, the connection made to a checked address); every call has ``timeout_s``;
replies are bounded by ``max_body_bytes`` and checked field by field; the episode id it reports must be ours;
calls in flight are capped per job (``max_concurrency``) and per tenant across jobs (``RLVR_ENV_MAX_SESSIONS``:
slots held in a shared Redis across machines, each hold lapsing after its call's bound, or as file locks on one
machine, so a crashed worker's slots free themselves). Anything wrong — a timeout, a crash,
a refused or vanished connection, malformed JSON, a huge body, a wrong id, an error that is not the action's
fault — is an ``infra_error``: the episode is left out of its group and the loss (never scored 0), and the
reason is counted for the job's warnings (``errors``).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import net
from .base import Reply

SLOTS_DIR_ENV, MAX_SESSIONS_ENV, TENANT_ENV = "RLVR_ENV_SLOTS_DIR", "RLVR_ENV_MAX_SESSIONS", "RLVR_ENV_TENANT"
SLOTS_REDIS_ENV = "RLVR_ENV_SLOTS_REDIS"  # a Redis URL: the cap holds across every worker machine using it


class EnvFailed(Exception):
    """The environment misbehaved: the episode is an infra_error (the message is for the job's warnings)."""


class ActionRefused(Exception):
    """The server refused the model's action (its schema said no): the model reads why."""


class Slots:
    """At most ``n`` calls in flight for one tenant across every process of this machine: ``n`` lock files,
    one held per call (a process that dies lets its locks go)."""

    def __init__(self, tenant: str, n: int, root: str):
        key = hashlib.sha256(tenant.encode()).hexdigest()[:16]  # a tenant name never becomes a path
        self.dir = os.path.join(root, key)
        os.makedirs(self.dir, exist_ok=True)
        self.n = n

    def acquire(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            for k in range(self.n):
                fd = os.open(os.path.join(self.dir, f"slot-{k}"), os.O_CREAT | os.O_RDWR, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    os.close(fd)
            if time.monotonic() > deadline:
                raise EnvFailed(f"the tenant's environment calls stayed at their cap ({self.n}, {MAX_SESSIONS_ENV}) "
                                f"for {timeout_s:g} s")
            time.sleep(0.01)

    def release(self, fd: int) -> None:
        os.close(fd)  # closing the descriptor drops its lock


# KEYS[1]: the tenant's sorted set (member: a holder's token, score: when its hold lapses, in Redis' clock);
# ARGV: cap, hold seconds, token. Lapsed holds (a worker that died mid-call) are dropped first.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 60)
  return 1
end
return 0
"""


class RedisSlots:
    """At most ``n`` calls in flight for one tenant across every worker machine that shares this Redis: a
    sorted set of holders, each hold lapsing after ``hold_s`` (longer than one call can take, so a worker that
    dies mid-call frees its slot then). Same interface as :class:`Slots`."""

    def __init__(self, tenant: str, n: int, url: str, hold_s: float):
        import redis

        key = hashlib.sha256(tenant.encode()).hexdigest()[:16]
        self.key, self.n, self.hold_s = f"rlvr:env-slots:{key}", n, hold_s
        self.r = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        self.script = self.r.register_script(_ACQUIRE)

    def acquire(self, timeout_s: float) -> str:
        token = os.urandom(12).hex()
        deadline = time.monotonic() + timeout_s
        while not self.script(keys=[self.key], args=[self.n, self.hold_s, token]):
            if time.monotonic() > deadline:
                raise EnvFailed(f"the tenant's environment calls stayed at their cap ({self.n}, {MAX_SESSIONS_ENV}, "
                                f"across workers) for {timeout_s:g} s")
            time.sleep(0.01)
        return token

    def release(self, token: str) -> None:
        self.r.zrem(self.key, token)


def slots(tenant: str, n: int, timeout_s: float) -> Slots | RedisSlots:
    """The tenant's cap: across machines where the operator named a Redis (RLVR_ENV_SLOTS_REDIS; the worker
    sets it to a Redis broker), else across this machine's processes."""
    url = os.environ.get(SLOTS_REDIS_ENV)
    if url:
        # a hold outlives its call: connect + the call (each bounded by timeout_s) and the slot wait itself
        return RedisSlots(tenant, n, url, hold_s=3 * timeout_s + 10)
    return Slots(tenant, n, os.environ.get(SLOTS_DIR_ENV, "/tmp/rlvr-env-slots"))


class Session:
    """One episode's WebSocket session with the server."""

    def __init__(self, env: "HttpEnvironment", episode_id: str):
        from websockets.sync.client import connect

        c, t = env.cfg, env.target
        sock = net.connect(t, c.timeout_s)
        scheme = "wss" if t.scheme == "https" else "ws"
        host = f"[{t.host}]" if ":" in t.host else t.host
        self.stack = contextlib.ExitStack()
        try:
            self.ws = self.stack.enter_context(connect(
                f"{scheme}://{host}:{t.port}{t.path}/ws", sock=sock, open_timeout=c.timeout_s, close_timeout=1.0,
                max_size=c.max_body_bytes, ping_interval=None, user_agent_header="rlvr"))
        except BaseException:
            sock.close()
            raise
        self.env, self.episode_id, self.steps = env, episode_id, 0

    def call(self, message: dict) -> dict:
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(json.dumps(message))
        except ConnectionClosed:  # a refused session sends an error, then closes: read what it said (as
            pass                  # OpenEnv's own client does); recv raises if nothing came
        raw = self.ws.recv(timeout=self.env.cfg.timeout_s)
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError):
            raise EnvFailed("the server's reply is not JSON") from None
        if type(reply) is not dict or type(reply.get("data")) is not dict:
            raise EnvFailed("the server's reply is not {type, data}")
        if reply.get("type") == "error":
            data = reply["data"]
            msg = str(data.get("message", ""))[:500]
            if data.get("code") == "VALIDATION_ERROR" and message.get("type") == "step":
                raise ActionRefused(msg)
            raise EnvFailed(f"the server answered an error: {msg} (code {str(data.get('code'))[:40]})")
        return reply

    def observation(self, message: dict) -> tuple[dict, float | None, bool]:
        reply = self.call(message)
        data = reply["data"]
        obs, reward, done = data.get("observation"), data.get("reward"), data.get("done", False)
        if reply.get("type") != "observation" or type(obs) is not dict or type(done) is not bool or not (
                reward is None or (type(reward) in (int, float) and abs(reward) < 1e9)):
            raise EnvFailed("the server's observation is not {observation: {…}, reward: number | null, done: bool}")
        return obs, (float(reward) if reward is not None else None), done

    def state(self) -> dict:
        reply = self.call({"type": "state"})
        if reply.get("type") != "state":
            raise EnvFailed(f"the server answered {str(reply.get('type'))[:40]!r} to state")
        return reply["data"]

    def close(self) -> None:
        try:
            self.ws.send(json.dumps({"type": "close"}))
        except Exception:  # noqa: BLE001 - a server already gone needs no goodbye
            pass
        self.stack.close()


class HttpEnvironment:
    acts_on = "call"
    judged = "all"
    role = "tool"

    def __init__(self, cfg, fmt: str, seed: int = 0):
        self.cfg, self.format, self.seed = cfg, fmt, seed
        self.target = net.check(cfg.url)  # refused here (the job fails saying why) before any episode starts
        self.rewards = cfg.reward == "env"
        self.errors: list[str] = []
        n = int(os.environ.get(MAX_SESSIONS_ENV, "16"))
        self.slots = slots(os.environ.get(TENANT_ENV, "local"), max(1, n), cfg.timeout_s)
        self.pool = ThreadPoolExecutor(min(cfg.max_concurrency, max(1, n)), thread_name_prefix="rlvr-env")
        self.schema = self._tool_schema() if fmt == "chat" else None
        self.opened = 0

    # -- the episode's life ---------------------------------------------------------------------------------
    def open(self, episodes) -> None:
        """A session per episode and its reset; the reset's observation, if it says anything, is the first
        thing the model reads (after the prompt)."""
        base = self.opened
        self.opened += len(episodes)
        results = list(self.pool.map(lambda k: self._guard(self._open, episodes[k], base + k), range(len(episodes))))
        for e, r in zip(episodes, results):
            if isinstance(r, Reply):  # failed
                e.excluded, e.done, e.finish = True, True, "infra_error"
                e.turns.append({"kind": "observation", "text": "", "outcome": "infra_error", "tool_s": r.seconds,
                                "error": r.text, "span": [0, 0, 0]})
            elif self.cfg.show_reset and r.strip():
                e.opening = r  # trainer.episodes.start puts it in the prompt, before anything is sampled

    def _open(self, e, k: int) -> str:
        """Start episode ``k``'s session; the reset observation's text (what the model would read)."""
        episode_id = f"rlvr-{self.seed}-{k}"
        e.env_state = Session(self, episode_id)
        obs, _, _ = e.env_state.observation({"type": "reset", "data": {"seed": (self.seed * 1_000_003 + k) % 2**31,
                                                                        "episode_id": episode_id}})
        return self._text(obs)

    def step(self, items: list[tuple[Any, str]]) -> list[Reply]:
        return list(self.pool.map(lambda it: self._guard(self._step, *it), items))

    def _step(self, e, call: str) -> Reply:
        t0 = time.perf_counter()
        if self.format == "chat":
            action = json.loads(call)  # the parser checked it is a JSON object
        else:
            action = {self.cfg.action_field: call}
        s = e.env_state
        try:
            obs, reward, done = s.observation({"type": "step", "data": action})
        except ActionRefused as why:
            return Reply(f"error: the environment refused the action: {why}\n", "tool_error", False,
                         seconds=time.perf_counter() - t0)
        s.steps += 1
        return Reply(self._text(obs), "ok", done, reward, time.perf_counter() - t0)

    def close(self, episodes) -> None:
        """Check each live session reports our episode (a server answering for another is lying), take the
        verify reward where asked, close every session."""
        def end(e):
            s, e.env_state = e.env_state, None
            if s is None:
                return None
            try:
                if not e.excluded:
                    state = s.state()
                    if state.get("episode_id") not in (None, s.episode_id):
                        raise EnvFailed(f"the server reports episode {str(state.get('episode_id'))[:80]!r}, "
                                        f"not ours ({s.episode_id})")
                    if self.cfg.verify:
                        e.reward = self._verify(e, s.episode_id)
                return None
            finally:
                s.close()
        for e, r in zip(episodes, self.pool.map(lambda e: self._guard(end, e), episodes)):
            if isinstance(r, Reply) and r.outcome == "infra_error":
                e.excluded, e.finish = True, "infra_error"

    def _guard(self, fn, *args) -> Any:
        """Run one call under the tenant's cap; any failure of the server becomes an infra_error Reply."""
        t0 = time.perf_counter()
        fd = None
        try:
            fd = self.slots.acquire(self.cfg.timeout_s)
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - whatever the server did, the episode cannot be judged
            self.errors.append(_why(e))
            return Reply(self.errors[-1], "infra_error", True, seconds=time.perf_counter() - t0)
        finally:
            if fd is not None:
                self.slots.release(fd)

    # -- plain HTTP: the schema and verify -----------------------------------------------------------------
    def _http(self, method: str, path: str, body: dict | None = None) -> Any:
        import httpx

        t, c = self.target, self.cfg
        ip = t.addresses[0]  # a checked address; the name goes in Host (and TLS's server name)
        url = f"{t.scheme}://{f'[{ip}]' if ':' in ip else ip}:{t.port}{t.path}{path}"
        with httpx.Client(timeout=c.timeout_s, follow_redirects=False, trust_env=False) as client:
            with client.stream(method, url, json=body, headers={"Host": t.host},
                               extensions={"sni_hostname": t.host}) as r:
                data = b""
                for chunk in r.iter_bytes():
                    data += chunk
                    if len(data) > c.max_body_bytes:
                        raise EnvFailed(f"{path}: the reply is over max_body_bytes ({c.max_body_bytes})")
        if r.status_code != 200:
            raise EnvFailed(f"{path}: HTTP {r.status_code}")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise EnvFailed(f"{path}: the reply is not JSON") from None

    def _verify(self, e, episode_id: str) -> float:
        out = self._http("POST", "/verify", {"episode_id": episode_id, "prompt": e.prompt if isinstance(e.prompt, str)
                                             else json.dumps(e.prompt), "turns": [{"kind": t["kind"], "text": t["text"]}
                                                                                  for t in e.turns]})
        reward = out.get("reward") if type(out) is dict else None
        if type(reward) not in (int, float) or reward != reward or abs(reward) > 1e9:
            raise EnvFailed("/verify: the reply is not {reward: number}")
        return float(reward)

    def _tool_schema(self) -> dict:
        params: Any = {"type": "object"}
        try:
            schema = self._http("GET", "/schema")
            if type(schema) is dict and type(schema.get("action")) is dict:
                params = schema["action"]
        except Exception as e:  # noqa: BLE001 - a server without /schema still takes actions
            self.errors.append(f"/schema: {_why(e)}")
        return {"type": "function", "function": {"name": "step", "description": "Act in the environment; its "
                "observation comes back.", "parameters": params}}

    def _text(self, obs: dict) -> str:
        """What the model reads of an observation: the named field, the only text field, or the fields as JSON."""
        if self.cfg.observation_field is not None:
            return str(obs.get(self.cfg.observation_field, ""))
        shown = {k: v for k, v in obs.items() if k not in ("metadata", "done", "reward")}
        texts = [v for v in shown.values() if isinstance(v, str)]
        if len(shown) == 1 and texts:
            return texts[0]
        return json.dumps(shown, sort_keys=True, default=str)


def _why(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "a call timed out (timeout_s)"
    name = type(e).__name__
    if name.startswith("ConnectionClosed"):
        return f"the connection closed ({str(e)[:200]})"
    return f"{name}: {str(e)[:300]}"
