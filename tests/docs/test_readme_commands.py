"""Every command README.md shows runs as written on the default model, on a fresh clone (tests/docs/readme_commands.py
says how each one is run, and which ones cannot run here and why). A command that fails fails its test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edge.sources.default_model import DEFAULT_MODEL, packaged_file
from tests.docs.readme_commands import (CHAT_PROMPT, NOT_RUN, README, ROOT, SERVER_ADDRESS, Step, client_blocks,
                                        library_blocks, readme_steps)

TIMEOUT_S = 300  # per command: a busy 2-core machine; a quiet one takes a few seconds

STEPS = readme_steps()


def console_scripts() -> dict[str, str]:
    """pyproject.toml's [project.scripts]: name -> module:function."""
    table = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.]+:\w+)"', table, flags=re.M))


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory) -> dict[str, str]:
    """The environment of a fresh clone's activated virtual environment: this checkout's console scripts and python
    first on PATH, the default model installed, nothing downloaded (an empty Hugging Face cache, offline) and a
    chat folder of its own."""
    if packaged_file() is None:
        if os.environ.get("EDGE_REQUIRE_DEFAULT_MODEL") == "1":
            pytest.fail(f"the default model is not installed: {DEFAULT_MODEL.install_command}")
        pytest.skip(f"the README's commands run on the default model ({DEFAULT_MODEL.install_command})")
    root = tmp_path_factory.mktemp("readme")
    bin_folder = root / "bin"
    bin_folder.mkdir()
    scripts = {name: f"import sys\nfrom {target.split(':')[0]} import {target.split(':')[1]} as main\n"
                     f"sys.argv[0] = {name!r}\nsys.exit(main())\n" for name, target in console_scripts().items()}
    for name, body in scripts.items():
        (bin_folder / name).write_text(f"#!{sys.executable}\n{body}")
    (bin_folder / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for path in bin_folder.iterdir():
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_folder}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_CACHE": str(root / "hub"), "HF_HUB_OFFLINE": "1", "EDGE_DATA_DIR": str(root / "data")}
    env.pop("HF_HOME", None)
    return env


def run_step(step: Step, env: dict[str, str]) -> subprocess.CompletedProcess:
    command, stdin = step.bounded()
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=ROOT, env=env, input=stdin,
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, f"{command!r} exited with {result.returncode}:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS, ids=[step.text for step in STEPS])
def test_readme_command_runs(step, shell_env):
    if step.text in NOT_RUN:
        pytest.skip(NOT_RUN[step.text])
    if step.program == "edge-serve":
        serve_and_ask(step, shell_env)
        return
    result = run_step(step, shell_env)
    if step.program == "edge-chat":
        assert result.stdout.strip(), f"{step.text!r} printed no reply"


def serve_and_ask(step: Step, env: dict[str, str]) -> None:
    """Start the server as written but on a free port, wait until it is ready, run the README's client against it,
    then stop it (SIGTERM) and check that it exits cleanly."""
    command, _ = step.bounded()
    server = subprocess.Popen(["bash", "-c", f"exec {command} --port 0"], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(iter(server.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        address = None
        while address is None:
            assert server.poll() is None and time.monotonic() < deadline, "".join(log)
            address = next((match[1] for line in log if (match := re.search(r"running on http://([\w.:\[\]-]+)", line))),
                           None)
            time.sleep(0.1)
        wait_until_ready(address, deadline, server, log)
        for block in client_blocks():
            result = subprocess.run([sys.executable, "-c", block.replace(SERVER_ADDRESS, address)], cwd=ROOT,
                                    env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            assert result.returncode == 0, result.stderr[-3000:]
            assert result.stdout.strip(), "the README's client printed no reply"
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    reader.join(5)
    assert server.returncode in (0, -signal.SIGTERM), "".join(log)
    assert "Traceback" not in "".join(log), "".join(log)


def wait_until_ready(address: str, deadline: float, server: subprocess.Popen, log: list[str]) -> None:
    import httpx

    while True:
        try:
            if httpx.get(f"http://{address}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, "".join(log)
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("block", library_blocks(), ids=lambda block: block.strip().splitlines()[-1][:40])
def test_readme_python_runs(block, shell_env):
    result = subprocess.run([sys.executable, "-c", block], cwd=ROOT, env=shell_env, capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()


def test_the_readme_shows_commands_a_server_and_its_client():
    """The extraction finds what the README shows (so that the tests above cannot pass by finding nothing)."""
    programs = {step.program for step in STEPS}
    assert {"edge-chat", "edge", "edge-serve"} <= programs
    assert client_blocks() and library_blocks()
    assert any("Engine.load()" in block for block in library_blocks())


def test_every_command_not_run_is_still_in_the_readme():
    """A command left out of the run with a reason names a command the README still shows."""
    assert set(NOT_RUN) <= {step.text for step in STEPS}


def test_an_interactive_command_gets_a_variant_that_ends_by_itself():
    assert Step(".venv/bin/edge-chat").bounded() == (f"edge-chat --prompt '{CHAT_PROMPT}' --max-new-tokens 16", None)
    assert Step("edge-chat --plain").bounded() == ("edge-chat --plain", "Hello\n/quit\n")
    assert Step('echo "Hi" | edge-chat').bounded() == ('echo "Hi" | edge-chat', None)
    assert Step('edge-chat --prompt "Hi" --stats').bounded() == ('edge-chat --prompt "Hi" --stats', None)


def test_a_comment_ends_a_command_but_a_hash_inside_quotes_does_not():
    steps = readme_steps('```bash\nedge-chat --prompt "What does # do?"   # one reply\na && b  # two steps\n```\n')
    assert [step.text for step in steps] == ['edge-chat --prompt "What does # do?"', "a", "b"]
