// Reading the spec's data keys (trainer/spec.cpp reads the rest): "data" as a file or a list of
// files and {"path", "weight"} objects (TrainSpec::data_mixture), "eval_data" as a file or a
// list of files (TrainSpec::eval_files). Errors are JsonFields' one-line key errors.
#pragma once
#include "base/json_fields.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

void read_data_key(const JsonFields& f, TrainSpec& s);
void read_eval_data_key(const JsonFields& f, TrainSpec& s);
/// The model's and the training data's names are recorded in JSON files (a checkpoint's
/// roundpipe_state.json, a LoRA run's roundpipe_base.json), which hold only UTF-8: a name that is
/// not (a Latin-1 file name given on the command line) is refused before the run, which failed
/// at its first save.
void check_recorded_paths(const JsonFields& f, const TrainSpec& s);

}  // namespace rp
