#!/usr/bin/env bash
# One short GPU benchmark for a lent machine: bench/gpu_bench.py on a Wan2.1-1.3B-architecture world model.
#
#   bash bench/gpu.sh [gpu_bench options]          # e.g. --blocks 12 --served-blocks 10
#
# Needs: python3 with CUDA torch and transformers (the GPU machine's image has them). What it lacks
# (Ray, Serve's web stack, pydantic, PyAV, diffusers) comes from .whl/site.tar.xz, made here by
# bench/gpu_wheels.sh, or from .whl/*.whl wheels; the project runs from this checkout (PYTHONPATH).
# Writes $OUT/gpu.json (the JSON it prints) and $OUT/log.txt; OUT defaults to out/gpu.
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
SITE=${SITE:-/tmp/rtv-site}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1

echo "== $(date -u +%FT%TZ) $(hostname) $(nproc) cores"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 || echo "nvidia-smi: none"

if [ -f .whl/site.tar.xz ]; then
  t0=$SECONDS
  mkdir -p "$SITE"
  tar -C "$SITE" -xJf .whl/site.tar.xz 2>/dev/null \
    || "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .whl/site.tar.xz "$SITE" \
    || { echo "FAILED: unpacking .whl/site.tar.xz"; exit 2; }
  echo "unpacked .whl/site.tar.xz into $SITE in $((SECONDS - t0)) s"
elif compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || { echo "FAILED: installing .whl/*.whl"; exit 2; }
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 TOKENIZERS_PARALLELISM=false

# Every import the bench needs, named, so a missing package is one clear line and not a hang later.
"$PY" - <<'EOF' || { echo "FAILED: a package is missing (above)"; exit 3; }
import importlib
missing = []
for name in ("torch", "numpy", "transformers", "tokenizers", "diffusers", "av", "ray", "ray.serve", "fastapi",
             "starlette", "uvicorn", "websockets", "pydantic", "psutil", "PIL", "safetensors",
             "deployments.app", "deployments.generation.engine", "clients.sdk.video", "bench.gpu_bench"):
    try:
        module = importlib.import_module(name)
        print(f"  {name:32s} {getattr(module, '__version__', '')}  {getattr(module, '__file__', '')}")
    except Exception as exc:
        missing.append(f"{name}: {type(exc).__name__}: {exc}")
for line in missing:
    print("MISSING", line)
raise SystemExit(1 if missing else 0)
EOF

timeout --kill-after=20 "${BENCH_TIMEOUT:-480}" "$PY" -m bench.gpu_bench --out "$OUT/gpu.json" "$@"
rc=$?
[ $rc -eq 124 ] && echo "FAILED: bench/gpu_bench.py ran past ${BENCH_TIMEOUT:-480} s (partial JSON in $OUT/gpu.json)"
exit $rc
