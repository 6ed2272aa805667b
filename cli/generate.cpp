#include "cli/generate.hpp"

#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/input_file.hpp"
#include "base/json_text.hpp"
#include "base/utf8.hpp"
#include "cli/command.hpp"
#include "data/chat_template.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/generate.hpp"
#include "trainer/checkpoint_bundle.hpp"
#include "trainer/sample.hpp"

namespace rp {

namespace fs = std::filesystem;
namespace {

struct GenerateCommandOptions {
  std::string model, base, prompt, chat, messages, system, chat_template = "auto", backend = "cpu",
                                                           dtype = "bf16";
  std::vector<std::string> stop;
  int64_t max_tokens = 128, top_k = 0, context = 0;
  double temperature = 0, top_p = 1;
  uint64_t seed = 0;
  bool no_think = false;
};

/// --messages FILE: a JSON array of {"role", "content"}.
std::vector<ChatMessage> read_messages(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw std::runtime_error(path +
                             ": is a folder; expected a JSON file: an array of {\"role\", \"content\"}");
  std::string text;
  try {
    text = read_input_file(path, "a JSON file: an array of {\"role\", \"content\"}");
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());  // the file's fault, not the command line's
  }
  nlohmann::json j;
  try {  // the shared reader: line and column, NUL bytes, duplicate keys, nesting, huge numbers
    j = parse_json_text(text, path, {.unique_keys = true});
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  if (!j.is_array() || j.empty())
    throw std::runtime_error(path + ": expected a JSON array of {\"role\", \"content\"}" +
                             (j.is_array() ? ", got []" : ""));
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_object() || !j[i].contains("role") || !j[i].contains("content") ||
        !j[i]["role"].is_string() || !j[i]["content"].is_string())
      throw std::runtime_error(fmt::format(
          "{}: element {} of {}: expected {{\"role\": str, \"content\": str}}", path, i + 1, j.size()));
    out.push_back({j[i]["role"], j[i]["content"], {}});
  }
  return out;
}

/// A text flag must be UTF-8 (the tokenizer's vocab may have no token for a stray byte, and its
/// error named no flag).
void check_utf8(const std::string& flag, const std::string& text) {
  if (const size_t ok = valid_utf8_prefix(text); ok != text.size())
    throw UsageError(fmt::format("{}: not UTF-8: byte 0x{:02x} at offset {}; expected UTF-8 text", flag,
                                 static_cast<unsigned char>(text[ok]), ok));
}

void run_generate(const GenerateCommandOptions& c) {
  const int given = !c.prompt.empty() + !c.chat.empty() + !c.messages.empty();
  if (given != 1)
    throw UsageError(given == 0 ? "give one of --prompt TEXT, --chat TEXT or --messages FILE, not empty"
                                : "give only one of --prompt TEXT, --chat TEXT or --messages FILE");
  // flags that would be ignored without a word
  if (!c.system.empty() && c.chat.empty())
    throw UsageError(fmt::format("--system: only with --chat (the system message before it); {}",
                                 c.prompt.empty() ? "--messages gives its own system message, if any"
                                                  : "--prompt is plain text, with no messages"));
  if (!c.prompt.empty() && c.no_think)
    throw UsageError(
        "--no-think: only with --chat or --messages (a chat template's enable_thinking); "
        "--prompt is plain text, rendered with no template");
  if (!c.prompt.empty() && c.chat_template != "auto")
    throw UsageError(
        fmt::format("--chat-template {}: only with --chat or --messages; --prompt is plain "
                    "text, rendered with no template",
                    c.chat_template));
  for (const std::string& s : c.stop)
    if (s.empty()) throw UsageError("--stop: expected a non-empty string, got \"\"");
  check_utf8("--prompt", c.prompt);
  check_utf8("--chat", c.chat);
  check_utf8("--system", c.system);
  for (const std::string& s : c.stop) check_utf8("--stop", s);
  SampleRequest r;
  if (!c.messages.empty()) {
    r.messages = read_messages(c.messages);
    r.messages_origin = c.messages;
  }
  if (!c.chat.empty()) {
    if (!c.system.empty()) r.messages.push_back({"system", c.system, {}});
    r.messages.push_back({"user", c.chat, {}});
  }
  r.text = c.prompt;
  r.chat_template = c.chat_template;
  r.enable_thinking = !c.no_think;
  r.stop = c.stop;
  r.generate.max_new_tokens = c.max_tokens;
  r.generate.temperature = c.temperature;
  r.generate.top_k = c.top_k;
  r.generate.top_p = c.top_p;
  r.generate.seed = c.seed;
  // a LoRA checkpoint: merged into its base (--base, else its adapter_config.json's)
  std::error_code ec;  // a run's output folder instead of one of its checkpoints
  const fs::path mp(c.model);
  if (fs::is_directory(mp, ec) && !fs::exists(mp / "config.json", ec) &&
      !fs::exists(mp / "adapter_config.json", ec))
    if (const auto inside = checkpoints_in(c.model); !inside.empty())
      throw std::invalid_argument(fmt::format("{}: a run's output folder, not a model; generate from {}/{}",
                                              c.model, c.model, newest_checkpoint(inside)));
  const LoadedModel lm = load_model_or_adapter(c.model, c.base);
  if (const int64_t trained = lm.config.max_position_embeddings; trained > 0 && c.context > trained)
    fmt::print(stderr,
               "warning: --context {} is past the model's max_position_embeddings ({}): positions beyond {} "
               "were not trained, and text there may degrade\n",
               c.context, trained, trained);
  GeneratorOptions go;
  go.backend = c.backend;
  go.dtype = parse_dtype(c.dtype);
  go.max_context = c.context;
  Generator gen(lm, go);
  const SampleResult res = sample(gen, lm, r, [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  fmt::print(stderr, "{} tokens after a prompt of {} in {:.2f} s ({:.1f} tokens/s) on {}\n", res.ids.size(),
             res.prompt_ids.size(), res.seconds, res.seconds > 0 ? double(res.ids.size()) / res.seconds : 0.0,
             gen.device_name());
  if (int64_t(res.ids.size()) < c.max_tokens &&
      int64_t(res.prompt_ids.size() + res.ids.size()) >= gen.max_context())
    fmt::print(stderr,
               "stopped at the context of {} positions before --max-tokens {} (--context sets it, up to the "
               "model's max_position_embeddings)\n",
               gen.max_context(), c.max_tokens);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto c = std::make_shared<GenerateCommandOptions>();
  auto* g = app.add_subcommand("generate",
                               "generate text from a model or checkpoint folder (KV cache, one device)");
  g->add_option(
       "model", c->model,
       "a .gguf file, a Hugging Face folder (e.g. runs/default/final) or a PEFT adapter folder (e.g. "
       "runs/lora/final: folded into its base model)")
      ->required();
  g->add_option(
       "--base", c->base,
       "a LoRA adapter folder's base model (default: the adapter_config.json's base_model_name_or_path)")
      ->check(non_empty_path_check("--base", "the adapter's base_model_name_or_path"));
  g->add_option("--prompt", c->prompt,
                "plain text to continue (with the tokenizer's BOS, as HF tokenizer(text))");
  g->add_option("--chat", c->chat,
                "a user message, rendered with the chat template and its generation prompt");
  g->add_option("--system", c->system, "a system message before --chat");
  g->add_option("--messages", c->messages, "a JSON file: an array of {\"role\", \"content\"} messages");
  g->add_option("--chat-template", c->chat_template,
                "auto (the model's own template, through the Jinja interpreter), jinja, or a hand-written "
                "chatml, qwen3, qwen3-no-think, smollm2, llama3")
      // checked as given, also where --prompt renders no template (a typo was accepted silently)
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto" || v == "jinja") return "";
            try {
              parse_chat_template_name(v);
              return "";
            } catch (const std::invalid_argument&) {
              return fmt::format("unknown chat template \"{}\" (valid: auto, jinja, {})", v,
                                 kChatTemplateNames);
            }
          },
          "TEMPLATE"));
  g->add_flag(
      "--no-think", c->no_think,
      "enable_thinking = false for the template (Qwen3: an empty think block ends the generation prompt)");
  g->add_option("--max-tokens", c->max_tokens, "most new tokens (default 128)")
      ->check(integer_check(int64_t(1), int64_t(1) << 20));
  g->add_option("--temperature", c->temperature, "0: greedy (default); > 0: sample")
      ->check(number_range_check(0.0, 100.0));
  g->add_option("--top-k", c->top_k, "sample among the k most likely tokens (0: all)")
      ->check(integer_check(int64_t(0), std::numeric_limits<int64_t>::max(), " (0: all)"));
  g->add_option("--top-p", c->top_p, "sample among the smallest set of probability >= p (1: all)")
      ->check(number_range_check(1e-6, 1.0));
  g->add_option("--seed", c->seed, "sampling seed")->check(integer_check(uint64_t(0)));
  g->add_option("--stop", c->stop,
                "stop once the text contains this (repeatable); eos and end of turn always stop");
  g->add_option("--backend", c->backend, "cpu (default), cuda or auto")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  g->add_option("--dtype", c->dtype, "CUDA storage dtype: bf16 (default) or f16")
      ->check(CLI::IsMember({"bf16", "f16"}));
  g->add_option("--context", c->context, "KV-cache rows (0: the model's max positions, at most 4096)")
      ->check(
          integer_check(int64_t(0), std::numeric_limits<int64_t>::max(), " (0: the model's max positions)"));
  g->callback(reporting_errors([c] { run_generate(*c); }));
}

}  // namespace rp
