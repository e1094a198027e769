#!/bin/sh
# tools/static_dtype_table.sh — `moonshine verify DIR --static-dtype D` for every unique fixture
# directory of tests/fixtures.list and tests/fixtures-extra.list (each line's flags ignored: plain
# resident), D = q8 then fp8: one line "DIR JSON" per run, then per dtype a summary line: runs
# passing, teacher-forced and free-running greedy agreement, flips (near ties / outside the margin
# bound), near-tie steps, prefill argmax agreement and prefill flips outside the bound, the
# routed-expert / DSA choices compared with the stored tier's, those that differed (and of them
# beyond their own margin bound: failures), and the choices forced to the stored tier's.
cd "$(dirname "$0")/.."
for sd in q8 fp8; do
  cat tests/fixtures.list tests/fixtures-extra.list | grep -v '^#' | awk 'NF{print $1}' | awk '!s[$0]++' | while read d; do
    out=$(./build/moonshine verify $d --static-dtype $sd 2>/dev/null); echo "$d $out"
  done | awk -v sd=$sd '
    function frac(k,   m) { if (match($0, "\"" k "\":\"[0-9]+/[0-9]+\"")) { m = substr($0, RSTART + length(k) + 4, RLENGTH - length(k) - 5); split(m, p, "/"); A[k] += p[1]; N[k] += p[2] } }
    { print; runs++; ok += /"ok":true/; frac("gen_ids_agree"); frac("free_ids_agree"); frac("prefill_argmax_agree")
      s = $0; sub(/\],"choices_compared".*/, "", s); sub(/.*"flips":\[/, "", s)
      while (match(s, /"near_tie":(true|false)/)) { if (substr(s, RSTART + 11, 4) == "true") nt++; else far++; s = substr(s, RSTART + RLENGTH) }
      s = $0; sub(/.*"choice_flips":\[/, "", s)
      while (match(s, /"near_tie":(true|false)/)) { cf++; if (substr(s, RSTART + 11, 4) != "true") cfbad++; s = substr(s, RSTART + RLENGTH) }
      if (match($0, /"choices_compared":[0-9]+/)) cc += substr($0, RSTART + 19, RLENGTH - 19)
      if (match($0, /"choices_forced":[0-9]+/)) cfo += substr($0, RSTART + 17, RLENGTH - 17)
      s = $0; sub(/.*"near_ties":\[/, "", s); sub(/\].*/, "", s); while (match(s, /"step"/)) { near++; s = substr(s, RSTART + 6) }
      if (match($0, /"prefill_flips_outside_bound":[0-9]+/)) pf += substr($0, RSTART + 30, RLENGTH - 30) }
    END { printf "summary %s: %d/%d pass; greedy teacher-forced %d/%d, free-running %d/%d; flips %d near-tie + %d outside the bound; near-tie steps %d; prefill argmax %d/%d, %d flips outside the bound; choices compared %d, flipped %d (beyond their bound %d), forced %d\n",
          sd, ok, runs, A["gen_ids_agree"], N["gen_ids_agree"], A["free_ids_agree"], N["free_ids_agree"], nt, far, near, A["prefill_argmax_agree"], N["prefill_argmax_agree"], pf, cc, cf, cfbad, cfo }'
done
