"""`hicache demo`'s report: the summary as aligned sections, and the glossary of its terms.

    section                  what it says
    -----------------------  ------------------------------------------------------------
    headline                 requests served, serving time and its rate, wall time with setup,
                             device, violations
    Configuration            every option the run used; capacities say which were sized
    Workload                 requests, admissions (= requests + preemptions), prompt tokens
    Prompt tokens by source  where each admitted prompt token's KV came from; adds to 100%
    Decisions by reason      one policy decision per admission, grouped by why
    Transfers                per direction: count, failed, MiB, GiB/s
    Restores, fallbacks, dropped backups, invariant checks

Every row label is a GLOSSARY term (`_term` refuses any other), and the glossary is printed
by `hicache demo --help`, so nothing the report says is left undefined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hicache.policy import Decision, DecisionLog

GLOSSARY: dict[str, str] = {
    "requests": "requests in the workload, each served to its last decode step",
    "admissions": "times a request was admitted (its prefix matched, a decision made, a "
    "restore issued): requests + preemptions",
    "preemptions": "admissions abandoned to break an L1 deadlock (every live request waiting "
    "for L1 pages the others hold): the newest is sent back to the queue and "
    "admitted again later",
    "prompt tokens": "prompt tokens over all admissions (a preempted request's tokens count "
    "once per admission)",
    "hit in L1": "prompt tokens whose KV was already in L1 (GPU) when admitted",
    "hit in L2": "prompt tokens restored from L2 (host memory) by an H2D transfer",
    "hit in L3": "prompt tokens restored from L3 (the file): S2H into L2, then H2D",
    "recomputed": "prompt tokens computed by the model (the producer) during prefill",
    "preempted": "prompt tokens of preempted admissions (served by the next admission)",
    "recompute: nothing cached beyond L1": "no lower tier holds more of the prompt than L1 "
    "does: there is nothing to restore, so every "
    "policy (always too) recomputes the rest",
    "recompute: restore declined": "a restore was possible; the policy chose recompute (a "
    "'policy skip': cost predicted it no faster, never does "
    "not restore, threshold found it too short)",
    "L2: predicted faster": "restored from L2; the cost model predicted it faster than recomputing",
    "L2: predicted no faster": "restored from L2 although the cost model did not predict a "
    "gain (policy always, or cost exploring an unmeasured path)",
    "L3: predicted faster": "restored from L3 (through L2); predicted faster than recomputing",
    "L3: predicted no faster": "restored from L3 although not predicted faster",
    "D2H": "L1 -> L2 (device to host): a backup of newly computed pages",
    "H2D": "L2 -> L1 (host to device): a restore",
    "H2S": "L2 -> L3 (host to storage): a backup to the file",
    "S2H": "L3 -> L2 (storage to host): the first step of a restore from L3",
    "GiB/s": "bytes moved over the transfers' own time: issue + queue wait + service, "
    "without one-time workspace setup and without the loop's polling delay",
    "restores": "restores that delivered pages to L1",
    "verified bytes by pool": "for a pool group (--preset), the restored bytes of each pool "
    "compared with recomputation",
    "verified pages": "restored pages compared byte for byte with recomputation (mismatches "
    "stop the demo with RestoreMismatch)",
    "promoted pages": "pages restored from L3 that stayed in L2 (--no-promotion drops them)",
    "shared load-back pages": "pages a request got from another request's load-back (it "
    "waited for that transfer instead of loading or recomputing)",
    "evicted pages": "pages evicted per tier to make room (least recently used leaves, one "
    "node at a time); copies dropped for a bad L3 slot are not counted here",
    "decode": "decode steps run; 'overlapped' is decode time while a restore was in flight",
    "transfer failed": "a restore's transfer failed (a cancel, when the request ends, is not "
    "counted): its tokens recomputed ('transfer_failed')",
    "cancelled": "transfers cancelled because their request ended or at shutdown (not failures)",
    "no room in the target tier": "a restore found no free pages even after eviction (live "
    "requests hold them): its tokens recomputed ('no_room')",
    "L3 part not loaded": "the L2 part before an L3 part did not reach L1 (failed, or not "
    "issued: the L3 part is then dropped with it); a promoted L3 part stays cached in L2, its "
    "tokens recomputed ('restore_gap')",
    "graft dropped": "an L3 part could not be grafted into L2 because the node above it has "
    "no L2 copy (a host-only suffix under a parent not backed up): its "
    "tokens recomputed, nothing reserved ('dropped')",
    "backed off": "another request's load-back was filling a node on the path and the cache "
    "backs off instead of sharing it (load_back_overlap = back_off): the tokens "
    "past the L1 hit recomputed ('load_back_pending')",
    "L3 read stopped part way": "an L3 part's read into L2 stopped with some pool's pages "
    "not all landed: the whole nodes every clamping pool landed "
    "are kept, the rest recomputed ('prefetch_clamped')",
    "L3 offline": "the L3 file was removed or replaced under the cache: L3 serves and takes "
    "nothing more, L1 and L2 keep serving ('l3_offline')",
    "L2 full": "a backup to L2 found no room after eviction, or write-back could not back "
    "up an L1 victim before evicting it ('host_pressure')",
    "evicted before its L2 backup": "under write-through, L1 evicted a node that had no L2 "
    "copy: its backup was not in time "
    "('write_through_unbacked_eviction')",
    "L3 full": "a backup to L3 found no room ('storage_pressure')",
    "window freed": "under write-back, L1 evicted a node whose window (the trailing side "
    "pools, dsv4's swa) had been freed: the host tiers hold whole groups, so "
    "it could not be backed up ('window_freed')",
    "backup transfer failed": "a D2H or H2S backup failed ('backup_failed')",
    "L3 copies dropped": "L3 pages dropped outside pressure eviction: a node's slot failed "
    "its checksum ('corrupt') or could not be read ('unreadable'), the "
    "file went offline ('l3_offline'), or a healthy copy below a bad "
    "slot's node was evicted first ('below_bad_slot'); the next request "
    "for them recomputes",
    "invariant checks": "runs of the ownership invariants (I1-I6) and structural checks, per "
    "--check-mode; any violation fails the demo (exit status 1)",
}
"""Every term the report prints -> what it means (printed by `hicache demo --help`)."""

FALLBACK_LABELS = {
    "transfer_failed": "transfer failed",
    "no_room": "no room in the target tier",
    "restore_gap": "L3 part not loaded",
    "l3_offline": "L3 offline",
    "dropped": "graft dropped",
    "load_back_pending": "backed off",
    "prefetch_clamped": "L3 read stopped part way",
}
DROP_LABELS = {
    "host_pressure": "L2 full",
    "write_through_unbacked_eviction": "evicted before its L2 backup",
    "storage_pressure": "L3 full",
    "backup_failed": "backup transfer failed",
    "l3_offline": "L3 offline",
    "window_freed": "window freed",
}
DIRECTION_LABELS = {"D2H": "L1 -> L2", "H2D": "L2 -> L1", "H2S": "L2 -> L3", "S2H": "L3 -> L2"}


def _term(label: str) -> str:
    # Verify the report only prints what the glossary defines.
    assert label in GLOSSARY, f"report term {label!r} is not in the glossary"
    return label


def glossary_text(width: int = 100) -> str:
    """The glossary as `--help` epilog text: each term, then its meaning, wrapped."""
    import textwrap

    column = 4 + max(len(term) for term in GLOSSARY)
    lines = ["terms in the report:"]
    for term, meaning in GLOSSARY.items():
        lines += textwrap.wrap(
            meaning,
            width,
            initial_indent=f"  {term + ':':<{column - 2}}",
            subsequent_indent=" " * column,
        )
    return "\n".join(lines)


def decision_reason(d: Decision) -> str:
    """Why a decision was made, as a GLOSSARY term: what the policy could choose among, and
    whether the cost model predicted the chosen restore faster than recomputing."""
    if d.choice == "recompute":
        return _term(
            "recompute: restore declined"
            if d.extension_tokens
            else "recompute: nothing cached beyond L1"
        )
    return _term(f"{d.choice}: predicted {'faster' if d.benefit_s > 0 else 'no faster'}")


class DecisionTally(DecisionLog):
    """The controller's decision log (`CacheController.decisions`), also counting each
    recorded decision by `decision_reason`: one per admission, the decision it is served by
    (after any tensor-parallel agreement), not each time the policy was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.by_reason: dict[str, int] = {}

    def record(self, decision: Decision) -> int:
        decision_id = super().record(decision)
        reason = decision_reason(decision)
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        return decision_id


def percents(counts: Sequence[int]) -> list[str]:
    """Each count's share of their sum to 0.1%, rounded so that the shares add up to exactly
    100.0% (largest remainder); '-' for all when the sum is 0."""
    total = sum(counts)
    if total == 0:
        return ["-"] * len(counts)
    tenths = [1000 * c // total for c in counts]
    by_remainder = sorted(range(len(counts)), key=lambda i: -(1000 * counts[i] % total))
    for i in by_remainder[: 1000 - sum(tenths)]:
        tenths[i] += 1
    return [f"{t / 10:.1f}%" for t in tenths]


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A section: `title` heads the first column (row labels, left-aligned, indented); the
    other columns are right-aligned under `header`."""
    width0 = max([len(title)] + [2 + len(r[0]) for r in rows])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(1, len(header))]
    out = [f"{title:<{width0}}" + "".join(f"  {h:>{w}}" for h, w in zip(header[1:], widths))]
    for r in rows:
        cells = "".join(f"  {c:>{w}}" for c, w in zip(r[1:], widths))
        out.append(f"  {r[0]:<{width0 - 2}}" + cells)
    return out


def pairs(title: str, items: Sequence[tuple[str, str]], columns: int = 100) -> list[str]:
    """A section of `name  value` lines under `title`, names aligned, values wrapped to
    `columns` under their first line."""
    import textwrap

    width = max(len(name) for name, _ in items)
    out = [title]
    for name, value in items:
        out += textwrap.wrap(
            value,
            columns,
            initial_indent=f"  {name:<{width}}  ",
            subsequent_indent=" " * (width + 4),
        )
    return out


def format_report(s: dict[str, Any]) -> str:
    """The whole report (module docstring) from the demo's summary dict."""
    inv = s["invariants"]
    # requests/s is over the serving loop's time (serving_s); wall_s adds the setup: building
    # the tiers, the L3 file, closing them. Both are given, each named, so neither misleads.
    head = (
        f"hicache demo: {s['requests']:,} requests served in {s['serving_s']:.1f} s "
        f"({s['requests_per_s']:.1f} requests/s) on {s['config']['device']}, {s['wall_s']:.1f} s "
        f"with setup; {inv['violations']} invariant violations"
    )
    checks = (
        f"{_term('invariant checks').capitalize()}: {inv['run']:,} run (check mode "
        f"{s['config']['check_mode']}), {inv['violations']} violations"
    )
    sections = [
        [head],
        _configuration(s["config"]),
        _workload(s),
        _sources(s),
        _decisions(s),
        _transfers(s["transfers"]),
        _restores(s),
        _losses(s),
        [checks],
    ]
    return "\n\n".join("\n".join(lines) for lines in sections)


def _configuration(c: dict[str, Any]) -> list[str]:
    g = c["geometry_fields"]
    sized = set(c["sized"])

    def cap(key: str, unit: str) -> str:
        return f"{c[key]:,} {unit}" + (" (sized from the workload)" if key in sized else "")

    backends = c["backends"]
    return pairs(
        "Configuration",
        [
            (
                "geometry",
                f"{c['geometry']}: {g['layers']} layers, {g['kv_heads']} KV heads, head_dim "
                f"{g['head_dim']}, {g['dtype']}, {g['page_size']} tokens/page, "
                f"{c['bytes_per_page']:,} bytes/page",
            ),
            *([("pool group", c["preset"])] if c.get("preset") else []),
            ("L1 (device)", cap("l1_pages", "pages")),
            ("L2 (host)", cap("l2_pages", "pages")),
            ("L3 (file)", cap("l3_slots", "slots")),
            ("L3 path", c["l3_path"] or "a temporary file, deleted at exit"),
            ("write policy", c["write_policy"]),
            ("policy", c["policy"]),
            ("check mode", c["check_mode"]),
            ("device", c["device"]),
            (
                "backend",
                f"{c['backend']}: gather {backends['gather']}, scatter "
                f"{backends['scatter']} ({backends['reason']})",
            ),
            ("seed", str(c["seed"])),
            (
                "batch size",
                f"{c['batch_size']} live requests; prefetch {_on(c['prefetch'])}, "
                f"promotion {_on(c['promotion'])}, {c['io_threads']} L3 I/O threads",
            ),
        ],
    )


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _workload(s: dict[str, Any]) -> list[str]:
    longest = s["longest_prompt"]
    return pairs(
        "Workload",
        [
            (
                _term("requests"),
                f"{s['requests']:,} (shared prefixes: system prompts, RAG "
                "documents, agent histories)",
            ),
            (
                _term("admissions"),
                f"{s['admissions']:,} ({s['requests']:,} served + "
                f"{s['preemptions']:,} {_term('preemptions')})",
            ),
            (
                _term("prompt tokens"),
                f"{s['prompt_tokens']:,}; the longest prompt "
                f"{longest['tokens']:,} tokens ({longest['pages']} pages)",
            ),
            (
                _term("decode"),
                f"{s['decode_steps']:,} steps, {s['decode_overlap_s'] * 1e3:.1f} ms "
                "overlapped with restores",
            ),
        ],
    )


def _sources(s: dict[str, Any]) -> list[str]:
    shares = s["token_shares"]
    labels = {
        "L1": "hit in L1",
        "L2": "hit in L2",
        "L3": "hit in L3",
        "recomputed": "recomputed",
        "preempted": "preempted",
    }
    counts = [shares[k] for k in labels]
    rows = [
        [_term(label), f"{n:,}", pct]
        for label, n, pct in zip(labels.values(), counts, percents(counts))
    ]
    rows.append(["total", f"{sum(counts):,}", "100.0%" if sum(counts) else "-"])
    return table("Prompt tokens by source", ["", "tokens", "share"], rows)


def _decisions(s: dict[str, Any]) -> list[str]:
    reasons = s["decision_reasons"]
    rows = [[r, f"{reasons[r]:,}"] for r in GLOSSARY if r in reasons]  # the glossary's order
    rows.append(["total", f"{sum(reasons.values()):,}"])
    return table(
        f"Decisions by reason (policy {s['config']['policy']}; one per admission)",
        ["", "count"],
        rows,
    )


def _transfers(transfers: dict[str, Any]) -> list[str]:
    rows = [
        [
            _term(d),
            DIRECTION_LABELS[d],
            f"{t['count']:,}",
            f"{t['failed']:,}",
            f"{t['cancelled']:,}",
            f"{t['bytes'] / 2**20:.2f}",
            f"{t['gib_per_s']:.3f}",
        ]
        for d, t in transfers.items()
    ]
    return table(
        "Transfers",
        ["", "tiers", "count", "failed", _term("cancelled"), "MiB", _term("GiB/s")],
        rows,
    )


def _restores(s: dict[str, Any]) -> list[str]:
    ev = s["evicted_pages"]
    return pairs(
        "Restores and evictions",
        [
            (_term("restores"), f"{s['restores']:,}"),
            (_term("verified pages"), f"{s['verified_pages']:,} (0 mismatches)"),
            *(
                [
                    (
                        _term("verified bytes by pool"),
                        ", ".join(f"{k} {n:,}" for k, n in s["verified_pool_bytes"].items()),
                    )
                ]
                if s.get("verified_pool_bytes")
                else []
            ),
            (_term("promoted pages"), f"{s['promoted_pages']:,}"),
            (_term("shared load-back pages"), f"{s['shared_load_back_pages']:,}"),
            (_term("evicted pages"), f"L1 {ev['L1']:,}, L2 {ev['L2']:,}, L3 {ev['L3']:,}"),
            (
                _term("L3 copies dropped"),
                ", ".join(f"{n:,} {why}" for why, n in s["l3_invalidated_pages"].items())
                + " (pages)",
            ),
        ],
    )


def _losses(s: dict[str, Any]) -> list[str]:
    fallbacks = [[_term(FALLBACK_LABELS[k]), f"{n:,}"] for k, n in s["fallbacks"].items()]
    drops = [[_term(DROP_LABELS[k]), f"{n:,}"] for k, n in s["dropped_tokens"].items()]
    return (
        table("Fallbacks to recompute, by reason", ["", "restores"], fallbacks)
        + [""]
        + table("Dropped backups, by reason", ["", "tokens"], drops)
    )
