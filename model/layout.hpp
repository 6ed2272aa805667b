// How a model's parameters are grouped and laid out in host memory: the types (ParamGroup,
// ModelLayout, make_layout) are public, in roundpipe/model.hpp, whose file comment describes
// the groups; the tensor order within a group is fixed in layout.cpp.
#pragma once
#include "model/config.hpp"
#include "roundpipe/model.hpp"
