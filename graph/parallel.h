// Thread control: one knob, Ember's thread count, which every parallel region of the kernels and
// products names (OpenMP's default count and OpenBLAS stay at one: graph/parallel.cpp).
#pragma once

#include <cstdint>

namespace ember {

// Sets the threads of every kernel and product; n <= 0 restores the default (EMBER_NUM_THREADS, or
// every core). At start: EMBER_NUM_THREADS, else OMP_NUM_THREADS, else every core.
void set_num_threads(int n);
int get_num_threads();

// Note [Parallel thresholds]
// A parallel region costs 1-2 us on a 2-core VM when OpenMP's threads spin between regions (its
// default: GOMP_SPINCOUNT, then sleep) and 40-45 us when they sleep at once (OMP_WAIT_POLICY=
// PASSIVE: a futex wake-up per region). Work is split across threads only where the half it
// saves is worth that: from parallel_grain() elements of an elementwise loop (65,536: from
// there x * y and exp(x) ran no slower on 2 threads than on 1) and blas_parallel_work()
// multiply-adds of a product (2^20), both 16 times more under PASSIVE (x * y then breaks even
// at ~1M elements, products at ~8-16M multiply-adds). Measured by ember_bench's grain/ rows at
// 1 and 2 threads under both policies (BENCHMARKS.md). The policy is read once, from the
// environment OpenMP itself reads, so a run's thread decisions (and its bits) do not vary.
// EMBER_PARALLEL_GRAIN=n sets parallel_grain() to n instead (read once too), to measure others.
int64_t parallel_grain();
int64_t blas_parallel_work();
// Loops that do several times x * y's work per element (a hash, an exponential, a row's passes
// of layer_norm or softmax) split from a quarter of parallel_grain(): exp(x) ran faster on 2
// threads than on 1 from 16,384 elements (Zen 5: 2.6 against 3.7 us), x * y only from ~32,768.
int64_t costly_grain();

}  // namespace ember
