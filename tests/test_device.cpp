// Devices (issue 35, part 1): Device's names and errors, every tensor's device, to(Device),
// creation on a device, Module::to(Device), and what a build or machine without a usable GPU
// says when asked for one (Note [CUDA availability] in graph/device.h). The cases that need no
// GPU skip with one line where there is one.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "cuda/optim.h"
#include "cuda/random.h"
#include "examples/copy_task.h"
#include "graph/caching_allocator.h"
#include "graph/random.h"
#include "helpers.h"
#include "train/checkpoint.h"

using namespace ember;
using namespace ember::testing;
namespace fs = std::filesystem;

namespace {

// The same dtype, shape and values, exactly.
void expect_equal(const Tensor& a, const Tensor& b) {
  BOOST_TEST((a.dtype() == b.dtype()), fmt::format("dtype {} vs {}", a.dtype(), b.dtype()));
  expect_close(a, b, 0, 0);
}

// A driver of `capacity` bytes that counts what it is asked: the caching allocator's backend in
// the tests (a GPU's is cudaMalloc/cudaFree).
struct FakeDriver {
  explicit FakeDriver(std::set<void*>& alive, size_t capacity = SIZE_MAX)
      : capacity(capacity), alive(&alive) {}
  size_t capacity, in_use = 0;
  std::set<void*>* alive;  // what the driver handed out and has not got back
  std::map<void*, size_t> sizes;
  void* alloc(size_t bytes) {
    if (in_use + bytes > capacity) return nullptr;
    void* p = std::malloc(bytes);
    in_use += bytes;
    sizes[p] = bytes;
    alive->insert(p);
    return p;
  }
  void release(void* p) {
    BOOST_TEST_REQUIRE(alive->erase(p) == 1u, "the driver got back a block it did not give");
    in_use -= sizes.at(p);
    sizes.erase(p);
    std::free(p);
  }
  std::string name() const { return "fake:0"; }
};

// True (and one line in the log) where a GPU is usable: the no-GPU cases skip there.
bool gpu_present() {
  if (!cuda::is_available()) return false;
  BOOST_TEST_MESSAGE("skipped: a CUDA device is usable here (" << cuda::device_count()
                                                               << " device(s))");
  return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(test_device)

BOOST_AUTO_TEST_CASE(names) {
  const Device cpu("cpu"), cuda("cuda"), cuda3("cuda:3");
  BOOST_TEST(cpu.is_cpu());
  BOOST_TEST(!cpu.is_cuda());
  BOOST_TEST(cpu.index() == 0);
  BOOST_TEST(cpu.str() == "cpu");
  BOOST_TEST((cpu == kCPU));
  BOOST_TEST((Device("cpu:0") == kCPU));
  BOOST_TEST(cuda.is_cuda());
  BOOST_TEST((cuda.type() == DeviceType::CUDA));
  BOOST_TEST(cuda.index() == 0);
  BOOST_TEST(cuda.str() == "cuda:0");
  BOOST_TEST((cuda == kCUDA));
  BOOST_TEST((Device("cuda:0") == kCUDA));
  BOOST_TEST(cuda3.index() == 3);
  BOOST_TEST(cuda3.str() == "cuda:3");
  BOOST_TEST((cuda3 == Device(DeviceType::CUDA, 3)));
  BOOST_TEST(!(cuda3 == cuda));
  BOOST_TEST(!(cpu == cuda));
  BOOST_TEST(Device("cuda:65535").index() == 65535);
  // printed by fmt and by streams alike
  BOOST_TEST(fmt::format("{} and {}", kCPU, cuda3) == "cpu and cuda:3");
  std::ostringstream os;
  os << cuda3;
  BOOST_TEST(os.str() == "cuda:3");
}

BOOST_AUTO_TEST_CASE(bad_names) {
  for (const char* name : {"gpu", "", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cuda: 1",
                           "cuda:65536", "cuda:99999999999", "cpu:1", "cpu:", "cuda0", " cuda"})
    expect_error([&] { Device d(name); }, {"Device", "'" + std::string(name) + "'", "cuda:N"});
  expect_error([] { Device d(DeviceType::CUDA, -1); }, {"Device", "index -1", "cuda"});
  expect_error([] { Device d(DeviceType::CPU, 1); }, {"Device", "cpu", "index 1"});
  expect_error([] { Device d(static_cast<DeviceType>(7)); }, {"Device", "unknown device type 7"});
}

BOOST_AUTO_TEST_CASE(tensors_know_their_device) {
  const Tensor x = randn({2, 3});
  BOOST_TEST((x.device() == kCPU));
  BOOST_TEST(!x.is_cuda());
  // views share the storage, and so the device
  BOOST_TEST((x.transpose(0, 1).device() == kCPU));
  BOOST_TEST((x.narrow(1, 0, 2).device() == kCPU));
  // to(the device it is on) is the tensor itself, as torch's; cpu() too
  BOOST_TEST(x.to(kCPU).same(x));
  BOOST_TEST(x.cpu().same(x));
  BOOST_TEST(x.to(Device("cpu")).same(x));
  BOOST_TEST(x.to(kCPU, kFloat32).same(x));
  // to(device, dtype) converts the dtype, differentiably
  const Tensor w = randn({2, 3}, kFloat32).requires_grad_();
  const Tensor y = w.to(kCPU, kFloat64);
  BOOST_TEST((y.dtype() == kFloat64));
  BOOST_TEST((y.device() == kCPU));
  y.sum().backward();
  BOOST_TEST((w.grad().dtype() == kFloat32));
  expect_equal(w.grad(), ones({2, 3}));
  // data_bytes: the first element's address, the view's offset counted
  const Tensor rows = x.narrow(0, 1, 1);
  BOOST_TEST(rows.data_bytes() == static_cast<void*>(x.data<float>() + 3));
  BOOST_TEST(rows.data_bytes() == static_cast<void*>(rows.data<float>()));
  expect_error([] { Tensor().to(kCPU); }, {"to", "undefined"});
  expect_error([] { (void)Tensor().device(); }, {"device", "undefined"});
}

BOOST_AUTO_TEST_CASE(creation_on_the_cpu) {
  // The device argument after the dtype; a CPU device gives what the defaults give.
  expect_equal(zeros({2, 2}, kFloat64, kCPU), zeros({2, 2}, kFloat64));
  expect_equal(ones({3}, kInt64, "cpu"), ones({3}, kInt64));
  expect_equal(full({2}, 7, kFloat32, kCPU), full({2}, 7));
  expect_equal(arange(0, 5, 1, kInt64, kCPU), arange(0, 5, 1, kInt64));
  expect_equal(eye(3, kFloat64, kCPU), eye(3, kFloat64));
  expect_equal(from_vector(std::vector<double>{1, 2}, {2}, kFloat64, kCPU),
               tensor({1, 2}, kFloat64));
  expect_equal(from_vector(std::vector<float>{1, 2}, {2}, kCPU), tensor({1, 2}));
  expect_equal(from_vector(std::vector<int64_t>{1, 2}, {2}, kCPU), tensor({1, 2}, kInt64));
  expect_equal(tensor({1, 2}, kFloat32, kCPU), tensor({1, 2}));
  expect_equal(scalar_tensor(4, kFloat64, kCPU), scalar_tensor(4, kFloat64));
  // random tensors: the same draws on the CPU device as by default
  for (const auto& draw : std::vector<std::function<Tensor(bool)>>{
           [](bool dev) { return dev ? rand({5}, kFloat64, kCPU) : rand({5}, kFloat64); },
           [](bool dev) { return dev ? randn({5}, kFloat32, kCPU) : randn({5}); },
           [](bool dev) { return dev ? normal(1, 2, {5}, kFloat32, kCPU) : normal(1, 2, {5}); },
           [](bool dev) { return dev ? randint(0, 9, {5}, kCPU) : randint(0, 9, {5}); }}) {
    manual_seed(11);
    const Tensor a = draw(true);
    manual_seed(11);
    expect_equal(a, draw(false));
    BOOST_TEST((a.device() == kCPU));
  }
  // *_like keep the argument's device (and dtype)
  const Tensor x = randn({2}, kFloat64);
  BOOST_TEST((zeros_like(x).device() == x.device()));
  BOOST_TEST((ones_like(x).dtype() == kFloat64));
  BOOST_TEST((full_like(x, 3).device() == kCPU));
}

BOOST_AUTO_TEST_CASE(module_to_device) {
  nn::Linear lin(3, 2);
  const Tensor weight = lin.weight;  // a handle, as an optimizer holds
  const Tensor before = weight.clone();
  lin.to(kCPU);
  BOOST_TEST(weight.same(lin.weight));
  expect_equal(lin.weight, before);
  // device and dtype at once: handles stay valid and see the new dtype, gradients follow
  lin(randn({4, 3})).sum().backward();
  lin.to(kCPU, kFloat64);
  BOOST_TEST((weight.dtype() == kFloat64));
  BOOST_TEST((lin.weight.grad().dtype() == kFloat64));
  expect_equal(weight, before.to(kFloat64));
  expect_error([&] { lin.to(kCPU, kInt64); }, {"Module::to", "Int64"});
}

BOOST_AUTO_TEST_CASE(no_gpu_errors) {
  if (gpu_present()) return;
  BOOST_TEST(cuda::device_count() == 0);
  BOOST_TEST(!cuda::is_available());
  const std::string why = cuda::unavailable_reason();
  BOOST_TEST(!why.empty());
  BOOST_TEST_MESSAGE("no CUDA device: " << why);
  expect_error([] { cuda::synchronize(); }, {"cuda::synchronize", "no CUDA device", why});
  const Tensor x = randn({2, 3});
  expect_error([&] { x.cuda(); }, {"to", "cannot use cuda:0", why});
  expect_error([&] { x.to(Device("cuda:1")); }, {"to", "cannot use cuda:1"});
  expect_error([&] { x.to(kCUDA, kFloat64); }, {"to", "cuda:0"});
  expect_error([] { zeros({2}, kFloat32, kCUDA); }, {"full", "cannot use cuda:0", why});
  expect_error([] { ones({2}, kFloat32, "cuda"); }, {"full", "cuda:0"});
  expect_error([] { arange(0, 3, 1, kFloat32, kCUDA); }, {"arange", "cuda:0"});
  expect_error([] { eye(2, kFloat32, kCUDA); }, {"eye", "cuda:0"});
  expect_error([] { from_vector(std::vector<float>{1}, {1}, kCUDA); }, {"from_vector", "cuda:0"});
  expect_error([] { tensor({1}, kFloat32, kCUDA); }, {"from_vector", "cuda:0"});
  expect_error([] { scalar_tensor(1, kFloat32, kCUDA); }, {"full", "cuda:0"});
  expect_error([] { rand({2}, kFloat32, kCUDA); }, {"rand", "cuda:0"});
  expect_error([] { randn({2}, kFloat32, kCUDA); }, {"randn", "cuda:0"});
  expect_error([] { normal(0, 1, {2}, kFloat32, kCUDA); }, {"normal", "cuda:0"});
  expect_error([] { randint(0, 3, {2}, kCUDA); }, {"randint", "cuda:0"});
  expect_error([] { empty({2}, kFloat32, kCUDA); }, {"tensor", "cuda:0"});
  expect_error([] { cuda::memory_stats(); }, {"cuda::memory_stats", "cuda:0", why});
  cuda::empty_cache();  // nothing to return
  // A refused move leaves the module as it was.
  nn::Linear lin(3, 2);
  const Tensor before = lin.weight.clone();
  expect_error([&] { lin.to(kCUDA); }, {"to", "cuda:0", why});
  expect_error([&] { lin.to(kCUDA, kFloat64); }, {"to", "cuda:0"});
  BOOST_TEST((lin.weight.device() == kCPU));
  BOOST_TEST((lin.weight.dtype() == kFloat32));
  expect_equal(lin.weight, before);
}

// Tensors on a GPU, where there is one: copies both ways (views, dtypes, gradients), values
// read through the host, the caching allocator's books, and the CPU kernels' refusal.
BOOST_AUTO_TEST_CASE(gpu_tensors) {
  if (!cuda::is_available()) {
    BOOST_TEST_MESSAGE("skipped: no CUDA device (" << cuda::unavailable_reason() << ")");
    return;
  }
  const Tensor x = randn({3, 5}, kFloat64);
  const Tensor g = x.cuda();
  BOOST_TEST(g.is_cuda());
  BOOST_TEST((g.device() == kCUDA));
  BOOST_TEST(g.to(kCUDA).same(g));
  expect_equal(g.cpu(), x);
  expect_equal(g.to(kCPU, kFloat32), x.to(kFloat32));
  expect_equal(x.to(kCUDA, kFloat32).cpu(), x.to(kFloat32));
  // a non-contiguous view each way
  expect_equal(x.transpose(0, 1).cuda().cpu(), x.transpose(0, 1).contiguous());
  expect_equal(x.narrow(0, 1, 2).cuda().cpu(), x.narrow(0, 1, 2));  // contiguous, at an offset
  expect_equal(g.transpose(0, 1).narrow(0, 1, 3).cpu(), x.transpose(0, 1).narrow(0, 1, 3));
  expect_equal(zeros({0, 4}, kFloat32, kCUDA).cpu(), zeros({0, 4}));
  // on the device: dtype conversions, strided copies, writes into views from either device
  BOOST_TEST(g.to(kFloat32).is_cuda());
  expect_equal(g.to(kFloat32).cpu(), x.to(kFloat32));
  expect_equal(g.to(kInt64).cpu(), x.to(kInt64));
  expect_equal(g.transpose(0, 1).contiguous().cpu(), x.transpose(0, 1).contiguous());
  Tensor part = zeros({3, 5}, kFloat64, kCUDA), want = zeros({3, 5}, kFloat64);
  part.narrow(1, 1, 2).copy_(x.narrow(1, 0, 2));  // from the host into a device view
  want.narrow(1, 1, 2).copy_(x.narrow(1, 0, 2));
  part.select(0, 2).copy_(g.select(0, 0));  // within the device
  want.select(0, 2).copy_(x.select(0, 0));
  part.transpose(0, 1).select(0, 4).fill_(7);
  want.transpose(0, 1).select(0, 4).fill_(7);
  expect_equal(part.cpu(), want);
  // sums over dims (and the broadcast gradients the engine sums with them)
  expect_close(g.sum({0}).cpu(), x.sum({0}), 1e-12, 1e-12);
  expect_close(g.transpose(0, 1).sum({-1}, true).cpu(), x.transpose(0, 1).sum({-1}, true), 1e-12,
               1e-12);
  BOOST_TEST(full({2, 3}, 1, kBool, kCUDA).sum().item<int64_t>() == 6);
  expect_equal(zeros({0, 3}, kFloat32, kCUDA).sum({0}).cpu(), zeros({3}));
  // products into a column-major output, with alpha and beta, and an empty inner dim
  {
    const Tensor a = randn({4, 3}, kFloat64), b = randn({3, 5}, kFloat64);
    const Tensor c0 = randn({5, 4}, kFloat64);
    Tensor c = c0.clone(), c_dev = c0.cuda();
    gemm(a, b, c.transpose(0, 1), 0.5, 2.0);
    gemm(a.cuda(), b.cuda(), c_dev.transpose(0, 1), 0.5, 2.0);
    expect_close(c_dev.cpu(), c, 1e-12, 1e-12);
    Tensor empty_k = full({2, 3}, 1.5, kFloat64, kCUDA);
    gemm(zeros({2, 0}, kFloat64, kCUDA), zeros({0, 3}, kFloat64, kCUDA), empty_k, 1.0, 2.0);
    expect_equal(empty_k.cpu(), full({2, 3}, 3.0, kFloat64));
  }
  // creation on the device
  expect_equal(full({2, 2}, 3, kInt64, kCUDA).cpu(), full({2, 2}, 3, kInt64));
  manual_seed(3);
  const Tensor r = randn({4}, kFloat32, kCUDA);
  manual_seed(3);
  expect_equal(r.cpu(), randn({4}));
  // values through the host
  BOOST_TEST(g.select(0, 1).select(0, 2).item<double>() ==
             x.select(0, 1).select(0, 2).item<double>());
  BOOST_TEST((g.to_vector<double>() == x.to_vector<double>()));
  std::ostringstream os;
  os << g;
  BOOST_TEST(os.str().find("device=cuda:0") != std::string::npos, os.str());
  // the gradient goes back to the input's device and dtype
  const Tensor w = randn({3}, kFloat32).requires_grad_();
  const Tensor moved = w.to(kCUDA, kFloat64);
  moved.cpu().sum().backward();
  BOOST_TEST((w.grad().device() == kCPU));
  BOOST_TEST((w.grad().dtype() == kFloat32));
  expect_equal(w.grad(), ones({3}));
  // a module and back
  nn::Linear lin(3, 2);
  const Tensor weight = lin.weight, before = weight.clone();
  lin.to(kCUDA);
  BOOST_TEST(weight.is_cuda());
  lin.to(kCPU);
  expect_equal(weight, before);
  // values into a GPU tensor in place, and a checkpoint onto a GPU module
  Tensor dst = zeros({2, 3}, kFloat32, kCUDA);
  dst.copy_(tensor({1, 2, 3}));  // broadcast and converted on the way
  expect_equal(dst.cpu(), tensor({1, 2, 3}).expand({2, 3}).contiguous());
  dst.zero_();
  expect_equal(dst.cpu(), zeros({2, 3}));
  nn::Linear saved(3, 2), loaded(3, 2);
  const fs::path file = fs::temp_directory_path() / "ember_test_device_linear.safetensors";
  nn::save(saved, file.string());
  loaded.to(kCUDA);
  nn::load(loaded, file.string());
  BOOST_TEST(loaded.weight.is_cuda());
  expect_equal(loaded.weight.cpu(), saved.weight);
  fs::remove(file);
  // the same sizes again: served from the cache, no new cudaMalloc
  for (int i = 0; i < 3; ++i) (void)zeros({256, 256}, kFloat32, kCUDA);
  const cuda::MemoryStats before_stats = cuda::memory_stats();
  for (int i = 0; i < 10; ++i) (void)zeros({256, 256}, kFloat32, kCUDA);
  const cuda::MemoryStats after_stats = cuda::memory_stats();
  BOOST_TEST(after_stats.driver_allocs == before_stats.driver_allocs);
  BOOST_TEST(after_stats.cache_hits >= before_stats.cache_hits + 10);
  cuda::empty_cache();
  BOOST_TEST(cuda::memory_stats().reserved_bytes == cuda::memory_stats().allocated_bytes);
  cuda::synchronize();
  // tensors of two devices in one op: an Error naming the op and both devices
  expect_error([&] { (void)add(g, x); }, {"add", "one device", "cuda:0", "cpu"});
  expect_error([&] { (void)matmul(x, g.transpose(0, 1)); },
               {"matmul", "one device", "cpu", "cuda:0"});
  // multinomial draws on the host: the CPU's samples for the same seed, on the device
  manual_seed(8);
  const Tensor drawn = multinomial(abs(x), 4, true);
  manual_seed(8);
  const Tensor drawn_here = multinomial(abs(g), 4, true);
  BOOST_TEST(drawn_here.is_cuda());
  expect_equal(drawn_here.cpu(), drawn);
  // a CPU kernel refuses a device's tensor rather than reading its memory
  expect_error([&] { (void)g.data<double>(); }, {"CPU kernel", "cuda:0", ".cpu()"});
  expect_error([&] { lin.to(Device(DeviceType::CUDA, cuda::device_count())); },
               {"to", "CUDA device(s)"});
}

// Where no device is usable, one line and true: the device cases below skip.
bool skip_without_gpu() {
  if (cuda::is_available()) return false;
  BOOST_TEST_MESSAGE("skipped: no CUDA device (" << cuda::unavailable_reason() << ")");
  return true;
}

// dropout on a device: the CPU's mask for the same seed (one counter-based hash, cuda/random.h),
// its gradient, and head_attention's weights and gradients with a mask and dropout.
BOOST_AUTO_TEST_CASE(dropout_and_attention_on_the_device) {
  if (skip_without_gpu()) return;
  for (uint64_t key : {0ull, 1ull, 0x123456789abcdefull})
    for (uint64_t counter : {0ull, 7ull, 1ull << 40})
      BOOST_TEST(cuda::kernels::counter_bits(key, counter) == counter_bits(key, counter));
  for (const Shape& shape : {Shape{7, 5}, Shape{4, 6}, Shape{0}, Shape{1}}) {
    const Tensor x = randn(shape, kFloat64).requires_grad_();
    const Tensor xd = x.detach().cuda().requires_grad_();
    manual_seed(21);
    const Tensor want = dropout(x, 0.4, true);
    manual_seed(21);
    const Tensor got = dropout(xd, 0.4, true);
    expect_equal(got.cpu(), want);
    const Tensor up = randn(shape, kFloat64);
    want.backward(up);
    got.backward(up.cuda());
    expect_equal(xd.grad().cpu(), x.grad());
  }
  // head_attention: 2 heads, a key mask dropping the last key of row 1, dropout 0.25
  const Tensor q = randn({2, 3, 4}, kFloat64).requires_grad_(), k = randn({2, 5, 4}, kFloat64),
               v = randn({2, 5, 4}, kFloat64);
  Tensor keep = ones({2, 1, 5}, kBool);
  keep.select(0, 1).select(1, 4).fill_(0);
  const Tensor qd = q.detach().cuda().requires_grad_();
  manual_seed(5);
  const HeadAttention want = head_attention(q, k, v, 2, keep, 0.25);
  manual_seed(5);
  const HeadAttention got = head_attention(qd, k.cuda(), v.cuda(), 2, keep.cuda(), 0.25);
  expect_close(got.values.cpu(), want.values, 1e-12, 1e-12, "head_attention values");
  expect_close(got.p_attn.cpu(), want.p_attn, 1e-12, 1e-12, "head_attention weights");
  const Tensor up = randn({2, 3, 4}, kFloat64);
  want.values.backward(up);
  got.values.backward(up.cuda());
  expect_close(qd.grad().cpu(), q.grad(), 1e-10, 1e-12, "head_attention dq");
}

// gradcheck and gradgradcheck on CUDA Float64 inputs, one a transposed view (issue 35, part 3):
// the finite differences taken on the device pass, and a wrong backward fails there too.
BOOST_AUTO_TEST_CASE(gradcheck_on_the_device) {
  if (skip_without_gpu()) return;
  const Tensor x = randn({4, 3}, kFloat64).cuda().transpose(0, 1).requires_grad_();
  const Tensor w = randn({4, 2}, kFloat64).cuda().requires_grad_();
  BOOST_TEST(!x.is_contiguous());
  const auto f = [](const std::vector<Tensor>& in) {
    return softmax(tanh(matmul(in[0], in[1])), -1) * in[1].sum();
  };
  check_gradient(f, {x, w}, "a product, tanh and softmax on the device");
  const GradcheckResult second = gradgradcheck(f, {x, w});
  BOOST_TEST(second.ok, second.message);
  // detach() hides w's second use from the backward: its analytic gradient is wrong, and
  // gradcheck on the device says so
  const GradcheckResult bad = gradcheck(
      [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]) * in[1].detach().sum(); },
      {x, w});
  BOOST_TEST(!bad.ok);
}

// linear's, layer_norm's and dropout's backwards recorded under create_graph (linear_backward,
// layer_norm_backward, dropout_backward) differentiate on the device: gradgradcheck there, and
// the second derivative of a small network equals the CPU's.
BOOST_AUTO_TEST_CASE(fused_backward_ops_differentiate_on_the_device) {
  if (skip_without_gpu()) return;
  const auto f = [](const std::vector<Tensor>& in) {
    manual_seed(9);  // the same dropout mask at every evaluation
    const Tensor h = layer_norm(linear(in[0], in[1], in[2]), {3}, in[3], Tensor());
    return dropout(tanh(h), 0.25, true) * in[0].sum();
  };
  std::vector<Tensor> host, device;
  for (const Shape& shape : std::vector<Shape>{{2, 4}, {3, 4}, {3}, {3}}) {
    const Tensor t = randn(shape, kFloat64);
    host.push_back(t.detach().requires_grad_());
    device.push_back(t.cuda().requires_grad_());
  }
  const GradcheckResult second = gradgradcheck(f, device);
  BOOST_TEST(second.ok, second.message);
  const auto hessian_row = [&](const std::vector<Tensor>& in) {
    const Tensor g = autograd::grad({f(in).sum()}, {in[0]}, {}, std::nullopt, true)[0];
    return autograd::grad({(g * g).sum()}, in);
  };
  const std::vector<Tensor> want = hessian_row(host), got = hessian_row(device);
  for (size_t i = 0; i < want.size(); ++i)
    expect_close(got[i].cpu(), want[i], 1e-10, 1e-12, fmt::format("input {}", i));
}

// cross_entropy on a device is one row kernel forward and one backward (Note [Cross-entropy on
// a device]): the CPU's values and gradients on (N, C, D) logits (a transposed view) with ignored
// targets and label smoothing, every reduction; two launches for the first-order pair beyond the
// reduction's; its create_graph backward (ops) passes gradgradcheck on the device.
BOOST_AUTO_TEST_CASE(cross_entropy_rows_on_the_device) {
  if (skip_without_gpu()) return;
  const Tensor logits = randn({3, 2, 5}, kFloat64).transpose(1, 2);  // (N, C, D) = (3, 5, 2)
  const Tensor target =
      from_vector(std::vector<int64_t>{0, 4, 2, 2, 1, 3}, {3, 2}, kCPU);  // 2 ignored
  for (const Reduction reduction : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    for (const double eps : {0.0, 0.1}) {
      const Tensor h = logits.detach().requires_grad_();
      const Tensor d = logits.detach().cuda().requires_grad_();
      const Tensor want = cross_entropy(h, target, reduction, 2, eps);
      const Tensor got = cross_entropy(d, target.cuda(), reduction, 2, eps);
      expect_close(got.cpu(), want, 1e-12, 1e-12, "value");
      const Tensor up = randn(want.shape(), kFloat64);
      want.backward(up);
      got.backward(up.cuda());
      expect_close(d.grad().cpu(), h.grad(), 1e-12, 1e-12, "gradient");
    }
  }
  const Tensor x = logits.detach().cuda().requires_grad_();
  const int64_t before = cuda::launch_stats().kernels;
  const Tensor loss = cross_entropy(x, target.cuda(), Reduction::None, 2, 0.1);
  BOOST_TEST(cuda::launch_stats().kernels - before == 1);  // the row kernel (no reduction)
  const int64_t forward = cuda::launch_stats().kernels;
  loss.backward(ones_like(loss));
  BOOST_TEST(cuda::launch_stats().kernels - forward <= 2);  // the ones, the row kernel
  const GradcheckResult second = gradgradcheck(
      [&](const std::vector<Tensor>& in) {
        return cross_entropy(in[0], target.cuda(), Reduction::Mean, 2, 0.1);
      },
      {x});
  BOOST_TEST(second.ok, second.message);
}

// layer_norm on a device is one row kernel forward (y, mean and rstd) and one for dX backward,
// dW and dB sums over the rows: the CPU's values and gradients over two trailing dims of a
// transposed input, with and without weight and bias.
BOOST_AUTO_TEST_CASE(layer_norm_rows_on_the_device) {
  if (skip_without_gpu()) return;
  const Tensor x0 = randn({3, 4, 2}, kFloat64).transpose(0, 2);  // (2, 4, 3), not contiguous
  const Tensor w0 = randn({4, 3}, kFloat64), b0 = randn({4, 3}, kFloat64);
  for (const bool affine : {true, false}) {
    BOOST_TEST_CONTEXT((affine ? "weight and bias" : "no weight or bias")) {
      const auto inputs = [&](const Device& d) {
        std::vector<Tensor> in = {x0.detach().to(d).requires_grad_()};
        if (affine) {
          in.push_back(w0.detach().to(d).requires_grad_());
          in.push_back(b0.detach().to(d).requires_grad_());
        }
        return in;
      };
      const auto f = [&](const std::vector<Tensor>& in) {
        return layer_norm(in[0], {4, 3}, affine ? in[1] : Tensor(), affine ? in[2] : Tensor(),
                          1e-5);
      };
      const std::vector<Tensor> h = inputs(kCPU), d = inputs(kCUDA);
      const int64_t before = cuda::launch_stats().kernels;
      const Tensor got = f(d);
      BOOST_TEST(cuda::launch_stats().kernels - before <= 2);  // x made contiguous, the row kernel
      const Tensor want = f(h);
      expect_close(got.cpu(), want, 1e-12, 1e-12, "value");
      const Tensor up = randn(want.shape(), kFloat64);
      want.backward(up);
      got.backward(up.cuda());
      for (size_t i = 0; i < h.size(); ++i)
        expect_close(d[i].grad().cpu(), h[i].grad(), 1e-10, 1e-12, fmt::format("gradient {}", i));
    }
  }
}

// SGD (momentum, Nesterov, weight decay), Adam and AdamW, and clip_grad_norm_ on device
// parameters: the CPU's values step by step.
BOOST_AUTO_TEST_CASE(optimizers_on_the_device) {
  if (skip_without_gpu()) return;
  using Make = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;
  const std::vector<std::pair<std::string, Make>> makers = {
      {"sgd", [](auto p) { return std::make_unique<optim::SGD>(p, optim::SGDOptions{0.1}); }},
      {"sgd momentum nesterov",
       [](auto p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions{0.05, 0.9, 0, 0.01, true});
       }},
      {"sgd dampening",
       [](auto p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions{0.05, 0.8, 0.3, 0, false});
       }},
      {"adam", [](auto p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions{0.01}); }},
      {"adamw", [](auto p) {
         optim::AdamOptions o{0.01};
         o.weight_decay = 0.1, o.decoupled_weight_decay = true;
         return std::make_unique<optim::Adam>(p, o);
       }}};
  for (const auto& [name, make] : makers) {
    BOOST_TEST_CONTEXT(name) {
      for (DType dtype : {kFloat32, kFloat64}) {
        const Tensor w0 = randn({3, 4}, dtype), b0 = randn({4}, dtype);
        std::vector<Tensor> host = {w0.clone().requires_grad_(), b0.clone().requires_grad_()};
        std::vector<Tensor> device = {w0.cuda().requires_grad_(), b0.cuda().requires_grad_()};
        const auto opt_host = make(host), opt_device = make(device);
        for (int step = 0; step < 4; ++step) {
          const Tensor x = randn({5, 3}, dtype);
          const auto loss = [&](const std::vector<Tensor>& p, const Tensor& in) {
            return sum(mul(tanh(add(matmul(in, p[0]), p[1])), 3.0));
          };
          loss(host, x).backward();
          loss(device, x.cuda()).backward();
          const double norm_host = optim::clip_grad_norm_(host, 1.0);
          const double norm_device = optim::clip_grad_norm_(device, 1.0);
          BOOST_TEST(norm_device == norm_host, boost::test_tools::tolerance(1e-5));
          opt_host->step();
          opt_device->step();
          opt_host->zero_grad();
          opt_device->zero_grad();
        }
        const double tol = dtype == kFloat64 ? 1e-12 : 1e-5;
        for (size_t i = 0; i < host.size(); ++i) {
          BOOST_TEST(device[i].is_cuda());
          expect_close(device[i].cpu(), host[i], tol, tol, fmt::format("parameter {}", i));
        }
      }
    }
  }
}

// Many parameters in one step (more than one launch of cuda/optim.h's kMaxOptimTensors): Float32
// and Float64 among them (one launch per dtype), a transposed view, empty ones, and some without a
// gradient at some steps (so their step counts differ, and Adam updates them apart). Adam, AdamW
// and SGD with momentum give the CPU's values.
BOOST_AUTO_TEST_CASE(optimizers_on_many_parameters) {
  if (skip_without_gpu()) return;
  constexpr int kParams = 2 * cuda::kernels::kMaxOptimTensors + 7;
  std::vector<Tensor> init;
  for (int i = 0; i < kParams; ++i) {
    const DType dtype = i % 3 == 0 ? kFloat64 : kFloat32;
    init.push_back(i % 11 == 5 ? empty({0, 3}, dtype) : randn({1 + i % 4, 2 + i % 5}, dtype));
  }
  using Make = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;
  const std::vector<std::pair<std::string, Make>> makers = {
      {"adam", [](auto p) { return std::make_unique<optim::Adam>(p, optim::AdamOptions{0.01}); }},
      {"adamw",
       [](auto p) {
         optim::AdamOptions o{0.01};
         o.weight_decay = 0.1, o.decoupled_weight_decay = true;
         return std::make_unique<optim::Adam>(p, o);
       }},
      {"sgd momentum", [](auto p) {
         return std::make_unique<optim::SGD>(p, optim::SGDOptions{0.05, 0.9, 0, 0.01, true});
       }}};
  for (const auto& [name, make] : makers) {
    BOOST_TEST_CONTEXT(name) {
      std::vector<Tensor> host, device;
      for (size_t i = 0; i < init.size(); ++i) {
        // parameter 1 a transposed view of its storage on the device
        host.push_back(init[i].clone().requires_grad_());
        device.push_back(i == 1 ? init[i].transpose(0, 1).contiguous().cuda().transpose(0, 1)
                                : init[i].cuda());
        device.back().requires_grad_();
      }
      BOOST_TEST(!device[1].is_contiguous());
      const auto opt_host = make(host), opt_device = make(device);
      for (int step = 0; step < 4; ++step) {
        opt_host->zero_grad();
        opt_device->zero_grad();
        for (size_t i = 0; i < init.size(); ++i) {
          if ((i + step) % 5 == 0) continue;  // no gradient this step
          const Tensor up = randn(init[i].shape(), init[i].dtype());
          sum(sin(host[i]) * up).backward();
          sum(sin(device[i]) * up.cuda()).backward();
        }
        opt_host->step();
        opt_device->step();
      }
      for (size_t i = 0; i < host.size(); ++i) {
        const double tol = host[i].dtype() == kFloat64 ? 1e-12 : 1e-5;
        expect_close(device[i].cpu(), host[i], tol, tol, fmt::format("parameter {}", i));
      }
    }
  }
}

// L-BFGS (with and without the strong Wolfe line search) on device parameters, one of them a
// transposed view: the CPU's iterates, counters and state; its state dict loads onto the CPU and
// back; parameters on two devices are an Error.
BOOST_AUTO_TEST_CASE(lbfgs_on_the_device) {
  if (skip_without_gpu()) return;
  for (const bool wolfe : {false, true}) {
    BOOST_TEST_CONTEXT((wolfe ? "strong_wolfe" : "fixed step")) {
      optim::LBFGSOptions o{.lr = wolfe ? 1.0 : 0.2, .max_iter = 6, .history_size = 3};
      if (wolfe) o.line_search_fn = "strong_wolfe";
      const Tensor w0 = randn({4, 3}, kFloat64), b0 = randn({4}, kFloat64);
      const Tensor x = randn({6, 3}, kFloat64), y = randn({6, 4}, kFloat64);
      // w is used through its transpose, so its storage is (3, 4) and the parameter a view
      const auto make = [&](const Device& d) {
        return std::vector<Tensor>{
            w0.transpose(0, 1).contiguous().to(d).transpose(0, 1).requires_grad_(),
            b0.clone().to(d).requires_grad_()};
      };
      std::vector<Tensor> host = make(kCPU), device = make(Device("cuda"));
      BOOST_TEST(!device[0].is_contiguous());
      optim::LBFGS opt_host(host, o), opt_device(device, o);
      const auto closure = [](optim::LBFGS& opt, const std::vector<Tensor>& p, const Tensor& in,
                              const Tensor& target) {
        return [&opt, p, in, target] {
          opt.zero_grad();
          const Tensor r = matmul(in, p[0].transpose(0, 1)) + p[1] - target;
          Tensor loss = (tanh(r) * r).mean();
          loss.backward();
          return loss;
        };
      };
      for (int call = 0; call < 3; ++call) {
        const Tensor lh = opt_host.step(closure(opt_host, host, x, y));
        const Tensor ld = opt_device.step(closure(opt_device, device, x.cuda(), y.cuda()));
        BOOST_TEST(ld.is_cuda());
        expect_close(ld.cpu(), lh, 1e-10, 1e-12, fmt::format("loss of call {}", call));
        BOOST_TEST(opt_device.func_evals() == opt_host.func_evals());
        BOOST_TEST(opt_device.n_iter() == opt_host.n_iter());
        for (size_t i = 0; i < host.size(); ++i)
          expect_close(device[i].cpu(), host[i], 1e-10, 1e-12, fmt::format("parameter {}", i));
      }
      // the state: vectors on the device, the CPU's values; it loads onto either device
      const optim::StateDict sh = opt_host.state_dict(), sd = opt_device.state_dict();
      BOOST_TEST_REQUIRE(sh.size() == sd.size());
      for (size_t k = 0; k < sh.size(); ++k) {
        BOOST_TEST(sd[k].first == sh[k].first);
        const bool vector = sd[k].first.starts_with("state.0.") && sd[k].second.dim() == 1;
        BOOST_TEST(sd[k].second.is_cuda() == vector, sd[k].first);
        expect_close(sd[k].second.cpu(), sh[k].second, 1e-9, 1e-12, sd[k].first);
      }
      optim::LBFGS back_on_cpu(make(kCPU), o), again_on_device(make(Device("cuda")), o);
      back_on_cpu.load_state_dict(sd);
      again_on_device.load_state_dict(sh);
      for (const auto& [name, t] : again_on_device.state_dict())
        if (name == "state.0.d") BOOST_TEST(t.is_cuda());
    }
  }
  expect_error(
      [] {
        optim::LBFGS(
            {zeros({2}).requires_grad_(), zeros({2}, kFloat32, Device("cuda")).requires_grad_()});
      },
      {"LBFGS:", "parameter 1 is on cuda:0", "parameter 0 on cpu", "one device"});
}

// A training checkpoint (model, Adam's moments and step counts, a schedule, the generator)
// written by a CPU run loads onto a device model and optimizer, and one written on the device
// loads back onto the CPU: either way the resumed run takes the uninterrupted run's steps.
BOOST_AUTO_TEST_CASE(checkpoints_move_between_devices) {
  if (skip_without_gpu()) return;
  const fs::path file = fs::temp_directory_path() / "ember_test_device_checkpoint.safetensors";
  const Tensor x = randn({6, 3}), y = randn({6, 2});
  // a Linear made on the host (the same weights for the same seed), moved to d, and its Adam
  struct Run {
    static std::shared_ptr<nn::Linear> on(const Device& d) {
      auto m = std::make_shared<nn::Linear>(3, 2);
      m->to(d);
      return m;
    }
    explicit Run(const Device& d) : model(on(d)), opt(model->parameters(), {.lr = 0.05}) {}
    std::shared_ptr<nn::Linear> model;
    optim::Adam opt;
  };
  const auto step = [&](Run& r) {
    const Device d = r.model->weight.device();
    r.opt.zero_grad();
    mse_loss(r.model->forward(x.to(d)), y.to(d)).backward();
    r.opt.step();
  };
  for (const bool from_cpu : {true, false}) {
    BOOST_TEST_CONTEXT((from_cpu ? "CPU -> device" : "device -> CPU")) {
      manual_seed(11);
      Run straight(kCPU);
      manual_seed(11);
      Run first(from_cpu ? kCPU : kCUDA);
      for (int i = 0; i < 3; ++i) step(straight), step(first);
      save_checkpoint(file.string(), *first.model, first.opt);
      Run resumed(from_cpu ? kCUDA : kCPU);
      load_checkpoint(file.string(), *resumed.model, resumed.opt);
      BOOST_TEST(resumed.model->weight.is_cuda() == from_cpu);
      for (int i = 0; i < 3; ++i) step(straight), step(resumed);
      expect_close(resumed.model->weight.cpu(), straight.model->weight, 1e-5, 1e-6, "weight");
      expect_close(resumed.model->bias.cpu(), straight.model->bias, 1e-5, 1e-6, "bias");
    }
  }
  fs::remove(file);
}

// The copy task (examples/copy_task.h) trained for 20 steps on a device and on the CPU from the
// same initial weights and seeds (dropout's masks included): the same losses to Float32
// tolerance, the check that a training script moves to a GPU by moving its model and
// batches.
BOOST_AUTO_TEST_CASE(copy_task_training_matches_the_cpu) {
  if (skip_without_gpu()) return;
  const int64_t V = 11;
  manual_seed(3);
  const auto host_model = nn::make_model(V, V, 2, 32, 64, 4, 0.1);
  const auto device_model = nn::make_model(V, V, 2, 32, 64, 4, 0.1);
  {
    NoGradGuard no_grad;
    const auto from = host_model->parameters(), to = device_model->parameters();
    for (size_t i = 0; i < from.size(); ++i) Tensor(to[i]).copy_(from[i]);
  }
  device_model->to(kCUDA);
  nn::LabelSmoothing host_criterion(V, 0, 0.1), device_criterion(V, 0, 0.1);
  copy_task::SimpleLossCompute host_loss(*host_model->generator, host_criterion);
  copy_task::SimpleLossCompute device_loss(*device_model->generator, device_criterion);
  optim::AdamOptions o{1e-3};
  o.beta2 = 0.98, o.eps = 1e-9;
  optim::Adam host_opt(host_model->parameters(), o), device_opt(device_model->parameters(), o);
  manual_seed(4);
  const std::vector<nn::Batch> data = copy_task::data_gen(V, 8, 20);
  std::vector<double> host_losses, device_losses;
  for (size_t i = 0; i < data.size(); ++i) {
    const auto step = [&](nn::EncoderDecoder& model, copy_task::SimpleLossCompute& compute,
                          optim::Adam& opt, const nn::Batch& b) {
      manual_seed(100 + i);  // the same dropout keys on both
      const Tensor out = model.forward(b.src, b.tgt, b.src_mask, b.tgt_mask);
      const copy_task::LossOutput loss = compute(out, b.tgt_y, static_cast<double>(b.ntokens));
      loss.loss.backward();
      opt.step();
      opt.zero_grad();
      return loss.total;
    };
    host_losses.push_back(step(*host_model, host_loss, host_opt, data[i]));
    device_losses.push_back(step(*device_model, device_loss, device_opt, data[i].to(kCUDA)));
  }
  for (size_t i = 0; i < data.size(); ++i)
    BOOST_TEST(device_losses[i] == host_losses[i], boost::test_tools::tolerance(1e-4));
  BOOST_TEST(host_losses.back() < host_losses.front());  // it trained
  for (const Tensor& p : device_model->parameters()) BOOST_TEST(p.is_cuda());
}

// A training step of the copy task's model on the device, in steady state (issue 35's speed
// section): no block asked of the driver, the same kernels and products every step, and no wait
// of the host for the device (no value asked for: the loss stays on the device).
BOOST_AUTO_TEST_CASE(a_training_step_in_steady_state) {
  if (skip_without_gpu()) return;
  const int64_t V = 11;
  manual_seed(5);
  const auto model = nn::make_model(V, V, 2, 32, 64, 4, 0.1);
  model->to(kCUDA);
  nn::LabelSmoothing criterion(V, 0, 0.1);
  optim::Adam opt(model->parameters(), {.lr = 1e-3, .beta2 = 0.98, .eps = 1e-9});
  const nn::Batch b = copy_task::data_gen(V, 8, 1)[0].to(kCUDA);
  const double ntokens = static_cast<double>(b.ntokens);
  const auto step = [&] {
    const Tensor logits =
        model->generator->forward(model->forward(b.src, b.tgt, b.src_mask, b.tgt_mask));
    const Tensor loss =
        criterion(logits.contiguous().view({-1, V}), b.tgt_y.contiguous().view({-1})) / ntokens;
    loss.backward();
    opt.step();
    opt.zero_grad();
  };
  for (int i = 0; i < 3; ++i) step();  // the allocator's cache and Adam's state filled
  const cuda::MemoryStats memory = cuda::memory_stats();
  std::vector<cuda::LaunchStats> stats = {cuda::launch_stats()};
  for (int i = 0; i < 3; ++i) {
    step();
    stats.push_back(cuda::launch_stats());
  }
  BOOST_TEST(cuda::memory_stats().driver_allocs == memory.driver_allocs);
  for (size_t i = 1; i < stats.size(); ++i) {
    BOOST_TEST_MESSAGE("step: " << stats[i].kernels - stats[i - 1].kernels << " kernels, "
                                << stats[i].products - stats[i - 1].products << " products, "
                                << stats[i].host_waits - stats[i - 1].host_waits << " host waits");
    BOOST_TEST(stats[i].kernels - stats[i - 1].kernels == stats[1].kernels - stats[0].kernels);
    BOOST_TEST(stats[i].products - stats[i - 1].products > 0);
    BOOST_TEST(stats[i].host_waits - stats[i - 1].host_waits == 0);
  }
  // a value asked for is a wait; synchronize() is one
  const int64_t before = cuda::launch_stats().host_waits;
  (void)b.src.sum().item<int64_t>();
  cuda::synchronize();
  BOOST_TEST(cuda::launch_stats().host_waits == before + 2);
}

// cuda/elementwise.h repeats graph/dtype.h's cast_value and ops/elementwise.cpp's wrapping
// integer arithmetic (a leaf below the core, it includes no Ember header): this pins them to the
// CPU's on the values where a plain C++ conversion or operation would be undefined (NaN, ±inf and
// out-of-range floats to Int64, overflowing Int64 sums, differences and products), bit for bit.
// On the emulated device x86 happens to agree even without them; a GPU does not (its conversion
// saturates 1e19 to INT64_MAX where the CPU gives INT64_MIN), so this is a GPU run's check.
BOOST_AUTO_TEST_CASE(conversions_and_integer_wrapping_match_the_cpu) {
  if (skip_without_gpu()) return;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> edges = {nan,    inf,     -inf, 1e19, -1e19, 0x1p63, -0x1p63,
                                     9.2e18, -9.2e18, 2.5,  -2.5, -0.0,  1e-300};
  for (DType dtype : {kFloat64, kFloat32}) {
    const Tensor x = from_vector(edges, {static_cast<int64_t>(edges.size())}, kFloat64).to(dtype);
    expect_equal(x.cuda().to(kInt64).cpu(), x.to(kInt64));
    expect_equal(x.cuda().to(kBool).cpu(), x.to(kBool));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const Tensor a =
      from_vector(std::vector<int64_t>{kMax, kMin, 3000000000000000000, kMin, -7}, {5}, kCPU);
  const Tensor b = from_vector(std::vector<int64_t>{1, 1, 4, -1, kMax}, {5}, kCPU);
  const Tensor da = a.cuda(), db = b.cuda();
  expect_equal((da + db).cpu(), a + b);
  expect_equal((da - db).cpu(), a - b);
  expect_equal((da * db).cpu(), a * b);
  expect_equal((da * 4.0).cpu(), a * 4.0);
  expect_equal(neg(da).cpu(), neg(a));
  // and back: Int64 to the floating types rounds as the CPU's
  expect_equal(da.to(kFloat32).cpu(), a.to(kFloat32));
  expect_equal(da.to(kFloat64).cpu(), a.to(kFloat64));
}

// Indices out of range on a device (Note [Checks on the device]): the op queues its kernel
// without waiting to look at them, and the host's next wait for the device (here a copy to the
// host, or synchronize) throws an Error naming the op and the index; then the device is usable.
BOOST_AUTO_TEST_CASE(bad_indices_are_reported_at_the_next_wait) {
  if (skip_without_gpu()) return;
  const Tensor x = randn({4, 3}).cuda(), w = randn({5, 2}).cuda();
  const Tensor bad = from_vector(std::vector<int64_t>{1, 7, 0}, {3}, kCUDA);
  const Tensor bad_2d = from_vector(std::vector<int64_t>{0, 1, 2, -2, 0, 1}, {2, 3}, kCUDA);
  nn::LabelSmoothing smoothing(3, 0, 0.1);
  const std::vector<std::pair<std::function<Tensor()>, std::string>> cases = {
      {[&] { return index_select(x, 0, bad); },
       "index_select: index 7 out of range for dim 0 of size 4"},
      {[&] { return gather(x, 1, bad_2d); }, "gather: index -2 is out of bounds for dim 1"},
      {[&] {
         return scatter_add(x, 1, bad_2d, ones({2, 3}).cuda());
       },
       "scatter_add: index -2 is out of bounds"},
      {[&] { return embedding(w, bad); }, "embedding: index 7 out of range for 5 rows"},
      {[&] {
         return cross_entropy(x, from_vector(std::vector<int64_t>{0, 1, 3, 2}, {4}, kCUDA));
       },
       "cross_entropy: target 3 out of range for 3 classes"},
      {[&] {
         return nll_loss(x, from_vector(std::vector<int64_t>{0, -5, 1, 2}, {4}, kCUDA));
       },
       "nll_loss: target -5 out of range"},
      {[&] {
         return smoothing(log_softmax(x, 1),
                          from_vector(std::vector<int64_t>{0, 1, 9, 2}, {4}, kCUDA));
       },
       "LabelSmoothing: target 9 out of range for 3 classes"}};
  for (const auto& [f, words] : cases) {
    const int64_t waits = cuda::launch_stats().host_waits;
    const Tensor out = f();  // queued: no wait, no Error yet
    BOOST_TEST(cuda::launch_stats().host_waits == waits, words);
    expect_error([&] { (void)out.cpu(); }, {words, "found on cuda:0"});
    (void)out.cpu();  // reported once: the device goes on
    (void)f();
    expect_error([] { cuda::synchronize(); }, {words, "found on cuda:0"});
    cuda::synchronize();
  }
  // good indices: nothing reported
  (void)index_select(x, 0, from_vector(std::vector<int64_t>{3, 0}, {2}, kCUDA)).cpu();
  cuda::synchronize();
}

BOOST_AUTO_TEST_CASE(caching_allocator_sizes) {
  using A = CachingAllocator<FakeDriver>;
  BOOST_TEST(A::rounded_size(0) == 512u);
  BOOST_TEST(A::rounded_size(1) == 512u);
  BOOST_TEST(A::rounded_size(512) == 512u);
  BOOST_TEST(A::rounded_size(513) == 1024u);
  BOOST_TEST(A::rounded_size((1u << 20) - 1) == size_t(1) << 20);
  BOOST_TEST(A::rounded_size(1u << 20) == size_t(1) << 20);
  BOOST_TEST(A::rounded_size((1u << 20) + 1) == (size_t(5) << 18));  // 1.25 MiB
  BOOST_TEST(A::rounded_size(3u << 20) == (size_t(3) << 20));
  BOOST_TEST(A::rounded_size((3u << 20) + 1) == (size_t(7) << 19));  // 3.5 MiB
  BOOST_TEST(A::rounded_size(size_t(100) << 20) == (size_t(112) << 20));
  // never less than asked, at most a quarter more above 1 MiB
  for (size_t n = 1; n < (size_t(1) << 34); n = n * 3 + 7) {
    const size_t r = A::rounded_size(n);
    BOOST_TEST(r >= n);
    if (n >= (1u << 20)) BOOST_TEST(r <= n + n / 4 + 1, n);
  }
}

BOOST_AUTO_TEST_CASE(caching_allocator_reuses_and_frees_on_demand) {
  std::set<void*> alive;
  {
    CachingAllocator<FakeDriver> a{FakeDriver(alive, 10000)};
    // A training step's pattern: the same sizes each iteration; after the first, no driver call.
    for (int step = 0; step < 5; ++step) {
      void* x = a.allocate(1000);
      void* y = a.allocate(3000);
      void* z = a.allocate(1000);
      BOOST_TEST(x != z);
      a.free(y);
      void* w = a.allocate(2900);  // rounds to y's 3072: y's block again
      BOOST_TEST(w == y);
      a.free(x), a.free(z), a.free(w);
    }
    AllocatorStats s = a.stats();
    BOOST_TEST(s.driver_allocs == 3);  // 1024, 1024, 3072
    BOOST_TEST(s.requests == 20);
    BOOST_TEST(s.cache_hits == 17);
    BOOST_TEST(s.allocated_bytes == 0u);
    BOOST_TEST(s.reserved_bytes == 5120u);
    BOOST_TEST(a.backend().in_use == 5120u);
    // Out of memory with blocks cached: they go back to the driver, and the request is served.
    void* big = a.allocate(9000);
    s = a.stats();
    BOOST_TEST(s.driver_frees == 3);
    BOOST_TEST(s.reserved_bytes == 9216u);
    BOOST_TEST(s.allocated_bytes == 9216u);
    // Out of memory with nothing cached: an Error naming the device and the sizes.
    expect_error([&] { a.allocate(2000); }, {"fake:0", "out of memory", "2000 bytes"});
    a.free(big);
    expect_error([&] { a.free(big); }, {"fake:0", "did not hand out"});
    int local = 0;
    expect_error([&] { a.free(&local); }, {"fake:0", "did not hand out"});
    a.empty_cache();
    BOOST_TEST(a.stats().reserved_bytes == 0u);
    BOOST_TEST(alive.empty());
    a.allocate(100);  // held at the allocator's end, which returns nothing (a device's lives
                      // as long as the process)
  }
  BOOST_TEST(alive.size() == 1u);
  for (void* p : alive) std::free(p);
}

BOOST_AUTO_TEST_CASE(caching_allocator_threads) {
  // Four threads allocating and freeing at once: every block handed out is distinct while held,
  // and the books balance at the end.
  std::set<void*> alive;
  CachingAllocator<FakeDriver> a{FakeDriver(alive)};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&a, t] {
      std::vector<void*> held;
      for (int i = 0; i < 2000; ++i) {
        held.push_back(a.allocate(512 * (1 + (i + t) % 7)));
        std::memset(held.back(), t, 512);
        if (held.size() > 5) {
          a.free(held.front());
          held.erase(held.begin());
        }
      }
      for (void* p : held) a.free(p);
    });
  for (std::thread& t : threads) t.join();
  const AllocatorStats s = a.stats();
  BOOST_TEST(s.allocated_bytes == 0u);
  BOOST_TEST(s.requests == 8000);
  BOOST_TEST(s.driver_allocs + s.cache_hits == s.requests);
  BOOST_TEST(s.driver_allocs <= 4 * 6 * 7);  // at most what four threads hold at once, per size
  a.empty_cache();
  BOOST_TEST(alive.empty());
}

BOOST_AUTO_TEST_CASE(seeds) {
  // The devices' seed is kept with or without a device, and ember::manual_seed sets it too.
  cuda::manual_seed(42);
  BOOST_TEST(cuda::initial_seed() == 42u);
  manual_seed(7);
  BOOST_TEST(cuda::initial_seed() == 7u);
  manual_seed(0);
}

BOOST_AUTO_TEST_SUITE_END()
