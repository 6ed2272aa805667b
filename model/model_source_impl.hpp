// Internals of rp::ModelSource (roundpipe/model_source.hpp): where each tensor of an opened
// model lies. model/model_source.cpp holds the format-independent part and the safetensors
// and in-memory sources; model/model_source_gguf.cpp the GGUF one.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/safetensors.hpp"
#include "roundpipe/model_source.hpp"

namespace rp {

struct ModelSource::Impl {
  /// One Hugging Face tensor: exactly one of st / gguf / mem is set.
  struct Loc {
    std::vector<int64_t> shape;  ///< Hugging Face (row-major) shape
    const SafetensorsFile* st = nullptr;
    const SafetensorsEntry* entry = nullptr;
    const GgufTensorInfo* gguf = nullptr;
    int64_t expert = -1;         ///< GGUF stacked experts: the slice [expert] of a 3-D tensor
    int64_t permute_heads = 0;   ///< GGUF LLaMA q/k: llama.cpp's row permutation to undo
    const HostTensor* mem = nullptr;
  };
  LoadedModel header;  ///< no tensors
  std::map<std::string, Loc> tensors;
  SafetensorsSet safetensors;
  std::unique_ptr<GgufFile> gguf;
  std::map<std::string, HostTensor> mem;

  /// Tensor `name`; throws std::runtime_error naming the source when it is not there.
  const Loc& at(const std::string& name) const;
};

/// Opens a GGUF model into `s` (header, tensors; not yet checked against the layout).
void open_gguf_source(const std::string& path, ModelSource::Impl& s);
/// Tensor `l` of `f` as fp32 in Hugging Face order (LLaMA q/k un-permuted).
std::vector<float> gguf_read_f32(const GgufFile& f, const ModelSource::Impl::Loc& l);
/// Copies tensor `l` of `f` into `dst` in storage form `fmt` when its ggml type has that very
/// layout (F32/F16/BF16 elements, Q8_0/Q4_0 blocks); false (nothing written) otherwise.
bool gguf_read_stored(const GgufFile& f, const ModelSource::Impl::Loc& l, WeightFormat fmt, void* dst);

}  // namespace rp
