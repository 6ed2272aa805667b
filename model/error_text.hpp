// Helpers for one-line error messages about file contents: rp::one_line and rp::excerpt
// (base/error_text.hpp) escape control characters and bound what a message quotes.
#pragma once
#include "base/error_text.hpp"
