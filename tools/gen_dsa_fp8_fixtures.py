# Usage (on the GPU machine): python3 tools/gen_dsa_fp8_fixtures.py GEN_MODEL_FIXTURES_PY FIXTURE_DIR
# FP8 (e4m3, 128x128 blocks, power-of-two scales) variants of the DSA fixtures in FIXTURE_DIR
# (deepseek_v32, glm_moe_dsa of tests/data/fixtures/models), made by GEN_MODEL_FIXTURES_PY's own make_fp8
# and finish (gen_model_fixtures.py, the generator of those fixtures, from the project's shared reference
# data), exactly as deepseek_v3_fp8 / kimi_linear_fp8 were -> $OUT/fixtures_dsa_fp8.tgz.
import os, sys, tarfile
import torch

OUT = os.environ.get("OUT", "/tmp/out")
GEN, FIXDIR = sys.argv[1], sys.argv[2]
ns = {"__name__": "gen"}
sys.argv = [GEN, "none"]
exec(compile(open(GEN).read(), GEN, "exec"), ns)
work = "/tmp/fixtures_dsa_fp8"
os.makedirs(work, exist_ok=True)
made = []
for base in ("deepseek_v32", "glm_moe_dsa"):
    name = base + "_fp8"
    try:
        d = os.path.join(work, name)
        model = ns["make_fp8"](os.path.join(FIXDIR, base), d)
        ns["finish"](name, model, d, dict(arch=base, quantized_from=base,
                                         made_by="tools/gen_dsa_fp8_fixtures.py: gen_model_fixtures.make_fp8 + finish"))
        made.append(name)
    except Exception as e:
        import traceback
        print(f"== {name}: FAILED {type(e).__name__}: {e}")
        traceback.print_exc(limit=6)
with tarfile.open(os.path.join(OUT, "fixtures_dsa_fp8.tgz"), "w:gz") as t:
    for n in made:
        t.add(os.path.join(work, n), arcname=n)
print("made", made)
