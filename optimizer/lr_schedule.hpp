// Learning-rate schedules: LrSchedule is public (roundpipe/optimizer.hpp, with the formulas);
// implemented in optimizer/lr_schedule.cpp.
#pragma once
#include "roundpipe/optimizer.hpp"
