// The op table's harness: seeded fills, guard-banded allocations, one run of a case on a
// device, and the NMSE comparison of two runs (op_table.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/kernels/op_table/op_table.hpp"

namespace rp::optable {

namespace {

// xorshift64 uniforms in [0, 1), seeded through a multiplicative hash so nearby seeds differ.
class Uniform {
 public:
  explicit Uniform(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  double operator()() {
    s_ ^= s_ << 13;
    s_ ^= s_ >> 7;
    s_ ^= s_ << 17;
    return double(s_ >> 11) * (1.0 / 9007199254740992.0);
  }

 private:
  uint64_t s_;
};

float round_to(DType t, float v) {
  switch (t) {
    case DType::bf16: return bf16_to_f32(f32_to_bf16(v));
    case DType::f16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}

DType storage(Kind k, DType ct) {
  switch (k) {
    case Kind::compute: return ct;
    case Kind::f32: return DType::f32;
    case Kind::i32: return DType::i32;
    case Kind::u8: break;
  }
  return DType::i32;  // unused for u8
}

bool is_output(Role r) { return r == Role::out || r == Role::inout; }

// Host bytes of n values of kind k (compute kind in dtype ct).
void encode(Kind k, DType ct, const std::vector<float>& v, std::vector<uint8_t>& out, size_t at) {
  const size_t n = v.size();
  if (k == Kind::u8) {
    for (size_t i = 0; i < n; ++i) out[at + i] = uint8_t(v[i]);
  } else if (k == Kind::i32) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t x = int32_t(v[i]);
      std::memcpy(out.data() + at + 4 * i, &x, 4);
    }
  } else {
    cast_f32_to(v.data(), out.data() + at, int64_t(n), storage(k, ct));
  }
}

// Values of n elements of kind k at p, as float (u8 decoded as FP8 codes of format f).
std::vector<float> decode(Kind k, DType ct, Fp8Format f, const uint8_t* p, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float& x = v[size_t(i)];
    if (k == Kind::u8) {
      x = fp8::decode(f, p[i]);
      continue;
    }
    const DType t = storage(k, ct);
    const uint8_t* e = p + size_t(i) * dtype_size(t);
    uint16_t h;
    int32_t j;
    switch (t) {
      case DType::f32: std::memcpy(&x, e, 4); break;
      case DType::i32:
        std::memcpy(&j, e, 4);
        x = float(j);
        break;
      case DType::bf16:
        std::memcpy(&h, e, 2);
        x = bf16_to_f32(h);
        break;
      case DType::f16:
        std::memcpy(&h, e, 2);
        x = f16_to_f32(h);
        break;
    }
  }
  return v;
}

// Bytes a poisoned output starts with: NaN in its type, 0x7f codes (FP8 NaN), 0x7f7f7f7f i32.
void poison(Kind k, DType ct, int64_t n, std::vector<uint8_t>& out, size_t at) {
  if (k == Kind::u8 || k == Kind::i32) {
    std::memset(out.data() + at, 0x7f, size_t(n) * kind_bytes(k, ct));
    return;
  }
  encode(k, ct, std::vector<float>(size_t(n), std::numeric_limits<float>::quiet_NaN()), out, at);
}

// Waits for the compute stream; the error text of then() ("" when none).
std::string wait(Stream& cs) {
  auto pr = std::make_shared<std::promise<std::string>>();
  auto fut = pr->get_future();
  cs.then([pr](const std::string& e) { pr->set_value(e); });
  if (fut.wait_for(std::chrono::seconds(600)) != std::future_status::ready)
    return "timed out waiting for the compute stream";
  return fut.get();
}

// Fills v in blocks of 2^20 values, block j from its own stream seeded by (seed, j), on up to
// 16 threads for large tensors (the values do not depend on the thread count).
void fill_blocks(std::vector<float>& v, uint64_t seed,
                 const std::function<void(float*, size_t, Uniform&)>& fn) {
  const size_t block = size_t(1) << 20, nb = (v.size() + block - 1) / block;
  auto work = [&](size_t first, size_t step) {
    for (size_t j = first; j < nb; j += step) {
      Uniform u(seed ^ (uint64_t(j) * 0xD1B54A32D192ED03ull));
      fn(v.data() + j * block, std::min(block, v.size() - j * block), u);
    }
  };
  const size_t nt = std::min<size_t>({nb, 16, std::max(1u, std::thread::hardware_concurrency())});
  if (nt <= 1) return work(0, 1);
  std::vector<std::thread> th;
  for (size_t t = 0; t < nt; ++t) th.emplace_back(work, t, nt);
  for (auto& x : th) x.join();
}

}  // namespace

Fill normal(float scale) {
  return [scale](std::vector<float>& v, uint64_t seed) {
    fill_blocks(v, seed, [scale](float* p, size_t n, Uniform& u) {
      for (size_t i = 0; i < n; ++i) p[i] = scale * float((u() + u() + u() + u() - 2.0) * std::sqrt(3.0));
    });
  };
}

Fill ints(int64_t lo, int64_t hi) {
  return [lo, hi](std::vector<float>& v, uint64_t seed) {
    const double span = double(hi - lo + 1);
    fill_blocks(v, seed, [=](float* p, size_t n, Uniform& u) {
      for (size_t i = 0; i < n; ++i) p[i] = float(lo + std::min<int64_t>(int64_t(u() * span), hi - lo));
    });
  };
}

Fill constant(float c) {
  return [c](std::vector<float>& v, uint64_t) { std::fill(v.begin(), v.end(), c); };
}

size_t kind_bytes(Kind k, DType ct) { return k == Kind::u8 ? 1 : dtype_size(storage(k, ct)); }

double derived_bytes(const OpCase& c, DType ct) {
  double b = 0;
  for (const Tensor& t : c.tensors) {
    if (t.place != Place::device || t.role == Role::scratch) continue;
    b += double(t.n) * double(kind_bytes(t.kind, ct)) * (t.role == Role::inout ? 2 : 1);
  }
  return b;
}

double case_bytes(const OpCase& c, DType ct) { return c.bytes >= 0 ? c.bytes : derived_bytes(c, ct); }

uint64_t tensor_seed(const std::string& case_name, size_t i) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : case_name) h = (h ^ ch) * 1099511628211ull;
  return h ^ (uint64_t(i + 1) * 0x9E3779B97F4A7C15ull);
}

std::vector<std::vector<float>> make_inputs(const OpCase& c, DType round_to_t) {
  std::vector<std::vector<float>> in(c.tensors.size());
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const Tensor& t = c.tensors[i];
    if (t.role != Role::in && t.role != Role::inout) continue;
    in[i].assign(size_t(t.n), 0.f);
    if (t.fill) t.fill(in[i], tensor_seed(c.name, i));
    if (t.kind == Kind::compute)
      for (auto& x : in[i]) x = round_to(round_to_t, x);
  }
  return in;
}

// Reads output t back from h (its bytes with the guard bands) into out, reporting a touched
// guard band and NaN / inf values.
static void check_output(const Tensor& t, DType ct, const std::vector<uint8_t>& h, std::vector<float>& out,
                         std::vector<std::string>& problems) {
  const size_t bytes = h.size() - 2 * kGuardBytes;
  for (size_t g = 0; g < kGuardBytes; ++g) {
    if (h[g] != kGuardByte) {
      problems.push_back(t.name + ": guard band before the output overwritten (byte " +
                         std::to_string(int64_t(g) - int64_t(kGuardBytes)) + ")");
      break;
    }
  }
  for (size_t g = 0; g < kGuardBytes; ++g) {
    if (h[kGuardBytes + bytes + g] != kGuardByte) {
      problems.push_back(t.name + ": guard band after the output overwritten (byte +" + std::to_string(g) +
                         ")");
      break;
    }
  }
  out = decode(t.kind, ct, t.codes, h.data() + kGuardBytes, t.n);
  if (!t.finite || t.kind == Kind::i32) return;
  int64_t bad = 0, first = -1;
  for (int64_t j = 0; j < t.n; ++j)
    if (!std::isfinite(out[size_t(j)])) {
      if (first < 0) first = j;
      ++bad;
    }
  if (bad)
    problems.push_back(t.name + ": " + std::to_string(bad) + " of " + std::to_string(t.n) +
                       " values NaN or inf (first at " + std::to_string(first) + ")");
}

Outcome run_case(Device& dev, const OpCase& c, const std::vector<std::vector<float>>& inputs, bool cuda) {
  Outcome oc;
  const DType ct = dev.ops().dtype();
  Stream& cs = dev.stream(StreamKind::compute);
  const size_t nt = c.tensors.size();
  std::vector<DeviceBuffer> dbuf(nt);
  std::vector<std::vector<uint8_t>> host(nt);  // staging (device) or the tensor itself (host)
  std::vector<void*> ptr(nt);
  try {
    for (size_t i = 0; i < nt; ++i) {
      const Tensor& t = c.tensors[i];
      const size_t bytes = size_t(t.n) * kind_bytes(t.kind, ct);
      host[i].assign(bytes + 2 * kGuardBytes, kGuardByte);
      if (t.role == Role::in || t.role == Role::inout) encode(t.kind, ct, inputs.at(i), host[i], kGuardBytes);
      else if (t.role == Role::out) poison(t.kind, ct, t.n, host[i], kGuardBytes);
      if (t.place == Place::host) {
        ptr[i] = host[i].data() + kGuardBytes;
        continue;
      }
      dbuf[i] = DeviceBuffer(dev, host[i].size());
      ptr[i] = static_cast<uint8_t*>(dbuf[i].get()) + kGuardBytes;
      cs.copy_h2d(dbuf[i].get(), host[i].data(), host[i].size());
    }
    cs.synchronize();
  } catch (const std::exception& e) {
    oc.problems.push_back(c.name + ": allocation / upload: " + e.what());
    return oc;
  }
  const Buffers b(ptr);
  std::string thrown;
  cs.launch([&] {
    Ops& ops = dev.ops();
    try {
      if (cuda && c.cuda_on) c.cuda_on(ops);
      if (c.prepare) c.prepare(ops, b);
      (!cuda && c.twin ? c.twin : c.run)(ops, b);
      if (cuda && c.cuda_off) c.cuda_off(ops);
    } catch (const std::exception& e) {
      thrown = e.what();
      if (cuda && c.cuda_off) c.cuda_off(ops);
    }
  });
  std::string err = wait(cs);
  if (!thrown.empty()) oc.problems.push_back(c.name + ": threw: " + thrown);
  if (!err.empty()) oc.problems.push_back(c.name + ": device error: " + err);
  if (!oc.problems.empty()) return oc;
  for (size_t i = 0; i < nt; ++i)
    if (c.tensors[i].place == Place::device && c.tensors[i].role != Role::scratch)
      cs.copy_d2h(host[i].data(), dbuf[i].get(), host[i].size());
  cs.synchronize();
  oc.outputs.resize(nt);
  for (size_t i = 0; i < nt; ++i) {
    const Tensor& t = c.tensors[i];
    if (!is_output(t.role)) continue;
    check_output(t, ct, host[i], oc.outputs[i], oc.problems);
  }
  return oc;
}

Allocation allocate(Device& dev, const OpCase& c, const std::vector<std::vector<float>>& inputs) {
  const DType ct = dev.ops().dtype();
  Stream& cs = dev.stream(StreamKind::compute);
  Allocation a;
  const size_t nt = c.tensors.size();
  a.dev.resize(nt);
  a.host.resize(nt);
  a.ptr.resize(nt);
  std::vector<uint8_t> staging;
  for (size_t i = 0; i < nt; ++i) {
    const Tensor& t = c.tensors[i];
    const size_t bytes = std::max<size_t>(size_t(t.n) * kind_bytes(t.kind, ct), 1);
    const bool has_input = t.role == Role::in || t.role == Role::inout;
    if (t.place == Place::host) {
      a.host[i].assign(bytes, 0);
      if (has_input) encode(t.kind, ct, inputs.at(i), a.host[i], 0);
      a.ptr[i] = a.host[i].data();
      continue;
    }
    a.dev[i] = DeviceBuffer(dev, bytes);
    a.ptr[i] = a.dev[i].get();
    if (!has_input || t.n == 0) continue;
    staging.assign(bytes, 0);
    encode(t.kind, ct, inputs.at(i), staging, 0);
    cs.copy_h2d(a.ptr[i], staging.data(), bytes);
    cs.synchronize();
  }
  return a;
}

double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  if (std::isnan(num) || std::isnan(den)) return std::numeric_limits<double>::infinity();
  if (num == 0) return 0;
  return den > 0 ? num / den : std::numeric_limits<double>::infinity();
}

std::vector<std::string> compare(const OpCase& c, const Outcome& a, const Outcome& b) {
  std::vector<std::string> bad;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const Tensor& t = c.tensors[i];
    if (!is_output(t.role) || !t.compare) continue;
    if (i >= a.outputs.size() || i >= b.outputs.size()) {
      bad.push_back(t.name + ": missing output");
      continue;
    }
    const double bound = t.nmse >= 0 ? t.nmse : c.nmse;
    const double e = nmse(a.outputs[i], b.outputs[i]);
    if (!(e <= bound)) {
      std::ostringstream s;
      s << t.name << ": NMSE " << e << " > " << bound;
      bad.push_back(s.str());
    }
  }
  return bad;
}

std::vector<OpCase> op_table(Size s) {
  std::vector<OpCase> v;
  add_dense_cases(v, s);
  add_elementwise_cases(v, s);
  add_attention_cases(v, s);
  add_moe_cases(v, s);
  add_fp8_cases(v, s);
  return v;
}

}  // namespace rp::optable
