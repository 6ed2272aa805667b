#include "scheduler/chunk_plan.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace rp {

std::vector<Chunk> split_chunks(size_t bytes, size_t chunk_bytes) {
  std::vector<Chunk> out;
  if (bytes == 0) return out;
  if (chunk_bytes == 0 || chunk_bytes >= bytes) return {Chunk{0, bytes}};
  out.reserve((bytes + chunk_bytes - 1) / chunk_bytes);
  for (size_t off = 0; off < bytes; off += chunk_bytes)
    out.push_back(Chunk{off, std::min(chunk_bytes, bytes - off)});
  return out;
}

double WindowPacking::makespan() const {
  return load.empty() ? 0.0 : *std::max_element(load.begin(), load.end());
}

WindowPacking lpt_pack(const std::vector<double>& sizes, int windows) {
  if (windows < 1)
    throw std::invalid_argument("lpt_pack: windows must be >= 1, got " + std::to_string(windows));
  WindowPacking p;
  p.window_of.assign(sizes.size(), 0);
  p.load.assign(size_t(windows), 0.0);
  std::vector<int> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sizes[a] > sizes[b]; });
  for (int i : order) {
    const int w = int(std::min_element(p.load.begin(), p.load.end()) - p.load.begin());
    p.window_of[i] = w;
    p.load[w] += sizes[i];
  }
  return p;
}

std::vector<int> window_issue_order(const WindowPacking& p) {
  std::vector<int> order(p.window_of.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p.window_of[a] < p.window_of[b]; });
  return order;
}

}  // namespace rp
