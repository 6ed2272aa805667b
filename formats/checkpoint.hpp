// Loading a model (GGUF file or Hugging Face folder) into fp32 host tensors, copying it into
// the runtime's parameter groups, and saving Hugging Face checkpoints atomically: the
// functions are public (roundpipe/checkpoint.hpp: load_model, fill_groups, save_hf_checkpoint,
// convert_gguf_to_hf) and implemented in formats/checkpoint.cpp (load_model: formats/model_source.cpp,
// fill_groups: model/fill_groups.cpp, in memory only).
#pragma once
#include "formats/safetensors.hpp"
#include "kernels/dtype.hpp"
#include "model/config.hpp"
#include "model/layout.hpp"
#include "roundpipe/checkpoint.hpp"
