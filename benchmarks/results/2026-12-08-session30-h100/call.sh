export PYTHONPATH=$PWD/.whl/transitions-0.9.3-py2.py3-none-any.whl:.
nvidia-smi --query-gpu=name --format=csv,noheader; nproc; lscpu | grep -i "model name\|cache" 
python3 -c "import triton,torch,numpy;print(triton.__version__,torch.__version__,numpy.__version__)"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_mapped.py tests/test_transfer.py tests/test_issue_graphs_gpu.py tests/test_transfer_route.py tests/test_pitched.py 2>&1 | tee $OUT/gpu_tests.log | tail -6
python3 -m pytest -q -p no:cacheprovider tests/test_mapped.py tests/test_transfer_route.py tests/test_placement.py tests/test_storage.py -k "not gpu" 2>&1 | tee $OUT/cpu_on_image.log | tail -4
python3 benchmarks/s2h_hash_probe.py --pages 256 --threads 1 4 8 16 --chunk-kib 128 256 512 1152 --out $OUT/s2h_probe.json 2>&1 | tee $OUT/s2h_probe.log
mkdir -p /tmp/st; for r in 1 2; do for rp in 262144 1048576 4194304; do
python3 -m hicache bench storage --tokens 350 1000 3500 --io-threads 8 --ceiling-threads 1 4 8 16 --read-part-bytes $rp --out /tmp/st/storage_${rp}_$r.json > /tmp/st_${rp}_$r.log 2>&1; echo "== read part $rp round $r"; sed -n 3,6p /tmp/st_${rp}_$r.log | cut -c1-200
done; done
cat /tmp/st_*.log > $OUT/storage.log; tar -czf $OUT/storage_json.tgz -C /tmp/st .
