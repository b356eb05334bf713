"""Structured output over the OpenAI API: ``response_format`` ``json_schema`` and
``json_object`` on /v1/chat/completions and /v1/completions, streamed and not, greedy and sampled
with seeds; the reply parses and validates against its schema (``jsonschema`` when installed). Bad
or unsupported schemas are a 400 naming the problem. The real ``openai`` client and raw HTTP against
three real workers, the coordinator and uvicorn in this process; the demo's tiny random model."""

from __future__ import annotations

import json
import re

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("outlines_core")

from helix.net.sampling import SamplingParams  # noqa: E402
from tests.builders.stack import MODEL_NAME, local_stack  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "sunny": {"type": "boolean"},
    "rank": {"type": "integer", "maxDigits": 3},
    "kind": {"enum": ["town", "village", "metropolis"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 5}]}},
    "required": ["city", "sunny", "rank", "kind", "tags"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": "Describe a place as JSON."}]
SAMPLINGS = [{"temperature": 0.0}, {"temperature": 1.0, "seed": 1}, {"temperature": 1.0, "seed": 2},
             {"temperature": 1.0, "seed": 3}, {"temperature": 0.8, "top_p": 0.9, "seed": 4}]


def validate(doc, schema=SCHEMA) -> None:
    """``jsonschema`` when installed; by hand otherwise (the keys and types this schema names)."""
    try:
        import jsonschema
    except ImportError:
        assert isinstance(doc, dict) and set(schema["required"]) <= set(doc) <= set(schema["properties"])
        assert isinstance(doc["city"], str) and len(doc["city"]) <= 10
        assert isinstance(doc["sunny"], bool) and type(doc["rank"]) is int
        assert doc["kind"] in ("town", "village", "metropolis")
        assert all(isinstance(t, str) and len(t) <= 4 for t in doc["tags"]) and len(doc["tags"]) <= 3
        return
    jsonschema.validate(doc, schema)


@pytest.fixture(scope="module")
def stack(tiny_stack):
    return tiny_stack


@pytest.fixture(scope="module")
def client(openai_client):
    return openai_client.with_options(timeout=120)   # the first compile of a schema can be slow


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_chat_json_schema_validates(client, sampling):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=300,
                                           response_format=FORMAT, **sampling)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    validate(json.loads(choice.message.content))


def test_free_text_from_the_same_model_is_no_json(client):
    """What the constraint changes: the random model left free writes no JSON (so the tests above
    can fail)."""
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=60,
                                           temperature=0.0)
    with pytest.raises(ValueError):
        json.loads(reply.choices[0].message.content)


@pytest.mark.parametrize("seed", [None, 5, 6])
def test_completions_json_schema_validates(client, seed):
    reply = client.completions.create(model=MODEL_NAME, prompt="A place:", max_tokens=300, seed=seed,
                                      temperature=0.0 if seed is None else 1.0,
                                      extra_body={"response_format": FORMAT})
    assert reply.choices[0].finish_reason == "stop"
    validate(json.loads(reply.choices[0].text))


@pytest.mark.parametrize("seed", [None, 11, 12])
def test_json_object_gives_an_object(client, seed):
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=300,
                                           seed=seed, temperature=0.0 if seed is None else 1.0,
                                           response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_streamed_equals_non_streamed(client):
    whole = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=300,
                                           temperature=1.0, seed=9, response_format=FORMAT)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=300,
                                            temperature=1.0, seed=9, response_format=FORMAT,
                                            stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert text == whole.choices[0].message.content
    validate(json.loads(text))
    comp = client.completions.create(model=MODEL_NAME, prompt="A place:", max_tokens=300,
                                     temperature=0.0, stream=True, extra_body={"response_format": FORMAT})
    validate(json.loads("".join(c.choices[0].text for c in comp)))


@pytest.mark.parametrize("response_format,match", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}},
     "type.*frobnicate|frobnicate.*type"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1, 2]}}, "must be a JSON object"),
    ({"type": "json_schema", "json_schema": "nope"}, "json_schema must be an object"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}},
     r"schema.properties.n: keyword 'minimum' is not supported"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}},
     "pattern"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 2}}}, "min/max"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}},
     "reference"),
    ({"type": "yaml"}, "response_format.type must be"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"c": {"enum": []}}}}}, r"schema.properties.c.enum is empty"),
])
def test_bad_schemas_are_a_400_naming_the_problem(stack, response_format, match):
    for path, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "x"})):
        r = httpx.post(stack.url + path, timeout=30,
                       json={"model": MODEL_NAME, "max_tokens": 5, "response_format": response_format, **body})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "\n" not in message and re.search(match, message), message


def test_a_schema_that_breaks_the_meta_schema_is_a_400(stack):
    """Malformed keywords outlines would ignore (``jsonschema``'s meta-schema check; Ray brings it)."""
    pytest.importorskip("jsonschema")
    for schema, where in (({"type": "object", "required": "city"}, "schema.required"),
                          ({"type": "string", "minLength": "x"}, "schema.minLength")):
        r = httpx.post(stack.url + "/v1/chat/completions", timeout=30, json={
            "model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 5,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
        assert r.status_code == 400 and where in r.json()["error"]["message"], r.text


def test_tools_are_still_refused_by_name(client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="tools are not supported"):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=[tool],
                                       response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match="tool_choice is not supported"):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tool_choice="required")


def test_requests_moved_off_a_dead_node_keep_their_format(tiny_model):
    """cpu-2 (the last stage of one pipeline) stops mid-generation: its guided requests move to
    cpu-0 -> cpu-1, whose last stage rebuilds each automaton from the tokens already generated,
    so every reply is the one an undisturbed run gives (greedy) and still validates."""
    from helix.server.structured import guided_regex
    from tests.builders.traffic import in_flight_on, submit_all, until
    params = SamplingParams(temperature=0.0, max_tokens=300, guided_regex=guided_regex(FORMAT))
    prompts = [[1, 30 + k, 31, 32 + k] for k in range(6)]

    def run(stack, kill: bool):
        results, threads = submit_all(stack.coordinator, prompts, len(prompts), params)
        if kill:
            until(lambda: in_flight_on(stack.coordinator, "cpu-2"), 30, "a request on cpu-2")
            stack.servers[2].shutdown()
        for t in threads:
            t.join(timeout=120)
        for tokens, done in results:
            assert done.error is None and done.finish_reason == "stop", done
        return [tokens for tokens, _ in results]
    with local_stack(tiny_model[0]) as stack:
        reference = run(stack, kill=False)
    with local_stack(tiny_model[0]) as stack:
        moved = run(stack, kill=True)
        assert stack.coordinator.requests_moved >= 1
    assert moved == reference
    for tokens in moved:
        validate(json.loads(stack.coordinator.codec.decode(tokens)))


def test_openai_parse_with_a_pydantic_model(client):
    """The openai client's own structured-output path: ``chat.completions.parse`` sends the model's
    strict JSON schema (titles, ``additionalProperties: false``) and parses the reply into it."""
    from typing import Literal

    from pydantic import BaseModel, Field

    class Place(BaseModel):
        city: str = Field(max_length=12)
        sunny: bool
        kind: Literal["town", "village"]
    for seed in (None, 21, 22):
        reply = client.chat.completions.parse(model=MODEL_NAME, messages=MESSAGES, max_tokens=300,
                                              response_format=Place, seed=seed,
                                              temperature=0.0 if seed is None else 1.0)
        place = reply.choices[0].message.parsed
        assert isinstance(place, Place) and len(place.city) <= 12


def test_langchain_with_structured_output(stack):
    """LangChain's ``with_structured_output(method="json_schema")`` (skipped without it)."""
    langchain_openai = pytest.importorskip("langchain_openai")
    schema = {"title": "place", "description": "A place.", "type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"], "additionalProperties": False}
    llm = langchain_openai.ChatOpenAI(model=MODEL_NAME, base_url=stack.url + "/v1", api_key="none",
                                      temperature=0, max_tokens=200, max_retries=0, timeout=60)
    out = llm.with_structured_output(schema, method="json_schema").invoke("Describe a place.")
    assert set(out) == {"city", "sunny"} and isinstance(out["sunny"], bool)


@pytest.mark.timeout(120)
def test_a_schema_too_complex_to_compile_is_a_400_not_a_500(stack):
    """The worker refuses it (its automaton did not compile in time): the request's own fault, so
    HTTP 400 / an invalid_request_error event, as for a schema the server refuses itself."""
    guides = [s.engine.guides for s in stack.servers if s.engine.guides is not None]   # last stages
    assert guides
    for g in guides:
        g.compile_timeout_s = 2.0
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "string",
                                                                          "maxLength": 10**8}}}
    try:
        body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 5, "response_format": fmt}
        r = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert "did not compile within 2 s" in r.json()["error"]["message"]
        with httpx.stream("POST", stack.url + "/v1/chat/completions", json={**body, "stream": True},
                          timeout=60) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        assert events[-1]["error"]["type"] == "invalid_request_error"
    finally:
        for g in guides:
            g.compile_timeout_s = 60.0
