// The commands that write a plain Hugging Face folder, under one save-dtype rule (bf16 unless
// --dtype, as a run's save_dtype):
//   `roundpipe merge ADAPTER_DIR OUT_DIR [--base MODEL] [--dtype f32|bf16|f16]` folds a PEFT LoRA
//   adapter folder (PEFT's save_pretrained or a LoRA run's final/) into its base model
//   (roundpipe/adapter.hpp, merge_peft_folder);
//   `roundpipe convert model.gguf OUT_DIR [--dtype ...]` converts a GGUF model
//   (roundpipe/checkpoint.hpp, convert_gguf_to_hf).
#pragma once

namespace CLI {
class App;
}

namespace rp {

/// Registers the `merge` subcommand on `app`; it runs from its callback, prints errors as one
/// line "roundpipe: error: ..." and then exits with code 1 (CLI::RuntimeError).
void add_merge_command(CLI::App& app);

/// Registers the `convert` subcommand on `app`, run and reporting errors as `merge` does.
void add_convert_command(CLI::App& app);

}  // namespace rp
