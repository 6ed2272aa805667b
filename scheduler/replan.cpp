#include "scheduler/replan.hpp"

#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "scheduler/prefetch_refine.hpp"

namespace rp {

std::string ReplanDecision::line() const {
  auto ms = [](double s) { return fmt::format("{:.2f} ms", s * 1e3); };
  if (!error.empty())
    return fmt::format(
        "re-plan at pass {} ({}): keeping {} ({} predicted); the measured costs could not be "
        "partitioned: {}",
        pass, why, old_plan.summary(), ms(old_seconds), error);
  if (!changed)
    return fmt::format(
        "re-plan at pass {} ({}): keeping {} ({} predicted per iteration; the measured partition {} "
        "predicts {})",
        pass, why, old_plan.summary(), ms(old_seconds), new_plan.summary(), ms(new_seconds));
  return fmt::format("re-plan at pass {} ({}): {} ({} predicted per iteration) -> {} ({} predicted)", pass,
                     why, old_plan.summary(), ms(old_seconds), new_plan.summary(), ms(new_seconds));
}

Replanner::Replanner(Profile profile, std::vector<LayerCost> analytic, PartitionOptions part, SimOptions sim,
                     ReplanOptions opt)
    : profile_(std::move(profile)),
      analytic_(std::move(analytic)),
      part_(part),
      sim_(std::move(sim)),
      opt_(opt) {
  if (int(analytic_.size()) != profile_.num_layers())
    throw std::invalid_argument(fmt::format("replanner: {} analytic layer costs for a profile of {} layers",
                                            analytic_.size(), profile_.num_layers()));
}

double Replanner::predict(const IterationPlan& plan, const std::vector<LayerCost>& costs) const {
  return predict_iteration_seconds(plan, stage_costs(costs, plan, part_), part_.gpus, part_.micro_batches,
                                   sim_);
}

std::optional<ReplanDecision> Replanner::poll(const IterationPlan& current, int64_t pass) {
  if (decided_ || !opt_.automatic) return std::nullopt;
  ReplanDecision d;
  if (profile_.settled(opt_.settle_rel_tol, opt_.settle_min_samples)) {
    d.why = "profile settled";
  } else if (opt_.settle_max_samples > 0 &&
             profile_.settled(std::numeric_limits<double>::infinity(), opt_.settle_max_samples)) {
    d.why = fmt::format("{} samples per series", opt_.settle_max_samples);
  } else {
    return std::nullopt;
  }
  decided_ = true;
  d.pass = pass;
  d.old_plan = current;
  d.new_plan = current;
  try {
    const std::vector<LayerCost> measured = profile_.apply(analytic_);
    d.old_seconds = predict(current, measured);
    if (planner_) {
      d.new_plan = planner_(measured);
      validate_plan(d.new_plan, "re-plan");
      if (d.new_plan.num_layers != current.num_layers)
        throw std::invalid_argument(fmt::format("re-plan: a plan of {} layers for a model of {}",
                                                d.new_plan.num_layers, current.num_layers));
    } else {
      d.new_plan = refine_for_prefetch(measured, partition(measured, part_), part_, sim_).plan;
    }
    d.new_seconds = predict(d.new_plan, measured);
    d.changed = d.new_plan.stages != current.stages &&
                (planner_ || d.new_seconds < (1.0 - opt_.min_gain) * d.old_seconds);
  } catch (const std::exception& e) {
    d.new_plan = current;
    d.changed = false;
    d.error = e.what();
  }
  return d;
}

PartitionResult automatic_partition(const std::vector<LayerCost>& costs, PartitionOptions& opt) {
  PartitionResult r;
  try {
    r = partition(costs, opt);
  } catch (const std::runtime_error&) {
    if (opt.weight_buffers <= 1) throw;
    PartitionOptions one = opt;
    one.weight_buffers = 1;
    r = partition(costs, one);  // throws the error of the single-buffer attempt
    opt = one;
  }
  return refine_for_prefetch(costs, std::move(r), opt, refine_sim_options(opt));
}

}  // namespace rp
