#!/usr/bin/env bash
# The GPU suite: every GPU test and GPU benchmark, results into RESULTS_DIR.
#
#   benchmarks/gpu_suite.sh RESULTS_DIR [STAGE...]
#   stages: env tests kernels transfer mapped multipool storage compare batched layerwise tp tpfuzz
#   recompute serving fuzz issue graphissue finds queues timeline gates
#   (default: env
#   tests transfer recompute serving)
#   FUZZ_STEPS (default 20000), FUZZ_SEED (default 1): the fuzz stage's length and seed
#   FINDS_SECONDS (default 40): the finds stage's limit per mutant (HypoFuzz, one worker per
#   core, each bug-zoo mutant of the null-plane machine, a run ended at its first find; then
#   plain `hicache fuzz` on the same mutants); needs .whl-hypofuzz/ carried (the wheels
#   benchmarks/hypofuzz_scaling.py --wheels makes)
#   TPFUZZ_SECONDS (default 540): the tpfuzz stage's length (2 ranks on CUDA, a GPU each
#   when there are two)
#   queues: benchmarks/stream_queues.py and the 8B serving bench (eager, graphs; 350, 1,000,
#   3,500 tokens, ~140 s each), for each of QUEUES_VARIANTS (default "default 32"): CUDA's
#   default 8 hardware queues, and 32 (CUDA_DEVICE_MAX_CONNECTIONS); session 20 found that
#   queues did not matter, streams did (hicache/dataplane/ownstreams.py)
#   timeline: benchmarks/layerwise_timeline.py, the L2 and layer-wise L2 restore's host and
#   device ops, profiled (TIMELINE_TOKENS, default 3500)
#   gates: tests/test_layerwise_gpu.py, then the 8B graphs serving bench at 3,500 tokens
#   (latency only, 5 repeats) for each of GATE_LAYERS (default "1 4 1 4": before and after
#   alternating on one card; --gate-layers K, a wait per K layers in a layer-wise graph),
#   then eager at 350 and 3,500 tokens, latency only, 7 repeats (its rows' gc_ms: the
#   collector's pauses per sample), and again with --gc-freeze (GATES_EAGER=0: not the eager
#   runs); with BASELINE (below), each graphs run for the baseline tree, then this one
#   BASELINE (compare stage): a directory holding another checkout's hicache/, kernels/,
#   invariants/, spec/ (`git archive REV hicache kernels invariants spec | tar -x -C DIR`):
#   the transfer benchmark at 350 and 3,500 tokens, single pool and dsv4/mla, run for it and
#   for this tree in turn (twice each, alternating), so before and after share one card;
#   the storage stage too, when BASELINE is set
#   mapped: the mapped D2H's GPU tests, benchmarks/zero_copy.py (programs 8-132), the transfer
#   benchmark's dma rows at MAPPED_TOKENS (default 350,1000,3500: "hicache" mapped beside
#   "hicache DMA route"), and dsv4/mla at MAPPED_GROUP_TOKENS (default 350,3500: "per_pool"
#   mapped beside "per_pool, DMA route"); MAPPED_PROBE=0 skips the probe
#   STORAGE_ARGS: extra arguments of the storage stage's `hicache bench storage` (350, 1,000 and
#   3,500 tokens, 8 I/O threads, ceilings on 1-16 threads)
#
# The lent machines return at most 8 files: pack RESULTS_DIR (tar) at the end of the call.
# Runs from the repository root with the project importable from the working tree
# (PYTHONPATH=.), as on the lent H200 where the project is not installed. Each stage writes
# its own files; a failing stage is reported and the suite goes on (exit status: failures).
set -uo pipefail
out=${1:?usage: benchmarks/gpu_suite.sh RESULTS_DIR [STAGE...]}
shift
stages=${*:-env tests transfer recompute serving}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
failed=0

run() {  # run NAME CMD...: log to $out/NAME.log, note failure
  local name=$1; shift
  echo "== $name: $*"
  if ! "$@" >"$out/$name.log" 2>&1; then
    echo "!! $name failed (see $name.log)"; failed=$((failed + 1))
  fi
  tail -n 25 "$out/$name.log"
}

for stage in $stages; do
  case $stage in
    env) run env bash -c 'nvidia-smi; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"' ;;
    tests) run gpu_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests ;;
    kernels) run bench_kernels python3 -m hicache bench kernels --out "$out/kernels.json" ;;
    transfer) run bench_transfer python3 -m hicache bench transfer --out "$out" ;;
    mapped) run mapped_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_mapped.py tests/test_issue_graphs_gpu.py tests/test_transfer.py
            [ "${MAPPED_PROBE:-1}" = 0 ] || run zero_copy python3 benchmarks/zero_copy.py --pages 22,219 --programs 8,16,33,66,132 --configs 1024x4,1024x8 --out "$out/zero_copy.json"
            run bench_mapped python3 -m hicache bench transfer --tokens ${MAPPED_TOKENS:-350,1000,3500} --sections dma --out "$out/mapped"
            run bench_mapped_multipool python3 -m hicache bench transfer --tokens ${MAPPED_GROUP_TOKENS:-350,3500} --preset dsv4,mla --out "$out/mapped_multipool" ;;
    multipool) run group_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_group_bytes_kernels.py
               run bench_multipool python3 -m hicache bench transfer --preset dsv4,mla --out "$out/multipool" ;;
    tp) run tp_tests python3 -m pytest -q -p no:cacheprovider tests/test_tp.py tests/test_tp_replicated.py tests/test_torchdist.py
        run bench_tp_agreement python3 benchmarks/tp_agreement_overhead.py
        run bench_tp_l3_writes python3 benchmarks/tp_l3_writes.py
        # per-rank D2H/H2D, together vs alone: one GPU per rank; on one GPU only a code check
        share=$([ "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -lt 2 ] && echo --share-gpu)
        run bench_tp_bandwidth python3 benchmarks/tp_bandwidth.py $share ;;
    storage) sides=${BASELINE:+baseline }current
             for round in 1 ${BASELINE:+2}; do
               for side in $sides; do
                 tree=$([ $side = baseline ] && echo "$BASELINE" || echo "$PWD")
                 run "storage_${side}_${round}" env PYTHONPATH="$tree${PYTHONPATH#$PWD}" bash -c \
                   "cd '$tree' && python3 -m hicache bench storage --tokens 350 1000 3500 --io-threads 8 \
                      --ceiling-threads 1 2 4 8 16 ${STORAGE_ARGS:-} --out '$out/storage_${side}_${round}.json'"
               done
             done ;;
    compare) for round in 1 2; do
               for side in baseline current; do
                 tree=$([ $side = baseline ] && echo "${BASELINE:?compare needs BASELINE}" || echo "$PWD")
                 run "compare_${side}_${round}" env PYTHONPATH="$tree${PYTHONPATH#$PWD}" bash -c \
                   "cd '$tree' && python3 -c 'import hicache; print(hicache.__file__)' && python3 -m hicache bench transfer --tokens 350,3500 --sections dma ${COMPARE_ARGS:-} \
                      --out '$out/compare/$side-$round/single' && python3 -m hicache bench transfer \
                      --tokens 350,3500 --preset dsv4,mla ${COMPARE_ARGS:-} --out '$out/compare/$side-$round/multipool'"
               done
             done ;;
    batched) run bench_batched python3 benchmarks/batched_copies.py --out "$out/batched.json" ;;
    layerwise) run layerwise_tests python3 -m pytest -q -p no:cacheprovider tests/test_layerwise_gpu.py \
                 tests/test_layerwise.py
               run bench_layerwise_h2d python3 benchmarks/layerwise_h2d.py --out "$out/layerwise_h2d.json"
               run bench_layerwise_serving python3 -m hicache bench serving --presets qwen3-8b \
                 --mode ${LAYERWISE_MODES:-graphs eager} --lengths 350 1000 3500 --no-stress \
                 --out "$out/layerwise-serving" ;;
    tpfuzz) run tp_fuzz python3 benchmarks/tp_fuzz.py --plane cuda --ranks 2 \
              --seconds "${TPFUZZ_SECONDS:-540}" --steps 1000 ;;
    recompute) run bench_recompute python3 -m hicache bench recompute --modes eager graphs --out "$out/recompute.json" ;;
    serving) run bench_serving python3 -m hicache bench serving --out "$out" ;;
    fuzz) run fuzz_cuda python3 -m hicache fuzz --plane cuda --seed "${FUZZ_SEED:-1}" \
            --steps "${FUZZ_STEPS:-20000}" --report --progress ;;
    queues) for q in ${QUEUES_VARIANTS:-default 32}; do  # the serving run that lost overlap
              case $q in
                32) qenv=CUDA_DEVICE_MAX_CONNECTIONS=32 ;;  # 32 hardware queues, not 8
                *) qenv=QUEUES=default ;;
              esac
              run "queues_$q" env $qenv python3 benchmarks/stream_queues.py --out "$out/queues_$q.json"
              run "queues_serving_$q" env $qenv python3 -m hicache bench serving --presets qwen3-8b \
                --mode eager graphs --lengths 350 1000 3500 --repeats 3 --out "$out/queues_serving_$q"
            done ;;
    timeline) run layerwise_timeline python3 benchmarks/layerwise_timeline.py \
                --tokens ${TIMELINE_TOKENS:-3500} --out "$out/layerwise_timeline.json" ;;
    gates) run gates_tests python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_layerwise_gpu.py
           i=0
           for k in ${GATE_LAYERS:-1 4 1 4}; do
             i=$((i + 1))
             for side in ${BASELINE:+baseline} current; do  # with BASELINE: A/B on one card
               tree=$([ $side = baseline ] && echo "$BASELINE" || echo "$PWD")
               name=gates_${i}_k$k${BASELINE:+_$side}
               run "$name" env PYTHONPATH="$tree${PYTHONPATH#$PWD}" bash -c "cd '$tree' && \
                 python3 -m hicache bench serving --presets qwen3-8b --mode graphs --lengths 3500 \
                 --repeats 5 --no-stress --gate-layers $k --out '$out/$name'"
             done
           done
           [ "${GATES_EAGER:-1}" = 0 ] && continue
           for freeze in "" --gc-freeze; do  # eager: the collector's pauses, then a frozen heap
             run "gates_eager${freeze:+_frozen}" python3 -m hicache bench serving --presets qwen3-8b \
               --mode eager --lengths 350 3500 --repeats 7 --no-stress $freeze --out "$out/gates_eager${freeze:+_frozen}"
           done ;;
    issue) run issue_profile python3 benchmarks/issue_profile.py --out "$out/issue_profile" ;;
    graphissue) run bench_graph_issue python3 benchmarks/graph_issue.py --tokens 350 1000 3500 \
                  --out "$out/graph_issue.json" ;;
    finds) run hypofuzz_finds bash -c 'python3 -m pip install -q --no-index --no-deps \
             --no-compile --target /tmp/hf-site .whl-hypofuzz/*.whl &&
           mutants=$(python3 -c "from hicache.testing.zoo import DEFAULT_MACHINE as M
print(\" \".join(k for k, v in M.items() if v == \"fuzz-null\"))") &&
           PYTHONPATH=/tmp/hf-site:$PYTHONPATH python3 benchmarks/hypofuzz_scaling.py /tmp/hf \
             --workers --baseline-steps 0 --mutants $mutants --stop-at-find --plain \
             --mutant-seconds "${FINDS_SECONDS:-40}" && cp /tmp/hf/hypofuzz-scaling.* "$0"/' \
           "$out" ;;
    *) echo "unknown stage $stage"; failed=$((failed + 1)) ;;
  esac
done
echo "== gpu suite done: $failed stage(s) failed"
exit "$failed"
