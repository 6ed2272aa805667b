// Held-out splits of packed sequences and the deterministic shuffled batch stream over them
// (data/dataset.hpp split_off, BatchStream).
#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

#include "data/dataset.hpp"

namespace rp {

int64_t TokenBatch::num_targets() const {
  return int64_t(std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != kIgnoreIndex; }));
}

PackedSequences split_off(PackedSequences& seqs, double fraction) {
  if (!(fraction >= 0 && fraction <= 1))
    throw std::invalid_argument(fmt::format("split_off: fraction must be in [0, 1], got {}", fraction));
  PackedSequences out;
  out.seq_len = seqs.seq_len;
  const size_t L = size_t(seqs.seq_len);
  const bool packed = !seqs.positions.empty();
  // the kept rows move up in place (never a second copy of the whole set), the held ones out
  size_t kept = 0;
  for (int64_t i = 0; i < seqs.size(); ++i) {
    const bool held = std::floor(double(i + 1) * fraction) > std::floor(double(i) * fraction);
    const auto from = long(size_t(i) * L), to = long(kept * L);
    for (auto* v : {&seqs.ids, &seqs.targets, &seqs.positions}) {
      if (v == &seqs.positions && !packed) continue;
      if (held) {
        auto& dst = v == &seqs.ids ? out.ids : v == &seqs.targets ? out.targets : out.positions;
        dst.insert(dst.end(), v->begin() + from, v->begin() + from + long(L));
      } else if (from != to) {
        std::copy_n(v->begin() + from, L, v->begin() + to);
      }
    }
    kept += held ? 0 : 1;
  }
  seqs.ids.resize(kept * L);
  seqs.targets.resize(kept * L);
  if (packed) seqs.positions.resize(kept * L);
  return out;
}

// ---- BatchStream ------------------------------------------------------------------------

BatchStream::BatchStream(PackedSequences seqs, uint64_t seed, bool shuffle)
    : seqs_(std::move(seqs)), seed_(seed), shuffle_(shuffle) {
  if (seqs_.size() == 0) throw std::invalid_argument("BatchStream: no sequences (empty data set?)");
}

void BatchStream::ensure_epoch(int64_t e) {
  if (e == perm_epoch_) return;
  size_t n = num_sequences();
  perm_.resize(n);
  for (size_t i = 0; i < n; ++i) perm_[i] = i;
  if (shuffle_) {
    std::mt19937_64 rng(splitmix64(seed_ ^ splitmix64(uint64_t(e))));
    for (size_t i = n - 1; i > 0; --i) std::swap(perm_[i], perm_[rng() % (i + 1)]);
  }
  perm_epoch_ = e;
}

size_t BatchStream::sequence_at(int64_t p) {
  int64_t n = int64_t(num_sequences());
  ensure_epoch(p / n);
  return perm_[size_t(p % n)];
}

void BatchStream::seek(int64_t position) {
  if (position < 0) throw std::invalid_argument("BatchStream::seek: negative position");
  pos_ = position;
}

TokenBatch BatchStream::next(int64_t n_seq) {
  if (n_seq < 1)
    throw std::invalid_argument(fmt::format("BatchStream::next: n_seq must be >= 1, got {}", n_seq));
  TokenBatch b;
  b.n_seq = n_seq;
  b.seq_len = seqs_.seq_len;
  const size_t L = size_t(seqs_.seq_len);
  b.ids.resize(size_t(n_seq) * L);
  b.targets.resize(size_t(n_seq) * L);
  const bool packed = !seqs_.positions.empty();
  if (packed) b.positions.resize(size_t(n_seq) * L);
  for (int64_t r = 0; r < n_seq; ++r) {
    size_t s = sequence_at(pos_++);
    std::copy_n(seqs_.ids.begin() + s * L, L, b.ids.begin() + r * L);
    std::copy_n(seqs_.targets.begin() + s * L, L, b.targets.begin() + r * L);
    if (packed) std::copy_n(seqs_.positions.begin() + s * L, L, b.positions.begin() + r * L);
  }
  return b;
}

}  // namespace rp
