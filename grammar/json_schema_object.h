// JSON Schema objects with presence constraints: which members may appear together
// (`dependencies` / `dependentRequired`, `not` of `required`, `minProperties` /
// `maxProperties`). The grammar emits members in a fixed order (schema order); a presence
// constraint then is a finite automaton over the sequence of take/skip decisions, so the
// object's content is built as rules keyed by (member index, members emitted so far, presence
// of the constrained members decided so far). Exact over the member order the grammar emits.
#pragma once
#include <cstdint>
#include <string>
#include <nlohmann/json.hpp>
#include <vector>

#include "grammar/ir.h"

namespace deepinfer::grammar {

// A boolean formula over the presence of members (indices into ObjectMembers::member).
struct PresenceFormula {
  enum class Kind : uint8_t { Has, All, Any, OneOf, Not };
  Kind kind = Kind::All;  // All with no children: true
  int32_t member = -1;    // Has
  std::vector<PresenceFormula> children;
};

// A schema that only constrains which properties are present (`required`, allOf / anyOf /
// oneOf / not of such schemas, annotations) as a formula whose Has leaves index `names`
// (names are appended as they appear). False when the schema constrains anything else.
bool presence_formula(const nlohmann::ordered_json& s, std::vector<std::string>* names, PresenceFormula* out);
// The formula's truth for a value that is not an object (every `required` holds there).
bool holds_for_non_objects(const PresenceFormula& f);
// Replaces each Has leaf's name index n by member_of_name[n].
void remap_members(PresenceFormula* f, const std::vector<int32_t>& member_of_name);

struct ObjectMembers {
  enum class Presence : uint8_t { Optional, Required, Absent };
  std::vector<int32_t> member;     // per member: the expression `"key" ws ":" ws value`
  std::vector<Presence> presence;  // per member
  int32_t extra_member = -1;       // one additional member (any number of them), or -1: none
  int32_t sep = -1;                // `ws "," ws`
};

struct PresenceRules {
  std::vector<PresenceFormula> constraints;  // all must hold
  int64_t min_members = 0;                   // minProperties (extra members counted too)
  int64_t max_members = -1;                  // maxProperties; -1: none
  bool any() const { return !constraints.empty() || min_members > 0 || max_members >= 0; }
};

// The content between `{ ws` and `ws }`: members in order, then extra members, meeting the
// rules. Throws deepinfer::Error naming `path` when no object can meet them or when the
// constraints involve too many members (more than 12) or states (more than 4096).
int32_t object_content(GrammarIR& ir, const ObjectMembers& m, const PresenceRules& rules, const std::string& path);

}  // namespace deepinfer::grammar
