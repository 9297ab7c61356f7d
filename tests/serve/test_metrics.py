"""GET /metrics: Prometheus' text format (read back with prometheus_client's own parser), behind the API key, counting
requests by route and status, refusals included, and the replies' tokens as the replies report them."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from edge import Engine
from edge.sources.builtin import builtin_model_path
from edge.load_spec import LoadSpec
from edge.serve.app import ServeConfig
from edge.serve.background import BackgroundServer

KEY = "metrics-test-key"


@pytest.fixture(scope="module")
def server():
    spec = LoadSpec.from_options(builtin_model_path(), drafter="hybrid:feature")
    with BackgroundServer(lambda: Engine.from_spec(spec), ServeConfig("edge-builtin", api_key=KEY)) as running:
        running.generations.loaded.wait(60)
        yield running


def scrape(server) -> dict[tuple[str, tuple], float]:
    response = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_metrics_need_the_api_key(server):
    assert httpx.get(server.url + "/metrics").status_code == 401
    assert httpx.get(server.url + "/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    page = {"Authorization": f"Bearer {KEY}", "Origin": "http://evil.example"}  # a web page, key or not
    assert httpx.get(server.url + "/metrics", headers=page).status_code == 403
    samples = scrape(server)
    assert samples["edge_requests_total", (("route", "/metrics"), ("status", "401"))] >= 2
    assert samples["edge_requests_total", (("route", "/metrics"), ("status", "403"))] >= 1


def test_metrics_count_requests_tokens_and_speculation(server):
    before = scrape(server)
    client = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Explain os.path.join"}],
                                           max_tokens=40, temperature=0)
    httpx.get(server.url + "/no/such/route", headers={"Authorization": f"Bearer {KEY}"})
    httpx.get(server.url + "/health", headers={"Host": "evil.example"})  # refused by the Host allow-list
    after = scrape(server)

    def grew(name: str, labels: tuple = ()) -> float:
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert grew("edge_requests_total", (("route", "/v1/chat/completions"), ("status", "200"))) == 1
    assert grew("edge_requests_total", (("route", "other"), ("status", "404"))) == 1
    assert grew("edge_requests_total", (("route", "/health"), ("status", "421"))) == 1
    assert grew("edge_generated_tokens_total") == reply.usage.completion_tokens
    assert grew("edge_prompt_tokens_total") == reply.usage.prompt_tokens
    assert grew("edge_drafted_tokens_total") == reply.timings["draft_n"] > 0
    assert grew("edge_accepted_tokens_total") == reply.timings["draft_n_accepted"]
    assert grew("edge_decode_tokens_total") == reply.timings["predicted_n"]
    assert grew("edge_replies_total", (("outcome", reply.choices[0].finish_reason == "length" and "max_tokens"
                                        or "eos"),)) == 1
    assert 0 < after["edge_acceptance_ratio", ()] <= 1 and after["edge_draft_length", ()] > 0
    assert after["edge_decode_tokens_per_second", ()] > 0
    assert after["edge_queue_waiting", ()] == 0 and after["edge_queue_limit", ()] == 16
    assert after["edge_generating", ()] == 0
    assert after["process_resident_memory_bytes", ()] > 10 * 2**20


def test_metrics_keep_their_names_types_and_help(server):
    response = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    families = {family.name: family for family in text_string_to_metric_families(response.text)}
    counters = {"edge_requests", "edge_replies", "edge_prompt_tokens", "edge_prompt_cached_tokens",
                "edge_generated_tokens", "edge_decode_tokens",
                "edge_decode_steps", "edge_drafted_tokens", "edge_accepted_tokens", "edge_decode_seconds",
                "edge_batch_passes", "edge_batch_sequences", "edge_slot_replies", "edge_slot_tokens",
                "edge_slot_drafted_tokens", "edge_slot_accepted_tokens"}
    gauges = {"edge_queue_waiting", "edge_queue_limit", "edge_generating", "edge_decode_tokens_per_second",
              "edge_slots", "edge_slots_busy", "edge_batch_size", "edge_prompt_cache_bytes",
              "edge_acceptance_ratio", "edge_draft_length", "process_resident_memory_bytes"}
    assert set(families) == counters | gauges  # no _created series, nothing from the process-wide default registry
    assert {name for name, family in families.items() if family.type == "counter"} == counters
    assert families["edge_requests"].documentation == "HTTP requests answered, by route and status."
    assert families["edge_queue_limit"].documentation == "Requests that may wait (--queue-size)."
    assert families["process_resident_memory_bytes"].documentation == "Resident memory size in bytes."


def test_metrics_speak_openmetrics_to_a_scraper_that_asks(server):
    response = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}",
                                                           "Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n") and "# TYPE edge_requests counter" in response.text


def test_each_server_counts_in_its_own_registry():
    from edge.serve.generation_queue import GenerationQueue

    first, second = GenerationQueue(4), GenerationQueue(8)
    first.metrics.count_request("/health", 200)
    first_page, second_page = first.metrics.exposition()[0].decode(), second.metrics.exposition()[0].decode()
    assert 'edge_requests_total{route="other",status="200"} 1.0' in first_page
    assert "edge_requests_total{" not in second_page and "edge_queue_limit 8.0" in second_page


def test_without_prometheus_client_edge_serve_says_how_to_install_it():
    blocked = ("import sys; sys.modules['prometheus_client'] = None; from edge.serve.cli import main; "
               "sys.exit(main([]))")
    done = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "prometheus_client is not installed" in done.stderr and "edge[serve]" in done.stderr
