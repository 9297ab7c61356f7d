"""edge-serve --parallel: requests decoded together in one fused pass a step, joining and leaving at any step. A
greedy reply equals the reply alone (Engine.chat / Engine.generate) token for token among others, a seeded sampled
one too; a short request is not stuck behind long streams; a client that goes away frees its slot; /metrics shows
the slots. On a tiny GGUF model (edge's fused CPU step)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge import Engine
from edge.serve.app import ServeConfig
from edge.serve.background import BackgroundServer
from edge.serve.scheduler import Scheduler
from tests.gguf_files import write_gguf

CONTEXT = 512
CHATS = [[{"role": "user", "content": "What does the json module do?"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How do I sort a list?"}],
         [{"role": "user", "content": "Explain os.path.join"}]]


@pytest.fixture(scope="module")
def model_file(llama_dir, tmp_path_factory):
    return write_gguf(llama_dir, tmp_path_factory.mktemp("slots") / "tiny.q8_0.gguf", "q8_0")


@pytest.fixture(scope="module")
def server(model_file):
    with BackgroundServer(lambda: Engine.load(model_file, max_context=CONTEXT), ServeConfig("tiny"),
                          parallel=4) as running:
        running.generations.loaded.wait(60)
        yield running


@pytest.fixture(scope="module")
def reference(model_file) -> Engine:
    return Engine.load(model_file, max_context=CONTEXT)


def alone(reference: Engine, request: dict) -> tuple[str, int, str]:
    """The reply the engine gives `request` alone, from an empty cache: text, tokens, edge's finish reason."""
    reference.reset()
    options = {"max_new_tokens": request["max_tokens"], "temperature": request.get("temperature", 0.0),
               **{name: request[name] for name in ("seed", "top_p", "stop", "ignore_eos") if name in request}}
    events = list(reference.chat(request["messages"], **options) if "messages" in request
                  else reference.generate(request["prompt"], **options))
    return "".join(event.text for event in events), events[-1].stats.generated_tokens, events[-1].finish_reason


def send(server, request: dict) -> tuple[str, int, str]:
    """The server's reply to `request` (streamed when it asks): text, completion tokens, OpenAI's finish reason."""
    chat = "messages" in request
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with httpx.Client(base_url=server.url, timeout=60) as client:
        if not request.get("stream"):
            body = client.post(path, json=request).json()
            choice = body["choices"][0]
            return (choice["message"]["content"] if chat else choice["text"]), body["usage"]["completion_tokens"], \
                choice["finish_reason"]
        parts, finish, tokens = [], None, 0
        with client.stream("POST", path, json={**request, "stream_options": {"include_usage": True}}) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = httpx.Response(200, content=line[6:]).json()
                tokens = chunk["usage"]["completion_tokens"] if chunk.get("usage") else tokens
                for choice in chunk["choices"]:
                    parts.append((choice["delta"].get("content") or "") if chat else choice["text"])
                    finish = choice["finish_reason"] or finish
        return "".join(parts), tokens, finish


def concurrently(server, requests: list[dict]) -> list[tuple[str, int, str]]:
    replies: list = [None] * len(requests)

    def run(index: int) -> None:
        replies[index] = send(server, requests[index])

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return replies


class Gate:
    count = 1  # jobs that must wait before the generation thread admits any


@pytest.fixture
def together(monkeypatch):
    """Set `together.count = 4`: the generation thread admits nothing until 4 jobs wait, so that they share the
    batch from its first step on (requests sent at once could otherwise be served one after another by a fast
    model)."""
    gate, admit = Gate(), Scheduler.admit

    def gated(self):
        deadline = time.monotonic() + 10
        while gate.count > 1 and len(self.waiting) < gate.count and not self.in_batch and self.alone is None \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        admit(self)

    monkeypatch.setattr(Scheduler, "admit", gated)
    return gate


def metrics(server) -> dict:
    page = httpx.get(server.url + "/metrics").text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(page) for sample in family.samples}


FINISH = {"eos": "stop", "stop_string": "stop", "loop": "stop", "max_tokens": "length", "context_length": "length"}


def run_together(server, together, requests: list[dict]) -> tuple[list, dict, dict]:
    """`requests` sent at once and admitted into the batch together: their replies, and /metrics before and after."""
    before = metrics(server)
    together.count = len(requests)
    replies = concurrently(server, requests)
    together.count = 1
    return replies, before, metrics(server)


def assert_replies_alone(reference, requests: list[dict], replies: list) -> None:
    """Each reply is the one the engine gives its request alone: text, tokens and finish reason."""
    for request, reply in zip(requests, replies):
        text, tokens, finish = alone(reference, request)
        assert reply == (text, tokens, FINISH[finish])


def test_a_greedy_reply_among_three_others_is_the_reply_alone(server, reference, together):
    requests = [{"messages": CHATS[0], "max_tokens": 40, "temperature": 0},
                {"messages": CHATS[1], "max_tokens": 60, "temperature": 0, "stream": True},
                {"prompt": "The os module", "max_tokens": 30, "temperature": 0, "stop": [" the"]},
                {"prompt": "Sorting a list", "max_tokens": 50, "temperature": 0, "stream": True}]
    first = send(server, requests[0])  # alone on the server
    replies, before, after = run_together(server, together, requests)
    assert_replies_alone(reference, requests, replies)
    assert replies[0] == first
    passes = after["edge_batch_passes_total", ()] - before["edge_batch_passes_total", ()]
    sequences = after["edge_batch_sequences_total", ()] - before["edge_batch_sequences_total", ()]
    assert sequences >= 3 * passes / 2  # they ran together, not one after another


def test_a_seeded_sampled_reply_among_others_is_the_reply_alone(server, reference, together):
    sampled = {"prompt": "The json module", "max_tokens": 32, "temperature": 0.9, "top_p": 0.95, "seed": 7}
    others = [{"messages": chat, "max_tokens": 24, "temperature": 0.8, "seed": 3 + index}
              for index, chat in enumerate(CHATS)]
    expected = alone(reference, sampled)
    replies, _, _ = run_together(server, together, [sampled, *others])
    assert replies[0] == (expected[0], expected[1], FINISH[expected[2]])
    assert send(server, sampled) == replies[0]  # and alone on the server
    for request, reply in zip(others, replies[1:]):
        assert reply[0] == alone(reference, request)[0]


def short_among_long_streams(server) -> tuple[bool, tuple[str, int, str]]:
    """Send a short request while three long streams run: whether it ended before all of them, and its reply."""
    long = [{"messages": chat, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
            for chat in CHATS]
    ends: dict[int, float] = {}
    started = threading.Barrier(4)

    def stream(index: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", "/v1/chat/completions", json=long[index]) as response:
                lines = response.iter_lines()
                next(line for line in lines if line.startswith("data: {"))  # it runs
                started.wait(30)
                for _ in lines:
                    pass
        ends[index] = time.monotonic()

    threads = [threading.Thread(target=stream, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    started.wait(30)
    short_reply = send(server, {"prompt": "The os module", "max_tokens": 8, "temperature": 0})
    short_end = time.monotonic()
    for thread in threads:
        thread.join(120)
    assert len(ends) == 3
    return short_end < min(ends.values()), short_reply


def test_a_short_request_among_three_long_streams_finishes_first(server, reference):
    # The tiny model runs the long streams in about half a second, so a busy machine can delay the short request's
    # arrival past their end; a scheduler that keeps it behind them fails every try.
    for _ in range(3):
        first, short_reply = short_among_long_streams(server)
        if first:
            break
    assert first
    assert short_reply[0] == alone(reference, {"prompt": "The os module", "max_tokens": 8})[0]


def test_a_client_that_goes_away_frees_its_slot_at_once(server):
    before = metrics(server)
    request = {"messages": CHATS[0], "max_tokens": 450, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=request) as response:
            next(line for line in response.iter_lines() if line.startswith("data: {"))
    deadline = time.monotonic() + 10
    while metrics(server)["edge_slots_busy", ()] and time.monotonic() < deadline:
        time.sleep(0.01)
    after = metrics(server)
    assert after["edge_slots_busy", ()] == 0
    stopped = (("outcome", "stopped"),)
    assert after["edge_replies_total", stopped] - before.get(("edge_replies_total", stopped), 0) == 1
    generated = sum(value - before.get(key, 0) for key, value in after.items() if key[0] == "edge_slot_tokens_total")
    assert generated < 450  # cut off, not run to its end


def test_a_grammar_request_takes_the_engines_loop_beside_the_batch(server, reference, together):
    structured = {"messages": CHATS[2], "max_tokens": 12, "temperature": 0, "response_format": {"type": "json_object"}}
    batched = [{"prompt": "The json module", "max_tokens": 40, "temperature": 0},
               {"messages": CHATS[0], "max_tokens": 30, "temperature": 0, "stream": True}]
    replies, before, after = run_together(server, together, [structured, *batched])  # its steps between the batch's
    assert after["edge_slots", ()] == 4 and after["edge_slots_busy", ()] == 0
    engine_loop = (("slot", "engine"),)
    assert after["edge_slot_replies_total", engine_loop] - before.get(("edge_slot_replies_total", engine_loop), 0) == 1
    in_slots = [value - before.get(key, 0) for key, value in after.items()
                if key[0] == "edge_slot_replies_total" and key[1] != engine_loop]
    assert sum(in_slots) == 2
    reference.reset()
    expected = "".join(event.text for event in reference.chat(CHATS[2], max_new_tokens=12, temperature=0.0,
                                                               response_format={"type": "json_object"}))
    assert replies[0][0] == expected
    assert_replies_alone(reference, batched, replies[1:])


def test_a_conversations_next_turn_reuses_its_slots_cache(server, reference):
    first_turn = {"messages": CHATS[1], "max_tokens": 16, "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        first = client.post("/v1/chat/completions", json=first_turn).json()
        messages = CHATS[1] + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                               {"role": "user", "content": "And a tuple?"}]
        second = client.post("/v1/chat/completions", json={**first_turn, "messages": messages}).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] // 2
    assert second["timings"]["prompt_n"] == second["usage"]["prompt_tokens"] - \
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert second["choices"][0]["message"]["content"] == alone(reference, {**first_turn, "messages": messages})[0]


def test_a_conversation_whose_slot_served_others_meanwhile_starts_from_the_prompt_cache(model_file, reference):
    """Two slots and a prompt cache: two other chats take both slots between a conversation's turns, and its next
    turn still skips what it had run (the keys/values come back from host memory), with the reply alone."""
    first_turn = {"messages": CHATS[1], "max_tokens": 16, "temperature": 0}
    with BackgroundServer(lambda: Engine.load(model_file, max_context=CONTEXT), ServeConfig("tiny"), parallel=2,
                          prompt_cache=64 * 2**20) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        assert running.generations.loaded.wait(60)  # requests before the model is ready get 503
        first = client.post("/v1/chat/completions", json=first_turn).json()
        for chat in (CHATS[0], CHATS[2]):
            client.post("/v1/chat/completions", json={**first_turn, "messages": chat})
        messages = CHATS[1] + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                               {"role": "user", "content": "And a tuple?"}]
        second = client.post("/v1/chat/completions", json={**first_turn, "messages": messages}).json()
        counted = metrics(running)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] // 2
    assert second["choices"][0]["message"]["content"] == alone(reference, {**first_turn, "messages": messages})[0]
    assert counted[("edge_prompt_cached_tokens_total", ())] >= second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < counted[("edge_prompt_cache_bytes", ())] <= 64 * 2**20


@pytest.fixture(scope="module")
def drafting_server(model_file):
    """A server whose engine speculates with n-gram lookup: each slot drafts with its own copy."""
    with BackgroundServer(lambda: Engine.load(model_file, max_context=CONTEXT, drafter="ngram"), ServeConfig("tiny"),
                          parallel=4) as running:
        running.generations.loaded.wait(60)
        yield running


def test_each_slot_speculates_with_its_own_drafter_and_replies_as_alone(drafting_server, reference, together):
    requests = [{"messages": CHATS[0], "max_tokens": 80, "temperature": 0, "ignore_eos": True},
                {"messages": CHATS[1], "max_tokens": 60, "temperature": 0, "stream": True, "ignore_eos": True},
                {"prompt": "The os module", "max_tokens": 70, "temperature": 0, "ignore_eos": True},
                {"prompt": "Sorting a list", "max_tokens": 50, "temperature": 0.9, "seed": 5, "stream": True}]
    sampled_alone = send(drafting_server, requests[3])  # speculative sampling: the seed fixes the reply
    replies, before, after = run_together(drafting_server, together, requests)
    assert_replies_alone(reference, requests[:3], replies)  # plain greedy decoding's
    assert replies[3] == sampled_alone
    engine_loop = (("slot", "engine"),)
    assert after.get(("edge_slot_replies_total", engine_loop), 0) == 0  # every reply ran in a slot
    drafted = {key[1]: value - before.get(key, 0) for key, value in after.items()
               if key[0] == "edge_slot_drafted_tokens_total"}
    accepted = {key[1]: value - before.get(key, 0) for key, value in after.items()
                if key[0] == "edge_slot_accepted_tokens_total"}
    assert sum(drafted.values()) > 0 and sum(accepted.values()) > 0
    passes = after["edge_batch_passes_total", ()] - before["edge_batch_passes_total", ()]
    sequences = after["edge_batch_sequences_total", ()] - before["edge_batch_sequences_total", ()]
    assert sequences >= 3 * passes / 2  # they ran together


@pytest.fixture(scope="module")
def draft_model_server(model_file):
    """A server whose engine speculates with a draft model (the same tiny file): its cache is one sequence's."""
    with BackgroundServer(lambda: Engine.load(model_file, max_context=CONTEXT, drafter=f"draft:{model_file}"),
                          ServeConfig("tiny"), parallel=4) as running:
        running.generations.loaded.wait(60)
        yield running


def test_with_a_draft_model_greedy_replies_among_others_share_the_batch(draft_model_server, reference, together):
    requests = [{"messages": CHATS[0], "max_tokens": 40, "temperature": 0},
                {"messages": CHATS[1], "max_tokens": 50, "temperature": 0, "stream": True},
                {"prompt": "The os module", "max_tokens": 30, "temperature": 0}]
    replies, before, after = run_together(draft_model_server, together, requests)
    assert_replies_alone(reference, requests, replies)
    in_slots = sum(value - before.get(key, 0) for key, value in after.items()
                   if key[0] == "edge_slot_replies_total" and key[1] != (("slot", "engine"),))
    assert in_slots == 3  # none waited for the engine's loop, one at a time
    alone_reply = send(draft_model_server, requests[0])  # alone, it speculates with the draft model
    final = metrics(draft_model_server)
    assert alone_reply == replies[0]
    assert final["edge_slot_replies_total", (("slot", "engine"),)] - after.get(
        ("edge_slot_replies_total", (("slot", "engine"),)), 0) == 1
