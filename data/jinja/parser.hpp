// Private: the template parser's class, shared by data/jinja/parser.cpp (the token cursor's
// use for statements: text, output, {% %} blocks, and parse()) and data/jinja/parser_expr.cpp
// (expressions). A recursive descent with Jinja's precedence: conditional < or < and < not <
// comparison < + - < ~ < * / // % < ** < unary - < postfix (. [] ()) and filters / tests.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "data/jinja/ast.hpp"

namespace rp::jinja {

class Parser {
 public:
  Parser(const std::vector<Token>& t, const std::string& name) : t_(t), name_(name) {}

  Body run() {
    std::string end;
    Body b = body({}, end);
    return b;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& next_tok() const { return t_[i_ + 1 < t_.size() ? i_ + 1 : i_]; }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().text == n; }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(fmt::format("{}:{}: {}", name_, cur().line, what));
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::eof: return "end of template";
      case Tok::block_end: return "end of statement '%}'";
      case Tok::var_end: return "end of expression '}}'";
      case Tok::text: return "text";
      case Tok::string: return "string";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(fmt::format("expected '{}', found {}", op, describe(cur())));
    ++i_;
  }
  std::string expect_name() {
    if (cur().type != Tok::name) fail(fmt::format("expected a name, found {}", describe(cur())));
    return t_[i_++].text;
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(fmt::format("expected {}, found {}", what, describe(cur())));
    ++i_;
  }
  void end_block() { expect(Tok::block_end, "'%}'"); }

  ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- statements (parser.cpp) ----
  Body body(const std::vector<std::string>& ends, std::string& end);
  std::unique_ptr<Node> statement();
  std::unique_ptr<Node> if_stmt(std::unique_ptr<Node> n);
  void targets(std::vector<std::string>& out);
  std::unique_ptr<Node> for_stmt(std::unique_ptr<Node> n);
  std::unique_ptr<Node> set_stmt(std::unique_ptr<Node> n);
  void params(std::vector<std::pair<std::string, ExprPtr>>& out);
  std::unique_ptr<Node> macro_stmt(std::unique_ptr<Node> n);
  std::unique_ptr<Node> call_stmt(std::unique_ptr<Node> n);
  std::unique_ptr<Node> filter_stmt(std::unique_ptr<Node> n);

  // ---- expressions (parser_expr.cpp) ----
  ExprPtr tuple_or_expr();
  ExprPtr expression();
  ExprPtr or_expr();
  ExprPtr and_expr();
  ExprPtr not_expr();
  ExprPtr compare();
  ExprPtr binary(ExprPtr l, const std::string& op, ExprPtr r, int line);
  ExprPtr math1();
  ExprPtr concat();
  ExprPtr math2();
  ExprPtr power();
  ExprPtr unary(bool with_filter);
  ExprPtr primary();
  ExprPtr paren();
  ExprPtr list_lit();
  ExprPtr dict_lit();
  void call_args(Expr& e);
  ExprPtr subscript(ExprPtr obj);
  ExprPtr postfix(ExprPtr e);
  ExprPtr filter_call(ExprPtr subject);
  ExprPtr filters(ExprPtr e);

  const std::vector<Token>& t_;
  const std::string& name_;
  size_t i_ = 0;
  int depth_ = 0;  ///< recursion depth, bounded so a hostile template cannot overflow the stack
  static constexpr int kMaxDepth = 256;
};

}  // namespace rp::jinja
