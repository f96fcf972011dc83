#!/usr/bin/env bash
# Download the wheels the GPU image lacks (the server stack, with httptools: the image has uvloop; accelerate
# for `transformers serve`; its launcher's imports for the replicas stage) into .whl/, for `run` with carry
# [".whl"] (or pack them with tools/pack_site.sh and carry [".whl_site"], 2 MB smaller); vllm-router itself (24 MB,
# the replicas stage only) into .whl_router/ (carry ".whl_router" there).
# Pinned to versions that install against the image's own anyio/httpx/typing-extensions (seen 2026-11-29).
# openai: transformers 5.17's serving imports ResponseReasoningText{Delta,Done}Event, which openai has from
# 1.99.0 on (1.97.0 and 1.98.0, its declared floor, lack them: checked 2026-12-01 against both wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
mkdir -p "$(dirname "$exclude")"; grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
for pkg in fastapi==0.115.12 starlette==0.46.2 pydantic==2.11.7 pydantic-core==2.33.2 typing-inspection==0.4.1 \
           annotated-types==0.7.0 uvicorn==0.34.3 openai==1.99.0 jiter==0.10.0 distro==1.9.0 sniffio==1.3.1 \
           accelerate==1.15.0 psutil==7.1.3 pyyaml==6.0.3 \
           setproctitle==1.3.8 orjson==3.13.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 \
           propcache==0.5.4 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 attrs==26.1.0 \
           outlines-core==0.2.14 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 \
           rpds-py==2026.9.1 httptools==0.8.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$pkg"
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d .whl_router vllm-router==0.1.17
ls .whl .whl_router
