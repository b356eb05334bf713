#!/usr/bin/env bash
# The wheels a lent GPU machine (Python 3.12, PyTorch, Triton, transformers; no network) lacks for
# scripts/bench_engine_gpu.py and tests/worker: pydantic and its needs. Downloads them into .whl/
# (ignored by git) for the device tool's `carry`; on the machine, install them with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5
ls -la .whl
