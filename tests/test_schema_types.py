"""The analysis document's Python types (tracekit/schemas/analysis.py) and its JSON schema
(tracekit/schemas/analysis.schema.json) describe the same document: every object the same
keys, the same ones required, each value the same kind, nested objects and ``$ref`` included.
A key added to one and not the other fails here; and a document the analysis writes holds no
key that neither names (the schema closed at every object it lists the keys of).
"""

# No "from __future__ import annotations": TypedDict tells NotRequired keys from evaluated annotations only.

import copy
import json
import types
from pathlib import Path
from typing import Any, NotRequired, TypedDict, Union, get_args, get_origin, get_type_hints, is_typeddict

import jsonschema
import pytest

from tracekit.schemas import analysis_schema
from tracekit.schemas.analysis import AnalysisDocument, SummaryDoc

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"

# A Python scalar and the JSON type it is written as.
JSON_TYPES: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _resolve(node: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref: str = node["$ref"]
        assert ref.startswith("#/$defs/"), ref
        node = schema["$defs"][ref.removeprefix("#/$defs/")]
    return node


def _json_types(node: dict[str, Any]) -> set[str]:
    """The JSON types a schema node admits (an enum's or a const's from its values)."""
    if "type" in node:
        kind = node["type"]
        return {kind} if isinstance(kind, str) else set(kind)
    values = node.get("enum", [node["const"]] if "const" in node else [])
    found = set()
    for value in values:
        found.add("null" if value is None else JSON_TYPES[type(value)])
    return found


def mismatches(tp: Any, node: dict[str, Any], schema: dict[str, Any], where: str = "$") -> list[str]:
    """Where the type ``tp`` and the schema ``node`` describe different things, one line each."""
    node = _resolve(node, schema)
    if tp is Any:
        return []
    kinds = _json_types(node)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        out = [] if "null" in kinds else [f"{where}: the type admits None, the schema not null"]
        narrowed = {**node, "type": sorted(kinds - {"null"})}
        return out + [m for a in present for m in mismatches(a, narrowed, schema, where)]
    if "null" in kinds and not (len(kinds) == 1 and tp is type(None)):
        return [f"{where}: the schema admits null, the type not None"]
    if is_typeddict(tp):
        return _object_mismatches(tp, node, schema, where)
    if origin is list:
        if kinds != {"array"}:
            return [f"{where}: a list in the type, {sorted(kinds)} in the schema"]
        return mismatches(args[0], node.get("items", {}), schema, where + "[]")
    if origin is dict:
        if kinds != {"object"}:
            return [f"{where}: a dict in the type, {sorted(kinds)} in the schema"]
        if "properties" in node:  # a closed mapping: each property one value of the dict's
            return [
                m for key, sub in node["properties"].items() for m in mismatches(args[1], sub, schema, f"{where}.{key}")
            ]
        extra = node.get("additionalProperties", True)
        return [] if extra is True else mismatches(args[1], extra, schema, where + "{}")
    if tp in JSON_TYPES:
        expected = JSON_TYPES[tp]
        return [] if kinds == {expected} else [f"{where}: {tp.__name__} in the type, {sorted(kinds)} in the schema"]
    return [f"{where}: no rule for the type {tp!r}"]


def _object_mismatches(tp: Any, node: dict[str, Any], schema: dict[str, Any], where: str) -> list[str]:
    if _json_types(node) != {"object"}:
        return [f"{where}: {tp.__name__} in the type, {sorted(_json_types(node))} in the schema"]
    hints = get_type_hints(tp)
    properties: dict[str, Any] = node.get("properties", {})
    required = set(node.get("required", []))
    out = [f"{where}.{k}: in {tp.__name__}, not in the schema" for k in hints if k not in properties]
    out += [f"{where}.{k}: in the schema, not in {tp.__name__}" for k in properties if k not in hints]
    out += [f"{where}.{k}: the schema requires a key it does not list" for k in sorted(required - set(properties))]
    for key in sorted(set(hints) & set(properties)):
        if (key in tp.__required_keys__) != (key in required):
            said = "required" if key in tp.__required_keys__ else "not required"
            out.append(f"{where}.{key}: {said} in {tp.__name__}, the opposite in the schema")
        out += mismatches(hints[key], properties[key], schema, f"{where}.{key}")
    return out


def test_the_types_and_the_schema_describe_the_same_document():
    schema = analysis_schema()
    found = mismatches(AnalysisDocument, schema, schema)
    assert found == [], "the TypedDicts and analysis.schema.json disagree:\n" + "\n".join(found)


def _summary_node(schema: dict[str, Any]) -> dict[str, Any]:
    return schema["properties"]["summary"]


class SummaryAndMore(SummaryDoc):
    n_gpus: int


class SummaryMaybe(TypedDict):
    bubble_ratio: float | None
    window_ns: int
    busy_ns: int
    idle_ns: NotRequired[int]
    n_ranks: int
    n_steps: int
    n_actions: int
    n_messages: int


class SummaryFloat(TypedDict):
    bubble_ratio: float | None
    window_ns: float
    busy_ns: int
    idle_ns: int
    n_ranks: int
    n_steps: int
    n_actions: int
    n_messages: int


def test_a_key_in_the_types_alone_fails():
    schema = analysis_schema()
    assert mismatches(SummaryDoc, _summary_node(schema), schema) == []
    assert mismatches(SummaryAndMore, _summary_node(schema), schema) == [
        "$.n_gpus: in SummaryAndMore, not in the schema"
    ]


def test_a_key_in_the_schema_alone_fails():
    schema = copy.deepcopy(analysis_schema())
    schema["$defs"]["spread"]["properties"]["p90"] = {"type": "number"}
    found = mismatches(AnalysisDocument, schema, schema)
    assert found == [
        "$.rollup.bubble_ratio.p90: in the schema, not in SpreadDoc",
        "$.rollup.places[].bubble_ratio.p90: in the schema, not in SpreadDoc",
    ]


@pytest.mark.parametrize(
    ("tp", "expected"),
    [
        (SummaryMaybe, "$.idle_ns: not required in SummaryMaybe, the opposite in the schema"),
        (SummaryFloat, "$.window_ns: float in the type, ['integer'] in the schema"),
    ],
)
def test_a_key_required_in_one_alone_or_of_another_kind_fails(tp, expected):
    schema = analysis_schema()
    assert mismatches(tp, _summary_node(schema), schema) == [expected]


def test_a_nullable_value_must_be_nullable_in_both():
    schema = copy.deepcopy(analysis_schema())
    schema["properties"]["summary"]["properties"]["bubble_ratio"]["type"] = "number"
    assert mismatches(AnalysisDocument, schema, schema) == [
        "$.summary.bubble_ratio: the type admits None, the schema not null"
    ]


def closed(schema: Any) -> Any:
    """The schema with every object that lists its keys closed to others."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


@pytest.mark.parametrize("sample", ["1f1b", "nsys_1f1b", "tp2_dp2_pp2", "megatron_interleaved", "pp4_recompute"])
def test_the_documents_written_hold_only_keys_the_types_name(sample):
    """The analysis of samples with each part filled (a rollup, the device, dimensions,
    layout groups, recompute) against the schema closed at every object: a key written
    that the types and the schema both lack fails here."""
    from tracekit.analyze import analyze
    from tracekit.loading import load
    from tracekit.render.json import to_document

    doc = to_document(analyze(load(SAMPLES / sample)))
    jsonschema.validate(json.loads(json.dumps(doc)), closed(analysis_schema()))


def test_closing_the_schema_catches_an_unnamed_key():
    summary = closed(analysis_schema())["properties"]["summary"]
    with pytest.raises(jsonschema.ValidationError, match="n_gpus"):
        jsonschema.validate({"n_gpus": 1}, {**summary, "required": []})
