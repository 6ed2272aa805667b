#include "trainer/metrics.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "base/atomic_file.hpp"

namespace rp {

MetricsFile::MetricsFile(const std::string& path, int64_t resume_step, bool replicas)
    : path_(path), replicas_(replicas) {
  const bool resuming = resume_step > 0;
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
      throw std::runtime_error(
          fmt::format("{}: cannot write the header: {}", path, errno ? std::strerror(errno) : "write failed"));
  }
}

void MetricsFile::write(const StepReport& r) {
  errno = 0;
  csv_ << fmt::format("{},{:.6f},{},{:.1f},{:.6g},{:.3f},{:.6g},{:.6g},{},{},{}{}\n", r.step, r.loss, r.target_tokens,
                      r.tokens_per_s, r.lr, r.elapsed_s, r.grad_norm, r.loss_scale, r.skipped ? 1 : 0,
                      r.evaluated ? fmt::format("{:.6f},{:.6g}", r.eval_loss, r.eval_perplexity) : std::string(","),
                      r.experts > 0 ? fmt::format("{:.6g},{:.4f},{:.4f}", r.aux_loss, r.expert_load_min, r.expert_load_max)
                                    : std::string(",,"),
                      replicas_ ? fmt::format(",{:.4f}", r.reduce_wait_s) : std::string());
  csv_.flush();
  // a failed row is reported at once: a full disk would fail every later save too
  if (!csv_)
    throw std::runtime_error(fmt::format("{}: cannot write the row of step {}: {}", path_, r.step,
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
