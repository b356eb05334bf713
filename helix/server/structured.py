"""Structured output: an OpenAI ``response_format`` turned into the regular expression the reply must
match (``SamplingParams.guided_regex``), checked once, here, so that a bad schema is a 400.

``{"type": "text"}`` (or none) constrains nothing. ``{"type": "json_object"}`` is a JSON object
(nested at most two levels, :data:`JSON_OBJECT`);
``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` is a JSON document valid
against ``schema`` (a missing ``schema`` is what ``json_object`` allows). The regex comes from
``outlines_core.json_schema.build_regex_from_schema``; the last stage compiles it into a token
automaton and masks sampling with it (:mod:`worker.guided`). Whitespace between JSON tokens is at
most one space (outlines' default allows any run of blanks, which a model can fill until
``max_tokens``); ``strict`` is accepted and changes nothing, as every schema is enforced.

A schema is checked against its JSON-schema meta-schema first (``jsonschema``, which Ray brings;
skipped without it), as outlines ignores malformed keywords (``"required": "a"``). Keywords
``outlines_core`` would silently ignore (numeric bounds, ``uniqueItems``, ``not``,
``if``/``then``/``else``, ...) are refused: a reply that does not validate against the schema the
client sent would be worse than a 400 naming the keyword.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from helix.core.errors import HelixUserError

WHITESPACE = r"[ ]?"
"""Whitespace allowed between JSON tokens (one optional space)."""

UNSUPPORTED_KEYWORDS = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems",
    "minProperties", "maxProperties", "patternProperties", "propertyNames", "unevaluatedProperties",
    "dependentRequired", "dependentSchemas", "dependencies", "not", "if", "then", "else"})
"""JSON-schema assertions that ``outlines_core`` (0.2) drops without a word (measured: the regex
is the same with and without them)."""

# Where a schema holds sub-schemas: one schema, a list of them, or a name -> schema map.
_ONE = ("items", "additionalProperties", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions")

_SCALARS = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]
JSON_OBJECT = {"type": "object", "additionalProperties": {"anyOf": [
    *_SCALARS, {"type": "array", "items": {"anyOf": _SCALARS}},
    {"type": "object", "additionalProperties": {"anyOf": _SCALARS}}]}}
"""What ``json_object`` allows: a JSON object whose values are scalars, or arrays or objects of
scalars (two levels). A regex cannot describe unbounded nesting; outlines' own three-level form of
``{"type": "object"}`` took 5-21 s to compile over the 297-token demo vocabulary, this one 0.1-0.5 s
(``scripts/bench_structured.py``)."""


def guided_regex(response_format: dict | None) -> str | None:
    """The regex a reply under ``response_format`` must match, or None when it is free text;
    :class:`HelixUserError` (one line, naming the field) for anything malformed or unsupported."""
    if response_format is None:
        return None
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return _regex(json.dumps(JSON_OBJECT))
    if kind != "json_schema":
        raise HelixUserError(f"response_format.type must be 'text', 'json_object' or 'json_schema', "
                             f"got {kind!r:.60}")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise HelixUserError("response_format.json_schema must be an object with 'name' and 'schema'")
    if "strict" in spec and not isinstance(spec["strict"], (bool, type(None))):
        raise HelixUserError(f"response_format.json_schema.strict must be true or false, "
                             f"got {spec['strict']!r:.40}")
    schema = spec.get("schema")
    if schema is None:
        schema = JSON_OBJECT
    if not isinstance(schema, dict):
        raise HelixUserError(f"response_format.json_schema.schema must be a JSON object (a JSON "
                             f"schema), got {type(schema).__name__}")
    _check_meta(schema)
    _check_keywords(schema, "schema")
    return _regex(json.dumps(schema, sort_keys=True))


def _check_meta(schema: dict) -> None:
    """The schema against its JSON-schema meta-schema (``jsonschema``, which Ray brings; skipped
    without it): outlines ignores a malformed keyword (``"required": "a"``, ``"minLength": "x"``)."""
    try:
        from jsonschema import SchemaError
        from jsonschema.validators import validator_for
    except ImportError:
        return
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
        raise HelixUserError(f"response_format.json_schema.schema{where}: {exc.message[:160]} "
                             f"(not a valid JSON schema)") from None


def _check_keywords(schema: Any, where: str) -> None:
    """Refuse keywords outlines_core would ignore, anywhere a sub-schema can sit."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise HelixUserError(f"response_format.json_schema.{where} must be a schema (an object), "
                             f"got {json.dumps(schema)[:60]}")
    bad = sorted(UNSUPPORTED_KEYWORDS & set(schema))
    if bad:
        raise HelixUserError(f"response_format.json_schema.{where}: keyword {bad[0]!r} is not "
                             f"supported by structured output (it would not be enforced)")
    if schema.get("enum") == []:
        raise HelixUserError(f"response_format.json_schema.{where}.enum is empty: no value can "
                             f"match it")
    for sub, path in _subschemas(schema, where):
        _check_keywords(sub, path)


def _subschemas(schema: dict, where: str):
    """(sub-schema, its path) for every place in ``schema`` that holds one."""
    for key in (*_ONE, *_LIST, *_MAP):
        if key not in schema:
            continue
        subs, path = schema[key], f"{where}.{key}"
        if key in _ONE:
            yield subs, path
            continue
        container = list if key in _LIST else dict
        if not isinstance(subs, container):
            raise HelixUserError(f"response_format.json_schema.{path} must be a "
                                 f"{'list of' if container is list else 'map of names to'} schemas")
        pairs = enumerate(subs) if container is list else subs.items()
        for name, sub in pairs:
            yield sub, f"{path}[{name}]" if container is list else f"{path}.{name}"


@functools.lru_cache(maxsize=256)
def _regex(schema_json: str) -> str:
    from outlines_core.json_schema import build_regex_from_schema
    try:
        regex = build_regex_from_schema(schema_json, WHITESPACE)
    except (ValueError, TypeError) as exc:   # outlines' messages run over several lines
        first = " ".join(str(exc).split())
        raise HelixUserError(f"response_format.json_schema.schema: {first[:200]}") from None
    try:
        re.compile(regex)   # a bad "pattern" passes outlines and would fail on the last stage
    except re.error as exc:
        raise HelixUserError(f"response_format.json_schema.schema gives no valid regular expression "
                             f"({exc}): check its 'pattern's and its min/max bounds") from None
    return regex
