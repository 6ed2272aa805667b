#include "cli/merge.hpp"

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/signal_exit.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"

namespace rp {

void add_merge_command(CLI::App& app) {
  struct Options {
    std::string adapter, out, base, dtype = "bf16";
  };
  auto o = std::make_shared<Options>();
  auto* c = app.add_subcommand(
      "merge", "fold a PEFT LoRA adapter folder into its base model (a plain Hugging Face folder)");
  c->add_option("adapter", o->adapter, "adapter folder (adapter_config.json + adapter_model.safetensors)")
      ->required();
  c->add_option("output", o->out, "output folder (written atomically)")->required();
  c->add_option("--base", o->base,
                "base model (.gguf or Hugging Face folder); default: the adapter's base_model_name_or_path")
      ->check(non_empty_path_check("--base", "the adapter's base_model_name_or_path"));
  c->add_option(
       "--dtype", o->dtype,
       "dtype of the written weights: f32, bf16 or f16 (default bf16, as convert and a run's save_dtype; f32 "
       "keeps the fp32 merge W + scaling B A exactly)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  c->callback(reporting_errors([o] {
    const ExitOnStopSignals interrupted;  // a stop signal takes back the half-written output
    for (const std::string& line : clean_model_folder_leftovers(o->out)) fmt::print("{}\n", line);
    const std::string base = merge_peft_folder(o->adapter, o->out, o->base, parse_dtype(o->dtype));
    fmt::print("merged {} into {} -> {}\n", o->adapter, base, o->out);
  }));
}

void add_convert_command(CLI::App& app) {
  struct Options {
    std::string in, out, dtype = "bf16";
  };
  auto o = std::make_shared<Options>();
  auto* c = app.add_subcommand("convert", "convert a GGUF model to a Hugging Face checkpoint folder");
  c->add_option("input", o->in, "model.gguf")->required();
  c->add_option("output", o->out, "output folder (written atomically)")->required();
  c->add_option(
       "--dtype", o->dtype,
       "dtype of the written weights: f32, bf16 or f16 (default bf16, as merge and a run's save_dtype; "
       "f32 keeps a dequantized or f32 model's values exactly)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  c->callback(reporting_errors([o] {
    const ExitOnStopSignals interrupted;  // a stop signal takes back the half-written output
    for (const std::string& line : clean_model_folder_leftovers(o->out)) fmt::print("{}\n", line);
    convert_gguf_to_hf(o->in, o->out, parse_dtype(o->dtype));
    fmt::print("wrote {}\n", o->out);
  }));
}

}  // namespace rp
