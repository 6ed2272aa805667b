// The template parser's expressions (data/jinja/parser.hpp), one function per precedence
// level from the conditional down to unary minus, then the primaries (literals, names,
// parentheses, lists, dicts), their postfixes (. [] and calls) and the filters and tests.
#include <charconv>

#include <fmt/format.h>

#include "data/jinja/parser.hpp"
#include "data/jinja/strings.hpp"

namespace rp::jinja {

ExprPtr Parser::tuple_or_expr() {
  const int line = cur().line;
  ExprPtr first = expression();
  if (!is_op(",")) return first;
  auto t = make(Expr::Kind::tuple, line);
  t->kids.push_back(std::move(first));
  while (is_op(",")) {
    ++i_;
    if (cur().type == Tok::block_end || cur().type == Tok::var_end) break;
    t->kids.push_back(expression());
  }
  return t;
}

ExprPtr Parser::expression() {
  ExprPtr e = or_expr();
  while (is_name("if")) {
    auto c = make(Expr::Kind::cond, cur().line);
    ++i_;
    c->kids.push_back(std::move(e));
    c->kids.push_back(or_expr());
    if (is_name("else")) {
      ++i_;
      c->kids.push_back(expression());
    } else {
      c->kids.push_back(nullptr);
    }
    e = std::move(c);
  }
  return e;
}

ExprPtr Parser::or_expr() {
  ExprPtr e = and_expr();
  while (is_name("or")) {
    auto o = make(Expr::Kind::or_, cur().line);
    ++i_;
    o->kids.push_back(std::move(e));
    o->kids.push_back(and_expr());
    e = std::move(o);
  }
  return e;
}

ExprPtr Parser::and_expr() {
  ExprPtr e = not_expr();
  while (is_name("and")) {
    auto o = make(Expr::Kind::and_, cur().line);
    ++i_;
    o->kids.push_back(std::move(e));
    o->kids.push_back(not_expr());
    e = std::move(o);
  }
  return e;
}

ExprPtr Parser::not_expr() {
  if (is_name("not")) {
    auto n = make(Expr::Kind::not_, cur().line);
    ++i_;
    n->kids.push_back(not_expr());
    return n;
  }
  return compare();
}

ExprPtr Parser::compare() {
  const int line = cur().line;
  ExprPtr e = math1();
  ExprPtr c;
  while (true) {
    std::string op;
    if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      op = cur().text;
      ++i_;
    } else if (is_name("in")) {
      op = "in";
      ++i_;
    } else if (is_name("not") && next_tok().type == Tok::name && next_tok().text == "in") {
      op = "notin";
      i_ += 2;
    } else {
      break;
    }
    if (!c) {
      c = make(Expr::Kind::compare, line);
      c->kids.push_back(std::move(e));
    }
    c->ops.push_back(op);
    c->kids.push_back(math1());
  }
  return c ? std::move(c) : std::move(e);
}

ExprPtr Parser::binary(ExprPtr l, const std::string& op, ExprPtr r, int line) {
  auto b = make(Expr::Kind::binary, line);
  b->name = op;
  b->kids.push_back(std::move(l));
  b->kids.push_back(std::move(r));
  return b;
}

ExprPtr Parser::math1() {
  ExprPtr e = concat();
  while (is_op("+") || is_op("-")) {
    const std::string op = cur().text;
    const int line = cur().line;
    ++i_;
    e = binary(std::move(e), op, concat(), line);
  }
  return e;
}

ExprPtr Parser::concat() {
  ExprPtr e = math2();
  while (is_op("~")) {
    const int line = cur().line;
    ++i_;
    e = binary(std::move(e), "~", math2(), line);
  }
  return e;
}

ExprPtr Parser::math2() {
  ExprPtr e = power();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const std::string op = cur().text;
    const int line = cur().line;
    ++i_;
    e = binary(std::move(e), op, power(), line);
  }
  return e;
}

ExprPtr Parser::power() {
  ExprPtr e = unary(true);
  while (is_op("**")) {
    const int line = cur().line;
    ++i_;
    e = binary(std::move(e), "**", unary(true), line);
  }
  return e;
}

ExprPtr Parser::unary(bool with_filter) {
  const int line = cur().line;
  if (++depth_ > kMaxDepth) fail(fmt::format("expressions and statements nested deeper than {}", kMaxDepth));
  struct Depth {
    int& d;
    ~Depth() { --d; }
  } guard{depth_};
  ExprPtr e;
  if (is_op("-")) {
    ++i_;
    e = make(Expr::Kind::neg, line);
    e->kids.push_back(unary(false));
  } else if (is_op("+")) {
    ++i_;
    e = unary(false);
  } else {
    e = postfix(primary());
  }
  return with_filter ? filters(std::move(e)) : std::move(e);
}

ExprPtr Parser::primary() {
  const Token& t = cur();
  auto lit = [&](Value v) {
    auto e = make(Expr::Kind::literal, t.line);
    e->value = std::move(v);
    ++i_;
    return e;
  };
  switch (t.type) {
    case Tok::string: {
      auto e = lit(Value(t.text));
      while (cur().type == Tok::string) e->value = Value(e->value.str() + t_[i_++].text);  // "a" "b"
      return e;
    }
    case Tok::integer: {  // past int64 (Python's ints have no bound): its float, as the nearest we hold
      int64_t v = 0;
      const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
      return r.ec == std::errc() ? lit(Value(v)) : lit(Value(py_float(t.text)));
    }
    case Tok::real: return lit(Value(py_float(t.text)));
    case Tok::name: {
      if (t.text == "true" || t.text == "True") return lit(Value(true));
      if (t.text == "false" || t.text == "False") return lit(Value(false));
      if (t.text == "none" || t.text == "None") return lit(Value(None{}));
      auto e = make(Expr::Kind::name, t.line);
      e->name = t.text;
      ++i_;
      return e;
    }
    case Tok::op:
      if (t.text == "(") return paren();
      if (t.text == "[") return list_lit();
      if (t.text == "{") return dict_lit();
      [[fallthrough]];
    default: fail(fmt::format("unexpected {}", describe(t)));
  }
}

ExprPtr Parser::paren() {
  const int line = cur().line;
  ++i_;
  if (is_op(")")) {
    ++i_;
    return make(Expr::Kind::tuple, line);
  }
  ExprPtr e = expression();
  if (is_op(")")) {
    ++i_;
    return e;
  }
  auto t = make(Expr::Kind::tuple, line);
  t->kids.push_back(std::move(e));
  while (is_op(",")) {
    ++i_;
    if (is_op(")")) break;
    t->kids.push_back(expression());
  }
  expect_op(")");
  return t;
}

ExprPtr Parser::list_lit() {
  auto l = make(Expr::Kind::list, cur().line);
  ++i_;
  while (!is_op("]")) {
    l->kids.push_back(expression());
    if (!is_op(",")) break;
    ++i_;
  }
  expect_op("]");
  return l;
}

ExprPtr Parser::dict_lit() {
  auto d = make(Expr::Kind::dict, cur().line);
  ++i_;
  while (!is_op("}")) {
    d->kids.push_back(expression());
    expect_op(":");
    d->kids.push_back(expression());
    if (!is_op(",")) break;
    ++i_;
  }
  expect_op("}");
  return d;
}

void Parser::call_args(Expr& e) {
  expect_op("(");
  while (!is_op(")")) {
    if (cur().type == Tok::name && next_tok().type == Tok::op && next_tok().text == "=") {
      std::string k = t_[i_].text;
      i_ += 2;
      e.kwargs.emplace_back(k, expression());
    } else {
      if (!e.kwargs.empty()) fail("positional argument after a keyword argument");
      e.kids.push_back(expression());
    }
    if (!is_op(",")) break;
    ++i_;
  }
  expect_op(")");
}

ExprPtr Parser::subscript(ExprPtr obj) {
  const int line = cur().line;
  ++i_;  // [
  ExprPtr parts[3];
  int colons = 0;
  while (!is_op("]")) {
    if (is_op(":")) {
      if (++colons > 2) fail("too many ':' in a slice");
      ++i_;
      continue;
    }
    if (parts[colons]) fail(fmt::format("expected ']' or ':', found {}", describe(cur())));
    parts[colons] = expression();
  }
  ++i_;
  if (colons == 0) {
    if (!parts[0]) fail("empty subscript");
    auto e = make(Expr::Kind::item, line);
    e->kids.push_back(std::move(obj));
    e->kids.push_back(std::move(parts[0]));
    return e;
  }
  auto e = make(Expr::Kind::slice, line);
  e->kids.push_back(std::move(obj));
  for (auto& p : parts) e->kids.push_back(std::move(p));
  return e;
}

ExprPtr Parser::postfix(ExprPtr e) {
  while (true) {
    if (is_op(".")) {
      const int line = cur().line;
      ++i_;
      auto a = make(Expr::Kind::attr, line);
      if (cur().type == Tok::integer) {  // x.0 = x[0]
        a->kind = Expr::Kind::item;
        a->kids.push_back(std::move(e));
        auto idx = make(Expr::Kind::literal, line);
        idx->value = Value(index_of_digits(t_[i_++].text));
        a->kids.push_back(std::move(idx));
      } else {
        a->name = expect_name();
        a->kids.push_back(std::move(e));
      }
      e = std::move(a);
    } else if (is_op("[")) {
      e = subscript(std::move(e));
    } else if (is_op("(")) {
      auto c = make(Expr::Kind::call, cur().line);
      c->kids.push_back(std::move(e));
      call_args(*c);
      e = std::move(c);
    } else {
      return e;
    }
  }
}

/// `| name[(args)]` applied to `subject` (null in a filter block).
ExprPtr Parser::filter_call(ExprPtr subject) {
  auto f = make(Expr::Kind::filter, cur().line);
  f->name = expect_name();
  while (is_op(".")) {  // dotted filter names are not used by chat templates; keep the name whole
    ++i_;
    f->name += "." + expect_name();
  }
  f->kids.push_back(std::move(subject));
  if (is_op("(")) call_args(*f);
  return f;
}

ExprPtr Parser::filters(ExprPtr e) {
  while (true) {
    if (is_op("|")) {
      ++i_;
      e = filter_call(std::move(e));
    } else if (is_name("is")) {
      auto t = make(Expr::Kind::test, cur().line);
      ++i_;
      if (is_name("not")) {
        t->negated = true;
        ++i_;
      }
      t->name = expect_name();
      t->kids.push_back(std::move(e));
      if (is_op("(")) {
        call_args(*t);
      } else if ((cur().type == Tok::name || cur().type == Tok::string || cur().type == Tok::integer ||
                  cur().type == Tok::real || is_op("[") || is_op("{")) &&
                 !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("in") &&
                 !is_name("not") && !is_name("is")) {
        t->kids.push_back(postfix(primary()));
      }
      e = std::move(t);
    } else {
      return e;
    }
  }
}

}  // namespace rp::jinja
