// Loading a model (GGUF file or Hugging Face folder) into fp32 host tensors, copying it into
// the runtime's parameter groups, and saving Hugging Face checkpoints atomically: the
// functions are public (roundpipe/checkpoint.hpp: load_model, fill_groups, save_hf_checkpoint,
// convert_gguf_to_hf) and implemented in model/checkpoint.cpp (load_model: model/model_source.cpp).
#pragma once
#include "kernels/dtype.hpp"
#include "model/config.hpp"
#include "model/layout.hpp"
#include "model/safetensors.hpp"
#include "roundpipe/checkpoint.hpp"
