// Command-line settings of spec keys (roundpipe/spec.hpp SpecSetting, `--set KEY=VALUE`):
// nested keys, JSON or string values, the last one wins, and errors that name the setting.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

#include "roundpipe/spec.hpp"

namespace fs = std::filesystem;

namespace {

fs::path spec_file(const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("rp_spec_settings_" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << text;
  return p;
}

const char* kSpec = R"({"model": "m.gguf", "data": "d.jsonl", "optimizer": {"lr": 0.001}})";

std::string error_of(const std::string& text, const std::vector<rp::SpecSetting>& sets) {
  const fs::path p = spec_file(text);
  try {
    rp::load_spec(p.string(), sets);
  } catch (const std::invalid_argument& e) {
    fs::remove(p);
    return e.what();
  }
  fs::remove(p);
  return "no error";
}

std::string error_of_path(const std::string& path) {
  try {
    rp::load_spec(path);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(SpecSettings, NestedKeysJsonValuesAndStrings) {
  const fs::path p = spec_file(kSpec);
  const rp::TrainSpec s =
      rp::load_spec(p.string(), {rp::parse_set_option("seq_len=64"),
                                 rp::parse_set_option("lora.r=4"),
                                 rp::parse_set_option("lora.target_modules=[\"q_proj\",\"o_proj\"]"),
                                 rp::parse_set_option("optimizer.lr=2e-5"),
                                 rp::parse_set_option("chat_template=chatml"),
                                 rp::parse_set_option("async=false"),
                                 rp::parse_set_option("seq_len=32"),
                                 {"data", "123", true, "--data 123"}});
  fs::remove(p);
  EXPECT_EQ(s.seq_len, 32) << "a later setting wins";
  ASSERT_TRUE(s.lora.has_value()) << "lora.r created the object";
  EXPECT_EQ(s.lora->r, 4);
  EXPECT_EQ(s.lora->target_modules, (std::vector<std::string>{"q_proj", "o_proj"}));
  EXPECT_EQ(s.adam.lr, 2e-5) << "inside the file's optimizer object";
  EXPECT_EQ(s.lr_schedule.lr, 2e-5) << "the schedule inherits it as from the file";
  EXPECT_EQ(s.chat_template, "chatml") << "not JSON: a string";
  EXPECT_FALSE(s.async);
  EXPECT_EQ(s.data, "123") << "as_string keeps a number-like path a string";
}

// KEY=null removes the key: the file's "epochs" gives way to steps (both at once are refused),
// and a nested key goes back to its default.
TEST(SpecSettings, NullRemovesTheKey) {
  const fs::path p = spec_file(R"({"model": "m.gguf", "data": "d.jsonl", "epochs": 2, "seq_len": 64})");
  const rp::TrainSpec s =
      rp::load_spec(p.string(), {rp::parse_set_option("epochs=null"), rp::parse_set_option("steps=7"),
                                 rp::parse_set_option("seq_len=null"), rp::parse_set_option("lora.r=null")});
  fs::remove(p);
  EXPECT_FALSE(s.epochs.has_value());
  EXPECT_EQ(s.steps, 7);
  EXPECT_EQ(s.seq_len, rp::TrainSpec{}.seq_len) << "back to the default";
  EXPECT_FALSE(s.lora.has_value()) << "removing a key of an absent object makes no object (no LoRA)";
}

// The optimizer's values are checked where the spec is read, so an error names the spec's key
// (optimizer.betas) and not the optimizer's field (AdamWOptions.beta1).
TEST(SpecSettings, OptimizerValuesNameTheSpecsKeys) {
  for (const char* bad : {"optimizer.betas=[0.9,1.0]", "optimizer.betas=[-0.1,0.999]", "optimizer.lr=-1",
                          "optimizer.eps=-1e-8", "optimizer.weight_decay=-0.1"}) {
    const rp::SpecSetting set = rp::parse_set_option(bad);
    const std::string e = error_of(kSpec, {set});
    EXPECT_NE(e.find("key '" + set.key + "'"), std::string::npos) << bad << ": " << e;
    EXPECT_EQ(e.find("AdamWOptions"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("optimizer.betas=[0.0,0.0]")}), "no error");
}

TEST(SpecSettings, ErrorsNameTheSetting) {
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("lora.r=0")}),
            "--set lora.r=0: key 'lora.r': expected an integer in 1..65536, got 0");
  EXPECT_EQ(error_of(kSpec, {{"optimizer.lr", "abc", false, "--lr abc"}}),
            "--lr abc: key 'optimizer.lr': expected a number, got \"abc\"");
  EXPECT_NE(error_of(kSpec, {rp::parse_set_option("wokers=2")}).find("--set wokers=2: unknown key 'wokers'"),
            std::string::npos);
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("model.x=1")}),
            "--set model.x=1: key 'model' holds \"m.gguf\", not an object with keys");
  // a key with an empty part says so wherever the empty part is, and quotes the key as given,
  // whether the setting comes from the command line or is made in code (the Python package's)
  for (const std::string key : {"steps.", ".steps", "lora..r", "."}) {
    const std::string line = "--set " + key + "=3: key '" + key +
                             "' has an empty part (a dot at its start or end, or two in a row); expected "
                             "a key like seq_len or lora.r";
    try {
      rp::parse_set_option(key + "=3");
      ADD_FAILURE() << key << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), line);
    }
    EXPECT_EQ(error_of(kSpec, {{key, "3", false, "--set " + key + "=3"}}), line);
  }
  // a key too long to quote whole still names its setting, at the top level and nested
  const std::string long_key(81, 'k');
  EXPECT_NE(error_of(kSpec, {rp::parse_set_option(long_key + "=1")}).find("--set " + long_key.substr(0, 10)),
            std::string::npos);
  EXPECT_NE(
      error_of(kSpec, {rp::parse_set_option("optimizer." + long_key + "=1")}).find("--set optimizer.kkkk"),
      std::string::npos);
  // a warmup longer than the run: the --set that wrote the warmup, with both counts
  EXPECT_EQ(error_of(R"({"model": "m", "data": "d", "steps": 20, "lr_schedule": {"kind": "cosine"}})",
                     {rp::parse_set_option("lr_schedule.warmup_steps=30")}),
            "--set lr_schedule.warmup_steps=30: key 'lr_schedule.warmup_steps': expected at most steps (20), "
            "got 30");
  // the file's own errors still name the file
  const std::string own =
      error_of(R"({"model": "m", "data": "d", "steps": 0})", {rp::parse_set_option("seq_len=8")});
  EXPECT_NE(own.find(".json: key 'steps'"), std::string::npos) << own;
  EXPECT_THROW(rp::parse_set_option("seq_len"), std::invalid_argument);
  EXPECT_THROW(rp::parse_set_option("=3"), std::invalid_argument);
}

// A spec held in memory (the Python package's dict) names its settings the same way, and keeps
// them for errors the run finds later.
TEST(SpecSettings, ASpecInMemoryNamesItsSettings) {
  const nlohmann::json j = nlohmann::json::parse(kSpec);
  const rp::SpecSetting r0{"lora.r", "0", false, "overrides['lora.r']"};
  try {
    rp::spec_from_json(j, "spec", {r0});
    ADD_FAILURE() << "lora.r = 0 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "overrides['lora.r']: key 'lora.r': expected an integer in 1..65536, got 0");
  }
  const rp::SpecSetting r4{"lora.r", "4", false, "overrides['lora.r']"};
  const rp::TrainSpec s = rp::spec_from_json(j, "spec", {r4});
  EXPECT_EQ(s.lora->r, 4);
  ASSERT_EQ(s.settings.size(), 1u);
  EXPECT_EQ(s.settings[0].origin, "overrides['lora.r']");
  // the spec's own errors still name it
  nlohmann::json bad = j;
  bad["steps"] = 0;
  EXPECT_THROW(
      {
        try {
          rp::spec_from_json(bad, "spec", {r4});
        } catch (const std::invalid_argument& e) {
          EXPECT_EQ(std::string(e.what()).rfind("spec: key 'steps'", 0), 0u) << e.what();
          throw;
        }
      },
      std::invalid_argument);
  EXPECT_EQ(error_of_path(""), "the spec file name is empty (expected a JSON spec file)");
}

TEST(SpecSettings, InvalidJsonNamesLineColumnAndReason) {
  const std::string e = error_of("{\"model\": \"x\",\n \"data\": }", {});
  EXPECT_NE(e.find(".json:2:10: invalid JSON: syntax error while parsing value - unexpected '}'"),
            std::string::npos)
      << e;
}

// A number beyond a double (1e400) is refused by the JSON reader itself: one line naming the
// file, the line and the key, not nlohmann's own message.
TEST(SpecSettings, ANumberBeyondADoubleNamesTheFileLineAndKey) {
  const std::string e = error_of("{\"model\": \"m\", \"data\": \"d\",\n \"optimizer\": {\"lr\": 1e400}}", {});
  EXPECT_NE(e.find(".json:2: key 'optimizer.lr': expected a number within a double's range (about 1.8e308), "
                   "got 1e400"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // the same number given with --set says the same, naming the setting
  const std::string spec = "{\"model\": \"m\", \"data\": \"d\", \"optimizer\": {\"lr\": 0.001}}";
  EXPECT_EQ(error_of(spec, {rp::parse_set_option("optimizer.lr=-1e400")}),
            "--set optimizer.lr=-1e400: key 'optimizer.lr': expected a number within a double's range (about "
            "1.8e308), got -1e400");
  // words stay strings (checked by their key), "inf" among them
  EXPECT_EQ(error_of(spec, {rp::parse_set_option("optimizer.lr=inf")}).find("double's range"),
            std::string::npos);
  // and so does a value that is no JSON text, whatever a part of it holds: a string where the
  // key takes any value; what a duplicate key or a large number inside it would say, only in JSON
  for (const char* v : {"[1e400", "{\"a\": 1, \"a\": 2", "[1e400, {\"a\": 1, \"a\": 2}"}) {
    SCOPED_TRACE(v);
    nlohmann::json j = nlohmann::json::parse(spec);
    rp::apply_spec_settings(j, {rp::parse_set_option(std::string("comment=") + v)});
    EXPECT_EQ(j["comment"], v);
  }
}

// Two values of one key in a spec file: refused naming the line of the second and the key
// path, rather than the last one winning unnoticed; in a --set value likewise.
TEST(SpecSettings, AKeyGivenTwiceIsRefused) {
  const std::string e = error_of(
      "{\"model\": \"m\", \"data\": \"d\",\n \"frozen_tier\": {\"path\": \"/c/b.tier\", \"ring_gib\": 1,\n "
      "\"ring_gib\": 2}}",
      {});
  EXPECT_NE(e.find(".json:3: key 'frozen_tier.ring_gib' given twice"), std::string::npos) << e;
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("lora={\"r\": 4, \"r\": 8}")}),
            "--set lora={\"r\": 4, \"r\": 8}: key 'lora.r' given twice");
}

// An object given with --set names the key inside it, as the same object in the file does; a
// --set that makes an object names itself for a key the object then lacks; a long value is
// quoted shortened.
TEST(SpecSettings, ObjectSettingsNameTheirInnerKeys) {
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option(R"(frozen_tier={"path":"/c/b.tier","ring_gib":1e400})")}),
            R"(--set frozen_tier={"path":"/c/b.tier","ring_gib":1e400}: key 'frozen_tier.ring_gib': )"
            "expected a number within a double's range (about 1.8e308), got 1e400");
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("frozen_tier.ring_gib=nan")}),
            "--set frozen_tier.ring_gib=nan: key 'frozen_tier.path': expected the path of the tier's cache "
            "file (required when frozen_tier is set), got nothing");
  // the file's own frozen_tier without a path still names the file
  const std::string own = error_of(R"({"model": "m", "data": "d", "frozen_tier": {"ring_gib": 1}})",
                                   {rp::parse_set_option("frozen_tier.ring_gib=2")});
  EXPECT_NE(own.find(".json: key 'frozen_tier.path'"), std::string::npos) << own;
  const std::string long_value = "lora.target_modules=[\"" + std::string(600, 'q') + "\"]";
  const std::string e = error_of(kSpec, {rp::parse_set_option(long_value)});
  EXPECT_EQ(e.rfind("--set lora.target_modules=[\"qqq", 0), 0u) << e;
  EXPECT_NE(e.find("... (" + std::to_string(long_value.size()) + " bytes): key 'lora.target_modules'"),
            std::string::npos)
      << e;
  EXPECT_LT(e.size(), 400u) << e;
}

// A setting's value is raw command-line bytes: one that is not UTF-8 is quoted escaped in the
// key's error, where quoting it threw nlohmann's "[json.exception.type_error.316] invalid UTF-8
// byte", naming neither the setting nor the key.
TEST(SpecSettings, AValueThatIsNotUtf8IsQuotedEscaped) {
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("backend=x\xffy")}),
            "--set backend=x\\xffy: key 'backend': expected \"auto\", \"cpu\" or \"cuda\", got \"x\\xffy\"");
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("steps=x\xffy")}),
            "--set steps=x\\xffy: key 'steps': expected an integer, got \"x\\xffy\"");
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("optimizer.betas=\xfe")}),
            "--set optimizer.betas=\\xfe: key 'optimizer.betas': expected two numbers [beta1, beta2], got "
            "\"\\xfe\"");
}

// sample_prompt is text: a setting's raw bytes that are not UTF-8 are refused (they went into
// the log and the closing summary as they were).
TEST(SpecSettings, ASamplePromptMustBeUtf8) {
  EXPECT_EQ(
      error_of(kSpec, {rp::parse_set_option("sample_prompt=a\xff b")}),
      "--set sample_prompt=a\\xff b: key 'sample_prompt': expected UTF-8 text (byte 0xff at offset 1 is "
      "not), got \"a\\xff b\"");
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("sample_prompt=caf\xc3\xa9?")}), "no error");
}

// The model's and the data's names go into the checkpoints' JSON, which holds only UTF-8: a
// Latin-1 name from the command line is refused before the run (it trained, then failed its
// first save with nlohmann's "invalid UTF-8 byte").
TEST(SpecSettings, RecordedPathsMustBeUtf8) {
  const std::string why = "; checkpoints record the name in JSON, which holds only UTF-8): rename the file";
  EXPECT_EQ(error_of(kSpec, {{"data", "caf\xe9.jsonl", true, "--data caf\\xe9.jsonl"}}),
            "--data caf\\xe9.jsonl: key 'data': expected a UTF-8 file name (byte 0xe9 at offset 3 is not" +
                why + ", got \"caf\\xe9.jsonl\"");
  EXPECT_EQ(error_of(kSpec, {{"model", "m\xe9", true, "--model m\\xe9"}}),
            "--model m\\xe9: key 'model': expected a UTF-8 file name (byte 0xe9 at offset 1 is not" + why +
                ", got \"m\\xe9\"");
  // (a --set value that is not UTF-8 is no JSON: the list is one name)
  const std::string mix = error_of(kSpec, {rp::parse_set_option("data=[\"a.jsonl\", \"b\xe9.jsonl\"]")});
  EXPECT_NE(mix.find(": key 'data': expected a UTF-8 file name (byte 0xe9 at offset 14"), std::string::npos)
      << mix;
  EXPECT_EQ(error_of(kSpec, {{"data", "caf\xc3\xa9.jsonl", true, "--data caf\xc3\xa9.jsonl"}}), "no error");
}

// A list's entries are keys of their own ("data[1].weight"): a setting that gave the list is
// named, not the file that has no such list.
TEST(SpecSettings, ListEntrySettingsNameTheSetting) {
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option(R"(data=["a.jsonl", {"path": "b.jsonl", "weight": 0}])")}),
            R"(--set data=["a.jsonl", {"path": "b.jsonl", "weight": 0}]: key 'data[1].weight': )"
            "expected a number > 0, got 0.0");
  const std::string unknown =
      error_of(kSpec, {rp::parse_set_option(R"(eval_data=[{"path": "e.jsonl"}, {"pth": "f.jsonl"}])")});
  EXPECT_EQ(unknown.rfind(R"(--set eval_data=[{"path": "e.jsonl"}, {"pth": "f.jsonl"}]: unknown key )"
                          "'eval_data[1].pth'",
                          0),
            0u)
      << unknown;
  EXPECT_EQ(error_of(kSpec, {rp::parse_set_option("eval_data=[5]")}),
            "--set eval_data=[5]: key 'eval_data[0]': expected a file name or a {\"path\"} object, got 5");
  // the file's own list still names the file
  const std::string own = error_of(R"({"model": "m", "data": [{"path": "a", "weight": -1}]})",
                                   {rp::parse_set_option("seq_len=64")});
  EXPECT_NE(own.find(".json: "), std::string::npos) << own;
}

}  // namespace

// "frozen_tier": the disk tier's cache file and read-buffer budget (SessionOptions::frozen_tier),
// refused with one line naming the nested key.
TEST(SpecFrozenTier, ReadsThePathAndBudgetAndRefusesBadValues) {
  const auto with = [](const std::string& tier) {
    return std::string(
               R"({"model": "m.gguf", "data": "d.jsonl", "optimizer": {"lr": 0.001}, "frozen_tier": )") +
           tier + "}";
  };
  {
    const fs::path p = spec_file(
        with(R"({"path": "/nvme/base.cache", "ring_gib": 2.5, "resident_gib": 3, "spill_layers": 7})"));
    const rp::TrainSpec s = rp::load_spec(p.string(), {});
    fs::remove(p);
    ASSERT_TRUE(s.frozen_tier.has_value());
    EXPECT_EQ(s.frozen_tier->path, "/nvme/base.cache");
    EXPECT_EQ(s.frozen_tier->ring_gib, 2.5);
    EXPECT_EQ(s.frozen_tier->resident_gib, 3.0);
    EXPECT_EQ(s.frozen_tier->spill_layers, 7);
  }
  {
    const fs::path p = spec_file(with(R"({"path": "/nvme/base.cache", "host_budget_gib": 32})"));
    const rp::TrainSpec s = rp::load_spec(p.string(), {});
    fs::remove(p);
    ASSERT_TRUE(s.frozen_tier.has_value());
    EXPECT_EQ(s.frozen_tier->host_budget_gib, 32.0);
    EXPECT_EQ(s.frozen_tier->resident_gib, 0.0);
  }
  {
    const fs::path p = spec_file(kSpec);
    EXPECT_FALSE(rp::load_spec(p.string(), {}).frozen_tier.has_value());
    fs::remove(p);
  }
  const auto refused = [&](const std::string& tier, const std::string& key, const std::string& expected) {
    const std::string e = error_of(with(tier), {});
    EXPECT_NE(e.find("key '" + key + "': expected " + expected), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  refused(R"("/nvme/base.cache")", "frozen_tier", "an object");
  refused(R"({"ring_gib": 1})", "frozen_tier.path", "the path of the tier's cache file (required");
  refused(R"({"path": ""})", "frozen_tier.path", "a non-empty path");
  refused(R"({"path": "x", "ring_gib": -1})", "frozen_tier.ring_gib", "a number >= 0");
  refused(R"({"path": "x", "ring_gib": "1"})", "frozen_tier.ring_gib", "a number");
  refused(R"({"path": "x", "resident_gib": -2})", "frozen_tier.resident_gib", "a number >= 0");
  refused(R"({"path": "x", "host_budget_gib": -1})", "frozen_tier.host_budget_gib", "a number >= 0");
  refused(R"({"path": "x", "host_budget_gib": 8, "resident_gib": 2})", "frozen_tier.host_budget_gib",
          "no resident_gib beside it");
  refused(R"({"path": "x", "spill_layers": -1})", "frozen_tier.spill_layers", "an integer >= 0");
  refused(R"({"path": "x", "spill_layers": 1.5})", "frozen_tier.spill_layers", "an integer");
  // past the bound the line names the bound it broke, not only ">= 0"
  refused(R"({"path": "x", "spill_layers": 1048577})", "frozen_tier.spill_layers",
          "an integer >= 0 and <= 1048576");
  refused(R"({"path": "~/base.cache"})", "frozen_tier.path", "a path without a leading '~'");
  refused(R"({"path": "/tmp/a\u0000b.cache"})", "frozen_tier.path",
          "a path without NUL or line-break characters");
  refused(R"({"path": "/tmp/a\nb.cache"})", "frozen_tier.path",
          "a path without NUL or line-break characters");
  refused(R"({"path": "cache/"})", "frozen_tier.path", "the path of a cache file, not of a folder");
  refused(R"({"path": "/tmp"})", "frozen_tier.path", "the path of a cache file, not of a folder");
  const std::string e = error_of(with(R"({"path": "x", "ring": 2})"), {});
  EXPECT_NE(e.find("ring"), std::string::npos) << e;
}
