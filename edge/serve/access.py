"""Who may use the server: the Host allow-list, the Origin check and CORS (off unless --cors names an origin).

A server on 127.0.0.1 is reachable from any web page the user opens: the browser sends the page's requests, and with
DNS rebinding (a name of the attacker's that resolves to 127.0.0.1) it also reads the replies. So:

    Host     must name this server: localhost, 127.0.0.1, [::1], the --host address or an --allowed-host name
             (any port); a rebinding page's requests carry its own name and get 421
    Origin   a browser's cross-origin request names its page; unless --cors lists that origin it gets 403 (native
             clients send no Origin)
    CORS     starlette's CORSMiddleware for the --cors origins only: their preflights are answered, their replies
             carry the CORS headers

POST bodies must also be `application/json` (request_body.read_body: 415 otherwise), so no page can send a "simple"
request (text/plain, a form) that skips the preflight.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from edge.serve.errors import ApiError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def host_name(address: str) -> str:
    """A listening address or host name as a Host header names it: lower case, an IPv6 address in brackets."""
    name = address.strip().lower().rstrip(".")
    try:
        if ipaddress.ip_address(name.strip("[]")).version == 6:
            return f"[{name.strip('[]')}]"
    except ValueError:
        pass
    return name


def split_host(header: str) -> str | None:
    """The name in a Host header (`name`, `name:port`, `[v6]:port`), as `host_name` writes it; None if malformed."""
    header = header.strip()
    if header.startswith("["):
        name, bracket, port = header.partition("]")
        if not bracket or (port and not port.startswith(":")):
            return None
        name, port = name + "]", port[1:]
    else:
        name, _, port = header.rpartition(":") if header.count(":") == 1 else (header, "", "")
    if not name or (port and not port.isdigit()):
        return None
    return host_name(name)


def is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def check_origin(origin: str) -> str:
    """A --cors value as browsers send it in Origin (scheme://host[:port], no path); ValueError naming the fix."""
    parts = urlsplit(origin.strip())
    if origin.strip() == "*" or not parts.scheme or not parts.netloc or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"--cors takes a web page's origin, as scheme://host[:port] (e.g. http://localhost:5173), "
                         f"got {origin!r}; repeat --cors for each origin")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


class AccessGuard:
    """ASGI middleware: requests whose Host is not on the allow-list get 421, those from a browser page whose Origin
    is not a --cors origin get 403, both as one-line OpenAI-style errors."""

    def __init__(self, app: ASGIApp, *, listen_host: str = "127.0.0.1", allowed_hosts: tuple[str, ...] = (),
                 cors_origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.names = {*LOOPBACK_NAMES, host_name(listen_host), *(host_name(name) for name in allowed_hosts)}
        self.any_address = listen_host.strip() in WILDCARD_ADDRESSES  # reached at any of the machine's addresses
        self.origins = set(cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]
                   if key in (b"host", b"origin")}
        refusal = self.refusal(headers.get("host", ""), headers.get("origin"))
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, host: str, origin: str | None) -> ApiError | None:
        name = split_host(host)
        if name is None or not (name in self.names or (self.any_address and is_ip_literal(name))):
            return ApiError(421, f"Host {host!r} is not a name of this server (it answers to "
                            f"{', '.join(sorted(self.names))}); to reach it under that name start edge-serve with "
                            "--allowed-host NAME", kind="invalid_request_error", code="host_not_allowed")
        if origin is not None and page_origin(origin) not in self.origins:
            return ApiError(403, origin_refusal(origin), kind="permission_error", code="origin_not_allowed")
        return None


def page_origin(origin: str) -> str | None:
    """An Origin header as --cors names it (check_origin's form), or None for one no --cors can name."""
    try:
        return check_origin(origin)
    except ValueError:
        return None


def origin_refusal(origin: str) -> str:
    """Why a request with this Origin header is refused, and the fix that works for it: --cors for a web page's
    origin; none for an empty, opaque ("null") or malformed one, which --cors cannot name."""
    page = page_origin(origin)
    if page is not None:
        return f"a web page at {origin!r} may not use this server; to let it, start edge-serve with --cors {page}"
    if not origin.strip():
        return ("a request with an empty Origin header may not use this server; send no Origin header (as native "
                "clients do), or the page's origin (scheme://host[:port]) started with --cors ORIGIN")
    if origin.strip().lower() == "null":
        return ("a page with the opaque origin 'null' (a file:// page or a sandboxed frame) may not use this server, "
                "and --cors cannot allow it; serve the page over http (e.g. http://localhost:5173) and start "
                "edge-serve with --cors http://localhost:5173")
    return (f"the Origin header {origin!r} is not a web page's origin (scheme://host[:port]), so it may not use this "
            "server; send no Origin header (as native clients do), or the page's origin started with --cors ORIGIN")
