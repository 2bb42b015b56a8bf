// oneDNN's convolution primitives behind ops/conv.cpp (declared in ops/conv_dnnl.h): forward,
// backward-data and backward-weights on Float32 NCHW tensors, their products in Float32 or in
// bfloat16 (set_float32_matmul_precision("medium")), through oneDNN's blocked layouts with
// reorders in and out, each made once per shape, product type and thread count and kept in a
// cache.
//
// Note [Convolutions in oneDNN]
// Ember's im2col + one product per group (Note [Convolution as products] in ops/conv.cpp) runs at
// 35-45 GFLOP/s on the Fashion-MNIST layers at one thread (Zen 4); oneDNN's direct JIT kernels
// on its blocked layouts (nChw16c activations, OIhw16i16o weights, picked by format_tag::any)
// run at 110-125, and still 1.5-2.8 times Ember's speed with the reorders from and to NCHW paid
// in every call (BENCHMARKS.md, "Convolution kernels"). So where Ember is built with oneDNN
// (CMake finds Debian's libdnnl-dev: EMBER_HAVE_DNNL), a Float32 convolution on the CPU calls it:
// - Each call reorders its NCHW/OIHW operands into the layouts the primitive chose, runs it, and
//   reorders its result back; the blocked buffers and the primitive's scratchpad come from
//   Ember's allocator (one tensor per call), so the caller's tensors stay NCHW and no state
//   lives between calls but the primitives.
// - Making a primitive descriptor and JIT-compiling its kernel costs 0.1-10 ms, so each
//   (direction, every size, stride, padding, dilation, groups, bias, product type, thread count)
//   has one entry in a process-wide cache under a mutex, made on first use. The primitives run with
//   a scratchpad of the caller's (scratchpad_mode::user), so one primitive may run on several
//   threads at once.
// - Threads: Debian's oneDNN runs on OpenMP and sizes its work from omp_get_max_threads(), which
//   Ember pins at one (graph/parallel.cpp, for OpenBLAS). Around each call (and each primitive's
//   creation, which blocks for the count it will run on) OpenMP's count on the calling thread is
//   set to Ember's thread count (one inside a parallel region), then put back: at one thread
//   oneDNN runs on the calling thread alone. The weight gradient alone is cut into pieces of
//   the batch, so that its bits do not depend on the count (Note [Weight gradients in pieces]).
// - Bfloat16 products: under set_float32_matmul_precision("medium") on a CPU with AVX512-BF16
//   (float32_matmul_uses_bfloat16()) the primitives' multiplied operands are bf16 (forward: src
//   and weights; backward-data: diff_dst and weights; backward-weights: src and diff_dst), and
//   their results f32 (dst with an f32 bias, diff_src, diff_weights). The caller's tensors stay
//   Float32: the reorders into the blocked layouts round them to bf16, to nearest with ties to
//   even, as Ember's bfloat16 products (ops/gemm_bf16.h) round, and the kernels sum the bf16
//   products in f32, so each result is the Float32 convolution of the rounded operands up to
//   the order of its sums. The bias gradient, a sum and no product, stays Float32 over the
//   unrounded dY (ops/conv.cpp sums it, as on im2col). This is what torch.autocast("cpu",
//   torch.bfloat16) runs, and it pays: at one thread (Zen 4, batch 128, ember_bench conv/ rows
//   under --matmul-precision medium) the 3x3 layers of the Fashion-MNIST CNN and ResNet ran at
//   145-240 GFLOP/s forward and 95-175 forward + backward, against 30-75 and 35-85 for im2col +
//   Ember's bf16 product kernel (2-4.6 times its time saved, every direction); only the 1x1
//   stride-2 projections (a millisecond or two) ran as fast or slower, as they do in Float32,
//   their time mostly the reorders. So every direction comes here under bfloat16 products too.
//   A bf16 primitive oneDNN cannot make on some CPU is cached as missing and the call goes
//   back to im2col (with Ember's bf16 products); a f32 one it cannot make is an Error. Ember's
//   products below BLAS stay Float32 where tiny or narrow (ops/linalg.h); a convolution here
//   rounds whatever its size.
// - EMBER_CONV=im2col in the environment (read once), or set_conv_uses_onednn(false), sends every
//   convolution back to im2col; EMBER_CONV=onednn (or unset) keeps oneDNN where it is built in,
//   with Winograd's kernels where they suit (Note [Winograd convolutions]); EMBER_CONV=direct
//   keeps oneDNN with its direct kernels alone.
// ops/conv.cpp decides what comes here: Float32 on the CPU, every size positive, padding oneDNN
// can express; everything else stays im2col.
#include "ops/conv_dnnl.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "graph/error.h"

#ifdef EMBER_HAVE_DNNL
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "graph/parallel.h"
#include "graph/strided.h"
#include "graph/tensor.h"
#include "ops/dnnl_common.h"
#endif

namespace ember::detail {

namespace {

// -1: as the environment says; 0 / 1: set by set_conv_uses_onednn (g_forced) or
// set_conv_winograd (g_winograd).
std::atomic<int> g_forced{-1}, g_winograd{-1};

// EMBER_CONV, read once: "" (unset), "im2col", "onednn" or "direct".
const std::string& environment() {
  static const std::string v = [] {
    const char* env = std::getenv("EMBER_CONV");
    std::string s = env ? env : "";
    EMBER_CHECK(s.empty() || s == "im2col" || s == "onednn" || s == "direct",
                "conv: EMBER_CONV must be \"im2col\", \"onednn\" or \"direct\", got \"{}\"", s);
    return s;
  }();
  return v;
}

}  // namespace

bool onednn_built() {
#ifdef EMBER_HAVE_DNNL
  return true;
#else
  return false;
#endif
}

bool conv_uses_onednn() {
  if (!onednn_built()) return false;
  const int forced = g_forced.load(std::memory_order_relaxed);
  return forced >= 0 ? forced == 1 : environment() != "im2col";
}

void set_conv_uses_onednn(bool on) { g_forced.store(on ? 1 : 0, std::memory_order_relaxed); }

bool conv_uses_winograd() {
  const int forced = g_winograd.load(std::memory_order_relaxed);
  return forced >= 0 ? forced == 1 : environment() != "direct";
}

void set_conv_winograd(bool on) { g_winograd.store(on ? 1 : 0, std::memory_order_relaxed); }

#ifndef EMBER_HAVE_DNNL

int64_t onednn_cached_primitives() { return 0; }
std::string onednn_weight_kernel(const ConvDesc&) { return ""; }
bool onednn_uses_winograd(const ConvDesc&) { return false; }

bool onednn_conv_forward(const ConvDesc&, const float*, const float*, const float*, float*) {
  throw Error("conv: Ember was built without oneDNN");
}
bool onednn_conv_backward_data(const ConvDesc&, const float*, const float*, float*) {
  throw Error("conv: Ember was built without oneDNN");
}
bool onednn_conv_backward_weights(const ConvDesc&, const float*, const float*, float*, float*) {
  throw Error("conv: Ember was built without oneDNN");
}

#else

namespace {

using dnnl::memory;
using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;
constexpr auto bf16 = memory::data_type::bf16;

enum class Direction { Forward, BackwardData, BackwardWeights };

// One operand of a primitive: the caller's layout, the primitive's, and the reorder between them
// (from the caller's for an input, to it for an output) when they differ.
struct Operand {
  int arg = 0;
  bool input = true;
  memory::desc user, inner;
  std::optional<dnnl::reorder> reorder;
  // an activation the primitive wants channels-last: moved by move_channels_last (Note
  // [Channels-last operands]) instead of the reorder
  bool channels_last = false;
};

// Note [Channels-last operands]
// Under bfloat16 products on a CPU with AMX, oneDNN 2.6 picks channels-last (NHWC, "acdb")
// activations for its AMX convolutions, and reorders between that and Ember's NCHW with its
// generic kernel (jit:uni): on an AMX Xeon at one thread, 3.0 ms for a (128, 32, 28, 28) f32
// NHWC -> NCHW, where a transpose in 16x16 tiles (16 rows loaded into an L1 tile, its columns
// gathered back by AVX-512) took 1.2. Such operands (a 4-D f32 NCHW buffer whose primitive wants
// f32 or bf16 acdb, on a CPU with AVX-512 and, for bf16, AVX512-BF16) are transposed here, image
// by image, an input rounded to bfloat16 on the way by vcvtneps2bf16 (to nearest even, as the
// reorder rounds); the edges past whole tiles element by element. The CNN's 32-channel 28x28
// layer under "medium" took 4.5 ms forward and 22.0 forward + backward, against 6.8 and 25.3
// with the reorders. Elsewhere the reorder runs.
#define EMBER_TILES __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

bool is_channels_last(const memory::desc& user, const memory::desc& inner) {
  static const bool vectors = __builtin_cpu_supports("avx512f") &&
                              __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512vl");
  static const bool bf16_vectors = vectors && __builtin_cpu_supports("avx512bf16");
  const memory::dims dims = user.dims();
  if (dims.size() != 4 || user != memory::desc(dims, f32, tag::nchw)) return false;
  return (vectors && inner == memory::desc(dims, f32, tag::acdb)) ||
         (bf16_vectors && inner == memory::desc(dims, bf16, tag::acdb));
}

// out[i] = v, as float or as bfloat16 bits (Bf16). A function of its own, not a lambda in the
// caller: GCC does not give a lambda its enclosing function's target attribute, so on a CPU
// without AVX512-BF16 under -march=native the lambda could not inline _mm_cvtneps_pbh.
template <bool Bf16>
EMBER_TILES inline void put_element(void* out, int64_t i, float v) {
  if constexpr (Bf16) {
    const __m128bh h = _mm_cvtneps_pbh(_mm_set_ss(v));
    static_cast<uint16_t*>(out)[i] =
        static_cast<uint16_t>(_mm_extract_epi16(reinterpret_cast<__m128i>(h), 0));
  } else {
    static_cast<float*>(out)[i] = v;
  }
}

// One image: dst (P, C) = src (C, P), dst as float or as bfloat16 bits (Bf16).
template <bool Bf16>
EMBER_TILES void image_to_channels_last(const float* src, void* out, int64_t C, int64_t P) {
  alignas(64) float tile[16][16];
  const __m512i column =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(16));
  const int64_t C16 = C / 16 * 16, P16 = P / 16 * 16;
  for (int64_t c0 = 0; c0 < C16; c0 += 16)
    for (int64_t p0 = 0; p0 < P16; p0 += 16) {
      for (int i = 0; i < 16; ++i)
        _mm512_store_ps(tile[i], _mm512_loadu_ps(src + (c0 + i) * P + p0));
      for (int j = 0; j < 16; ++j) {  // position p0 + j: its 16 channels, tile[0..15][j]
        const __m512 v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF,
                                                  _mm512_add_epi32(column, _mm512_set1_epi32(j)),
                                                  &tile[0][0], 4);
        if constexpr (Bf16)
          _mm256_storeu_si256(
              reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + (p0 + j) * C + c0),
              reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
        else
          _mm512_storeu_ps(static_cast<float*>(out) + (p0 + j) * C + c0, v);
      }
    }
  for (int64_t c = 0; c < C; ++c)  // the edges: channels past C16, positions past P16
    for (int64_t p = c < C16 ? P16 : 0; p < P; ++p)
      put_element<Bf16>(out, p * C + c, src[c * P + p]);
}

// One image: dst (C, P) = src (P, C), Float32.
EMBER_TILES void image_from_channels_last(const float* src, float* dst, int64_t C, int64_t P) {
  alignas(64) float tile[16][16];
  const __m512i column =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(16));
  const int64_t C16 = C / 16 * 16, P16 = P / 16 * 16;
  for (int64_t p0 = 0; p0 < P16; p0 += 16)
    for (int64_t c0 = 0; c0 < C16; c0 += 16) {
      for (int i = 0; i < 16; ++i)
        _mm512_store_ps(tile[i], _mm512_loadu_ps(src + (p0 + i) * C + c0));
      for (int j = 0; j < 16; ++j)  // channel c0 + j: its 16 positions, tile[0..15][j]
        _mm512_storeu_ps(dst + (c0 + j) * P + p0,
                         _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xFFFF,
                                                  _mm512_add_epi32(column, _mm512_set1_epi32(j)),
                                                  &tile[0][0], 4));
    }
  for (int64_t c = 0; c < C; ++c)
    for (int64_t p = c < C16 ? P16 : 0; p < P; ++p) dst[c * P + p] = src[p * C + c];
}

// Moves an operand between the caller's NCHW buffer and the primitive's channels-last one: into
// `to` for an input, out of `from` for an output; the images split across Ember's threads.
void move_channels_last(const Operand& op, const void* from, void* to) {
  const memory::dims d = op.user.dims();
  const int64_t N = d[0], C = d[1], P = d[2] * d[3];
  const bool rounded = op.inner.data_type() == bf16;
  const size_t out_bytes = rounded ? sizeof(uint16_t) : sizeof(float);
  parallel_for(
      N,
      [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
          const float* src = static_cast<const float*>(from) + n * C * P;
          if (!op.input)
            image_from_channels_last(src, static_cast<float*>(to) + n * C * P, C, P);
          else if (rounded)
            image_to_channels_last<true>(src, static_cast<char*>(to) + n * C * P * out_bytes, C, P);
          else
            image_to_channels_last<false>(src, static_cast<char*>(to) + n * C * P * out_bytes, C,
                                          P);
        }
      },
      1);
}

// A primitive with its operands, in the order the run functions pass their pointers.
struct Entry {
  dnnl::primitive prim;
  std::vector<Operand> operands;
  size_t scratchpad = 0;  // bytes: the largest of the primitive's and the reorders'
  std::string impl;       // oneDNN's name of its kernel, as ONEDNN_VERBOSE prints it ("jit:avx2")
};

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

memory::dims dims2(const std::array<int64_t, 2>& a) { return {a[0], a[1]}; }

Operand operand(int arg, bool input, const memory::desc& user, const memory::desc& inner,
                size_t& scratchpad) {
  Operand op{arg, input, user, inner, std::nullopt};
  if (user != inner) {
    const dnnl::primitive_attr attr = user_scratchpad();
    const auto& eng = dnnl_cpu_engine();
    const dnnl::reorder::primitive_desc pd =
        input ? dnnl::reorder::primitive_desc(eng, user, eng, inner, attr)
              : dnnl::reorder::primitive_desc(eng, inner, eng, user, attr);
    scratchpad = std::max(scratchpad, pd.scratchpad_desc().get_size());
    op.reorder = dnnl::reorder(pd);
    op.channels_last = is_channels_last(user, inner);
  }
  return op;
}

// The primitive for direction `dir` of d with its reorders, by oneDNN's Winograd kernels where
// `winograd` and its direct ones otherwise. Its multiplied operands are d's product type (bf16
// where d.bf16: the reorders from the caller's f32 round them), its results and the bias f32; the
// caller's operands are all f32 NCHW / (G)OIHW. Throws dnnl::error where oneDNN has no
// implementation.
Entry make_entry(Direction dir, const ConvDesc& d, bool winograd) {
  const memory::dims src_dims{d.N, d.C, d.in[0], d.in[1]}, dst_dims{d.N, d.O, d.out[0], d.out[1]};
  const memory::dims w_dims =
      d.G == 1 ? memory::dims{d.O, d.C, d.kernel[0], d.kernel[1]}
               : memory::dims{d.G, d.O / d.G, d.C / d.G, d.kernel[0], d.kernel[1]};
  const tag w_tag = d.G == 1 ? tag::oihw : tag::goihw;
  const memory::dims strides = dims2(d.stride), pad_l = dims2(d.pad_l), pad_r = dims2(d.pad_r);
  const memory::dims dilates{d.dilation[0] - 1, d.dilation[1] - 1};  // oneDNN counts the gaps
  const memory::desc user_src(src_dims, f32, tag::nchw), user_dst(dst_dims, f32, tag::nchw),
      user_w(w_dims, f32, w_tag);
  // the product type: what src, weights and dst are multiplied in (src and diff_dst of the
  // backward-weights, diff_dst and weights of the backward-data); results stay f32
  const auto mul = d.bf16 ? bf16 : f32;
  const memory::desc any_src(src_dims, mul, tag::any), any_dst(dst_dims, mul, tag::any),
      any_w(w_dims, mul, tag::any);
  const memory::desc any_src_f32(src_dims, f32, tag::any), any_dst_f32(dst_dims, f32, tag::any),
      any_w_f32(w_dims, f32, tag::any);
  const memory::desc bias_md = d.bias ? memory::desc({d.O}, f32, tag::x) : memory::desc();
  const auto& eng = dnnl_cpu_engine();
  const dnnl::primitive_attr attr = user_scratchpad();
  const auto algo =
      winograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  // the forward with a dst of `dst`: f32 for the forward itself, the product type for the
  // backwards' hint (the same forward where the products are f32)
  const auto forward = [&](const memory::desc& dst) {
    return dnnl::convolution_forward::primitive_desc(
        {dnnl::prop_kind::forward_training, algo, any_src, any_w, bias_md, dst, strides, dilates,
         pad_l, pad_r},
        attr, eng);
  };
  const auto hint = [&] { return forward(any_dst); };
  Entry e;
  switch (dir) {
    case Direction::Forward: {
      const dnnl::convolution_forward::primitive_desc fwd = forward(any_dst_f32);
      e.prim = dnnl::convolution_forward(fwd);
      e.impl = fwd.impl_info_str();
      e.scratchpad = fwd.scratchpad_desc().get_size();
      e.operands.push_back(operand(DNNL_ARG_SRC, true, user_src, fwd.src_desc(), e.scratchpad));
      e.operands.push_back(
          operand(DNNL_ARG_WEIGHTS, true, user_w, fwd.weights_desc(), e.scratchpad));
      if (d.bias)
        e.operands.push_back(operand(DNNL_ARG_BIAS, true, bias_md, bias_md, e.scratchpad));
      e.operands.push_back(operand(DNNL_ARG_DST, false, user_dst, fwd.dst_desc(), e.scratchpad));
      break;
    }
    case Direction::BackwardData: {
      const dnnl::convolution_backward_data::primitive_desc pd(
          {algo, any_src_f32, any_w, any_dst, strides, dilates, pad_l, pad_r}, attr, eng, hint());
      e.prim = dnnl::convolution_backward_data(pd);
      e.impl = pd.impl_info_str();
      e.scratchpad = pd.scratchpad_desc().get_size();
      e.operands.push_back(
          operand(DNNL_ARG_DIFF_DST, true, user_dst, pd.diff_dst_desc(), e.scratchpad));
      e.operands.push_back(
          operand(DNNL_ARG_WEIGHTS, true, user_w, pd.weights_desc(), e.scratchpad));
      e.operands.push_back(
          operand(DNNL_ARG_DIFF_SRC, false, user_src, pd.diff_src_desc(), e.scratchpad));
      break;
    }
    case Direction::BackwardWeights: {
      const dnnl::convolution_backward_weights::primitive_desc pd(
          {algo, any_src, any_w_f32, bias_md, any_dst, strides, dilates, pad_l, pad_r}, attr, eng,
          hint());
      e.prim = dnnl::convolution_backward_weights(pd);
      e.impl = pd.impl_info_str();
      e.scratchpad = pd.scratchpad_desc().get_size();
      e.operands.push_back(operand(DNNL_ARG_SRC, true, user_src, pd.src_desc(), e.scratchpad));
      e.operands.push_back(
          operand(DNNL_ARG_DIFF_DST, true, user_dst, pd.diff_dst_desc(), e.scratchpad));
      e.operands.push_back(
          operand(DNNL_ARG_DIFF_WEIGHTS, false, user_w, pd.diff_weights_desc(), e.scratchpad));
      if (d.bias)
        e.operands.push_back(operand(DNNL_ARG_DIFF_BIAS, false, bias_md, bias_md, e.scratchpad));
      break;
    }
  }
  return e;
}

// The cache: every field of the convolution (the product type too), the direction, the thread
// count and the algorithm.
using Key = std::array<int64_t, 23>;

Key key_of(Direction dir, const ConvDesc& d, int threads, bool winograd) {
  return {static_cast<int64_t>(dir),
          d.N,
          d.C,
          d.O,
          d.G,
          d.in[0],
          d.in[1],
          d.out[0],
          d.out[1],
          d.kernel[0],
          d.kernel[1],
          d.stride[0],
          d.stride[1],
          d.pad_l[0],
          d.pad_l[1],
          d.pad_r[0],
          d.pad_r[1],
          d.dilation[0],
          d.dilation[1],
          d.bias ? 1 : 0,
          threads,
          d.bf16 ? 1 : 0,
          winograd ? 1 : 0};
}

// An entry is null where oneDNN could not make a bf16 or a Winograd primitive for its key (the
// caller computes that convolution otherwise, and asks oneDNN once).
PrimitiveCache<Key, Entry>& cache() {
  static auto* c = new PrimitiveCache<Key, Entry>;  // never destroyed: convolutions may run at exit
  return *c;
}

// The entry for (dir, d, threads, winograd), made on first use (with OpenMP's count at
// `threads`); null where d.bf16 or `winograd` and oneDNN has no primitive for it. A direct f32
// primitive it cannot make is an Error.
std::shared_ptr<const Entry> entry_for(Direction dir, const ConvDesc& d, int threads,
                                       bool winograd) {
  return cache().get(key_of(dir, d, threads, winograd), [&] {
    std::shared_ptr<const Entry> made;
    try {
      made = std::make_shared<const Entry>(make_entry(dir, d, winograd));
    } catch (const dnnl::error& err) {
      if (!d.bf16 && !winograd)
        throw Error(fmt::format("conv: oneDNN could not make a primitive: {}", err.what()));
    }
    return made;
  });
}

constexpr size_t kAlign = 64;
size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Whether oneDNN has the primitive for (dir, d, winograd) at `threads` threads (making it now if
// not yet), and, where `impl` is given, its kernel's name.
bool available(Direction dir, const ConvDesc& d, int threads, bool winograd,
               std::string* impl = nullptr) {
  OmpThreads omp(threads);
  const std::shared_ptr<const Entry> e = entry_for(dir, d, threads, winograd);
  if (e && impl) *impl = e->impl;
  return e != nullptr;
}

// Runs direction `dir` of d on the operands' buffers, in the order of the Entry's operands, on
// `threads` threads (0: Ember's count, one inside a parallel region), by Winograd's kernels where
// `winograd`. False, with nothing written, where oneDNN has no such bf16 or Winograd primitive.
bool run(Direction dir, const ConvDesc& d, const std::vector<const void*>& buffers, int threads = 0,
         bool winograd = false) {
  if (threads <= 0) threads = omp_in_parallel() ? 1 : std::max(1, get_num_threads());
  OmpThreads omp(threads);
  const std::shared_ptr<const Entry> e = entry_for(dir, d, threads, winograd);
  if (!e) return false;
  // one buffer of Ember's for every reordered operand and the scratchpad
  size_t bytes = aligned(e->scratchpad) + kAlign;
  for (const Operand& op : e->operands)
    if (op.reorder) bytes += aligned(op.inner.get_size());
  const Tensor space = empty({static_cast<int64_t>(bytes / sizeof(float))}, kFloat32);
  char* base = reinterpret_cast<char*>(space.data<float>());
  char* next = base + (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  const auto take = [&](size_t n) {
    char* p = next;
    next += aligned(n);
    return p;
  };
  const auto& eng = dnnl_cpu_engine();
  thread_local dnnl::stream stream(eng);
  std::unordered_map<int, memory> args;
  std::vector<std::pair<const Operand*, memory> > outputs;
  std::optional<memory> scratch;
  if (e->scratchpad > 0)
    scratch.emplace(
        memory::desc({static_cast<int64_t>(e->scratchpad)}, memory::data_type::u8, tag::x), eng,
        take(e->scratchpad));
  // a reorder's arguments: from, to and the scratchpad where there is one
  const auto reorder_args = [&](const memory& from, const memory& to) {
    std::unordered_map<int, memory> a{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    if (scratch) a[DNNL_ARG_SCRATCHPAD] = *scratch;
    return a;
  };
  for (size_t i = 0; i < e->operands.size(); ++i) {
    const Operand& op = e->operands[i];
    memory user(op.user, eng, const_cast<void*>(buffers[i]));
    if (!op.reorder) {
      args[op.arg] = user;
      continue;
    }
    memory inner(op.inner, eng, take(op.inner.get_size()));
    if (op.input && op.channels_last)
      move_channels_last(op, buffers[i], inner.get_data_handle());
    else if (op.input)
      op.reorder->execute(stream, reorder_args(user, inner));
    else
      outputs.push_back({&op, user});
    args[op.arg] = inner;
  }
  if (scratch) args[DNNL_ARG_SCRATCHPAD] = *scratch;
  e->prim.execute(stream, args);
  for (auto& [op, user] : outputs) {
    if (op->channels_last) {
      stream.wait();
      move_channels_last(*op, args.at(op->arg).get_data_handle(), user.get_data_handle());
    } else {
      op->reorder->execute(stream, reorder_args(args.at(op->arg), user));
    }
  }
  stream.wait();
  return true;
}

// Note [Winograd convolutions]
// A 3x3 convolution of stride 1 computes each 4x4 tile of its output from a 6x6 tile of its input
// by Winograd's F(4x4, 3x3): both tiles transformed, 36 products per pair of channels where the
// direct sum has 144, the result transformed back. oneDNN has it in f32 (jit_wino_4x3, AVX-512),
// forward, backward-data and backward-weights. At one thread (Zen 4, its blocked layouts, the
// Fashion-MNIST layers) it ran 1.5-2.2 times as fast as oneDNN's direct kernels, which are
// PyTorch's and already at 110-125 GFLOP/s, near the core's peak: the one way left to a
// convolution faster than PyTorch's is fewer products. So where a convolution is large enough
// (winograd_suits below) and Winograd is not switched off, it runs Winograd's kernels:
// - Accuracy: exact in exact arithmetic, its rounding error is larger than the direct sum's, as
//   cuDNN's and NNPACK's Winograd kernels' are (PyTorch runs those on GPUs, and ran NNPACK's on
//   CPUs). Against Float64 (test_conv/onednn_winograd, 16 to 32 channels at 28x28) the value and
//   the input gradient were within 8e-7 and 1.3e-6 of the result's largest magnitude, the direct
//   kernels' within 4e-7; the weight gradient within 8e-7, the direct kernels' 1.8e-6. All far
//   inside bfloat16's 4e-3: every operand and sum stays Float32.
// - Pieces: the forward and backward-data run the batch in pieces of about kPiecePositions output
//   positions (at least one piece per thread), each piece a one-thread primitive, the pieces in
//   parallel over Ember's threads. A whole batch of 128 at 28x28 transforms more tiles than the
//   caches hold: in a probe of oneDNN alone (32 channels, one thread) the batch took 9.2 ms whole
//   and 7.2 ms in pieces of 8 images, and two threads on the whole batch took 7.5 ms; in pieces
//   the CNN's 32-channel forward runs 1.9 times as fast on two threads as on one. Each output
//   element is summed on one thread in an order that does not depend on the piece's size (on
//   Zen 4 every piece size from 1 to 43 images gave the whole batch's bits; test_conv compares
//   one and two threads), so the bits do not depend on the thread count. The backward-weights
//   runs in Note [Weight gradients in pieces]'s pieces, as the direct kernels do.
// - Small convolutions (fewer than kWinogradPositions output positions, or fewer than 16
//   channels in or out) ran slower than direct: they stay direct, as does everything oneDNN has
//   no Winograd primitive for, bfloat16 products (Winograd is f32 only) included.
// - EMBER_CONV=direct in the environment (read once), or set_conv_winograd(false), keeps every
//   convolution on oneDNN's direct kernels.
constexpr int64_t kWinogradPositions = 4096;
constexpr int64_t kPiecePositions = 8192;

bool winograd_suits(const ConvDesc& d) {
  return conv_uses_winograd() && !d.bf16 && d.G == 1 && d.kernel[0] == 3 && d.kernel[1] == 3 &&
         d.stride[0] == 1 && d.stride[1] == 1 && d.dilation[0] == 1 && d.dilation[1] == 1 &&
         d.C >= 16 && d.O >= 16 && d.N * d.out[0] * d.out[1] >= kWinogradPositions;
}

// Forward (a = x, out = y) or backward-data (a = dy, out = dx) of d by Winograd's kernels, the
// batch in pieces (Note [Winograd convolutions]). False, with nothing written, where oneDNN has no
// Winograd primitive for the pieces.
bool run_winograd(Direction dir, const ConvDesc& d, const float* a, const float* w, const float* b,
                  float* out) {
  const int64_t x_image = d.C * d.in[0] * d.in[1], y_image = d.O * d.out[0] * d.out[1];
  const bool forward = dir == Direction::Forward;
  const int64_t a_image = forward ? x_image : y_image, out_image = forward ? y_image : x_image;
  const int64_t threads = omp_in_parallel() ? 1 : std::max(1, get_num_threads());
  const int64_t by_size = std::max<int64_t>(1, d.N * d.out[0] * d.out[1] / kPiecePositions);
  const int64_t pieces = std::min(d.N, (by_size + threads - 1) / threads * threads);
  const auto piece_of = [&](int64_t p) {
    ConvDesc piece = d;
    piece.N = d.N * (p + 1) / pieces - d.N * p / pieces;
    return piece;
  };
  // the pieces' primitives (two batch sizes at most: N / pieces rounded down and up), so that a
  // missing one sends the whole call to the direct kernels before anything runs
  for (const int64_t n : {d.N / pieces, (d.N + pieces - 1) / pieces}) {
    ConvDesc piece = d;
    piece.N = n;
    if (!available(dir, piece, 1, true)) return false;
  }
  parallel_for(
      pieces,
      [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const int64_t n0 = d.N * p / pieces;
          std::vector<const void*> buffers{a + n0 * a_image, w};
          if (forward && d.bias) buffers.push_back(b);
          buffers.push_back(out + n0 * out_image);
          run(dir, piece_of(p), buffers, 1, true);
        }
      },
      1);
  return true;
}

}  // namespace

int64_t onednn_cached_primitives() { return cache().size(); }

bool onednn_uses_winograd(const ConvDesc& d) {
  return winograd_suits(d) && available(Direction::Forward, d, 1, true);
}

bool onednn_conv_forward(const ConvDesc& d, const float* x, const float* w, const float* b,
                         float* y) {
  if (winograd_suits(d) && run_winograd(Direction::Forward, d, x, w, b, y)) return true;
  if (d.bias) return run(Direction::Forward, d, {x, w, b, y});
  return run(Direction::Forward, d, {x, w, y});
}

bool onednn_conv_backward_data(const ConvDesc& d, const float* dy, const float* w, float* dx) {
  if (winograd_suits(d) && run_winograd(Direction::BackwardData, d, dy, w, nullptr, dx))
    return true;
  return run(Direction::BackwardData, d, {dy, w, dx});
}

// Note [Weight gradients in pieces]
// The weight and bias gradients sum over the batch, and oneDNN's backward-weights splits that sum
// across its threads: its bits would depend on the thread count, which Ember's must not (a run
// resumed on another count continues bit for bit). So the batch is cut into pieces whose number
// depends on the batch alone (kWeightPieces, fewer for a smaller batch), each piece reduced by a
// one-thread primitive, the pieces in parallel over Ember's threads, and their sums added in
// order, in f32 and bf16 products alike. The forward and backward-data sum within one output
// element, on one thread whatever the count: their bits do not depend on it.
constexpr int64_t kWeightPieces = 4;

// Note [Single-channel weight gradients]
// oneDNN 2.6's AVX2 backward-weights kernel (jit:avx2, what a CPU without AVX-512 gets) is slow
// where each group reads one input channel: on Zen 3 at one thread (bench/conv_dnnl, batch 128)
// the CNN's first layer (1->32, 3x3, 28x28) took 23.9 ms in Note [Weight gradients in pieces]'s
// pieces and 17.0 ms whole, where im2col + one product took 6.3 (the forward 3.4); the ResNet's
// stem (1->16) 6.6 against 2.9. Its AVX-512 kernel has no such gap (Zen 4: 0.62 ms against
// im2col's 5.5). So a weight gradient of one input channel per group whose kernel is jit:avx2
// is not run here: onednn_conv_backward_weights returns false and ops/conv.cpp computes it by
// im2col. Depthwise convolutions get another kernel (jit_dw) and stay.
namespace {
bool slow_weight_kernel(const ConvDesc& d, const std::string& impl) {
  return d.C / d.G == 1 && impl == "jit:avx2";
}
}  // namespace

std::string onednn_weight_kernel(const ConvDesc& d) {
  std::string impl;
  return available(Direction::BackwardWeights, d, 1, false, &impl) ? impl : "";
}

bool onednn_conv_backward_weights(const ConvDesc& d, const float* x, const float* dy, float* dw,
                                  float* db) {
  const int64_t pieces = std::min(d.N, kWeightPieces);
  // the pieces' primitives (at most two batch sizes) made here, so that a missing Winograd one
  // sends the call to the direct kernels, and a missing bf16 one (or a slow one, Note
  // [Single-channel weight gradients]) the whole call back, before anything runs
  const auto all_available = [&](bool winograd) {
    for (int64_t p = 0; p < pieces; ++p) {
      ConvDesc piece = d;
      piece.N = d.N * (p + 1) / pieces - d.N * p / pieces;
      std::string impl;
      if (!available(Direction::BackwardWeights, piece, 1, winograd, &impl) ||
          slow_weight_kernel(piece, impl))
        return false;
    }
    return true;
  };
  const bool winograd = winograd_suits(d) && all_available(true);
  if (!winograd && !all_available(false)) return false;
  const int64_t w_size = d.O * (d.C / d.G) * d.kernel[0] * d.kernel[1], b_size = d.bias ? d.O : 0;
  const int64_t x_image = d.C * d.in[0] * d.in[1], y_image = d.O * d.out[0] * d.out[1];
  const Tensor parts = empty({pieces, w_size + b_size}, kFloat32);
  float* part = parts.data<float>();
  parallel_for(
      pieces,
      [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          const int64_t n0 = d.N * p / pieces, n1 = d.N * (p + 1) / pieces;
          ConvDesc piece = d;
          piece.N = n1 - n0;
          float* w_part = part + p * (w_size + b_size);
          std::vector<const void*> buffers{x + n0 * x_image, dy + n0 * y_image, w_part};
          if (d.bias) buffers.push_back(w_part + w_size);
          run(Direction::BackwardWeights, piece, buffers, 1, winograd);
        }
      },
      2);
  const auto add_up = [&](float* out, int64_t offset, int64_t size) {
    std::copy(part + offset, part + offset + size, out);
    for (int64_t p = 1; p < pieces; ++p) {
      const float* src = part + p * (w_size + b_size) + offset;
      for (int64_t i = 0; i < size; ++i) out[i] += src[i];
    }
  };
  add_up(dw, 0, w_size);
  if (d.bias) add_up(db, w_size, b_size);
  return true;
}

#endif  // EMBER_HAVE_DNNL

}  // namespace ember::detail
