"""Doorbells: wake-ups between the API and a session's worker on the same machine, so neither has to poll
the store every millisecond to answer in milliseconds.

A bell is a Linux abstract-namespace datagram socket named after the store and the thing waited for (a
session's queue, one request's result): ``ring`` sends one byte and never blocks or fails, ``wait``
returns as soon as one arrives (a ring sent before the wait is kept by the socket, so none is lost).
Bells carry no data: whoever wakes reads the store, which stays the one source of truth. Across machines,
or where the name is taken, nothing rings and waits simply run out: polling at the backed-off interval.
"""
from __future__ import annotations

import asyncio
import hashlib
import select
import socket


def _name(store_url: str, what: str) -> bytes:
    return b"\0rlvr-" + hashlib.sha256(f"{store_url}|{what}".encode()).hexdigest()[:32].encode()


def ring(store_url: str, what: str) -> None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.sendto(b"!", _name(store_url, what))
    except OSError:  # nobody listening (or the buffer is full: a wake-up is already pending)
        pass


class Bell:
    def __init__(self, store_url: str, what: str):
        self.sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.bind(_name(store_url, what))
            self.sock.setblocking(False)
        except OSError:  # taken (another waiter) or unsupported: waits just time out
            self.sock.close()
            self.sock = None

    def _drain(self) -> None:
        try:
            while self.sock is not None:
                self.sock.recv(64)
        except OSError:
            pass

    def wait(self, timeout: float) -> None:
        if self.sock is None:
            select.select([], [], [], timeout)
            return
        if select.select([self.sock], [], [], timeout)[0]:
            self._drain()

    async def wait_async(self, timeout: float) -> None:
        if self.sock is None:
            await asyncio.sleep(timeout)
            return
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, 64), timeout)
            self._drain()
        except asyncio.TimeoutError:
            pass

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
