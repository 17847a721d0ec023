#!/usr/bin/env bash
# The base install's size: a fresh venv, `pip install SRC` (no extras, not editable), `du` of its
# site-packages, the twenty largest folders in it, and how many setuptools "absent from the
# `packages` configuration" warnings the build printed. SRC defaults to this checkout.
#   bash benchmarks/install_size.sh [SRC]
# Python 3.11.7, x86_64, pip's default index, 2026-12-07 (pip, setuptools and pkg_resources of
# the venv itself are ~24 MB of each number):
#   708e13e (datashader in the base: numba, llvmlite, scipy, xarray)  1036 MB, 6 warnings (270 lines)
#   datashader dropped, include-package-data = false                  648 MB, 0 warnings
#   the largest left, each imported: pyarrow 170, panel 119 (its JS bundles), pandas 84,
#   numpy 73 (with numpy.libs), selenium 35 (+ trio), bokeh 32, holoviews 28
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --upgrade pip >/dev/null
"$tmp/venv/bin/pip" install "$src" >"$tmp/pip.log" 2>&1 || { tail -50 "$tmp/pip.log"; exit 1; }
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "site-packages: $(du -sm "$site" | cut -f1) MB (pip $(du -sm "$site/pip" | cut -f1) MB)"
echo "setuptools 'absent from the packages configuration' warnings: $(grep -c 'is absent from the `packages` configuration' "$tmp/pip.log" || true)"
echo "largest (MB):"
du -sm "$site"/*/ | sort -rn | head -20 | sed "s|$site/||"
