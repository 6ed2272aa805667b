// JSONL / plain-text loading, file:line errors, packing and the batch stream.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common.hpp"
#include "data/chat_template.hpp"
#include "data/dataset.hpp"
#include "data/tokenizer.hpp"

using namespace rp;
using rp::test::fixture;
using rp::test::qwen;
using rp::test::read_file;
using rp::test::TempDir;

namespace {
using Ids = std::vector<int32_t>;
constexpr int32_t X = kIgnoreIndex;

// The message of the runtime_error thrown by loading `content` as a JSONL file.
std::string jsonl_error(const std::string& content, std::string* path_out = nullptr) {
  TempDir dir;
  std::string path = dir.write("data.jsonl", content);
  if (path_out) *path_out = path;
  try {
    load_json_records(path, qwen(), ChatTemplate::chatml);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "<no exception>";
}

void expect_error(const std::string& content, const std::string& where_what) {
  std::string path;
  std::string msg = jsonl_error(content, &path);
  EXPECT_EQ(msg.rfind(path + ":", 0), 0u) << "should start with the path: " << msg;
  EXPECT_NE(msg.find("data.jsonl:" + where_what), std::string::npos) << "got: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
}
}  // namespace

TEST(Jsonl, ErrorsNameFileLineAndExpectation) {
  expect_error("{\"text\": \"ok\"}\n{\"text\": \n", "2: invalid JSON");
  expect_error("{\"prompt\":\"a\",\"completion\":\"b\"}\n\n{\"prompt\":\"p\",\"completion\":5}\n",
               "3: expected a string at key \"completion\", got number");
  expect_error("{\"prompt\":\"p\"}\n", "1: missing key \"completion\"");
  expect_error("{\"completion\":\"c\"}\n", "1: missing key \"prompt\"");
  expect_error(
      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"bot\",\"content\":\"y\"}]}\n",
      "1: messages[1]: unknown role \"bot\" (expected system, user or assistant)");
  expect_error("{\"messages\":[{\"role\":\"user\"}]}\n", "1: messages[0]: missing key \"content\"");
  expect_error("{\"messages\":{\"role\":\"user\"}}\n", "1: expected an array at key \"messages\"");
  expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"only a question\"}]}\n",
               "1: expected at least one assistant message");
  expect_error("[1, 2]\n", " element 1 of 2: expected a JSON object, got number");
  expect_error("[{\"text\": \"a\"}, 2]\n", " element 2 of 2: expected a JSON object, got number");
  expect_error(
      "{\"text\": \"a\"}\n{\"foo\": 1}\n",
      "2: expected a key \"text\", \"prompt\"+\"completion\", \"messages\", \"conversations\" (ShareGPT) or "
      "\"instruction\"+\"output\" (alpaca)");
  expect_error("{\"text\": \"a\"}\n{\"text\": 1}\n[1]\n", "2: expected a string at key \"text\", got number");
  expect_error("{\"conversations\": [{\"from\": \"robot\", \"value\": \"x\"}]}\n",
               "1: conversations[0]: unknown \"from\" \"robot\" (expected human, gpt or system)");
  expect_error("{\"instruction\": \"do\", \"output\": 3}\n",
               "1: expected a string at key \"output\", got number");
  expect_error("[{\"text\": \"a\"},\n {\"text\": }]\n", "2: invalid JSON");
  // a NUL byte ended the JSON text unseen: the second record of the line was dropped
  const std::string nul(1, '\0'),
      why = "invalid JSON: a NUL byte (JSON text has none; in a string it is written \\u0000)";
  expect_error("{\"text\": \"a\"}\n{\"text\": \"b\"}" + nul + "{\"text\": \"c\"}\n", "2: " + why);
  expect_error("[{\"text\": \"a\"},\n{\"text\": \"b\"}]" + nul + "\n", "2: " + why);
  expect_error("{\"text\": \"hello world\"}\n{\"text\": \"a" + nul + "b\"}\n", "2: " + why);
  // nesting past 512 levels (20,000 overflowed the stack) and a number past a double (the JSON
  // library's own exception text named no file) are one line naming the record
  std::string deep = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\", \"x\": ";
  deep += std::string(20000, '[') + std::string(20000, ']') + "}]}";
  expect_error("{\"text\": \"a\"}\n" + deep + "\n",
               "2: invalid JSON: objects and lists nested deeper than 512 levels");
  expect_error("[" + deep + "]", " invalid JSON: objects and lists nested deeper than 512 levels");
  // brackets inside strings are text, not nesting
  EXPECT_EQ(jsonl_error("{\"text\": \"" + std::string(600, '[') + "\"}\n"), "<no exception>");
  expect_error("{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": 1e400}\n",
               "3: invalid JSON: number overflow parsing '1e400' (past a double's range, about 1.8e308)");
  expect_error("[{\"text\": \"a\"},\n{\"text\": -1e400}]", " invalid JSON: number overflow parsing '-1e400'");
  // past the first line the reason has no "at line 1" of its own (the parser sees one line)
  EXPECT_EQ(jsonl_error("{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": }\n").find("line 1"),
            std::string::npos);
  expect_error(
      "{\"text\": null}\n",
      "1: expected a key \"text\", \"prompt\"+\"completion\", \"messages\", \"conversations\" (ShareGPT) "
      "or \"instruction\"+\"output\" (alpaca) (a key whose value is null counts as absent)");
  // a record of two shapes is refused, naming the keys found: training on one would drop the other
  const std::string two_shapes =
      " of two record shapes; expected \"text\" alone (a document, every token trained) or "
      "\"prompt\"+\"completion\" without it";
  expect_error("{\"text\": \"a\"}\n{\"prompt\": \"p\", \"completion\": \"c\", \"text\": \"t\"}\n",
               "2: found the keys \"prompt\", \"completion\", \"text\"" + two_shapes);
  expect_error("{\"text\": \"t\", \"prompt\": \"p\"}\n",
               "1: found the keys \"prompt\", \"text\"" + two_shapes);
  expect_error("{\"completion\": \"c\", \"text\": \"t\"}\n",
               "1: found the keys \"completion\", \"text\"" + two_shapes);
  // a null is an absent key in every shape (a table written as JSON lines leaves its empty cells
  // null: datasets' to_json)
  EXPECT_EQ(jsonl_error("{\"prompt\": \"p\", \"completion\": \"c\", \"text\": null}\n"), "<no exception>");
  EXPECT_EQ(jsonl_error("{\"text\": \"t\", \"prompt\": null, \"completion\": null}\n"), "<no exception>");
  EXPECT_EQ(jsonl_error("{\"prompt\": \"p\", \"completion\": \"c\", \"messages\": null}\n"),
            "<no exception>");
  EXPECT_EQ(jsonl_error("{\"instruction\": null, \"output\": null, \"text\": \"t\"}\n"), "<no exception>");
  EXPECT_NE(jsonl_error("\n  \n").find(": no examples"), std::string::npos);
  EXPECT_THROW(load_json_records("/nonexistent/x.jsonl", qwen(), ChatTemplate::chatml), std::runtime_error);
}

// A tokenizer whose pre-tokenizer regex backtracks catastrophically on a data line fails with
// one line naming the data file and line as well as the tokenizer file.
TEST(Jsonl, ARegexPastItsWorkBoundNamesTheDataLineAndTheTokenizer) {
  nlohmann::json j = nlohmann::json::parse(read_file(fixture("qwen3-tokenizer/tokenizer.json")));
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "(a+)+b|."}}}, {"behavior", "Isolated"}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const Tokenizer evil = Tokenizer::from_json(j, "evil/tokenizer.json");
  std::string run;
  while (run.size() < 23000) run += std::string(20, 'a') + "c";
  TempDir dir;
  const std::string path = dir.write("data.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"" + run + "\"}\n");
  try {
    load_json_records(path, evil, ChatTemplate::chatml);
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(path + ":2: evil/tokenizer.json: ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_LT(m.size(), 500u) << m;
  }
}

// The same records as JSON lines or as a JSON array, whatever the file is called; a .json
// file holding neither, or one object spread over several lines, is one clear error.
TEST(Jsonl, ArraysAndLinesAreRecognisedByContent) {
  TempDir dir;
  const std::string r1 = "{\"prompt\": \"Q?\", \"completion\": \" A.\"}";
  const std::string r2 = "{\"text\": \"Some words.\"}";
  const Dataset lines =
      load_json_records(dir.write("a.jsonl", r1 + "\n" + r2 + "\n"), qwen(), ChatTemplate::chatml);
  ASSERT_EQ(lines.examples.size(), 1u);
  ASSERT_EQ(lines.num_documents, 1u);
  for (const auto& [name, content] : std::vector<std::pair<std::string, std::string>>{
           {"lines.json", r1 + "\n" + r2 + "\n"},  // what datasets' to_json writes by default
           {"array.json", "[\n  " + r1 + ",\n  " + r2 + "\n]\n"},
           {"array.jsonl", "\xEF\xBB\xBF [" + r1 + "," + r2 + "]"},
           {"noext", r1 + "\n\n" + r2}}) {
    const Dataset d = load_dataset(dir.write(name, content), qwen(), ChatTemplate::chatml);
    ASSERT_EQ(d.examples.size(), 1u) << name;
    EXPECT_EQ(d.examples[0].ids, lines.examples[0].ids) << name;
    EXPECT_EQ(d.examples[0].loss_mask, lines.examples[0].loss_mask) << name;
    EXPECT_EQ(d.text_stream, lines.text_stream) << name;
  }
  for (const auto& [name, content, what] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"prose.json", "Once upon a time {there was} a file.\n",
            "expected JSON lines (one object per line) or a JSON array of objects, but the file starts with "
            "'O'"},
           {"pretty.json", "{\n  \"text\": \"a\"\n}\n", "one JSON object over several lines"},
           {"random.json", std::string("\x8f\x01{\"text\"", 9),
            "not text: its first bytes are 8f 01 7b 22 74 65 78 74 22;"},
           {"object.json", "{\"data\": [1]}", "expected a key \"text\""}}) {
    const std::string path = dir.write(name, content);
    try {
      load_dataset(path, qwen(), ChatTemplate::chatml);
      ADD_FAILURE() << name << ": no error";
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path, 0), 0u) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  // plain text stays plain text (a .txt file, or another file whose content is not JSON)
  const Dataset txt =
      load_dataset(dir.write("notes.txt", "{not json} just text"), qwen(), ChatTemplate::chatml);
  EXPECT_EQ(txt.num_documents, 1u);
  EXPECT_EQ(load_dataset(dir.write("notes", "just text"), qwen(), ChatTemplate::chatml).num_documents, 1u);
}

// Alpaca and ShareGPT records are the conversations they describe.
TEST(Jsonl, AlpacaAndShareGptShapes) {
  TempDir dir;
  const std::string path = dir.write(
      "d.jsonl",
      "{\"instruction\": \"Translate\", \"input\": \"chat\", \"output\": \"cat\"}\n"
      "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\", \"system\": \"Be brief.\", "
      "\"history\": [[\"q0\", \"a0\"]]}\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"Hello\"}, {\"from\": \"gpt\", \"value\": "
      "\"Hi!\"}, "
      "{\"from\": \"human\", \"value\": \"Bye\"}, {\"from\": \"gpt\", \"value\": \"Bye!\"}], \"system\": "
      "\"S\"}\n");
  const Dataset d = load_json_records(path, qwen(), ChatTemplate::chatml);
  const std::vector<std::vector<ChatMessage>> want = {
      {{"user", "Translate\nchat"}, {"assistant", "cat"}},
      {{"system", "Be brief."}, {"user", "q0"}, {"assistant", "a0"}, {"user", "Say hi"}, {"assistant", "hi"}},
      {{"system", "S"}, {"user", "Hello"}, {"assistant", "Hi!"}, {"user", "Bye"}, {"assistant", "Bye!"}}};
  ASSERT_EQ(d.examples.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const RenderedChat r = render_chat(qwen(), ChatTemplate::chatml, want[i]);
    EXPECT_EQ(d.examples[i].ids, r.ids) << i;
    EXPECT_EQ(d.examples[i].loss_mask, r.loss_mask) << i;
  }
}

TEST(Jsonl, ThreeShapes) {
  TempDir dir;
  std::string path = dir.write("d.jsonl",
                               "{\"prompt\": \"Capital of France?\", \"completion\": \" Paris.\"}\r\n"
                               "\n"
                               "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": "
                               "\"assistant\", \"content\": \"Hello!\"}]}\n"
                               "{\"text\": \"Plain words.\"}\n"
                               "{\"text\": \"More words.\"}");  // no final newline
  Dataset d = load_json_records(path, qwen(), ChatTemplate::chatml);
  ASSERT_EQ(d.examples.size(), 2u);
  const int32_t eos = qwen().eos_id();
  // prompt/completion: prompt tokens masked, completion + eos trained on.
  Ids p = qwen().encode("Capital of France?"), c = qwen().encode(" Paris.");
  Ids want = p;
  want.insert(want.end(), c.begin(), c.end());
  want.push_back(eos);
  EXPECT_EQ(d.examples[0].ids, want);
  std::vector<uint8_t> mask(p.size(), 0);
  mask.resize(want.size(), 1);
  EXPECT_EQ(d.examples[0].loss_mask, mask);
  // chat: same as rendering it directly.
  auto r = render_chat(qwen(), ChatTemplate::chatml, {{"user", "Hi"}, {"assistant", "Hello!"}});
  EXPECT_EQ(d.examples[1].ids, r.ids);
  EXPECT_EQ(d.examples[1].loss_mask, r.loss_mask);
  // text lines: concatenated, each followed by eos.
  Ids a = qwen().encode("Plain words."), b = qwen().encode("More words.");
  Ids stream = a;
  stream.push_back(eos);
  stream.insert(stream.end(), b.begin(), b.end());
  stream.push_back(eos);
  EXPECT_EQ(d.text_stream, stream);
  EXPECT_EQ(d.num_documents, 2u);
}

TEST(TextCorpus, DirectoryOfTxtFiles) {
  Dataset d = load_text_corpus(fixture("sotu-excerpt"), qwen());
  EXPECT_EQ(d.num_documents, 3u);  // README.md is not a .txt file
  EXPECT_TRUE(d.examples.empty());
  const int32_t eos = qwen().eos_id();
  EXPECT_EQ(std::count(d.text_stream.begin(), d.text_stream.end(), eos), 3);
  EXPECT_EQ(d.text_stream.back(), eos);
  // Files in name order: the stream starts with Washington's 1790 address.
  auto first = qwen().encode("Fellow-Citizens of the Senate");
  ASSERT_GT(d.text_stream.size(), first.size());
  EXPECT_TRUE(std::equal(first.begin(), first.end() - 1, d.text_stream.begin()));
  TempDir empty;
  EXPECT_THROW(load_text_corpus(empty.path.string(), qwen()), std::runtime_error);
  // load_dataset dispatches on directory / extension.
  EXPECT_EQ(load_dataset(fixture("sotu-excerpt"), qwen(), ChatTemplate::chatml).text_stream, d.text_stream);
}

TEST(Packing, ExamplesPaddedOnePerSequence) {
  Dataset d;
  d.examples.push_back({{10, 11, 12, 13}, {0, 0, 1, 1}});                                // fits, padded
  d.examples.push_back({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, std::vector<uint8_t>(10, 1)});  // truncated
  d.examples.push_back({{1, 2, 3, 4, 5, 6, 7}, {0, 0, 0, 0, 0, 0, 1}});  // no target left: dropped
  d.examples.push_back({{20, 21, 22, 23, 24}, {0, 0, 0, 0, 1}});         // exactly seq_len + 1 tokens
  PackedSequences p = pack_sequences(d, 4, /*pad_id=*/0);
  EXPECT_EQ(p.seq_len, 4);
  ASSERT_EQ(p.size(), 3);
  EXPECT_EQ(p.dropped_examples, 1u);
  EXPECT_EQ(p.ids, (Ids{10, 11, 12, 13, /**/ 1, 2, 3, 4, /**/ 20, 21, 22, 23}));
  EXPECT_EQ(p.targets, (Ids{X, 12, 13, X, /**/ 2, 3, 4, 5, /**/ X, X, X, 24}));
  // cut: the 10- and the 7-token example (the dropped one too); 5 = seq_len + 1 tokens is whole
  EXPECT_EQ(p.truncated_examples, 2u);
  EXPECT_EQ(pack_sequences(d, 4, 0, /*pack=*/true).truncated_examples, 2u);
  EXPECT_EQ(pack_sequences(d, 9, 0).truncated_examples, 0u) << "10 tokens fit seq_len 9 + 1";
  split_off(p, 0.5);
  EXPECT_EQ(p.truncated_examples, 2u) << "the held-out split keeps the count of the file";
}

TEST(Packing, TextStreamWindowsOverlapByOne) {
  Dataset d;
  d.text_stream = {1, 2, 3, 4, 5, 6, 7};
  PackedSequences p = pack_sequences(d, 3, 99);
  ASSERT_EQ(p.size(), 2);
  EXPECT_EQ(p.ids, (Ids{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.targets, (Ids{2, 3, 4, 5, 6, 7}));
  d.text_stream.push_back(8);  // one more token: a padded third window
  p = pack_sequences(d, 3, 99);
  ASSERT_EQ(p.size(), 3);
  EXPECT_EQ(p.ids, (Ids{1, 2, 3, 4, 5, 6, 7, 8, 99}));  // 8 is input only: no next token
  EXPECT_EQ(p.targets, (Ids{2, 3, 4, 5, 6, 7, 8, X, X}));
  // Examples come first, then text windows.
  d.examples.push_back({{50, 51}, {0, 1}});
  p = pack_sequences(d, 3, 99);
  ASSERT_EQ(p.size(), 4);
  EXPECT_EQ((Ids{p.ids.begin(), p.ids.begin() + 3}), (Ids{50, 51, 99}));
  EXPECT_EQ((Ids{p.targets.begin(), p.targets.begin() + 3}), (Ids{51, X, X}));
  EXPECT_THROW(pack_sequences(d, 0, 0), std::invalid_argument);
  EXPECT_THROW(pack_sequences(d, 4, -1), std::invalid_argument);
}

namespace {
PackedSequences numbered(int n, int64_t L) {  // sequence i holds i*100 + t
  PackedSequences p;
  p.seq_len = L;
  for (int i = 0; i < n; ++i)
    for (int64_t t = 0; t < L; ++t) {
      p.ids.push_back(i * 100 + int32_t(t));
      p.targets.push_back(t + 1 < L ? i * 100 + int32_t(t) + 1 : X);
    }
  return p;
}
}  // namespace

TEST(BatchStream, DeterministicShuffledEpochs) {
  const int N = 10;
  BatchStream a(numbered(N, 3), 42), b(numbered(N, 3), 42), c(numbered(N, 3), 43);
  EXPECT_EQ(a.num_sequences(), size_t(N));
  std::vector<Ids> from_a;
  bool differs = false;
  for (int k = 0; k < 7; ++k) {  // 7 batches of 3 = 21 sequences: crosses two epoch ends
    TokenBatch x = a.next(3), y = b.next(3), z = c.next(3);
    EXPECT_EQ(x.n_seq, 3);
    EXPECT_EQ(x.seq_len, 3);
    EXPECT_EQ(x.ids, y.ids) << "step " << k;
    EXPECT_EQ(x.targets, y.targets) << "step " << k;
    differs = differs || x.ids != z.ids;
    from_a.push_back(x.ids);
  }
  EXPECT_TRUE(differs) << "another seed should give another order";
  EXPECT_EQ(a.position(), 21);
  EXPECT_EQ(a.epoch(), 2);
  // Each epoch visits every sequence exactly once; rows are intact sequences.
  std::vector<int32_t> firsts;
  for (auto& ids : from_a)
    for (size_t r = 0; r < 3; ++r) {
      EXPECT_EQ(ids[r * 3 + 1], ids[r * 3] + 1);
      firsts.push_back(ids[r * 3] / 100);
    }
  for (int e = 0; e < 2; ++e) {
    std::set<int32_t> seen(firsts.begin() + e * N, firsts.begin() + (e + 1) * N);
    EXPECT_EQ(seen.size(), size_t(N)) << "epoch " << e;
  }
  EXPECT_NE((std::vector<int32_t>(firsts.begin(), firsts.begin() + N)),
            (std::vector<int32_t>(firsts.begin() + N, firsts.begin() + 2 * N)))
      << "epochs should be reshuffled";
  // seek() resumes exactly.
  BatchStream d(numbered(N, 3), 42);
  d.seek(12);
  EXPECT_EQ(d.next(3).ids, from_a[4]);
  // Targets travel with their ids.
  TokenBatch t = d.next(2);
  EXPECT_EQ(t.targets[2], X);
  EXPECT_EQ(t.targets[0], t.ids[1]);
  EXPECT_EQ(t.num_targets(), 4);
}

TEST(BatchStream, UnshuffledOrderAndErrors) {
  BatchStream s(numbered(4, 2), 7, /*shuffle=*/false);
  EXPECT_EQ(s.next(3).ids, (Ids{0, 1, 100, 101, 200, 201}));
  EXPECT_EQ(s.next(3).ids, (Ids{300, 301, 0, 1, 100, 101}));
  EXPECT_THROW(s.next(0), std::invalid_argument);
  EXPECT_THROW(BatchStream(PackedSequences{}, 1), std::invalid_argument);
}

TEST(BatchStream, EndToEndFromJsonl) {
  TempDir dir;
  std::string path = dir.write("chat.jsonl",
                               "{\"messages\": [{\"role\": \"user\", \"content\": \"Say hi\"}, "
                               "{\"role\": \"assistant\", \"content\": \"hi\"}]}\n");
  Dataset d = load_json_records(path, qwen(), ChatTemplate::chatml);
  PackedSequences p = pack_sequences(d, 32, qwen().eos_id());
  BatchStream s(std::move(p), 1);
  TokenBatch b = s.next(1);
  // Targets: exactly "hi" and <|im_end|>.
  Ids tg;
  for (int32_t t : b.targets)
    if (t != X) tg.push_back(t);
  Ids want = qwen().encode("hi");
  want.push_back(151645);
  EXPECT_EQ(tg, want);
}

// With a LLaMA-3-style post-processor, prompt/completion and text records start with
// <|begin_of_text|> as HF's tokenizer(text) gives them; chat records get it from the template
// only (apply_chat_template tokenizes without special tokens), never twice.
TEST(Jsonl, BosFollowsThePostProcessor) {
  auto j = nlohmann::json::parse(read_file(fixture("smollm2-tokenizer/tokenizer.json")));
  const int begin = 60000;  // beyond SmolLM2's 49,152 ids
  int id = begin;
  for (const char* s : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
    j["added_tokens"].push_back({{"id", id++}, {"content", s}, {"special", true}});
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  const Tokenizer t = Tokenizer::from_json(j, "llama3-like");
  TempDir dir;
  const std::string path = dir.write("d.jsonl",
                                     "{\"prompt\": \"Q?\", \"completion\": \" A.\"}\n{\"text\": \"Words.\"}\n"
                                     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": "
                                     "\"assistant\", \"content\": \"Yo\"}]}\n");
  const Dataset d = load_json_records(path, t, ChatTemplate::llama3);
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.examples[0].ids.front(), begin);
  EXPECT_EQ(d.examples[0].loss_mask.front(), 0);
  EXPECT_EQ(d.examples[0].ids.back(), t.eos_id());
  EXPECT_EQ(d.text_stream.front(), begin);
  EXPECT_EQ(d.text_stream.back(), t.eos_id());
  EXPECT_EQ(std::count(d.examples[1].ids.begin(), d.examples[1].ids.end(), begin), 1);
  EXPECT_EQ(d.examples[1].ids.front(), begin);
}

// Packing: examples in order, each after the previous while it fits, positions restarting
// per example (and for the padding), the last token's target only for a cut example.
TEST(Packing, ExamplesShareSequencesWithRestartingPositions) {
  Dataset d;
  d.examples.push_back({{10, 11, 12}, {0, 1, 1}});  // 3 tokens
  d.examples.push_back({{20, 21}, {0, 1}});         // 2: fits after it
  d.examples.push_back({{30, 31, 32}, {0, 0, 1}});  // 3: does not fit (5 + 3 > 6)
  d.examples.push_back({{40, 41, 42}, {0, 0, 0}});  // no target: dropped
  d.examples.push_back({{50, 51, 52, 53, 54, 55, 56, 57}, std::vector<uint8_t>(8, 1)});  // cut to 6
  d.text_stream = {1, 2, 3};
  PackedSequences p = pack_sequences(d, 6, /*pad_id=*/0, /*pack=*/true);
  ASSERT_EQ(p.size(), 4);
  EXPECT_EQ(p.dropped_examples, 1u);
  EXPECT_EQ(p.ids, (Ids{10,     11, 12, 20, 21, 0, /**/ 30, 31, 32, 0, 0, 0, /**/ 50, 51, 52, 53, 54, 55,
                        /**/ 1, 2,  3,  0,  0,  0}));
  EXPECT_EQ(p.targets, (Ids{11,     12, X, 21, X, X, /**/ X, 32, X, X, X, X, /**/ 51, 52, 53, 54, 55, 56,
                            /**/ 2, 3,  X, X,  X, X}));
  EXPECT_EQ(p.positions,
            (Ids{0, 1, 2, 0, 1, 0, /**/ 0, 1, 2, 0, 1, 2, /**/ 0, 1, 2, 3, 4, 5, /**/ 0, 1, 2, 3, 4, 5}));
  // unpacked: no positions, one example per sequence
  EXPECT_TRUE(pack_sequences(d, 6, 0).positions.empty());
  EXPECT_EQ(pack_sequences(d, 6, 0).size(), 5);
  // batches carry the positions of their sequences
  BatchStream bs(p, 0, false);
  TokenBatch b = bs.next(2);
  EXPECT_EQ(b.positions, (Ids{0, 1, 2, 0, 1, 0, 0, 1, 2, 0, 1, 2}));
}

namespace {
// In a death test's child: loads `path` with the address space capped at 2 GiB; exit 3 after
// printing the one-line refusal, 0 when it loaded. The child removes the folder of `path` before
// it exits: a threadsafe death test's child runs the test again from its start (its own
// TempDir, which _Exit would leave behind).
void load_capped(const std::string& path) {
  const Tokenizer& tok = qwen();  // loaded before the cap
  struct rlimit cap {};
  cap.rlim_cur = cap.rlim_max = rlim_t(2) << 30;
  setrlimit(RLIMIT_AS, &cap);
  int code = 0;
  try {
    load_dataset(path, tok, ChatTemplate::chatml);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 3;
  }
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::path(path).parent_path(), ec);
  std::_Exit(code);
}
}  // namespace

// A data file larger than memory is one line naming it and its size, where std::bad_alloc's own
// text named nothing: a JSON array (read whole) and a JSON lines file whose one line is larger.
TEST(DataFileDeathTest, AFileLargerThanMemoryIsNamedWithItsSize) {
  TempDir dir;
  // text for the first bytes, which are sniffed for a binary file
  const std::string array =
      dir.write("big.json", "[{\"text\": \"a\"},\n{\"text\": \"" + std::string(2048, 'a'));
  const std::string lines =
      dir.write("big.jsonl", "{\"text\": \"a\"}\n{\"text\": \"" + std::string(2048, 'a'));
  for (const std::string& p : {array, lines}) {
    const int fd = ::open(p.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, off_t(4) << 30), 0);  // sparse: the rest reads as NUL bytes
    ::close(fd);
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(load_capped(array), ::testing::ExitedWithCode(3),
              "big\\.json: cannot read \\(4294967296 bytes do not fit in memory\\)");
  EXPECT_EXIT(load_capped(lines), ::testing::ExitedWithCode(3),
              "big\\.jsonl:2: cannot read \\(the line does not fit in memory, or the read failed\\)");
}
