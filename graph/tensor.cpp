// Storage, TensorImpl and the Tensor methods that are not ops: metadata, element access,
// conversion, copies, the autograd entry points, and printing.
#include "graph/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <sys/mman.h>
#include <unistd.h>

#include "graph/copy.h"
#include "graph/strided.h"

namespace ember {

namespace {
std::atomic<int64_t> g_live_impls{0};
constexpr size_t kAlignment = 64;

// Note [Buffer cache]
// A freed buffer is kept, by its exact (64-byte rounded) size, for the next Storage of that size,
// up to kCacheMaxBytes in all: a training step allocates the same sizes every iteration, and a
// fresh large buffer costs a page fault per 4 KB that the kernel zeroes (half the CPU time of a
// NW epoch at n_train = 1000), a small one glibc's memalign path. The peak footprint stays that
// of the live tensors, as a step reuses what the previous one freed. Sanitizer builds skip the
// cache, so that AddressSanitizer still sees every use after free.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kCacheMaxBytes = 0;
#else
constexpr size_t kCacheMaxBytes = size_t(1) << 30;
#endif

class BufferCache {
 public:
  void* take(size_t bytes) {
    std::lock_guard lock(mutex_);
    const auto it = free_.find(bytes);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    held_ -= bytes;
    return p;
  }
  // False when the cache is full: the caller frees the buffer.
  bool give(void* p, size_t bytes) {
    std::lock_guard lock(mutex_);
    if (held_ + bytes > kCacheMaxBytes) return false;
    free_[bytes].push_back(p);
    held_ += bytes;
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t held_ = 0;
};

// Never destroyed: Storages of static tensors may be freed after static destruction.
BufferCache& buffer_cache() {
  static BufferCache* cache = new BufferCache;
  return *cache;
}

size_t rounded_bytes(size_t nbytes) {
  return nbytes == 0 ? kAlignment : (nbytes + kAlignment - 1) / kAlignment * kAlignment;
}

// Note [Huge pages]
// A buffer of 2 MB or more starts on a 2 MB boundary, and one of kHugeAdvice or more has its whole
// 2 MB pages advised to the kernel as huge-page memory (madvise MADV_HUGEPAGE, what Linux's
// transparent huge pages act on in their default "madvise" mode; PyTorch's CPU allocator does the
// same under THP_MEM_ALLOC_ENABLE). A pass over a large tensor then takes a TLB miss per 2 MB
// instead of per 4 KB: b += 3c over 128 MB arrays ran at 34-37 GB/s on one Zen 4 core and 59-67
// GB/s on two, against 26-28 and 48 with 4 KB pages (a plain OpenMP loop, docs/design.md); on
// the AMX Xeon 10-13% faster from 4 MB arrays up. The length is not rounded up: the tail past the
// last whole 2 MB page stays in 4 KB pages, so a buffer holds no more memory than its length.
// Why not every buffer from 2 MB: a fresh huge page can cost more to fault in than its 4 KB pages.
// On the AMX Xeon, a VM with a virtio balloon (whose free page reporting gives the host free guest
// memory back in 2 MB blocks, which a huge page then takes), first touches ran at 1.1 GB/s on huge
// pages against 2.9 on 4 KB ones (400 MB, alternating runs), so the
// Fashion-MNIST CNN's first step (tensors of up to 12.8 MB, 420 MB touched) took 660-820 ms
// against 230, while its later steps, and copy steps A and B, ran no faster on huge pages
// (docs/design.md, "Huge pages"). From kHugeAdvice up the passes gain enough to pay for it (NW's
// epoch at n_train = 4000, 64 MB tensors: 3% faster). The advice is only advice: where the kernel
// has no THP, nothing changes; where THP is "always", the kernel uses huge pages for aligned
// buffers of every size anyway.
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kHugeAdvice = size_t(32) << 20;

void* allocate(size_t rounded) {
  void* p = nullptr;
  if (rounded < kHugePage) return std::aligned_alloc(kAlignment, rounded);
  if (posix_memalign(&p, kHugePage, rounded) != 0) return nullptr;
  if (rounded >= kHugeAdvice) (void)madvise(p, rounded / kHugePage * kHugePage, MADV_HUGEPAGE);
  return p;
}

// The machine's memory in bytes: a buffer larger than this can never be filled, and with memory
// overcommit the allocation itself could succeed and the process be killed later.
size_t physical_memory() {
  static const size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page)
                                 : std::numeric_limits<size_t>::max();
  }();
  return bytes;
}

}  // namespace

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  check_device(device_, "tensor");
  if (device_.is_cuda()) {
    data_ = cuda::detail::allocate(device_, nbytes);
    return;
  }
  EMBER_CHECK(nbytes <= physical_memory(),
              "tensor: cannot allocate {} bytes ({:.1f} GiB): the machine has {:.1f} GiB of memory",
              nbytes, nbytes / 1073741824.0, physical_memory() / 1073741824.0);
  const size_t rounded = rounded_bytes(nbytes);
  data_ = buffer_cache().take(rounded);
  if (data_ == nullptr) data_ = allocate(rounded);
  if (data_ == nullptr)
    throw Error(fmt::format("tensor: cannot allocate {} bytes (out of memory)", nbytes));
}

Storage::~Storage() {
  if (device_.is_cuda()) {
    cuda::detail::free(device_, data_);
    return;
  }
  const size_t rounded = rounded_bytes(nbytes_);
  if (!buffer_cache().give(data_, rounded)) std::free(data_);
}

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage_, int64_t offset_, Shape shape_,
                       Shape strides_, DType dtype_)
    : storage(std::move(storage_)),
      offset(offset_),
      shape(std::move(shape_)),
      strides(std::move(strides_)),
      numel(shape_numel(shape)),
      dtype(dtype_) {
  EMBER_CHECK(shape.size() <= kMaxDims, "tensor: at most {} dims are supported, got shape {}",
              kMaxDims, shape);
  ++g_live_impls;
}

TensorImpl::~TensorImpl() { --g_live_impls; }

int64_t live_tensor_impls() { return g_live_impls.load(); }

// Note [Checked sizes]
// Every shape is checked where a tensor is made: its sizes are non-negative and their product,
// the product of the nonzero ones (which strides reach) and the byte count fit in an int64, as
// torch's "numel: integer multiplication overflow". A shape whose size wraps around would
// otherwise describe a tensor over too small a buffer.
int64_t shape_numel(const Shape& shape) {
  int64_t n = 1, reach = 1;  // reach: the product of the nonzero sizes
  for (int64_t s : shape) {
    EMBER_CHECK(s >= 0, "tensor: negative size in shape {}", shape);
    EMBER_CHECK(!__builtin_mul_overflow(reach, std::max<int64_t>(s, 1), &reach),
                "tensor: shape {} has more elements than an int64 counts (integer multiplication "
                "overflow)",
                shape);
    n *= s;  // <= reach: cannot overflow
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = s;
    EMBER_CHECK(!__builtin_mul_overflow(s, std::max<int64_t>(shape[d], 1), &s),
                "tensor: strides of shape {} overflow an int64", shape);
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, std::string_view op) {
  const int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dims 0 and -1
  EMBER_CHECK(dim >= -n && dim < n, "{}: dim {} out of range for a tensor of {} dims", op, dim,
              ndim);
  return dim < 0 ? dim + n : dim;
}

Tensor empty(const Shape& shape, DType dtype, const Device& device) {
  const int64_t n = shape_numel(shape);
  int64_t bytes = 0;
  EMBER_CHECK(!__builtin_mul_overflow(n, static_cast<int64_t>(element_size(dtype)), &bytes),
              "tensor: shape {} of {} needs more bytes than an int64 counts", shape, dtype);
  auto storage = std::make_shared<Storage>(static_cast<size_t>(bytes), device);
  return Tensor(
      std::make_shared<TensorImpl>(std::move(storage), 0, shape, contiguous_strides(shape), dtype));
}

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  return Tensor(std::make_shared<TensorImpl>(base.impl()->storage, offset, std::move(shape),
                                             std::move(strides), base.dtype()));
}

// --- overlap: Note [In-place overlap] in graph/tensor.h

bool has_internal_overlap(const Tensor& t) {
  if (t.numel() <= 1) return false;
  // Dims of size > 1 by increasing stride: the tensor is free of overlap when each stride
  // exceeds the farthest offset reachable through the smaller ones.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.shape()[d] > 1) dims.emplace_back(std::abs(t.strides()[d]), t.shape()[d]);
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the largest offset the smaller dims reach
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return true;
    reach += stride * (size - 1);
  }
  return false;
}

namespace {
// The element offsets [lo, hi] that t touches in its storage.
std::pair<int64_t, int64_t> memory_span(const Tensor& t) {
  int64_t lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t extent = t.strides()[d] * (t.shape()[d] - 1);
    (extent < 0 ? lo : hi) += extent;
  }
  return {lo, hi};
}
}  // namespace

bool partially_overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  if (a.impl()->storage != b.impl()->storage) return false;
  if (a.storage_offset() == b.storage_offset() && a.shape() == b.shape() &&
      a.strides() == b.strides() && a.dtype() == b.dtype())
    return false;  // the same view
  const auto [alo, ahi] = memory_span(a);
  const auto [blo, bhi] = memory_span(b);
  return alo <= bhi && blo <= ahi;
}

// --- metadata

void Tensor::throw_undefined(std::string_view op) {
  throw Error(fmt::format("{}: undefined tensor (a default-constructed Tensor holds no data)", op));
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // as torch: no element is out of place
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

template <class T>
T* Tensor::data() const {
  EMBER_CHECK(defined(), "data: undefined tensor");
  EMBER_CHECK(dtype() == dtype_of<T>(), "data: tensor is {}, asked for {}", dtype(), dtype_of<T>());
  // Note [CPU kernels and devices]
  // Every kernel reads and writes its tensors through data<T>(): on a tensor of another device
  // that would be a device address, so here the CPU kernels of ops without a CUDA kernel yet
  // refuse it.
  EMBER_CHECK(impl_->storage->device().is_cpu(),
              "a CPU kernel was given a tensor of shape {} on {}: this op has no kernel for that "
              "device yet; move the tensor with .cpu()",
              shape(), device());
  return static_cast<T*>(impl_->storage->data()) + impl_->offset;
}
void* Tensor::data_bytes() const {
  EMBER_CHECK(defined(), "data_bytes: undefined tensor");
  return static_cast<char*>(impl_->storage->data()) +
         impl_->offset * static_cast<int64_t>(element_size(impl_->dtype));
}

template float* Tensor::data<float>() const;
template double* Tensor::data<double>() const;
template int64_t* Tensor::data<int64_t>() const;
template bool* Tensor::data<bool>() const;

// --- values

template <class T>
T Tensor::item() const {
  EMBER_CHECK(defined(), "item: undefined tensor");
  if (!device().is_cpu()) return cpu().item<T>();
  EMBER_CHECK(numel() == 1,
              "item: only one-element tensors can be converted to a scalar, got "
              "shape {}",
              shape());
  return dispatch_all(dtype(), [&]<class S>() { return cast_value<T>(*data<S>()); });
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template bool Tensor::item<bool>() const;

template <class T>
std::vector<T> Tensor::to_vector() const {
  EMBER_CHECK(defined(), "to_vector: undefined tensor");
  if (!device().is_cpu()) return cpu().to_vector<T>();
  Tensor c = to(dtype_of<T>()).contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

Tensor Tensor::contiguous() const {
  EMBER_CHECK(defined(), "contiguous: undefined tensor");
  return is_contiguous() ? *this : clone();
}

// --- autograd entry points

Tensor& Tensor::requires_grad_(bool on) {
  EMBER_CHECK(defined(), "requires_grad_: undefined tensor");
  EMBER_CHECK(!on || is_floating(dtype()),
              "requires_grad_: only Float32/Float64 tensors can require gradients, got {} of "
              "shape {}",
              dtype(), shape());
  EMBER_CHECK(on || is_leaf(),
              "requires_grad_: cannot turn off requires_grad of a non-leaf tensor; use detach()");
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const { return defined() && impl_->grad ? Tensor(impl_->grad) : Tensor(); }

void Tensor::set_grad(const Tensor& g) const {
  EMBER_CHECK(defined(), "set_grad: undefined tensor");
  EMBER_CHECK(!g.defined() || g.dtype() == dtype(),
              "set_grad: a {} gradient for a {} tensor (the dtypes must match)",
              g.defined() ? g.dtype() : dtype(), dtype());
  EMBER_CHECK(!g.defined() || g.shape() == shape(),
              "set_grad: gradient of shape {} for a tensor of shape {}",
              g.defined() ? g.shape() : Shape{}, shape());
  impl_->grad = g.impl_ptr();
}

Tensor Tensor::detach() const {
  EMBER_CHECK(defined(), "detach: undefined tensor");
  return make_view(*this, shape(), strides(), storage_offset());
}

// --- printing

namespace {

template <class T>
void print_value(std::ostream& os, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "true" : "false");
  } else if constexpr (std::is_integral_v<T>) {
    os << v;
  } else {
    os << fmt::format("{:.4f}", v);
  }
}

template <class T>
void print_dim(std::ostream& os, const T* p, const Tensor& t, int64_t d, int64_t indent) {
  if (d == t.dim()) {
    print_value(os, *p);
    return;
  }
  os << '[';
  const int64_t n = t.size(d), edge = 3;
  for (int64_t i = 0; i < n; ++i) {
    if (n > 2 * edge + 1 && i == edge) {
      os << (d + 1 == t.dim() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - edge - 1;
      continue;
    }
    print_dim(os, p + i * t.stride(d), t, d + 1, indent + 1);
    if (i + 1 < n) os << (d + 1 == t.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  os << "tensor(";
  const Tensor host = t.device().is_cpu() ? t : t.detach().cpu();
  dispatch_all(t.dtype(), [&]<class T>() { print_dim(os, host.data<T>(), host, 0, 7); });
  os << fmt::format(", shape={}, dtype={}", t.shape(), t.dtype());
  if (!t.device().is_cpu()) os << fmt::format(", device={}", t.device());
  if (t.requires_grad()) os << ", requires_grad=true";
  return os << ')';
}

}  // namespace ember
