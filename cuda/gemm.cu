// The GPU's products: cuBLAS's strided batched gemm, one handle per device (made at its first
// product there, kept for the process), queued on the device's stream. Row-major C = op(A) op(B)
// is column-major Cᵀ = op(B)ᵀ op(A)ᵀ over the same memory: cuBLAS is called with the operands
// swapped and the same transpose flags.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "cuda/gemm.h"
#include "cuda/launch.h"

namespace ember::cuda::kernels {

namespace {

// The calling thread's current device's handle, or nullptr when cuBLAS cannot make one.
cublasHandle_t handle_of_current_device() {
  static std::mutex mutex;
  static std::vector<cublasHandle_t>* handles = new std::vector<cublasHandle_t>();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  std::lock_guard lock(mutex);
  if (handles->size() <= static_cast<size_t>(device)) handles->resize(device + 1, nullptr);
  cublasHandle_t& h = (*handles)[device];
  if (h == nullptr && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) h = nullptr;
  return h;
}

}  // namespace

int gemm_on_device(const Gemm& g, void* stream) {
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return 0;
  const bool f64 = g.type == ScalarType::Float64;
  if (!f64 && g.type != ScalarType::Float32) return kUnsupported;
  cublasHandle_t handle = handle_of_current_device();
  if (handle == nullptr) return kCublasError + CUBLAS_STATUS_NOT_INITIALIZED;
  cublasStatus_t status = cublasSetStream(handle, static_cast<cudaStream_t>(stream));
  if (status != CUBLAS_STATUS_SUCCESS) return kCublasError + status;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
  cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  if (!f64 && g.precision == Precision::High) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  if (!f64 && g.precision == Precision::Medium) compute = CUBLAS_COMPUTE_32F_FAST_16BF;
  const double alpha64 = g.alpha, beta64 = g.beta;
  const float alpha32 = static_cast<float>(g.alpha), beta32 = static_cast<float>(g.beta);
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  // k = 0: cuBLAS scales C by beta, as BLAS.
  status = cublasGemmStridedBatchedEx(
      handle, op_b, op_a, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k),
      alpha, g.b, type, static_cast<int>(g.ldb), g.stride_b, g.a, type, static_cast<int>(g.lda),
      g.stride_a, beta, g.c, type, static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.batch),
      compute, CUBLAS_GEMM_DEFAULT);
  return status == CUBLAS_STATUS_SUCCESS ? 0 : kCublasError + status;
}

}  // namespace ember::cuda::kernels
