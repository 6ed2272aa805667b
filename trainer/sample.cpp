#include "trainer/sample.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "data/chat_jinja.hpp"
#include "data/tokenizer.hpp"
#include "roundpipe/data.hpp"
#include "trainer/run_setup.hpp"

namespace rp {

SampleResult sample(Generator& gen, const LoadedModel& model, const SampleRequest& r,
                    const std::function<void(const std::string&)>& on_text) {
  require_tokenizer(model);
  Tokenizer tok = Tokenizer::from_json(model.tokenizer_json, tokenizer_origin(model));
  if (model.config.eos_token_id >= 0) tok.set_eos_id(int32_t(model.config.eos_token_id));
  SampleResult res;
  GenerateOptions o = r.generate;
  if (tok.eos_id() >= 0) o.stop_ids.push_back(tok.eos_id());
  if (!r.messages.empty()) {
    const std::string format = TokenStream::chat_template_for(model, r.chat_template);
    // a rendering error names the messages' file first, when they came from one
    auto rendered = [&](const std::function<std::string()>& render) {
      try {
        return render();
      } catch (const std::exception& e) {
        if (r.messages_origin.empty()) throw;
        throw std::invalid_argument(r.messages_origin + ": " + e.what());
      }
    };
    if (format == "jinja") {  // the model's own template, with its generation prompt
      const auto [bos, eos] = template_special_tokens(tok);
      const JinjaChat chat(model.chat_template, bos, eos, template_file_name(model));
      nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
      for (const auto& m : r.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
      const std::string text = rendered([&] {
        return chat.render(msgs, nullptr, true, {{"enable_thinking", r.enable_thinking}});
      });
      res.prompt_ids = tok.encode(text);  // the template writes its own BOS
    } else {
      const ChatTemplate t = parse_chat_template_name(format);
      res.prompt_ids = tok.encode(
          rendered([&] { return render_chat_text(t, r.messages, nullptr, true, r.enable_thinking); }));
    }
    for (const char* end : {"<|im_end|>", "<|eot_id|>"})
      if (int32_t id = tok.token_id(end); id >= 0) o.stop_ids.push_back(id);
  } else {
    res.prompt_ids = tok.encode_with_special_tokens(r.text);
  }
  if (r.interrupt && r.interrupt()) {
    res.interrupted = true;
    return res;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string text;  // decoded so far
  size_t shown = 0, cut = std::string::npos;
  auto text_of = [&](const std::vector<int32_t>& ids) {
    std::vector<int32_t> keep;
    // ids the tokenizer has no token for (rows a model pads its vocabulary with) show as
    // nothing, as Hugging Face's decode skips them
    for (int32_t id : ids)
      if (tok.has_token(id) && std::find(o.stop_ids.begin(), o.stop_ids.end(), id) == o.stop_ids.end())
        keep.push_back(id);
    return tok.decode(keep);
  };
  // the callback decodes as tokens come, shows the new text and stops at a stop string
  res.ids = gen.generate(res.prompt_ids, o, [&](int32_t id) {
    res.ids.push_back(id);
    text = text_of(res.ids);
    for (const auto& s : r.stop)
      if (!s.empty()) cut = std::min(cut, text.find(s));
    const size_t upto = std::min(cut, text.size());
    if (on_text && upto > shown) on_text(text.substr(shown, upto - shown));
    shown = std::max(shown, upto);
    if (cut == std::string::npos && r.interrupt && r.interrupt()) res.interrupted = true;
    return cut == std::string::npos && !res.interrupted;
  });
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.text = text_of(res.ids);
  if (cut != std::string::npos) res.text.resize(std::min(cut, res.text.size()));
  return res;
}

}  // namespace rp
