#!/usr/bin/env bash
# One short GPU benchmark for a lent machine: bench/gpu_bench.py on a Wan2.1-1.3B-architecture world model.
#
#   bash bench/gpu.sh [gpu_bench options]          # e.g. --blocks 12 --served-blocks 10
#   IMPORT_ARGS="--enforce-eager --work /tmp/ir" bash bench/gpu.sh ...   # options of bench/import_rollout.py
#
# Needs: python3 with CUDA torch and transformers (the GPU machine's image has them). What it lacks
# (Ray, Serve's web stack, pydantic, PyAV, diffusers) comes from .whl/site.tar.xz, made here by
# bench/gpu_wheels.sh, or from .whl/*.whl wheels; the project runs from this checkout (PYTHONPATH).
# Writes $OUT/import_rollout.json, $OUT/gpu.json (the JSON gpu_bench prints) and $OUT/log.txt; OUT defaults
# to out/gpu.
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
SITE=${SITE:-/tmp/rtv-site}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1

echo "== $(date -u +%FT%TZ) $(hostname) $(nproc) cores"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 || echo "nvidia-smi: none"

if [ -f .whl/site.tar.xz ] && [ -f "$SITE/.unpacked" ] && cmp -s "$SITE/.unpacked" <(cksum < .whl/site.tar.xz); then
  echo "$SITE already holds .whl/site.tar.xz (a warm machine)"
elif [ -f .whl/site.tar.xz ]; then
  t0=$SECONDS
  mkdir -p "$SITE"
  tar -C "$SITE" -xJf .whl/site.tar.xz 2>/dev/null \
    || "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .whl/site.tar.xz "$SITE" \
    || { echo "FAILED: unpacking .whl/site.tar.xz"; exit 2; }
  cksum < .whl/site.tar.xz > "$SITE/.unpacked"
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
             "deployments.app", "deployments.generation.engine", "clients.sdk.video", "bench.gpu_bench", "bench.import_rollout"):
    try:
        module = importlib.import_module(name)
        print(f"  {name:32s} {getattr(module, '__version__', '')}  {getattr(module, '__file__', '')}")
    except Exception as exc:
        missing.append(f"{name}: {type(exc).__name__}: {exc}")
for line in missing:
    print("MISSING", line)
raise SystemExit(1 if missing else 0)
EOF

# First the imported-checkpoint check (a published-style checkpoint through rtv import-checkpoint and
# rtv rollout, frames compared with the native model's), then the bench; IMPORT_ARGS are the first's
# options ("skip" leaves it out), the command line's the bench's.
rc=0
if [ "${IMPORT_ARGS:-}" != skip ]; then
  # shellcheck disable=SC2086 # IMPORT_ARGS is a list of options
  timeout --kill-after=20 "${IMPORT_TIMEOUT:-240}" "$PY" -m bench.import_rollout --out "$OUT/import_rollout.json" ${IMPORT_ARGS:-} >/dev/null
  rc=$?
  [ $rc -eq 124 ] && echo "FAILED: bench/import_rollout.py ran past ${IMPORT_TIMEOUT:-240} s (partial JSON in $OUT/import_rollout.json)"
fi
timeout --kill-after=20 "${BENCH_TIMEOUT:-480}" "$PY" -m bench.gpu_bench --out "$OUT/gpu.json" "$@"
bench_rc=$?
[ $bench_rc -eq 124 ] && echo "FAILED: bench/gpu_bench.py ran past ${BENCH_TIMEOUT:-480} s (partial JSON in $OUT/gpu.json)"
exit $((rc || bench_rc))
