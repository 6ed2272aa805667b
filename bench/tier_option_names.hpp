// bench_throughput's disk-tier options are the spec's frozen_tier keys under other names: the
// runtime's one-line errors name the keys, and the bench's user gave options.
#pragma once
#include <string>
#include <utility>

namespace bench {

/// `what` with each "frozen_tier.<key>" named as the bench option that sets it
/// ("frozen_tier.host_budget_gib" -> "--tier-host-budget-gib").
inline std::string tier_option_names(std::string what) {
  // longest keys first: "frozen_tier.path" is no prefix of another, nor are the others
  static const std::pair<const char*, const char*> names[] = {
      {"frozen_tier.host_budget_gib", "--tier-host-budget-gib"},
      {"frozen_tier.resident_gib", "--tier-resident-gib"},
      {"frozen_tier.spill_layers", "--tier-spill-layers"},
      {"frozen_tier.ring_gib", "--tier-ring-gib"},
      {"frozen_tier.path", "--frozen-tier"},
      {"give it or resident_gib, not both", "give it or --tier-resident-gib, not both"},
      {"a given `spill_layers` raises", "a given --tier-spill-layers raises"}};
  for (const auto& [key, option] : names)
    for (size_t at = what.find(key); at != std::string::npos;
         at = what.find(key, at + std::string(option).size()))
      what.replace(at, std::string(key).size(), option);
  return what;
}

}  // namespace bench
