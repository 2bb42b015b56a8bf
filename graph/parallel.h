// Thread control: one knob for OpenMP (our kernels) and OpenBLAS together.
#pragma once

namespace ember {

// Sets the threads of OpenMP and OpenBLAS; n <= 0 restores the default (EMBER_NUM_THREADS, or
// every core).
void set_num_threads(int n);
int get_num_threads();

}  // namespace ember
