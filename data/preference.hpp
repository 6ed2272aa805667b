// Preference data (what TRL's DPO / ORPO / KTO-style trainers read), parsed and validated into
// typed pairs. No trainer consumes them yet: this is the data layer's half, so that a file is
// checked record by record with the same one-line errors as supervised data.
//
// Each record (JSON lines, a JSON array, or a Parquet / Arrow IPC row; data/dataset.hpp) is
//   {"prompt": str, "chosen": str, "rejected": str}             standard
//   {"prompt": [msgs], "chosen": [msgs], "rejected": [msgs]}     conversational, "tools"?
//   {"chosen": [msgs], "rejected": [msgs]}                        implicit prompt: the messages
//                                                                 both conversations start with
// and becomes two examples, prompt + chosen and prompt + rejected, tokenized exactly as a
// prompt / completion record with that completion (prompt_completion_example): the loss mask
// marks the completion's tokens.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "data/dataset.hpp"

namespace rp {

struct PreferencePair {
  Example chosen;    ///< prompt + chosen completion; loss_mask on the completion
  Example rejected;  ///< prompt + rejected completion; loss_mask on the completion
  /// Tokens the two share from the start (at least the prompt's, as rendered with the
  /// generation prompt for conversations).
  size_t shared_prefix = 0;
};

/// The pairs of a preference data file. Throws std::runtime_error with one line
/// "<where>: <what>" (where as data/dataset.hpp's RecordFn) for a record that is not a
/// preference record (names the expected keys), a missing or mistyped key, strings mixed
/// with message lists, a chosen equal to the rejected (nothing to prefer), a completion with
/// no token to train on, an implicit-prompt pair whose conversations share no leading
/// message or differ only after their end; "<path>: no preference pairs" for an empty file.
std::vector<PreferencePair> load_preference_records(const std::string& path, const Tokenizer& tok,
                                                    const ChatFormat& chat);

}  // namespace rp
