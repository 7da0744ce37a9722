#!/usr/bin/env bash
# The GPU campaign, one part per device command (docs/gpu-campaign.md):
#
#   benchmarks/gpu/campaign.sh PART [--device cpu] [--tiny] [--out DIR] [--wheels DIR] [--budget SECONDS]
#
# PART is setup, suite, throughput, paper, kernels or peers (the two short slots: issue 48). Results go to --out, else $OUT
# (the device machine's folder that comes back), else runs/gpu-campaign: PART.log and PART.json, nothing else.
# First the carried wheels (make gpu-wheels: .whl/, or --wheels DIR) are installed offline into $CAMPAIGN_SITE (default /tmp/site) and put on PYTHONPATH with
# src/ (interlayer runs from the working tree); then benchmarks/gpu/campaign.py checks that every needed package
# imports, naming any that does not, and runs the part. Exit status 0 only when every step of the part succeeded.
set -uo pipefail
cd "$(dirname "$0")/../.."
usage="usage: benchmarks/gpu/campaign.sh {setup|suite|throughput|paper|kernels|peers} [--device cpu] [--tiny] [--out DIR] [--wheels DIR] [--budget SECONDS]"
part="${1:-}"
case "$part" in
    setup|suite|throughput|paper|kernels|peers) shift ;;
    *) echo "campaign.sh: unknown part '${part}'; $usage" >&2; exit 2 ;;
esac
out="${OUT:-runs/gpu-campaign}" wheels=".whl" forward=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="${2:?--out needs a folder}"; shift 2 ;;
        --wheels) wheels="${2:?--wheels needs a folder}"; shift 2 ;;
        --device|--budget) forward+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
        --tiny) forward+=("$1"); shift ;;
        *) echo "campaign.sh: unknown option '$1'; $usage" >&2; exit 2 ;;
    esac
done
python="${PYTHON:-python3}"
site="${CAMPAIGN_SITE:-/tmp/site}"
mkdir -p "$out"
log="$out/$part.log"
: >"$log"
shopt -s nullglob
carried=("$wheels"/*.whl)
if [ ${#carried[@]} -gt 0 ]; then
    echo "== installing ${#carried[@]} carried wheels from $wheels into $site (offline)" | tee -a "$log"
    if ! "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "${carried[@]}" >>"$log" 2>&1; then
        echo "!! pip could not install the wheels in $wheels (see $log); the import check below names what is missing" \
            | tee -a "$log"
    fi
else
    echo "== no wheels in $wheels: nothing installed (make gpu-wheels prepares them)" | tee -a "$log"
fi
export PYTHONPATH="$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" benchmarks/gpu/campaign.py "$part" --out "$out" "${forward[@]}"
