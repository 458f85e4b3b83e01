#!/usr/bin/env bash
# The wheel bundle a bare GPU device needs to run `benchmarks/gpu_acceptance.sh --device`: what DigenRL imports
# that the lent machine lacks (KINDS.md's package list: it has torch, transformers, peft, safetensors,
# tensorboard, pytest, numpy, pyyaml, rich, tqdm, matplotlib, requests, pillow, httpx, huggingface-hub, zipp, ...),
# minus Ray (79 MB; the device check runs no Ray): diffusers, pydantic with its core and its two small
# dependencies, importlib-metadata (diffusers imports it) with lazy-importer, and typing-extensions >= 4.16
# (pydantic-core needs it; the device's version is not listed). Binary wheels only, for the device's Python.
#
#   bash scripts/device_bundle.sh 3.12            # -> .whl/ (the device: python 3.12, x86-64 manylinux)
#   bash scripts/device_bundle.sh 3.11 .whl-311   # for a CPU dry run in a python 3.11 venv
#
# The versions are this project's tested ones (the CI venv's); the bundle is about 10 MB, so the working tree
# plus the bundle stays well under the device's 64 MiB per call. .whl*/ is git-ignored: carry it
# (`carry: [".whl"]`).
set -euo pipefail
PYVER=${1:?usage: device_bundle.sh PYTHON_VERSION [OUT_DIR]  (e.g. 3.12)}
OUT=${2:-.whl}
PIP=${PIP:-python3 -m pip}
PKGS=(diffusers==0.42.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
      importlib-metadata==10.2.0 lazy-importer==0.1.0 typing-extensions==4.16.0)
PLATFORMS=()
for n in 17 24 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
rm -rf "$OUT"
mkdir -p "$OUT"
$PIP download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp "${PLATFORMS[@]}" \
  -d "$OUT" "${PKGS[@]}"
ls "$OUT"
du -sh "$OUT"
