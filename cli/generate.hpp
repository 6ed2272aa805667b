// `roundpipe generate MODEL_OR_CHECKPOINT`: text generation with a KV cache on one device
// (rp::Generator), streaming the text to stdout.
#pragma once
#include <CLI/CLI.hpp>

namespace rp {

/// Adds the `generate` subcommand to `app` (its callback runs it; errors are one line).
void add_generate_command(CLI::App& app);

}  // namespace rp
