"""The learning loop against a fake OpenAI-compatible server (real HTTP on 127.0.0.1) and a real daemon:
operations land in the ledger, bad model output is rejected with counted reasons, failures are retried,
and the prompts sent are the seed's templates with every placeholder filled."""

from __future__ import annotations

import json
import os
import re
import string
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.cid import CID
from ledger.params import NetworkParams
from ledger.validation import check_text, examine
from node.config import LlmConfig
from node.dso import prompts
from node.dso.extract import CONSOLIDATE_OPTIONS, CRITIQUE_OPTIONS
from node.dso.grading import default_grader, final_answer, load_grader
from node.dso.llm import LlmClient, LlmError, LlmOutputError, LlmSettings
from node.dso.parsing import Rejected, ShortIds, check_proposal, json_value, operation_items
from tests.daemons import EXPLEDGER, Daemon, expledger, init_home, start
from tests.dso_fakes import Reply, fake_llm, stage

SPEED = "When computing an average speed, divide total distance by total time."
RATE = "When a rate problem gives distance and time, divide distance by time rather than multiplying."
REFINED = "When computing an average speed, divide the total distance by the total time, never multiply them."
FACTORIAL = "When arranging distinct objects in a row, count orderings with a factorial."
TOO_LONG = "When " + " ".join(["reasoning"] * 40) + ", stop."
PARAMS = NetworkParams()
#: llama.cpp's answer when what the model wrote under a response_format fails the server's own parser
OUTPUT_FAILED = json.dumps(
    {
        "error": {
            "code": 500,
            "message": "The model produced output that does not match the expected peg-native format",
            "type": "server_error",
        }
    }
).encode()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("dso") / "home"
    init_home(home)
    daemon = start(home)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def spare_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A node of its own, for tests whose experiences must not change what the other tests retrieve."""
    home = tmp_path_factory.mktemp("dso-spare") / "home"
    init_home(home)
    daemon = start(home)
    try:
        yield daemon
    finally:
        daemon.stop()


def dso(home: Path, url: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EXPLEDGER_LLM_BASE_URL": url}
    return subprocess.run(
        [str(EXPLEDGER), "dso", *args, "--home", str(home), "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def follows_template(prompt: str, name: str, filled: bool = True) -> bool:
    """The template's fixed text appears in the prompt, in order, and (`filled`) no placeholder is left."""
    text = prompts.template(name)
    pattern = "|".join(re.escape(placeholder) for placeholder in prompts.PLACEHOLDERS[name])
    position = 0
    for part in re.split(pattern, text):
        found = prompt.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return not (filled and prompts.unfilled(prompt))


def short_id(prompt: str, text: str) -> str:
    found = re.search(r"\[(exp_\w+)\] " + re.escape(text), prompt)
    assert found, f"{text!r} is not in the prompt's library"
    return found.group(1)


def rollouts_file(path: Path, speed_id: str) -> Path:
    groups = [
        {
            "problem": "A train travels 60 km in 1.5 hours. What is its average speed in km/h?",
            "answer": "40",
            "domain": "math.arithmetic",
            "rollouts": [
                {"trajectory": "60 / 1.5 = 40. Answer: 40", "correct": True, "experiences": [speed_id]},
                {"trajectory": "60 * 1.5 = 90. Answer: 90", "correct": False, "experiences": [speed_id]},
                {"trajectory": "Distance over time gives 40. Answer: 40", "correct": True, "reward": 1.0},
            ],
        },
        {
            "problem": "How many ways can 3 different books be arranged on a shelf?",
            "answer": "6",
            "domain": "math.combinatorics",
            "rollouts": [
                {"trajectory": "3! = 6. Answer: 6", "correct": True},
                {"trajectory": "3 * 3 = 9. Answer: 9", "correct": False},
            ],
        },
        {
            "problem": "What is 7 + 5?",
            "answer": "12",
            "rollouts": [
                {"trajectory": "12. Answer: 12", "correct": True},
                {"trajectory": "Answer: 12", "correct": True},
            ],
        },
    ]
    path.write_text("".join(json.dumps(group) + "\n" for group in groups))
    return path


def scripted(request: dict[str, Any]) -> Reply:
    """A model that answers each stage with a mix of good, repairable and bad output."""
    prompt = request["messages"][-1]["content"]
    match stage(request):
        case "summarize":
            return Reply("Step 1: divided distance by time. Outcome as graded.")
        case "critique" if "A train travels" in prompt:
            body = [{"option": "add", "experience": RATE}]
            if SPEED in prompt:
                body.append({"option": "modify", "old_id": short_id(prompt, SPEED), "experience": REFINED})
            return Reply(f"Here is my analysis.\n```json\n{json.dumps(body)}\n```\nHope this helps!")
        case "critique":
            body = [
                {"option": "add", "experience": FACTORIAL},
                {"option": "rewrite", "experience": FACTORIAL},
                {"option": "delete", "exp_id": "exp_nothere"},
                {"option": "add", "experience": "When stuck, reread the problem statement carefully."},
                {"option": "add", "experience": "When done, check the units of the answer."},
            ]
            return Reply(json.dumps({"operations": body}))
        case "consolidate":
            speed = short_id(prompt, SPEED) if SPEED in prompt else "exp_unseen"
            body = [
                {"option": "add", "experience": RATE, "reason": "New insight from Group 1"},
                {"option": "modify", "old_id": speed, "experience": REFINED, "reason": "Group 1 showed it"},
                {"option": "add", "experience": FACTORIAL, "reason": "from Group 2"},
                {"option": "add", "experience": "When a sum equals a total, write a = b and solve."},
                {"option": "add", "experience": TOO_LONG},
                {"option": "add", "experience": "Always check your work."},
                {"option": "merge", "exp_ids": [speed], "experience": REFINED},
                {"option": "delete", "exp_id": "exp_ghost"},
                "not an object",
            ]
            return Reply(json.dumps(body) + "\n\nThese are the final operations.")
    return Reply("Answer: 0")


def test_extract_submits_valid_operations_and_rejects_bad_output_with_reasons(node: Daemon, tmp_path: Path) -> None:
    speed_id = node.call("add", {"text": SPEED, "domain": "math.arithmetic", "confidence": 0.6})["cid"]
    size = node.call("status")["log_size"]
    rollouts = rollouts_file(tmp_path / "rollouts.jsonl", speed_id)
    with fake_llm(scripted) as llm:
        result = dso(node.home, llm.url, "extract", "--rollouts", str(rollouts))
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)

        assert (report["groups"], report["skipped_uniform"], report["suggested"]) == (3, 1, 3)
        assert report["operations"] == {"add": 2, "modify": 1}
        assert report["outcomes"] == {"applied": 3}
        assert report["rejections"] == {
            "op.unknown_option": 1,
            "op.unknown_id": 1,
            "group.too_many_ops": 2,
            "text.generality.equation": 1,
            "text.length": 1,
            "text.structure": 1,
            "batch.too_many_ops": 3,
        }
        assert report["usage"]["summarize"]["calls"] == 5  # the uniform group's rollouts are not summarized
        assert "rejected (op.unknown_option)" in result.stderr  # every rejection is logged with its reason

        # the prompts are the seed's templates, every placeholder filled, the library under short ids
        for name, marker in (
            ("summarize", "Please summarize the trajectory"),
            ("critique", "Review these problem-solving attempts"),
            ("consolidate", "Consolidate suggested experience updates"),
        ):
            sent = llm.prompts(marker)
            assert sent and all(follows_template(prompt, name) for prompt in sent), name
        summaries = llm.prompts("Please summarize the trajectory")
        assert sum(f"] {SPEED}" in prompt for prompt in summaries) >= 2  # the experiences in each rollout's context
        assert "Trajectory 2 (wrong):" in llm.prompts("Review these problem-solving attempts")[0]
        assert "Group 1: " in llm.prompts("Consolidate suggested")[0]

    assert node.call("status")["log_size"] == size + 3
    shown = node.call("get", {"id": speed_id})
    assert shown["text"] == REFINED and shown["library"]["conflicted"] is False
    added = {hit["text"]: hit for hit in node.call("retrieve", {"query": RATE, "k": 10, "threshold": 0.5})["hits"]}
    assert RATE in added
    source = node.call("get", {"id": added[RATE]["id"]})["metadata"]["source"]
    assert re.fullmatch(r"dso problem=[0-9a-f]{12} rollouts=3 correct=2 model=fake-model", source), source
    assert node.call("get", {"id": added[RATE]["id"]})["confidence"] == 0.94  # 2 of 3 correct


def test_dry_run_writes_signed_valid_operations_and_submits_nothing(node: Daemon, tmp_path: Path) -> None:
    speed = node.call(
        "add", {"text": "When a speed is asked, divide the distance by the time.", "domain": "math", "confidence": 0.5}
    )
    size = node.call("status")["log_size"]
    out = tmp_path / "ops.jsonl"
    with fake_llm(scripted) as llm:
        result = dso(
            node.home,
            llm.url,
            "extract",
            "--rollouts",
            str(rollouts_file(tmp_path / "r.jsonl", speed["cid"])),
            "--dry-run",
            str(out),
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["submitted"] is False
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and node.call("status")["log_size"] == size
    for line in lines:
        block, errors = examine(bytes.fromhex(line["hex"]), PARAMS)
        assert not errors and str(block.cid) == line["cid"]
    receipt = node.call("submit", {"operation": lines[0]["hex"]})  # what it wrote is what would have been sent
    assert receipt["verdict"] == "accepted"


def test_a_bad_rollouts_file_is_refused_naming_the_line_and_field(node: Daemon, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "p", "answer": "a", "rollouts": [{"trajectory": "t", "correct": "yes"}]}\n')
    result = dso(node.home, "http://127.0.0.1:9/v1", "extract", "--rollouts", str(path))
    assert result.returncode == 2
    assert f"{path}:1: rollouts[0].correct: expected true or false" in result.stderr


def test_an_endpoint_that_is_down_is_one_clear_error(node: Daemon, tmp_path: Path) -> None:
    speed = node.call(
        "add",
        {
            "text": "When two trains meet, add their speeds to get the closing speed.",
            "domain": "math",
            "confidence": 0.5,
        },
    )
    result = subprocess.run(
        [
            str(EXPLEDGER),
            "dso",
            "extract",
            "--home",
            str(node.home),
            "--rollouts",
            str(rollouts_file(tmp_path / "r.jsonl", speed["cid"])),
            "--max-retries",
            "1",  # not [llm]'s 4, which would wait 7.5 s for the same answer
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EXPLEDGER_LLM_BASE_URL": "http://127.0.0.1:9/v1", "EXPLEDGER_LLM_MODEL": "m"},
    )
    assert result.returncode == 4
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("expledger: error: llm.unreachable: the LLM endpoint http://127.0.0.1:9/v1 failed 2 times")
    assert "EXPLEDGER_LLM_BASE_URL" in error
    refused = expledger("dso", "extract", "--home", str(node.home), "--rollouts", "r.jsonl", "--max-retries", "21")
    assert refused.returncode == 2 and "--max-retries: must be from 0 to 20, got 21" in refused.stderr


def test_an_answer_the_server_failed_on_or_cut_off_is_a_counted_rejection(spare_node: Daemon, tmp_path: Path) -> None:
    speed = spare_node.call(
        "add",
        {
            "text": "When a speed is asked for, divide the distance by the time taken.",
            "domain": "math",
            "confidence": 0.5,
        },
    )

    def failing(request: dict[str, Any]) -> Reply:
        match stage(request):
            case "summarize":
                return Reply("Step 1: divided distance by time.")
            case "critique" if "A train travels" in request["messages"][-1]["content"]:
                return Reply(status=500, raw=OUTPUT_FAILED)
            case "critique":
                return Reply('{"operations": [{"option": "add", "experience": "When arranging', finish_reason="length")
        return Reply("")

    with fake_llm(failing) as llm:
        rollouts = rollouts_file(tmp_path / "r.jsonl", speed["cid"])
        result = dso(spare_node.home, llm.url, "extract", "--rollouts", str(rollouts))
        critiques = [request for request in llm.requests if stage(request) == "critique"]
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rejections"] == {"llm.bad_output": 1, "parse.truncated": 1}
    assert report["rejected_at"] == {"critique answer": 2}
    assert "consolidate" not in report["usage"]  # no group suggested anything
    usage = report["usage"]["critique"]
    assert (usage["calls"], usage["retries"], usage["failed"], usage["truncated"]) == (2, 0, 1, 1)
    # not retried (the model would write it again) and not taken as a refusal of the format
    assert [request["response_format"]["type"] for request in critiques] == ["json_schema", "json_schema"]
    for request in critiques:
        schema = request["response_format"]["json_schema"]["schema"]
        assert request["max_tokens"] == prompts.answer_tokens(schema)  # sized from the schema
        assert schema["properties"]["operations"]["minItems"] == 1  # a mixed group has something to teach


def test_a_cap_on_answer_tokens_asks_for_fewer_operations(spare_node: Daemon, tmp_path: Path) -> None:
    speed = spare_node.call(
        "add",
        {"text": "When a pace is asked for, divide the distance by the time.", "domain": "math", "confidence": 0.5},
    )
    cap = 400
    with fake_llm(lambda request: Reply('{"operations": []}')) as llm:
        result = dso(
            spare_node.home,
            llm.url,
            "extract",
            "--rollouts",
            str(rollouts_file(tmp_path / "r.jsonl", speed["cid"])),
            "--max-tokens",
            str(cap),
        )
        critiques = [request for request in llm.requests if stage(request) == "critique"]
    assert result.returncode == 0, result.stderr
    for request in critiques:
        schema = request["response_format"]["json_schema"]["schema"]
        operations = schema["properties"]["operations"]
        assert request["max_tokens"] == prompts.answer_tokens(schema) <= cap
        wider = prompts.operations_schema(CRITIQUE_OPTIONS, operations["maxItems"] + 1, ids_of(schema), least=1)
        assert prompts.answer_tokens(wider) > cap  # as many operations as fit


def ids_of(schema: dict[str, Any]) -> list[str]:
    shapes = schema["properties"]["operations"]["items"]["anyOf"]
    return next((shape["properties"]["exp_id"]["enum"] for shape in shapes if "exp_id" in shape["properties"]), [])


# --- the client: retries, time-outs, formats ----------------------------------------------------------------


def client(url: str, **settings: Any) -> LlmClient:
    values = {"base_url": url, "max_retries": 2, "timeout": 5, **settings}
    config = LlmConfig(**{key: value for key, value in values.items() if key != "base_url"})
    return LlmClient(LlmSettings.resolve(config, {}, base_url=values["base_url"]), sleep=lambda seconds: None)


def test_a_time_out_is_retried_and_counted() -> None:
    calls = []

    def slow_first(request: dict[str, Any]) -> Reply:
        calls.append(request)
        return Reply("late", delay=3.0) if len(calls) == 1 else Reply("on time")

    with fake_llm(slow_first) as llm:
        answer = client(llm.url, timeout=1).complete([{"role": "user", "content": "hi"}], purpose="test")
    assert (answer.text, answer.attempts) == ("on time", 2)


def test_rate_limits_and_server_errors_are_retried_then_reported() -> None:
    script = iter([Reply(status=429, headers={"Retry-After": "0"}), Reply(status=503), Reply("fine")])
    with fake_llm(lambda request: next(script)) as llm:
        llm_client = client(llm.url)
        assert llm_client.complete([{"role": "user", "content": "hi"}], purpose="test").text == "fine"
        assert llm_client.usage["test"].retries == 2
    with fake_llm(lambda request: Reply(status=500)) as llm, pytest.raises(LlmError) as failed:
        client(llm.url, response_format="none").complete([{"role": "user", "content": "hi"}], purpose="test")
    assert failed.value.code == "llm.failed" and "failed 3 times (HTTP 500)" in failed.value.message


def test_a_server_that_refuses_json_schema_is_asked_with_a_json_object() -> None:
    def picky(request: dict[str, Any]) -> Reply:
        if request.get("response_format", {}).get("type") == "json_schema":
            return Reply(status=500)
        return Reply('{"operations": []}')

    with fake_llm(picky) as llm:
        llm_client = client(llm.url)
        for _ in range(2):
            text = llm_client.complete([{"role": "user", "content": "x"}], purpose="t", schema={"type": "object"}).text
            assert text == '{"operations": []}'
        formats = [request.get("response_format", {}).get("type") for request in llm.requests]
    assert formats == ["json_schema", "json_object", "json_object"]  # it remembers what the server takes


def test_a_server_that_fails_on_the_models_output_has_not_refused_the_format() -> None:
    script = iter([Reply(status=500, raw=OUTPUT_FAILED), Reply('{"operations": []}')])
    with fake_llm(lambda request: next(script)) as llm:
        llm_client = client(llm.url)
        with pytest.raises(LlmOutputError) as failed:
            llm_client.complete([{"role": "user", "content": "x"}], purpose="t", schema={"type": "object"})
        answer = llm_client.complete([{"role": "user", "content": "x"}], purpose="t", schema={"type": "object"})
        formats = [request["response_format"]["type"] for request in llm.requests]
    assert failed.value.code == "llm.bad_output" and "does not match the expected" in failed.value.message
    assert answer.text == '{"operations": []}' and formats == ["json_schema", "json_schema"]
    usage = llm_client.usage["t"]
    assert (usage.calls, usage.retries, usage.failed) == (2, 0, 1)


def test_a_malformed_http_body_is_retried() -> None:
    script = iter([Reply(raw=b"<html>oops"), Reply("ok")])
    with fake_llm(lambda request: next(script)) as llm:
        assert client(llm.url).complete([{"role": "user", "content": "x"}], purpose="t").text == "ok"


# --- parsing and checking model output -----------------------------------------------------------------------


@given(
    before=st.text(alphabet=st.characters(blacklist_characters="[]{}`"), max_size=40),
    after=st.text(max_size=40),
    value=st.lists(
        st.fixed_dictionaries({"option": st.sampled_from(["add", "delete"]), "n": st.integers()}), max_size=4
    ),
    fenced=st.booleans(),
)
def test_the_json_is_found_in_prose_and_fences(before: str, after: str, value: list[Any], fenced: bool) -> None:
    body = json.dumps(value)
    text = f"{before}\n```json\n{body}\n```\n{after}" if fenced else f"{before} {body} {after}"
    assert json_value(text) == value


def test_answers_without_usable_json_are_rejected() -> None:
    with pytest.raises(Rejected) as no_json:
        operation_items("I think you should add an experience about speed.")
    assert no_json.value.code == "parse.no_json"
    with pytest.raises(Rejected) as shape:
        operation_items('{"a": [1], "b": [2]}')
    assert shape.value.code == "parse.shape"
    assert operation_items('{"option": "add", "experience": "x"}') == [{"option": "add", "experience": "x"}]


def test_each_bad_proposal_has_its_reason() -> None:
    from ledger.cid import CID

    ids, known = ShortIds(), CID.parse("bafyreifq7r2uherxem24ty3bsgpnav5eoxltdpwhpdksbvpsg77kdl3axu")
    name = ids.name(known)
    options = ("add", "modify", "merge", "delete")

    def reason(item: Any) -> str:
        with pytest.raises(Rejected) as rejected:
            check_proposal(item, options, ids, {known}, PARAMS)
        return rejected.value.code

    assert reason(["add"]) == "op.not_object"
    assert reason({"option": "upsert", "experience": SPEED}) == "op.unknown_option"
    assert reason({"option": "modify", "experience": SPEED}) == "op.missing_id"
    assert reason({"option": "modify", "old_id": "exp_zzzzzz", "experience": SPEED}) == "op.unknown_id"
    assert reason({"option": "merge", "exp_ids": [name, name], "experience": SPEED}) == "op.merge_targets"
    assert reason({"option": "add", "experience": "  "}) == "op.missing_text"
    assert reason({"option": "add", "experience": "Check it."}) == "text.structure"
    proposal = check_proposal(
        {"option": "MODIFY", "old_id": f"[{name.upper()}]", "experience": SPEED}, options, ids, {known}, PARAMS
    )
    assert proposal.targets == (known,) and proposal.option == "modify"


@given(st.from_regex(prompts.EXPERIENCE_SCHEMA["pattern"], fullmatch=True))
def test_every_experience_the_schema_admits_is_json_as_written_bounded_and_valid(text: str) -> None:
    # a grammar that copies pattern characters without escaping them cannot end the JSON string early
    assert json.dumps(text) == f'"{text}"'
    # the pattern itself bounds the length: llama.cpp ignores maxLength beside a pattern
    assert len(text) <= prompts.EXPERIENCE_SCHEMA["maxLength"]
    assert check_text(" ".join(text.split()), PARAMS) == []  # 32 words, a context clause, no constants


def test_the_experience_schema_refuses_what_broke_json_or_the_ledger() -> None:
    pattern = re.compile(prompts.EXPERIENCE_SCHEMA["pattern"])
    for text in (
        'When you add a new item to your list", you should check it',  # a raw quote ended the string
        "When the train travels 60 km, divide the distance by the time it takes.",
        "When " + " ".join(["reasoning"] * 12) + ", " + " ".join(["check"] * 20),
        "When... then...",
    ):
        assert pattern.fullmatch(text) is None, text


def answers(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Any value of the bounded schemas prompts.operations_schema builds."""
    if "anyOf" in schema:
        return st.one_of(*(answers(option) for option in schema["anyOf"]))
    if schema.get("type") == "object":
        return st.fixed_dictionaries({key: answers(value) for key, value in schema["properties"].items()})
    if schema.get("type") == "array":
        return st.lists(
            answers(schema["items"]),
            min_size=schema.get("minItems", 0),
            max_size=schema["maxItems"],
            unique=schema.get("uniqueItems", False),
        )
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    return st.text(string.ascii_letters + " .,", max_size=schema["maxLength"])


@given(
    data=st.data(),
    consolidation=st.booleans(),
    most=st.integers(1, 6),
    known=st.integers(0, 3),
)
def test_every_answer_the_operations_schema_admits_fits_its_budget_and_passes_the_checks(
    data: st.DataObject, consolidation: bool, most: int, known: int
) -> None:
    ids = ShortIds()
    cids = [CID.for_block(bytes([number])) for number in range(known)]
    names = [ids.name(cid) for cid in cids]
    options = CONSOLIDATE_OPTIONS if consolidation else CRITIQUE_OPTIONS
    schema = prompts.operations_schema(options, most, names, least=0 if consolidation else 1, reason=consolidation)
    answer = data.draw(answers(schema))
    assert len(json.dumps(answer, separators=(",", ":"))) <= prompts.answer_chars(schema)
    assert prompts.answer_tokens(schema) * prompts.CHARS_PER_TOKEN >= prompts.answer_chars(schema)
    for item in operation_items(json.dumps(answer, indent=2)):
        check_proposal(item, options, ids, set(cids), PARAMS)  # raises Rejected if the schema let a bad one by


def test_prompts_fill_every_placeholder_even_with_braces_in_the_values() -> None:
    shown = [prompts.Shown("exp_abc123", "When {query} appears, do not expand it.")]
    prompt = prompts.summarize(shown, "What is {answer}?", "I tried {x}.", False, "{none}")
    assert follows_template(prompt, "summarize", filled=False) and "OUTCOME: wrong" in prompt
    assert "What is {answer}?" in prompt  # a value is not filled again
    with pytest.raises(ValueError):
        prompts.fill("consolidate", {"{experience_library}": ""})


def test_grading_exact_and_numeric_and_pluggable() -> None:
    assert default_grader("so the speed is 40 km/h.\nAnswer: 40", "40")
    assert default_grader("Answer: 40.0", "40") and default_grader("Answer: 1/2", "0.5")
    assert default_grader("the result is \\boxed{1,000}", "1000")
    assert not default_grader("Answer: 41", "40")
    assert default_grader("Final answer: Paris.", "paris")
    assert final_answer("first 3 then 4") == "4"
    assert load_grader("operator:eq")("a", "a")


# --- the training loop ----------------------------------------------------------------------------------------


def test_run_reports_each_epoch_and_resumes_after_an_interruption(node: Daemon, tmp_path: Path) -> None:
    problems = tmp_path / "problems.jsonl"
    problems.write_text(
        json.dumps(
            {
                "problem": "A car covers 120 km in 2 hours. What is its average speed in km/h?",
                "answer": "60",
                "domain": "math",
            }
        )
        + "\n"
        + json.dumps({"problem": "What is the capital of France?", "answer": "Paris", "domain": "geography"})
        + "\n"
    )
    turns = {"rollout": 0}

    def model(request: dict[str, Any]) -> Reply:
        name = stage(request)
        if name == "rollout":
            turns["rollout"] += 1
            assert request["temperature"] == 0.7 and "# Problem" in request["messages"][-1]["content"]
            return Reply("Answer: 60" if turns["rollout"] % 2 else "Answer: 50")
        if name == "critique":
            return Reply(
                json.dumps(
                    [
                        {
                            "option": "add",
                            "experience": "When a question asks for a rate, relate each quantity to the elapsed time.",
                        }
                    ]
                )
            )
        if name == "consolidate":
            return Reply(
                json.dumps(
                    [
                        {
                            "option": "add",
                            "experience": "When a question asks for a rate, relate each quantity to the elapsed time.",
                            "reason": "Group 1",
                        }
                    ]
                )
            )
        return Reply("A summary.")

    state = tmp_path / "state.json"
    with fake_llm(model) as llm:
        first = dso(
            node.home,
            llm.url,
            "run",
            "--problems",
            str(problems),
            "--epochs",
            "1",
            "--group-size",
            "3",
            "--batch-size",
            "1",
            "--state",
            str(state),
        )
        assert first.returncode == 0, first.stderr
        assert turns["rollout"] == 6
        second = dso(
            node.home,
            llm.url,
            "run",
            "--problems",
            str(problems),
            "--epochs",
            "2",
            "--group-size",
            "3",
            "--batch-size",
            "1",
            "--state",
            str(state),
        )
        assert second.returncode == 0, second.stderr
    assert turns["rollout"] == 12  # epoch 1 was not done again
    assert "resuming from" in second.stderr and "epoch 2/2 batch 2/2: problem 1/1" in second.stderr
    epochs = json.loads(second.stdout)["epochs"]
    assert [epoch["epoch"] for epoch in epochs] == [1, 2]
    for epoch in epochs:
        assert epoch["rollouts"] == 6 and 0 < epoch["accuracy"] < 1
        assert epoch["library_size"] >= 1 and "rejections" in epoch
    # only the speed problem's group is mixed (the other's rollouts are all wrong); the same insight again is absorbed
    assert [(epoch["operations"], epoch["outcomes"], epoch["skipped_uniform"]) for epoch in epochs] == [
        ({"add": 1}, {"applied": 1}, 1),
        ({"add": 1}, {"absorbed": 1}, 1),
    ]


def test_a_state_file_of_another_run_is_refused(node: Daemon, tmp_path: Path) -> None:
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps({"problem": "What is 2 + 2?", "answer": "4"}) + "\n")
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"version": 1, "fingerprint": "other", "epoch": 0, "batch": 0, "epochs": []}))
    result = dso(node.home, "http://127.0.0.1:9/v1", "run", "--problems", str(problems), "--state", str(state))
    assert result.returncode == 2 and "state.mismatch" in result.stderr


def test_the_shipped_problem_file_parses() -> None:
    from node.dso.loop import read_problems

    root = Path(__file__).resolve().parent.parent
    assert len(read_problems(root / "data" / "dso" / "problems.jsonl", PARAMS)) >= 8
    assert sys.executable  # the same interpreter runs the CLI
