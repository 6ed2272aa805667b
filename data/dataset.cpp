#include "data/dataset.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/error_text.hpp"
#include "base/input_file.hpp"
#include "base/json_text.hpp"
#include "base/output_folder.hpp"
#include "data/arrow_records.hpp"
#include "data/file_kind.hpp"
#include "data/pretokenizer.hpp"
#include "data/sequence_packer.hpp"
#include "data/tokenizer.hpp"

namespace rp {

namespace {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // records keep their key order (tool-call arguments render as written)

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  std::string msg = fmt::format("{}: {}", where, what);
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  throw std::runtime_error(one_line(msg));
}

int32_t require_eos(const Tokenizer& tok, const std::string& path) {
  int32_t eos = tok.eos_id();
  if (eos < 0)
    throw std::runtime_error(path + ": the tokenizer has no eos token (set one with set_eos_token)");
  return eos;
}

const char* type_name(const Json& v) { return v.type_name(); }

const std::string& get_string(const Json& obj, const char* key, const std::string& ctx,
                              const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(where, fmt::format("{}missing key \"{}\" (expected a string)", ctx, key));
  if (!it->is_string())
    fail(where, fmt::format("{}expected a string at key \"{}\", got {}", ctx, key, type_name(*it)));
  return it->get_ref<const std::string&>();
}

/// An optional string key ("" when absent or null).
std::string opt_string(const Json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return {};
  if (!it->is_string())
    fail(where, fmt::format("expected a string at key \"{}\", got {}", key, type_name(*it)));
  return it->get<std::string>();
}

/// The end of a sequence as HF's tokenizer(text) + eos gives it: eos (unless the
/// post-processor's suffix already ends with it), then the suffix.
void append_end(const Tokenizer& tok, int32_t eos, std::vector<int32_t>& ids) {
  const auto& suf = tok.suffix_tokens();
  if (suf.empty() || suf.back() != eos) ids.push_back(eos);
  ids.insert(ids.end(), suf.begin(), suf.end());
}

void append_document(const Tokenizer& tok, std::string_view text, int32_t eos, Dataset& d) {
  const auto& pre = tok.prefix_tokens();
  d.text_stream.insert(d.text_stream.end(), pre.begin(), pre.end());
  auto ids = tok.encode(text);
  d.text_stream.insert(d.text_stream.end(), ids.begin(), ids.end());
  append_end(tok, eos, d.text_stream);
  ++d.num_documents;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open");
  std::error_code ec;
  const uint64_t size = fs::is_regular_file(path, ec) ? fs::file_size(path, ec) : 0;
  try {
    std::string text;
    text.reserve(size_t(size));  // a file larger than memory fails here, before any reading
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return text;
  } catch (const std::bad_alloc&) {  // its own text names nothing
    throw std::runtime_error(does_not_fit_message(path, int64_t(size)));
  }
}

const char* kNoAssistant = "expected at least one assistant message (nothing to train on)";

/// A conversation through the model's own template: messages (role, content, tool_calls, ...)
/// and the record's tools pass to it as they are.
void add_jinja_chat(const Tokenizer& tok, const JinjaChat& chat, const Json& msgs, const Json& tools,
                    const std::string& where, Dataset& d) {
  if (!msgs.is_array())
    fail(where, fmt::format("expected an array at key \"messages\", got {}", type_name(msgs)));
  bool has_assistant = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string ctx = fmt::format("messages[{}]: ", i);
    if (!msgs[i].is_object()) fail(where, ctx + "expected an object with \"role\"");
    has_assistant |= get_string(msgs[i], "role", ctx, where) == "assistant";
  }
  if (!has_assistant) fail(where, kNoAssistant);
  if (!tools.is_null() && !tools.is_array())
    fail(where, fmt::format("expected an array at key \"tools\", got {}", type_name(tools)));
  try {
    RenderedChat r = chat.render_chat(tok, msgs, tools);
    d.examples.push_back({std::move(r.ids), std::move(r.loss_mask)});
  } catch (const jinja::TemplateError& e) {
    fail(where, e.what());
  } catch (const std::invalid_argument& e) {
    fail(where, e.what());
  }
}

void add_chat(const Tokenizer& tok, const ChatFormat& chat, const std::vector<ChatMessage>& msgs,
              const std::string& where, Dataset& d) {
  if (chat.jinja) {  // ShareGPT / alpaca records as messages
    Json m = Json::array();
    for (const auto& x : msgs) {
      Json o = {{"role", x.role}, {"content", x.content}};
      if (!x.reasoning.empty()) o["reasoning_content"] = x.reasoning;
      m.push_back(std::move(o));
    }
    add_jinja_chat(tok, *chat.jinja, m, nullptr, where, d);
    return;
  }
  const bool has_assistant =
      std::any_of(msgs.begin(), msgs.end(), [](const ChatMessage& m) { return m.role == "assistant"; });
  if (!has_assistant) fail(where, kNoAssistant);
  RenderedChat r = render_chat(tok, chat.family, msgs);
  d.examples.push_back({std::move(r.ids), std::move(r.loss_mask)});
}

// {"messages": [{"role", "content"[, "reasoning_content"]}, ...]}
std::vector<ChatMessage> messages_of(const Json& m, const std::string& where, const char* key = "messages") {
  if (!m.is_array()) fail(where, fmt::format("expected an array at key \"{}\", got {}", key, type_name(m)));
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < m.size(); ++i) {
    std::string ctx = fmt::format("{}[{}]: ", key, i);
    if (!m[i].is_object()) fail(where, ctx + "expected an object with \"role\" and \"content\"");
    ChatMessage cm{get_string(m[i], "role", ctx, where), get_string(m[i], "content", ctx, where), {}};
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
      fail(where,
           fmt::format("{}unknown role \"{}\" (expected system, user or assistant)", ctx, excerpt(cm.role)));
    cm.reasoning = opt_string(m[i], "reasoning_content", where);
    msgs.push_back(std::move(cm));
  }
  return msgs;
}

// ShareGPT: {"conversations": [{"from": "human"|"gpt"|"system", "value"}, ...], "system"?}
std::vector<ChatMessage> sharegpt_of(const Json& j, const std::string& where) {
  const auto& c = j.at("conversations");
  if (!c.is_array())
    fail(where, fmt::format("expected an array at key \"conversations\", got {}", type_name(c)));
  std::vector<ChatMessage> msgs;
  if (std::string sys = opt_string(j, "system", where); !sys.empty()) msgs.push_back({"system", sys, {}});
  for (size_t i = 0; i < c.size(); ++i) {
    std::string ctx = fmt::format("conversations[{}]: ", i);
    if (!c[i].is_object()) fail(where, ctx + "expected an object with \"from\" and \"value\"");
    const std::string& from = get_string(c[i], "from", ctx, where);
    std::string role;
    if (from == "human" || from == "user") role = "user";
    else if (from == "gpt" || from == "assistant" || from == "model" || from == "chatgpt") role = "assistant";
    else if (from == "system") role = "system";
    else
      fail(where,
           fmt::format("{}unknown \"from\" \"{}\" (expected human, gpt or system)", ctx, excerpt(from)));
    msgs.push_back({role, get_string(c[i], "value", ctx, where), {}});
  }
  return msgs;
}

// Alpaca: {"instruction", "input"?, "output", "system"?, "history"?: [[query, answer], ...]},
// as a conversation (the user turn is instruction + "\n" + input, as LLaMA-Factory joins them).
std::vector<ChatMessage> alpaca_of(const Json& j, const std::string& where) {
  std::vector<ChatMessage> msgs;
  if (std::string sys = opt_string(j, "system", where); !sys.empty()) msgs.push_back({"system", sys, {}});
  if (j.contains("history") && !j.at("history").is_null()) {
    const auto& h = j.at("history");
    if (!h.is_array()) fail(where, "expected an array of [query, answer] pairs at key \"history\"");
    for (size_t i = 0; i < h.size(); ++i) {
      if (!h[i].is_array() || h[i].size() != 2 || !h[i][0].is_string() || !h[i][1].is_string())
        fail(where, fmt::format("history[{}]: expected a pair of strings [query, answer]", i));
      msgs.push_back({"user", h[i][0].get<std::string>(), {}});
      msgs.push_back({"assistant", h[i][1].get<std::string>(), {}});
    }
  }
  std::string user = get_string(j, "instruction", "", where);
  if (std::string input = opt_string(j, "input", where); !input.empty()) user += "\n" + input;
  msgs.push_back({"user", std::move(user), {}});
  msgs.push_back({"assistant", get_string(j, "output", "", where), {}});
  return msgs;
}

/// A conversational prompt / completion as TRL renders it: the completion's tokens are those of
/// render(prompt ++ completion) after render(prompt, add_generation_prompt), which must be its
/// prefix; tools pass to a Jinja template as `tools`.
Example chat_prompt_completion(const Json& prompt, const Json& completion, const char* ckey,
                               const Json& tools, const std::string& where, const Tokenizer& tok,
                               const ChatFormat& chat) {
  for (const auto& [m, key] : {std::pair<const Json*, const char*>{&prompt, "prompt"}, {&completion, ckey}}) {
    if (!m->is_array())
      fail(where, fmt::format("expected a list of messages at key \"{}\" (as \"prompt\"), got {}", key,
                              type_name(*m)));
    for (size_t i = 0; i < m->size(); ++i) {
      const std::string ctx = fmt::format("{}[{}]: ", key, i);
      if (!(*m)[i].is_object()) fail(where, ctx + "expected an object with \"role\"");
      get_string((*m)[i], "role", ctx, where);
    }
  }
  if (!std::any_of(completion.begin(), completion.end(),
                   [](const Json& m) { return m["role"] == "assistant"; }))
    fail(where, fmt::format("expected an assistant message in \"{}\" (nothing to train on)", ckey));
  Json all = prompt;
  all.insert(all.end(), completion.begin(), completion.end());
  std::string prompt_text, full;
  try {
    if (chat.jinja) {
      prompt_text = chat.jinja->render(prompt, tools, true);
      full = chat.jinja->render(all, tools, false);
    } else {
      prompt_text = render_chat_text(chat.family, messages_of(prompt, where, "prompt"), nullptr, true);
      messages_of(completion, where, ckey);  // names a bad completion message by its own key
      full = render_chat_text(chat.family, messages_of(all, where, "prompt+completion"), nullptr, false);
    }
  } catch (const jinja::TemplateError& e) {
    fail(where, e.what());
  }
  if (full.compare(0, prompt_text.size(), prompt_text) != 0)
    fail(where,
         fmt::format("the chat template renders the prompt with its generation prompt differently from the "
                     "start of prompt + {} (nothing marks where the {} starts)",
                     ckey, ckey));
  RenderedChat r = tokenize_chat(tok, full, {{prompt_text.size(), full.size()}});
  return {std::move(r.ids), std::move(r.loss_mask)};
}

}  // namespace

const Json& record_without_nulls(const Json& record, Json& storage) {
  if (!record.is_object() ||
      std::none_of(record.begin(), record.end(), [](const Json& v) { return v.is_null(); }))
    return record;
  storage = Json::object();
  for (auto it = record.begin(); it != record.end(); ++it)
    if (!it->is_null()) storage[it.key()] = *it;
  return storage;
}

Example prompt_completion_example(const Json& j, const char* ckey, const std::string& where,
                                  const Tokenizer& tok, const ChatFormat& chat) {
  const auto p = j.find("prompt"), c = j.find(ckey);
  if (p != j.end() && c != j.end() && (p->is_array() || c->is_array()))
    return chat_prompt_completion(*p, *c, ckey, j.value("tools", Json()), where, tok, chat);
  const std::string& prompt = get_string(j, "prompt", "", where);
  const std::string& completion = get_string(j, ckey, "", where);
  if (prompt.empty() && completion.empty())
    fail(where, fmt::format("\"prompt\" and \"{}\" are both empty (nothing to train on)", ckey));
  // as TRL: the prompt + completion text tokenised as one, the loss after as many tokens as the
  // prompt alone has
  Example ex;
  ex.ids = tok.prefix_tokens();
  const size_t prompt_tokens = ex.ids.size() + tok.encode(prompt).size();
  const auto pc = tok.encode(prompt + completion);
  ex.ids.insert(ex.ids.end(), pc.begin(), pc.end());
  append_end(tok, require_eos(tok, where), ex.ids);
  ex.loss_mask.assign(ex.ids.size(), 1);
  std::fill_n(ex.loss_mask.begin(), std::min(prompt_tokens, ex.ids.size()), uint8_t(0));
  return ex;
}

namespace {

/// One record of a JSON data file into `d`.
void add_record_fields(const Json& record, const std::string& where, const Tokenizer& tok,
                       const ChatFormat& chat, Dataset& d) {
  Json kept;
  const Json& j = record_without_nulls(record, kept);
  if (!j.is_object()) fail(where, fmt::format("expected a JSON object, got {}", type_name(j)));
  if (j.contains("messages")) {
    if (chat.jinja) add_jinja_chat(tok, *chat.jinja, j.at("messages"), j.value("tools", Json()), where, d);
    else add_chat(tok, chat, messages_of(j.at("messages"), where), where, d);
  } else if (j.contains("conversations")) {
    add_chat(tok, chat, sharegpt_of(j, where), where, d);
  } else if (j.contains("instruction") || j.contains("output")) {
    add_chat(tok, chat, alpaca_of(j, where), where, d);
  } else if (j.contains("prompt") || j.contains("completion")) {
    // two shapes in one record: training on one would drop the other unseen
    if (j.contains("text"))
      fail(where, fmt::format("found the keys {}\"text\" of two record shapes; expected \"text\" alone (a "
                              "document, every token trained) or \"prompt\"+\"completion\" without it",
                              std::string(j.contains("prompt") ? "\"prompt\", " : "") +
                                  (j.contains("completion") ? "\"completion\", " : "")));
    d.examples.push_back(prompt_completion_example(j, "completion", where, tok, chat));
  } else if (j.contains("text")) {
    append_document(tok, get_string(j, "text", "", where), require_eos(tok, where), d);
  } else {
    fail(where,
         std::string("expected a key \"text\", \"prompt\"+\"completion\", \"messages\", \"conversations\" "
                     "(ShareGPT) or \"instruction\"+\"output\" (alpaca)") +
             (&j != &record ? " (a key whose value is null counts as absent)" : ""));
  }
}

/// add_record_fields, with the record (file:line) named when the tokenizer's pre-tokenizer regex
/// ran past its work bound on it.
void add_record(const Json& j, const std::string& where, const Tokenizer& tok, const ChatFormat& chat,
                Dataset& d) {
  try {
    add_record_fields(j, where, tok, chat, d);
  } catch (const RegexWorkExceeded& e) {
    fail(where, e.what());
  }
}

/// Refuses JSON text nested deeper than kMaxJsonNesting (a copy or print of such a value
/// recurses once per level: 20,000 levels overflowed the stack); `where` names the file or line.
void refuse_deep(const std::string& text, const std::string& where) {
  if (json_nesting_depth(text) > kMaxJsonNesting)
    fail(where, fmt::format("invalid JSON: objects and lists nested deeper than {} levels", kMaxJsonNesting));
}

/// Refuses a NUL byte in a JSON text (nlohmann's lexer takes it for the end of the input, so
/// whatever follows it would be dropped unseen); `line0` is the line `text` starts on.
void refuse_nul(const std::string& text, const std::string& path, size_t line0) {
  const size_t at = text.find('\0');
  if (at == std::string::npos) return;
  fail(fmt::format("{}:{}", path, line0 + size_t(std::count(text.begin(), text.begin() + long(at), '\n'))),
       kJsonNulReason);
}

/// 1-based line of byte offset `pos` in `text`.
size_t line_of(const std::string& text, size_t pos) {
  return 1 + size_t(std::count(text.begin(), text.begin() + long(std::min(pos, text.size())), '\n'));
}

/// Every element of a JSON array file, whole in memory (a JSON array cannot be read in parts).
void json_array_records(const std::string& path, const RecordFn& record) {
  const std::string text = read_all(path);
  refuse_nul(text, path, 1);
  refuse_deep(text, path);
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    fail(fmt::format("{}:{}", path, line_of(text, e.byte ? e.byte - 1 : 0)),
         "invalid JSON: " + json_error_reason(e));
  } catch (const Json::out_of_range& e) {  // a number past a double: 1e400
    fail(path, fmt::format("invalid JSON: {} (past a double's range, about 1.8e308)", json_error_reason(e)));
  }
  if (!j.is_array()) fail(path, fmt::format("expected a JSON array of objects, got {}", type_name(j)));
  // counted from 1, as the line numbers of a .jsonl file
  for (size_t i = 0; i < j.size(); ++i)
    record(j[i], fmt::format("{}: element {} of {}", path, i + 1, j.size()));
}

/// Every line of a JSON lines file, read line by line: memory holds one line, not the file.
void json_lines_records(const std::string& path, const RecordFn& record) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::string line;
  size_t lineno = 0;
  for (;;) {
    // a failed read (a line longer than memory holds: getline catches the bad_alloc and sets
    // badbit) ended the loop as if the file ended there
    if (!std::getline(in, line)) {
      if (in.bad())
        throw std::runtime_error(fmt::format(
            "{}:{}: cannot read (the line does not fit in memory, or the read failed)", path, lineno + 1));
      break;
    }
    ++lineno;
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 BOM
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    refuse_nul(line, path, lineno);
    refuse_deep(line, fmt::format("{}:{}", path, lineno));
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::parse_error& e) {
      std::string text = read_all(path);  // only to tell the cause
      if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
      if (Json::accept(text))  // one object written over several lines
        fail(path,
             "one JSON object over several lines; expected one object per line (JSON lines) or a JSON array "
             "of objects");
      fail(fmt::format("{}:{}", path, lineno), "invalid JSON: " + json_error_reason(e));
    } catch (const Json::out_of_range& e) {  // a number past a double: 1e400
      fail(fmt::format("{}:{}", path, lineno),
           fmt::format("invalid JSON: {} (past a double's range, about 1.8e308)", json_error_reason(e)));
    }
    record(j, fmt::format("{}:{}", path, lineno));
  }
}

bool has_extension(const std::string& path, std::initializer_list<const char*> exts) {
  std::string e = fs::path(path).extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return std::any_of(exts.begin(), exts.end(), [&](const char* x) { return e == x; });
}

/// The first byte that is not whitespace (or a UTF-8 byte-order mark), or 0.
char first_char(const std::string& text) {
  size_t i = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  i = text.find_first_not_of(" \t\r\n", i);
  return i == std::string::npos ? 0 : text[i];
}
}  // namespace

void for_each_json_record(const std::string& path, const RecordFn& record) {
  const char c = first_char(file_head(path, 1 << 16));
  if (c == '[') json_array_records(path, record);
  else if (c == '{') json_lines_records(path, record);
  else if (c != 0)
    fail(path,
         fmt::format("expected JSON lines (one object per line) or a JSON array of objects, but the file "
                     "starts with {}",
                     c >= 0x20 && c < 0x7f ? fmt::format("'{}'", c)
                                           : fmt::format("byte 0x{:02x} (not text)", uint8_t(c))));
}

void for_each_record(const std::string& path, const RecordFn& record) {
  const ColumnarFormat format = columnar_format_of(file_head(path, 8));
  if (format == ColumnarFormat::none) return for_each_json_record(path, record);
  for_each_columnar_row(path, format,
                        [&](const Json& row, size_t n) { record(row, fmt::format("{}: row {}", path, n)); });
}

namespace {
/// Receives the examples and documents of each record (or text file) as it is read, in
/// `scratch`, and empties it.
using TakeFn = std::function<void(Dataset& scratch)>;

/// The records of a JSON or columnar file through `take`; "<path>: no examples" for none.
void stream_records(const std::string& path, const Tokenizer& tok, const ChatFormat& chat,
                    const TakeFn& take) {
  Dataset scratch;
  size_t n = 0;
  for_each_record(path, [&](const Json& j, const std::string& where) {
    add_record(j, where, tok, chat, scratch);
    n += scratch.examples.size() + scratch.num_documents;
    take(scratch);
  });
  if (n == 0) throw std::runtime_error(path + ": no examples");
}

/// `path` itself, or the .txt files of the folder `path` in name order.
std::vector<std::string> text_files(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {path};  // the file's reader names what is wrong
  std::vector<std::string> files;
  for (const fs::path& p : folder_entries(path))
    if (p.extension() == ".txt" && fs::is_regular_file(p, ec)) files.push_back(p.string());
  if (files.empty()) throw std::runtime_error(path + ": no .txt files in this directory");
  return files;
}

void stream_text_corpus(const std::string& path, const Tokenizer& tok, const TakeFn& take) {
  int32_t eos = require_eos(tok, path);
  Dataset scratch;
  bool any_text = false;
  for (const auto& f : text_files(path)) try {
      const std::string text = read_all(f);
      any_text |= !text.empty();
      if (std::string e = text_file_error(f, text); !e.empty()) throw std::runtime_error(e);
      append_document(tok, text, eos, scratch);
      take(scratch);
    } catch (const RegexWorkExceeded& e) {
      fail(f, e.what());
    }
  if (!any_text) fail(path, fs::is_directory(path) ? "its .txt files are empty" : "empty; expected text");
}

void stream_dataset(const std::string& path, const Tokenizer& tok, const ChatFormat& chat,
                    const TakeFn& take) {
  if (fs::is_directory(path)) return stream_text_corpus(path, tok, take);
  const std::string head = file_head(path, 4096);
  if (columnar_format_of(head) != ColumnarFormat::none) return stream_records(path, tok, chat, take);
  if (std::string e = binary_file_error(path, head); !e.empty()) throw std::runtime_error(e);
  if (has_extension(path, {".txt"})) return stream_text_corpus(path, tok, take);
  const char c = first_char(head);
  if (c == '{' || c == '[' || has_extension(path, {".json", ".jsonl"}))
    return stream_records(path, tok, chat, take);
  stream_text_corpus(path, tok, take);
}

/// A take that gathers everything into `d`.
TakeFn gather_into(Dataset& d) {
  return [&d](Dataset& s) {
    for (auto& ex : s.examples) d.examples.push_back(std::move(ex));
    d.text_stream.insert(d.text_stream.end(), s.text_stream.begin(), s.text_stream.end());
    d.num_documents += s.num_documents;
    s = Dataset{};
  };
}

/// Newlines and bytes of `path` (every .txt file of a folder): bounds on the rows it can yield.
std::pair<size_t, size_t> lines_and_bytes(const std::string& path) {
  size_t lines = 0, bytes = 0;
  std::vector<char> buf(1 << 20);
  for (const auto& f : text_files(path)) {
    std::ifstream in(f, std::ios::binary);
    while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
      const auto n = size_t(in.gcount());
      lines += size_t(std::count(buf.begin(), buf.begin() + long(n), '\n'));
      bytes += n;
    }
    ++lines;  // a last line without its newline
  }
  return {lines, bytes};
}
}  // namespace

Dataset load_json_records(const std::string& path, const Tokenizer& tok, const ChatFormat& chat) {
  Dataset d;
  for_each_json_record(path,
                       [&](const Json& j, const std::string& where) { add_record(j, where, tok, chat, d); });
  if (d.examples.empty() && d.num_documents == 0) throw std::runtime_error(path + ": no examples");
  return d;
}

Dataset load_columnar_records(const std::string& path, const Tokenizer& tok, const ChatFormat& chat) {
  if (columnar_format_of(file_head(path, 8)) == ColumnarFormat::none)
    fail(path, "not a Parquet or Arrow IPC file (it does not start with their magic)");
  Dataset d;
  stream_records(path, tok, chat, gather_into(d));
  return d;
}

Dataset load_text_corpus(const std::string& path, const Tokenizer& tok) {
  Dataset d;
  stream_text_corpus(path, tok, gather_into(d));
  return d;
}

Dataset load_dataset(const std::string& path, const Tokenizer& tok, const ChatFormat& chat) {
  Dataset d;
  stream_dataset(path, tok, chat, gather_into(d));
  return d;
}

void load_dataset_into(const std::string& path, const Tokenizer& tok, const ChatFormat& chat,
                       SequencePacker& packer, size_t max_examples) {
  // every example takes a row at most (records are lines of JSON lines) and every token of
  // text takes a byte at least, give or take a document's prefix and eos: address space, not
  // memory, for that many rows
  if (!fs::is_directory(path) && columnar_format_of(file_head(path, 8)) == ColumnarFormat::none) {
    const auto [lines, bytes] = lines_and_bytes(path);
    packer.reserve(lines, (bytes + 3 * lines) / size_t(packer.seq_len()) + 1);
  }
  stream_dataset(path, tok, chat, [&](Dataset& s) {
    for (const auto& ex : s.examples)
      if (max_examples == 0 || packer.examples() < max_examples) packer.add_example(ex);
    packer.add_text(s.text_stream);
    s = Dataset{};
  });
}

}  // namespace rp
