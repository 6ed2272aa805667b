// Training data: a data set tokenised with a model's tokenizer, packed into fixed-length
// sequences and served in a deterministic shuffled order, exactly as `roundpipe train`
// does (the Trainer uses this class).
//
// Data files: JSON lines or a JSON array (recognised by content) of {"text"},
// {"prompt", "completion"}, {"messages": [...]}, ShareGPT {"conversations": [...]} or alpaca
// {"instruction", "input", "output"} records (docs/spec.md, "Data files"), the same records as
// the rows of a Parquet or Arrow IPC file (with Arrow C++ built in), a .txt file or a folder of
// .txt files; any other binary file is refused. Supervised examples get one sequence each (truncated, padded
// with eos; loss on the completion / assistant tokens only), or share sequences with `packing` (positions
// restarting per example, attention within each); plain text is concatenated and cut into windows. For each
// sequence ids[t] = token t and targets[t] = token t+1, or -100 where there is no loss.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rp {

struct LoadedModel;  // roundpipe/checkpoint.hpp
struct DataSource;   // roundpipe/spec.hpp

/// Target value meaning "no loss at this position" (PyTorch's ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

/// A batch of n_seq sequences: ids and targets are i32 [n_seq, seq_len], row-major.
struct TokenBatch {
  int64_t n_seq = 0, seq_len = 0;
  std::vector<int32_t> ids, targets;
  /// Packed sequences (TokenStreamOptions::packing): each token's position within its
  /// example, restarting at 0 where one begins (Session::forward_backward's positions);
  /// empty otherwise.
  std::vector<int32_t> positions;
  /// Number of positions with a target (not kIgnoreIndex): the loss normaliser.
  int64_t num_targets() const;
};

struct TokenStreamOptions {
  int64_t seq_len = 128;  ///< tokens per sequence (>= 2)
  std::string chat_template =
      "auto";  ///< auto (the model's own template, rendered by the Jinja interpreter; chatml when it has
               ///< none) | jinja | chatml | qwen3 | qwen3-no-think | smollm2 | llama3
  int64_t max_examples = 0;  ///< use only the first k supervised examples (0 = all)
  uint64_t seed = 0;         ///< shuffling seed: the order depends only on it and the position
  /// Pack supervised examples several to a sequence (positions restart per example; the
  /// batches carry them) instead of one padded example per sequence.
  bool packing = false;
  /// Hold out this fraction of the sequences for evaluation (every k-th, evenly spread):
  /// next() never serves them, evaluation_batches() does. 1: the whole file is for evaluation.
  double eval_fraction = 0;
};

/// What a TokenStream loaded.
struct TokenStreamStats {
  size_t examples = 0;          ///< supervised examples (after max_examples)
  size_t text_tokens = 0;       ///< tokens of plain text
  size_t dropped_examples = 0;  ///< examples whose prompt left no target within seq_len
  size_t truncated_examples =
      0;  ///< examples longer than a sequence (seq_len + 1 tokens), cut (dropped ones included)
  int64_t sequences =
      0;  ///< packed training sequences (one epoch); 0 when every prompt is longer than seq_len
  int64_t eval_sequences = 0;  ///< sequences held out for evaluation (TokenStreamOptions::eval_fraction)
  std::string chat_template;   ///< the template used for {"messages"} lines: "jinja" (the model's own) or a
                               ///< hand-written family
};

/// Endless deterministic iteration over the packed sequences of a data set. Epoch e visits
/// every sequence once in a permutation drawn from (seed, e) (identical on every platform);
/// a batch may straddle two epochs.
class TokenStream {
 public:
  /// Tokenises `data_path` with `model`'s tokenizer (its eos ends documents and pads). Throws
  /// std::runtime_error("<file>: <what>") for a missing tokenizer or a bad data file (one line
  /// naming the line), std::invalid_argument for an unknown chat template name or a model
  /// template that is not recognised. A data set whose every example loses its target to
  /// truncation loads with stats().sequences == 0 (next() then throws).
  TokenStream(const LoadedModel& model, const std::string& data_path, const TokenStreamOptions& options);
  /// A weighted mixture of data files: each file loaded (and its eval_fraction held out) as
  /// above; position p draws its file from (seed, p) with probability weight / (sum of the
  /// weights), the file's sequences in their own shuffled epochs, so seek(p) resumes the
  /// stream exactly; evaluation_batches() serves every file's held-out sequences. stats() sum
  /// over the files. Throws as above, and std::invalid_argument with one line for a weight
  /// that is not > 0 or a file with no training sequence.
  TokenStream(const LoadedModel& model, const std::vector<DataSource>& sources,
              const TokenStreamOptions& options);
  ~TokenStream();
  TokenStream(TokenStream&&) noexcept;
  TokenStream& operator=(TokenStream&&) noexcept;

  /// The chat template TokenStream would use for `model` and `requested`, by name: "jinja"
  /// (the model's own template through the Jinja interpreter: "auto" when the model carries
  /// one the interpreter parses, or "jinja"), else a hand-written family ("auto": the family
  /// a template the interpreter cannot parse resembles, with a warning; ChatML if the model
  /// has none). Throws std::invalid_argument for an unknown name, or "jinja" without a
  /// (parsable) template.
  static std::string chat_template_for(const LoadedModel& model, const std::string& requested);

  /// The next n_seq sequences (n_seq >= 1, else std::invalid_argument; std::invalid_argument
  /// also when there are no sequences).
  TokenBatch next(int64_t n_seq);
  /// Sequences consumed so far (over all epochs); seek(p) continues at position p (a resumed
  /// run seeks to the position its checkpoint saved).
  int64_t position() const;
  void seek(int64_t position);
  const TokenStreamStats& stats() const;
  /// A mixture's realised proportions so far ("a.jsonl 74.8% (weight 75.0%), b.parquet 25.2%
  /// (weight 25.0%)"); "" for one file.
  std::string mixture_proportions() const;
  /// The held-out sequences in order, n_seq per batch; the last batch is filled up with
  /// sequences that have no target (ids = eos, targets = -100), so every batch has the
  /// shape of a training pass. Empty without held-out sequences.
  std::vector<TokenBatch> evaluation_batches(int64_t n_seq) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rp
