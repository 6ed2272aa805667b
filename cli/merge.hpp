// `roundpipe merge ADAPTER_DIR OUT_DIR [--base MODEL] [--dtype f32|bf16|f16]`: folds a PEFT LoRA
// adapter folder (PEFT's save_pretrained or a LoRA run's final/) into its base model and writes a
// plain Hugging Face folder (roundpipe/adapter.hpp, merge_peft_folder).
#pragma once

namespace CLI {
class App;
}

namespace rp {

/// Registers the `merge` subcommand on `app`; it runs from its callback, prints errors as one
/// line "roundpipe: error: ..." and then exits with code 1 (CLI::RuntimeError).
void add_merge_command(CLI::App& app);

}  // namespace rp
