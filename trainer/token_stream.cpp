// rp::TokenStream (roundpipe/data.hpp): a model's tokenizer + data/ (load, pack, shuffle).
#include <algorithm>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/counted.hpp"
#include "base/error_text.hpp"
#include "base/host_resources.hpp"
#include "data/chat_jinja.hpp"
#include "data/chat_template.hpp"
#include "data/dataset.hpp"
#include "data/mixture.hpp"
#include "data/sequence_packer.hpp"
#include "data/tokenizer.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"
#include "roundpipe/spec.hpp"
#include "trainer/run_setup.hpp"

namespace rp {
namespace {

/// "auto": the model's own template through the Jinja interpreter when it has one (a template
/// the interpreter cannot parse falls back to the hand-written family it resembles, with a
/// warning), chatml when it has none; "jinja": the model's template or an error; a family name:
/// that hand-written renderer.
ChatFormat format_for(const LoadedModel& model, const std::string& requested, const Tokenizer* tok) {
  if (requested != "auto" && requested != "jinja") return parse_chat_template_name(requested);
  if (model.chat_template.empty()) {
    if (!model.chat_template_error.empty()) throw std::invalid_argument(model.chat_template_error);
    if (requested == "jinja")
      throw std::invalid_argument(
          fmt::format("chat_template 'jinja': {} has no chat template (tokenizer_config.json "
                      "chat_template or chat_template.jinja)",
                      model.source));
    return ChatTemplate::chatml;
  }
  try {
    const auto [bos, eos] = tok ? template_special_tokens(*tok) : std::pair<std::string, std::string>();
    return ChatFormat(
        std::make_shared<const JinjaChat>(model.chat_template, bos, eos, template_file_name(model)));
  } catch (const jinja::TemplateError& e) {
    if (requested == "jinja") throw std::invalid_argument(fmt::format("{}: {}", model.source, e.what()));
    ChatTemplate family;
    try {
      family = detect_chat_template(model.chat_template);
    } catch (const std::invalid_argument&) {  // no family to fall back to: the parse error itself
      throw std::invalid_argument(
          fmt::format("{}: {} (and it resembles no hand-written template: chatml, smollm2, llama3)",
                      model.source, e.what()));
    }
    spdlog::warn(
        "the chat template of {} cannot be interpreted ({}); using the hand-written {} renderer instead",
        model.source, e.what(), chat_template_name(family));
    return family;
  }
}

// Every token id of the data (and the pad) must have a row in the model's embedding: a
// tokenizer with more ids than config.json's vocab_size would otherwise fail inside the first
// step. Throws std::invalid_argument naming the data file, the id and its token.
void check_ids_fit_the_model(const LoadedModel& model, const std::string& data_path, const Tokenizer& tok,
                             const PackedSequences& packed) {
  const int64_t V = model.config.vocab_size;
  if (V <= 0) return;
  int32_t top = tok.eos_id();
  for (const int32_t id : packed.ids) top = std::max(top, id);
  if (top < V) return;
  const std::string text = tok.has_token(top) ? tok.token_text(top) : std::string();
  throw std::invalid_argument(
      fmt::format("{}: token id {}{} from {} is not below the model's vocab_size {} (config.json): the "
                  "embedding has no row for it; the tokenizer does not belong to this model",
                  data_path, top, text.empty() ? std::string() : fmt::format(" (\"{}\")", excerpt(text)),
                  tokenizer_origin(model), V));
}

}  // namespace

struct TokenStream::Impl {
  TokenStreamStats stats;
  PackedSequences held_out;  ///< evaluation sequences
  int32_t pad = 0;
  std::optional<BatchStream> stream;     ///< one file; none without sequences
  std::optional<MixtureStream> mixture;  ///< a weighted mixture of files
  void require_sequences() const {
    if (!stream && !mixture)
      throw std::invalid_argument(fmt::format(
          "no training sequence: {} tokens leave no target in any of the {} (their prompts are longer)",
          seq_len, counted(stats.examples, "example")));
  }
  int64_t seq_len = 0;
};

namespace {
/// One data file's training and held-out sequences, its stats added to `st`.
struct LoadedFile {
  PackedSequences train, held;
};

LoadedFile load_file(const LoadedModel& model, const Tokenizer& tok, const ChatFormat& chat,
                     const std::string& path, const TokenStreamOptions& o, TokenStreamStats& st) {
  // record by record into the packed sequences: memory holds them, not every example too
  SequencePacker packer(o.seq_len, tok.eos_id(), o.packing, host_available_bytes());
  load_dataset_into(path, tok, chat, packer, o.max_examples > 0 ? size_t(o.max_examples) : 0);
  LoadedFile f;
  f.train = packer.finish();
  check_ids_fit_the_model(model, path, tok, f.train);
  f.held = split_off(f.train, o.eval_fraction);
  st.examples += packer.examples();
  st.text_tokens += packer.text_tokens();
  st.dropped_examples += f.train.dropped_examples;
  st.truncated_examples += f.train.truncated_examples;
  st.sequences += f.train.size();
  st.eval_sequences += f.held.size();
  return f;
}

Tokenizer tokenizer_of(const LoadedModel& model) {
  require_tokenizer(model);
  Tokenizer tok = Tokenizer::from_json(model.tokenizer_json, tokenizer_origin(model));
  if (model.config.eos_token_id >= 0) tok.set_eos_id(int32_t(model.config.eos_token_id));
  // sequences are padded with it and every example ends with it
  if (tok.eos_id() < 0)
    throw std::invalid_argument(fmt::format(
        "{}: the model names no end-of-sequence token, which pads the training sequences and ends each "
        "example (expected eos_token_id in config.json or the GGUF's tokenizer.ggml.eos_token_id, eos_token "
        "in tokenizer_config.json, or one of <|endoftext|>, <|end_of_text|>, </s>, <|im_end|>, <|eot_id|> in "
        "{})",
        model.source, tokenizer_origin(model)));
  return tok;
}
}  // namespace

TokenStream::TokenStream(const LoadedModel& model, const std::string& data_path,
                         const TokenStreamOptions& o) {
  const Tokenizer tok = tokenizer_of(model);
  const ChatFormat chat = format_for(model, o.chat_template, &tok);
  impl_ = std::make_unique<Impl>();
  LoadedFile f = load_file(model, tok, chat, data_path, o, impl_->stats);
  impl_->stats.chat_template = chat.name();
  impl_->seq_len = o.seq_len;
  impl_->held_out = std::move(f.held);
  impl_->pad = tok.eos_id();
  if (f.train.size() > 0) impl_->stream.emplace(std::move(f.train), o.seed);
}

TokenStream::TokenStream(const LoadedModel& model, const std::vector<DataSource>& sources,
                         const TokenStreamOptions& o) {
  const Tokenizer tok = tokenizer_of(model);
  const ChatFormat chat = format_for(model, o.chat_template, &tok);
  impl_ = std::make_unique<Impl>();
  std::vector<MixtureSource> mix;
  for (const auto& src : sources) {
    LoadedFile f = load_file(model, tok, chat, src.path, o, impl_->stats);
    auto& held = impl_->held_out;  // every file's held-out sequences, in the order of the list
    held.seq_len = o.seq_len;
    held.ids.insert(held.ids.end(), f.held.ids.begin(), f.held.ids.end());
    held.targets.insert(held.targets.end(), f.held.targets.begin(), f.held.targets.end());
    held.positions.insert(held.positions.end(), f.held.positions.begin(), f.held.positions.end());
    if (f.train.size() == 0)
      throw std::invalid_argument(one_line(fmt::format(
          "{}: no training sequence at seq_len {} (every example's prompt is longer, or all are held out)",
          src.path, o.seq_len)));
    mix.push_back({src.path, std::move(f.train), src.weight});
  }
  impl_->stats.chat_template = chat.name();
  impl_->seq_len = o.seq_len;
  impl_->pad = tok.eos_id();
  impl_->mixture.emplace(std::move(mix), o.seed);
}

TokenStream::~TokenStream() = default;
TokenStream::TokenStream(TokenStream&&) noexcept = default;
TokenStream& TokenStream::operator=(TokenStream&&) noexcept = default;

std::string TokenStream::chat_template_for(const LoadedModel& model, const std::string& requested) {
  return format_for(model, requested, nullptr).name();
}

TokenBatch TokenStream::next(int64_t n_seq) {
  impl_->require_sequences();
  return impl_->mixture ? impl_->mixture->next(n_seq) : impl_->stream->next(n_seq);
}
int64_t TokenStream::position() const {
  return impl_->mixture ? impl_->mixture->position() : impl_->stream ? impl_->stream->position() : 0;
}
void TokenStream::seek(int64_t position) {
  impl_->require_sequences();
  if (impl_->mixture) impl_->mixture->seek(position);
  else impl_->stream->seek(position);
}
std::string TokenStream::mixture_proportions() const {
  return impl_->mixture ? impl_->mixture->proportions() : "";
}
const TokenStreamStats& TokenStream::stats() const { return impl_->stats; }

std::vector<TokenBatch> TokenStream::evaluation_batches(int64_t n_seq) const {
  if (n_seq < 1)
    throw std::invalid_argument(fmt::format("evaluation_batches: n_seq must be >= 1, got {}", n_seq));
  const PackedSequences& h = impl_->held_out;
  const size_t L = size_t(h.seq_len);
  std::vector<TokenBatch> out;
  for (int64_t first = 0; first < h.size(); first += n_seq) {
    TokenBatch b;
    b.n_seq = n_seq;
    b.seq_len = h.seq_len;
    b.ids.assign(size_t(n_seq) * L, impl_->pad);
    b.targets.assign(size_t(n_seq) * L, kIgnoreIndex);
    if (!h.positions.empty()) {
      b.positions.resize(size_t(n_seq) * L);
      for (size_t i = 0; i < b.positions.size(); ++i) b.positions[i] = int32_t(i % L);
    }
    const size_t n = size_t(std::min<int64_t>(n_seq, h.size() - first)) * L, a = size_t(first) * L;
    std::copy_n(h.ids.begin() + long(a), n, b.ids.begin());
    std::copy_n(h.targets.begin() + long(a), n, b.targets.begin());
    if (!h.positions.empty()) std::copy_n(h.positions.begin() + long(a), n, b.positions.begin());
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace rp
