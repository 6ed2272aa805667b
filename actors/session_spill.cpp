// FrozenTierOptions::spill_layers at construction: which layers' saved inputs go to disk, saved
// attention off, and the session's ActivationSpill (its hidden file in the folder of
// frozen_tier.path, its staging buffers pinned through the first device, its I/O thread).
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "actors/session_impl.hpp"
#include "actors/session_testing.hpp"
#include "base/counted.hpp"
#include "base/output_folder.hpp"  // create_folders, dangling_link_text

namespace rp {

std::vector<int> choose_spill_layers(int num_layers, const IterationPlan& plan, int n) {
  std::vector<char> begins(size_t(std::max(num_layers, 0)), 0);
  for (const Stage& st : plan.stages)  // a backward stage uploads every layer's input alike
    if (st.kind != StageKind::backward && st.first >= 0 && st.first < num_layers)
      begins[size_t(st.first)] = 1;
  std::vector<int> out;
  for (int pass = 0; pass < 2; ++pass)  // first the layers no forward stage or tail begins with, then those
    for (int b = 1; b < num_layers && int(out.size()) < n; ++b)
      if (bool(begins[size_t(b)]) == (pass == 1)) out.push_back(b);
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
  const double per_iteration = double(r.spill_bytes) / double(sets);
  r.spill_line = fmt::format(
      "activation spill: the saved inputs of {} to {}: {} written and read back per iteration, a "
      "file of {} for {}; staging {} x {} over {} ({}, {})",
      rp::counted(chosen.size(), "layer"), r.spill_folder, byte_text(per_iteration),
      byte_text(double(r.spill_bytes)), rp::counted(sets, "activation set"), r.spill_staging_buffers,
      byte_text(double(r.spill_staging_bytes)), rp::counted(opt.workers, "worker"),
      r.spill_direct ? "O_DIRECT" : "buffered", r.spill_engine);
  log(r.spill_line);
}

}  // namespace rp
