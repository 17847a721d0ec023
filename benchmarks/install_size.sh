#!/usr/bin/env bash
# The install's size, base and with the dashboard extra: for `pip install SRC` and `pip install 'SRC[dashboard]'`
# (not editable) a fresh venv each, `du` of its site-packages, the twenty largest folders in it, and how many
# setuptools "absent from the `packages` configuration" warnings the build printed. SRC defaults to this checkout.
#   bash benchmarks/install_size.sh [SRC]
# Python 3.11.7, x86_64, pip's default index (pip, setuptools and pkg_resources of the venv itself are 24 MB of
# each number):
#   708e13e (datashader in the base: numba, llvmlite, scipy, xarray)  1036 MB, 6 warnings (270 lines)   2026-12-07
#   datashader dropped, include-package-data = false                  648 MB, 0 warnings               2026-12-07
#   holoviews, bokeh, panel, selenium in the dashboard extra:                                            2026-12-07
#     pip install SRC                366 MB (35 % of 1036): pyarrow 170, pandas 84, numpy 73 (with numpy.libs)
#     pip install 'SRC[dashboard]'   644 MB: + panel 119 (its JS bundles), selenium 35 (+ trio), bokeh 32,
#                                    holoviews 28, pillow 23
#   export draws over chromium's pipe: selenium only in the test extra                                   2026-12-07
#     pip install SRC                366 MB (35 % of 1036)
#     pip install 'SRC[dashboard]'   602 MB: + panel 119, bokeh 32, holoviews 28, pillow 15 (+ its libs)
set -euo pipefail
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for spec in "$src" "$src[dashboard]"; do
  venv="$tmp/venv$([ "$spec" = "$src" ] || echo -dashboard)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >/dev/null
  "$venv/bin/pip" install "$spec" >"$venv.log" 2>&1 || { tail -50 "$venv.log"; exit 1; }
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "== pip install ${spec/#$src/SRC}"
  echo "site-packages: $(du -sm "$site" | cut -f1) MB (pip $(du -sm "$site/pip" | cut -f1) MB)"
  echo "setuptools 'absent from the packages configuration' warnings: $(grep -c 'is absent from the `packages` configuration' "$venv.log" || true)"
  echo "largest (MB):"
  du -sm "$site"/*/ | sort -rn | head -20 | sed "s|$site/||"
done
