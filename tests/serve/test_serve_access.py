"""Safe by default on a desktop: a web page the user opens cannot use edge-serve. Requests must name the server in
Host (DNS rebinding carries the attacker's name: 421), carry JSON as application/json (a page's "simple" text/plain
or form POST skips the CORS preflight: 415), and come from no web page unless --cors names its origin (403)."""

from __future__ import annotations

import dataclasses
import re

import httpx
import pytest

from edge import Engine
from edge.sources.builtin import builtin_model_path
from edge.serve.access import AccessGuard, split_host
from edge.serve.app import ServeConfig
from edge.serve.background import BackgroundServer
from edge.serve.cli import build_parser, main, serve_config

BODY = b'{"prompt": "The json module", "max_tokens": 2}'
PAGE = "http://localhost:5173"


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(builtin_model_path(), max_context=128)


@pytest.fixture(scope="module")
def server(engine):
    with BackgroundServer(lambda: engine, ServeConfig("m")) as running:
        running.generations.loaded.wait(60)
        yield running


@pytest.fixture(scope="module")
def cors_server(engine):
    with BackgroundServer(lambda: engine, ServeConfig("m", cors_origins=(PAGE,))) as running:
        running.generations.loaded.wait(60)
        yield running


def post(server, headers: dict, body: bytes = BODY, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(server.url + path, content=body, headers=headers, timeout=30)


def assert_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    assert "\n" not in error["message"]
    return error["message"]


def test_a_dns_rebinding_page_is_refused(server):
    """The request a rebinding page sends: its own name in Host and Origin, a text/plain body (no preflight)."""
    rebinding = {"Host": f"evil.example:{server.port}", "Origin": f"http://evil.example:{server.port}",
                 "Content-Type": "text/plain"}
    assert_error(post(server, rebinding), 421, "host_not_allowed")
    message = assert_error(httpx.get(server.url + "/health", headers={"Host": "evil.example"}), 421,
                           "host_not_allowed")
    assert "'evil.example'" in message and "--allowed-host" in message


@pytest.mark.parametrize("host", ["localhost", "localhost:{port}", "127.0.0.1", "127.0.0.1:{port}", "[::1]",
                                  "[::1]:{port}", "LOCALHOST:{port}", "localhost:9999"])
def test_the_loopback_names_are_served(server, host):
    reply = post(server, {"Host": host.format(port=server.port), "Content-Type": "application/json"})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("host", ["evil.example", "localhost.evil.example", "127.0.0.1.nip.io:80", "[::1", "",
                                  "localhost:http", "192.168.1.5:8080"])
def test_other_hosts_are_421(server, host):
    assert_error(post(server, {"Host": host, "Content-Type": "application/json"}), 421, "host_not_allowed")


def test_the_listen_address_and_allowed_hosts_are_served():
    guard = AccessGuard(None, listen_host="192.168.1.5", allowed_hosts=("mybox.local",))
    assert guard.refusal("192.168.1.5:8080", None) is None and guard.refusal("MyBox.local", None) is None
    assert guard.refusal("10.0.0.1", None).status == 421
    everywhere = AccessGuard(None, listen_host="0.0.0.0")  # reached at any of the machine's addresses
    assert everywhere.refusal("10.0.0.1:8080", None) is None and everywhere.refusal("[fe80::1]:80", None) is None
    assert everywhere.refusal("evil.example", None).status == 421  # a name still has to be allowed
    assert AccessGuard(None, listen_host="::1").refusal("[::1]:8080", None) is None
    assert split_host("[::1]:80") == "[::1]" and split_host("[::1]x") is None and split_host("a:b") is None


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          "application/jsonx", None])
def test_a_body_not_sent_as_json_is_415(server, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/v1/completions", "/v1/chat/completions"):
        message = assert_error(post(server, headers, path=path), 415, "unsupported_media_type")
        assert "application/json" in message


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON;charset=UTF-8"])
def test_json_with_or_without_a_charset_is_served(server, content_type):
    assert post(server, {"Content-Type": content_type}).status_code == 200


def test_without_cors_a_web_page_gets_no_cors_and_is_refused(server):
    preflight = httpx.options(server.url + "/v1/completions", headers={
        "Origin": PAGE, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert_error(preflight, 403, "origin_not_allowed")
    assert "access-control-allow-origin" not in preflight.headers
    message = assert_error(post(server, {"Origin": PAGE, "Content-Type": "application/json"}), 403,
                           "origin_not_allowed")
    assert f"--cors {PAGE}" in message


def test_cors_lets_only_the_named_origins_in(cors_server):
    preflight = httpx.options(cors_server.url + "/v1/chat/completions", headers={
        "Origin": PAGE, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == PAGE
    reply = post(cors_server, {"Origin": PAGE, "Content-Type": "application/json"})
    assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == PAGE
    other = post(cors_server, {"Origin": "http://evil.example", "Content-Type": "application/json"})
    assert_error(other, 403, "origin_not_allowed")
    assert "access-control-allow-origin" not in other.headers
    native = post(cors_server, {"Content-Type": "application/json"})  # no Origin: a program, not a page
    assert native.status_code == 200 and "access-control-allow-origin" not in native.headers


def test_the_command_line_sets_hosts_and_origins(capsys):
    args = build_parser().parse_args(["--host", "0.0.0.0", "--allowed-host", "mybox.local", "--cors", PAGE + "/",
                                      "--cors", "app://obsidian.md"])
    config = serve_config(args)
    assert config.listen_host == "0.0.0.0" and config.allowed_hosts == ("mybox.local",)
    assert config.cors_origins == (PAGE, "app://obsidian.md")
    for bad in ("*", "localhost:5173", "http://localhost:5173/page"):
        assert main(["--cors", bad]) == 2
        error = capsys.readouterr().err
        assert error.startswith("edge-serve: error: --cors takes a web page's origin") and error.count("\n") == 1


@pytest.mark.parametrize("origin, says", [
    ("", "a request with an empty Origin header may not use this server; send no Origin header"),
    ("null", "a page with the opaque origin 'null' (a file:// page or a sandboxed frame) may not use this server, and "
             "--cors cannot allow it"),
    ("not an origin", "the Origin header 'not an origin' is not a web page's origin (scheme://host[:port])"),
])
def test_an_origin_no_cors_can_name_is_refused_without_an_empty_suggestion(server, origin, says):
    message = assert_error(post(server, {"Origin": origin, "Content-Type": "application/json"}), 403,
                           "origin_not_allowed")
    assert message.startswith(says)
    assert not re.search(r"--cors\s*($|[;,)])", message)  # never a --cors with nothing after it


def test_the_suggested_cors_value_lets_the_page_in(engine):
    written = "HTTP://LocalHost:5173/"  # as a hand-made client may send it
    guard = AccessGuard(None)
    suggestion = guard.refusal("127.0.0.1", written).message.rpartition("--cors ")[2]
    assert suggestion == PAGE
    assert AccessGuard(None, cors_origins=(suggestion,)).refusal("127.0.0.1", written) is None
