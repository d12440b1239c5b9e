"""A small Chrome DevTools Protocol client for the dashboard's browser tests: Debian's chromium, headless,
driven over its DevTools websocket (no browser download, no driver binary). It evaluates JavaScript in the
page, waits for conditions, records the page's network requests and takes screenshots."""
from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Chrome:
    def __init__(self, profile: Path, width: int = 1400, height: int = 1000):
        from websockets.sync.client import connect

        profile.mkdir(parents=True, exist_ok=True)
        self._stack = contextlib.ExitStack()
        self.log = open(profile.parent / f"{profile.name}.log", "wb")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "about:blank"], stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            port = self._port(profile / "DevToolsActivePort")
            page = self._page(port)
            self.ws = self._stack.enter_context(connect(page, max_size=None, open_timeout=10))
        except BaseException:
            self.close()
            raise
        self.ids, self.events = itertools.count(1), []
        for domain in ("Page", "Runtime", "Network"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _port(self, active: Path, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # chromium writes its port here once it listens
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            if active.exists() and active.read_text().strip():
                return int(active.read_text().split()[0])
            time.sleep(0.1)
        raise TimeoutError("chromium did not open its DevTools port")

    @staticmethod
    def _page(port: int) -> str:
        import httpx

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                     if t["type"] == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)
        raise TimeoutError("chromium has no page target")

    def send(self, method: str, timeout: float = 30, **params: Any) -> dict:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}: {r['exceptionDetails'].get('exception', r['exceptionDetails'])}")
        return r["result"].get("value")

    def wait(self, expression: str, timeout: float = 60, what: str | None = None) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g}s for {what or expression}")
            time.sleep(0.2)

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && location.href !== 'about:blank'", 30, f"{url} to load")

    def requests(self) -> list[dict]:
        """Every request the page sent so far: {url, method, headers}."""
        return [e["params"]["request"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def screenshot(self, path: Path, selector: str | None = None) -> Path:
        """A PNG of the page, or of one element (its whole box, scrolled or not)."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if selector:
            box = self.eval(f"(() => {{ const r = "
                            f"document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                            " return {x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height}; })()")
            params["clip"] = {**box, "scale": 1}
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", **params)["data"]))
        return path

    def close(self) -> None:
        self._stack.close()  # the websocket
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.log.close()

    def __enter__(self) -> "Chrome":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
