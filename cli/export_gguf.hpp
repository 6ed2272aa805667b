// `roundpipe export-gguf IN_DIR OUT.gguf [--type f16|bf16|q8_0] [--force]`: a Hugging Face
// folder (a run's final/ or final-merged/, a convert output; a LoRA adapter folder is merged
// into its base first) as a GGUF file llama.cpp loads (formats/gguf_export.hpp).
#pragma once

namespace CLI {
class App;
}

namespace rp {

/// Registers the `export-gguf` subcommand on `app`; errors are one line "roundpipe: error:
/// ..." and exit code 1 (CLI::RuntimeError), as `merge`.
void add_export_gguf_command(CLI::App& app);

}  // namespace rp
