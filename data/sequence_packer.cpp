#include "data/sequence_packer.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace rp {

namespace {
size_t bytes_per_token(bool pack) { return (pack ? 3 : 2) * sizeof(int32_t); }

std::string too_big(size_t rows, size_t L, bool pack, size_t max_bytes) {
  return fmt::format(
      "packing {} sequences of {} tokens needs {:.1f} GiB of host memory (ids, targets{}), {:.1f} GiB are "
      "available",
      rows, L, double(rows) * double(L) * double(bytes_per_token(pack)) / double(1ull << 30),
      pack ? ", positions" : "", double(max_bytes) / double(1ull << 30));
}

/// Whether example ids[0..n) has a target: a masked token after the first.
bool has_target(const Example& ex, size_t n) {
  for (size_t t = 1; t < n; ++t)
    if (ex.loss_mask[t]) return true;
  return false;
}
}  // namespace

SequencePacker::SequencePacker(int64_t seq_len, int32_t pad_id, bool pack, size_t max_bytes)
    : L_(size_t(seq_len)),
      pad_(pad_id),
      pack_(pack),
      max_bytes_(max_bytes),
      per_token_(bytes_per_token(pack)) {
  if (seq_len < 1)
    throw std::invalid_argument(fmt::format("pack_sequences: seq_len must be >= 1, got {}", seq_len));
  if (pad_id < 0)
    throw std::invalid_argument(fmt::format("pack_sequences: pad_id must be >= 0, got {}", pad_id));
  rows_.seq_len = text_.seq_len = seq_len;
  fill_ = L_;
}

void SequencePacker::reserve(size_t example_rows, size_t text_rows) {
  // never more than max_bytes' worth (nor past size_t)
  const size_t cap = max_bytes_ > 0 ? max_bytes_ / per_token_ / L_ : SIZE_MAX / per_token_ / L_;
  for (auto [p, n] :
       {std::pair{&rows_, std::min(example_rows, cap)}, std::pair{&text_, std::min(text_rows, cap)}}) {
    p->ids.reserve(n * L_);
    p->targets.reserve(n * L_);
    if (pack_) p->positions.reserve(n * L_);
  }
}

/// A fresh row of `into` (positions 0..L-1), or SIZE_MAX when past max_bytes (only counted).
size_t SequencePacker::new_row(PackedSequences& into) {
  size_t bytes = 0;
  if (!over_ &&
      (__builtin_mul_overflow(total_rows_ + 1, L_, &bytes) ||
       __builtin_mul_overflow(bytes, per_token_, &bytes) || (max_bytes_ > 0 && bytes > max_bytes_))) {
    over_ = true;  // nothing more is stored: what is held goes back now
    rows_ = PackedSequences{};
    text_ = PackedSequences{};
  }
  ++total_rows_;
  if (over_) return SIZE_MAX;
  const size_t base = into.ids.size();
  into.ids.resize(base + L_, pad_);
  into.targets.resize(base + L_, kIgnoreIndex);
  if (pack_) {
    into.positions.resize(base + L_);
    for (size_t t = 0; t < L_; ++t) into.positions[base + t] = int32_t(t);
  }
  return base;
}

// the padding after the last example of a packed row: its own positions from 0
void SequencePacker::close_row() {
  if (!pack_ || over_ || fill_ >= L_) return;
  for (size_t t = fill_; t < L_; ++t) rows_.positions[row_ + t] = int32_t(t - fill_);
}

void SequencePacker::add_example(const Example& ex) {
  if (ex.loss_mask.size() != ex.ids.size())
    throw std::invalid_argument("pack_sequences: an example's loss_mask and ids differ in length");
  ++examples_;
  const size_t n = std::min(ex.ids.size(), L_ + 1), used = std::min(n, L_);
  rows_.truncated_examples += ex.ids.size() > L_ + 1;
  if (!has_target(ex, n)) {  // no target left: dropped
    ++rows_.dropped_examples;
    return;
  }
  if (!pack_ || fill_ + used > L_) {
    close_row();
    row_ = new_row(rows_);
    fill_ = 0;
  }
  if (!over_)
    for (size_t t = 0; t < used; ++t) {
      const size_t at = row_ + fill_ + t;
      rows_.ids[at] = ex.ids[t];
      rows_.targets[at] = t + 1 < n && ex.loss_mask[t + 1] ? ex.ids[t + 1] : kIgnoreIndex;
      if (pack_) rows_.positions[at] = int32_t(t);
    }
  fill_ += used;
}

/// A window of tokens s[0..n), n <= L + 1 (targets for all but the last).
void SequencePacker::cut_window(const int32_t* s, size_t n) {
  const size_t base = new_row(text_);
  if (base == SIZE_MAX) return;
  for (size_t t = 0; t < std::min(n, L_); ++t) {
    text_.ids[base + t] = s[t];
    if (t + 1 < n) text_.targets[base + t] = s[t + 1];
  }
}

void SequencePacker::add_text(const std::vector<int32_t>& tokens) {
  text_tokens_ += tokens.size();
  pending_.insert(pending_.end(), tokens.begin(), tokens.end());
  size_t start = 0;  // window k covers stream[k L, (k+1) L]: consecutive windows share a token
  for (; pending_.size() - start >= L_ + 1; start += L_) cut_window(pending_.data() + start, L_ + 1);
  pending_.erase(pending_.begin(), pending_.begin() + long(start));
}

PackedSequences SequencePacker::finish() {
  close_row();
  if (pending_.size() > 1) cut_window(pending_.data(), pending_.size());  // the last, partial window
  pending_.clear();
  if (over_) throw std::length_error(too_big(total_rows_, L_, pack_, max_bytes_));
  PackedSequences p = std::move(rows_);
  if (p.ids.empty()) {
    std::swap(p.ids, text_.ids);
    std::swap(p.targets, text_.targets);
    std::swap(p.positions, text_.positions);
  } else {
    p.ids.insert(p.ids.end(), text_.ids.begin(), text_.ids.end());
    p.targets.insert(p.targets.end(), text_.targets.begin(), text_.targets.end());
    p.positions.insert(p.positions.end(), text_.positions.begin(), text_.positions.end());
  }
  p.seq_len = int64_t(L_);
  return p;
}

PackedSequences pack_sequences(const Dataset& data, int64_t seq_len, int32_t pad_id, bool pack,
                               size_t max_bytes) {
  SequencePacker packer(seq_len, pad_id, pack, max_bytes);
  // the rows and their bytes first (packing needs at most as many rows as one example per
  // row): nothing is allocated for an impossible seq_len
  const size_t L = size_t(seq_len);
  size_t example_rows = 0, text_rows = 0, bytes = 0;
  for (const auto& ex : data.examples) {
    if (ex.loss_mask.size() != ex.ids.size())
      throw std::invalid_argument("pack_sequences: an example's loss_mask and ids differ in length");
    example_rows += has_target(ex, std::min(ex.ids.size(), L + 1));
  }
  if (data.text_stream.size() > 1) text_rows = (data.text_stream.size() - 2) / L + 1;
  if (__builtin_mul_overflow(example_rows + text_rows, L, &bytes) ||
      __builtin_mul_overflow(bytes, bytes_per_token(pack), &bytes) || (max_bytes > 0 && bytes > max_bytes))
    throw std::length_error(too_big(example_rows + text_rows, L, pack, max_bytes));
  packer.reserve(example_rows, text_rows);
  for (const auto& ex : data.examples) packer.add_example(ex);
  packer.add_text(data.text_stream);
  return packer.finish();
}

}  // namespace rp
