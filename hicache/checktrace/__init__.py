"""Trace checking (placeholder: the check-trace package provides this file)."""
