// The compiled part of the Python package: the module `roundpipe._roundpipe` (pybind11), which
// python/roundpipe/__init__.py wraps. Each *_binding.cpp file registers its part.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace rp::python {

/// _Trainer: rp::Trainer with Python callbacks (trainer_binding.cpp).
void bind_trainer(pybind11::module_& m);
/// plan, generate, merge, export_gguf, convert (tools_binding.cpp).
void bind_tools(pybind11::module_& m);

}  // namespace rp::python
