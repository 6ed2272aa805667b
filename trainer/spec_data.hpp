// Reading the spec's data keys (trainer/spec.cpp reads the rest): "data" as a file or a list of
// files and {"path", "weight"} objects (TrainSpec::data_mixture), "eval_data" as a file or a
// list of files (TrainSpec::eval_files). Errors are JsonFields' one-line key errors.
#pragma once
#include "base/json_fields.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

void read_data_key(const JsonFields& f, TrainSpec& s);
void read_eval_data_key(const JsonFields& f, TrainSpec& s);

}  // namespace rp
