// Training data: JSON (lines or arrays) / Parquet / Arrow IPC / plain-text loading, packing into fixed-length
// sequences, and a deterministic shuffled batch stream.
//
// Sequence construction respects the runtime's attention: it is causal *per sequence*
// with positions restarting at 0 in each sequence, so two examples packed into one
// sequence would attend to each other. Therefore
//   * supervised examples (prompt/completion, chat) get one sequence each: truncated to
//     seq_len + 1 tokens, padded with `pad_id` (usually eos);
//   * plain text (a .txt corpus, or {"text"} JSONL lines) is concatenated into one token
//     stream, documents separated by eos, and cut into windows of seq_len + 1 tokens that
//     overlap by one token (window k covers stream[k*seq_len, (k+1)*seq_len]); the final
//     partial window is kept and padded.
// For each sequence: ids[t] = token t, targets[t] = token t+1 when that token exists and
// its loss_mask is 1, else kIgnoreIndex (-100): masked tokens, padding, and the last real
// position of a padded example.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat_jinja.hpp"
#include "roundpipe/data.hpp"  // kIgnoreIndex, TokenBatch

namespace rp {

/// SplitMix64's output function (Steele, Lea, Flood 2014): the shuffles' and the mixture
/// draws' hash of a seed and a position.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

class Tokenizer;
class SequencePacker;  // data/sequence_packer.hpp

/// One tokenised training example: loss_mask[i] = 1 when token i is to be predicted.
struct Example {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  ///< same length as ids
};

/// A loaded data set, before packing.
struct Dataset {
  std::vector<Example> examples;     ///< supervised examples, one sequence each
  std::vector<int32_t> text_stream;  ///< plain text, every document followed by eos
  size_t num_documents = 0;          ///< documents in text_stream
};

/// One record of a data file and where it is, for error messages: "<path>:<line>" (JSON
/// lines), "<path>: element <i> of <n>" (JSON array) or "<path>: row <n>" (Parquet / Arrow).
using RecordFn = std::function<void(const nlohmann::ordered_json& record, const std::string& where)>;

/// Calls `record` for every record of a JSON lines file (read line by line: memory holds one
/// line, never the file) or JSON array, told by the first non-blank byte; nothing for an empty
/// file. Throws std::runtime_error with one line for invalid JSON and a file that is neither
/// (as load_json_records); whatever `record` throws passes through.
void for_each_json_record(const std::string& path, const RecordFn& record);

/// for_each_json_record, or the rows of a Parquet / Arrow IPC file (told by its magic; data/
/// arrow_records.hpp) as records.
void for_each_record(const std::string& path, const RecordFn& record);

/// Loads a JSON data file, recognised by its content (not its extension): a JSON array of
/// objects (first non-blank byte '[') or JSON lines, one object per line ('{'; blank lines
/// skipped; what `datasets`' to_json writes). Each object is one record of the shapes
///   {"text": str}                         -> text_stream: the post-processor's prefix (e.g.
///                                            LLaMA-3's <|begin_of_text|>), the tokens, eos
///   {"prompt": str, "completion": str}    -> example: prefix ++ encode(prompt + completion)
///                                            ++ eos, loss after the prompt's tokens (TRL)
///   {"prompt": [msgs], "completion": [msgs]} -> the conversation, loss after the prompt with
///                                            its generation prompt (prompt_completion_example)
///   {"messages": [{"role","content"[,"reasoning_content"]},..]}
///                                         -> example rendered by `chat` (chat_template.hpp),
///                                            loss on assistant turns + end-of-turn token
///   {"messages": [...], "tools"?: [...]}  with the model's own template (chat.jinja,
///                                            chat_jinja.hpp): every message object passes to
///                                            the template as written (roles system / user /
///                                            assistant / tool, content, tool_calls, ...), the
///                                            record's tools as `tools`; loss on the assistant
///                                            turns with their tool calls and end-of-turn token
///   {"conversations": [{"from","value"},..][, "system"]}   (ShareGPT; from human / gpt /
///                                            system) -> the same conversation
///   {"instruction", "input"?, "output"[, "system", "history": [[q, a],..]]}   (alpaca)
///                                         -> conversation [system], history turns, user =
///                                            instruction + "\n" + input, assistant = output
/// (HF's tokenizer(text) adds the post-processor's special tokens; chat templates carry
/// their own, as apply_chat_template.) Special tokens written in the text are matched.
/// Throws std::runtime_error with one line "<path>:<line>: <what>" (JSON lines) or
/// "<path>: element <i>: <what>" (array), e.g. `data.jsonl:17: expected a string at key
/// "completion"`, for a malformed record, a wrong type, a missing key, an unknown role or a
/// conversation without an assistant turn; "<path>: expected JSON lines ... or a JSON array"
/// for a file that is neither; "<path>: cannot open" / "<path>: no examples" for unreadable
/// or empty files; and when the tokenizer has no eos_id() and one is needed.
Dataset load_json_records(const std::string& path, const Tokenizer& tok, const ChatFormat& chat);

/// Loads plain text: `path` is one file, or a directory whose *.txt files (not recursive)
/// are read in lexicographic order. Each file is one document (prefix, tokens, eos as a
/// {"text"} record) in text_stream. Throws std::runtime_error when nothing can be read, a
/// file is not UTF-8 text (file_kind.hpp), the directory holds no .txt file, or the
/// tokenizer has no eos_id().
Dataset load_text_corpus(const std::string& path, const Tokenizer& tok);

/// `record` without its members that are null, in `storage` when it has any (else `record`
/// itself): a null counts as an absent key in every record shape, as Parquet and Arrow rows
/// leave a null column out (Hugging Face datasets' to_json writes a null for each column a
/// row lacks: {"text": "...", "prompt": null, "completion": null} is a document).
const nlohmann::ordered_json& record_without_nulls(const nlohmann::ordered_json& record,
                                                   nlohmann::ordered_json& storage);

/// The example of a prompt / completion record (`completion_key` "completion", or "chosen" /
/// "rejected" of preference data): strings as TRL tokenizes them, prefix ++ encode(prompt +
/// completion) ++ eos, the loss on the tokens after the first |prefix ++ encode(prompt)|;
/// conversational ({"prompt": [messages], "completion": [messages]}, TRL's conversational
/// prompt-completion, "tools" passed to a Jinja template) rendered by the chat template, the
/// loss on the tokens of render(prompt ++ completion) after render(prompt) with the
/// generation prompt (which must be its prefix), so on the completion's turns, end-of-turn
/// tokens and whatever the template writes after them. Throws std::runtime_error with one
/// line "<where>: <what>" (a missing key, a string beside a list, no assistant message in the
/// completion, a template that renders the prompt differently once the completion follows).
Example prompt_completion_example(const nlohmann::ordered_json& record, const char* completion_key,
                                  const std::string& where, const Tokenizer& tok, const ChatFormat& chat);

/// Loads a Parquet or Arrow IPC (file or stream) data file, recognised by its magic: every
/// row is one record of the shapes load_json_records takes, its columns the keys (nested
/// list<struct> for messages; data/arrow_records.hpp maps the types, a null leaves its key
/// out). Errors as load_json_records, naming "<path>: row <n>" (from 1); a damaged file, a
/// column type with no JSON counterpart, or a build without Arrow C++ give one line naming
/// the file (data/arrow_records.hpp).
Dataset load_columnar_records(const std::string& path, const Tokenizer& tok, const ChatFormat& chat);

/// Dispatch by content: a directory => load_text_corpus; a file starting with the Parquet or
/// Arrow IPC magic => load_columnar_records; any other file that is not UTF-8 text (a NUL
/// byte or invalid UTF-8 in its first KiB, or an archive's magic) is refused with one line
/// naming it and its first bytes in hex (file_kind.hpp); a .txt file => load_text_corpus; a
/// file whose content starts with '{' or '[', or named .json / .jsonl => load_json_records
/// (which refuses a .json file holding neither JSON lines nor an array); any other => plain text.
Dataset load_dataset(const std::string& path, const Tokenizer& tok, const ChatFormat& chat);

/// load_dataset straight into `packer`, record by record (text file by text file): host
/// memory holds the packed sequences and one record, never every tokenised example. With
/// max_examples > 0 only the first k supervised examples are packed (the others are still
/// read and checked). Throws as load_dataset, and as SequencePacker::add_example.
void load_dataset_into(const std::string& path, const Tokenizer& tok, const ChatFormat& chat,
                       SequencePacker& packer, size_t max_examples = 0);

/// Fixed-length training sequences, row-major [size(), seq_len].
struct PackedSequences {
  int64_t seq_len = 0;
  std::vector<int32_t> ids;      ///< input token ids; padding = pad_id
  std::vector<int32_t> targets;  ///< next-token ids, kIgnoreIndex where there is no loss
  /// Packed (pack_sequences with pack = true): each token's position within its example,
  /// restarting at 0 where an example begins (padding counts as one more example); empty
  /// otherwise.
  std::vector<int32_t> positions;
  size_t dropped_examples = 0;  ///< supervised examples with no target left after truncation
  /// Supervised examples longer than a sequence holds (seq_len + 1 tokens: seq_len inputs and
  /// the last one's target), whose tail was cut; dropped ones included.
  size_t truncated_examples = 0;
  int64_t size() const { return seq_len ? int64_t(ids.size()) / seq_len : 0; }
};

/// Packs `data` as described in the file comment: the examples' sequences first (in
/// order), then the text windows. Examples whose truncation leaves no target are dropped
/// and counted. With `pack`, supervised examples share sequences instead: each example
/// (truncated to seq_len tokens, its last token's target only when it was cut) goes after
/// the previous one in the current sequence while it fits, else starts the next one (order
/// kept; the rest of a sequence is padding), and `positions` restarts at 0 for each, so
/// with positions-aware attention (Session::forward_backward with positions) a packed
/// sequence computes exactly what its examples compute one by one. Text windows get
/// positions 0..seq_len-1. Throws std::invalid_argument when seq_len < 1 or pad_id < 0.
/// Throws std::length_error, before allocating, when the packed ids, targets (and positions)
/// would exceed `max_bytes` (0: no limit) or the size_t range.
PackedSequences pack_sequences(const Dataset& data, int64_t seq_len, int32_t pad_id, bool pack = false,
                               size_t max_bytes = 0);

/// Splits off every k-th sequence for evaluation: sequence i goes to the returned set when
/// floor((i+1)*fraction) > floor(i*fraction) (evenly spread, deterministic), the rest stay
/// in `seqs`. fraction 0: nothing; 1: everything. Throws std::invalid_argument outside [0, 1].
PackedSequences split_off(PackedSequences& seqs, double fraction);

/// Deterministic, endless iteration over packed sequences. Epoch e visits every sequence
/// once, in a permutation drawn from std::mt19937_64 seeded with (seed, e) via a
/// portable Fisher-Yates shuffle (identical on every platform and standard library);
/// with shuffle=false the order is 0..N-1. A batch may straddle two epochs. The sequence
/// of batches depends only on (data, seed, shuffle) and the n_seq of each call.
class BatchStream {
 public:
  /// Throws std::invalid_argument when `seqs` is empty.
  BatchStream(PackedSequences seqs, uint64_t seed, bool shuffle = true);

  /// The next n_seq sequences (n_seq >= 1, else std::invalid_argument).
  TokenBatch next(int64_t n_seq);

  /// Sequences consumed so far (over all epochs); seek(p) resumes at position p, e.g.
  /// p = step * n_seq when resuming a run at `step` with a constant batch size.
  int64_t position() const { return pos_; }
  void seek(int64_t position);

  /// Current epoch: position() / num_sequences().
  int64_t epoch() const { return pos_ / int64_t(num_sequences()); }
  size_t num_sequences() const { return size_t(seqs_.size()); }
  int64_t seq_len() const { return seqs_.seq_len; }

  /// Index of the sequence visited at global position p (for tests and tracing).
  size_t sequence_at(int64_t p);

 private:
  void ensure_epoch(int64_t e);
  PackedSequences seqs_;
  uint64_t seed_;
  bool shuffle_;
  int64_t pos_ = 0;
  int64_t perm_epoch_ = -1;
  std::vector<size_t> perm_;
};

}  // namespace rp
