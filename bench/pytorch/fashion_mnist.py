"""The PyTorch twin of examples/fashion_mnist: the same two models (torch's default
initialisation, which Ember's modules copy), the same normalisation, augmentation (pad 2 and
crop, then flip), optimizers and per-step cosine schedule, and an order reshuffled every epoch
(torch's generator, so the same distribution of orders, not Ember's permutations).

  python3 bench/pytorch/fashion_mnist.py --model cnn --epochs 15 --threads 2
  python3 bench/pytorch/fashion_mnist.py --model resnet --augment --train-size 6400 --epochs 1
      [--channels-last] [--compile] [--autocast]

--autocast runs every forward and loss (training and test) under torch.autocast("cpu",
torch.bfloat16): convolutions and products on bfloat16 operands (oneDNN's bf16 kernels), the
twin of the example's --matmul-precision medium; weights, gradients and optimizer stay Float32.

Prints per-epoch test accuracy and, at the end, one JSON line with test_accuracy and
images_per_s (training only), as the example's metrics.json.
"""
import argparse, contextlib, gzip, json, math, os, time

import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path) as f:
        data = f.read()
    magic = int.from_bytes(data[:4], "big")
    rank = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(rank)]
    t = torch.frombuffer(bytearray(data[4 + 4 * rank:]), dtype=torch.uint8)
    return t.reshape(dims)


def cnn():
    def block(i, o):
        return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]
    return nn.Sequential(*block(1, 32), *block(32, 32), nn.MaxPool2d(2), *block(32, 64),
                         *block(64, 64), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3136, 256),
                         nn.ReLU(), nn.Dropout(0.3), nn.Linear(256, 10))


class BasicBlock(nn.Module):
    def __init__(self, i, o, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(i, o, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(o)
        self.conv2 = nn.Conv2d(o, o, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(o)
        self.downsample = None
        if stride != 1 or i != o:
            self.downsample = nn.Sequential(nn.Conv2d(i, o, 1, stride, bias=False),
                                            nn.BatchNorm2d(o))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(h))
        return F.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 16, 1))
        self.layer2 = nn.Sequential(BasicBlock(16, 32, 2), BasicBlock(32, 32, 1))
        self.layer3 = nn.Sequential(BasicBlock(32, 64, 2), BasicBlock(64, 64, 1))
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layer3(self.layer2(self.layer1(h)))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


def augment(x):
    n = x.shape[0]
    padded = F.pad(x, (2, 2, 2, 2))
    tops = torch.randint(0, 5, (n,)).tolist()
    lefts = torch.randint(0, 5, (n,)).tolist()
    out = torch.stack([padded[i, :, t:t + 28, l:l + 28] for i, (t, l) in enumerate(zip(tops, lefts))])
    flip = torch.rand(n) < 0.5
    out[flip] = out[flip].flip(-1)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn", choices=["cnn", "resnet"])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0)
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    p.add_argument("--augment", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--train-size", type=int, default=0)
    p.add_argument("--test-size", type=int, default=0)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--autocast", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    train_x = read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz")).float().div_(255).unsqueeze(1)
    train_y = read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz")).long()
    test_x = read_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz")).float().div_(255).unsqueeze(1)
    test_y = read_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz")).long()
    if a.train_size: train_x, train_y = train_x[:a.train_size], train_y[:a.train_size]
    if a.test_size: test_x, test_y = test_x[:a.test_size], test_y[:a.test_size]
    model = cnn() if a.model == "cnn" else ResNet()
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    lr = a.lr or (0.1 if a.optimizer == "sgd" else 1e-3)
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    else:
        opt = torch.optim.Adam(model.parameters(), lr)
    steps = math.ceil(len(train_x) / a.batch)
    total = a.epochs * steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    forward = torch.compile(model) if a.compile else model
    cast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if a.autocast
            else contextlib.nullcontext)
    seconds, images = 0.0, 0
    for epoch in range(a.epochs):
        model.train()
        order = torch.randperm(len(train_x))
        start = time.perf_counter()
        for s in range(steps):
            idx = order[s * a.batch:(s + 1) * a.batch]
            x = train_x[idx]
            if a.augment:
                x = augment(x)
            x = ((x - MEAN) / STD).contiguous(memory_format=fmt)
            with cast():
                loss = F.cross_entropy(forward(x), train_y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        seconds += time.perf_counter() - start
        images += len(train_x)
        model.eval()
        with torch.no_grad(), cast():
            pred = torch.cat([forward(((test_x[i:i + 1000] - MEAN) / STD).contiguous(memory_format=fmt)).argmax(1)
                              for i in range(0, len(test_x), 1000)])
        acc = (pred == test_y).float().mean().item()
        print(f"epoch {epoch + 1}/{a.epochs}: test accuracy {100 * acc:.2f}%, "
              f"{len(train_x) / (time.perf_counter() - start):.0f} images/s", flush=True)
    print(json.dumps({"torch": torch.__version__, "model": a.model, "threads": a.threads,
                      "channels_last": a.channels_last, "compile": a.compile, "autocast": a.autocast,
                      "test_accuracy": acc, "images_per_s": images / seconds}))


if __name__ == "__main__":
    main()
