// How a model's parameters are grouped and laid out in host memory.
//
// The unit the runtime moves, updates and protects with the per-layer protocol is a
// parameter *group*: one contiguous buffer holding every tensor of one layer.
//   group 0          : "embed"  model.embed_tokens.weight [vocab, hidden]
//   group 1..L       : "layer.<i>" the tensors of decoder layer i-1 (HF names)
//   group L+1        : "head"   model.norm.weight [hidden] (+ lm_head.weight [vocab, hidden]
//                      when embeddings are not tied)
// With tied embeddings the tail (final norm + LM head) reads group 0 as its LM head.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace rp {

struct TensorSpec {
  std::string name;            ///< Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  ///< row-major, HF order ([out_features, in_features] for linears)
  int64_t offset = 0;          ///< in elements, from the start of its group
  int64_t numel() const;
};

struct ParamGroup {
  std::string name;
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;
  /// Index of tensor `name` in `tensors`, or -1.
  int find(const std::string& tensor_name) const;
};

/// Compute units of one iteration, in forward order: embedding, L decoder layers, tail.
enum class LayerKind : uint8_t { embedding, decoder, tail };

struct ModelLayout {
  ModelConfig config;
  std::vector<ParamGroup> groups;  ///< see file comment
  int num_layers() const { return int(config.num_hidden_layers) + 2; }  ///< embedding + decoders + tail
  LayerKind kind(int layer) const;
  /// Groups read by compute layer `layer` (0 = embedding, 1..L decoders, L+1 tail).
  /// The tail reads {L+1} and also {0} when embeddings are tied.
  std::vector<int> groups_of(int layer) const;
  /// Sorted union of groups_of(l) over `layers`: the groups a stage running them reads,
  /// and (backward and tail stages) the groups whose gradient it produces.
  std::vector<int> groups_of(const std::vector<int>& layers) const;
  /// The groups whose weights a stage running `layers` must upload: groups_of(layers),
  /// except that a backward stage (`backward_stage`: recompute + backward) leaves out the
  /// embedding's, whose backward scatters dy into gradient rows by token id and reads no
  /// weight (a forward or tail stage runs the embedding's forward, which does).
  std::vector<int> groups_uploaded(const std::vector<int>& layers, bool backward_stage) const;
  int64_t total_numel() const;
};

/// Builds the layout for `c` (tensor order within a group is fixed and documented in
/// layout.cpp). Throws std::invalid_argument from c.validate().
ModelLayout make_layout(const ModelConfig& c);

}  // namespace rp
