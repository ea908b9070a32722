#!/usr/bin/env bash
# meshio and Monarch 0.7.0 through the same harness, one after the other, in
# one run; then one table.  Usage: benchmarks/side_by_side.sh [harness args]
# Needs ../shared/bench-peers (the harness) and a Monarch virtualenv; set
# MONARCH_VENV (default: benchmarks/.venv-monarch, created on first use).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
peers=${MESHIO_BENCH_PEERS:-$here/../../shared/bench-peers}
venv=${MONARCH_VENV:-$here/.venv-monarch}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0        # CPU build first (local wheel)
  "$venv/bin/pip" install -q torchmonarch==0.7.0
fi
out=$here/results
mkdir -p "$out"
work=$(mktemp -d)   # the harness writes beside its scripts: use a copy
cp "$peers"/*.py "$work"/
"$venv/bin/python" "$work/bench_monarch.py" --out "$out/monarch.json" "$@"
python3 "$here/bench_meshio.py" --out "$out/meshio.json" "$@"
python3 "$work/report.py" "$out/monarch.json" "$out/meshio.json" | tee "$out/TABLE.md"
python3 "$here/ratios.py" "$out/monarch.json" "$out/meshio.json" | tee -a "$out/TABLE.md"
rm -rf "$work"
