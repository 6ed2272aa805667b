#include "trainer/async_range.hpp"

#include <fmt/format.h>

#include "trainer/lora_setup.hpp"

namespace rp {

const AsyncLrRange& async_lr_range(const TrainSpec& spec) {
  return trains_lora(spec) ? kAsyncLrLora : kAsyncLrFullFineTuning;
}

std::optional<std::string> async_lr_warning(const TrainSpec& spec) {
  if (!spec.async) return std::nullopt;
  const AsyncLrRange& r = async_lr_range(spec);
  const double peak = spec.lr_schedule.lr;
  if (!(peak > r.max_peak_lr)) return std::nullopt;
  return fmt::format(
      "{}: peak lr {:g} is above {:g}, the highest at which the asynchronous (staleness-1) optimizer "
      "matched the synchronous one within {:g}% for {} ({}); the loss may end higher: set \"async\": false "
      "for the synchronous optimizer, \"async_compensation\": \"predict\" to narrow the gap, or lower the lr "
      "(docs/fidelity.md)",
      spec.source.empty() ? std::string("spec") : spec.source, peak, r.max_peak_lr, kAsyncLossGap * 100,
      r.run_kind, r.measured);
}

}  // namespace rp
