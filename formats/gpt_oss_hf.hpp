// GPT-OSS's expert tensors in Hugging Face checkpoints and in the layout.
//   HF (GptOssExperts): mlp.experts.gate_up_proj [E, H, 2F] (x @ W; gate in the even
//   columns, up in the odd ones), gate_up_proj_bias [E, 2F] (same interleaving),
//   down_proj [E, F, H], down_proj_bias [E, H]; or, quantized (quantization_config
//   quant_method "mxfp4"), gate_up_proj_blocks [E, 2F, H/32, 16] + gate_up_proj_scales
//   [E, 2F, H/32] and down_proj_blocks [E, H, F/32, 16] + down_proj_scales [E, H, F/32]
//   (U8: two E2M1 codes per byte, low nibble first, times 2^(scale - 127) per 32 values).
//   Layout (make_layout): mlp.experts.<e>.{gate,up,down}_proj.{weight,bias}, weights
//   [out, in] like nn.Linear, so each projection of all experts is one [E, out, in] stack.
#pragma once
#include <string>
#include <vector>

#include "formats/safetensors.hpp"  // TensorRef
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/model.hpp"

namespace rp {

/// Replaces the HF expert tensors of every layer of a gpt_oss model `m` (plain or MXFP4,
/// dequantized exactly to fp32) by the layout's per-expert tensors: the reference conversion.
/// ModelSource (formats/gpt_oss_source.cpp) gives the same values one expert tensor at a time
/// without holding the stacks in fp32. Throws
/// std::runtime_error("<where>: ...") naming a missing or misshapen tensor.
void gpt_oss_experts_from_hf(LoadedModel& m, const std::string& where);

/// The HF expert tensors of decoder `l` of a gpt_oss model (0-based): gate_up_proj
/// [E, H, 2F], gate_up_proj_bias [E, 2F], down_proj [E, F, H], down_proj_bias [E, H], in this
/// order, with their values (`values` empty: names and shapes only).
struct GptOssHfLayerExperts {
  std::vector<std::pair<std::string, std::vector<int64_t>>> specs;
  std::vector<std::vector<float>> values;
};
/// Names and shapes of decoder l's HF expert tensors; with `group` (the fp32 data of the
/// layout's group l + 1, that decoder's) their values too. Throws std::invalid_argument when
/// values are asked for and the layout's group lacks an expert tensor.
GptOssHfLayerExperts gpt_oss_layer_experts_to_hf(const ModelLayout& layout, int64_t l, const float* group);

/// "..._blocks" / "..._scales": an MXFP4 tensor of a checkpoint.
bool is_mxfp4_tensor_name(const std::string& name);
/// A tensor of a sparse block's experts ("....mlp.experts....").
bool is_gpt_oss_expert_name(const std::string& name);

}  // namespace rp
