"""Golden values for tests/test_norm.cpp beyond the op table: torch.nn.BatchNorm1d/2d and
GroupNorm over several training steps (the outputs, running_mean, running_var and
num_batches_tracked after each step), then in eval; and each module's state_dict names in order.
Float64; the inputs are saved too. Also norm_model.safetensors: the state dict of a Float32
Sequential of BatchNorm2d, GroupNorm and BatchNorm2d(affine=False) after two training steps, with
an input and the model's eval output ("model.x", "model.y") in norm.json.
Run: /usr/bin/python3 tests/golden/gen_norm.py -> norm.json, norm_model.safetensors
"""
import os

import torch

from gen_safetensors import save_file
from golden import HERE, write

torch.set_default_dtype(torch.float64)
torch.manual_seed(44)
out = {}


def steps(name, module, shapes, eval_shape):
    """Training steps on fresh inputs, then one eval forward; the module's affine parameters
    are set to random values first (saved as <name>.weight / .bias)."""
    with torch.no_grad():
        if getattr(module, "weight", None) is not None:
            module.weight.copy_(torch.randn(module.weight.shape))
            module.bias.copy_(torch.randn(module.bias.shape))
            out[f"{name}.weight"] = module.weight.detach().clone()
            out[f"{name}.bias"] = module.bias.detach().clone()
    module.train()
    for i, shape in enumerate(shapes):
        x = torch.randn(shape) * 2 + 0.5
        out[f"{name}.x{i}"] = x
        out[f"{name}.y{i}"] = module(x).detach()
        for buf in ("running_mean", "running_var", "num_batches_tracked"):
            value = getattr(module, buf, None)
            if value is not None:
                out[f"{name}.{buf}{i}"] = value.clone()
    module.eval()
    x = torch.randn(eval_shape)
    out[f"{name}.x_eval"] = x
    out[f"{name}.y_eval"] = module(x).detach()
    out[f"{name}.state_dict"] = " ".join(
        f"{k}:{list(v.shape)}:{str(v.dtype).removeprefix('torch.')}"
        for k, v in module.state_dict().items())


steps("bn2d", torch.nn.BatchNorm2d(3), [(4, 3, 2, 3), (2, 3, 3, 2), (5, 3, 1, 2)], (2, 3, 2, 2))
steps("bn2d_momentum", torch.nn.BatchNorm2d(2, eps=1e-3, momentum=0.3, affine=False),
      [(3, 2, 2, 2), (2, 2, 4, 1)], (1, 2, 3, 3))
steps("bn1d", torch.nn.BatchNorm1d(4), [(5, 4), (3, 4), (6, 4)], (2, 4))
steps("bn1d_3d", torch.nn.BatchNorm1d(3, momentum=0.5), [(2, 3, 4), (3, 3, 2)], (2, 3, 5))
steps("bn1d_untracked", torch.nn.BatchNorm1d(3, track_running_stats=False), [(4, 3)], (2, 3))
steps("gn", torch.nn.GroupNorm(2, 4), [(3, 4, 5)], (2, 4, 2, 2))
steps("gn_plain", torch.nn.GroupNorm(3, 6, eps=1e-3, affine=False), [(2, 6, 3)], (1, 6, 2))

model = torch.nn.Sequential(torch.nn.BatchNorm2d(3), torch.nn.GroupNorm(1, 3),
                            torch.nn.BatchNorm2d(3, affine=False)).float()
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.randn(p.shape))
    model.train()
    for _ in range(2):
        model(torch.randn(4, 3, 3, 3, dtype=torch.float32) * 3 + 1)
model.eval()
x = torch.randn(2, 3, 3, 3, dtype=torch.float32)
out["model.x"], out["model.y"] = x, model(x).detach()
save_file(model.state_dict(), os.path.join(HERE, "norm_model.safetensors"),
          metadata={"format": "pt"})

write("norm", out)
