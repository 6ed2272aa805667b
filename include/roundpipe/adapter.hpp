// LoRA adapters as files: PEFT-compatible adapter folders (export and import) and the merge
// of the adapters into the base weights (a plain Hugging Face checkpoint).
//
// A PEFT adapter folder (what peft's save_pretrained writes and PeftModel.from_pretrained
// reads) holds:
//   adapter_config.json        peft_type "LORA", r, lora_alpha, lora_dropout, target_modules,
//                              use_rslora, modules_to_save, base_model_name_or_path, ...
//   roundpipe_base.json        (a run's folders only) the base's model id and local path:
//                              base_model_name_or_path names the id (BaseModelRef below)
//   adapter_model.safetensors  "base_model.model.<HF name>" for every tensor:
//     base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight  [r, in]
//     base_model.model.model.layers.<i>.self_attn.q_proj.lora_B.weight  [out, r]
//     (k_proj, v_proj, o_proj under self_attn; gate_proj, up_proj, down_proj under mlp)
//     base_model.model.model.embed_tokens.weight [vocab, hidden]  modules_to_save "embed_tokens"
//     base_model.model.lm_head.weight            [vocab, hidden]  modules_to_save "lm_head"
//     base_model.model.model.layers.<i>.mlp.experts[.base_layer].lora_A.weight [E*r, in] and
//     ...lora_B.weight [out, r*E]: per-expert adapters (target_parameters, PEFT's ParamWrapper;
//     the layout and the nesting in formats/peft_experts.hpp)
// (PEFT stores a modules_to_save copy under the module's own name, without the
// ".modules_to_save.default" of its wrapper.)
//
// Tied embeddings. The runtime trains one matrix for both ends (group 0), so whichever of
// embed_tokens / lm_head is in modules_to_save, both change together. PEFT keeps them tied only
// with "ensure_weight_tying": true (then it saves both keys); without it, PEFT trains a copy of
// the named module and leaves the other at the base weight, which unties them. The export writes
// both keys and ensure_weight_tying true, so PEFT loads exactly the model the runtime trained.
// An imported adapter of a tied model that names only one of the two without ensure_weight_tying
// unties the model: peft_adapter_unties() says so, and the caller builds its layout from
// untie_embeddings(base) (lm_head.weight = a copy of the embedding, tie_word_embeddings false),
// after which the merged checkpoint holds both matrices and tie_word_embeddings false.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/dtype.hpp"
#include "roundpipe/model.hpp"

namespace rp {

class ModelSource;  // roundpipe/model_source.hpp

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

/// "base_model.model." + `name` (our tensor names are the Hugging Face ones).
std::string peft_tensor_key(const std::string& name);
/// The inverse: `key` without "base_model.model.", or "" when it lacks that prefix.
std::string tensor_name_of_peft_key(const std::string& key);

/// The seven linear module names of a decoder layer in the layer's order (q, k, v, o, gate,
/// up, down) that `lora.target_modules` selects ("all-linear" selects all seven). Throws
/// std::invalid_argument("lora.target_modules: ...") for an unknown name.
std::vector<std::string> lora_target_list(const LoraConfig& lora);

/// adapter_config.json for the LoRA `layout` (see the file comment): target_modules as the
/// explicit list of lora_target_list (in a model with mixture-of-experts layers the MLP names
/// as the full paths of the dense layers' modules, so PEFT does not take them for the experts;
/// null when only experts are adapted), target_parameters when experts carry adapters, modules_to_save as
/// trained (plus "model.norm" when the head group, which holds the final norm beside lm_head, is trainable),
/// ensure_weight_tying true when the model ties its embeddings and trains them, base_model_name_or_path (null
/// when ""). Throws std::invalid_argument when layout.lora is empty.
nlohmann::json peft_adapter_config(const ModelLayout& layout, const std::string& base_model_name_or_path);

/// Writes adapter_config.json and adapter_model.safetensors into the existing folder `dir`:
/// every tensor of the adapter groups (layout.adapter_group), and the tensors of the trainable
/// base groups: group 0's embedding (a tied model's also under lm_head's key, see the file
/// comment), the head group's lm_head.weight and model.norm.weight (the runtime trains the
/// group as one; PEFT knows the norm as modules_to_save "model.norm").
/// `group_data` has one pointer per layout group, fp32 at the TensorSpec element offsets (the
/// trainer's Session::group_weights_f32); pointers of groups it does not write may be null.
/// Tensors are written in `dtype` (f32, bf16, f16). Each file is replaced atomically. Throws
/// std::invalid_argument when layout.lora is empty or the group count differs,
/// std::runtime_error("<file>: <what>") on I/O errors.
void write_peft_adapter(const std::string& dir, const ModelLayout& layout,
                        const std::vector<const float*>& group_data,
                        const std::string& base_model_name_or_path, DType dtype = DType::f32);

/// write_peft_adapter into a fresh folder that replaces `dir` atomically (base/atomic_file.hpp):
/// after a failure `dir` is as it was, never partial. `extra` (optional) is called with the
/// temporary folder once the adapter is written there and before it replaces `dir` (as in
/// save_hf_checkpoint); an exception from it aborts the save.
void save_peft_adapter(const std::string& dir, const ModelLayout& layout,
                       const std::vector<const float*>& group_data,
                       const std::string& base_model_name_or_path, DType dtype = DType::f32,
                       const std::function<void(const std::string& tmp_dir)>& extra = {});

/// The base model of an adapter, as adapter_config.json names it and as this machine has it.
/// base_model_name_or_path must name what PEFT's AutoPeftModelForCausalLM can load anywhere:
/// a Hugging Face model id ("HuggingFaceTB/SmolLM2-135M"), not the local file a run read. The
/// local path goes into kAdapterBaseFile beside it, which roundpipe generate / merge read first.
struct BaseModelRef {
  std::string id;    ///< "owner/name" ("" when none is known: then the adapter names `path`)
  std::string path;  ///< the local .gguf or folder, absolute when it exists
  std::string
      id_from;  ///< where `id` came from: "base_model_id", "config.json _name_or_path", "GGUF metadata"
  /// What base_model_name_or_path records: `id`, else `path`.
  const std::string& portable() const { return id.empty() ? path : id; }
};

/// "roundpipe_base.json": {"written_by", "base_model_id" (or null), "base_model_path"}, written
/// into a run's adapter folders beside adapter_config.json.
inline constexpr const char* kAdapterBaseFile = "roundpipe_base.json";

/// Whether `s` has the form of a Hugging Face model id, "owner/name" (letters, digits, '-',
/// '_', '.'; no part starting or ending with '.' or '-', no "..", "--", at most 96 bytes).
bool is_hub_model_id(const std::string& s);

/// The model id a local model names for itself, "" when none: a folder's config.json
/// "_name_or_path" when it is a model id; a GGUF's general.source.huggingface.repository, else
/// the id in general.source.url or general.base_model.0.repo_url (a huggingface.co address).
/// Throws what GgufFile throws for an unreadable GGUF.
std::string hub_id_of_model(const std::string& path);

/// The reference of a run's base: `base_model_id` when not "" (the spec's key), else
/// hub_id_of_model(model_path); `path` is model_path made absolute when it exists.
BaseModelRef base_model_ref(const std::string& model_path, const std::string& base_model_id);

/// Writes kAdapterBaseFile of `base` into folder `dir` (atomically). Throws
/// std::runtime_error("<file>: ...") on I/O errors.
void write_adapter_base_record(const std::string& dir, const BaseModelRef& base);

/// base_model_path of `adapter_dir`'s kAdapterBaseFile, "" when there is none or it is not
/// readable (a PEFT-made adapter folder has none).
std::string adapter_base_path(const std::string& adapter_dir);

/// A PEFT adapter folder read into memory.
struct PeftAdapter {
  std::string dir;
  /// r, alpha, dropout, target_modules (short names, layer order), target_parameters
  /// (kExpertProjNames, gate_up first), use_rslora, modules_to_save ("embed_tokens" /
  /// "lm_head"); base_format and seed keep LoraConfig's defaults.
  LoraConfig lora;
  bool ensure_weight_tying = false;
  /// modules_to_save names the final norm ("model.norm"; the runtime's head group trains it
  /// with lm_head); it is not part of lora.modules_to_save.
  bool final_norm = false;
  std::string base_model_name_or_path;  ///< "" when null or absent
  /// Our (Hugging Face) names -> fp32 tensors: "model.layers.<i>.<self_attn|mlp>.<m>.lora_A.weight",
  /// "...lora_B.weight", "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", and
  /// the experts' adapters already in the runtime's layout (model/lora.hpp expert_lora_tensors).
  std::map<std::string, HostTensor> tensors;
};

/// Reads the LoRA settings of an adapter_config.json object (`where` names the file in
/// errors). Refuses what the runtime does not compute, with one line
/// "<where>: key '<k>': expected <what>, got <value>": peft_type other than "LORA", r < 1,
/// target_modules that is a regular expression or names another module, use_dora, bias other
/// than "none", fan_in_fan_out, rank_pattern / alpha_pattern, layers_to_transform,
/// modules_to_save other than embed_tokens / lm_head / model.norm. Unknown keys are ignored (PEFT adds keys
/// in every release). Throws std::runtime_error.
PeftAdapter peft_adapter_from_config(const nlohmann::json& config, const std::string& where);

/// Reads `dir`/adapter_config.json and `dir`/adapter_model.safetensors (F32, F16 or BF16).
/// Throws std::runtime_error naming the file (and the key): missing files (an
/// adapter_model.bin alone: "pickle adapters are not read"), a key without the
/// "base_model.model." prefix or of a tensor LoRA does not have (lora_magnitude_vector, a
/// bias, ...), a lora_A / lora_B of a module outside target_modules, a modules_to_save matrix
/// that modules_to_save does not name.
PeftAdapter read_peft_adapter(const std::string& dir);

/// True when `a` on a model with config `base` gives PEFT's untied result: `base` ties its
/// embeddings, ensure_weight_tying is false and the adapter holds exactly one of
/// embed_tokens / lm_head (or both, with different values).
bool peft_adapter_unties(const PeftAdapter& a, const ModelConfig& base);

/// Unties `m`: tie_word_embeddings false and tensors["lm_head.weight"] = a copy of the
/// embedding. No-op for an untied model.
void untie_embeddings(LoadedModel& m);

/// Copies the adapter `a` into the adapter groups (and the modules_to_save groups) of
/// `layout`, a layout with LoRA (make_layout(config, lora)), whose other groups in
/// `group_data` keep their values. `group_data` holds layout.groups.size() buffers of
/// group.numel floats (frozen groups: unused here). Checks, with one line naming the file and
/// the key: r and the target modules equal the layout's, every adapter tensor of the layout
/// present with its shape (a final norm in the file needs the head group trainable; a
/// trainable head group without one in the file keeps the base norm) ("<dir>/adapter_model.safetensors: key
/// '<peft key>': expected shape [4, 64], got [8, 64]"), no tensor the layout lacks, modules_to_save the same
/// set, tied embeddings with both matrices equal (else peft_adapter_unties: untie first). Throws
/// std::invalid_argument when layout.lora is empty, std::runtime_error for the file checks.
void load_peft_adapter(const PeftAdapter& a, const ModelLayout& layout,
                       std::vector<std::vector<float>>& group_data);

/// W += scaling * B A for one linear: W [out, in], A [r, in], B [out, r], all fp32 row-major.
/// Each element's update is summed in double and rounded once (PEFT's merge computes B @ A in
/// the weight's dtype; the two agree to fp32 rounding).
void fold_lora(float* w, const float* a, const float* b, int64_t out, int64_t in, int64_t r, double scaling);
/// Folds decoder l's adapters (group layout.adapter_group(l) of a LoRA layout, values at
/// `adapters`) into that decoder's plain weights: `base` is group l of make_layout(config) with
/// its fp32 values at `base_data` (W += s B A for each adapted linear, and per expert for expert
/// adapters). Throws std::invalid_argument naming a missing or misshapen tensor.
void fold_decoder_adapters(const ModelLayout& layout, int l, const float* adapters, const ParamGroup& base,
                           float* base_data);

/// The base weights of a LoRA `layout` with every adapter folded in (W' = W + scaling B A,
/// Hu et al. 2021, eq. 3) and the modules_to_save matrices as trained: the layout of
/// make_layout(layout.config) (no adapter groups, nothing frozen) and its fp32 groups.
struct MergedWeights {
  ModelLayout layout;
  std::vector<std::vector<float>> groups;
};
/// `group_data`: one pointer per group of `layout`, fp32 at the element offsets (frozen groups
/// dequantized: Session::group_weights_f32). Throws std::invalid_argument when layout.lora is
/// empty, the group count differs or a pointer is null.
MergedWeights merge_adapters(const ModelLayout& layout, const std::vector<const float*>& group_data);

/// merge_adapters + save_hf_checkpoint: a plain Hugging Face folder (config.json,
/// model.safetensors, tokenizer files) with no adapter file, replacing `dir` atomically.
void save_merged_checkpoint(const std::string& dir, const ModelLayout& layout,
                            const std::vector<const float*>& group_data, const nlohmann::json& tokenizer_json,
                            const std::string& chat_template, DType dtype);

/// Folds the PEFT adapter `a` into the base model `m` in place (tensor by tensor, no runtime
/// layout needed): untie_embeddings first when peft_adapter_unties, then W += scaling B A for
/// every adapter pair and the modules_to_save tensors replace the base ones (tied: the
/// embedding). Throws std::runtime_error naming the adapter file and key for a base tensor
/// that is missing or of another shape.
void merge_peft_adapter(LoadedModel& m, const PeftAdapter& a);

/// The PEFT adapter folder `adapter_dir` folded into its base model (`base`, or else the local
/// path of the folder's kAdapterBaseFile when that exists, or else the adapter's
/// base_model_name_or_path: as given, or relative to the adapter folder), in memory:
/// the base's config, tokenizer and chat template with merged tensors. `base_path`, when not
/// null, receives the base model's path. Throws std::runtime_error naming the file and key
/// ("<dir>/adapter_config.json: key 'base_model_name_or_path': ... pass the base model
/// explicitly" when it is no local model).
LoadedModel load_merged_adapter(const std::string& adapter_dir, const std::string& base,
                                std::string* base_path);
/// load_model(path), or, for a PEFT adapter folder (it holds adapter_config.json: what a LoRA
/// run's checkpoints and final/ are), load_merged_adapter(path, base, nullptr). A non-empty
/// `base` for anything but an adapter folder throws std::invalid_argument ("--base: only for a
/// LoRA adapter folder; ...").
LoadedModel load_model_or_adapter(const std::string& path, const std::string& base = "");
/// load_model_or_adapter as a ModelSource: a model is opened to be read one tensor at a time
/// (ModelSource::open, nothing held in fp32), an adapter folder merged onto its base and held
/// (ModelSource::from_loaded). Throws as load_model_or_adapter.
ModelSource open_model_or_adapter(const std::string& path, const std::string& base = "");
/// `roundpipe merge`: reads the PEFT adapter folder `adapter_dir`, loads its base model
/// (`base`, or else the local path of kAdapterBaseFile, or else the adapter's
/// base_model_name_or_path: as given, or relative to the adapter folder), folds the adapter in
/// (merge_peft_adapter) and writes `out_dir`, a plain Hugging Face folder in `dtype` with the base model's
/// tokenizer and no adapter file, replacing it atomically; `out_dir` is checked against the adapter and the
/// base first (check_model_output_folder: std::invalid_argument, nothing written). Returns the base model's
/// path. Throws std::runtime_error naming the file and key ("<dir>/adapter_config.json: key
/// 'base_model_name_or_path': ... pass the base model explicitly" when it is no local model).
/// Streamed: the base is opened as a ModelSource and each layout group is read, folded
/// (the same values as merge_peft_adapter) and released as the writer reaches it, so the
/// host memory needed is the adapter plus about twice the largest group, not the fp32 model.
/// Every adapter tensor is checked against the base's shapes before anything is written.
std::string merge_peft_folder(const std::string& adapter_dir, const std::string& out_dir,
                              const std::string& base, DType dtype);

}  // namespace rp
