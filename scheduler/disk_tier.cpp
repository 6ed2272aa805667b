#include "scheduler/disk_tier.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

std::vector<int64_t> stage_frozen_reads(const ModelLayout& m, const IterationPlan& plan,
                                        const std::vector<char>& streamed) {
  if (plan.num_layers != m.num_layers())
    throw std::invalid_argument(
        fmt::format("disk tier: the plan has {} layers, the model {}", plan.num_layers, m.num_layers()));
  std::vector<int64_t> out;
  for (const Stage& s : plan.stages) {
    std::vector<int> layers(size_t(s.last - s.first + 1));
    std::iota(layers.begin(), layers.end(), s.first);
    int64_t bytes = 0;
    for (int g : m.groups_uploaded(layers, s.kind == StageKind::backward)) {
      const ParamGroup& pg = m.groups[size_t(g)];
      if (pg.frozen && (streamed.empty() || streamed[size_t(g)])) bytes += pg.storage_bytes;
    }
    out.push_back(bytes);
  }
  return out;
}

namespace {

// Bit reversal of i in `bits` bits (the van der Corput sequence in base 2, scaled).
uint64_t reversed_bits(uint64_t i, int bits) {
  uint64_t r = 0;
  for (int b = 0; b < bits; ++b, i >>= 1) r = (r << 1) | (i & 1);
  return r;
}

}  // namespace

std::vector<int> residency_order(const ModelLayout& m) {
  // the decoder layers in bit-reversed order of their index, so that any prefix (the decoders
  // a budget keeps) is spread evenly over the depth: every stage then reads a share of its
  // decoders and the reads overlap every stage's compute, instead of a run of stages reading
  // nothing followed by a run reading everything
  const int decoders = std::max(0, m.num_layers() - 2);
  int bits = 0;
  while ((1 << bits) < decoders) ++bits;
  std::vector<int> layers;
  for (int i = 1; i <= decoders; ++i) layers.push_back(i);
  std::stable_sort(layers.begin(), layers.end(), [bits](int a, int b) {
    return reversed_bits(uint64_t(a - 1), bits) < reversed_bits(uint64_t(b - 1), bits);
  });
  std::vector<int> order;
  std::vector<char> seen(m.groups.size(), 0);
  for (int l : layers)
    for (int g : m.groups_of(l))
      if (m.groups[size_t(g)].frozen && !seen[size_t(g)]) {
        seen[size_t(g)] = 1;
        order.push_back(g);
      }
  for (int g = 0; g < int(m.groups.size()); ++g)  // then the others (embedding, head)
    if (m.groups[size_t(g)].frozen && !seen[size_t(g)]) order.push_back(g);
  return order;
}

std::vector<char> streamed_groups(const ModelLayout& m, double room, double* resident) {
  std::vector<char> streamed(m.groups.size(), 0);
  double kept = 0;
  for (int g : residency_order(m)) {
    const double b = double(m.groups[size_t(g)].storage_bytes);
    if (b <= room) {
      room -= b;
      kept += b;
    } else {
      streamed[size_t(g)] = 1;
    }
  }
  if (resident) *resident = kept;
  return streamed;
}

double largest_frozen_group(const ModelLayout& m, std::string* name) {
  int64_t largest = 0;
  for (const ParamGroup& g : m.groups)
    if (const int64_t b = (g.storage_bytes + 4095) / 4096 * 4096; g.frozen && b > largest) {
      largest = b;
      if (name) *name = g.name;
    }
  return double(largest);
}

namespace {

// Keeps the activations in `room` (dropping the attention, then spilling); returns the room left.
double place_activations(const HostMemoryNeed& need, const HostRun& run, double room, DiskPlan& d) {
  const double slots = run.workers == 1 ? 1.0 : double(run.pass_slots);
  d.saved_attention = run.saved_attention;
  if (need.activations + need.attention <= room) {
    d.activation_bytes = need.activations + need.attention;
    return room - d.activation_bytes;
  }
  d.attention_dropped = run.saved_attention;
  d.saved_attention = false;
  if (need.activations <= room) {
    d.activation_bytes = need.activations;
    return room - d.activation_bytes;
  }
  d.activation_bytes = std::max(0.0, room);
  d.spill_bytes = (need.activations - d.activation_bytes) / slots;
  return 0;
}

}  // namespace

DiskPlan place_in_host_budget(const ModelLayout& m, const HostRun& run, double budget, double ring_bytes) {
  const HostMemoryNeed need = host_memory_need(m, run);
  DiskPlan d;
  d.micro_batches = run.micro_batches;
  d.trainable_bytes = need.master + need.moments + need.weights + need.gradients;
  d.frozen_bytes = need.frozen;
  d.streamed.assign(m.groups.size(), 0);
  d.saved_attention = run.saved_attention;
  d.minimum_budget = d.trainable_bytes + ring_bytes;
  if (need.total() <= budget) {  // everything stays in host memory
    d.resident_bytes = d.frozen_bytes;
    d.activation_bytes = need.activations + need.attention;
    return d;
  }
  d.ring_bytes = ring_bytes;
  d.fits = budget >= d.minimum_budget;
  const double room = place_activations(need, run, budget - d.minimum_budget, d);
  d.streamed = streamed_groups(m, room, &d.resident_bytes);
  return d;
}

BudgetPlacement place_host_budget(const ModelLayout& m, const HostRun& run, double room, double ring_bytes,
                                  size_t staging, bool automatic_attention) {
  const HostMemoryNeed need = host_memory_need(m, run);
  const double slots = run.workers == 1 ? 1.0 : double(run.pass_slots);
  BudgetPlacement p;
  p.most_spilled = std::max(0, m.num_layers() - 1);
  p.activations = need.activations;
  p.per_layer = need.activations / double(m.num_layers() + 1);  // one layer's saved inputs, all slots
  const double record =
      std::ceil(p.per_layer / double(run.micro_batches) / slots / 4096) * 4096;  // one micro-batch's, aligned
  // the staging's count depends on the layers spilled, so the placement is repeated until it
  // settles (the staging only grows, and at most to every layer's: a few rounds)
  for (int round = 0; round < 64; ++round) {
    p.disk = place_in_host_budget(m, run, room - p.staging_bytes, ring_bytes);
    p.dropped_for_base = false;
    if (automatic_attention && p.disk.fits && p.disk.ring_bytes > 0 && p.disk.saved_attention) {
      HostRun without = run;
      without.saved_attention = false;
      DiskPlan e = place_in_host_budget(m, without, room - p.staging_bytes, ring_bytes);
      if (e.resident_bytes > p.disk.resident_bytes) {
        p.disk = e;
        p.disk.attention_dropped = p.dropped_for_base = true;
      }
    }
    p.spilled = p.disk.spill_bytes > 0
                    ? int(std::ceil((need.activations - p.disk.activation_bytes) / p.per_layer - 1e-9))
                    : 0;
    if (p.spilled > 0) p.disk.spill_bytes = double(p.spilled) * p.per_layer / slots;  // whole layers
    const double staging_bytes =
        p.spilled > 0 ? double(run.workers) * double(staging + std::max(staging, size_t(p.spilled))) * record
                      : 0.0;
    if (staging_bytes <= p.staging_bytes) break;
    p.staging_bytes = staging_bytes;
  }
  return p;
}

double least_host_room(const ModelLayout& m, const HostRun& run, double ring_bytes, size_t staging,
                       bool automatic_attention) {
  const auto places = [&](double room) {
    return place_host_budget(m, run, room, ring_bytes, staging, automatic_attention).places();
  };
  double lo = 0, hi = std::max(1.0, host_memory_need(m, run).total());
  if (places(lo)) return lo;
  while (!places(hi) && hi < 1e21) lo = hi, hi *= 2;
  for (int i = 0; i < 64 && hi - lo > 1; ++i) (places((lo + hi) / 2) ? hi : lo) = (lo + hi) / 2;
  return hi;
}

DiskPlan plan_disk_tier(const ModelLayout& m, const HostRun& run, const DiskTier& tier,
                        const IterationPlan& plan) {
  (void)stage_frozen_reads(m, plan);  // checks the plan against the model
  const double ring = double(tier.ring_buffers) * largest_frozen_group(m);
  const BudgetPlacement p = place_host_budget(m, run, tier.enabled() ? tier.host_budget : HUGE_VAL, ring,
                                              tier.spill_staging, tier.automatic_attention);
  DiskPlan d = p.disk;
  d.spilled_layers = p.spilled;
  d.staging_bytes = p.staging_bytes;
  d.dropped_for_base = p.dropped_for_base;
  if (!p.places()) {
    d.fits = false;
    d.least_budget = least_host_room(m, run, ring, tier.spill_staging, tier.automatic_attention);
  }
  if (d.ring_bytes == 0) {  // everything stays in host memory
    d.stage_reads.assign(plan.stages.size(), 0);
    return d;
  }
  d.stage_reads = stage_frozen_reads(m, plan, d.streamed);
  d.read_bytes = std::accumulate(d.stage_reads.begin(), d.stage_reads.end(), 0.0) + d.spill_bytes;
  d.write_bytes = d.spill_bytes;
  d.seconds = d.read_bytes / tier.read_bandwidth + d.write_bytes / tier.write_rate();
  return d;
}

void apply_disk_reads(std::vector<LayerCost>& costs, const ModelLayout& m,
                      const std::vector<char>& streamed) {
  if (int(costs.size()) != m.num_layers())
    throw std::invalid_argument(
        fmt::format("disk tier: {} layer costs, the model has {} layers", costs.size(), m.num_layers()));
  for (int l = 0; l < m.num_layers(); ++l) {
    int64_t bytes = 0;
    for (int g : m.groups_of(l))
      if (m.groups[size_t(g)].frozen && size_t(g) < streamed.size() && streamed[size_t(g)])
        bytes += m.groups[size_t(g)].storage_bytes;
    costs[size_t(l)].disk_bytes = bytes;
  }
}

double disk_stage_bandwidth(const DiskTier& tier, int gpus) {
  return tier.enabled() ? tier.read_bandwidth / double(std::max(1, gpus)) : 0.0;
}

void add_disk_costs(std::vector<StageCost>& costs, const IterationPlan& plan, const DiskPlan& d) {
  if (costs.size() != plan.stages.size() || d.stage_reads.size() != plan.stages.size())
    throw std::invalid_argument(fmt::format("disk tier: {} stage costs and {} stage reads for {} stages",
                                            costs.size(), d.stage_reads.size(), plan.stages.size()));
  double down = 0, up = 0;  // saved activations per micro-batch: forward downloads, backward uploads
  for (size_t i = 0; i < costs.size(); ++i) {
    const StageKind k = plan.stages[i].kind;
    if (k == StageKind::forward) down += double(costs[i].act_down_bytes);
    if (k == StageKind::backward) up += double(costs[i].act_up_bytes);
  }
  // the spill of one iteration, per micro-batch, in each stage's share of that traffic
  const double per_micro = d.spill_bytes / double(std::max<int64_t>(1, d.micro_batches));
  for (size_t i = 0; i < costs.size(); ++i) {
    StageCost& c = costs[i];
    c.disk_read_bytes = d.stage_reads[i];
    if (per_micro <= 0) continue;
    const StageKind k = plan.stages[i].kind;
    if (k == StageKind::forward && down > 0)
      c.spill_write_bytes = int64_t(std::llround(per_micro * double(c.act_down_bytes) / down));
    if (k == StageKind::backward && up > 0)
      c.spill_read_bytes = int64_t(std::llround(per_micro * double(c.act_up_bytes) / up));
  }
}

double tokens_to_hide(double stream_bytes, double spill_per_token, double compute_per_token, int gpus,
                      double read_bandwidth, double write_bandwidth) {
  if (stream_bytes <= 0 && spill_per_token <= 0) return 0;
  if (!(read_bandwidth > 0)) return std::numeric_limits<double>::infinity();
  const double write = write_bandwidth > 0 ? write_bandwidth : read_bandwidth;
  const double margin =
      compute_per_token / double(std::max(1, gpus)) - spill_per_token * (1 / read_bandwidth + 1 / write);
  if (margin <= 0) return std::numeric_limits<double>::infinity();
  return std::ceil(stream_bytes / read_bandwidth / margin);
}

}  // namespace rp
