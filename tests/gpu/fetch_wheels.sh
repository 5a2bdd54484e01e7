#!/usr/bin/env bash
# Download the wheels tests/gpu/run.sh installs on a GPU host without network (docs/gpu.md, step 1):
#   tests/gpu/fetch_wheels.sh [DIR [AV_DIR]]   (default .whl/ and .whl-av/; run where pip reaches
#   the package index). PyAV (~36 MB, only the video tests decode clips) goes to AV_DIR, so the rest
#   (~31 MB) travels without it.
# The GPU host keeps its own torch; everything else the engine, the gateway, the tests and the
# benchmarks import travels, for CPython 3.12 on x86_64 (PY_VERSION, PLATFORM_ARCH change that).
# --no-deps on purpose: the list is the closure, and one version of each (two stop the install).
set -euo pipefail
DIR=${1:-.whl}
AV_DIR=${2:-$DIR-av}
PY_VERSION=${PY_VERSION:-3.12}
PLATFORM_ARCH=${PLATFORM_ARCH:-x86_64}
PYTHON=${PYTHON:-python3}
mkdir -p "$DIR"
wheels=(
  exllamav3==1.6.5 marisa-trie rich markdown-it-py mdurl pygments
  xgrammar apache-tvm-ffi
  fastapi starlette opentelemetry-api annotated-doc uvicorn h11 httptools uvloop click prometheus-client
  httpx httpcore anyio idna sniffio certifi
  pydantic pydantic-core annotated-types typing-inspection typing-extensions
  pytest pytest-timeout pluggy iniconfig
  jsonschema referencing rpds-py attrs jsonschema-specifications
  openai anthropic httpx2 httpcore2 truststore jiter distro docstring-parser tqdm
  py-spy
)
platforms=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do platforms+=(--platform "manylinux_${n}_${PLATFORM_ARCH}"); done
platforms+=(--platform "manylinux2014_${PLATFORM_ARCH}" --platform "manylinux1_${PLATFORM_ARCH}")
download() {
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp "${platforms[@]}" -d "$@"
}
download "$DIR" "${wheels[@]}"
download "$AV_DIR" av
ls "$DIR" | wc -l | xargs echo "wheels in $DIR:"
du -sh "$DIR" "$AV_DIR"
