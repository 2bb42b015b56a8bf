// bfloat16 products on AMX tiles: gemm_bf16's contract (ops/gemm_bf16.h) computed by oneDNN's
// matmul primitive where the CPU has AMX-BF16 (Intel Xeon since Sapphire Rapids). Internal to
// ops/linalg.cpp; no autograd. Note [bfloat16 products on AMX] in ops/gemm_amx.cpp.
#pragma once

#include <cstdint>

namespace ember::detail {

// Whether bfloat16 products run on AMX: the CPU has AMX-BF16, Ember was built with oneDNN, and
// neither EMBER_AMX=off (read once) nor set_amx_products(false) turned it off.
bool amx_products();
// Turns the AMX path on or off for this process (tests compare it with gemm_bf16); on only
// where the CPU and the build allow.
void set_amx_products(bool on);

// How many primitives the AMX path has made (and shapes it found none for), for tests.
int64_t amx_cached_primitives();

// gemm_bf16's product (each element of A and B rounded to bfloat16 to nearest even, products
// and sums Float32, alpha, beta, bias as there) on AMX, on `threads` threads. False, with C
// untouched, where it does not run here: AMX off, a product below kAmxMinWork multiply-adds, or
// a shape oneDNN has no AMX kernel for; the caller then runs gemm_bf16.
bool gemm_bf16_amx(int64_t m, int64_t n, int64_t k, float alpha, const float* a, bool a_trans,
                   int64_t lda, const float* b, bool b_trans, int64_t ldb, float beta, float* c,
                   int64_t ldc, const float* bias, int threads);

}  // namespace ember::detail
