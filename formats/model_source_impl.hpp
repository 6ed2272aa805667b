// Internals of rp::ModelSource (roundpipe/model_source.hpp): where each tensor of an opened
// model lies. formats/model_source.cpp holds the format-independent part and the safetensors
// and in-memory sources; formats/model_source_gguf.cpp the GGUF one.
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "formats/gguf.hpp"
#include "formats/safetensors.hpp"
#include "roundpipe/model_source.hpp"

namespace rp {

struct ModelSource::Impl {
  /// Hugging Face GPT-OSS: one layout tensor of one expert (formats/gpt_oss_hf.hpp), cut from a
  /// checkpoint's stacked tensor as it is read (formats/gpt_oss_source.cpp).
  struct OssSlice {
    const SafetensorsFile* file = nullptr;
    /// gate_up_proj [E, H, 2F] / down_proj [E, F, H] (x @ W), their MXFP4 "_blocks"
    /// [E, out, in/32, 16], or a bias gate_up_proj_bias [E, 2F] / down_proj_bias [E, H]
    const SafetensorsEntry* data = nullptr;
    const SafetensorsFile* scales_file = nullptr;
    const SafetensorsEntry* scales = nullptr;  ///< "_scales" [E, out, in/32] with "_blocks", else null
    int64_t expert = 0;
    int part = 0;  ///< 0: gate (gate_up's even outputs), 1: up (odd outputs), 2: down (all)
  };
  /// One Hugging Face tensor: exactly one of st / gguf / mem / oss is set.
  struct Loc {
    std::vector<int64_t> shape;  ///< Hugging Face (row-major) shape
    const SafetensorsFile* st = nullptr;
    const SafetensorsEntry* entry = nullptr;
    const GgufTensorInfo* gguf = nullptr;
    int64_t expert = -1;        ///< GGUF stacked experts: the slice [expert] of a 3-D tensor
    int64_t row0 = 0;           ///< GGUF fused gate/up stack: first row of the part in the slice
    int64_t permute_heads = 0;  ///< GGUF LLaMA q/k: llama.cpp's row permutation to undo
    const HostTensor* mem = nullptr;
    std::optional<OssSlice> oss;
  };
  LoadedModel header;  ///< no tensors
  std::map<std::string, Loc> tensors;
  SafetensorsSet safetensors;
  std::unique_ptr<GgufFile> gguf;
  std::map<std::string, HostTensor> mem;
  /// Phi-3: the entries of the layout's q/k/v and gate/up tensors, row ranges of the
  /// checkpoint's fused ones (stable addresses: Loc::entry points here)
  std::deque<SafetensorsEntry> slices;

  /// Tensor `name`; throws std::runtime_error naming the source when it is not there.
  const Loc& at(const std::string& name) const;
};

/// Replaces the stacked (or MXFP4) expert tensors of a Hugging Face GPT-OSS checkpoint in
/// `s.tensors` by the layout's per-expert tensors (OssSlice), checking the stacks' names and
/// shapes; nothing is read. Throws std::runtime_error("<where>: ...") naming a missing or
/// misshapen tensor.
void gpt_oss_hf_expert_slices(ModelSource::Impl& s, const std::string& where);
/// Slice `o` (layout shape `shape`) as fp32: the values gpt_oss_experts_from_hf gives, bit
/// for bit. Throws std::runtime_error naming a "_blocks" / "_scales" tensor that holds values
/// other than bytes.
std::vector<float> gpt_oss_read_f32(const ModelSource::Impl::OssSlice& o, const std::vector<int64_t>& shape);
/// MXFP4 slice `o` copied into mxfp4 storage at `dst` (mxfp4_from_hf, row by row: the
/// checkpoint's codes and exponents, no fp32 copy); false (nothing written) for another
/// format or a slice that is not MXFP4.
bool gpt_oss_read_stored(const ModelSource::Impl::OssSlice& o, const std::vector<int64_t>& shape,
                         WeightFormat fmt, void* dst);

/// Replaces each fused projection of a Hugging Face Phi-3 checkpoint in `s.tensors`
/// (formats/phi3_hf.hpp) by the layout's tensors, row ranges of its entry; nothing is read.
/// Throws std::runtime_error("<where>: ...") naming a missing or misshapen fused tensor.
void split_fused_projections(ModelSource::Impl& s, const std::string& where);

/// Opens a GGUF model into `s` (header, tensors; not yet checked against the layout).
void open_gguf_source(const std::string& path, ModelSource::Impl& s);
/// Tensor `l` of `f` as fp32 in Hugging Face order (LLaMA q/k un-permuted).
std::vector<float> gguf_read_f32(const GgufFile& f, const ModelSource::Impl::Loc& l);
/// Copies tensor `l` of `f` into `dst` in storage form `fmt` when its ggml type has that very
/// layout (F32/F16/BF16 elements, Q8_0/Q4_0/MXFP4 blocks); false (nothing written) otherwise.
bool gguf_read_stored(const GgufFile& f, const ModelSource::Impl::Loc& l, WeightFormat fmt, void* dst);

}  // namespace rp
