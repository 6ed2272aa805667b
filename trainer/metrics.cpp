#include "trainer/metrics.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "base/atomic_file.hpp"
#include "base/output_folder.hpp"

namespace rp {

MetricsFile::MetricsFile(const std::string& path, int64_t resume_step, bool replicas)
    : path_(path), replicas_(replicas) {
  const bool resuming = resume_step > 0;
  // a pipe or device there would block the read of a resumed run's rows or the write (a
  // link is never followed: the write puts a new file in its place)
  if (const std::string why = output_file_problem(path, true); !why.empty())
    throw std::runtime_error(fmt::format("{}: {}", path, why));
  std::string header = kHeader;
  if (replicas) header.insert(header.size() - 1, std::string(",") + kReplicaColumn);
  if (resuming) truncate_metrics(path, resume_step, header);
  csv_.open(path, resuming ? std::ios::app : std::ios::trunc);
  if (!csv_) throw std::runtime_error(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
  if (!resuming) {
    errno = 0;
    csv_ << header;
    csv_.flush();
    if (!csv_)
      throw std::runtime_error(fmt::format("{}: cannot write the header: {}", path,
                                           errno ? std::strerror(errno) : "write failed"));
  }
}

void MetricsFile::write(const StepReport& r) {
  errno = 0;
  csv_ << fmt::format(
      "{},{:.6f},{},{:.1f},{:.6g},{:.3f},{:.6g},{:.6g},{},{},{},{:.4f}{}\n", r.step, r.loss, r.target_tokens,
      r.tokens_per_s, r.lr, r.elapsed_s, r.grad_norm, r.loss_scale, r.skipped ? 1 : 0,
      r.evaluated ? fmt::format("{:.6f},{:.6g}", r.eval_loss, r.eval_perplexity) : std::string(","),
      r.experts > 0 ? fmt::format("{:.6g},{:.4f},{:.4f}", r.aux_loss, r.expert_load_min, r.expert_load_max)
                    : std::string(",,"),
      r.epoch, replicas_ ? fmt::format(",{:.4f}", r.reduce_wait_s) : std::string());
  csv_.flush();
  // a failed row is reported at once: a full disk would fail every later save too
  if (!csv_)
    throw std::runtime_error(fmt::format("{}: cannot write the row of step {}: {}", path_, r.step,
                                         errno ? std::strerror(errno) : "write failed"));
}

void MetricsJsonl::eval_before_training(double loss, double perplexity) {
  pending_ = {{"step", 0}, {"eval_loss", loss}, {"eval_perplexity", perplexity}};
}

void MetricsJsonl::write(const StepReport& r) {
  nlohmann::json j = {{"step", r.step},
                      {"loss", r.loss},
                      {"target_tokens", r.target_tokens},
                      {"tokens_per_s", r.tokens_per_s},
                      {"lr", r.lr},
                      {"elapsed_s", r.elapsed_s},
                      {"grad_norm", r.grad_norm},
                      {"loss_scale", r.loss_scale},
                      {"skipped", r.skipped ? 1 : 0}};
  if (r.evaluated) {
    j["eval_loss"] = r.eval_loss;
    j["eval_perplexity"] = r.eval_perplexity;
  }
  if (r.experts > 0) {
    j["aux_loss"] = r.aux_loss;
    j["expert_load_min"] = r.expert_load_min;
    j["expert_load_max"] = r.expert_load_max;
  }
  j["epoch"] = r.epoch;
  if (replicas_) j["reduce_wait_s"] = r.reduce_wait_s;
  append(j, r.step);
}

void MetricsJsonl::append(const nlohmann::json& line, int64_t step) {
  if (!out_.is_open()) {
    if (resume_step_ > 0) {  // the lines of steps <= the resumed one stay, a later attempt's go
      std::vector<std::string> keep;
      {
        std::ifstream f(path_);
        for (std::string l; f && std::getline(f, l);) {
          const auto j = nlohmann::json::parse(l, nullptr, false);
          if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
              j["step"].get<int64_t>() <= resume_step_)
            keep.push_back(l);  // a torn last line of a killed run does not parse and goes
        }
      }
      write_file_atomically(path_, [&](std::ostream& o) {
        for (auto& l : keep) o << l << "\n";
      });
    }
    out_.open(path_, resume_step_ > 0 ? std::ios::app : std::ios::trunc);
    if (!out_) throw std::runtime_error(fmt::format("{}: cannot write: {}", path_, std::strerror(errno)));
    if (!pending_.is_null()) {
      const nlohmann::json first = std::move(pending_);
      pending_ = nullptr;
      append(first, 0);
    }
  }
  errno = 0;
  out_ << line.dump() << "\n";
  out_.flush();  // a tracker tailing the file sees each line whole and at once
  if (!out_)
    throw std::runtime_error(fmt::format("{}: cannot write the line of step {}: {}", path_, step,
                                         errno ? std::strerror(errno) : "write failed"));
}

void truncate_metrics(const std::string& path, int64_t step, const std::string& header) {
  std::vector<std::string> keep;
  {
    std::ifstream f(path);
    std::string line;
    bool first = true;
    while (f && std::getline(f, line)) {
      if (first) {
        first = false;
        continue;  // the header is rewritten below
      }
      int64_t s = -1;
      try {
        s = std::stoll(line.substr(0, line.find(',')));
      } catch (const std::exception&) {
        continue;  // a torn last line of a killed run
      }
      if (s >= 1 && s <= step) keep.push_back(line);
    }
  }
  write_file_atomically(path, [&](std::ostream& o) {
    o << header;
    for (auto& l : keep) o << l << "\n";
  });
}

}  // namespace rp
