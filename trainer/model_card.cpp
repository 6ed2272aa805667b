#include "trainer/model_card.hpp"

#include "base/output_folder.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/checksum.hpp"
#include "kernels/weight_format.hpp"

namespace rp {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOwnerLine = "<!-- roundpipe model card, xxh3 ";

std::string xxh3_hex(const std::string& text) {
  return fmt::format("{:016x}", checksum64(text.data(), text.size()));
}

/// A YAML scalar: double-quoted, with '\\' and '"' escaped and control bytes dropped.
std::string yaml_quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

/// `s` inside a Markdown code span, on one line.
std::string code(const std::string& s) {
  std::string t;
  for (const char c : s) t += (c == '\n' || c == '\r' || c == '`') ? ' ' : c;
  return "`" + t + "`";
}

/// "name (N bytes)" of a data file, or of a folder's files (count and total bytes).
std::string data_line(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    uint64_t bytes = 0, files = 0;
    for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file(ec)) bytes += it->file_size(ec), ++files;
    return fmt::format("{} (folder: {} files, {} bytes)", code(path), files, bytes);
  }
  const auto bytes = fs::file_size(path, ec);
  return ec ? fmt::format("{} (not readable now)", code(path))
            : fmt::format("{} ({} bytes)", code(path), bytes);
}

std::string number(double x) { return fmt::format("{:g}", x); }

void front_matter(std::ostringstream& o, const ModelCardFacts& f) {
  const bool adapter = f.kind == ModelCardFacts::Kind::adapter;
  o << "---\n";
  o << "library_name: " << (adapter ? "peft" : "transformers") << "\n";
  if (!f.base.id.empty()) o << "base_model: " << yaml_quoted(f.base.id) << "\n";
  o << "pipeline_tag: text-generation\n";
  o << "tags:\n- roundpipe\n- fine-tuned\n";
  if (adapter) o << "- lora\n";
  if (f.kind == ModelCardFacts::Kind::merged) o << "- lora-merged\n";
  o << "---\n\n";
}

void training_section(std::ostringstream& o, const ModelCardFacts& f) {
  const TrainSpec& s = *f.spec;
  // what ran: "auto" resolved, and the CPU backend computes in f32 whatever compute_dtype says
  const std::string backend = f.backend.empty() ? s.backend : f.backend;
  const std::string compute = backend == "cpu" ? "f32" : s.compute_dtype;
  o << "## Training\n\n";
  o << fmt::format("- steps: {} of {} ({} epochs of {} training sequences)\n", f.steps_done, s.steps,
                   number(std::round(f.epochs * 1000) / 1000), f.train_sequences);
  o << fmt::format(
      "- batch: {} sequences of {} tokens per step ({} micro-batches, {} accumulation pass{}), "
      "packing {}, {} worker{} ({} backend)\n",
      s.sequences_per_step, s.seq_len, s.micro_batches, s.accumulation, s.accumulation == 1 ? "" : "es",
      s.packing ? "on" : "off", s.workers, s.workers == 1 ? "" : "s", backend);
  o << fmt::format(
      "- optimizer: {} lr {}, betas ({}, {}), eps {}, weight decay {}, gradient clipping {}; {}\n",
      s.adam.decoupled ? "AdamW" : "Adam", number(s.adam.lr), number(s.adam.beta1), number(s.adam.beta2),
      number(s.adam.eps), number(s.adam.weight_decay),
      s.max_grad_norm > 0 ? "at norm " + number(s.max_grad_norm) : std::string("off"),
      s.async ? "staleness-1 (asynchronous) updates" : "synchronous updates");
  const LrSchedule& lr = s.lr_schedule;
  o << fmt::format("- learning-rate schedule: {}, warmup {} steps, min lr {}\n", lr.kind, lr.warmup_steps,
                   number(lr.min_lr));
  if (s.lora)
    o << fmt::format(
        "- LoRA: rank {}, alpha {}, dropout {}, rsLoRA {}, targets [{}]{}, frozen base stored as {}\n",
        s.lora->r, number(s.lora->alpha), number(s.lora->dropout), s.lora->use_rslora ? "on" : "off",
        fmt::join(s.lora->target_modules, ", "),
        s.lora->modules_to_save.empty()
            ? std::string()
            : fmt::format(", modules_to_save [{}]", fmt::join(s.lora->modules_to_save, ", ")),
        weight_format_name(s.lora->base_format));
  else if (!s.adapter.empty()) o << fmt::format("- LoRA: continued from the adapter {}\n", code(s.adapter));
  else o << "- full fine-tuning (every weight trained)\n";
  o << fmt::format("- precision: compute {}, weights saved as {}; chat template {}; data seed {}\n\n",
                   compute, s.save_dtype, s.chat_template, s.seed);
}

}  // namespace

std::string model_card_text(const ModelCardFacts& f) {
  if (!f.spec) throw std::invalid_argument("model_card_text: no spec");
  const TrainSpec& s = *f.spec;
  std::ostringstream o;
  front_matter(o, f);
  o << "# " << fs::path(f.folder).lexically_normal().string() << "\n\n";
  const char* what = f.kind == ModelCardFacts::Kind::adapter ? "A LoRA adapter (PEFT folder)"
                     : f.kind == ModelCardFacts::Kind::merged
                         ? "The base model with the run's LoRA adapters merged in"
                         : "A fine-tuned model";
  o << what << ", trained by `roundpipe train` (RoundPipe C++ " << f.version << ").\n\n";
  o << "## Base model\n\n";
  o << "- id: "
    << (f.base.id.empty() ? std::string("none known (set the spec's base_model_id)") : code(f.base.id))
    << (f.base.id_from.empty() ? "" : " (from " + f.base.id_from + ")") << "\n";
  o << "- local file: " << code(f.base.path) << "\n\n";
  o << "## Data\n\n";
  if (s.data_mixture.empty()) o << "- training: " << data_line(s.data) << "\n";
  for (const auto& d : s.data_mixture)
    o << "- training: " << data_line(d.path) << fmt::format(", weight {:g}\n", d.weight);
  for (const auto& p : eval_data_paths(s)) o << "- evaluation: " << data_line(p) << "\n";
  if (s.eval_data.empty() && s.eval_fraction > 0)
    o << fmt::format("- evaluation: {} held-out sequences ({}% of the training file's)\n", f.eval_sequences,
                     number(s.eval_fraction * 100));
  if (s.max_examples > 0) o << fmt::format("- the first {} examples only\n", s.max_examples);
  o << "\n";
  training_section(o, f);
  o << "## Results\n\n| | loss |\n|---|---|\n";
  o << "| train (step " << f.steps_done << ") | "
    << (f.train_loss ? fmt::format("{:.4f}", *f.train_loss) : std::string("not measured in this run"))
    << " |\n";
  if (f.eval_loss)
    o << fmt::format("| eval (after step {}) | {:.4f} (perplexity {:.2f}) |\n", f.eval_step, *f.eval_loss,
                     std::exp(*f.eval_loss));
  else o << "| eval | not evaluated |\n";
  o << "\n";
  if (f.kind == ModelCardFacts::Kind::adapter)
    o << "Load it with PEFT (`AutoPeftModelForCausalLM.from_pretrained(folder)` when the base id above is "
         "set) "
         "or `roundpipe generate "
      << fs::path(f.folder).lexically_normal().string() << "`.\n\n";
  const std::string body = o.str();
  return body + kOwnerLine + xxh3_hex(body) + " -->\n";
}

bool is_roundpipe_model_card(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() < 2 || text.back() != '\n') return false;
  const size_t line = text.rfind('\n', text.size() - 2);
  const size_t start = line == std::string::npos ? 0 : line + 1;
  const std::string last = text.substr(start);
  const std::string body = text.substr(0, start);
  return last == std::string(kOwnerLine) + xxh3_hex(body) + " -->\n";
}

bool place_model_card(const std::string& new_dir, const std::string& old_dir, const std::string& card) {
  const fs::path old_card = fs::path(old_dir) / kModelCardFile, dst = fs::path(new_dir) / kModelCardFile;
  std::error_code ec;
  if (fs::exists(fs::symlink_status(old_card, ec))) {
    // the user's (or a card the user edited): the rewrite of the folder keeps it where it is
    // (replace_folder carries what the manifest does not prove roundpipe's), never listed as ours
    const auto foreign = foreign_names(old_dir);
    if (std::find(foreign.begin(), foreign.end(), kModelCardFile) != foreign.end()) return false;
  }
  std::ofstream out(dst, std::ios::binary);
  out << card;
  out.close();
  if (!out) throw std::runtime_error(fmt::format("{}: write failed (disk full?)", dst.string()));
  return true;
}

}  // namespace rp
