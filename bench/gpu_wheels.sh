#!/usr/bin/env bash
# Pack what a bare GPU machine lacks for bench/gpu.sh into .whl/site.tar.xz (run here, with PyPI).
#
# The lent GPU machine has Python 3.12 with torch, transformers, numpy, aiohttp,
# grpcio, protobuf... but not Ray, Serve's web stack, pydantic, PyAV or diffusers,
# and it reaches no registry. Wheels for cp312 are fetched here, installed into a
# folder for that platform, and packed with xz, less what Serve does not use (below),
# which keeps the whole under the 64 MiB a device call may carry. bench/gpu.sh
# unpacks it and puts it on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."

# Versions as in constraints/cpu.txt and the CPU venv; grpcio-reflection 1.62.3 is pure Python with no
# protobuf/grpcio version checks, so it works with whatever grpcio and protobuf the GPU machine has.
PACKAGES=(
  ray==2.60.0 av==18.1.0 diffusers==0.42.1 importlib-metadata==10.2.0 lazy-importer==0.1.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 websockets==17.4 opentelemetry-api==1.45.2
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  grpcio-reflection==1.62.3
)
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all:
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)

work=$(mktemp -d /tmp/gpu_wheels.XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps "${PLATFORM[@]}" -d "$work/wheels" "${PACKAGES[@]}"
python3 -m pip install -q --no-index --no-deps --no-compile "${PLATFORM[@]}" --target "$work/site" "$work"/wheels/*.whl
# Left out, unused by Serve: Ray's Java jars, its dashboard's web build and its data, train, tune, RLlib and
# LLM libraries (the working tree and this archive must fit a device call's 64 MiB together).
rm -rf "$work/site/ray/jars" "$work/site/ray/dashboard/client/build" "$work/site/bin" \
  "$work/site/ray/rllib" "$work/site/ray/data" "$work/site/ray/tune" "$work/site/ray/train" "$work/site/ray/llm"
mkdir -p .whl
tar -C "$work/site" -cf - . | xz -T0 -9 > .whl/site.tar.xz
ls -l .whl/site.tar.xz
