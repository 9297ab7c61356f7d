#!/usr/bin/env bash
# edge's GPU checks in one go, where a CUDA GPU is lent: the GPU tests, the kernels' bandwidth (with a tile sweep),
# and decoding on the built-in model widened to 1B (plain, QuantSpec, int4, layer offload under a memory budget).
#   bash bench/gpu_check.sh OUTDIR        (torch with CUDA and triton installed; edge importable from here)
set -uo pipefail
out=${1:-gpu-results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/device.txt"
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_gpu.py 2>&1 | tee "$out/tests.txt" | tail -30
timeout 120 python3 -m edge.kernels.bench > "$out/kernels.json" 2> "$out/kernels.err"
echo "edge.kernels.bench rc=$?"; tail -5 "$out/kernels.err"
python3 - "$out/kernels.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print(report["device"], "copy", report["copy_bandwidth_gb_s"], "GB/s")
for row in report["gemv"] + report["attention"]:
    print({k: v for k, v in row.items() if k != "sweep"})
PY
python3 -m bench.memory_bound /tmp/wide --params 1B > /dev/null
timeout 200 python3 -m bench.gpu_check /tmp/wide/target --tokens 96 --profile --out "$out/decode.json" \
    > "$out/decode.log" 2>&1
echo "gpu_check rc=$?"
grep -v "not guaranteed token-identical" "$out/decode.log" | tail -90
