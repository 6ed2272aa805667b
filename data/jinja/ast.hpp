// The syntax tree of a parsed template, and the lexer's tokens. Internal to data/jinja.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja/value.hpp"

namespace rp::jinja {

enum class Tok { text, var_begin, var_end, block_begin, block_end, name, string, integer, real, op, eof };

struct Token {
  Tok type;
  std::string text;  ///< text, name, operator, or the string literal's decoded value
  int line;
};

struct LexOptions {
  bool trim_blocks = true;    ///< drop the first newline after a block or comment tag
  bool lstrip_blocks = true;  ///< drop spaces and tabs before a block or comment tag that starts a line
};

/// Splits a template into tokens, applying whitespace control ({%- -%}, trim_blocks,
/// lstrip_blocks) and dropping comments. Throws std::runtime_error "<name>:<line>: ..." for an
/// unclosed tag, comment or string.
std::vector<Token> lex(const std::string& source, const std::string& name, const LexOptions& options);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,  ///< value
    name,     ///< name
    list,     ///< kids = elements
    tuple,    ///< kids = elements
    dict,     ///< kids = key, value, key, value, ...
    attr,     ///< kids[0].name
    item,     ///< kids[0][kids[1]]
    slice,    ///< kids[0][kids[1]:kids[2]:kids[3]] (null kids: omitted)
    call,     ///< kids[0](kids[1..], kwargs)
    filter,   ///< kids[0] | name(kids[1..], kwargs); kids[0] null inside a filter block
    test,     ///< kids[0] is [not] name(kids[1..], kwargs)
    not_,     ///< not kids[0]
    neg,      ///< -kids[0]
    binary,   ///< kids[0] name kids[1]; name in + - * / // % ** ~
    compare,  ///< kids[0] ops[0] kids[1] ops[1] kids[2] ...; ops in == != < <= > >= in notin
    and_,
    or_,
    cond,  ///< kids[0] if kids[1] else kids[2] (kids[2] null: undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  std::vector<ExprPtr> kids;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    text,          ///< text
    output,        ///< {{ expr }}
    if_,           ///< branches (a null condition is the else branch)
    for_,          ///< for targets in expr [if cond] body [else else_body]
    set,           ///< set targets = expr; a target "ns.attr" assigns a namespace attribute
    set_block,     ///< set targets[0] %} body {% endset
    macro,         ///< macro name(params) body
    call_block,    ///< call[(params)] expr body: body is the `caller` macro
    filter_block,  ///< filter expr(kids[0] null) body
    break_,
    continue_,
    generation,  ///< transformers' {% generation %} body {% endgeneration %}: renders its body
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr, cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::vector<std::pair<std::string, ExprPtr>> params;
  Body body, else_body;
  bool recursive = false;
};

/// Parses tokens into a body. Throws std::runtime_error "<name>:<line>: ..." naming the
/// unexpected token or the unsupported statement.
Body parse(const std::vector<Token>& tokens, const std::string& name);

}  // namespace rp::jinja
