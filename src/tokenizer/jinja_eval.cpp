// Tree-walking interpreter of the chat-template Jinja subset and the Template class. Scoping
// follows Jinja2: each for-loop iteration and each macro call gets its own scope (a `set` inside
// them is not visible outside; use namespace() for that); if-blocks share the enclosing scope.
// Arithmetic and comparisons follow Python (int/float promotion, floor division, modulo sign).
#include <cmath>

#include "core/check.h"
#include "tokenizer/jinja.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_builtins.h"

namespace moetrain::jinja {

namespace {

struct Scope {
  ValueDict vars;
  std::shared_ptr<Scope> parent;
  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get())
      if (const Value* v = s->vars.find(name)) return v;
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

constexpr int kMaxDepth = 200;  // macro recursion guard

class Interp {
 public:
  Interp(const Program& prog, const std::string& name) : prog_(prog), name_(name) {}

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (auto& s : body) {
      Flow f = exec_stmt(*s, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  [[noreturn]] void located(size_t pos, const std::string& msg) const {
    auto [l, c] = prog_.line_col(pos);
    MT_FAIL("[{}] error at line {}, column {}: {}", name_, l, c, msg);
  }

  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
    try {
      return exec_stmt_inner(s, scope, out);
    } catch (const EvalError& e) {
      located(s.pos, e.what());
    }
  }

  Flow exec_stmt_inner(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.type) {
      case StmtType::kText: out += s.text; return Flow::kNormal;
      case StmtType::kOutput: out += to_str(eval(*s.expr, scope)); return Flow::kNormal;
      case StmtType::kIf:
        for (auto& [cond, body] : s.branches)
          if (truthy(eval(*cond, scope))) return exec(body, scope, out);
        return exec(s.else_body, scope, out);
      case StmtType::kFor: return exec_for(s, scope, out);
      case StmtType::kSet: assign(s, scope, eval(*s.expr, scope)); return Flow::kNormal;
      case StmtType::kSetBlock: {
        std::string captured;
        exec(s.body, scope, captured);
        assign(s, scope, Value::string(std::move(captured)));
        return Flow::kNormal;
      }
      case StmtType::kMacro: define_macro(s, scope); return Flow::kNormal;
      case StmtType::kBreak: return Flow::kBreak;
      case StmtType::kContinue: return Flow::kContinue;
      case StmtType::kFilterBlock: {
        std::string captured;
        Flow f = exec(s.body, scope, captured);
        out += to_str(apply_filter(s.cond->name, Value::string(std::move(captured)), call_args(*s.cond, scope, 1)));
        return f;
      }
      case StmtType::kBlock: return exec(s.body, scope, out);
    }
    return Flow::kNormal;
  }

  void assign(const Stmt& s, const ScopePtr& scope, Value v) {
    if (s.attr_target) {
      const Value* ns = scope->lookup(s.targets[0]);
      if (!ns || ns->kind != Kind::kNamespace)
        fail("cannot assign attribute '" + s.targets[1] + "' on '" + s.targets[0] + "', which is not a namespace()");
      ns->dict->set(s.targets[1], std::move(v));
      return;
    }
    if (s.targets.size() == 1) {
      scope->vars.set(s.targets[0], std::move(v));
      return;
    }
    ValueList items = iterate(v);
    if (items.size() != s.targets.size())
      fail("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(s.targets.size()) + " names");
    for (size_t k = 0; k < items.size(); ++k) scope->vars.set(s.targets[k], items[k]);
  }

  void bind_targets(const Stmt& s, Scope& scope, const Value& item) {
    if (s.targets.size() == 1) {
      scope.vars.set(s.targets[0], item);
      return;
    }
    ValueList parts = iterate(item);
    if (parts.size() != s.targets.size())
      fail("cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(s.targets.size()) +
           " loop variables");
    for (size_t k = 0; k < parts.size(); ++k) scope.vars.set(s.targets[k], parts[k]);
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    Value seq = eval(*s.expr, scope);
    if (seq.is_none()) fail("'NoneType' object is not iterable");
    ValueList items = iterate(seq);
    if (s.cond) {  // `for x in xs if cond` filters before loop.* is computed
      ValueList kept;
      for (auto& it : items) {
        auto tmp = std::make_shared<Scope>();
        tmp->parent = scope;
        bind_targets(s, *tmp, it);
        if (truthy(eval(*s.cond, tmp))) kept.push_back(it);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(s.else_body, scope, out);
    int64_t n = int64_t(items.size());
    for (int64_t k = 0; k < n; ++k) {
      auto iter = std::make_shared<Scope>();
      iter->parent = scope;
      Value loop = Value::new_dict();
      auto& d = *loop.dict;
      d.set("index", Value::integer(k + 1));
      d.set("index0", Value::integer(k));
      d.set("revindex", Value::integer(n - k));
      d.set("revindex0", Value::integer(n - k - 1));
      d.set("first", Value::boolean(k == 0));
      d.set("last", Value::boolean(k == n - 1));
      d.set("length", Value::integer(n));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem", k > 0 ? items[size_t(k - 1)] : Value());
      d.set("nextitem", k + 1 < n ? items[size_t(k + 1)] : Value());
      d.set("cycle", Value::function([k](const CallArgs& a) {
              if (a.args.empty()) fail("loop.cycle() needs at least one argument");
              return a.args[size_t(k) % a.args.size()];
            }));
      iter->vars.set("loop", std::move(loop));
      bind_targets(s, *iter, items[size_t(k)]);
      Flow f = exec(s.body, iter, out);
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void define_macro(const Stmt& s, const ScopePtr& scope) {
    const Stmt* def = &s;
    // weak: the scope owns the macro, so a strong capture would be a reference cycle.
    std::weak_ptr<Scope> closure = scope;
    scope->vars.set(s.name, Value::function([this, def, closure](const CallArgs& a) {
      if (++depth_ > kMaxDepth) fail("macro recursion deeper than " + std::to_string(kMaxDepth));
      auto local = std::make_shared<Scope>();
      local->parent = closure.lock();
      if (!local->parent) fail("macro '" + def->name + "' called outside the scope that defined it");
      if (a.args.size() > def->params.size())
        fail("macro '" + def->name + "' takes at most " + std::to_string(def->params.size()) + " arguments, got " +
             std::to_string(a.args.size()));
      for (size_t k = 0; k < def->params.size(); ++k) {
        auto& [pname, pdef] = def->params[k];
        const Value* v = k < a.args.size() ? &a.args[k] : a.kwarg(pname);
        local->vars.set(pname, v ? *v : pdef ? eval(*pdef, local) : Value());
      }
      for (auto& [key, v] : a.kwargs) {
        bool known = false;
        for (auto& p : def->params) known = known || p.first == key;
        if (!known) fail("macro '" + def->name + "' has no parameter '" + key + "'");
      }
      std::string out;
      exec(def->body, local, out);
      --depth_;
      return Value::string(std::move(out));
    }));
  }

  CallArgs call_args(const Expr& e, const ScopePtr& scope, size_t first) {
    CallArgs a;
    for (size_t k = first; k < e.children.size(); ++k) a.args.push_back(eval(*e.children[k], scope));
    for (auto& [key, x] : e.kwargs) a.kwargs.emplace_back(key, eval(*x, scope));
    return a;
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      return eval_inner(e, scope);
    } catch (const EvalError& err) {
      located(e.pos, err.what());
    }
  }

  Value eval_inner(const Expr& e, const ScopePtr& scope) {
    switch (e.type) {
      case ExprType::kLiteral: return e.literal;
      case ExprType::kName: {
        const Value* v = scope->lookup(e.name);
        return v ? *v : Value();
      }
      case ExprType::kList:
      case ExprType::kTuple: {
        ValueList items;
        for (auto& c : e.children) items.push_back(eval(*c, scope));
        Value v = Value::new_list(std::move(items));
        v.is_tuple = e.type == ExprType::kTuple;
        return v;
      }
      case ExprType::kDict: {
        Value d = Value::new_dict();
        for (size_t k = 0; k + 1 < e.children.size(); k += 2) {
          Value key = eval(*e.children[k], scope);
          if (!key.is_string()) fail("dict literal keys must be strings, got " + std::string(kind_name(key.kind)));
          d.dict->set(key.s, eval(*e.children[k + 1], scope));
        }
        return d;
      }
      case ExprType::kGetAttr: return get_attr(eval(*e.children[0], scope), e.name);
      case ExprType::kGetItem: return get_item(eval(*e.children[0], scope), eval(*e.children[1], scope));
      case ExprType::kSlice: {
        Value obj = eval(*e.children[0], scope);
        auto part = [&](int k) { return e.children[size_t(k)] ? eval(*e.children[size_t(k)], scope) : Value(); };
        return slice_value(obj, part(1), part(2), part(3));
      }
      case ExprType::kCall: {
        Value callee = eval(*e.children[0], scope);
        CallArgs a = call_args(e, scope, 1);
        if (callee.kind != Kind::kFunction) fail(describe_callee(*e.children[0], callee) + " is not callable");
        return (*callee.fn)(a);
      }
      case ExprType::kFilter: return apply_filter(e.name, eval(*e.children[0], scope), call_args(e, scope, 1));
      case ExprType::kTest: {
        bool r = apply_test(e.name, eval(*e.children[0], scope), call_args(e, scope, 1));
        return Value::boolean(e.negate ? !r : r);
      }
      case ExprType::kNeg:
      case ExprType::kPos: {
        Value v = eval(*e.children[0], scope);
        if (!v.is_number()) fail(std::string("bad operand type for unary ") + (e.type == ExprType::kNeg ? "-" : "+") +
                                 ": '" + kind_name(v.kind) + "'");
        if (e.type == ExprType::kPos) return v.kind == Kind::kBool ? Value::integer(v.b) : v;
        if (v.kind == Kind::kFloat) return Value::number(-v.f);
        return Value::integer(-(v.kind == Kind::kBool ? int64_t(v.b) : v.i));
      }
      case ExprType::kNot: return Value::boolean(!truthy(eval(*e.children[0], scope)));
      case ExprType::kAnd: {
        Value l = eval(*e.children[0], scope);
        return truthy(l) ? eval(*e.children[1], scope) : l;
      }
      case ExprType::kOr: {
        Value l = eval(*e.children[0], scope);
        return truthy(l) ? l : eval(*e.children[1], scope);
      }
      case ExprType::kCond: {
        if (truthy(eval(*e.children[0], scope))) return eval(*e.children[1], scope);
        return e.children[2] ? eval(*e.children[2], scope) : Value();
      }
      case ExprType::kCompare: {
        Value left = eval(*e.children[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.children[k + 1], scope);
          if (!compare_op(e.ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprType::kBinary: return binary(e.name, eval(*e.children[0], scope), eval(*e.children[1], scope));
    }
    return Value();
  }

  static std::string describe_callee(const Expr& callee, const Value& v) {
    std::string what = callee.type == ExprType::kName      ? "'" + callee.name + "'"
                       : callee.type == ExprType::kGetAttr ? "attribute '" + callee.name + "'"
                                                           : "expression";
    return v.is_undefined() ? what + " is undefined and" : what + " (" + kind_name(v.kind) + ")";
  }

  static bool compare_op(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    int c = compare(a, b);
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  static int64_t ival(const Value& v) { return v.kind == Kind::kBool ? v.b : v.i; }

  static Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return Value::string(to_str(a) + to_str(b));
    auto bad = [&]() -> Value {
      fail("unsupported operand type(s) for " + op + ": '" + kind_name(a.kind) + "' and '" + kind_name(b.kind) + "'");
    };
    bool ints = (a.kind == Kind::kInt || a.kind == Kind::kBool) && (b.kind == Kind::kInt || b.kind == Kind::kBool);
    if (a.is_number() && b.is_number()) {
      if (op == "+") return ints ? Value::integer(ival(a) + ival(b)) : Value::number(a.as_double() + b.as_double());
      if (op == "-") return ints ? Value::integer(ival(a) - ival(b)) : Value::number(a.as_double() - b.as_double());
      if (op == "*") return ints ? Value::integer(ival(a) * ival(b)) : Value::number(a.as_double() * b.as_double());
      if (op == "/") {
        if (b.as_double() == 0) fail("division by zero");
        return Value::number(a.as_double() / b.as_double());
      }
      if (op == "//" || op == "%") {
        if (b.as_double() == 0) fail("integer division or modulo by zero");
        if (ints) {
          int64_t x = ival(a), y = ival(b), q = x / y, r = x % y;
          if (r != 0 && ((r < 0) != (y < 0))) { --q; r += y; }
          return Value::integer(op == "//" ? q : r);
        }
        double x = a.as_double(), y = b.as_double();
        if (op == "//") return Value::number(std::floor(x / y));
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value::number(r);
      }
      if (op == "**") {
        if (ints && ival(b) >= 0) {
          int64_t r = 1, base = ival(a);
          for (int64_t k = 0; k < ival(b); ++k) r *= base;
          return Value::integer(r);
        }
        return Value::number(std::pow(a.as_double(), b.as_double()));
      }
      return bad();
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
      if (a.is_list() && b.is_list()) {
        ValueList items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::new_list(std::move(items));
      }
      return bad();
    }
    if (op == "*") {
      const Value& seq = a.is_number() ? b : a;
      const Value& cnt = a.is_number() ? a : b;
      if (cnt.kind == Kind::kFloat || !cnt.is_number()) return bad();
      int64_t n = std::max<int64_t>(0, ival(cnt));
      if (seq.is_string()) {
        std::string r;
        for (int64_t k = 0; k < n; ++k) r += seq.s;
        return Value::string(r);
      }
      if (seq.is_list()) {
        ValueList r;
        for (int64_t k = 0; k < n; ++k) r.insert(r.end(), seq.list->begin(), seq.list->end());
        return Value::new_list(std::move(r));
      }
    }
    return bad();
  }

  const Program& prog_;
  const std::string& name_;
  int depth_ = 0;
};

}  // namespace

Template::Template(const std::string& source, const std::string& name, const Options& opt)
    : program_(parse_program(source, name, opt.trim_blocks, opt.lstrip_blocks, opt.keep_trailing_newline)),
      name_(name) {}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const ValueDict& vars) const {
  auto globals = std::make_shared<Scope>();
  add_globals(globals->vars);
  auto top = std::make_shared<Scope>();
  top->parent = globals;
  top->vars = vars;
  Interp interp(*program_, name_);
  std::string out;
  interp.exec(program_->body, top, out);
  return out;
}

}  // namespace moetrain::jinja
