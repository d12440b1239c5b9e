"""A stand-in OpenEnv server for tests (trainer/envs/http.py), in OpenEnv's WebSocket protocol, with ways to
misbehave. The game: the model sends a message; the observation echoes it with its length; the reward is
1.0 when the message is "42" (and the episode ends), else 0.0; a third step ends it too. ``/verify`` gives
2.0 for a transcript that contains "42". ``MODE`` (set per test) chooses a failure:
ok | slow | crash | malformed | huge | wrong_id | refuse_action | capacity | verify_slow | verify_lies |
task_in_reset (a
vanished server is one the test stops).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

MODE = {"mode": "ok", "sessions": 0, "max_sessions": 64, "steps": 0}
app = FastAPI()


def _obs(message: str, reward, done: bool) -> dict:
    return {"type": "observation", "data": {"observation": {"echoed_message": message, "message_length": len(message),
                                                            "metadata": {}}, "reward": reward, "done": done}}


@app.get("/schema")
def schema():
    return {"action": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
            "observation": {}, "state": {}}


@app.post("/verify")
async def verify(body: dict):
    if MODE["mode"] == "verify_slow":
        await asyncio.sleep(30)
    if MODE["mode"] == "verify_lies":
        return {"reward": "a lot"}
    text = " ".join(t["text"] for t in body.get("turns", []))
    return {"reward": 2.0 if "42" in text else 0.0}


@app.websocket("/ws")
async def ws(websocket: WebSocket):
    await websocket.accept()
    if MODE["sessions"] >= MODE["max_sessions"] or MODE["mode"] == "capacity":
        await websocket.send_text(json.dumps({"type": "error", "data": {"message": "at capacity",
                                                                          "code": "CAPACITY_REACHED"}}))
        await websocket.close()
        return
    MODE["sessions"] += 1
    state = {"episode_id": None, "step_count": 0}
    try:
        while True:
            msg = json.loads(await websocket.receive_text())
            mode = MODE["mode"]
            if msg["type"] == "reset":
                state = {"episode_id": msg["data"].get("episode_id"), "step_count": 0}
                greeting = "say 42 to win" if mode == "task_in_reset" else "ready"  # a game whose task is in its reset
                await websocket.send_text(json.dumps(_obs(greeting, None, False)))
            elif msg["type"] == "step":
                MODE["steps"] += 1
                if mode == "slow":
                    await asyncio.sleep(30)
                if mode == "crash":
                    await websocket.close(code=1011)
                    return
                if mode == "malformed":
                    await websocket.send_text("{not json")
                    continue
                if mode == "huge":
                    await websocket.send_text(json.dumps(_obs("x" * (4 << 20), 0.0, False)))
                    continue
                if mode == "refuse_action" and "message" not in msg["data"]:
                    await websocket.send_text(json.dumps({"type": "error", "data": {
                        "message": "message: field required", "code": "VALIDATION_ERROR"}}))
                    continue
                message = str(msg["data"].get("message", ""))
                state["step_count"] += 1
                win = message.strip() == "42"
                await websocket.send_text(json.dumps(_obs(message, 1.0 if win else 0.0,
                                                          win or state["step_count"] >= 3)))
            elif msg["type"] == "state":
                reported = "someone-else" if mode == "wrong_id" else state["episode_id"]
                await websocket.send_text(json.dumps({"type": "state", "data": {**state, "episode_id": reported}}))
            elif msg["type"] == "close":
                return
    except WebSocketDisconnect:
        return
    finally:
        MODE["sessions"] -= 1


class Server:
    """The app on 127.0.0.1 at a free port, in a thread; ``stop()`` makes it vanish."""

    def __init__(self):
        import uvicorn

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    ws="websockets-sansio"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the stand-in server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
