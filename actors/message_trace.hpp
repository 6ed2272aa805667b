// Protocol messages in the trace (SessionOptions::trace_messages): one line at each send and
// receive site of the actors, recorded as flow arrows between the actors' "messages" tracks
// (trace/tracer.hpp). Without a tracer, or with messages off, a call costs one branch.
#pragma once
#include <string>

#include "trace/tracer.hpp"

namespace rp {

inline void trace_sent(Tracer* t, const std::string& from, const std::string& to, const char* type,
                       const Tracer::MessageKey& key) {
  if (t && t->messages()) t->sent(from, to, type, key);
}
inline void trace_received(Tracer* t, const std::string& to, const std::string& from, const char* type,
                           const Tracer::MessageKey& key) {
  if (t && t->messages()) t->received(to, from, type, key);
}

}  // namespace rp
