// The model card (README.md) a run writes into final/, final-merged/ and every checkpoint-<n>/:
// what was trained from what, on which data, how, and to which losses, with Hugging Face's YAML
// front matter (library_name, base_model, tags) so that the folder uploads as a documented
// model. The card names no address outside the folder.
//
// Ownership: the card is listed in the folder's roundpipe_manifest.json with its size and XXH3;
// a README.md the manifest does not prove roundpipe's (the user's README, a card the user
// edited) is carried into the new folder untouched and never listed: never overwritten or
// deleted. The card's last line "<!-- roundpipe model card, xxh3 <hex> -->" also carries the
// XXH3 of the text before it (is_roundpipe_model_card).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "roundpipe/adapter.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

inline constexpr const char* kModelCardFile = "README.md";

/// What a card says about one saved folder.
struct ModelCardFacts {
  enum class Kind { full, adapter, merged };
  Kind kind = Kind::full;
  std::string folder;  ///< the folder the card describes, as the run names it ("runs/x/final")
  BaseModelRef base;   ///< the base model (id and local file)
  const TrainSpec* spec = nullptr;
  int64_t steps_done = 0;            ///< optimizer steps in the weights
  double epochs = 0;                 ///< passes over the training sequences (sequences consumed / per epoch)
  int64_t train_sequences = 0;       ///< training sequences of one epoch
  int64_t eval_sequences = 0;        ///< held-out sequences (0: none)
  std::optional<double> train_loss;  ///< the last step's mean loss (none: no step in this run)
  std::optional<double> eval_loss;   ///< the last evaluation's loss (none: not evaluated)
  int64_t eval_step = 0;             ///< the step after which eval_loss was measured
  std::string version;               ///< roundpipe's version
  std::string backend;               ///< the backend the run ran on, cpu or cuda ("": the spec's)
};

/// The card's text (front matter, sections, the closing ownership line). Throws
/// std::invalid_argument when facts.spec is null.
std::string model_card_text(const ModelCardFacts& facts);

/// Whether the file `path` is a card model_card_text wrote, unedited (its closing line's XXH3
/// matches the text before it). False for a missing or unreadable file.
bool is_roundpipe_model_card(const std::string& path);

/// Puts README.md into `new_dir` (a folder about to replace `old_dir` by replace_folder, with a
/// roundpipe_manifest.json): `card` when `old_dir` has no README.md or one its manifest proves
/// roundpipe's (listed, unchanged), else nothing: the user's file (or a card the user edited) is
/// carried into the new folder by replace_folder, unlisted, and the card is not written.
/// Returns true when the card was written. Throws std::runtime_error ("<file>: ...") on I/O errors.
bool place_model_card(const std::string& new_dir, const std::string& old_dir, const std::string& card);

}  // namespace rp
