// A weighted mixture of several data sets' packed sequences, served as one deterministic
// stream (the data layer's half of data mixtures; the spec's "data" list is not wired to it
// yet).
//
// Global position p (sequences consumed so far, as BatchStream::position) draws its source
// from (seed, p) alone: a splitmix64 hash of both, as a uniform number in [0, 1), against the
// cumulative normalised weights. Within a source, sequences come in that source's own
// BatchStream order (its epochs reshuffled from (seed + source index)), at that source's own
// count of draws so far. So the stream depends only on (sources, weights, seed, shuffle),
// and seek(p) replays the p draws (a hash each: microseconds per thousand) to recover every
// source's count: a run resumed at a saved position continues bit for bit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.hpp"

namespace rp {

struct MixtureSource {
  std::string name;  ///< for the log (the file)
  PackedSequences seqs;
  double weight = 1;  ///< > 0; normalised over the sources
};

class MixtureStream {
 public:
  /// Throws std::invalid_argument with one line when there are no sources, a weight is not
  /// finite and > 0 ("data[1]: weight must be > 0, got -1"), a source has no sequences, or
  /// their seq_len differ.
  MixtureStream(std::vector<MixtureSource> sources, uint64_t seed, bool shuffle = true);

  /// The next n_seq sequences (n_seq >= 1, else std::invalid_argument).
  TokenBatch next(int64_t n_seq);
  int64_t position() const { return pos_; }
  /// Continues at global position p (>= 0, else std::invalid_argument), replaying its draws.
  void seek(int64_t position);

  size_t num_sources() const { return sources_.size(); }
  /// The source global position p draws (for tests and tracing).
  size_t source_at(int64_t p) const;
  /// Sequences served from each source so far (the realised mixture).
  const std::vector<int64_t>& served() const { return served_; }
  /// "a.jsonl 70.3% (weight 70.0%), b.parquet 29.7% (30.0%)": the realised proportions.
  std::string proportions() const;

 private:
  std::vector<std::string> names_;
  std::vector<double> cumulative_;  ///< normalised, last = 1
  std::vector<double> weights_;
  std::vector<BatchStream> sources_;
  std::vector<int64_t> served_;
  uint64_t seed_;
  int64_t pos_ = 0;
};

}  // namespace rp
