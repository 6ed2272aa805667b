#include "cli/export_gguf.hpp"

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/signal_exit.hpp"
#include "formats/gguf_export.hpp"
#include "roundpipe/checkpoint.hpp"

namespace rp {

void add_export_gguf_command(CLI::App& app) {
  struct Options {
    std::string in, out, type = "f16", base;
    bool force = false;
  };
  auto o = std::make_shared<Options>();
  auto* c = app.add_subcommand(
      "export-gguf",
      "write a Hugging Face folder (a run's final/ or final-merged/; an adapter folder is merged "
      "into its base) as a GGUF file for llama.cpp (llama, qwen2, qwen3)");
  c->add_option("input", o->in, "model folder (config.json, model.safetensors, tokenizer.json)")->required();
  c->add_option("output", o->out, "the .gguf file to write (atomically)")->required();
  c->add_option(
       "--type", o->type,
       "type of the 2-D weights: f16 (default), bf16, or q8_0 (blocks of 32 with an f16 scale; rows not a "
       "multiple of 32 stay f16); norms and biases are always f32")
      ->check(CLI::IsMember({"f16", "bf16", "q8_0"}));
  c->add_option("--base", o->base,
                "a LoRA adapter folder's base model (default: the adapter_config.json's "
                "base_model_name_or_path)")
      ->check(non_empty_path_check("--base", "the adapter's base_model_name_or_path"));
  c->add_flag("--force", o->force,
              "replace OUTPUT when it is a GGUF file export-gguf wrote (any other file is never replaced)");
  c->callback(reporting_errors([o] {
    const ExitOnStopSignals interrupted;  // a stop signal takes back the half-written output
    // what a killed earlier export to the same file left (OUT.tmp-<pid> with its owner marker)
    for (const std::string& line : clean_model_folder_leftovers(o->out)) fmt::print("{}\n", line);
    const int64_t n = export_gguf(o->in, o->out, parse_gguf_export_type(o->type), o->force, o->base);
    fmt::print("wrote {} ({} tensors, {})\n", o->out, n, o->type);
  }));
}

}  // namespace rp
