"""Conformance vectors: plain JSON cases any engine can be checked against (spec/vectors.md).

module        concept
------------  ------------------------------------------------------------------------
format        the case and manifest files: read, write, check (canonical bytes)
drive         run one step on a `CacheUnderTest` and observe it (normalised)
recorder      how a case script drives the controller and records the case
categories    the case scripts, one per category, drawn from a seed
adapters      adapter factories for `run --adapter` (hicache's controller)
generate      `hicache vectors generate DIR`
run           `hicache vectors run DIR --adapter module:Name`
"""
