#include "data/mixture.hpp"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

MixtureStream::MixtureStream(std::vector<MixtureSource> sources, uint64_t seed, bool shuffle) : seed_(seed) {
  if (sources.empty())
    throw std::invalid_argument("data: an empty list (expected files, or {\"path\", \"weight\"} objects)");
  double total = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    if (!(std::isfinite(s.weight) && s.weight > 0))
      throw std::invalid_argument(
          fmt::format("data[{}] ({}): weight must be > 0, got {}", i, s.name, s.weight));
    if (s.seqs.size() == 0)
      throw std::invalid_argument(fmt::format("data[{}] ({}): no sequences", i, s.name));
    if (s.seqs.seq_len != sources[0].seqs.seq_len)
      throw std::invalid_argument(fmt::format("data[{}] ({}): sequences of {} tokens, data[0]'s have {}", i,
                                              s.name, s.seqs.seq_len, sources[0].seqs.seq_len));
    total += s.weight;
  }
  double run = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    names_.push_back(sources[i].name);
    weights_.push_back(sources[i].weight / total);
    run += sources[i].weight / total;
    cumulative_.push_back(i + 1 == sources.size() ? 1.0 : run);
    // each source its own order: seeds apart by the source's index
    sources_.emplace_back(std::move(sources[i].seqs), splitmix64(seed ^ splitmix64(0xA5A5 + i)), shuffle);
  }
  served_.assign(sources_.size(), 0);
}

size_t MixtureStream::source_at(int64_t p) const {
  // 53 random bits as a double in [0, 1)
  const double u =
      double(splitmix64(seed_ ^ splitmix64(uint64_t(p) + 0x6D69787475726500ull)) >> 11) * 0x1.0p-53;
  size_t i = 0;
  while (i + 1 < cumulative_.size() && u >= cumulative_[i]) ++i;
  return i;
}

void MixtureStream::seek(int64_t position) {
  if (position < 0) throw std::invalid_argument("MixtureStream::seek: negative position");
  served_.assign(sources_.size(), 0);
  for (int64_t p = 0; p < position; ++p) ++served_[source_at(p)];
  for (size_t i = 0; i < sources_.size(); ++i) sources_[i].seek(served_[i]);
  pos_ = position;
}

TokenBatch MixtureStream::next(int64_t n_seq) {
  if (n_seq < 1)
    throw std::invalid_argument(fmt::format("MixtureStream::next: n_seq must be >= 1, got {}", n_seq));
  TokenBatch b;
  for (int64_t r = 0; r < n_seq; ++r) {
    const size_t s = source_at(pos_++);
    ++served_[s];
    TokenBatch one = sources_[s].next(1);
    if (r == 0) {
      b.n_seq = n_seq;
      b.seq_len = one.seq_len;
    }
    b.ids.insert(b.ids.end(), one.ids.begin(), one.ids.end());
    b.targets.insert(b.targets.end(), one.targets.begin(), one.targets.end());
    b.positions.insert(b.positions.end(), one.positions.begin(), one.positions.end());
  }
  return b;
}

std::string MixtureStream::proportions() const {
  int64_t total = 0;
  for (int64_t n : served_) total += n;
  std::string out;
  for (size_t i = 0; i < names_.size(); ++i)
    out += fmt::format("{}{} {:.1f}% (weight {:.1f}%)", i ? ", " : "", names_[i],
                       total ? 100.0 * double(served_[i]) / double(total) : 0.0, 100.0 * weights_[i]);
  return out;
}

}  // namespace rp
