#include "actors/messages.hpp"

#include <fmt/format.h>

namespace rp {

std::string describe(const CopyTag& t) {
  switch (t.kind) {
    case CopyKind::input: return fmt::format("input of micro-batch {} (task {})", t.micro_batch, t.task);
    case CopyKind::output: return fmt::format("output of micro-batch {} (task {})", t.micro_batch, t.task);
    case CopyKind::weights: return fmt::format("weights of group {} (task {})", t.group, t.task);
    case CopyKind::gradient: return fmt::format("gradient of group {} (task {})", t.group, t.task);
    case CopyKind::staged_gradient:
      return fmt::format("staged gradient contribution of group {} (task {})", t.group, t.task);
    case CopyKind::spill_output:
      return fmt::format("spilled input of layer {} of micro-batch {} (task {})", t.group, t.micro_batch,
                         t.task);
  }
  return "?";
}

std::string error_text(const caf::error& e) {
  const caf::message& ctx = e.context();
  for (size_t i = 0; i < ctx.size(); ++i)
    if (ctx.match_element<std::string>(i)) return ctx.get_as<std::string>(i);
  return caf::to_string(e);
}

std::string exception_text(const std::exception_ptr& x) {
  try {
    std::rethrow_exception(x);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {}
  return "unknown exception";
}

void register_protocol(caf::actor_system_config& cfg) { cfg.add_message_types<caf::id_block::roundpipe>(); }

}  // namespace rp
