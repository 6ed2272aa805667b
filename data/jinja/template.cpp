// The tree-walking renderer: statements, expressions, scopes, macros, limits.
#include "data/jinja/template.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "data/jinja/ast.hpp"
#include "data/jinja/builtins.hpp"

namespace rp::jinja {

namespace {

/// Thrown by raise_exception(), turned into RaisedException where the line is known.
struct RaiseSignal {
  std::string message;
};

class Renderer {
 public:
  Renderer(const std::string& name, const Dict& vars, const RenderOptions& o)
      : name_(name), vars_(vars), o_(o) {
    frames_.emplace_back();
    add_globals();
  }

  std::string run(const Body& body) {
    std::string out;
    out_ = &out;
    exec(body);
    return out;
  }

 private:
  enum class Flow { normal, break_, continue_ };

  std::string where(int line) const { return fmt::format("{}:{}: ", name_, line); }
  [[noreturn]] void fail(int line, const std::string& what) const { throw TemplateError(where(line) + what); }

  void step(int line) {
    if (++steps_ > o_.limits.max_steps)
      fail(line, fmt::format("rendering took more than {} steps (a runaway loop?)", o_.limits.max_steps));
  }

  void emit(const std::string& s, int line) {
    // every open capture (a macro's body, a block set) holds its text until it returns
    if (outer_ + out_->size() + s.size() > o_.limits.max_output_bytes)
      fail(line, fmt::format("output over {} bytes", o_.limits.max_output_bytes));
    *out_ += s;
  }

  /// Adds what `v` holds (a string's bytes, a list's or dict's items) to the bytes the render
  /// built; over max_built_bytes it fails naming `construct`.
  void charge(const Value& v, int line, const char* construct) {
    uint64_t bytes = 0;
    if (v.is_string()) bytes = v.str().size();
    else if (v.is_list()) bytes = v.list().size() * sizeof(Value);
    else if (v.is_dict()) bytes = v.dict().items.size() * sizeof(std::pair<std::string, Value>);
    built_ += bytes;
    if (built_ > o_.limits.max_built_bytes)
      fail(line,
           fmt::format("{}: the values this template built add up to more than {} MiB (a runaway template?)",
                       construct, o_.limits.max_built_bytes >> 20));
  }

  // ---- globals ----

  Value builtin(const std::string& name, std::function<Value(const Args&)> fn) {
    auto c = std::make_shared<Callable>();
    c->name = name;
    c->fn = std::move(fn);
    return Value(std::shared_ptr<const Callable>(std::move(c)));
  }

  void add_globals() {
    globals_.set("raise_exception", builtin("raise_exception", [](const Args& a) -> Value {
                   throw RaiseSignal{a.pos.empty() ? std::string() : to_str(a.pos[0])};
                 }));
    globals_.set("strftime_now", builtin("strftime_now", [this](const Args& a) {
                   if (a.pos.empty() || !a.pos[0].is_string())
                     throw std::invalid_argument("strftime_now(format) needs a string");
                   std::tm tm{};
                   if (o_.now) tm = *o_.now;
                   else {
                     const std::time_t t = std::time(nullptr);
                     localtime_r(&t, &tm);
                   }
                   char buf[512];
                   const size_t n = std::strftime(buf, sizeof buf, a.pos[0].str().c_str(), &tm);
                   return Value(std::string(buf, n));
                 }));
    globals_.set("namespace", builtin("namespace", [](const Args& a) {
                   auto ns = std::make_shared<Namespace>();
                   for (const auto& p : a.pos)
                     if (p.is_dict())
                       for (const auto& [k, v] : p.dict().items) ns->attrs.set(k, v);
                   for (const auto& [k, v] : a.kw) ns->attrs.set(k, v);
                   return Value(std::move(ns));
                 }));
    globals_.set("dict", builtin("dict", [](const Args& a) {
                   Dict d;
                   for (const auto& p : a.pos)
                     if (p.is_dict()) d = p.dict();
                   for (const auto& [k, v] : a.kw) d.set(k, v);
                   return Value(std::move(d));
                 }));
    globals_.set("range", builtin("range", [](const Args& a) {
                   int64_t lo = 0, hi = 0, st = 1;
                   auto num = [](const Value& v) {
                     if (!v.is_int()) throw std::invalid_argument("range() takes integers");
                     return v.as_int();
                   };
                   if (a.pos.size() == 1) hi = num(a.pos[0]);
                   else if (a.pos.size() >= 2) {
                     lo = num(a.pos[0]);
                     hi = num(a.pos[1]);
                     if (a.pos.size() > 2) st = num(a.pos[2]);
                   } else {
                     throw std::invalid_argument("range() needs 1 to 3 arguments");
                   }
                   if (st == 0) throw std::invalid_argument("range() step must not be zero");
                   // Python's len(range(lo, hi, st)), exact (a double rounds spans past 2^53)
                   const __int128 span = st > 0 ? __int128(hi) - lo : __int128(lo) - hi,
                                  step = st > 0 ? __int128(st) : -__int128(st);
                   const __int128 n = span > 0 ? (span + step - 1) / step : 0;
                   if (n > __int128(kMaxBuiltValue / sizeof(Value)))
                     throw std::invalid_argument("range() too long");
                   List out;
                   // the count, not i += st, ends the loop: i + st may pass int64 after the last item
                   for (int64_t k = 0, i = lo; k < int64_t(n); ++k, i = int64_t(uint64_t(i) + uint64_t(st)))
                     out.push_back(Value(i));
                   return Value(std::move(out));
                 }));
  }

  // ---- names ----

  Value lookup(const std::string& n) const {
    for (auto f = frames_.rbegin(); f != frames_.rend(); ++f)
      if (const Value* v = f->find(n)) return *v;
    if (const Value* v = vars_.find(n)) return *v;
    if (const Value* v = globals_.find(n)) return *v;
    return Value(Undefined{n});
  }

  void assign(const std::string& target, Value v, int line) {
    const size_t dot = target.find('.');
    if (dot == std::string::npos) {
      frames_.back().set(target, std::move(v));
      return;
    }
    const Value obj = lookup(target.substr(0, dot));
    if (!obj.is_namespace())
      fail(line, fmt::format("cannot assign attribute '{}' on a {} (only on a namespace())",
                             target.substr(dot + 1), type_name(obj)));
    obj.ns().attrs.set(target.substr(dot + 1), std::move(v));
  }

  void assign_all(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      assign(targets[0], v, line);
      return;
    }
    const std::vector<Value> parts = iterate(v);
    if (parts.size() != targets.size())
      fail(line, fmt::format("cannot unpack {} values into {} names", parts.size(), targets.size()));
    for (size_t i = 0; i < parts.size(); ++i) assign(targets[i], parts[i], line);
  }

  // ---- statements ----

  Flow exec(const Body& body) {
    for (const auto& n : body) {
      const Flow f = exec_node(*n);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  Flow exec_node(const Node& n) {
    step(n.line);
    try {
      return exec_inner(n);
    } catch (const std::logic_error& e) {
      fail(n.line, e.what());
    }
  }

  std::string capture(const Body& body, int line) {
    std::string buf;
    std::string* saved = out_;
    const size_t saved_outer = outer_;
    outer_ += saved->size();
    out_ = &buf;
    try {
      exec(body);
    } catch (...) {
      out_ = saved;
      outer_ = saved_outer;
      throw;
    }
    out_ = saved;
    outer_ = saved_outer;
    built_ += buf.size();
    if (built_ > o_.limits.max_built_bytes)
      fail(line, fmt::format("a captured block: the values this template built add up to more than {} MiB (a "
                             "runaway template?)",
                             o_.limits.max_built_bytes >> 20));
    return buf;
  }

  Flow exec_inner(const Node& n) {
    switch (n.kind) {
      case Node::Kind::text: emit(n.text, n.line); return Flow::normal;
      case Node::Kind::output: emit(to_str(eval(*n.expr)), n.line); return Flow::normal;
      case Node::Kind::if_:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond))) return exec(body);
        return Flow::normal;
      case Node::Kind::for_: return exec_for(n);
      case Node::Kind::set: assign_all(n.targets, eval(*n.expr), n.line); return Flow::normal;
      case Node::Kind::set_block:
        assign(n.targets[0], Value(capture(n.body, n.line)), n.line);
        return Flow::normal;
      case Node::Kind::macro: frames_.back().set(n.text, make_macro(n, n.text)); return Flow::normal;
      case Node::Kind::call_block: {
        const Expr& call = *n.expr;
        Value fn = eval(*call.kids[0]);
        Args args = eval_args(call);
        args.kw.emplace_back("caller", make_macro(n, "caller"));
        emit(to_str(invoke(fn, args, n.line)), n.line);
        return Flow::normal;
      }
      case Node::Kind::filter_block: {
        Value v(capture(n.body, n.line));
        emit(to_str(apply_filter_chain(*n.expr, v)), n.line);
        return Flow::normal;
      }
      case Node::Kind::break_: return Flow::break_;
      case Node::Kind::continue_: return Flow::continue_;
      case Node::Kind::generation: return exec(n.body);
    }
    return Flow::normal;
  }

  Value apply_filter_chain(const Expr& f, const Value& subject) {
    Value in = f.kids[0] ? apply_filter_chain(*f.kids[0], subject) : subject;
    Args args;
    for (size_t i = 1; i < f.kids.size(); ++i) args.pos.push_back(eval(*f.kids[i]));
    for (const auto& [k, e] : f.kwargs) args.kw.emplace_back(k, eval(*e));
    return apply_filter(f.name, in, args);
  }

  Value loop_object(const std::vector<Value>& items, size_t i) {
    const int64_t n = int64_t(items.size()), k = int64_t(i);
    Dict loop;
    loop.set("index", Value(k + 1));
    loop.set("index0", Value(k));
    loop.set("revindex", Value(n - k));
    loop.set("revindex0", Value(n - k - 1));
    loop.set("first", Value(k == 0));
    loop.set("last", Value(k + 1 == n));
    loop.set("length", Value(n));
    loop.set("depth", Value(int64_t(1)));
    loop.set("depth0", Value(int64_t(0)));
    loop.set("previtem", i > 0 ? items[i - 1] : Value(Undefined{"loop.previtem"}));
    loop.set("nextitem", i + 1 < items.size() ? items[i + 1] : Value(Undefined{"loop.nextitem"}));
    loop.set("cycle", builtin("loop.cycle", [k](const Args& a) {
               if (a.pos.empty()) throw std::invalid_argument("loop.cycle() needs at least one value");
               return a.pos[size_t(k % int64_t(a.pos.size()))];
             }));
    return Value(std::move(loop));
  }

  Flow exec_for(const Node& n) {
    std::vector<Value> items = iterate(eval(*n.expr));
    frames_.emplace_back();
    struct Pop {
      std::vector<Dict>& f;
      ~Pop() { f.pop_back(); }
    } pop{frames_};
    if (n.cond) {  // `for x in xs if cond`: the loop sees only the items that pass
      std::vector<Value> kept;
      for (const auto& it : items) {
        step(n.line);
        assign_all(n.targets, it, n.line);
        if (truthy(eval(*n.cond))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    for (size_t i = 0; i < items.size(); ++i) {
      step(n.line);
      frames_.back() = Dict{};  // as Jinja: a `set` in the body does not outlive its iteration
      frames_.back().set("loop", loop_object(items, i));
      assign_all(n.targets, items[i], n.line);
      if (exec(n.body) == Flow::break_) break;
    }
    if (items.empty()) exec(n.else_body);
    return Flow::normal;
  }

  Value make_macro(const Node& n, const std::string& name) {
    const Node* node = &n;
    return builtin(name, [this, node](const Args& a) { return call_macro(*node, a); });
  }

  Value call_macro(const Node& m, const Args& a) {
    if (++depth_ > o_.limits.max_call_depth) {
      --depth_;
      throw std::invalid_argument(fmt::format("macro calls nested deeper than {}", o_.limits.max_call_depth));
    }
    struct Depth {
      int& d;
      ~Depth() { --d; }
    } guard{depth_};
    if (a.pos.size() > m.params.size())
      throw std::invalid_argument(
          fmt::format("macro '{}' takes {} arguments, got {}", m.text, m.params.size(), a.pos.size()));
    std::vector<Dict> saved = std::move(frames_);
    frames_ = {saved.front(), Dict{}};
    struct Restore {
      std::vector<Dict>& f;
      std::vector<Dict>& s;
      ~Restore() { f = std::move(s); }
    } restore{frames_, saved};
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& [pname, dflt] = m.params[i];
      const Value* kw = a.kwarg(pname);
      if (i < a.pos.size()) frames_.back().set(pname, a.pos[i]);
      else if (kw) frames_.back().set(pname, *kw);
      else frames_.back().set(pname, dflt ? eval(*dflt) : Value(Undefined{pname}));
    }
    for (const auto& [k, v] : a.kw) {
      const bool known =
          std::any_of(m.params.begin(), m.params.end(), [&](const auto& p) { return p.first == k; });
      if (known) continue;
      if (k != "caller")
        throw std::invalid_argument(fmt::format("macro '{}' has no argument '{}'", m.text, k));
      frames_.back().set(k, v);
    }
    return Value(capture(m.body, m.line));
  }

  Value invoke(const Value& fn, const Args& args, int line) {
    step(line);
    if (fn.is_undefined())
      throw std::invalid_argument(
          fmt::format("'{}' is undefined (called as a function)", fn.undefined().what));
    if (!fn.is_callable())
      throw std::invalid_argument(fmt::format("'{}' object is not callable", type_name(fn)));
    return fn.callable().fn(args);
  }

  // ---- expressions ----

  Args eval_args(const Expr& e) {
    Args a;
    for (size_t i = 1; i < e.kids.size(); ++i) a.pos.push_back(eval(*e.kids[i]));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  Value eval(const Expr& e) {
    try {
      Value v = eval_inner(e);
      using K = Expr::Kind;
      switch (e.kind) {  // what builds a new value (names, attributes and items read existing ones)
        case K::list:
        case K::tuple:
        case K::dict: charge(v, e.line, "a literal"); break;
        case K::binary: charge(v, e.line, fmt::format("operator '{}'", e.name).c_str()); break;
        case K::filter: charge(v, e.line, fmt::format("filter '{}'", e.name).c_str()); break;
        case K::call: charge(v, e.line, "a call"); break;
        case K::slice: charge(v, e.line, "a slice"); break;
        default: break;
      }
      return v;
    } catch (const std::logic_error& x) {
      fail(e.line, x.what());
    } catch (const std::bad_variant_access&) {
      fail(e.line, "value of the wrong type");
    } catch (const RaiseSignal& r) {
      throw RaisedException(where(e.line), r.message);
    }
  }

  Value compare(const Expr& e) {
    Value left = eval(*e.kids[0]);
    for (size_t i = 0; i < e.ops.size(); ++i) {
      Value right = eval(*e.kids[i + 1]);
      const std::string& op = e.ops[i];
      bool r;
      if (op == "==") r = equal(left, right);
      else if (op == "!=") r = !equal(left, right);
      else if (op == "<") r = less(left, right);
      else if (op == "<=") r = !less(right, left);
      else if (op == ">") r = less(right, left);
      else if (op == ">=") r = !less(left, right);
      else if (op == "in") r = contains(right, left);
      else r = !contains(right, left);
      if (!r) return Value(false);
      left = std::move(right);
    }
    return Value(true);
  }

  Value eval_inner(const Expr& e) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::literal: return e.value;
      case K::name: return lookup(e.name);
      case K::list:
      case K::tuple: {
        List l;
        for (const auto& k : e.kids) l.push_back(eval(*k));
        return e.kind == K::tuple ? make_tuple(std::move(l)) : Value(std::move(l));
      }
      case K::dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
          Value k = eval(*e.kids[i]);
          if (!k.is_string()) throw std::invalid_argument("dict keys must be strings");
          d.set(k.str(), eval(*e.kids[i + 1]));
        }
        return Value(std::move(d));
      }
      case K::attr: return get_attr(eval(*e.kids[0]), e.name);
      case K::item: return get_item(eval(*e.kids[0]), eval(*e.kids[1]));
      case K::slice: {
        Value parts[3];
        for (int i = 0; i < 3; ++i)
          if (e.kids[size_t(i) + 1]) parts[i] = eval(*e.kids[size_t(i) + 1]);
        return get_slice(eval(*e.kids[0]), parts[0], parts[1], parts[2]);
      }
      case K::call: return invoke(eval(*e.kids[0]), eval_args(e), e.line);
      case K::filter: {
        Value subject = eval(*e.kids[0]);
        return apply_filter(e.name, subject, eval_args(e));
      }
      case K::test: {
        Value subject = eval(*e.kids[0]);
        return Value(apply_test(e.name, subject, eval_args(e)) != e.negated);
      }
      case K::not_: return Value(!truthy(eval(*e.kids[0])));
      case K::neg: {
        Value v = eval(*e.kids[0]);
        if (v.is_int()) {
          if (v.as_int() == std::numeric_limits<int64_t>::min())
            throw std::invalid_argument("integer overflow in unary -");
          return Value(-v.as_int());
        }
        if (v.is_float()) return Value(-v.as_float());
        if (v.is_bool()) return Value(-int64_t(v.as_bool()));
        throw std::invalid_argument(fmt::format("bad operand type for unary -: '{}'", type_name(v)));
      }
      case K::binary: {
        Value a = eval(*e.kids[0]);
        return binary_op(e.name, a, eval(*e.kids[1]));
      }
      case K::compare: return compare(e);
      case K::and_: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? eval(*e.kids[1]) : a;
      }
      case K::or_: {
        Value a = eval(*e.kids[0]);
        return truthy(a) ? a : eval(*e.kids[1]);
      }
      case K::cond:
        if (truthy(eval(*e.kids[1]))) return eval(*e.kids[0]);
        return e.kids[2] ? eval(*e.kids[2]) : Value(Undefined{"conditional without else"});
    }
    return Value();
  }

  const std::string& name_;
  const Dict& vars_;
  const RenderOptions& o_;
  Dict globals_;
  std::vector<Dict> frames_;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  uint64_t built_ = 0;  // bytes of the values built (charge)
  size_t outer_ = 0;    // bytes held by the captures enclosing the current one
  int depth_ = 0;
};

}  // namespace

Template::Template(const std::string& source, std::string name) : name_(std::move(name)) {
  try {
    auto body = std::make_shared<Body>(parse(lex(source, name_, LexOptions{}), name_));
    body_ = std::move(body);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::runtime_error& e) {  // lexer and parser errors already name the line
    throw TemplateError(e.what());
  } catch (const std::logic_error& e) {
    throw TemplateError(name_ + ": " + e.what());
  }
}

std::string Template::render(const Dict& variables, const RenderOptions& options) const {
  Renderer r(name_, variables, options);
  return r.run(*static_cast<const Body*>(body_.get()));
}

}  // namespace rp::jinja
