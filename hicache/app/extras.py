"""Optional dependencies: which pip extra (pyproject.toml) provides a module the base install
lacks, so a command that needs one can say what to install instead of a traceback.

    module        extra    needed by
    ------------  -------  ------------------------------------------------------------------
    torch         data     the data plane: pools, transfers, kernels, the cache controller,
                           `hicache demo` and the benchmarks (the CPU wheel is enough on CPU)
    triton        gpu      the Triton gather/scatter kernels (CUDA; on CPU only in Triton's
                           interpreter). Without it, backend "auto" uses the torch kernels
    transformers  model    the Qwen3 model producer
    hypofuzz      fuzz     `hicache hypofuzz`: the fuzz machines under HypoFuzz on many cores
                           (its licence is its own, not Apache-2.0: README, "Fuzzing on many
                           cores"; never a dependency of the library)

The base install (numpy, transitions) runs the control plane, the spec checks and the
invariant checker.
"""

from __future__ import annotations

EXTRA_OF_MODULE: dict[str, str] = {
    "torch": "data",
    "triton": "gpu",
    "transformers": "model",
    "hypofuzz": "fuzz",
}


def top_module(name: str | None) -> str | None:
    """`torch` for `torch.cuda`: the distribution a missing module belongs to."""
    return name.split(".")[0] if name else None


def is_optional(name: str | None) -> bool:
    """Whether `name` (a module that failed to import) is an optional dependency."""
    return top_module(name) in EXTRA_OF_MODULE


def install_hint(what: str, missing: str) -> str:
    """One line: `what` needs the optional module `missing`, and how to install it.

    `missing` must be an optional dependency (see `is_optional`)."""
    module = top_module(missing)
    assert module is not None and module in EXTRA_OF_MODULE, missing
    return (
        f"{what} needs {module}, which is not installed: pip install {module}, "
        f"or pip install -e '.[{EXTRA_OF_MODULE[module]}]' from a checkout"
    )
