#!/usr/bin/env bash
# Every sample's outputs, for "the refit changes no answer": run before and after a change,
# then `diff -r BEFORE AFTER`. Usage: scripts/snapshot_outputs.sh OUT_DIR [tracekit]
# Writes, per sample: analyze (console), analyze --json, check (against its baseline, or
# without), whatif -m 16 --json, export -o merged trace, export --tables --csv, report --html
# with bokeh's random ids replaced. Absolute paths of this checkout are replaced by "<root>".
set -uo pipefail
out=${1:?usage: snapshot_outputs.sh OUT_DIR [tracekit-command]}
tk=${2:-tracekit}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
export TRACEKIT_CACHE_DIR=$(mktemp -d)   # a cold cache: no answer comes from an older build
norm() { sed -e "s#$root#<root>#g" -e 's#/tmp/[A-Za-z0-9._/-]*#<tmp>#g'; }
for run in "$root"/sample_traces/*/ "$root"/sample_traces/validation/*/; do
  name=$(basename "$run")
  ls "$run" | grep -qE 'rank|\.sqlite|\.nsys-rep' || continue
  d="$out/$name"; mkdir -p "$d"
  $tk analyze "$run" --no-progress 2>&1 | norm > "$d/analyze.txt"; echo "rc=$?" >> "$d/analyze.txt"
  $tk analyze "$run" --json --no-progress 2>/dev/null | norm > "$d/analyze.json"
  base="$root/baselines/$name.json"
  if [ -f "$base" ]; then
    $tk check "$run" --baseline "$base" --no-progress --no-config 2>&1 | norm > "$d/check.txt"
  else
    $tk check "$run" --no-progress --no-config 2>&1 | norm > "$d/check.txt"
  fi
  echo "rc=${PIPESTATUS[0]}" >> "$d/check.txt"
  $tk whatif "$run" -m 16 --json --no-progress 2>&1 | norm > "$d/whatif.json"
  $tk export "$run" -o "$d/merged.json" --no-progress > /dev/null 2>&1
  [ -f "$d/merged.json" ] && norm < "$d/merged.json" > "$d/merged.norm.json" && rm -f "$d/merged.json"
  $tk export "$run" --tables "$d/tables" --csv --no-progress > /dev/null 2>&1
  rm -f "$d"/tables/*.parquet
  $tk report "$run" -o "$d/report.html" --no-progress > /dev/null 2>&1
  if [ -f "$d/report.html" ]; then
    # bokeh's ids and the generation time differ on every run
    sed -E -e 's/"id":"[^"]*"/"id":"X"/g' -e 's/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/UUID/g' \
      -e 's/(id|for|data-root-id)="[^"]*"/\1="X"/g' -e 's/p[0-9]{4,}/pN/g' "$d/report.html" | norm > "$d/report.norm.html"
    rm -f "$d/report.html"
  fi
done
echo "snapshot in $out"
