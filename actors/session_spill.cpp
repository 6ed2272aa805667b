// FrozenTierOptions::spill_layers at construction: which layers' saved inputs go to disk, saved
// attention off, and the session's ActivationSpill (its hidden file in the folder of
// frozen_tier.path, its staging buffers pinned through the first device, its I/O thread).
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "actors/session_impl.hpp"
#include "actors/session_testing.hpp"
#include "actors/spill_port.hpp"
#include "base/counted.hpp"
#include "base/output_folder.hpp"  // create_folders, dangling_link_text, path_blocker_text

namespace rp {

std::vector<char> tail_interior_layers(int num_layers, const IterationPlan& plan) {
  std::vector<char> inside(size_t(std::max(num_layers, 0)), 0);
  for (const Stage& st : plan.stages)  // the tail runs forward and backward at once: no input saved
    if (st.kind == StageKind::tail)
      for (int b = std::max(st.first + 1, 0); b <= st.last && b < num_layers; ++b) inside[size_t(b)] = 1;
  return inside;
}

std::vector<int> choose_spill_layers(int num_layers, const IterationPlan& plan, int n) {
  std::vector<char> begins(size_t(std::max(num_layers, 0)), 0);
  for (const Stage& st : plan.stages)  // a backward stage uploads every layer's input alike
    if (st.kind != StageKind::backward && st.first >= 0 && st.first < num_layers)
      begins[size_t(st.first)] = 1;
  const std::vector<char> inside = tail_interior_layers(num_layers, plan);
  // first the layers inside the tail (their host buffers go, and nothing is written while the plan
  // keeps them there), then those no forward stage or tail begins with, then the rest
  const auto rank = [&](int b) { return inside[size_t(b)] ? 0 : begins[size_t(b)] ? 2 : 1; };
  std::vector<int> out;
  for (int pass = 0; pass < 3; ++pass)
    for (int b = 1; b < num_layers && int(out.size()) < n; ++b)
      if (rank(b) == pass) out.push_back(b);
  std::sort(out.begin(), out.end());
  return out;
}

void Session::Impl::open_activation_spill(const SessionInternals& internals,
                                          const std::function<void(const std::string&)>& log) {
  if (!opt.frozen_tier) return;
  const FrozenTierOptions& o = *opt.frozen_tier;
  const int L = layout.num_layers();
  if (o.spill_layers < 0 || o.spill_layers > L - 1)
    throw std::invalid_argument(
        fmt::format("frozen_tier.spill_layers: expected 0..{} (the layers with a saved input: all but the "
                    "first of {}; 0: off), got {}",
                    L - 1, L, o.spill_layers));
  if (o.spill_layers == 0) return;
  if (o.path.empty())
    throw std::invalid_argument("frozen_tier.path: expected the path of the tier's cache file, got \"\"");
  const std::vector<int> chosen = choose_spill_layers(L, plan, o.spill_layers);
  if (saved_attention) {
    saved_attention = false;
    log("activation spill: saved attention is off for this run (only the layers' saved inputs spill)");
  }
  std::filesystem::path folder = std::filesystem::path(o.path).parent_path();
  if (folder.empty()) folder = ".";
  std::error_code ec;
  spill_folders_made = create_folders(folder.string(), ec);
  if (ec) {  // said here: the file's open would only find the folder missing (a read-only disk, say)
    std::string why = dangling_link_text(folder.string());
    if (why.empty()) why = path_blocker_text(folder.string(), true);
    if (why.empty()) why = fmt::format("{} ({})", folder.string(), ec.message());
    throw std::invalid_argument("frozen_tier.path: the spill file's folder cannot be made: " + why);
  }
  SpillConfig c;
  c.folder = folder.string();
  c.layers = chosen;
  c.num_layers = L;
  const int sets =
      opt.workers == 1 ? 1 : opt.pass_slots;  // one worker: the pass slots share their activations
  c.sets = sets;
  c.micro_batches = opt.micro_batches;
  c.act_bytes = size_t(opt.micro.tokens()) * size_t(layout.config.hidden_size) *
                dtype_size(devices[0]->compute_dtype());
  c.workers = opt.workers;
  c.staging = internals.spill_staging > 0 ? internals.spill_staging : kDefaultSpillStaging;
  c.direct = o.direct;
  c.fault = internals.spill_fault;
  spill = std::make_unique<ActivationSpill>(std::move(c), pinned_allocator(*devices[0]));
  spill_mask.assign(size_t(L), 0);
  for (int b : chosen) spill_mask[size_t(b)] = 1;
  FrozenTierReport& r = tier_report;
  r.spill_layers = chosen;
  r.spill_bytes = spill->file_bytes();
  r.spill_folder = spill->folder();
  r.spill_direct = spill->direct();
  r.spill_engine = spill->engine();
  r.spill_staging_buffers = spill->staging_buffers();
  r.spill_staging_bytes = spill->record_bytes();
  // the file holds every activation set (pass slot); one pass writes and reads back one set's share
  // of the layers outside the tail (a re-plan that moves the tail writes the others)
  // of the layers outside the tail (a re-plan that moves the tail writes the others); a layer is read
  // back by each stage that uploads it: its backward stage, and a forward stage or the tail it begins
  const std::vector<char> inside = tail_interior_layers(L, plan);
  size_t in_tail = 0, reads = 0;
  for (int b : chosen) {
    in_tail += inside[size_t(b)] ? 1 : 0;
    for (const Stage& st : plan.stages) reads += !inside[size_t(b)] && stage_uploads_input(st, b);
  }
  const double per_record = double(r.spill_bytes) / double(sets) / double(chosen.size());
  const double written = per_record * double(chosen.size() - in_tail), read = per_record * double(reads);
  const std::string tail_note =
      in_tail > 0 ? fmt::format(" ({} inside the tail stage, never written while it holds them)", in_tail)
                  : "";
  r.spill_line = fmt::format(
      "activation spill: the saved inputs of {}{} to {}: {} per iteration, a "
      "file of {} for {}; staging {} x {} over {} ({}, {})",
      rp::counted(chosen.size(), "layer"), tail_note, r.spill_folder,
      written == read ? byte_text(written) + " written and read back"
                      : fmt::format("{} written and {} read back", byte_text(written), byte_text(read)),
      byte_text(double(r.spill_bytes)), rp::counted(sets, "activation set"), r.spill_staging_buffers,
      byte_text(double(r.spill_staging_bytes)), rp::counted(opt.workers, "worker"),
      r.spill_direct ? "O_DIRECT" : "buffered", r.spill_engine);
  log(r.spill_line);
}

}  // namespace rp
