"""One factory protocol for `hicache fuzz --adapter` and `hicache vectors run --adapter`
(hicache/testing/factory.py): the same factory runs in both, from a module in the current
directory, and a factory that is not one is one line naming the hook, exit 2, in both."""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

pytest.importorskip("torch", reason="needs torch (`vectors run`): pip install -e '.[data]'")

from hicache.app.cli import main
from hicache.controller.config import WRITE_POLICIES
from hicache.oracle.vectors import generate
from hicache.testing import EngineConfig, UnsupportedConfig
from hicache.testing.factory import SHAPES, AdapterError, build, load_factory
from hicache.testing.template import Adapter, factory

NAMES = itertools.count()  # each module a fresh name: an imported module stays imported

TEMPLATE = Path(__file__).resolve().parents[1] / "hicache" / "testing" / "template.py"


@pytest.fixture(scope="module")
def vectors(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vectors") / "v"
    generate.generate(directory, 1, 0, ["hit_miss", "l1_hit_miss", "l1_eviction"])
    return directory


def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    """A module of `source` in a fresh current directory (not on sys.path); its name."""
    name = f"user_adapter_{next(NAMES)}"
    (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    return name


def status(argv: list[str]) -> int:
    """`hicache ARGV`'s exit status (argparse's usage errors leave by SystemExit)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else -1


def both(spec: str, vectors: Path) -> list[int]:
    """The exit statuses of a short fuzz and of the vectors run with `--adapter spec`."""
    fuzz = status(["fuzz", "--adapter", spec, "--steps", "60", "--seed", "1"])
    run = status(["vectors", "run", str(vectors), "--adapter", spec, "--quiet"])
    return [fuzz, run]


def test_one_factory_from_the_current_directory_runs_in_both_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vectors: Path
) -> None:
    """The template's factory, copied beside the user: `fuzz` called a factory with the
    string 'null' (or a draw of the module's undocumented `setups`), `vectors run` with a
    CaseConfig, and neither imported a module from the current directory."""
    name = module(tmp_path, monkeypatch, TEMPLATE.read_text(encoding="utf-8"))
    assert both(f"{name}:factory", vectors) == [0, 0]


BAD_HOOKS = [
    ("factory = 3\n", "factory = 3 is not callable"),
    ("def factory(capacity, page_size):\n    pass\n", "does not take one argument"),
    (
        "def factory(capacity):\n    return int(capacity)\n",
        "raised TypeError: int() argument must be",
    ),
    ("def factory(config):\n    return object()\n", "returned <object>, which lacks"),
    (
        "from hicache.testing.template import Adapter\n"
        "class NoTick(Adapter):\n    tick = None\n"
        "def factory(config):\n    return NoTick(8, 4)\n",
        "has tick not callable",
    ),
    ("raise RuntimeError('boom')\n", "raised RuntimeError: boom"),
    ("import no_such_package_xyz\n", "imports no_such_package_xyz, which is not installed"),
    ("", "has no 'factory'"),
]


@pytest.mark.parametrize("source, says", BAD_HOOKS)
def test_a_wrong_hook_is_one_line_naming_it_and_exit_2_in_both_commands(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    vectors: Path,
    source: str,
    says: str,
) -> None:
    """Before: a TypeError traceback (a factory of the other command's signature), or a
    failure that looked like the engine's (a shrunk example and a replay line)."""
    name = module(tmp_path, monkeypatch, source)
    assert both(f"{name}:factory", vectors) == [2, 2]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(says in line and f"{name}" in line for line in err), err


def test_a_module_that_is_not_there_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vectors: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AdapterError, match=f"no module nosuch here \\({tmp_path}\\)"):
        load_factory("nosuch:factory")


def test_a_factory_that_takes_no_shape_the_fuzz_draws_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = module(
        tmp_path,
        monkeypatch,
        "from hicache.testing import UnsupportedConfig\n"
        "def factory(config):\n    raise UnsupportedConfig('page size 16 only')\n",
    )
    assert main(["fuzz", "--adapter", f"{name}:factory", "--steps", "20"]) == 2
    err = capsys.readouterr().err
    assert "UnsupportedConfig for every shape the fuzz draws" in err and "page size 16" in err


def test_the_fuzz_draws_only_the_shapes_a_factory_takes() -> None:
    """A one-tier factory is never asked for three tiers during the runs (each shape is
    probed once, before them)."""
    asked: list[tuple[str, ...]] = []

    def one_tier(config: EngineConfig) -> Adapter:
        asked.append(config.tiers)
        return factory(config)

    from hicache.testing.draws import configs
    from hicache.testing.factory import shapes_taken

    taken = shapes_taken(one_tier, "test:one_tier", "null")
    assert [c.tiers for c in taken] == [("L1",)] and asked.count(("L1",)) == 1
    assert len(asked) == len(SHAPES)
    with pytest.raises(NoSuchExample):  # nothing but L1 alone is drawn
        find(configs(taken), lambda c: c.tiers != ("L1",), settings=settings(database=None))


def test_a_two_tier_factory_is_drawn_l1_and_l2_only() -> None:
    """An engine of L1 and L2 (no last tier: sglang's HiCache without storage) is driven
    with its own shape; before the two-tier shapes the fuzz refused such a factory."""

    def two_tiers(config: EngineConfig) -> Adapter:
        if config.tiers != ("L1", "L2"):
            raise UnsupportedConfig(f"L1 and L2; asked for {config.tiers}")
        engine = factory(replace(config, capacities={"L1": config.capacities["L1"]}))
        engine.tiers = ("L1", "L2")  # only probed, never driven
        return engine

    from hicache.testing.draws import configs
    from hicache.testing.factory import shapes_taken

    taken = shapes_taken(two_tiers, "test:two_tiers", "null")
    assert [c.tiers for c in taken] == [("L1", "L2")] * 3
    assert sorted(c.write_policy for c in taken) == sorted(WRITE_POLICIES)
    drawn = find(configs(taken), lambda c: True, settings=settings(database=None))
    assert set(drawn.capacities) == {"L1", "L2"}


def test_build_checks_page_size_and_protocol_not_the_engine() -> None:
    """A factory's own typed refusal (UnsupportedConfig, another HiCacheError) is the
    engine's answer, passed through; only a broken hook is an AdapterError."""

    def refuses(config: EngineConfig) -> object:
        raise UnsupportedConfig("no")

    with pytest.raises(UnsupportedConfig):
        build(refuses, SHAPES[0])  # type: ignore[arg-type]
