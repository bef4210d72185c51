"""`hicache pools [PRESET]`: the presets of spec/pools.toml, or one preset's pool table.

    hicache pools             one line per preset: name, pools, bytes per anchor page (in all,
                              and on the anchor's indices)
    hicache pools dsv4-tiny   the preset's description and its table, as spec/pools.md holds it

Exit status 0, or 2 with one line on stderr for an unknown preset (naming the choices).
"""

from __future__ import annotations

import sys

from hicache.app.usage import EXIT_USAGE, UsageParser
from hicache.errors import ConfigError
from hicache.pools.presets import descriptions, group, load_presets


def main(argv: list[str]) -> int:
    parser = UsageParser(prog="hicache pools", description=__doc__.split("\n")[0])
    parser.add_argument("preset", nargs="?", help="a preset of spec/pools.toml")
    args = parser.parse_args(argv)
    from hicache.oracle.speccheck.pools import preset_table  # the renderer pools.md is checked with

    if args.preset is None:
        for name, g in load_presets().items():
            pools = ", ".join(p.name for p in g.pools)
            print(
                f"{name:<11} {len(g.pools)} pools, {g.value_bytes_per_anchor_page:,} B per anchor "
                f"page in all, {g.bytes_per_anchor_page:,} on {g.anchor.name}'s indices: {pools}"
            )
        return 0
    try:
        g = group(args.preset)
    except ConfigError as e:
        print(f"hicache pools: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.preset}: {descriptions()[args.preset]}\n")
    print(preset_table(g), end="")
    return 0
