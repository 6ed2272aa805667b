// Recursive-descent parser with Jinja's precedence (one class over ~650 lines: the grammar,
// statements and expressions, reads best in one place): conditional < or < and < not <
// comparison < + - < ~ < * / // % < ** < unary - < postfix (. [] ()) and filters / tests.
#include <stdexcept>

#include <fmt/format.h>

#include "data/jinja/ast.hpp"

namespace rp::jinja {

namespace {

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

  // ---- statements ----

  /// Parses nodes until a block tag whose keyword is in `ends` (consumed up to the keyword;
  /// `end` receives it). At top level (`ends` empty) stops at eof.
  Body body(const std::vector<std::string>& ends, std::string& end) {
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

  std::unique_ptr<Node> statement() {
    if (++depth_ > kMaxDepth)
      fail(fmt::format("expressions and statements nested deeper than {}", kMaxDepth));
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

  std::unique_ptr<Node> if_stmt(std::unique_ptr<Node> n) {
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

  void targets(std::vector<std::string>& out) {
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

  std::unique_ptr<Node> for_stmt(std::unique_ptr<Node> n) {
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

  std::unique_ptr<Node> set_stmt(std::unique_ptr<Node> n) {
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

  void params(std::vector<std::pair<std::string, ExprPtr>>& out) {
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

  std::unique_ptr<Node> macro_stmt(std::unique_ptr<Node> n) {
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

  std::unique_ptr<Node> call_stmt(std::unique_ptr<Node> n) {
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

  std::unique_ptr<Node> filter_stmt(std::unique_ptr<Node> n) {
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

  // ---- expressions ----

  ExprPtr tuple_or_expr() {
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

  ExprPtr expression() {
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

  ExprPtr or_expr() {
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

  ExprPtr and_expr() {
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

  ExprPtr not_expr() {
    if (is_name("not")) {
      auto n = make(Expr::Kind::not_, cur().line);
      ++i_;
      n->kids.push_back(not_expr());
      return n;
    }
    return compare();
  }

  ExprPtr compare() {
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

  ExprPtr binary(ExprPtr l, const std::string& op, ExprPtr r, int line) {
    auto b = make(Expr::Kind::binary, line);
    b->name = op;
    b->kids.push_back(std::move(l));
    b->kids.push_back(std::move(r));
    return b;
  }

  ExprPtr math1() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      ++i_;
      e = binary(std::move(e), op, concat(), line);
    }
    return e;
  }

  ExprPtr concat() {
    ExprPtr e = math2();
    while (is_op("~")) {
      const int line = cur().line;
      ++i_;
      e = binary(std::move(e), "~", math2(), line);
    }
    return e;
  }

  ExprPtr math2() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      ++i_;
      e = binary(std::move(e), op, power(), line);
    }
    return e;
  }

  ExprPtr power() {
    ExprPtr e = unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      ++i_;
      e = binary(std::move(e), "**", unary(true), line);
    }
    return e;
  }

  ExprPtr unary(bool with_filter) {
    const int line = cur().line;
    if (++depth_ > kMaxDepth)
      fail(fmt::format("expressions and statements nested deeper than {}", kMaxDepth));
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

  ExprPtr primary() {
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
      case Tok::integer: try { return lit(Value(int64_t(std::stoll(t.text))));
        } catch (const std::out_of_range&) {
          return lit(Value(std::stod(t.text)));
        }
      case Tok::real: return lit(Value(std::stod(t.text)));
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

  ExprPtr paren() {
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

  ExprPtr list_lit() {
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

  ExprPtr dict_lit() {
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

  void call_args(Expr& e) {
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

  ExprPtr subscript(ExprPtr obj) {
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

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const int line = cur().line;
        ++i_;
        auto a = make(Expr::Kind::attr, line);
        if (cur().type == Tok::integer) {  // x.0 = x[0]
          a->kind = Expr::Kind::item;
          a->kids.push_back(std::move(e));
          auto idx = make(Expr::Kind::literal, line);
          idx->value = Value(int64_t(std::stoll(t_[i_++].text)));
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
  ExprPtr filter_call(ExprPtr subject) {
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

  ExprPtr filters(ExprPtr e) {
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
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("in") && !is_name("not") && !is_name("is")) {
          t->kids.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  size_t i_ = 0;
  int depth_ = 0;  ///< recursion depth, bounded so a hostile template cannot overflow the stack
  static constexpr int kMaxDepth = 256;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name) { return Parser(tokens, name).run(); }

}  // namespace rp::jinja
