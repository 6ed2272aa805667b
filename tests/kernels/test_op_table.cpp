// The op table's correctness mode (tests/kernels/op_table/op_table.hpp): every case runs on the
// CPU backend (guard bands, NaN / inf checks) and, with a GPU, on the CUDA backend, compared
// with its CPU twin by NMSE. Then the harness's own checks: a wrong twin, an overwritten guard
// band and an unwritten output are each detected, and the table is consistent across sizes and
// covers the ops it promises to.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>

#include "tests/kernels/op_table/op_table.hpp"

namespace rp::optable {
namespace {

const std::vector<OpCase>& test_table() {
  static const std::vector<OpCase> t = op_table(Size::test);
  return t;
}

std::unique_ptr<Device> cpu_device() {
  DeviceOptions o;
  o.capacity_bytes = size_t(4) << 30;
  auto d = make_cpu_device(0, o);
  d->ops().set_num_threads(2);
  return d;
}

// One CPU and one CUDA device for all cases (opening a GPU costs more than most cases), closed
// when the tests end.
class Devices : public ::testing::Environment {
 public:
  static Device& cpu() {
    if (!cpu_) cpu_ = cpu_device();
    return *cpu_;
  }
  static Device& cuda() {
    if (!cuda_) {
      DeviceOptions o;
      o.capacity_bytes = size_t(24) << 30;
      cuda_ = make_cuda_device(0, o);
    }
    return *cuda_;
  }
  void TearDown() override {
    cuda_.reset();
    cpu_.reset();
  }

 private:
  static inline std::unique_ptr<Device> cpu_, cuda_;
};
[[maybe_unused]] ::testing::Environment* const kDevices = ::testing::AddGlobalTestEnvironment(new Devices);

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "\n  " + x;
  return s;
}

class OpTableTest : public ::testing::TestWithParam<size_t> {};

TEST_P(OpTableTest, CudaMatchesCpuTwin) {
  const OpCase& c = test_table()[GetParam()];
  // inputs rounded to bf16, the CUDA backend's storage, so both backends read the same values
  const auto inputs = make_inputs(c, DType::bf16);
  const Outcome ref = run_case(Devices::cpu(), c, inputs, false);
  ASSERT_TRUE(ref.problems.empty()) << c.name << " on the CPU backend:" << joined(ref.problems);
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  if (c.cuda_unavailable) {
    const std::string why = c.cuda_unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  const Outcome got = run_case(Devices::cuda(), c, inputs, true);
  ASSERT_TRUE(got.problems.empty()) << c.name << " on the CUDA backend:" << joined(got.problems);
  const auto bad = compare(c, got, ref);
  EXPECT_TRUE(bad.empty()) << c.name << " (" << c.shape << "), CUDA against the CPU twin:" << joined(bad);
}

std::vector<size_t> all_cases() {
  std::vector<size_t> v(test_table().size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

INSTANTIATE_TEST_SUITE_P(OpTable, OpTableTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return test_table()[i.param].name;
                         });

const OpCase& find(const std::string& name) {
  for (const OpCase& c : test_table())
    if (c.name == name) return c;
  throw std::out_of_range("no op-table case " + name);
}

// The same case with run replaced.
OpCase with_run(const OpCase& c, RunFn run) {
  OpCase w = c;
  w.run = std::move(run);
  return w;
}

TEST(OpTableHarness, WrongTwinIsDetected) {
  const OpCase& c = find("swiglu_fwd");
  const auto in = make_inputs(c, DType::bf16);
  auto cpu = cpu_device();
  const Outcome good = run_case(*cpu, c, in, false);
  ASSERT_TRUE(good.problems.empty()) << joined(good.problems);
  EXPECT_TRUE(compare(c, good, good).empty());
  // a twin computing geglu instead of swiglu: finite, in range, and wrong
  const int64_t n = c.tensors[2].n;
  const OpCase wrong = with_run(c, [n](Ops& o, const Buffers& b) { o.geglu_fwd(b[0], b[1], b[2], n); });
  const Outcome bad = run_case(*cpu, wrong, in, false);
  ASSERT_TRUE(bad.problems.empty()) << joined(bad.problems);
  const auto diff = compare(c, bad, good);
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_NE(diff[0].find("h: NMSE"), std::string::npos) << diff[0];
  // a one-element error in a GEMM still exceeds a tight bound
  const OpCase& g = find("linear_fwd_qproj");
  const auto gin = make_inputs(g, DType::bf16);
  const Outcome gr = run_case(*cpu, g, gin, false);
  const OpCase off_by_one = with_run(g, [run = g.run](Ops& o, const Buffers& b) {
    run(o, b);
    o.fill(o.dtype(), b[2], 1, 100.f);
  });
  const Outcome go = run_case(*cpu, off_by_one, gin, false);
  EXPECT_FALSE(compare(g, go, gr).empty());
}

TEST(OpTableHarness, OverwrittenGuardBandIsDetected) {
  const OpCase& c = find("swiglu_fwd");
  const auto in = make_inputs(c, DType::bf16);
  auto cpu = cpu_device();
  const int64_t n = c.tensors[2].n;
  // one element past the end, then one before the start (inside the guard bands: no UB)
  const OpCase after = with_run(c, [run = c.run, n](Ops& o, const Buffers& b) {
    run(o, b);
    o.fill(o.dtype(), b[2], n + 1, 0.5f);
  });
  const Outcome a = run_case(*cpu, after, in, false);
  ASSERT_EQ(a.problems.size(), 1u) << joined(a.problems);
  EXPECT_NE(a.problems[0].find("guard band after"), std::string::npos) << a.problems[0];
  const OpCase before = with_run(c, [run = c.run](Ops& o, const Buffers& b) {
    run(o, b);
    o.fill(o.dtype(), b.f(2) - 1, 1, 0.5f);  // the CPU backend stores f32
  });
  const Outcome bf = run_case(*cpu, before, in, false);
  ASSERT_EQ(bf.problems.size(), 1u) << joined(bf.problems);
  EXPECT_NE(bf.problems[0].find("guard band before"), std::string::npos) << bf.problems[0];
}

TEST(OpTableHarness, UnwrittenOrNonFiniteOutputIsDetected) {
  const OpCase& c = find("swiglu_fwd");
  const auto in = make_inputs(c, DType::bf16);
  auto cpu = cpu_device();
  const int64_t n = c.tensors[2].n;
  const OpCase half = with_run(c, [n](Ops& o, const Buffers& b) { o.swiglu_fwd(b[0], b[1], b[2], n / 2); });
  const Outcome h = run_case(*cpu, half, in, false);
  ASSERT_EQ(h.problems.size(), 1u) << joined(h.problems);
  EXPECT_NE(h.problems[0].find(std::to_string(n - n / 2) + " of " + std::to_string(n) + " values NaN"),
            std::string::npos)
      << h.problems[0];
  const OpCase inf = with_run(c, [run = c.run](Ops& o, const Buffers& b) {
    run(o, b);
    o.fill(o.dtype(), b[2], 3, std::numeric_limits<float>::infinity());
  });
  const Outcome f = run_case(*cpu, inf, in, false);
  ASSERT_EQ(f.problems.size(), 1u) << joined(f.problems);
  EXPECT_NE(f.problems[0].find("3 of"), std::string::npos) << f.problems[0];
  // an op that throws becomes a problem, not a crash
  const OpCase thrower = with_run(c, [](Ops&, const Buffers&) { throw std::invalid_argument("deliberate"); });
  const Outcome t = run_case(*cpu, thrower, in, false);
  ASSERT_EQ(t.problems.size(), 1u);
  EXPECT_NE(t.problems[0].find("threw: deliberate"), std::string::npos) << t.problems[0];
}

TEST(OpTableHarness, SizesShareNamesAndWork) {
  const std::vector<OpCase> big = op_table(Size::bench);
  const auto& small = test_table();
  ASSERT_EQ(big.size(), small.size());
  std::set<std::string> names;
  for (size_t i = 0; i < big.size(); ++i) {
    EXPECT_EQ(big[i].name, small[i].name);
    EXPECT_EQ(big[i].op, small[i].op) << big[i].name;
    EXPECT_TRUE(names.insert(big[i].name).second) << "duplicate case " << big[i].name;
    const std::string& n = big[i].name;
    EXPECT_TRUE(std::all_of(n.begin(), n.end(), [](char ch) {
      return std::isalnum((unsigned char)ch) || ch == '_';
    })) << n;
    EXPECT_TRUE(big[i].run) << n;
    EXPECT_GT(big[i].flops + case_bytes(big[i], DType::bf16), 0.0) << n;
    if (big[i].bound != Bound::memory) {
      EXPECT_GT(big[i].flops, 0.0) << n;
    }
  }
}

TEST(OpTableHarness, CoversTheBenchmarkedOps) {
  std::set<std::string> ops;
  for (const OpCase& c : test_table()) {
    size_t p = 0;  // "a+b+c" names several
    for (size_t q; (q = c.op.find('+', p)) != std::string::npos; p = q + 1) ops.insert(c.op.substr(p, q - p));
    ops.insert(c.op.substr(p));
  }
  for (const char* op : {"linear_fwd",
                         "linear_bwd_input",
                         "linear_bwd_weight",
                         "linear_fwd_add",
                         "linear_fwd_ld",
                         "linear_bwd_input_ld",
                         "linear_bwd_weight_ld",
                         "embedding_fwd",
                         "embedding_bwd",
                         "lm_head_cross_entropy",
                         "rmsnorm_fwd",
                         "rmsnorm_bwd",
                         "rope_fwd",
                         "rope_bwd",
                         "qk_norm_rope_fwd",
                         "qk_norm_rope_bwd",
                         "swiglu_fwd",
                         "swiglu_bwd",
                         "geglu_fwd",
                         "geglu_bwd",
                         "add",
                         "copy",
                         "cast",
                         "add_into",
                         "fill",
                         "dropout",
                         "dequantize",
                         "attention_fwd",
                         "attention_bwd",
                         "attention_fwd_v",
                         "attention_bwd_v",
                         "moe_route",
                         "moe_route_bwd",
                         "moe_sort",
                         "gather_rows",
                         "moe_combine",
                         "moe_combine_bwd",
                         "moe_gather_bwd",
                         "grouped_linear_fwd",
                         "grouped_linear_fwd_add",
                         "grouped_linear_bwd_input",
                         "grouped_linear_bwd_weight",
                         "fp8_scale",
                         "fp8_scale_rows",
                         "fp8_quantize",
                         "fp8_quantize_rows",
                         "fp8_quantize_transposed",
                         "fp8_quantize_transposed_padded",
                         "fp8_quantize_both",
                         "rmsnorm_fwd_fp8_scale",
                         "rmsnorm_fwd_fp8_rows",
                         "swiglu_fwd_fp8_scale",
                         "swiglu_bwd_fp8_scale",
                         "gemm_fp8",
                         "gemm_fp8_accumulate_f32"})
    EXPECT_TRUE(ops.count(op)) << "no op-table case runs " << op;
}

TEST(OpTableHarness, NmseIsNormalizedSquaredError) {
  EXPECT_EQ(nmse({1, 2}, {1, 2}), 0.0);
  EXPECT_EQ(nmse({0, 0}, {0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(nmse({1, 2}, {1, 4}), 4.0 / 17.0);
  EXPECT_TRUE(std::isinf(nmse({1}, {1, 2})));
  EXPECT_TRUE(std::isinf(nmse({1, std::numeric_limits<float>::quiet_NaN()}, {1, 2})));
  EXPECT_TRUE(std::isinf(nmse({1}, {0})));
}

}  // namespace
}  // namespace rp::optable
