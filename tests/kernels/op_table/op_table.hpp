// The op table: one list of kernel cases that both the correctness tests
// (tests/kernels/test_op_table.cpp) and the benchmark (bench/ops.cpp, bench_ops) run.
//
// A case names one method of the Ops interface (kernels/ops.hpp), or a short fixed sequence of
// them (the LoRA adapter's order of calls), with
//  - its tensors: kind (the backend's compute dtype, f32, i32 or FP8/byte codes), element
//    count, role (input, output, in-out, scratch, or "derived": filled on each backend by the
//    case's prepare step, e.g. the forward's o and lse before an attention backward), where it
//    lives (device, or host memory for the arguments the interface takes on the host), and
//    how its initial values are made (a seeded fill; the seed is a hash of the case name and
//    the tensor's index, so every run of a case sees the same values);
//  - its work: FLOPs (2*M*N*K per GEMM, ...) and bytes moved (each input read once, each
//    output written once, in-out tensors twice, unless the case says otherwise), and the
//    ceiling its rate is set against (bf16 GEMM, FP8 GEMM or memory bandwidth);
//  - how it runs on a backend: run(Ops&, Buffers&), issued on the device's compute stream;
//    optional CUDA-only knobs (attention implementation, grouped-GEMM mode) set before and
//    reset after.
// Every case exists at two sizes with the same names: Size::test (small, so the CPU twin runs
// in well under a second) and Size::bench (the model shapes of docs/gpu.md: Qwen3-1.7B at
// 8192 tokens, LLaMA-3.1-8B LoRA, Qwen3-30B-A3B experts, GPT-OSS attention).
//
// The harness (run_case) allocates every tensor with guard bands (kGuardBytes of a sentinel
// pattern before and after each output), poisons outputs with NaN (codes: 0x7f, an FP8 NaN;
// i32: 0x7f7f7f7f), runs prepare + run, and reports any touched guard byte and any NaN / inf
// left in an output. compare() gives the normalized mean squared error
//   NMSE = sum_i (a_i - b_i)^2 / sum_i b_i^2   (0 when both are all zero)
// of each compared output between two runs (the CUDA backend against its CPU twin).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.hpp"
#include "kernels/dtype.hpp"
#include "kernels/fp8.hpp"
#include "kernels/ops.hpp"

namespace rp::optable {

enum class Size : uint8_t { test, bench };
/// compute: the backend's Ops::dtype() (bf16 on the GPU, f32 on the CPU); u8: one byte per
/// element (FP8 codes, or raw bytes of a stored weight format).
enum class Kind : uint8_t { compute, f32, i32, u8 };
enum class Role : uint8_t { in, out, inout, scratch, derived };
enum class Place : uint8_t { device, host };
/// The ceiling a case's rate is set against (bench/ceilings.hpp).
enum class Bound : uint8_t { gemm_bf16, gemm_fp8, memory };

/// Fills v (already sized to the tensor's element count) from seed. Values of i32 / u8
/// tensors are whole numbers in their type's range.
using Fill = std::function<void(std::vector<float>& v, uint64_t seed)>;

struct Tensor {
  std::string name;
  Kind kind = Kind::compute;
  int64_t n = 0;
  Role role = Role::in;
  Fill fill;  ///< in / inout (null: zeros)
  Place place = Place::device;
  Fp8Format codes = Fp8Format::e4m3;  ///< u8 outputs: decoded in this format for checks
  double nmse = -1;                   ///< compared outputs: bound (< 0: the case's)
  bool compare = true;                ///< out / inout: compared between backends
  bool finite = true;                 ///< out / inout: NaN / inf is an error
};

/// The pointers of one allocation of a case's tensors, in the order of OpCase::tensors.
class Buffers {
 public:
  explicit Buffers(std::vector<void*> p) : p_(std::move(p)) {}
  void* operator[](size_t i) const { return p_.at(i); }
  float* f(size_t i) const { return static_cast<float*>(p_.at(i)); }
  int32_t* i(size_t i) const { return static_cast<int32_t*>(p_.at(i)); }
  uint8_t* u(size_t i) const { return static_cast<uint8_t*>(p_.at(i)); }

 private:
  std::vector<void*> p_;
};

using RunFn = std::function<void(Ops&, const Buffers&)>;

struct OpCase {
  std::string name;   ///< unique: letters, digits, '_' (a GTest parameter name)
  std::string op;     ///< the Ops method(s) measured, e.g. "linear_fwd"
  std::string shape;  ///< human-readable shape and dtype
  std::vector<Tensor> tensors;
  RunFn run;
  RunFn prepare;  ///< optional, once per allocation before run
  /// optional: what the CPU backend runs instead of run, for a CUDA-only helper (the same result
  /// built from primitive ops, the helper's CPU twin)
  RunFn twin;
  std::function<void(Ops&)> cuda_on;   ///< optional CUDA-only setting, applied before
  std::function<void(Ops&)> cuda_off;  ///< ... and undone after (both inside a launch)
  /// optional: why this CUDA variant cannot run on the device at hand ("" = it can), e.g. cuDNN
  /// attention in a build without cuDNN; such a case is skipped on the GPU, saying why.
  std::function<std::string()> cuda_unavailable;
  double flops = 0;
  double bytes = -1;  ///< < 0: derived from the tensors (derived_bytes)
  Bound bound = Bound::memory;
  double nmse = 1e-4;  ///< default bound of the compared outputs
  int reps = 10;       ///< benchmark: calls per timed trial
};

/// Every case at the given size, in a fixed order (names identical across sizes).
std::vector<OpCase> op_table(Size s);
// The families op_table() concatenates (op_cases_*.cpp).
void add_dense_cases(std::vector<OpCase>& out, Size s);
void add_elementwise_cases(std::vector<OpCase>& out, Size s);
void add_attention_cases(std::vector<OpCase>& out, Size s);
void add_moe_cases(std::vector<OpCase>& out, Size s);
void add_fp8_cases(std::vector<OpCase>& out, Size s);

// ---- fills -------------------------------------------------------------------------------
/// scale * approximately normal values (Irwin-Hall sum of four uniforms, xorshift64).
Fill normal(float scale = 1.f);
/// Whole numbers uniform in [lo, hi].
Fill ints(int64_t lo, int64_t hi);
/// Every value v.
Fill constant(float v);

// ---- tensor shorthands of the case files ------------------------------------------------
inline Tensor input(std::string name, Kind k, int64_t n, Fill f = normal()) {
  return Tensor{std::move(name), k, n, Role::in, std::move(f)};
}
inline Tensor output(std::string name, Kind k, int64_t n, double bound = -1) {
  Tensor t{std::move(name), k, n, Role::out};
  t.nmse = bound;
  return t;
}
inline Tensor inout(std::string name, Kind k, int64_t n, Fill f = normal(), double bound = -1) {
  Tensor t{std::move(name), k, n, Role::inout, std::move(f)};
  t.nmse = bound;
  return t;
}
/// bytes of device scratch (not compared, not counted as traffic).
inline Tensor scratch(std::string name, size_t bytes) {
  return Tensor{std::move(name), Kind::u8, int64_t(bytes), Role::scratch};
}
/// Filled on each backend by the case's prepare step.
inline Tensor derived(std::string name, Kind k, int64_t n) {
  return Tensor{std::move(name), k, n, Role::derived};
}

/// Bytes per element of kind k on a backend whose compute dtype is ct.
size_t kind_bytes(Kind k, DType ct);
/// Each input read once, each output written once, in-out twice (device tensors only).
double derived_bytes(const OpCase& c, DType ct);
/// The case's bytes: c.bytes, or derived_bytes when that is negative.
double case_bytes(const OpCase& c, DType ct);

// ---- harness -----------------------------------------------------------------------------
/// Sentinel bytes before and after every output allocation (a multiple of 256, so the tensor
/// keeps the pool's alignment).
constexpr size_t kGuardBytes = 256;
constexpr uint8_t kGuardByte = 0xA5;

/// Initial values of every in / inout tensor (fills run with the case's seeds), compute-kind
/// values rounded to `round_to` so backends of different dtypes start from the same values.
std::vector<std::vector<float>> make_inputs(const OpCase& c, DType round_to);

struct Outcome {
  std::vector<std::vector<float>> outputs;  ///< per tensor (empty unless out / inout): as float
  std::vector<std::string> problems;        ///< guard bands touched, NaN / inf, device errors
};

/// Runs c once on dev: allocate with guard bands, upload inputs, poison outputs, prepare, run
/// (with cuda_on / cuda_off when cuda), wait, download outputs, check guards and finiteness.
/// Never throws for the case's own errors (they become problems).
Outcome run_case(Device& dev, const OpCase& c, const std::vector<std::vector<float>>& inputs, bool cuda);

/// One allocation of c's tensors on dev as the benchmark uses them: no guard bands, inputs
/// uploaded (outputs and scratch left as allocated), host tensors kept in `host`. Throws what
/// the allocation or the upload throws.
struct Allocation {
  std::vector<DeviceBuffer> dev;
  std::vector<std::vector<uint8_t>> host;
  std::vector<void*> ptr;
};
Allocation allocate(Device& dev, const OpCase& c, const std::vector<std::vector<float>>& inputs);

/// NMSE of a against b (0 when both are all zero; infinite for a size mismatch or NaN).
double nmse(const std::vector<float>& a, const std::vector<float>& b);
/// One line per compared output whose NMSE (a against the reference b) exceeds its bound.
std::vector<std::string> compare(const OpCase& c, const Outcome& a, const Outcome& b);

/// The case's seed of tensor i (FNV-1a of the name, mixed with i).
uint64_t tensor_seed(const std::string& case_name, size_t i);

}  // namespace rp::optable
