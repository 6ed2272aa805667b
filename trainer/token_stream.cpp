// rp::TokenStream (roundpipe/data.hpp): a model's tokenizer + data/ (load, pack, shuffle).
#include <algorithm>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "base/host_resources.hpp"
#include "base/counted.hpp"
#include "base/error_text.hpp"
#include "data/chat_jinja.hpp"
#include "data/chat_template.hpp"
#include "data/dataset.hpp"
#include "data/tokenizer.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"
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
    if (requested == "jinja")
      throw std::invalid_argument(fmt::format("chat_template 'jinja': {} has no chat template (tokenizer_config.json "
                                              "chat_template or chat_template.jinja)",
                                              model.source));
    return ChatTemplate::chatml;
  }
  try {
    const auto [bos, eos] = tok ? template_special_tokens(*tok) : std::pair<std::string, std::string>();
    return ChatFormat(std::make_shared<const JinjaChat>(model.chat_template, bos, eos, template_file_name(model)));
  } catch (const jinja::TemplateError& e) {
    if (requested == "jinja") throw std::invalid_argument(fmt::format("{}: {}", model.source, e.what()));
    const ChatTemplate family = detect_chat_template(model.chat_template);
    spdlog::warn("the chat template of {} cannot be interpreted ({}); using the hand-written {} renderer instead",
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
  throw std::invalid_argument(fmt::format(
      "{}: token id {}{} from {} is not below the model's vocab_size {} (config.json): the "
      "embedding has no row for it; the tokenizer does not belong to this model",
      data_path, top, text.empty() ? std::string() : fmt::format(" (\"{}\")", excerpt(text)), tokenizer_origin(model), V));
}

}  // namespace

struct TokenStream::Impl {
  TokenStreamStats stats;
  PackedSequences held_out;  ///< evaluation sequences
  int32_t pad = 0;
  std::optional<BatchStream> stream;  ///< none without sequences
  BatchStream& batches() {
    if (!stream)
      throw std::invalid_argument(fmt::format(
          "no training sequence: {} tokens leave no target in any of the {} (their prompts are longer)",
          seq_len, counted(stats.examples, "example")));
    return *stream;
  }
  int64_t seq_len = 0;
};

TokenStream::TokenStream(const LoadedModel& model, const std::string& data_path, const TokenStreamOptions& o) {
  require_tokenizer(model);
  Tokenizer tok = Tokenizer::from_json(model.tokenizer_json, tokenizer_origin(model));
  if (model.config.eos_token_id >= 0) tok.set_eos_id(int32_t(model.config.eos_token_id));
  const ChatFormat chat = format_for(model, o.chat_template, &tok);
  Dataset ds = load_dataset(data_path, tok, chat);
  if (o.max_examples > 0 && int64_t(ds.examples.size()) > o.max_examples) ds.examples.resize(size_t(o.max_examples));
  PackedSequences packed = pack_sequences(ds, o.seq_len, tok.eos_id(), o.packing, host_available_bytes());
  check_ids_fit_the_model(model, data_path, tok, packed);
  PackedSequences held = split_off(packed, o.eval_fraction);
  TokenStreamStats st;
  st.examples = ds.examples.size();
  st.text_tokens = ds.text_stream.size();
  st.dropped_examples = packed.dropped_examples;
  st.truncated_examples = packed.truncated_examples;
  st.sequences = packed.size();
  st.eval_sequences = held.size();
  st.chat_template = chat.name();
  impl_ = std::make_unique<Impl>();
  impl_->stats = std::move(st);
  impl_->seq_len = o.seq_len;
  impl_->held_out = std::move(held);
  impl_->pad = tok.eos_id();
  if (packed.size() > 0) impl_->stream.emplace(std::move(packed), o.seed);
}

TokenStream::~TokenStream() = default;
TokenStream::TokenStream(TokenStream&&) noexcept = default;
TokenStream& TokenStream::operator=(TokenStream&&) noexcept = default;

std::string TokenStream::chat_template_for(const LoadedModel& model, const std::string& requested) {
  return format_for(model, requested, nullptr).name();
}

TokenBatch TokenStream::next(int64_t n_seq) { return impl_->batches().next(n_seq); }
int64_t TokenStream::position() const { return impl_->stream ? impl_->stream->position() : 0; }
void TokenStream::seek(int64_t position) { impl_->batches().seek(position); }
const TokenStreamStats& TokenStream::stats() const { return impl_->stats; }

std::vector<TokenBatch> TokenStream::evaluation_batches(int64_t n_seq) const {
  if (n_seq < 1) throw std::invalid_argument(fmt::format("evaluation_batches: n_seq must be >= 1, got {}", n_seq));
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
