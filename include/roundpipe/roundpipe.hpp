// Everything of RoundPipe's C++ API: models, the Session (a hand-written training loop) and
// the Trainer (the whole loop from a spec). Link roundpipe::roundpipe (find_package(roundpipe)).
#pragma once
#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/data.hpp"
#include "roundpipe/device.hpp"
#include "roundpipe/dtype.hpp"
#include "roundpipe/errors.hpp"
#include "roundpipe/generate.hpp"
#include "roundpipe/model.hpp"
#include "roundpipe/model_source.hpp"
#include "roundpipe/optimizer.hpp"
#include "roundpipe/plan.hpp"
#include "roundpipe/session.hpp"
#include "roundpipe/spec.hpp"
#include "roundpipe/trainer.hpp"
