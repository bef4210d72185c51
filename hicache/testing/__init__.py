"""Stateful fuzzing of a tiered KV cache, importable by other projects; and the bug zoo."""
