"""Golden values for the op tables (tests/op_table.h): the rows of every `OpTable` in
tests/test_*.cpp, read from the C++ source, evaluated with PyTorch.
Run with Debian's python3-torch: /usr/bin/python3 tests/golden/gen_op_tables.py -> op_tables.json.

A row opens {"name", "torch expression", {shapes...}, {domains...}, ...; the expression reads
the inputs a, b, c, ... made from the shapes and domains with a seed taken from the row's name
(so adding a row leaves the others' values alone). For each row the file holds
  <name>.row   the row's signature, which the C++ test compares to spot stale values;
  <name>.in<i> the inputs;  <name>.out the result;
  <name>.gy, <name>.g<i>   when the result has a gradient: an upstream gradient and the
               gradient of every floating input;
  <name>.edge <variant>.out, .g<i>   for the edge shapes of tests/edge_shapes.h (Note [Edge
               variants] there): the result, or "error", and the gradients for an upstream
               gradient of ones, as text."""
import codecs
import glob
import os
import re
import string
import sys
import warnings
import zlib

import torch
import torch.nn.functional as F

from golden import HERE, write

TESTS = os.path.dirname(HERE)
STRING = r'"(?:[^"\\]|\\.)*"'
ROW = re.compile(
    r"\{\s*(?P<name>" + STRING + r")\s*,"
    r"\s*(?P<torch>" + STRING + r"(?:\s*" + STRING + r")*)\s*,"
    r"\s*\{(?P<shapes>(?:\s*\{[^{}]*\}\s*,?)*)\}\s*,"
    r"\s*\{(?P<domains>[^{}]*)\}\s*,", re.S)
TABLE = re.compile(r"\bOpTable\s+\w+\s*=\s*\{")
DOMAINS = ("Real", "Positive", "Integer", "Bool")


def literal(text):
    """The value of adjacent C++ string literals (simple escapes only)."""
    pieces = re.findall(STRING, text)
    return "".join(codecs.decode(p[1:-1], "unicode_escape") for p in pieces)


def skip_to_close(text, i):
    """text[i] is an opening brace: the index just past its closing brace, skipping string and
    character literals and comments."""
    depth = 0
    while i < len(text):
        if text.startswith("//", i):
            i = text.index("\n", i)
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 1
        elif text[i] in "\"'":
            quote, i = text[i], i + 1
            while text[i] != quote:
                i += 2 if text[i] == "\\" else 1
        elif text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced braces")


def rows_of(path):
    """(name, torch, shapes, domains) of every row of every OpTable in the file."""
    text = open(path).read()
    for table in TABLE.finditer(text):
        end = skip_to_close(text, table.end() - 1) - 1
        i = table.end()
        while True:
            m = re.compile(r"(?:\s|,|//[^\n]*\n)*").match(text, i)
            i = m.end()
            if i >= end:
                break
            line = text.count("\n", 0, i) + 1
            row = ROW.match(text, i)
            if not row:
                sys.exit(f"{path}:{line}: cannot read this OpTable row")
            shapes = [tuple(int(d) for d in s.replace(" ", "").split(",") if d)
                      for s in re.findall(r"\{([^{}]*)\}", row["shapes"])]
            domains = [d.strip().removeprefix("Domain::") for d in row["domains"].split(",")
                       if d.strip()]
            if any(d not in DOMAINS for d in domains) or len(domains) > len(shapes):
                sys.exit(f"{path}:{line}: bad domains {domains}")
            domains += ["Real"] * (len(shapes) - len(domains))
            yield literal(row["name"]), literal(row["torch"]), shapes, domains
            i = skip_to_close(text, i)


def signature(expr, shapes, domains):
    """As detail::signature in tests/op_table.h."""
    shape_list = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
    return f"{expr}; shapes [{shape_list}]; domains [{', '.join(domains)}]"


def make_input(shape, domain):
    if domain == "Real":
        return torch.randn(shape, dtype=torch.float64)
    if domain == "Positive":
        return torch.rand(shape, dtype=torch.float64) + 0.5
    if domain == "Integer":
        return torch.randint(-3, 4, shape).to(torch.float64)
    return torch.rand(shape) > 0.5


def edge_variants(shapes):
    """As detail::edge_variants in tests/edge_shapes.h: (name, shapes) with one dim 0, with
    every dim of one size 0, and with every dim 1."""
    out = []
    for i, s in enumerate(shapes):
        for d, n in enumerate(s):
            if n != 0:
                v = [list(x) for x in shapes]
                v[i][d] = 0
                out.append((f"in{i} dim{d} 0", v))
    sizes = []
    for s in shapes:
        for n in s:
            if n > 0 and n not in sizes:
                sizes.append(n)
    for n in sizes:
        if sum(list(s).count(n) for s in shapes) >= 2:
            out.append((f"size {n} 0", [[0 if m == n else m for m in s] for s in shapes]))
    ones = [[1] * len(s) for s in shapes]
    if ones != [list(s) for s in shapes]:
        out.append(("ones", ones))
    return out


def edge_input(shape, domain):
    """As detail::edge_input in tests/edge_shapes.h: values fixed by the flat index k."""
    k = torch.arange(torch.Size(shape).numel())
    if domain == "Real":
        v = ((k * 7 + 3) % 11 - 5).double() / 4
    elif domain == "Positive":
        v = 0.5 + ((k * 5 + 1) % 9).double() / 8
    elif domain == "Integer":
        v = ((k * 3 + 1) % 7 - 3).double()
    else:
        v = (k * 5 + 2) % 3 == 0
    return v.reshape(shape)


DTYPE_NAMES = {torch.float32: "Float32", torch.float64: "Float64", torch.int64: "Int64",
               torch.bool: "Bool"}


def edge_text(t):
    """As detail::edge_text: "<shape> <dtype> v0 v1 ...", the shape as fmt prints a Shape."""
    t = t.detach()
    head = "[" + ", ".join(map(str, t.shape)) + "] " + DTYPE_NAMES[t.dtype]
    return " ".join([head] + [repr(float(v)) for v in t.flatten().tolist()])


def edge_values(expr, shapes, domains):
    """For each edge variant of a row: PyTorch's result (or "error") and its gradients."""
    values = {}
    for variant, vshapes in edge_variants(shapes):
        inputs = [edge_input(s, d) for s, d in zip(vshapes, domains)]
        for x in inputs:
            if x.is_floating_point():
                x.requires_grad_()
        env = {"torch": torch, "F": F, **dict(zip(string.ascii_lowercase, inputs))}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = eval(expr, env)
        except (RuntimeError, IndexError, ValueError, TypeError):
            values[f"{variant}.out"] = "error"
            continue
        values[f"{variant}.out"] = edge_text(out)
        if out.requires_grad:
            floating = [x for x in inputs if x.is_floating_point()]
            grads = torch.autograd.grad(out, floating, torch.ones_like(out), allow_unused=True)
            for x, g in zip(floating, grads):
                i = next(k for k, y in enumerate(inputs) if y is x)
                values[f"{variant}.g{i}"] = edge_text(torch.zeros_like(x) if g is None else g)
    return values


def main():
    values, seen = {}, set()
    for path in sorted(glob.glob(os.path.join(TESTS, "test_*.cpp"))):
        for name, expr, shapes, domains in rows_of(path):
            if name in seen:
                sys.exit(f"{path}: row name '{name}' is used twice")
            seen.add(name)
            torch.manual_seed(zlib.crc32(name.encode()))
            inputs = [make_input(s, d) for s, d in zip(shapes, domains)]
            for x in inputs:
                if x.is_floating_point():
                    x.requires_grad_()
            env = {"torch": torch, "F": F, **dict(zip(string.ascii_lowercase, inputs))}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # broadcast targets, kl_div's 'mean'
                out = eval(expr, env)
            values[f"{name}.row"] = signature(expr, shapes, domains)
            for i, x in enumerate(inputs):
                values[f"{name}.in{i}"] = x
            values[f"{name}.out"] = out
            if out.requires_grad:
                floating = [x for x in inputs if x.is_floating_point()]
                gy = torch.randn(out.shape, dtype=torch.float64)
                grads = torch.autograd.grad(out, floating, gy, allow_unused=True)
                values[f"{name}.gy"] = gy
                for x, g in zip(floating, grads):
                    i = next(k for k, y in enumerate(inputs) if y is x)
                    values[f"{name}.g{i}"] = torch.zeros_like(x) if g is None else g
            for key, v in edge_values(expr, shapes, domains).items():
                values[f"{name}.edge {key}"] = v
    write("op_tables", values, one_per_line=True)


if __name__ == "__main__":
    main()
