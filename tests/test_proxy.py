"""The OpenAI-compatible proxy (node/proxy.py), driven by the official `openai` package against a real daemon and
the fake upstream of the dso tests, which records each request it got: what the upstream saw is the test."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.daemons import Daemon, init_home, running
from tests.dso_fakes import FakeLlm, Reply, fake_llm, smollm_missing, smollm_server

GEOMETRY = "When intersecting lines with segments, check each solution lies on the segment, not its extension."
RATES = "When computing an average speed, divide the total distance by the total time; never multiply them."
QUESTION = "A line crosses a segment: does the intersection point lie on the segment or on its extension?"
ANSWER = "The point lies on the segment. Answer: yes"


@dataclass
class Proxied:
    daemon: Daemon
    fake: FakeLlm
    url: str
    ids: dict[str, str]  # experience text -> id

    def client(self, api_key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=api_key or self.daemon.token, max_retries=0, timeout=60)


def proxy_config(home: Path, upstream: str) -> None:
    with open(home / "config.toml", "a") as config:
        config.write(f'\n[proxy]\nlisten = "127.0.0.1:0"\nupstream = "{upstream}"\n')


@pytest.fixture(scope="module")
def proxied(tmp_path_factory) -> Iterator[Proxied]:
    home = tmp_path_factory.mktemp("proxy") / "home"
    init_home(home)
    with fake_llm(lambda request: Reply(ANSWER)) as fake:
        proxy_config(home, fake.url)
        with running(home) as daemon:
            ids = {}
            for text, domain in ((GEOMETRY, "math.geometry"), (RATES, "math.arithmetic")):
                ids[text] = daemon.call("add", {"text": text, "domain": domain, "confidence": 0.8})["cid"]
            url = (home / "proxy.url").read_text().strip()
            yield Proxied(daemon, fake, url, ids)


def last_user(request: dict) -> str:
    return next(m for m in reversed(request["messages"]) if m["role"] == "user")["content"]


def test_an_answer_carries_the_injected_experiences_and_the_upstream_saw_them(proxied):
    raw = proxied.client().chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == ANSWER  # the upstream's answer, unchanged
    geometry = proxied.ids[GEOMETRY]
    assert completion.model_extra["expledger"]["injected"][0] == geometry
    assert raw.headers["x-expledger-injected"].split(",") == completion.model_extra["expledger"]["injected"]
    sent = proxied.fake.requests[-1]
    prompt = last_user(sent)
    assert prompt.startswith("# Learned Experiences\n\n1. " + GEOMETRY)  # the retrieval seed's template
    assert prompt.endswith("---\n\n# Problem\n\n" + QUESTION)
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}  # other messages untouched
    assert proxied.daemon.token not in json.dumps(sent)


def test_a_stream_is_passed_through_and_its_header_names_the_experiences(proxied):
    raw = proxied.client().chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": QUESTION}], stream=True
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["x-expledger-injected"].split(",")[0] == proxied.ids[GEOMETRY]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse())
    assert text == ANSWER
    sent = proxied.fake.requests[-1]
    assert sent["stream"] is True and GEOMETRY in last_user(sent)


def test_the_domain_narrows_what_is_injected(proxied):
    question = "How should I handle a speed and an intersection in one problem?"
    for extra in (
        {"extra_headers": {"X-Expledger-Domain": "math.arithmetic"}},
        {"metadata": {"expledger_domain": "math.arithmetic"}},
    ):
        completion = proxied.client().chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": question}], **extra
        )
        injected = completion.model_extra["expledger"]["injected"]
        assert injected in ([], [proxied.ids[RATES]])
        assert GEOMETRY not in last_user(proxied.fake.requests[-1])


def test_nothing_above_the_threshold_forwards_the_request_byte_for_byte(proxied):
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "Bonjour, ça va ?"}]}).encode()
    answer = httpx.post(
        proxied.url + "/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {proxied.daemon.token}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert proxied.fake.bodies[-1] == body
    assert answer.headers["x-expledger-injected"] == "" and answer.json()["expledger"] == {"injected": []}


def test_a_bad_api_key_is_refused_with_an_openai_error(proxied):
    with pytest.raises(openai.AuthenticationError) as refused:
        proxied.client("not-the-token").chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": QUESTION}]
        )
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    assert len(proxied.fake.requests) == len(proxied.fake.bodies)  # nothing forwarded is missing from the record


def test_a_malformed_request_names_the_field(proxied):
    with pytest.raises(openai.BadRequestError) as refused:
        proxied.client().chat.completions.create(model="fake-model", messages=[])
    assert refused.value.param == "messages" and "messages" in refused.value.message


def test_models_are_the_upstreams(proxied):
    assert [model.id for model in proxied.client().models.list()] == ["fake-model"]


def test_each_injection_is_counted_as_served_by_the_proxy(proxied):
    geometry = proxied.ids[GEOMETRY]
    before = proxied.daemon.call("usage", {"id": geometry})["experiences"][0]
    proxied.client().chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": QUESTION}],
        extra_headers={"X-Expledger-Domain": "math.geometry"},
    )
    after = proxied.daemon.call("usage", {"id": geometry})["experiences"][0]
    assert after["served_by"]["proxy"] == before["served_by"]["proxy"] + 1
    assert after["usage_count"] == before["usage_count"] + 1 and "math.geometry" in after["domains_applied"]


def test_an_upstream_that_is_down_is_named_in_the_error(tmp_path):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    home = tmp_path / "home"
    init_home(home)
    proxy_config(home, dead)
    with running(home) as daemon:
        client = openai.OpenAI(base_url=(home / "proxy.url").read_text().strip(), api_key=daemon.token, max_retries=0)
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as failed:
                client.chat.completions.create(
                    model="any", messages=[{"role": "user", "content": QUESTION}], stream=stream
                )
            assert failed.value.status_code == 502
            assert failed.value.code == "upstream_unreachable" and dead in failed.value.message
        assert daemon.call("status")["log_size"] == 0  # the node goes on


@pytest.mark.skipif(smollm_missing() is not None, reason=str(smollm_missing()))
def test_smollm_behind_the_proxy_answers_streamed_and_not(tmp_path):
    """The real model as the upstream: the openai package gets its answer through the proxy, whole and streamed,
    each naming the experience injected (what llama.cpp received is not recorded: the fake's tests show that)."""
    home = tmp_path / "home"
    init_home(home)
    with smollm_server(threads=1) as upstream:
        proxy_config(home, upstream)
        with running(home) as daemon:
            exp_id = daemon.call("add", {"text": GEOMETRY, "domain": "math.geometry", "confidence": 0.8})["cid"]
            client = openai.OpenAI(base_url=(home / "proxy.url").read_text().strip(), api_key=daemon.token)
            ask = {"model": "smollm2", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24}
            whole = client.chat.completions.with_raw_response.create(**ask)
            completion = whole.parse()
            assert completion.choices[0].message.content.strip()
            assert (
                completion.model_extra["expledger"]["injected"]
                == [exp_id]
                == whole.headers["x-expledger-injected"].split(",")
            )
            assert completion.usage.prompt_tokens > len(
                f"{QUESTION} {GEOMETRY}".split()
            )  # the template reached the model
            streamed = client.chat.completions.with_raw_response.create(**ask, stream=True)
            assert streamed.headers["x-expledger-injected"] == exp_id
            chunks = [chunk.choices[0].delta.content or "" for chunk in streamed.parse() if chunk.choices]
            assert len(chunks) > 1 and "".join(chunks).strip()
            assert daemon.call("usage", {"id": exp_id})["experiences"][0]["served_by"]["proxy"] == 2
