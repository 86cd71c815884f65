// Object content under presence constraints (see json_schema_object.h). States are
// (member index i, members emitted so far c, presence bits of the constrained members before
// i); c is capped where larger counts behave alike (at max(minProperties, 1), or
// maxProperties + 1 which is dead). A state is emitted only if some completion meets every
// constraint (`feasible`), so the grammar has no dead ends.
#include "grammar/json_schema_object.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "core/error.h"

namespace deepinfer::grammar {
namespace {

constexpr size_t kMaxConstrained = 12;  // 2^12 presence combinations, evaluated once each
constexpr size_t kMaxStates = 4096;     // rules per object
constexpr int64_t kMaxExtraBound = 1024;

void collect_members(const PresenceFormula& f, std::vector<int32_t>* out) {
  if (f.kind == PresenceFormula::Kind::Has) out->push_back(f.member);
  for (const auto& c : f.children) collect_members(c, out);
}

bool eval(const PresenceFormula& f, const std::vector<int32_t>& bit_of, uint32_t mask) {
  switch (f.kind) {
    case PresenceFormula::Kind::Has: return (mask >> bit_of[f.member]) & 1;
    case PresenceFormula::Kind::Not: return !eval(f.children.at(0), bit_of, mask);
    case PresenceFormula::Kind::All:
      return std::all_of(f.children.begin(), f.children.end(), [&](const auto& c) { return eval(c, bit_of, mask); });
    case PresenceFormula::Kind::Any:
      return std::any_of(f.children.begin(), f.children.end(), [&](const auto& c) { return eval(c, bit_of, mask); });
    case PresenceFormula::Kind::OneOf:
      return std::count_if(f.children.begin(), f.children.end(), [&](const auto& c) { return eval(c, bit_of, mask); }) ==
             1;
  }
  return false;
}

class ObjectBuilder {
 public:
  ObjectBuilder(GrammarIR& ir, const ObjectMembers& m, const PresenceRules& rules, const std::string& path)
      : ir_(ir), m_(m), rules_(rules), path_(path), n_(m.member.size()), bit_of_(m.member.size(), -1) {}

  int32_t build() {
    std::vector<int32_t> constrained;
    for (const auto& f : rules_.constraints) collect_members(f, &constrained);
    std::sort(constrained.begin(), constrained.end());
    constrained.erase(std::unique(constrained.begin(), constrained.end()), constrained.end());
    if (constrained.size() > kMaxConstrained)
      fail("json schema: presence constraints (dependencies, not/required) over ", constrained.size(),
           " properties; at most ", kMaxConstrained, " are supported at ", path_);
    for (size_t k = 0; k < constrained.size(); ++k) bit_of_[constrained[k]] = static_cast<int32_t>(k);
    ok_.resize(size_t{1} << constrained.size());
    for (uint32_t mask = 0; mask < ok_.size(); ++mask)
      ok_[mask] = std::all_of(rules_.constraints.begin(), rules_.constraints.end(),
                              [&](const auto& f) { return eval(f, bit_of_, mask); });
    if (rules_.max_members > kMaxExtraBound && m_.extra_member >= 0)
      fail("json schema: maxProperties above ", kMaxExtraBound, " with additional properties is not supported at ",
           path_);
    cap_ = std::max<int64_t>(rules_.min_members, 1);
    if (rules_.max_members >= 0) cap_ = std::max(cap_, rules_.max_members + 1);
    if (!feasible(0, 0, 0))
      fail("json schema: no object meets required/dependencies/not/minProperties/maxProperties at ", path_);
    return rule_for(0, 0, 0);
  }

 private:
  using Key = std::tuple<size_t, int64_t, uint32_t>;

  // Number of extra members allowed after c declared ones: [lo, hi] (hi -1: unbounded), or
  // lo > hi (hi >= 0) when none fits.
  std::pair<int64_t, int64_t> extras(int64_t c) const {
    int64_t lo = std::max<int64_t>(0, rules_.min_members - c);
    int64_t hi = rules_.max_members >= 0 ? rules_.max_members - c : -1;
    if (m_.extra_member < 0) hi = 0;
    return {lo, hi};
  }

  bool feasible(size_t i, int64_t c, uint32_t mask) {
    if (rules_.max_members >= 0 && c > rules_.max_members) return false;
    Key key{i, c, mask};
    if (auto it = feasible_.find(key); it != feasible_.end()) return it->second;
    if (feasible_.size() > kMaxStates * 4)
      fail("json schema: object presence constraints need more than ", kMaxStates * 4, " states at ", path_);
    bool r;
    if (i == n_) {
      auto [lo, hi] = extras(c);
      r = ok_[mask] && (hi < 0 || lo <= hi);
    } else {
      r = (m_.presence[i] != ObjectMembers::Presence::Absent && feasible(i + 1, next_count(c), with(i, mask))) ||
          (m_.presence[i] != ObjectMembers::Presence::Required && feasible(i + 1, c, mask));
    }
    feasible_[key] = r;
    return r;
  }

  int64_t next_count(int64_t c) const { return std::min(c + 1, cap_); }
  uint32_t with(size_t i, uint32_t mask) const { return bit_of_[i] >= 0 ? mask | (1u << bit_of_[i]) : mask; }

  int32_t rule_for(size_t i, int64_t c, uint32_t mask) {
    Key key{i, c, mask};
    if (auto it = rules_of_.find(key); it != rules_of_.end()) return ir_.ref(it->second);
    if (rules_of_.size() >= kMaxStates)
      fail("json schema: object presence constraints need more than ", kMaxStates, " rules at ", path_);
    int32_t rule = ir_.add_rule(c == 0 ? "obj_first" : "obj_rest");
    rules_of_[key] = rule;
    ir_.set_body(rule, i == n_ ? extras_expr(c) : member_expr(i, c, mask));
    return ir_.ref(rule);
  }

  int32_t member_expr(size_t i, int64_t c, uint32_t mask) {
    std::vector<int32_t> alts;
    if (m_.presence[i] != ObjectMembers::Presence::Absent && feasible(i + 1, next_count(c), with(i, mask))) {
      int32_t next = rule_for(i + 1, next_count(c), with(i, mask));
      alts.push_back(c == 0 ? ir_.seq({m_.member[i], next}) : ir_.seq({m_.sep, m_.member[i], next}));
    }
    if (m_.presence[i] != ObjectMembers::Presence::Required && feasible(i + 1, c, mask))
      alts.push_back(rule_for(i + 1, c, mask));
    return ir_.alt(std::move(alts));
  }

  int32_t extras_expr(int64_t c) {
    auto [lo, hi] = extras(c);
    if (hi == 0) return ir_.empty();
    auto bound = [](int64_t v) { return v < 0 ? GrammarIR::kUnbounded : static_cast<int32_t>(v); };
    int32_t more = ir_.seq({m_.sep, m_.extra_member});
    if (c > 0) return ir_.repeat(more, static_cast<int32_t>(lo), bound(hi));
    // None emitted yet: the first extra member has no separator.
    int32_t some = ir_.seq({m_.extra_member, ir_.repeat(more, static_cast<int32_t>(std::max<int64_t>(lo - 1, 0)),
                                                        bound(hi < 0 ? -1 : hi - 1))});
    return lo == 0 ? ir_.opt(some) : some;
  }

  GrammarIR& ir_;
  const ObjectMembers& m_;
  const PresenceRules& rules_;
  const std::string& path_;
  const size_t n_;
  std::vector<int32_t> bit_of_;  // per member: its bit in the presence mask, or -1
  std::vector<char> ok_;         // per presence mask of the constrained members: all constraints hold
  int64_t cap_ = 1;
  std::map<Key, char> feasible_;
  std::map<Key, int32_t> rules_of_;
};

}  // namespace

bool presence_formula(const nlohmann::ordered_json& s, std::vector<std::string>* names, PresenceFormula* out) {
  static const char* kAnnotations[] = {"title", "description", "$comment", "examples", "default"};
  if (!s.is_object()) return false;
  *out = PresenceFormula{};  // All of nothing: true
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    const auto& v = it.value();
    if (std::find(std::begin(kAnnotations), std::end(kAnnotations), k) != std::end(kAnnotations)) continue;
    PresenceFormula part;
    if (k == "required") {
      if (!v.is_array()) return false;
      for (const auto& r : v) {
        if (!r.is_string()) return false;
        auto at = std::find(names->begin(), names->end(), r.get<std::string>());
        if (at == names->end()) at = names->insert(names->end(), r.get<std::string>());
        PresenceFormula has{PresenceFormula::Kind::Has, static_cast<int32_t>(at - names->begin()), {}};
        part.children.push_back(has);
      }
    } else if (k == "not") {
      part.kind = PresenceFormula::Kind::Not;
      part.children.resize(1);
      if (!presence_formula(v, names, &part.children[0])) return false;
    } else if (k == "allOf" || k == "anyOf" || k == "oneOf") {
      if (!v.is_array() || v.empty()) return false;
      part.kind = k == "allOf" ? PresenceFormula::Kind::All
                  : k == "anyOf" ? PresenceFormula::Kind::Any
                                 : PresenceFormula::Kind::OneOf;
      for (const auto& sub : v) {
        part.children.emplace_back();
        if (!presence_formula(sub, names, &part.children.back())) return false;
      }
    } else {
      return false;
    }
    out->children.push_back(std::move(part));
  }
  return true;
}

bool holds_for_non_objects(const PresenceFormula& f) {
  std::vector<int32_t> bit_of;
  std::vector<int32_t> members;
  collect_members(f, &members);
  for (int32_t m : members) bit_of.resize(std::max<size_t>(bit_of.size(), m + 1), 0);
  return eval(f, bit_of, 1u);  // every leaf reads bit 0, which is set
}

void remap_members(PresenceFormula* f, const std::vector<int32_t>& member_of_name) {
  if (f->kind == PresenceFormula::Kind::Has) f->member = member_of_name.at(f->member);
  for (auto& c : f->children) remap_members(&c, member_of_name);
}

int32_t object_content(GrammarIR& ir, const ObjectMembers& m, const PresenceRules& rules, const std::string& path) {
  return ObjectBuilder(ir, m, rules, path).build();
}

}  // namespace deepinfer::grammar
