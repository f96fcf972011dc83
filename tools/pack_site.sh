#!/usr/bin/env bash
# Packs .whl/*.whl (the wheels the GPU image lacks: tools/fetch_wheels.sh) into .whl_site/site.tar.xz, the tree
# `pip install --target` makes of them, xz'd: 6.4 -> 4.6 MB of the 64 MiB a device call carries (session 35; wheels
# are zips, the unpacked tree compresses better). Carry [".whl_site"] instead of [".whl"]: tools/gpu_run.sh unpacks
# it to /tmp/site. Pack only the wheels a call needs (the HF peer's stay out unless hf-peer runs).
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.whl_site/' "$exclude" 2>/dev/null || echo '/.whl_site/' >> "$exclude"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# the device's install (tools/gpu_run.sh), for its Python 3.12 from here
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$tmp/site" \
  --python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 .whl/*.whl
mkdir -p .whl_site
tar cf - -C "$tmp" site | xz -9e -T0 > .whl_site/site.tar.xz
echo "$(ls .whl/*.whl | wc -l) wheels -> .whl_site/site.tar.xz ($(du -h .whl_site/site.tar.xz | cut -f1))"
