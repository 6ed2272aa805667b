// base/json_text: a JSON file's errors in one line naming the file and the place (line and
// column of a syntax error; line and key of a number beyond a double's range).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "base/json_fields.hpp"
#include "base/json_text.hpp"

namespace {

std::string error_of(const std::string& text) {
  try {
    rp::parse_json_text(text, "f.json");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

// Printing a value nested tens of thousands deep (an error message quoting it) overflowed the
// stack: nesting past 512 levels is refused as the file is read.
TEST(JsonText, NestingPast512LevelsIsOneLine) {
  auto nested = [](int n) {
    return "{\"a\": " + std::string(size_t(n), '[') + std::string(size_t(n), ']') + "}";
  };
  EXPECT_EQ(error_of(nested(500)), "no error");
  EXPECT_EQ(error_of(nested(100000)),
            "f.json: invalid JSON: objects and lists nested deeper than 512 levels");
}

// /dev/zero never ends: a device is refused before it is read.
TEST(JsonText, ADeviceIsRefusedBeforeItIsRead) {
  for (const char* p : {"/dev/zero", "/dev/null"}) {
    try {
      rp::read_json_file(p);
      ADD_FAILURE() << p << " was read";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), std::string(p) + ": is a device, expected a JSON file");
    }
  }
}

TEST(JsonText, ASyntaxErrorNamesLineAndColumn) {
  EXPECT_EQ(error_of("{\"a\": 1,\n \"b\": }"),
            "f.json:2:7: invalid JSON: syntax error while parsing value - unexpected '}'; expected '[', "
            "'{', or a literal");
  EXPECT_EQ(rp::parse_json_text("{\"a\": [1, 2.5]}", "f.json")["a"][1], 2.5);
}

// nlohmann's lexer ends the input at a NUL byte: "{...}\0garbage" parsed as its first part, so a
// file cut or padded with NULs read as whole. A raw NUL is refused wherever it stands.
TEST(JsonText, ANulByteIsRefusedNotTakenForTheEnd) {
  const std::string nul(1, '\0');
  const std::string why = "invalid JSON: a NUL byte (JSON text has none; in a string it is written \\u0000)";
  EXPECT_EQ(error_of("{\"a\": 1}" + nul + "{\"b\": 2}"), "f.json:1:9: " + why);
  EXPECT_EQ(error_of("{\"a\": 1,\n \"b\": \"x" + nul + "\"}"), "f.json:2:9: " + why);
  EXPECT_EQ(error_of("{\"a\": 1}" + nul), "f.json:1:9: " + why);
  // written as an escape it is a character like any other
  EXPECT_EQ(rp::parse_json_text("{\"a\": \"x\\u0000y\"}", "f.json")["a"].get<std::string>().size(), 3u);
  // a one-line value (a --set VALUE) with a NUL is no JSON: plain text
  EXPECT_FALSE(rp::parse_json_value("1" + nul + "2", "--set x", {.lines = false}).has_value());
}

// The parse keeps every value and its key lines however many objects a list holds (a trace's
// events): the same document as nlohmann's own parse.
TEST(JsonText, AListOfManyObjectsParsesAsTheLibraryDoes) {
  std::string text = "{\"traceEvents\": [";
  for (int i = 0; i < 2000; ++i)
    text += (i ? ",\n" : "\n") + std::string("{\"ph\": \"X\", \"tid\": ") + std::to_string(i % 7) +
            ", \"args\": {\"n\": [" + std::to_string(i) + ", null, true, 1.5]}}";
  text += "]}";
  rp::JsonKeyLines lines;
  const nlohmann::json j = rp::parse_json_text(text, "t.json", {.unique_keys = true, .key_lines = &lines});
  EXPECT_EQ(j, nlohmann::json::parse(text));
  EXPECT_EQ(lines.at("/traceEvents/0/ph"), 2u);
  EXPECT_EQ(lines.at("/traceEvents/1999/args"), 2001u);
  EXPECT_EQ(lines.size(), 2000u * 4 + 1);
}

TEST(JsonText, ANumberBeyondADoubleNamesLineAndKeyPath) {
  EXPECT_EQ(error_of("{\"a\": 1,\n \"b\": {\"c\": 1e400}}"),
            "f.json:2: key 'b.c': expected a number within a double's range (about 1.8e308), got 1e400");
  // inside a list: the key holding the list; the same digits earlier in a string are not it
  EXPECT_EQ(error_of("{\"name\": \"-1e999\",\n\n \"f\": [1, -1e999]}"),
            "f.json:3: key 'f[1]': expected a number within a double's range (about 1.8e308), got -1e999");
  // the same digits inside a string after a '[' are text, not the number
  EXPECT_EQ(
      error_of("{\"comment\": \"see [1e400\",\n \"x\": 1,\n\n \"optimizer\": {\"lr\": 1e400}}"),
      "f.json:4: key 'optimizer.lr': expected a number within a double's range (about 1.8e308), got 1e400");
  // not under a key
  EXPECT_EQ(error_of("1e400"),
            "f.json:1: expected a number within a double's range (about 1.8e308), got 1e400");
}

// A key given twice in one object (the last one would win silently) is refused where asked,
// naming its key path and its line; the same key in other objects, or in a string, is no repeat.
TEST(JsonText, AKeyGivenTwiceNamesItsLineAndKeyPath) {
  rp::JsonTextOptions unique;
  unique.unique_keys = true;
  const std::string text =
      "{\"a\": \"\\\"c\\\": 1\",\n \"b\": {\"c\": 1,\n\n  \"c\": 2},\n \"l\": [{\"c\": 1}, {\"c\": 2}]}";
  try {
    rp::parse_json_text(text, "f.json", unique);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "f.json:4: key 'b.c' given twice");
  }
  EXPECT_EQ(rp::parse_json_text(text, "f.json")["b"]["c"], 2) << "without the option the last one wins";
  EXPECT_EQ(rp::parse_json_text("{\"b\": {\"c\": 1}, \"c\": [{\"c\": 1}, {\"c\": 2}]}", "f.json",
                                unique)["c"][1]["c"],
            2);
}

// A value that may be plain text (a --set VALUE): nullopt when it is no JSON; a number beyond a
// double's range or a repeated key names the key path under the prefix, and no line.
TEST(JsonText, AValueNamesItsKeyPathUnderThePrefix) {
  rp::JsonTextOptions opt;
  opt.unique_keys = true;
  opt.key_prefix = "tier";
  opt.lines = false;
  EXPECT_FALSE(rp::parse_json_value("chatml", "--set x=chatml", opt).has_value());
  EXPECT_EQ(*rp::parse_json_value("{\"a\": [1]}", "--set", opt), nlohmann::json::parse("{\"a\": [1]}"));
  const auto error = [&](const std::string& text) {
    try {
      rp::parse_json_value(text, "--set tier=...", opt);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("{\"p\": \"x\",\n \"ring\": 1e400}"),
            "--set tier=...: key 'tier.ring': expected a number within a double's range (about 1.8e308), got "
            "1e400");
  EXPECT_EQ(
      error("1e400"),
      "--set tier=...: key 'tier': expected a number within a double's range (about 1.8e308), got 1e400");
  EXPECT_EQ(error("{\"r\": 1,\n \"r\": 2}"), "--set tier=...: key 'tier.r' given twice");
}

// With key_lines a text that parses says where each key stands, by its JSON pointer: keys in
// lists of objects and lists of lists, a key with '/' or '~' escaped; a reader of its fields
// then names a key's line in its errors.
TEST(JsonText, KeyLinesNameEveryKeyByItsPointer) {
  rp::JsonKeyLines lines;
  rp::JsonTextOptions opt;
  opt.key_lines = &lines;
  const std::string text =
      "{\"a\": 1,\n \"l\": [[7, {\"x\": \"s: t\"}],\n  {\"y\": {\"z\": [1, 2]}},\n  3,\n  {\"a/b~\": 0}]}";
  const nlohmann::json j = rp::parse_json_text(text, "f.json", opt);
  const rp::JsonKeyLines want = {{"/a", 1},     {"/l", 2},       {"/l/0/1/x", 2},
                                 {"/l/1/y", 3}, {"/l/1/y/z", 3}, {"/l/3/a~1b~0", 5}};
  EXPECT_EQ(lines, want);
  rp::JsonFields f(j["l"][1]["y"], "f.json: the y");
  f.with_lines(&lines, "f.json", "/l/1/y");
  try {
    f.string("z");
    ADD_FAILURE() << "read";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "f.json:3: the y: key 'z': expected a string, got [1,2]");
  }
  try {
    f.allow_only({"w"});
    ADD_FAILURE() << "read";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "f.json:3: the y: unknown key 'z' (known keys: w)");
  }
  EXPECT_EQ(f.where_of("absent"), "f.json: the y");
}

}  // namespace
