#include "kernels/device_arch.hpp"

#include <fmt/format.h>

#include <cctype>
#include <vector>

namespace rp {
namespace {

struct ArchEntry {
  int cc = 0;       // x10: 80, 90, 120
  char suffix = 0;  // 'a' (arch-specific), 'f' (family) or 0
  bool cubin = true;
  bool ptx = true;
};

// false: an entry we cannot read ("native", a typo): the caller lets the driver decide.
bool parse(const std::string& compiled, std::vector<ArchEntry>& out) {
  size_t i = 0;
  bool any = false;
  while (i <= compiled.size()) {
    size_t j = compiled.find_first_of(",;", i);
    if (j == std::string::npos) j = compiled.size();
    std::string e = compiled.substr(i, j - i);
    i = j + 1;
    while (!e.empty() && std::isspace(static_cast<unsigned char>(e.back()))) e.pop_back();
    while (!e.empty() && std::isspace(static_cast<unsigned char>(e.front()))) e.erase(0, 1);
    if (e.empty()) continue;
    ArchEntry a;
    size_t k = 0;
    while (k < e.size() && std::isdigit(static_cast<unsigned char>(e[k]))) a.cc = a.cc * 10 + (e[k++] - '0');
    if (k == 0 || a.cc < 10) return false;
    if (k < e.size() && (e[k] == 'a' || e[k] == 'f')) a.suffix = e[k++];
    const std::string kind = e.substr(k);
    if (kind == "-real") a.ptx = false;
    else if (kind == "-virtual") a.cubin = false;
    else if (!kind.empty()) return false;
    out.push_back(a);
    any = true;
  }
  return any;
}

bool cubin_runs(const ArchEntry& a, int cc) {
  if (!a.cubin || a.cc / 10 != cc / 10) return false;  // cubins are compatible within a major only
  if (a.suffix == 'a') return a.cc == cc;
  return cc >= a.cc;
}

}  // namespace

bool arch_list_runs_on(const std::string& compiled, int major, int minor) {
  std::vector<ArchEntry> list;
  if (!parse(compiled, list)) return true;
  const int cc = major * 10 + minor;
  for (const ArchEntry& a : list)
    if (cubin_runs(a, cc) || (a.ptx && a.suffix == 0 && cc >= a.cc)) return true;
  return false;
}

bool arch_list_has_cubin_for(const std::string& compiled, int major, int minor) {
  std::vector<ArchEntry> list;
  if (!parse(compiled, list)) return true;
  for (const ArchEntry& a : list)
    if (cubin_runs(a, major * 10 + minor)) return true;
  return false;
}

std::string arch_mismatch_line(const std::string& device, int major, int minor, const std::string& compiled) {
  return fmt::format(
      "{} has compute capability {}.{}, but this build's CUDA kernels are for {} only; rebuild for it: "
      "cmake -S . -B build -DCMAKE_CUDA_ARCHITECTURES={}{} && cmake --build build",
      device, major, minor, compiled.empty() ? "<unknown>" : compiled, major, minor);
}

std::string arch_too_old_line(const std::string& device, int major, int minor) {
  return fmt::format(
      "{} has compute capability {}.{}; RoundPipe's CUDA kernels need {}.{} or newer (cp.async, bf16 tensor "
      "cores: A100, RTX 30xx and later); use --backend cpu",
      device, major, minor, kMinComputeCapability / 10, kMinComputeCapability % 10);
}

bool device_supports_fp8(int major, int minor) { return major * 10 + minor >= 89; }

std::string fp8_refusal_line(const std::string& device, int major, int minor) {
  if (device_supports_fp8(major, minor)) return "";
  return fmt::format(
      "{} has compute capability {}.{}; \"fp8\": true needs FP8 tensor cores (8.9 or newer: Ada, Hopper, "
      "Blackwell); set \"fp8\": false",
      device, major, minor);
}

}  // namespace rp
