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

_PLAIN_TYPES: dict[str, type] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "boolean": bool,
}
"""The types whose `_STRICT_TYPES` test is `type(x) is T` (number and null are not)."""


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
    """An object's predicate, compiled from generated source into one function: the key
    sets, then each property's test inline (an integer floor, a string enum or const, an
    array of integer floors; any other property calls its own predicate). No call per key
    and no generic walk: the same answers as testing each present key by its schema."""
    required = frozenset(schema.get("required", ()))
    props = schema.get("properties", {})
    allowed = frozenset(props) if schema.get("additionalProperties", True) is False else None
    least = int(schema.get("minProperties", 0))
    names: dict[str, Any] = {"REQUIRED": required, "ALLOWED": allowed}
    body = [
        "def test(x):",
        "    if type(x) is not dict:",
        f"        return {not strict}",
        "    keys = x.keys()",
        f"    if not keys >= REQUIRED or len(x) < {least}:",
        "        return False",
    ]
    if allowed is not None:
        body += ["    if not keys <= ALLOWED:", "        return False"]
    for i, (key, need) in enumerate(schema.get("dependentRequired", {}).items()):
        names[f"NEED{i}"] = frozenset(need)
        body += [f"    if {key!r} in x and not NEED{i} <= keys:", "        return False"]
    for i, (key, sub) in enumerate(props.items()):
        body += [f"    if {key!r} in x:", f"        v = x[{key!r}]"]
        body += ["        " + line for line in _inline(sub, i, names)]
    body.append("    return True")
    code = compile("\n".join(body), f"<fastschema {sorted(required)}>", "exec")
    exec(code, names)  # source built above from the schema's keywords only
    test: Predicate = names["test"]
    return test


def compile_shaped(schema: Mapping[str, Any], keys: tuple[str, ...]) -> Predicate | None:
    """`compile_fast(schema)` for an object whose keys are `keys`, in that order (a dict's
    `tuple(x)`): the key tests (required, allowed, minProperties, dependentRequired) are
    answered here, once, and the values are read in one unpacking and tested inline, as
    `_object` tests each present key. Only for a dict with exactly these keys in this order
    (the caller looks the predicate up by `tuple(x)`). None when `schema` is not an object
    schema `_object` alone tests (the caller then asks `compile_fast`'s predicate)."""
    objectish = ("required", "properties", "additionalProperties", "minProperties")
    if (
        schema.get("type") != "object"
        or not any(k in schema for k in (*objectish, "dependentRequired"))
        or any(k in schema for k in ("enum", "const", "minimum", "items", "minItems", "maxItems"))
        or len(set(keys)) != len(keys)
    ):
        return None
    required = frozenset(schema.get("required", ()))
    props = schema.get("properties", {})
    allowed = frozenset(props) if schema.get("additionalProperties", True) is False else None
    have = frozenset(keys)
    if (
        not have >= required
        or len(keys) < int(schema.get("minProperties", 0))
        or (allowed is not None and not have <= allowed)
        or any(
            k in have and not frozenset(need) <= have
            for k, need in schema.get("dependentRequired", {}).items()
        )
    ):
        return _never  # `_object`'s key tests refuse every dict with these keys
    names: dict[str, Any] = {}
    body = ["def test(x):"]
    if keys:
        slots = ", ".join(f"v{j}" for j in range(len(keys)))
        body.append(f"    {slots}, = x.values()")
    for i, key in enumerate(props):  # `_object`'s order: the first failing test decides
        if key in have:
            body.append(f"    v = v{keys.index(key)}")
            body += ["    " + line for line in _inline(props[key], i, names)]
    body.append("    return True")
    code = compile("\n".join(body), f"<fastschema shaped {list(keys)}>", "exec")
    exec(code, names)  # source built above from the schema's keywords and `keys` only
    test: Predicate = names["test"]
    return test


def _never(x: Any) -> bool:
    return False


def _inline(schema: Mapping[str, Any], i: int, names: dict[str, Any]) -> list[str]:
    """Lines that return False unless `v` passes `schema` (the property's i-th name slot)."""
    if _int_floor(schema):
        return [f"if type(v) is not int or v < {schema['minimum']!r}:", "    return False"]
    if _string_leaf(schema):
        tests = ["type(v) is not str"]
        if "enum" in schema:
            names[f"ENUM{i}"] = frozenset(schema["enum"])
            tests.append(f"v not in ENUM{i}")
        if "const" in schema:
            tests.append(f"v != {schema['const']!r}")
        return [f"if {' or '.join(tests)}:", "    return False"]
    items = schema.get("items")
    if set(schema) - {"description"} <= {"type", "items", "minItems"} and (
        schema.get("type") == "array" and items is not None and _int_floor(items)
    ):
        return [
            f"if type(v) is not list or len(v) < {int(schema.get('minItems', 0))}:",
            "    return False",
            "for p in v:",
            f"    if type(p) is not int or p < {items['minimum']!r}:",
            "        return False",
        ]
    names[f"CHECK{i}"] = compile_fast(schema)
    return [f"if not CHECK{i}(v):", "    return False"]


def _string_leaf(schema: Mapping[str, Any]) -> bool:
    """Whether `schema` is a string, an enum of strings and/or a string const, nothing else
    (a description aside), with at least the enum or the const."""
    keys = set(schema) - {"description"}
    return (
        bool(keys & {"enum", "const"})
        and keys <= {"type", "enum", "const"}
        and schema.get("type", "string") == "string"
        and all(type(v) is str for v in schema.get("enum", ()))
        and type(schema.get("const", "")) is str
    )


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
    # Items of one plain type and nothing else (a prompt's tokens: integers): their types
    # read at once, `type(v) is T` for each as a set of the types met.
    plain = (
        _PLAIN_TYPES.get(schema["items"].get("type"))
        if "items" in schema and set(schema["items"]) - {"description"} == {"type"}
        else None
    )
    only = frozenset() if plain is None else frozenset({plain})

    def test(x: Any) -> bool:
        if type(x) is not list:
            return not strict  # without a type, array keywords ignore other values
        if len(x) < low or (high is not None and len(x) > high):
            return False
        if plain is not None:
            return set(map(type, x)) <= only
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
