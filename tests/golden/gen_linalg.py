"""Golden values for tests/test_linalg.cpp: matmul, bmm and linear with PyTorch (float64).

Each case stores its inputs (`<case>.in0`, `.in1`, ...), the output, an upstream gradient
`<case>.grad_out` and the gradient of every input (`<case>.grad0`, ...). The case names, input
shapes and functions mirror the table in test_linalg.cpp (transposes/expands made inside f)."""
import torch
import torch.nn.functional as F

from golden import write

mm = torch.matmul
CASES = {
    # name: (input shapes, f)
    "dot": ([(5,), (5,)], lambda a, b: mm(a, b)),
    "mm": ([(3, 4), (4, 5)], lambda a, b: mm(a, b)),
    "vec_mat": ([(4,), (4, 5)], lambda a, b: mm(a, b)),
    "mat_vec": ([(3, 4), (4,)], lambda a, b: mm(a, b)),
    "batched_mat": ([(2, 3, 4), (4, 5)], lambda a, b: mm(a, b)),
    "vec_batched": ([(4,), (2, 4, 5)], lambda a, b: mm(a, b)),
    "batched_vec": ([(2, 3, 4), (4,)], lambda a, b: mm(a, b)),
    "mat_batched": ([(3, 4), (2, 4, 5)], lambda a, b: mm(a, b)),
    "batched_same": ([(2, 3, 4), (2, 4, 5)], lambda a, b: mm(a, b)),
    "batch_broadcast": ([(2, 1, 3, 4), (3, 4, 2)], lambda a, b: mm(a, b)),
    "size_one": ([(1, 4), (2, 4, 1)], lambda a, b: mm(a, b)),
    "attention": ([(2, 2, 3, 4), (2, 2, 3, 4)], lambda q, k: mm(q, k.transpose(-2, -1))),
    "transposed_a": ([(4, 3), (4, 5)], lambda a, b: mm(a.t(), b)),
    "transposed_both": ([(4, 3), (5, 4)], lambda a, b: mm(a.t(), b.t())),
    "narrowed": ([(3, 6), (4, 5)], lambda a, b: mm(a.narrow(1, 1, 4), b)),
    "expanded_b": ([(3, 4), (4, 1)], lambda a, b: mm(a, b.expand(4, 5))),
    "permuted_batch": ([(3, 2, 4), (4, 5)], lambda a, b: mm(a.transpose(0, 1), b)),
    "grad_expanded": ([(2, 3, 4), (2, 4, 5)], lambda a, b: mm(a, b).sum(-1)),
    "bmm": ([(2, 3, 4), (2, 4, 5)], lambda a, b: torch.bmm(a, b)),
    "bmm_transposed": ([(2, 4, 3), (2, 5, 4)],
                       lambda a, b: torch.bmm(a.transpose(1, 2), b.transpose(1, 2))),
    "linear": ([(3, 4), (5, 4), (5,)], lambda x, w, b: F.linear(x, w, b)),
    "linear_nobias": ([(3, 4), (5, 4)], lambda x, w: F.linear(x, w)),
    "linear_3d": ([(2, 3, 4), (5, 4), (5,)], lambda x, w, b: F.linear(x, w, b)),
    "linear_1d": ([(4,), (5, 4), (5,)], lambda x, w, b: F.linear(x, w, b)),
    "linear_transposed_x": ([(3, 2, 4), (5, 4), (5,)],
                            lambda x, w, b: F.linear(x.transpose(0, 1), w, b)),
    "linear_transposed_w": ([(3, 4), (4, 5), (5,)], lambda x, w, b: F.linear(x, w.t(), b)),
}


def main():
    torch.manual_seed(0)
    values = {}
    for name, (shapes, f) in CASES.items():
        inputs = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]
        out = f(*inputs)
        grad_out = torch.randn(out.shape, dtype=torch.float64)
        out.backward(grad_out)
        for i, x in enumerate(inputs):
            values[f"{name}.in{i}"] = x
            values[f"{name}.grad{i}"] = x.grad
        values[f"{name}.out"] = out
        values[f"{name}.grad_out"] = grad_out
    write("linalg", values)


if __name__ == "__main__":
    main()
