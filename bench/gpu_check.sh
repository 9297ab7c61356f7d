#!/usr/bin/env bash
# edge's GPU checks in one go, where a CUDA GPU is lent; installs nothing (the machine's own torch and triton):
# the GPU tests, the static step's kernels (bandwidth, with a tile sweep), and decoding on the built-in model widened
# to 1B (plain and eager plain, QuantSpec, layer skip and early exit, layer offload under a memory budget).
#   bash bench/gpu_check.sh OUTDIR        (torch with CUDA and triton installed; edge importable from here)
# GPU_CHECK_TESTS: a pytest -k expression; GPU_CHECK_SWEEP=0: no tile sweep; GPU_CHECK_TOKENS: tokens a reply;
# GPU_CHECK_TEST_S, _KERNEL_S, _DECODE_S: each part's time limit in seconds
set -uo pipefail
out=${1:-gpu-results}
tokens=${GPU_CHECK_TOKENS:-48}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/device.txt"
git log -1 --format='commit %h %cI' 2>/dev/null | tee -a "$out/device.txt"
stamp tests
timeout "${GPU_CHECK_TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gpu.py \
    ${GPU_CHECK_TESTS:+-k "$GPU_CHECK_TESTS"} > "$out/tests.txt" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|error" "$out/tests.txt" | tail -3; grep -E "^(FAILED|ERROR)" "$out/tests.txt" | head -20
stamp kernels
sweep=--sweep; [ "${GPU_CHECK_SWEEP:-1}" = 0 ] && sweep=
timeout "${GPU_CHECK_KERNEL_S:-120}" python3 -m edge.kernels.bench --step-only $sweep > "$out/kernels.json" \
    2> "$out/kernels.err"
echo "edge.kernels.bench rc=$?"; tail -5 "$out/kernels.err"
python3 - "$out/kernels.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
print(report["device"], "copy", report["copy_bandwidth_gb_s"], "GB/s")
for row in report["gemv"] + report["step_gemv"] + report.get("step_layer", []) + report["step_attention"]:
    print({k: v for k, v in row.items() if k != "sweep"})
PY
# after a sweep, the decoding runs take the int4 unpacking that timed fastest over the 1B target's shapes
unpack=$(python3 - "$out/kernels.json" <<'PY'
import json, sys
try:
    rows = [row for row in json.load(open(sys.argv[1]))["step_gemv"] if row["format"] == "int4" and "sweep" in row
            and row["k"] in (256, 108160)]
    totals = {}
    for row in rows:
        best = {}
        for name, result in row["sweep"].items():
            unpack = name.split("/")[0].split("=")[1]
            best[unpack] = min(best.get(unpack, 1e9), result["ms"])
        for unpack, ms in best.items():
            totals[unpack] = totals.get(unpack, 0.0) + ms
    print(min((ms, unpack) for unpack, ms in totals.items())[1])
except Exception:
    pass  # no sweep: the default
PY
)
[ -n "$unpack" ] && export EDGE_STEP_UNPACK=$unpack
echo "EDGE_STEP_UNPACK=${EDGE_STEP_UNPACK:-default}" | tee -a "$out/device.txt"
stamp decoding
python3 -m bench.memory_bound /tmp/wide --params 1B > /dev/null
timeout "${GPU_CHECK_DECODE_S:-240}" python3 -m bench.gpu_check /tmp/wide/target --tokens "$tokens" \
    --out "$out/decode.json" > "$out/decode.log" 2>&1
echo "gpu_check rc=$?"
grep -v "not guaranteed token-identical" "$out/decode.log" | tail -40
stamp done
