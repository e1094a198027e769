"""Reference clamped SwiGLU outputs, computed by the transformers sources themselves.

The activation code of three models is taken from the transformers 5.17.0 sources
(gpt-oss GptOssExperts._apply_gate, GLM-5-Next Glm5NextTextMLP.forward, DeepSeek-V4
DeepseekV4MLP.forward), and run, unmodified, on a tiny float64 stand-in for the few torch
tensor operations they use (clamp, sigmoid, silu, arithmetic, strided slicing). Prints JSON:
{"gate": [...], "up": [...], "gpt_oss": [...], "glm5_next": [...], "deepseek_v4": [...]}.
Usage: swiglu_reference.py TRANSFORMERS_MODELS_DIR  (transformers/models of 5.17.0)
tools/refs/regen.sh runs it into tests/data/swiglu_reference.json, which test_act reads.
"""
import ast
import json
import math
import sys
import textwrap


class T:
    """A 1-D float64 'tensor' with the operations the activation code uses."""

    def __init__(self, v):
        self.v = [float(x) for x in v]

    def clamp(self, min=None, max=None):  # noqa: A002 - torch's argument names
        out = []
        for x in self.v:
            if math.isnan(x):
                out.append(x)
                continue
            if min is not None and x < min:
                x = float(min)
            if max is not None and x > max:
                x = float(max)
            out.append(x)
        return T(out)

    def _op(self, o, f):
        if isinstance(o, T):
            return T([f(a, b) for a, b in zip(self.v, o.v)])
        return T([f(a, o) for a in self.v])

    def __mul__(self, o):
        return self._op(o, lambda a, b: a * b)

    __rmul__ = __mul__

    def __add__(self, o):
        return self._op(o, lambda a, b: a + b)

    __radd__ = __add__

    def __getitem__(self, k):
        if isinstance(k, tuple):
            k = k[-1]
        return T(self.v[k])


def sigmoid(t):
    return T([1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x)) for x in t.v])


class TorchShim:
    Tensor = T
    sigmoid = staticmethod(sigmoid)


def silu(t):
    return t * sigmoid(t)


def method(path, cls, name):
    src = open(path).read()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == name:
                    ns = {"torch": TorchShim}
                    exec(textwrap.dedent(ast.get_source_segment(src, f)), ns)
                    return ns[name]
    raise SystemExit(f"{cls}.{name} not found in {path}")


class Obj:
    pass


def main():
    models = sys.argv[1]
    gate = [x / 4.0 for x in range(-60, 61)] + [-100.0, 100.0, 6.999, 7.001, 9.999, 10.001]
    up = [((i * 37) % 121 - 60) / 4.0 for i in range(len(gate))]
    gate_up = [v for pair in zip(gate, up) for v in pair]  # gpt-oss interleaves gate and up
    out = {"gate": gate, "up": up}

    apply_gate = method(f"{models}/gpt_oss/modeling_gpt_oss.py", "GptOssExperts", "_apply_gate")
    s = Obj()
    s.alpha, s.limit = 1.702, 7.0
    out["gpt_oss"] = apply_gate(s, T(gate_up)).v

    for key, path, cls, attr in (
        ("glm5_next", f"{models}/glm5_next/modeling_glm5_next.py", "Glm5NextTextMLP", "swiglu_limit"),
        ("deepseek_v4", f"{models}/deepseek_v4/modeling_deepseek_v4.py", "DeepseekV4MLP", "limit"),
    ):
        fwd = method(path, cls, "forward")
        s = Obj()
        setattr(s, attr, 10.0)
        s.gate_proj = lambda x: x[0]
        s.up_proj = lambda x: x[1]
        s.down_proj = lambda y: y
        s.act_fn = silu
        out[key] = fwd(s, (T(gate), T(up))).v
    print(json.dumps(out))


main()
