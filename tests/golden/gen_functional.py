"""Golden values for tests/test_functional.cpp: torch.autograd.grad to third order and
torch.autograd.functional (vjp, jvp, hvp, vhp, jacobian, hessian), Float64, on functions both
sides can write with the same ops. Inputs are saved too ("<name>.x", ...).
Run: /usr/bin/python3 tests/golden/gen_functional.py -> functional.json
"""
import torch
from torch.autograd import grad
from torch.autograd.functional import hessian, hvp, jacobian, jvp, vhp, vjp

from golden import write

torch.set_default_dtype(torch.float64)
torch.manual_seed(34)
out = {}

x = torch.randn(3, 4)
w = torch.randn(4, 2)
A = torch.randn(3, 5)
out.update({"x": x, "w": w, "A": A})


def f(x, w):  # (3, 2)
    return torch.tanh(x @ w) * x.sum()


def scalar(x, w):  # one element
    return (torch.tanh(x @ w) ** 2).sum() + (torch.sin(x) * x).sum() + (x @ w).exp().mean()


# autograd.grad: a gradient penalty (first derivatives, differentiated again) and a third order
xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
y = scalar(xg, wg)
gx, gw = grad(y, [xg, wg], create_graph=True)
out["grad.gx"], out["grad.gw"] = gx, gw
penalty = (gx ** 2).sum() + (gw * gw).sum()
px, pw = grad(penalty, [xg, wg], create_graph=True)
out["grad.penalty_x"], out["grad.penalty_w"] = px, pw
third = grad(px.sin().sum(), [wg])[0]
out["grad.third_w"] = third

v_out = torch.randn(3, 2)
vx, vw = torch.randn(3, 4), torch.randn(4, 2)
out.update({"v_out": v_out, "vx": vx, "vw": vw})

o, (jx, jw) = vjp(f, (x, w), v_out)
out.update({"vjp.out": o, "vjp.x": jx, "vjp.w": jw})
o, jv = jvp(f, (x, w), (vx, vw))
out.update({"jvp.out": o, "jvp.jvp": jv})
o, (hx, hw) = hvp(scalar, (x, w), (vx, vw))
out.update({"hvp.out": o, "hvp.x": hx, "hvp.w": hw})
o, (hx, hw) = vhp(scalar, (x, w), (vx, vw))
out.update({"vhp.x": hx, "vhp.w": hw})


def g(x):  # (3, 5) from (3, 4)... with A fixed: x[:, :3].T-free form
    return torch.tanh(x.t() @ A) * x.sum(0, keepdim=True).t()  # (4, 5)


out["jacobian"] = jacobian(g, x)  # (4, 5, 3, 4)
# the same Jacobian by forward mode (Ember's functional::jacfwd; torch.func.jacfwd's columns)
out["jacfwd"] = jacobian(g, x, vectorize=True, strategy="forward-mode")


def s(x):
    return (x ** 3).sum() * torch.sin(x).sum() + (torch.tanh(x @ w) ** 2).sum()


out["hessian"] = hessian(s, x)  # (3, 4, 3, 4)

# create_graph: an hvp differentiated again (third derivatives through the functional API)
xc = x.clone().requires_grad_()
_, (hc,) = hvp(lambda x: s(x), (xc,), (vx,), create_graph=True)
out["hvp_create_graph.dx"] = grad(hc.pow(2).sum(), xc)[0]
# and a Jacobian with create_graph, differentiated
xc = x.clone().requires_grad_()
jc = jacobian(lambda x: torch.tanh(x @ w), xc, create_graph=True)
out["jacobian_create_graph.dx"] = grad((jc ** 2).sum(), xc)[0]

write("functional", out)
