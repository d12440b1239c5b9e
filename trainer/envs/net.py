"""Where an environment URL may point: the operator's allow-list, checked on the addresses we connect to.

An environment URL comes from a tenant's job spec, so it is untrusted: without a check it could reach the
service's own network (its database, its metadata endpoint at 169.254.169.254, a loopback admin port). Rules:
http or https only, no user info; the host is resolved HERE and EVERY address it resolves to must be public
(not loopback, link-local, private, shared, multicast, reserved or unspecified) unless the operator allows its
network (``RLVR_ENV_ALLOW``: comma-separated CIDRs, e.g. ``127.0.0.0/8`` for a local test server). The caller
then connects to one of the checked addresses itself (:func:`connect`), never to the name again, so a DNS
answer that changes between the check and the connection (rebinding) changes nothing.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass
from urllib.parse import urlsplit

ALLOW_ENV = "RLVR_ENV_ALLOW"
RESOLVE_TIMEOUT_S = 3.0
_LOOKUPS = ThreadPoolExecutor(4, thread_name_prefix="rlvr-env-dns")


class Refused(ValueError):
    """The URL may not be called: the reason names what (shown to the tenant as a 422 or a job error)."""


@dataclass(frozen=True)
class Target:
    scheme: str          # http | https
    host: str            # the name (Host header, TLS server name)
    port: int
    path: str            # base path, no trailing slash
    addresses: tuple[str, ...]  # the checked IPs, in resolver order


def allowed_networks(value: str | None = None) -> list:
    raw = os.environ.get(ALLOW_ENV, "") if value is None else value
    out = []
    for part in (p.strip() for p in raw.split(",")):
        if part:
            out.append(ipaddress.ip_network(part, strict=False))
    return out


def _public(ip) -> bool:
    if ip.version == 6 and ip.ipv4_mapped is not None:  # ::ffff:127.0.0.1 is loopback too
        ip = ip.ipv4_mapped
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
                or ip.is_unspecified or ip in ipaddress.ip_network("100.64.0.0/10"))


def check(url: str, allow: list | None = None, resolve=socket.getaddrinfo) -> Target:
    """The URL's target with every resolved address checked; :class:`Refused` says why not."""
    allow = allowed_networks() if allow is None else allow
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise Refused(f"not a URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise Refused(f"scheme {parts.scheme!r}: only http and https")
    if parts.username is not None or parts.password is not None:
        raise Refused("user info in the URL is not accepted (send credentials another way)")
    if not parts.hostname:
        raise Refused("no host")
    port = port or (443 if parts.scheme == "https" else 80)
    lookup = _LOOKUPS.submit(resolve, parts.hostname, port, type=socket.SOCK_STREAM)
    try:  # the resolver has no timeout of its own: a hung lookup must not hold a request or a worker
        infos = lookup.result(timeout=RESOLVE_TIMEOUT_S)
    except FutureTimeout:
        raise Refused(f"host {parts.hostname!r} did not resolve within {RESOLVE_TIMEOUT_S:g} s") from None
    except (socket.gaierror, UnicodeError, OSError) as e:
        raise Refused(f"host {parts.hostname!r} does not resolve ({e})") from None
    addresses = []
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(sockaddr[0].split("%")[0])
        if not _public(ip) and not any(ip in net for net in allow):
            raise Refused(f"host {parts.hostname!r} resolves to {ip}, a non-public address (loopback, private, "
                          f"link-local or metadata); the operator allows such networks with {ALLOW_ENV}")
        if str(ip) not in addresses:
            addresses.append(str(ip))
    if not addresses:
        raise Refused(f"host {parts.hostname!r} resolves to no address")
    return Target(parts.scheme, parts.hostname, port, parts.path.rstrip("/"), tuple(addresses))


def connect(target: Target, timeout_s: float) -> socket.socket:
    """A TCP connection to one of the target's checked addresses (the first that answers)."""
    last: Exception | None = None
    for ip in target.addresses:
        try:
            return socket.create_connection((ip, target.port), timeout=timeout_s)
        except OSError as e:
            last = e
    raise ConnectionError(f"cannot connect to {target.host}:{target.port}: {last}")
