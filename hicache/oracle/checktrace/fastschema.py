"""The schema's fast path: one yes/no predicate per event name, for events as parsed.

`compile_fast(schema)` compiles the same keywords as `hicache.oracle.checktrace.schema.compile_rule`
into a predicate that only answers whether a value is valid, with the cheapest test for
each: an object's keys against two frozensets (allowed, required), an integer as `type(x)
is int` (the reader parses a whole-number float as an int, so JSON's `2.0` arrives as `2`),
an enum as a set lookup. `EventSchema.check` asks the predicate first and the message-giving
rule only when it says no; the predicate may be stricter than JSON Schema (a float `2.0`
given directly), never looser -- the rule then has the last word.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Any], bool]

_STRICT_TYPES: dict[str, Predicate] = {
    "object": lambda x: type(x) is dict,
    "array": lambda x: type(x) is list,
    "string": lambda x: type(x) is str,
    "integer": lambda x: type(x) is int,
    "number": lambda x: type(x) is int or type(x) is float,
    "boolean": lambda x: type(x) is bool,
    "null": lambda x: x is None,
}


def compile_fast(schema: Mapping[str, Any]) -> Predicate:
    """A predicate for `schema` (keywords as `compile_rule` accepts; allOf resolved)."""
    tests: list[Predicate] = []
    kind = schema.get("type")
    low = schema.get("minimum")
    if _int_floor(schema):
        floor = int(schema["minimum"])
        return lambda x: type(x) is int and x >= floor  # the common leaf, in one test
    objectish = any(
        k in schema
        for k in (
            "required",
            "properties",
            "additionalProperties",
            "minProperties",
            "dependentRequired",
        )
    )
    arrayish = any(k in schema for k in ("items", "minItems", "maxItems"))
    strings = frozenset(v for v in schema.get("enum", ()) if type(v) is str)
    string_enum = "enum" in schema and len(strings) == len(schema["enum"])
    if kind == "object" and objectish:
        tests.append(_object(schema, strict=True))  # the type test is its first line
        objectish = False
    elif kind == "array" and arrayish:
        tests.append(_array(schema, strict=True))  # the type test is its first line
        arrayish = False
    elif kind is not None and not (kind == "string" and string_enum):
        tests.append(_STRICT_TYPES[kind])  # (a string enum's test is a string's type test)
    if "enum" in schema:
        if string_enum:
            tests.append(lambda x: type(x) is str and x in strings)
        else:
            allowed = tuple(schema["enum"])
            tests.append(lambda x: any(x == a and type(x) is type(a) for a in allowed))
    if "const" in schema:
        want = schema["const"]
        tests.append(lambda x: x == want and type(x) is type(want))
    if low is not None:
        tests.append(lambda x: type(x) not in (int, float) or x >= low)
    if objectish:
        tests.append(_object(schema, strict=False))
    if arrayish:
        tests.append(_array(schema, strict=False))
    return _both(tests) if tests else lambda x: True


def _both(tests: list[Predicate]) -> Predicate:
    """All of `tests`, as nested `and`s (a generator per value would cost more than them)."""
    if len(tests) == 1:
        return tests[0]
    head, rest = tests[0], _both(tests[1:])
    return lambda x: head(x) and rest(x)


def _object(schema: Mapping[str, Any], strict: bool) -> Predicate:
    required = frozenset(schema.get("required", ()))
    props = {k: compile_fast(v) for k, v in schema.get("properties", {}).items()}
    allowed = frozenset(props) if schema.get("additionalProperties", True) is False else None
    least = int(schema.get("minProperties", 0))
    depends = tuple((k, frozenset(v)) for k, v in schema.get("dependentRequired", {}).items())
    # Properties that are the common leaf (an integer with a minimum), tested inline:
    # key -> minimum.
    floors = {k: v["minimum"] for k, v in schema.get("properties", {}).items() if _int_floor(v)}

    def test(x: Any) -> bool:
        if type(x) is not dict:
            return not strict  # without a type, object keywords ignore other values
        keys = x.keys()
        if not keys >= required or (allowed is not None and not keys <= allowed) or len(x) < least:
            return False
        for key, need in depends:
            if key in x and not need <= keys:
                return False
        for key, value in x.items():
            low = floors.get(key)
            if low is not None:
                if type(value) is not int or value < low:
                    return False
                continue
            check = props.get(key)
            if check is not None and not check(value):
                return False
        return True

    return test


def _int_floor(schema: Mapping[str, Any]) -> bool:
    """Whether `schema` is exactly an integer with a minimum (a description aside)."""
    return (
        schema.get("type") == "integer"
        and "minimum" in schema
        and set(schema) - {"description"} == {"type", "minimum"}
    )


def _array(schema: Mapping[str, Any], strict: bool) -> Predicate:
    item = compile_fast(schema["items"]) if "items" in schema else None
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    # Items that are the common leaf (an integer with a minimum: pages), tested inline.
    floor = (
        int(schema["items"]["minimum"])
        if "items" in schema and _int_floor(schema["items"])
        else None
    )

    def test(x: Any) -> bool:
        if type(x) is not list:
            return not strict  # without a type, array keywords ignore other values
        if len(x) < low or (high is not None and len(x) > high):
            return False
        if floor is not None:
            for v in x:
                if type(v) is not int or v < floor:
                    return False
        elif item is not None:
            for v in x:
                if not item(v):
                    return False
        return True

    return test
