// ember_bench's products/ rows (issue 48's products table): one Float32 product c = op(a) · op(b)
// through ember::gemm into a preallocated c (no autograd; torch.mm(a, b, out=c) in the twin), at
// the shapes the models run: the copy task's steps A, B and C, the LSTM layer of the rnn/ rows,
// the im2col products of the largest Fashion-MNIST convolutions (bench/conv_shapes.h), and small
// shapes where a library's fixed costs show. bench/products.sh times them with each product
// library (EMBER_BLAS) beside PyTorch's MKL, and bench/products_table.py tabulates them.
//
// A row is named `products/<group> <what> MxNxK <TA><TB>`: op(a) is (m, k), op(b) is (k, n), and
// an operand marked T is the transposed view (transpose(0, 1)) of a contiguous tensor, which the
// product takes as a transpose flag, as linear's weight (NT) and the weight gradients (TN) are.
// flops: 2·m·n·k.
#include <array>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "bench/conv_shapes.h"
#include "bench/harness.h"
#include "ember.h"

namespace ember::bench {
namespace {

struct ProductShape {
  const char* group;
  const char* what;
  int64_t m, n, k;
  const char* trans;  // "NN", "NT", "TN": whether op(a), op(b) are transposed views
};

// THE shape list; bench/pytorch/bench_torch.py's PRODUCT_SHAPES mirrors it row for row (keep the
// two the same). Where a product comes from:
//   A: the copy task of step A (800 source tokens, d_model 512, d_ff 2048): the projections
//      X·Wᵀ (NT), ff1's input gradient dY·W (NN) and the weight gradients dYᵀ·X (TN);
//   B: step B (d_model 64, d_ff 256, 800 tokens), the same products, and ff2's input gradient,
//      a sum over d_model = 64 (NN);
//   C: step C (1024 tokens, d_model 512, d_ff 2048, a vocabulary of 1000): the generator too;
//   lstm: nn::LSTM of the rnn/ rows (batch 64, hidden 256, input 256, 32 steps): the hidden
//      product h·W_hhᵀ per step, its gradients, and the input product of all 32 steps at once;
//   conv: conv2d's im2col path (ops/conv.cpp, Note [Convolution as products]) at batch 128,
//      y (C_out, N·OH·OW) = W (C_out, C_in·k²) · cols (C_in·k², N·OH·OW), both as they lie, for
//      the four largest distinct layers of bench/conv_shapes.h by flops (checked below; three
//      layers tie for the fourth place, the first of them in the list is taken);
//   small: where fixed costs (dispatch, packing, threads) show.
constexpr std::array<ProductShape, 26> kProductShapes{{
    {"A", "qkv", 800, 512, 512, "NT"},
    {"A", "ff1", 800, 2048, 512, "NT"},
    {"A", "ff2", 800, 512, 2048, "NT"},
    {"A", "ff1.dX", 800, 512, 2048, "NN"},
    {"A", "ff1.dW", 2048, 512, 800, "TN"},
    {"A", "qkv.dW", 512, 512, 800, "TN"},
    {"B", "qkv", 800, 64, 64, "NT"},
    {"B", "ff1", 800, 256, 64, "NT"},
    {"B", "ff1.dX", 800, 64, 256, "NN"},
    {"B", "ff1.dW", 256, 64, 800, "TN"},
    {"B", "ff2.dX", 800, 256, 64, "NN"},
    {"C", "generator", 1024, 1000, 512, "NT"},
    {"C", "ff1", 1024, 2048, 512, "NT"},
    {"C", "ff1.dW", 2048, 512, 1024, "TN"},
    {"lstm", "hidden", 64, 1024, 256, "NT"},
    {"lstm", "hidden.dh", 64, 256, 1024, "NN"},
    {"lstm", "hidden.dW", 1024, 256, 64, "TN"},
    {"lstm", "input", 2048, 1024, 256, "NT"},
    {"conv", "cnn.conv2", 32, 100352, 288, "NN"},
    {"conv", "cnn.conv4", 64, 25088, 576, "NN"},
    {"conv", "cnn.conv3", 64, 25088, 288, "NN"},
    {"conv", "resnet.stage1", 16, 100352, 144, "NN"},
    {"small", "fixed", 16, 16, 16, "NN"},
    {"small", "fixed", 32, 64, 32, "NT"},
    {"small", "fixed", 64, 64, 64, "NN"},
    {"small", "fixed", 128, 128, 128, "NN"},
}};

// The conv rows are the forward products of the layers they name (ConvShape's out(), which is not
// constexpr, written out: padding kernel / 2).
constexpr bool is_im2col_product(const ProductShape& p, int layer) {
  const ConvShape& c = kConvShapes[layer];
  const int64_t out = (c.size + 2 * (c.kernel / 2) - c.kernel) / c.stride + 1;
  return p.m == c.c_out && p.n == kConvBatch * out * out && p.k == c.c_in * c.kernel * c.kernel &&
         std::string_view(p.trans) == "NN";
}
static_assert(is_im2col_product(kProductShapes[18], 1) &&
              is_im2col_product(kProductShapes[19], 3) &&
              is_im2col_product(kProductShapes[20], 2) && is_im2col_product(kProductShapes[21], 5));

// (rows, cols) of op(x), as a contiguous tensor or the transposed view of one.
Tensor operand(int64_t rows, int64_t cols, bool transposed) {
  return transposed ? rand({cols, rows}).transpose(0, 1) : rand({rows, cols});
}

}  // namespace

void add_product_workloads() {
  for (const ProductShape& p : kProductShapes) {
    registry().push_back(
        {fmt::format("products/{} {} {}x{}x{} {}", p.group, p.what, p.m, p.n, p.k, p.trans),
         2.0 * p.m * p.n * p.k, [p](bool tiny) {
           // --smoke: each size a sixteenth (and at least 1), the transposes kept
           const auto size = [tiny](int64_t d) { return tiny ? d / 16 + 1 : d; };
           const int64_t m = size(p.m), n = size(p.n), k = size(p.k);
           const Tensor a = operand(m, k, p.trans[0] == 'T'), b = operand(k, n, p.trans[1] == 'T');
           const Tensor c = empty({m, n});
           return std::function<void()>([a, b, c] { gemm(a, b, c); });
         }});
  }
}

}  // namespace ember::bench
