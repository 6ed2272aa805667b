// What rp::Trainer(spec).run() logs: the default spdlog logger is swapped for one writing to a
// string for the run, and restored however the run ends.
#pragma once

#include <memory>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "roundpipe/trainer.hpp"

namespace rp::test {

inline std::string run_logging(const rp::TrainSpec& spec) {
  std::ostringstream logged;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("run", std::make_shared<spdlog::sinks::ostream_sink_mt>(logged)));
  try {
    rp::Trainer(spec).run();
  } catch (...) {
    spdlog::set_default_logger(previous);
    throw;
  }
  spdlog::set_default_logger(previous);
  return logged.str();
}

}  // namespace rp::test
