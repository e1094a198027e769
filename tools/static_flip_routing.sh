#!/bin/sh
# tools/static_flip_routing.sh FIXTURE_DIR q8|fp8 — which greedy steps of `verify --static-dtype D`
# route tokens to other experts than the stored tier does. Runs verify twice with the experts
# streamed (--expert-cache-mib 0) and an expert trace: stored (its greedy ids are the reference's,
# so its trace is that of the teacher-forced steps) and requantized (teacher-forced first, then
# free-running; only the teacher-forced forwards are compared). Prints verify's JSON line for D,
# then one line per forward whose acquired experts differ: "routing differs: prefill" or
# "routing differs: step S (layer L: stored {ids} vs D {ids})". A model without routed experts
# prints no such line.
set -e
[ $# -eq 2 ] || { echo "usage: $0 FIXTURE_DIR q8|fp8" >&2; exit 2; }
cd "$(dirname "$0")/.."
d=$1 sd=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
./build/moonshine verify "$d" --expert-cache-mib 0 --expert-trace "$tmp/stored" >/dev/null 2>&1 || true
./build/moonshine verify "$d" --static-dtype "$sd" --expert-cache-mib 0 --expert-trace "$tmp/q" 2>/dev/null || true
[ -s "$tmp/stored" ] || exit 0
# forwards: a forward starts with an acquire of store layer 0 after the release of the last one; forward 0 is the prefill over
# input_ids, forward 1 the gen_prompt (logits of step 0), forward k the logits of step k-1
split() {
  awk 'NR==2{nl=$2; lastr=-1} /^a /{if (started && $2==0 && lastr==nl-1) n++; started=1
         f[n]=f[n] " L" $2 ":{"; for(i=4;i<=NF;i++) f[n]=f[n] (i>4?",":"") $i; f[n]=f[n] "}"}
       /^r /{lastr=$2} END{for(i=0;started && i<=n;i++) print i "\t" f[i]}' "$1"
}
split "$tmp/stored" >"$tmp/s.f"; split "$tmp/q" >"$tmp/q.f"
awk -F'\t' -v sd="$sd" 'NR==FNR{s[$1]=$2; n=FNR; next} FNR<=n && s[$1]!=$2 {
    if ($1==0) print "routing differs: prefill"; else print "routing differs: step " ($1-1) " (stored" s[$1] " vs " sd $2 ")" }' \
  "$tmp/s.f" "$tmp/q.f"
