// A kernel-level profile of any CUDA program without Nsight Systems: a CUPTI activity
// collector loaded by the CUDA driver through CUDA_INJECTION64_PATH (the driver calls
// InitializeInjection() when the program initialises CUDA). It records every kernel, memory
// copy and runtime API call, and at exit writes one report:
//   - per stream: the time it was busy (union of its kernels) within the window;
//   - the kernels by total time (count, total, mean, share of the window);
//   - the gaps between consecutive kernels of the busiest stream (the compute stream), by
//     size, and the kernel pairs around the largest total gap time (what the GPU waited for);
//     each gap also by when the host's launch call of the kernel after it returned: after the
//     kernel before it had ended (the host launched late: the queue had run dry) or before (the
//     GPU itself took the time between two queued kernels);
//   - memory copies by direction (bytes, time, GB/s) and the runtime API calls by host time
//     (stream synchronisations are where the host waits for the GPU).
// Environment:
//   RP_KPROF_OUT     report file (default: standard error)
//   RP_KPROF_SKIP_S  leave out the first seconds after the first kernel (warm-up), default 0
//   RP_KPROF_CALLERS runtime API calls whose callers to report, comma-separated names
//                    (e.g. cudaHostUnregister,cudaStreamSynchronize): the call sites, by count
//   RP_KPROF_LAST_S  keep only the last seconds before the last kernel ended (0: all), default 0;
//                    with both, the later start wins
// Usage (the program itself is unchanged):
//   CUDA_INJECTION64_PATH=$PWD/build/bench/librp_kernel_profile.so RP_KPROF_OUT=prof.txt
//   RP_KPROF_SKIP_S=20 build/bench/bench_throughput ...  (one command line)
// Overhead: CUPTI's kernel serialisation is off (concurrent-kernel records); the records cost
// a few percent of launch throughput, so read ratios within one profile, not absolute speed.
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct KernelRec {
  uint64_t start, end;
  uint32_t stream, name, correlation;
};
struct CopyRec {
  uint64_t start, end, bytes;
  uint8_t kind;
};
struct ApiRec {
  uint64_t start, end;
  uint32_t cbid;
};

std::mutex mu;
std::vector<KernelRec> kernels;
std::vector<CopyRec> copies;
std::vector<ApiRec> apis;                         // runtime API calls
std::unordered_map<uint32_t, uint64_t> launched;  // correlation id -> end of its launch call
std::unordered_map<std::string, uint32_t> name_ids;
std::vector<std::string> names;
constexpr size_t kBufBytes = 8u << 20;
std::vector<std::string> watched;                // RP_KPROF_CALLERS
std::map<std::vector<void*>, uint64_t> callers;  // call stack (frames 2..7) -> count

uint32_t name_id(const char* mangled) {
  std::string s = mangled ? mangled : "?";
  auto it = name_ids.find(s);
  if (it != name_ids.end()) return it->second;
  int status = 0;
  char* d = abi::__cxa_demangle(s.c_str(), nullptr, nullptr, &status);
  std::string shown = (status == 0 && d) ? d : s;
  std::free(d);
  if (shown.size() > 110) shown = shown.substr(0, 107) + "...";
  const uint32_t id = uint32_t(names.size());
  names.push_back(shown);
  name_ids.emplace(std::move(s), id);
  return id;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufBytes));
  *size = kBufBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard lk(mu);
  CUpti_Activity* r = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    switch (r->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(r);
        kernels.push_back({k->start, k->end, k->streamId, name_id(k->name), uint32_t(k->correlationId)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* c = reinterpret_cast<CUpti_ActivityMemcpy6*>(r);
        copies.push_back({c->start, c->end, c->bytes, c->copyKind});
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {  // cuBLASLt and cuDNN launch through the driver API
        auto* a = reinterpret_cast<CUpti_ActivityAPI*>(r);
        if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) apis.push_back({a->start, a->end, a->cbid});
        auto [it, fresh] = launched.emplace(uint32_t(a->correlationId), uint64_t(a->end));
        if (!fresh) it->second = std::min(it->second, a->end);  // the driver call inside the runtime's
        break;
      }
      default: break;
    }
  }
  std::free(buffer);
}

double ms(uint64_t ns) { return double(ns) / 1e6; }

// Length of the union of [start, end) intervals (sorted by start).
template <class It>
uint64_t union_length(It b, It e) {
  uint64_t total = 0, cur_s = 0, cur_e = 0;
  bool open = false;
  for (It i = b; i != e; ++i) {
    if (!open || i->start > cur_e) {
      if (open) total += cur_e - cur_s;
      cur_s = i->start, cur_e = i->end, open = true;
    } else {
      cur_e = std::max(cur_e, i->end);
    }
  }
  if (open) total += cur_e - cur_s;
  return total;
}

void report_kernels(FILE* f, const std::vector<KernelRec>& ks, uint64_t window) {
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> per;  // name -> (count, ns)
  for (const auto& k : ks) per[k.name].first++, per[k.name].second += k.end - k.start;
  std::vector<std::pair<uint32_t, std::pair<uint64_t, uint64_t>>> v(per.begin(), per.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.second > b.second.second; });
  std::fprintf(f,
               "\n## Kernels by total time (top 45)\n| kernel | count | total ms | mean us | %% of window "
               "|\n|---|---|---|---|---|\n");
  for (size_t i = 0; i < v.size() && i < 45; ++i)
    std::fprintf(f, "| %s | %llu | %.1f | %.1f | %.1f |\n", names[v[i].first].c_str(),
                 (unsigned long long)v[i].second.first, ms(v[i].second.second),
                 double(v[i].second.second) / 1e3 / double(v[i].second.first),
                 100.0 * double(v[i].second.second) / double(window));
}

void report_gaps(FILE* f, const std::vector<KernelRec>& ks, uint32_t stream) {
  std::vector<KernelRec> s;
  for (const auto& k : ks)
    if (k.stream == stream) s.push_back(k);
  const uint64_t edges[] = {2000, 10000, 50000, 200000, 1000000, UINT64_MAX};
  const char* labels[] = {"< 2 us", "2-10 us", "10-50 us", "50-200 us", "0.2-1 ms", "> 1 ms"};
  uint64_t cnt[6] = {}, tot[6] = {};
  uint64_t late_cnt[6] = {}, late_tot[6] = {};  // the host's launch call returned after the GPU idled
  std::map<std::pair<uint32_t, uint32_t>, std::pair<uint64_t, uint64_t>> pairs, small_pairs;
  uint64_t last_end = s.empty() ? 0 : s[0].end;
  uint32_t last_name = s.empty() ? 0 : s[0].name;
  for (size_t i = 1; i < s.size(); ++i) {
    if (s[i].start > last_end) {
      const uint64_t g = s[i].start - last_end;
      int b = 0;
      while (g >= edges[b]) ++b;
      cnt[b]++, tot[b] += g;
      if (const auto it = launched.find(s[i].correlation); it != launched.end() && it->second > last_end)
        late_cnt[b]++, late_tot[b] += g;
      auto& at = (g >= 10000 ? pairs : small_pairs)[{last_name, s[i].name}];
      at.first++, at.second += g;
    }
    if (s[i].end >= last_end) last_end = s[i].end, last_name = s[i].name;
  }
  std::fprintf(
      f,
      "\n## Idle gaps of stream %u (the busiest)\n(launched late: the host's launch call of the kernel "
      "after the gap returned after the kernel before it had ended)\n\n| gap | count | total ms | "
      "launched late: count | total ms |\n|---|---|---|---|---|\n",
      stream);
  for (int b = 0; b < 6; ++b)
    std::fprintf(f, "| %s | %llu | %.1f | %llu | %.1f |\n", labels[b], (unsigned long long)cnt[b], ms(tot[b]),
                 (unsigned long long)late_cnt[b], ms(late_tot[b]));
  const auto top_pairs = [&](const auto& by_pair, const char* title) {
    std::vector<std::pair<std::pair<uint32_t, uint32_t>, std::pair<uint64_t, uint64_t>>> v(by_pair.begin(),
                                                                                           by_pair.end());
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.second > b.second.second; });
    std::fprintf(f,
                 "\n### %s by the kernels around them (top 20)\n| after | before | count | total ms |\n"
                 "|---|---|---|---|\n",
                 title);
    for (size_t i = 0; i < v.size() && i < 20; ++i)
      std::fprintf(f, "| %s | %s | %llu | %.1f |\n", names[v[i].first.first].c_str(),
                   names[v[i].first.second].c_str(), (unsigned long long)v[i].second.first,
                   ms(v[i].second.second));
  };
  top_pairs(pairs, "Gaps of 10 us or more");
  top_pairs(small_pairs, "Gaps under 10 us (a kernel's start after the one before it ended)");
}

void report_copies_and_apis(FILE* f, uint64_t lo, uint64_t hi) {
  const char* kinds[] = {"unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                         "AtoD",    "DtoA", "DtoD", "HtoH", "PtoP"};
  std::map<int, std::array<uint64_t, 3>> per;  // kind -> count, bytes, ns
  for (const auto& c : copies)
    if (c.start >= lo && c.start < hi) {
      auto& p = per[c.kind];
      p[0]++, p[1] += c.bytes, p[2] += c.end - c.start;
    }
  std::fprintf(
      f, "\n## Memory copies\n| kind | count | GB | ms | GB/s while copying |\n|---|---|---|---|---|\n");
  for (auto& [k, p] : per)
    std::fprintf(f, "| %s | %llu | %.2f | %.1f | %.1f |\n", k >= 0 && k <= 10 ? kinds[k] : "?",
                 (unsigned long long)p[0], double(p[1]) / 1e9, ms(p[2]),
                 p[2] ? double(p[1]) / double(p[2]) : 0.0);
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> api;
  for (const auto& a : apis)
    if (a.start >= lo && a.start < hi) api[a.cbid].first++, api[a.cbid].second += a.end - a.start;
  std::vector<std::pair<uint32_t, std::pair<uint64_t, uint64_t>>> v(api.begin(), api.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.second > b.second.second; });
  std::fprintf(f,
               "\n## Runtime API calls by host time (all threads, top 15)\n| call | count | total ms | mean "
               "us |\n|---|---|---|---|\n");
  for (size_t i = 0; i < v.size() && i < 15; ++i) {
    const char* n = nullptr;
    cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, v[i].first, &n);
    std::fprintf(f, "| %s | %llu | %.1f | %.1f |\n", n ? n : "?", (unsigned long long)v[i].second.first,
                 ms(v[i].second.second), double(v[i].second.second) / 1e3 / double(v[i].second.first));
  }
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* d = static_cast<const CUpti_CallbackData*>(data);
  if (d->callbackSite != CUPTI_API_ENTER || !d->functionName) return;
  bool hit = false;
  for (const auto& w : watched) hit = hit || w == d->functionName;
  if (!hit) return;
  void* frames[10];
  const int n = backtrace(frames, 10);
  std::vector<void*> key(frames + std::min(n, 2), frames + n);
  std::lock_guard lk(mu);
  callers[key]++;
}

std::string symbol(void* a) {
  Dl_info i{};
  if (!dladdr(a, &i)) return "?";
  if (!i.dli_sname) {  // a static symbol: module + offset, for addr2line -f -C -e <module> <offset>
    char buf[64];
    std::snprintf(buf, sizeof buf, "+0x%lx",
                  (unsigned long)(static_cast<char*>(a) - static_cast<char*>(i.dli_fbase)));
    const std::string m = i.dli_fname ? i.dli_fname : "?";
    return m.substr(m.rfind('/') + 1) + buf;
  }
  int status = 0;
  char* d = abi::__cxa_demangle(i.dli_sname, nullptr, nullptr, &status);
  std::string s = (status == 0 && d) ? d : i.dli_sname;
  std::free(d);
  if (s.size() > 90) s = s.substr(0, 87) + "...";
  return s;
}

void report_callers(FILE* f) {
  if (watched.empty()) return;
  std::vector<std::pair<std::vector<void*>, uint64_t>> v(callers.begin(), callers.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second > b.second; });
  std::fprintf(f, "\n## Callers of the watched calls (whole run, top 8 stacks)\n");
  for (size_t i = 0; i < v.size() && i < 8; ++i) {
    std::fprintf(f, "- %llu calls:", (unsigned long long)v[i].second);
    for (void* a : v[i].first) std::fprintf(f, " <- %s", symbol(a).c_str());
    std::fprintf(f, "\n");
  }
}

double env_seconds(const char* name) {
  const char* s = std::getenv(name);
  return s ? std::atof(s) : 0.0;
}

void write_report() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard lk(mu);
  const char* out = std::getenv("RP_KPROF_OUT");
  FILE* f = out ? std::fopen(out, "w") : stderr;
  if (!f) f = stderr;
  if (kernels.empty()) {
    std::fprintf(f, "kernel profile: no kernels recorded\n");
    if (f != stderr) std::fclose(f);
    return;
  }
  std::sort(kernels.begin(), kernels.end(), [](auto& a, auto& b) { return a.start < b.start; });
  const uint64_t first = kernels.front().start;
  uint64_t last = 0;
  for (const auto& k : kernels) last = std::max(last, k.end);
  uint64_t lo = first + uint64_t(env_seconds("RP_KPROF_SKIP_S") * 1e9);
  const uint64_t tail = uint64_t(env_seconds("RP_KPROF_LAST_S") * 1e9);
  if (tail > 0 && last > tail) lo = std::max(lo, last - tail);
  const uint64_t hi = UINT64_MAX;
  std::vector<KernelRec> ks;
  for (const auto& k : kernels)
    if (k.start >= lo && k.start < hi) ks.push_back(k);
  if (ks.empty()) {
    std::fprintf(f, "kernel profile: no kernels in the window (skip too long?)\n");
    if (f != stderr) std::fclose(f);
    return;
  }
  uint64_t w_end = 0;
  for (const auto& k : ks) w_end = std::max(w_end, k.end);
  const uint64_t window = w_end - ks.front().start;
  std::map<uint32_t, std::vector<KernelRec>> per_stream;
  for (const auto& k : ks) per_stream[k.stream].push_back(k);
  std::fprintf(f, "# Kernel profile\nwindow %.1f ms, %zu kernels; all streams busy %.1f%%\n\n", ms(window),
               ks.size(), 100.0 * double(union_length(ks.begin(), ks.end())) / double(window));
  std::fprintf(f, "| stream | kernels | busy ms | busy %% |\n|---|---|---|---|\n");
  uint32_t busiest = 0;
  uint64_t busiest_ns = 0;
  for (auto& [s, v] : per_stream) {
    const uint64_t b = union_length(v.begin(), v.end());
    if (b > busiest_ns) busiest_ns = b, busiest = s;
    std::fprintf(f, "| %u | %zu | %.1f | %.1f |\n", s, v.size(), ms(b), 100.0 * double(b) / double(window));
  }
  report_kernels(f, ks, window);
  report_gaps(f, ks, busiest);
  report_copies_and_apis(f, lo, hi);
  report_callers(f);
  if (f != stderr) std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  if (const char* w = std::getenv("RP_KPROF_CALLERS")) {
    std::string all = w;
    for (size_t p = 0; p <= all.size();) {
      const size_t q = std::min(all.find(',', p), all.size());
      if (q > p) watched.push_back(all.substr(p, q - p));
      p = q + 1;
    }
    CUpti_SubscriberHandle sub;
    if (cuptiSubscribe(&sub, on_api, nullptr) == CUPTI_SUCCESS)
      cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API);
  }
  std::atexit(write_report);
  return 1;
}
