// Packing examples and text into fixed-length sequences as they are loaded (data/dataset.hpp
// describes the layout; pack_sequences is this over a loaded Dataset). A data file streams
// through it record by record, so host memory holds the sequences it yields, not also every
// tokenised example before packing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/dataset.hpp"

namespace rp {

class SequencePacker {
 public:
  /// Throws std::invalid_argument when seq_len < 1 or pad_id < 0. `max_bytes` (0: no limit)
  /// bounds the packed ids, targets (and positions): past it the packer keeps counting the
  /// sequences without storing them, and finish() throws std::length_error naming them all.
  SequencePacker(int64_t seq_len, int32_t pad_id, bool pack, size_t max_bytes = 0);

  /// Address space for about this many example rows and text windows (only a hint: pages are
  /// touched as rows fill, so an overestimate costs no memory).
  void reserve(size_t example_rows, size_t text_rows);

  /// The next supervised example (pack_sequences' rules: its own row, or the current packed
  /// row while it fits; dropped and counted when truncation leaves no target).
  /// Throws std::invalid_argument when its loss_mask and ids differ in length.
  void add_example(const Example& ex);
  /// Tokens appended to the plain-text stream; every full window is cut off at once.
  void add_text(const std::vector<int32_t>& tokens);

  int64_t seq_len() const { return int64_t(L_); }
  size_t examples() const { return examples_; }
  size_t text_tokens() const { return text_tokens_; }

  /// The example rows, then the text windows. Throws std::length_error ("packing N sequences
  /// of L tokens needs X GiB of host memory ..., Y GiB are available") past max_bytes.
  PackedSequences finish();

 private:
  size_t new_row(PackedSequences& into);
  void close_row();
  void cut_window(const int32_t* s, size_t n);

  size_t L_;
  int32_t pad_;
  bool pack_;
  size_t max_bytes_;
  size_t per_token_;
  PackedSequences rows_;          ///< example rows
  PackedSequences text_;          ///< text windows
  size_t total_rows_ = 0;         ///< rows of both, counted on past max_bytes
  bool over_ = false;             ///< past max_bytes: counting only
  size_t row_ = 0, fill_;         ///< the packed row being filled and its tokens used
  std::vector<int32_t> pending_;  ///< text stream tokens not yet in a full window
  size_t examples_ = 0, text_tokens_ = 0;
};

}  // namespace rp
