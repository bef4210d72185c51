"""The oracle: the tools an engine developer runs hicache as, against their own engine.

checktrace/     `hicache check-trace`: judge an engine's JSONL trace step by step
vectors/        `hicache vectors`: conformance vectors, generated and run
modelcheck/     `hicache modelcheck`: exhaustive search of small configurations
speccheck/      `hicache spec check`: the spec's rules and tables against the code
"""
