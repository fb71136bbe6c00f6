#!/usr/bin/env bash
# The prepared GPU capture of issue #29: run it in ONE call of the device tool, first thing in a
# session that is lent a GPU (the tool runs it in the repository root and brings $OUT back):
#
#   run(command="bash scripts/gpu_capture.sh", timeout_s=540)
#
# What it records, with the profiler's CUDA activity and with_stack, every rank on GPU 0
# (NCCL refuses two ranks on one device, so P2P is gloo through the host; capture.json says so):
#   gpu_1f1b         torch.distributed.pipelining 1F1B,            p=4 m=8,     3 profiled steps
#   gpu_interleaved  torch.distributed.pipelining Interleaved1F1B, p=4 v=2 m=8, 3 profiled steps
# and what tracekit makes of each, there. Megatron-core is not in the device image (and its
# capture shims CUDA away), so no Megatron GPU run yet.
#
# $OUT gets (at most 8 files come back): <name>.tar.gz (the capture folder: rank<R>.json.gz +
# capture.json), analyze_<name>.txt, and gpu_capture.log (versions, nvidia-smi, every step).
# Then, here: tar -xzf each into sample_traces/, keep the command from capture.json, and check
# tracekit on them (tests, baselines, sample_traces/README.md).
#
# Nothing needs installing there: the image's python3 has torch (CUDA), numpy, pandas, pyarrow,
# click and jinja2; tracekit runs from the checkout (PYTHONPATH) without its C scanner.
# DEVICE=cpu HIDDEN=256 MB_ROWS=8 bash scripts/gpu_capture.sh runs the same steps on a CPU
# (how the script itself is tested where no GPU is lent).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_capture_out}
DEVICE=${DEVICE:-cuda}
HIDDEN=${HIDDEN:-4096}   # 8 MB activations per microbatch with MB_ROWS=512: 3 ms of gloo
MB_ROWS=${MB_ROWS:-512}
PY=${PY:-python3}
WORK=$(mktemp -d)
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_capture.log") 2>&1

echo "== machine"
date -u
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

capture() {
  local name=$1
  shift
  echo "== capture $name"
  if timeout 200 "$PY" -m tracekit capture -o "$WORK/$name" "$@" --device "$DEVICE" --compute real \
    --hidden "$HIDDEN" --microbatch-size "$MB_ROWS" --with-stack; then
    tar -C "$WORK" -czf "$OUT/$name.tar.gz" "$name"
    echo "== tracekit analyze $name"
    timeout 120 "$PY" -m tracekit analyze "$WORK/$name" --no-cache --no-progress >"$OUT/analyze_$name.txt" 2>&1
    echo "analyze exit $?"
    head -12 "$OUT/analyze_$name.txt"
  else
    echo "capture $name failed (exit $?)"
  fi
}

capture gpu_1f1b --schedule 1F1B -p 4 -m 8 --steps 3
capture gpu_interleaved --schedule Interleaved1F1B -p 4 -m 8 -v 2 --steps 3
ls -la "$OUT"
