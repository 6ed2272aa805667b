#include "trainer/replica_run.hpp"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

std::shared_ptr<Replicas> replicas_for(const TrainSpec& spec) {
  if (spec.mpi == "off" || (spec.mpi == "auto" && !launched_by_mpi())) return nullptr;
  if (!mpi_available()) {
    const char* n = std::getenv("OMPI_COMM_WORLD_SIZE");
    throw std::invalid_argument(fmt::format(
        "{}: key 'mpi': {} but this roundpipe was built without MPI (install libopenmpi-dev and openmpi-bin, "
        "as "
        "scripts/setup.sh does, and configure again), or set \"mpi\": \"off\"",
        spec.source,
        spec.mpi == "on" ? std::string("\"on\" asks for MPI")
                         : fmt::format("started by an MPI launcher ({} processes)", n ? n : "several")));
  }
  std::shared_ptr<Replicas> r = mpi_replicas(spec.replica_timeout_s);
  if (spec.accumulation % r->size() != 0)
    throw std::invalid_argument(fmt::format(
        "{}: key 'accumulation': {} pass{} per step cannot be split over {} replicas (each runs accumulation "
        "/ "
        "replicas of them): expected a multiple of {}",
        spec.source, spec.accumulation, spec.accumulation == 1 ? "" : "es", r->size(), r->size()));
  return r;
}

std::vector<double> sum_over(Replicas* r, const std::vector<double>& values) {
  if (!r || r->size() <= 1) return values;
  const std::vector<std::vector<double>> all = r->allgather(values);
  std::vector<double> out(values.size(), 0.0);
  for (const auto& v : all)  // rank order
    for (size_t i = 0; i < out.size(); ++i) out[i] += v[i];
  return out;
}

void combine_step(Replicas* r, StepResult& s, int64_t experts) {
  if (!r || r->size() <= 1) return;
  // moe_aux_loss is this replica's token-weighted mean: times its tokens, the weighted sum
  std::vector<double> v{s.loss_sum, s.tokens, s.moe_aux_loss * s.tokens};
  v.resize(size_t(3 + experts), 0.0);  // the same length on every replica
  for (size_t e = 0; e < s.expert_tokens.size() && e < size_t(experts); ++e) v[3 + e] = s.expert_tokens[e];
  v.push_back(s.reduce_wait_s);  // the last entry: the most, not the sum
  const std::vector<std::vector<double>> all = r->allgather(v);
  std::vector<double> sum(v.size() - 1, 0.0);
  double wait = 0;
  for (const auto& x : all) {  // rank order
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
    wait = std::max(wait, x.back());
  }
  s.loss_sum = sum[0], s.tokens = sum[1];
  s.moe_aux_loss = sum[1] > 0 ? sum[2] / sum[1] : 0.0;
  if (experts > 0) s.expert_tokens.assign(sum.begin() + 3, sum.end());
  s.reduce_wait_s = wait;
}

}  // namespace rp
