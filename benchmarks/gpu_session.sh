#!/usr/bin/env bash
# What the first session with a GPU measures (issue 47, item 5), as one command that ends within 10 minutes:
# `run.py --configs recipes --autocast bf16` (the papers' sizes, training and evaluation tokens/s and the training
# step's peak memory, ours against transformers 4.37.2 and 5, every side under bf16 autocast, NVIDIA's published
# A100 figures beside them), 3 rounds after 2 warm-up calls.
#
#   PYTHON=.venv/bin/python benchmarks/gpu_session.sh --download   # here, beforehand: the wheels it lacks, in .whl/
#   benchmarks/gpu_session.sh                # there, from the repository root (docs/benchmarks.md, "On a GPU")
#   benchmarks/gpu_session.sh --quick --device cpu   # the same at tiny sizes on CPU (tests/test_benchmarks.py)
#
# Arguments after the script's own (--download, --quick) go to run.py and win over its defaults. On the GPU machine
# (python 3.12, its own torch and an older transformers) the wheels in .whl/ are installed under /tmp: transformers 5
# (this venv's version, with what it needs) and this package for ours and transformers 5's XLNet; transformers 4.37.2
# apart, for the legacy side's python (a wrapper that puts only those on its path). Without .whl/ (a CPU run) the
# python is $PYTHON (default python3) and the legacy side's $TRANSFORMERS_XL_LEGACY_PYTHON, if set. $WHEELS (default
# .whl) names the wheels' folder, $BUDGET the seconds the whole command may take (default 570).
# Results: $OUT (the device tool's folder) or benchmark-results/gpu-session/: results.json, results.md (rewritten
# after every case, so a run stopped by the time limit leaves the cases it measured) and log.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}  # (the test points it elsewhere: wheels downloaded here must not change what it runs)
BUDGET=${BUDGET:-570}  # (the device tool stops a command after 600 s)

if [[ ${1:-} == --download ]]; then
    # pip's platform flags of the GPU machine's python (3.12, manylinux x86_64)
    platform=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
              --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    version=$("$PYTHON" -c "import transformers; print(transformers.__version__)")
    rm -rf "$WHEELS.partial" && mkdir -p "$WHEELS.partial/ours" "$WHEELS.partial/legacy"
    "$PYTHON" -m pip download -q "${platform[@]}" -d "$WHEELS.partial/ours" "transformers==$version"
    # the legacy venv's versions (docs/benchmarks.md, "The legacy reference venv"), with what they need
    "$PYTHON" -m pip download -q "${platform[@]}" -d "$WHEELS.partial/legacy" transformers==4.37.2 \
        tokenizers==0.15.2 huggingface_hub==0.36.2
    rm -f "$WHEELS.partial"/*/numpy-*.whl  # (the machine's numpy is the one its torch was built with)
    rm -rf "$WHEELS" && mv "$WHEELS.partial" "$WHEELS"
    du -sh "$WHEELS"
    exit 0
fi

quick=()
if [[ ${1:-} == --quick ]]; then
    quick=(--quick)
    shift
fi
output=${OUT:-benchmark-results/gpu-session}
mkdir -p "$output"
legacy=()  # (run.py's default: $TRANSFORMERS_XL_LEGACY_PYTHON)

if [[ -d $WHEELS ]]; then
    site=$(mktemp -d)  # (the installs: a folder of its own, removed at exit)
    trap 'rm -rf "$site"' EXIT
    install=("$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir)
    "${install[@]}" --target "$site/ours" "$WHEELS"/ours/*.whl
    "${install[@]}" --no-build-isolation --target "$site/package" .  # (this checkout, built there)
    "${install[@]}" --target "$site/legacy" "$WHEELS"/legacy/*.whl
    printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$site/legacy" "$(command -v "$PYTHON")" >"$site/legacy-python"
    chmod +x "$site/legacy-python"
    export PYTHONPATH=$site/package:$site/ours
    legacy=(--legacy-python "$site/legacy-python")
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

timeout --signal=INT --kill-after=15 $((BUDGET - SECONDS > 60 ? BUDGET - SECONDS : 60)) \
    "$PYTHON" -u benchmarks/run.py --device cuda --configs recipes --autocast bf16 --rounds 3 --warmup 2 \
    --output "$output" "${legacy[@]}" "${quick[@]}" "$@" 2>&1 | tee "$output/log.txt"
