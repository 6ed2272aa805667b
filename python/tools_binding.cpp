// The commands other than train for Python: plan (the report `roundpipe plan` prints),
// generate (text or token ids in, tokens and text out), merge, export_gguf and convert.
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include <fmt/format.h>

#include "cli/plan.hpp"
#include "formats/gguf_export.hpp"
#include "python/bindings.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/checkpoint.hpp"
#include "roundpipe/generate.hpp"
#include "trainer/sample.hpp"

namespace py = pybind11;

namespace rp::python {
namespace {

/// One plan() keyword: the flag of `roundpipe plan` it stands for and how it sets the options.
struct PlanKeyword {
  std::string flag;
  std::function<void(PlanCommandOptions&, py::handle)> set;
};

template <class T>
std::function<void(PlanCommandOptions&, py::handle)> setter(T PlanCommandOptions::*field) {
  return [field](PlanCommandOptions& o, py::handle v) { o.*field = v.cast<T>(); };
}

/// plan()'s keywords: the flags of `roundpipe plan` without "--" and with '_' for '-'
/// (save_attention=False is --no-save-attention).
const std::map<std::string, PlanKeyword>& plan_keywords() {
  using O = PlanCommandOptions;
  static const std::map<std::string, PlanKeyword> k = {
      {"model", {"--model", setter(&O::model)}},
      {"gpu", {"--gpu", setter(&O::gpu)}},
      {"host_gib", {"--host-gib", setter(&O::host_gib)}},
      {"gpus", {"--gpus", setter(&O::gpus)}},
      {"seq", {"--seq", setter(&O::seq_len)}},
      {"micro", {"--micro", setter(&O::micro_batches)}},
      {"sequences_per_micro", {"--sequences-per-micro", setter(&O::sequences_per_micro)}},
      {"profile", {"--profile", setter(&O::profile)}},
      {"memory_cap", {"--memory-cap", setter(&O::memory_cap)}},
      {"trace", {"--trace", setter(&O::trace)}},
      {"peak_tflops", {"--peak-tflops", setter(&O::peak_tflops)}},
      {"fp8", {"--fp8", setter(&O::fp8)}},
      {"fp8_wgrad",
       {"--fp8-wgrad",
        [](O& o, py::handle v) {  // a flag: False would read as bf16 weight gradients and change nothing
          if (!v.cast<bool>())
            throw std::invalid_argument(
                "plan: fp8_wgrad=False: FP8 weight gradients are the default with fp8=True; give "
                "bf16_wgrad=True for bf16 ones");
          o.fp8_wgrad = true;
        }}},
      {"bf16_wgrad", {"--bf16-wgrad", setter(&O::bf16_wgrad)}},
      {"fp8_tflops", {"--fp8-tflops", setter(&O::fp8_tflops)}},
      {"hbm_gbps", {"--hbm-gbps", setter(&O::hbm_gbps)}},
      {"pcie_gbps", {"--pcie-gbps", setter(&O::pcie_gbps)}},
      {"iterations", {"--iterations", setter(&O::iterations)}},
      {"sync", {"--sync", setter(&O::sync)}},
      {"max_seq", {"--max-seq", setter(&O::max_seq)}},
      {"mlp_chunk", {"--mlp-chunk", setter(&O::mlp_chunk_tokens)}},
      {"save_attention", {"--no-save-attention", setter(&O::save_attention)}},
      {"frozen", {"--frozen", setter(&O::frozen)}},
      {"lora_r", {"--lora-r", setter(&O::lora_r)}},
      {"lora_targets", {"--lora-targets", setter(&O::lora_targets)}},
      {"nodes", {"--nodes", setter(&O::nodes)}},
      {"net_gbps", {"--net-gbps", setter(&O::net_gbps)}},
      {"net_latency_us", {"--net-latency-us", setter(&O::net_latency_us)}},
      {"accumulation", {"--accumulation", setter(&O::accumulation)}},
      {"expert_gemm", {"--expert-gemm", setter(&O::expert_gemm)}},
      {"grouped_gemm_efficiency", {"--grouped-gemm-efficiency", setter(&O::grouped_gemm_efficiency)}},
      {"disk_gbps", {"--disk-gbps", setter(&O::disk_gbps)}},
      {"disk_write_gbps", {"--disk-write-gbps", setter(&O::disk_write_gbps)}},
      {"host_budget_gib", {"--host-budget-gib", setter(&O::host_budget_gib)}},
      {"disk_ring", {"--disk-ring", setter(&O::disk_ring)}},
      {"plan",
       {"--plan",
        [](O& o, py::handle v) {  // a dict is the plan object itself; a str is JSON text or a file
          o.plan = py::isinstance<py::dict>(v)
                       ? py::module_::import("json").attr("dumps")(v).cast<std::string>()
                       : v.cast<std::string>();
        }}},
  };
  return k;
}

/// run_plan's report as text (what `roundpipe plan` prints on stdout).
std::string plan_text(const PlanCommandOptions& o) {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = ::open_memstream(&buf, &size);
  if (!f) throw std::runtime_error("plan: cannot open a memory stream for the report");
  try {
    run_plan(o, f);
  } catch (...) {
    std::fclose(f);
    std::free(buf);
    throw;
  }
  std::fclose(f);
  std::string out(buf, size);
  std::free(buf);
  return out;
}

std::string plan(const py::dict& kwargs) {
  PlanCommandOptions o;
  std::vector<std::pair<std::string, std::string>> given;
  for (const auto& [key, value] : kwargs) {
    const std::string name = key.cast<std::string>();
    const auto it = plan_keywords().find(name);
    if (it == plan_keywords().end()) {
      std::string known;
      for (const auto& [k, v] : plan_keywords()) known += (known.empty() ? "" : ", ") + k;
      throw std::invalid_argument(fmt::format("plan: unknown option '{}' (known: {})", name, known));
    }
    try {
      it->second.set(o, value);
    } catch (const py::cast_error&) {
      throw std::invalid_argument(fmt::format("plan: option '{}' ({}): cannot take {}", name, it->second.flag,
                                              py::repr(value).cast<std::string>().substr(0, 80)));
    }
    given.emplace_back(it->second.flag, py::str(value).cast<std::string>());
  }
  resolve_plan_flags(o, given);
  py::gil_scoped_release nogil;
  return plan_text(o);
}

/// generate(): `prompt` (plain text), `messages` (chat, list of (role, content)) or `tokens`.
py::dict generate(const std::string& model, const std::string& base, const std::string& prompt,
                  const std::vector<std::pair<std::string, std::string>>& messages,
                  const std::vector<int32_t>& tokens, const SampleRequest& defaults,
                  const std::string& backend, const std::string& dtype, int64_t context,
                  const py::object& on_text) {
  const int given = !prompt.empty() + !messages.empty() + !tokens.empty();
  if (given != 1)
    throw std::invalid_argument(
        "generate: give one of prompt=TEXT, chat=TEXT / messages=[...] or tokens=[ids]");
  SampleRequest r = defaults;
  r.text = prompt;
  for (const auto& [role, content] : messages) r.messages.push_back({role, content, {}});
  GeneratorOptions go;
  go.backend = backend;
  go.dtype = parse_dtype(dtype);
  go.max_context = context;
  std::exception_ptr python_error;
  // Ctrl-C: Python's handlers run on this thread between tokens (at the first check, then at most
  // every 100 ms, each under the GIL), so a KeyboardInterrupt, or an error raised in on_text, ends
  // the generation there and is raised once it returns.
  auto last_check = std::chrono::steady_clock::time_point{};
  const auto python_stops = [&]() -> bool {
    if (python_error) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check < std::chrono::milliseconds(100)) return false;
    last_check = now;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    python_error = std::make_exception_ptr(py::error_already_set());
    return true;
  };
  r.interrupt = python_stops;
  SampleResult res;
  py::object decoder;  // on_text: a character split across two pieces is decoded once whole
  if (!on_text.is_none())
    decoder = py::module_::import("codecs").attr("getincrementaldecoder")("utf-8")("replace");
  {
    py::gil_scoped_release nogil;
    const LoadedModel lm = load_model_or_adapter(model, base);
    Generator gen(lm, go);
    if (!tokens.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      res.prompt_ids = tokens;
      res.ids = gen.generate(tokens, r.generate, [&](int32_t) { return !python_stops(); });
      res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      std::function<void(const std::string&)> text_cb;
      if (!on_text.is_none())
        text_cb = [&](const std::string& s) {
          py::gil_scoped_acquire gil;
          if (python_error) return;
          try {
            if (py::str piece = decoder.attr("decode")(py::bytes(s)); py::len(piece) > 0) on_text(piece);
          } catch (py::error_already_set&) {
            python_error = std::current_exception();
          }
        };
      res = sample(gen, lm, r, text_cb);
      if (decoder) {
        py::gil_scoped_acquire gil;
        try {
          if (py::str rest = decoder.attr("decode")(py::bytes(), true); !python_error && py::len(rest) > 0)
            on_text(rest);
        } catch (py::error_already_set&) {
          python_error = std::current_exception();
        }
      }
    }
  }
  if (python_error) std::rethrow_exception(python_error);
  py::dict d;
  d["text"] = py::bytes(res.text).attr("decode")("utf-8", "replace");  // invalid UTF-8: U+FFFD
  d["text_bytes"] = py::bytes(res.text);
  d["tokens"] = res.ids;
  d["prompt_tokens"] = res.prompt_ids;
  d["seconds"] = res.seconds;
  return d;
}

}  // namespace

void bind_tools(py::module_& m) {
  m.def("_plan", &plan, py::arg("options"));
  m.def(
      "_generate",
      [](const std::string& model, const std::string& base, const std::string& prompt,
         const std::vector<std::pair<std::string, std::string>>& messages, const std::vector<int32_t>& tokens,
         int64_t max_tokens, double temperature, int64_t top_k, double top_p, uint64_t seed,
         const std::vector<std::string>& stop, const std::string& chat_template, bool enable_thinking,
         const std::string& backend, const std::string& dtype, int64_t context, const py::object& on_text) {
        SampleRequest r;
        r.chat_template = chat_template;
        r.enable_thinking = enable_thinking;
        r.stop = stop;
        r.generate.max_new_tokens = max_tokens;
        r.generate.temperature = temperature;
        r.generate.top_k = top_k;
        r.generate.top_p = top_p;
        r.generate.seed = seed;
        return generate(model, base, prompt, messages, tokens, r, backend, dtype, context, on_text);
      },
      py::arg("model"), py::arg("base"), py::arg("prompt"), py::arg("messages"), py::arg("tokens"),
      py::arg("max_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seed"),
      py::arg("stop"), py::arg("chat_template"), py::arg("enable_thinking"), py::arg("backend"),
      py::arg("dtype"), py::arg("context"), py::arg("on_text"));
  m.def(
      "_merge",
      [](const std::string& adapter, const std::string& out, const std::string& base,
         const std::string& dtype) {
        py::gil_scoped_release nogil;
        std::vector<std::string> notes = clean_model_folder_leftovers(out);
        const std::string base_path = merge_peft_folder(adapter, out, base, parse_dtype(dtype));
        return std::make_pair(base_path, notes);
      },
      py::arg("adapter"), py::arg("out"), py::arg("base"), py::arg("dtype"));
  m.def(
      "_export_gguf",
      [](const std::string& in, const std::string& out, const std::string& type, bool force) {
        const GgufExportType t = parse_gguf_export_type(type);
        py::gil_scoped_release nogil;
        return export_gguf(in, out, t, force);
      },
      py::arg("input"), py::arg("output"), py::arg("type"), py::arg("force"));
  m.def(
      "_convert",
      [](const std::string& gguf, const std::string& out, const std::string& dtype) {
        const DType d = parse_dtype(dtype);
        py::gil_scoped_release nogil;
        std::vector<std::string> notes = clean_model_folder_leftovers(out);
        convert_gguf_to_hf(gguf, out, d);
        return notes;
      },
      py::arg("gguf"), py::arg("out"), py::arg("dtype"));
}

}  // namespace rp::python
