// The template parser's statements (data/jinja/parser.hpp): the body of text, output and
// {% %} blocks up to an end keyword, and each statement (if, for, set, macro, call, filter,
// break / continue, generation); and parse(). Expressions: data/jinja/parser_expr.cpp.
#include <fmt/format.h>

#include "data/jinja/parser.hpp"

namespace rp::jinja {

/// Parses nodes until a block tag whose keyword is in `ends` (consumed up to the keyword;
/// `end` receives it). At top level (`ends` empty) stops at eof.
Body Parser::body(const std::vector<std::string>& ends, std::string& end) {
  Body out;
  while (true) {
    const Token& t = cur();
    if (t.type == Tok::eof) {
      if (!ends.empty()) fail(fmt::format("missing '{{% {} %}}'", ends.front()));
      return out;
    }
    if (t.type == Tok::text) {
      auto n = std::make_unique<Node>();
      n->kind = Node::Kind::text;
      n->line = t.line;
      n->text = t.text;
      out.push_back(std::move(n));
      ++i_;
    } else if (t.type == Tok::var_begin) {
      ++i_;
      auto n = std::make_unique<Node>();
      n->kind = Node::Kind::output;
      n->line = t.line;
      n->expr = expression();
      expect(Tok::var_end, "'}}'");
      out.push_back(std::move(n));
    } else if (t.type == Tok::block_begin) {
      ++i_;
      const std::string kw = cur().type == Tok::name ? cur().text : "";
      for (const auto& e : ends)
        if (kw == e) {
          ++i_;
          end = kw;
          return out;
        }
      out.push_back(statement());
    } else {
      fail(fmt::format("unexpected {}", describe(t)));
    }
  }
}

std::unique_ptr<Node> Parser::statement() {
  if (++depth_ > kMaxDepth) fail(fmt::format("expressions and statements nested deeper than {}", kMaxDepth));
  struct Depth {
    int& d;
    ~Depth() { --d; }
  } guard{depth_};
  auto n = std::make_unique<Node>();
  n->line = cur().line;
  const std::string kw = expect_name();
  if (kw == "if") return if_stmt(std::move(n));
  if (kw == "for") return for_stmt(std::move(n));
  if (kw == "set") return set_stmt(std::move(n));
  if (kw == "macro") return macro_stmt(std::move(n));
  if (kw == "call") return call_stmt(std::move(n));
  if (kw == "filter") return filter_stmt(std::move(n));
  if (kw == "break" || kw == "continue") {
    n->kind = kw == "break" ? Node::Kind::break_ : Node::Kind::continue_;
    end_block();
    return n;
  }
  if (kw == "generation") {
    n->kind = Node::Kind::generation;
    end_block();
    std::string end;
    n->body = body({"endgeneration"}, end);
    end_block();
    return n;
  }
  --i_;
  fail(fmt::format("unsupported statement '{}'", kw));
}

std::unique_ptr<Node> Parser::if_stmt(std::unique_ptr<Node> n) {
  n->kind = Node::Kind::if_;
  ExprPtr c = expression();
  while (true) {
    end_block();
    std::string end;
    Body b = body({"elif", "else", "endif"}, end);
    n->branches.emplace_back(std::move(c), std::move(b));
    if (end == "endif") break;
    if (end == "else") {
      end_block();
      Body e = body({"endif"}, end);
      n->branches.emplace_back(nullptr, std::move(e));
      break;
    }
    c = expression();
  }
  end_block();
  return n;
}

void Parser::targets(std::vector<std::string>& out) {
  bool paren = is_op("(");
  if (paren) ++i_;
  do {
    std::string t = expect_name();
    if (is_op(".")) {
      ++i_;
      t += "." + expect_name();
    }
    out.push_back(t);
  } while (is_op(",") && (++i_, true));
  if (paren) expect_op(")");
}

std::unique_ptr<Node> Parser::for_stmt(std::unique_ptr<Node> n) {
  n->kind = Node::Kind::for_;
  targets(n->targets);
  if (!is_name("in")) fail(fmt::format("expected 'in', found {}", describe(cur())));
  ++i_;
  n->expr = or_expr();  // a conditional here would swallow the loop filter's `if`
  if (is_name("if")) {
    ++i_;
    n->cond = or_expr();
  }
  if (is_name("recursive")) fail("unsupported 'recursive' loop");
  end_block();
  std::string end;
  n->body = body({"else", "endfor"}, end);
  if (end == "else") {
    end_block();
    n->else_body = body({"endfor"}, end);
  }
  end_block();
  return n;
}

std::unique_ptr<Node> Parser::set_stmt(std::unique_ptr<Node> n) {
  targets(n->targets);
  if (is_op("=")) {
    ++i_;
    n->kind = Node::Kind::set;
    n->expr = tuple_or_expr();
    end_block();
    return n;
  }
  n->kind = Node::Kind::set_block;
  if (n->targets.size() != 1) fail("a block set takes one name");
  end_block();
  std::string end;
  n->body = body({"endset"}, end);
  end_block();
  return n;
}

void Parser::params(std::vector<std::pair<std::string, ExprPtr>>& out) {
  expect_op("(");
  while (!is_op(")")) {
    std::string p = expect_name();
    ExprPtr def;
    if (is_op("=")) {
      ++i_;
      def = expression();
    }
    out.emplace_back(p, std::move(def));
    if (!is_op(",")) break;
    ++i_;
  }
  expect_op(")");
}

std::unique_ptr<Node> Parser::macro_stmt(std::unique_ptr<Node> n) {
  n->kind = Node::Kind::macro;
  n->text = expect_name();
  params(n->params);
  end_block();
  std::string end;
  n->body = body({"endmacro"}, end);
  if (cur().type == Tok::name) ++i_;  // {% endmacro name %}
  end_block();
  return n;
}

std::unique_ptr<Node> Parser::call_stmt(std::unique_ptr<Node> n) {
  n->kind = Node::Kind::call_block;
  if (is_op("(")) params(n->params);
  n->expr = expression();
  if (n->expr->kind != Expr::Kind::call) fail("expected a macro call after 'call'");
  end_block();
  std::string end;
  n->body = body({"endcall"}, end);
  end_block();
  return n;
}

std::unique_ptr<Node> Parser::filter_stmt(std::unique_ptr<Node> n) {
  n->kind = Node::Kind::filter_block;
  ExprPtr chain;  // the filters apply to the body's output (a null subject)
  do {
    chain = filter_call(std::move(chain));
  } while (is_op("|") && (++i_, true));
  n->expr = std::move(chain);
  end_block();
  std::string end;
  n->body = body({"endfilter"}, end);
  end_block();
  return n;
}

Body parse(const std::vector<Token>& tokens, const std::string& name) { return Parser(tokens, name).run(); }

}  // namespace rp::jinja
