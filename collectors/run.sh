#!/usr/bin/env bash
# Run the overlap experiment on this node: one configuration through torchrun, or a sweep.
#
#   NGPU=8 CONFIG=cb_ar ./collectors/run.sh --setup optimized --smem-pad-bytes 65536
#   NGPU=8 SWEEP=my_sweep.toml OUT=runs/a100 ./collectors/run.sh
#   NGPU=1 CONFIG=cb_ar_standin ./collectors/run.sh        # one GPU: the stand-in, not NCCL
#   NGPU=2 CONFIG=gloo_smoke ./collectors/run.sh           # CPU only: gloo
#
# Extra arguments ("$@") are configuration overrides (--<field> VALUE, see
# `python -m overlapviz.collectors.run --help`). Each rank writes its own files under
# OUT/runs/<run_id>/ (a shared filesystem across nodes); rank 0 writes the manifest.
set -euo pipefail

NGPU=${NGPU:-8}
CONFIG=${CONFIG:-cb_ar}          # a preset name, or a JSON file of fields
SWEEP=${SWEEP:-}                 # a TOML sweep file: runs every configuration, resumable
OUT=${OUT:-./overlap_runs}
LOG_RANK=${LOG_RANK:-0}          # which local rank's output to show
# NVLink multicast stays off unless asked for (it can wedge shared hosts' GPUs)
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# safe-path mode for every Python the launcher starts: from a clone's root, the clone's own
# overlapviz/ directory must not shadow the installed package (it has no collectors/)
export PYTHONSAFEPATH=1

if [[ -n "$SWEEP" ]]; then
  exec overlapviz collect --sweep "$SWEEP" --nproc "$NGPU" -o "$OUT" "$@"
fi

if [[ -f "$CONFIG" ]]; then SOURCE=(--config "$CONFIG"); else SOURCE=(--preset "$CONFIG"); fi
exec torchrun --standalone --nproc-per-node="$NGPU" \
  --local-ranks-filter "$LOG_RANK" --role rank --tee 3 \
  -m overlapviz.collectors.run "${SOURCE[@]}" --out "$OUT" "$@"
