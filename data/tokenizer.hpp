// Byte-level BPE tokenizer loaded from a Hugging Face `tokenizer.json`.
//
// Supported (enough for Qwen2/Qwen3, LLaMA-3 and SmolLM2 tokenizers):
//   model          : {"type":"BPE"} with `vocab` {token: id} and `merges` given either as
//                    "a b" strings or as ["a","b"] pairs (rank = position in the list).
//   added_tokens   : matched literally in the raw text *before* normalisation and
//                    pre-tokenisation (longest match wins). Tokens flagged `special`
//                    are only matched when encode(..., allow_special=true); non-special
//                    added tokens (e.g. Qwen's <think>) are always matched, as in HF.
//                    The lstrip/rstrip/single_word flags are ignored.
//   normalizer     : null, or NFC (or a Sequence of NFC): Unicode normalisation form C
//                    through utf8proc (data/normalizer.hpp), applied to the text between
//                    added tokens as HF does; offsets still point into the input.
//   pre_tokenizer  : ByteLevel (use_regex=true => GPT-2 regex; add_prefix_space),
//                    Split {pattern {Regex|String}, behavior Isolated | Removed |
//                    MergedWithPrevious | MergedWithNext | Contiguous, invert},
//                    Digits {individual_digits}, and Sequence of these. Regexes run on
//                    PCRE2 in UTF + Unicode-property mode (PCRE2_UTF|PCRE2_UCP), JIT
//                    compiled once at load.
//   post_processor : TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel and
//                    Sequence: the special tokens HF's encode(add_special_tokens=True)
//                    puts around one sequence (LLaMA-3: <|begin_of_text|> before it);
//                    encode_with_special_tokens() applies them, encode() never does.
//   decoder        : byte-level (every vocab token is mapped back through the GPT-2
//                    bytes<->unicode table; added tokens decode to their literal text).
// Token ids are int32_t throughout; -1 means "no such token".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace rp {

class Tokenizer {
 public:
  /// Loads `tokenizer_json_path`. If a `tokenizer_config.json` sits in the same folder,
  /// its `eos_token`, `bos_token` and `chat_template` are read as hints (see eos_id()).
  /// Throws std::runtime_error naming the file when it cannot be read or parsed, or
  /// when it uses a model/pre-tokenizer type listed as unsupported above.
  static Tokenizer from_file(const std::string& tokenizer_json_path);

  /// Builds from an already parsed tokenizer.json document. `where` names the source in
  /// error messages (a path, or e.g. "gguf:model.gguf"). Throws std::runtime_error.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json, const std::string& where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Encodes UTF-8 `text` to token ids (no BOS/EOS added). With allow_special=false,
  /// special added tokens in the text are tokenised as ordinary text. Invalid UTF-8 is
  /// tolerated: each invalid byte becomes a pre-token of its own, so bytes still
  /// round-trip. Thread-safe (the per-word cache is guarded by a mutex). Throws
  /// std::runtime_error only if the vocab lacks a byte token needed by the text.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;

  /// prefix_tokens() + encode(text) + suffix_tokens(): what HF's tokenizer(text) (with
  /// add_special_tokens=True) gives, e.g. <|begin_of_text|> first for LLaMA-3.
  std::vector<int32_t> encode_with_special_tokens(std::string_view text) const;
  /// The post-processor's special tokens before / after a single sequence (often empty).
  const std::vector<int32_t>& prefix_tokens() const;
  const std::vector<int32_t>& suffix_tokens() const;

  /// Like encode(), additionally returning in `byte_offsets[i]` the byte offset in
  /// `text` at which token i starts (same length as the returned ids).
  std::vector<int32_t> encode_with_offsets(std::string_view text, std::vector<size_t>& byte_offsets,
                                           bool allow_special = true) const;

  /// Decodes ids back to UTF-8 bytes: byte-level tokens are un-mapped to raw bytes, added
  /// tokens contribute their literal content. Throws std::out_of_range for an id outside
  /// [0, vocab_size()) or an id that no token uses. decode(encode(x)) == x for any x.
  std::string decode(const std::vector<int32_t>& ids) const;
  /// True when `id` names a token decode() can write (a vocab or added token). A model's
  /// vocab_size may exceed the tokenizer's ids (Qwen3 pads 151,669 tokens to 151,936 rows).
  bool has_token(int32_t id) const;

  /// Id of the token whose vocab string (byte-level alphabet, e.g. "Ġthe") or added-token
  /// content is exactly `token`; -1 if absent.
  int32_t token_id(std::string_view token) const;

  /// The token string of `id` as stored in tokenizer.json ("" for an unused id).
  /// Throws std::out_of_range when id is outside [0, vocab_size()).
  const std::string& token_text(int32_t id) const;

  /// 1 + the largest id used by the vocab or an added token.
  size_t vocab_size() const;

  /// End-of-sequence id: the setter's value if set, else tokenizer_config.json's
  /// eos_token, else the first present of <|endoftext|>, <|end_of_text|>, </s>, <|im_end|>,
  /// <|eot_id|>; -1 if none.
  int32_t eos_id() const;
  /// Beginning-of-sequence id: setter, else tokenizer_config.json's bos_token, else -1.
  /// Note: encode() never inserts it; callers that want BOS prepend it themselves.
  int32_t bos_id() const;
  void set_eos_id(int32_t id);
  void set_bos_id(int32_t id);
  /// Sets EOS/BOS by token text; throws std::invalid_argument if the token is absent.
  void set_eos_token(std::string_view token);
  void set_bos_token(std::string_view token);

  /// The `chat_template` string of the sibling tokenizer_config.json ("" when none).
  const std::string& chat_template() const;
  void set_chat_template(std::string jinja_text);

  /// True when `id` is an added token flagged `special`.
  bool is_special(int32_t id) const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rp
