// RoPE tables of one layer: one inverse-frequency table, or LongRoPE's two, of which each
// forward pass takes one by its length (kernels/ops.hpp's rope_frequencies makes the others).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/ops.hpp"  // RopeParams, RopeTable

namespace rp {

/// LongRoPE's per-frequency divisors (transformers' rope_parameters "short_factor" and
/// "long_factor"; Ding et al. 2024, "LongRoPE", arXiv 2402.13753): head_dim/2 positive finite
/// numbers each (head_dim of RopeParams: the rotary dimension).
struct LongRopeFactors {
  std::vector<double> short_factor, long_factor;
};

/// The tables of one layer's RoPE. For RopeParams::type "longrope" two, as transformers'
/// `longrope_frequency_update` (modeling_rope_utils.py) picks between them per forward pass:
/// `long_table` when the pass's largest position + 1 (its `seq_len = max(position_ids) + 1`)
/// exceeds original_max_position_embeddings, `short_table` otherwise; one table (short_table)
/// for every other type.
struct RopeTables {
  RopeTable short_table;                         ///< every type's table; longrope's from short_factor
  RopeTable long_table;                          ///< longrope only (empty otherwise): from long_factor
  int64_t original_max_position_embeddings = 0;  ///< longrope: the longest pass on short_table
  /// The table of a forward pass whose largest position + 1 is `length` (> 0).
  const RopeTable& pick(int64_t length) const {
    return !long_table.inv_freq.empty() && length > original_max_position_embeddings ? long_table
                                                                                     : short_table;
  }
  bool longrope() const { return !long_table.inv_freq.empty(); }
};

/// rope_frequencies(p) for every type but "longrope", which needs `lr` and gives both tables
/// (transformers' _compute_longrope_parameters, computed in double, rounded to float):
///   inv_freq_i = 1 / (ext_i * theta^(2i/D)), ext = short_factor or long_factor;
///   attention_scaling = p.attention_factor, or when 0: 1 if factor <= 1, else
///   sqrt(1 + ln(factor) / ln(original_max_position_embeddings)), factor = p.factor, or when 0
///   max_position_embeddings / original_max_position_embeddings (the Phi-3 checkpoints' way).
/// Throws std::invalid_argument ("rope_tables: ...") for longrope without
/// original_max_position_embeddings > 0, with factor lists not of D/2 positive finite numbers,
/// or a negative factor / attention_factor; otherwise what rope_frequencies throws.
RopeTables rope_tables(const RopeParams& p, const LongRopeFactors& lr = {});

}  // namespace rp
