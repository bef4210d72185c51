"""Benchmarks of hicache's own code, one module each (`python -m hicache.bench.<name>`)."""

from __future__ import annotations
