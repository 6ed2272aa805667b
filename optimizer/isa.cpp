#include "optimizer/isa.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace rp {
namespace {

bool cpu_has(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }
  return false;
#else
  return isa == Isa::scalar;
#endif
}

std::atomic<int> g_isa{-1};

Isa initial_isa() {
  const Isa best = best_isa();
  const char* env = std::getenv("RP_OPTIMIZER_ISA");
  if (!env || !*env) return best;
  try {
    Isa want = parse_isa(env);
    if (isa_supported(want)) return want;
    std::fprintf(stderr, "[roundpipe] RP_OPTIMIZER_ISA=%s is not supported by this CPU; using %s\n", env,
                 isa_name(best));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[roundpipe] %s; using %s\n", e.what(), isa_name(best));
  }
  return best;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

Isa parse_isa(const char* name) {
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (std::strcmp(name, isa_name(i)) == 0) return i;
  throw std::invalid_argument(std::string("unknown ISA '") + name + "' (valid: scalar, avx2, avx512)");
}

bool isa_supported(Isa isa) {
  static const bool has[3] = {cpu_has(Isa::scalar), cpu_has(Isa::avx2), cpu_has(Isa::avx512)};
  const int i = int(isa);
  return i >= 0 && i < 3 && has[i];
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

Isa best_isa() {
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

Isa adamw_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    int want = int(initial_isa());
    int expected = -1;
    g_isa.compare_exchange_strong(expected, want);
    v = g_isa.load(std::memory_order_relaxed);
  }
  return Isa(v);
}

void set_adamw_isa(Isa isa) {
  if (!isa_supported(isa))
    throw std::invalid_argument(std::string("set_adamw_isa: this CPU cannot run ") + isa_name(isa));
  g_isa.store(int(isa), std::memory_order_relaxed);
}

}  // namespace rp
