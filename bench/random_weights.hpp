// Random weights of bench_throughput: uniform in [-0.02, 0.02) (norms 1). Trainable groups come
// as fp32, frozen ones in their storage form, made one chunk of rows at a time from a seed of
// (group, tensor, chunk), so a frozen group's bytes are the same whether the groups are made
// together on several threads (in memory) or one by one, each on several threads (the
// runtime's frozen source, which a disk tier asks for one group at a time while it writes its
// cache, so a base larger than the host's memory never exists whole in it).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/weight_format.hpp"
#include "model/lora.hpp"
#include "optimizer/thread_pool.hpp"
#include "roundpipe/model.hpp"
#include "roundpipe/session.hpp"

namespace bench {

/// Values per chunk of a frozen tensor (whole rows, at least one).
constexpr int64_t kChunkValues = int64_t(1) << 20;

/// splitmix64 (Steele et al. 2014): the chunk's seed, then its stream.
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// n values of chunk `chunk` of tensor `t` of group `g` (1 for a 1-D tensor: norms).
inline void fill_chunk(const rp::TensorSpec& t, int g, size_t tensor, int64_t chunk, float* v, int64_t n) {
  uint64_t s = (uint64_t(g) << 40) ^ (uint64_t(tensor) << 24) ^ uint64_t(chunk);
  splitmix(s);
  for (int64_t i = 0; i < n; ++i)
    v[i] = t.shape.size() == 1 ? 1.f : float(double(splitmix(s) >> 11) * 0x1p-53 * 0.04 - 0.02);
}

/// Runs work(k) for k in [0, threads) on a pool of `threads` threads (rp::ThreadPool: what one
/// throws is rethrown here once all finished); std::bad_alloc becomes one line naming the
/// weights (`weight_bytes`) that did not fit.
template <class Work>
void on_threads(int threads, const Work& work, double weight_bytes = 0) {
  try {
    if (threads <= 1) return work(0);
    rp::ThreadPool pool(threads);
    pool.run(threads, [&](int k) { work(k); });
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("the model's random weights (" +
                             std::to_string(int64_t(weight_bytes / (1 << 30))) +
                             " GiB) do not fit in this machine's memory: choose a smaller shape");
  }
}

/// Frozen group g's storage form into `out` (storage_bytes), on `threads` threads.
/// The block formats' chunks of every tensor form one list the threads share (a mixture-of-
/// experts decoder has hundreds of tensors of a few chunks each: shared per tensor, most
/// threads would idle); fp8 and tensors whose rows a block straddles are made whole in fp32,
/// one tensor at a time, then quantized.
inline void make_frozen_group(const rp::ModelLayout& m, int g, std::span<std::byte> out, int threads) {
  const rp::ParamGroup& grp = m.groups[size_t(g)];
  char* dst = reinterpret_cast<char*>(out.data());
  struct Piece {
    size_t tensor;
    int64_t chunk, r0, rows, cols;
  };
  std::vector<Piece> pieces;  // block formats: quantized chunk by chunk straight into place
  std::vector<size_t> whole;  // the others
  auto pieces_of = [&](size_t ti) {
    const rp::TensorSpec& t = grp.tensors[ti];
    const int64_t cols = std::max<int64_t>(1, rp::weight_format_cols(t.shape));
    const int64_t rows = t.numel() / cols;
    const int64_t rows_per = std::max<int64_t>(1, kChunkValues / cols);
    std::vector<Piece> v;
    for (int64_t c = 0, r0 = 0; r0 < rows; ++c, r0 += rows_per)
      v.push_back({ti, c, r0, std::min(rows_per, rows - r0), cols});
    return v;
  };
  for (size_t ti = 0; ti < grp.tensors.size(); ++ti) {
    const rp::TensorSpec& t = grp.tensors[ti];
    const int64_t cols = std::max<int64_t>(1, rp::weight_format_cols(t.shape));
    if (t.format == rp::WeightFormat::fp8 || cols % rp::weight_format_block(t.format) != 0) {
      whole.push_back(ti);
    } else {
      const std::vector<Piece> v = pieces_of(ti);
      pieces.insert(pieces.end(), v.begin(), v.end());
    }
  }
  on_threads(threads, [&](int k) {
    std::vector<float> v;
    for (size_t i = size_t(k); i < pieces.size(); i += size_t(threads)) {
      const Piece& p = pieces[i];
      const rp::TensorSpec& t = grp.tensors[p.tensor];
      v.resize(size_t(p.rows * p.cols));
      fill_chunk(t, g, p.tensor, p.chunk, v.data(), p.rows * p.cols);
      rp::quantize_weights(t.format, v.data(),
                           dst + t.byte_offset + rp::weight_format_bytes(t.format, p.r0 * p.cols, p.cols),
                           p.rows * p.cols, p.cols);
    }
  });
  for (size_t ti : whole) {
    const rp::TensorSpec& t = grp.tensors[ti];
    const std::vector<Piece> v = pieces_of(ti);
    if (v.empty()) continue;
    std::vector<float> all(size_t(t.numel()));
    on_threads(threads, [&](int k) {
      for (size_t i = size_t(k); i < v.size(); i += size_t(threads))
        fill_chunk(t, g, ti, v[i].chunk, all.data() + v[i].r0 * v[i].cols, v[i].rows * v[i].cols);
    });
    rp::quantize_weights(t.format, all.data(), dst + t.byte_offset, t.numel(), v.front().cols);
  }
}

/// Trainable groups' fp32 values into w (adapters: PEFT's initialisation); frozen groups in
/// storage form into `frozen` unless `lazy` (then left empty for frozen_source()).
inline void random_weights(const rp::ModelLayout& m, std::vector<std::vector<float>>& w,
                           std::vector<std::vector<uint8_t>>& frozen, bool lazy) {
  w.assign(m.groups.size(), {});
  frozen.assign(m.groups.size(), {});
  const int nt = int(std::min<size_t>(std::max<size_t>(1, rp::allowed_cpus().size()), 16));
  double bytes = 0;
  for (const auto& g : m.groups) bytes += g.frozen ? double(g.storage_bytes) : 4.0 * double(g.numel);
  on_threads(
      nt,
      [&](int k) {
        for (size_t gi = size_t(k); gi < m.groups.size(); gi += size_t(nt)) {
          const auto& g = m.groups[gi];
          if (m.lora && int(gi) >= m.num_layers()) {
            w[gi] = rp::lora_initial_group(m, int(gi));
          } else if (!g.frozen) {
            w[gi].resize(size_t(g.numel));
            for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
              const rp::TensorSpec& t = g.tensors[ti];
              fill_chunk(t, int(gi), ti, 0, w[gi].data() + t.offset, t.numel());
            }
          } else if (!lazy) {
            frozen[gi].resize(size_t(g.storage_bytes));
            make_frozen_group(
                m, int(gi),
                std::span<std::byte>(reinterpret_cast<std::byte*>(frozen[gi].data()), frozen[gi].size()), 1);
          }
        }
      },
      bytes);
}

/// The runtime's source of the frozen groups random_weights(lazy) left out.
inline rp::FrozenSource frozen_source(const rp::ModelLayout& m) {
  const int threads = std::max(1, int(rp::allowed_cpus().size()));  // the cores this process may use
  return rp::FrozenSource{
      "bench_throughput random weights 2 (splitmix64 per 2^20-value chunk of rows)",
      [&m, threads](int g, std::span<std::byte> out) { make_frozen_group(m, g, out, threads); }};
}

}  // namespace bench
