// Devices (issue 35, part 1): Device's names and errors, every tensor's device, to(Device),
// creation on a device, Module::to(Device), and what a build or machine without a usable GPU
// says when asked for one (Note [CUDA availability] in graph/device.h). The cases that need no
// GPU skip with one line where there is one.
#include <sstream>

#include "helpers.h"

using namespace ember;
using namespace ember::testing;

namespace {

// The same dtype, shape and values, exactly.
void expect_equal(const Tensor& a, const Tensor& b) {
  BOOST_TEST((a.dtype() == b.dtype()), fmt::format("dtype {} vs {}", a.dtype(), b.dtype()));
  expect_close(a, b, 0, 0);
}

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
  // A refused move leaves the module as it was.
  nn::Linear lin(3, 2);
  const Tensor before = lin.weight.clone();
  expect_error([&] { lin.to(kCUDA); }, {"to", "cuda:0", why});
  expect_error([&] { lin.to(kCUDA, kFloat64); }, {"to", "cuda:0"});
  BOOST_TEST((lin.weight.device() == kCPU));
  BOOST_TEST((lin.weight.dtype() == kFloat32));
  expect_equal(lin.weight, before);
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
