// Automaton: a GrammarIR compiled to one deterministic byte automaton per rule whose
// edges either consume a byte range or call another rule (a pushdown automaton over
// bytes). Matchers advance sets of (state, return-stack) elements over it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "grammar/ir.h"

namespace deepinfer::grammar {

struct ByteEdge {
  uint8_t lo;
  uint8_t hi;
  int32_t to;  // global state id
};

struct CallEdge {
  int32_t rule;
  int32_t to;  // state to continue in after the called rule completes
};

struct AutomatonState {
  int32_t rule = -1;
  bool final = false;            // the rule may end here
  std::vector<ByteEdge> bytes;   // sorted, disjoint
  std::vector<CallEdge> calls;
};

struct Automaton {
  std::vector<AutomatonState> states;
  std::vector<int32_t> rule_start;    // per IR rule; -1 for rules not reachable from the root
  std::vector<std::string> rule_names;
  int32_t root_rule = -1;
  // Dense byte transitions for states of rules without calls (fast lexing path):
  // dense[dense_offset[s] + b] is the next state or -1; dense_offset[s] == -1 when absent.
  std::vector<int32_t> dense_offset;
  std::vector<int32_t> dense;
  // Per state, a compact copy of what the trie walk tests on every node (kFinal | kHasBytes |
  // kHasCalls), so the hot loop does not touch the AutomatonState vectors.
  enum : uint8_t { kFinal = 1, kHasBytes = 2, kHasCalls = 4 };
  std::vector<uint8_t> flags;
  // Per state, the fewest bytes from it to a state with calls (kFarFromCalls: 255 or more, or
  // none): a mask entry keyed by the call-free DFA within d bytes exists only when this is > d.
  static constexpr uint8_t kFarFromCalls = 255;
  std::vector<uint8_t> call_distance;

  int32_t root_start() const { return rule_start[root_rule]; }
  // Next state on byte b from s (byte edges only), or -1.
  int32_t next(int32_t s, uint8_t b) const {
    if (dense_offset[s] >= 0) return dense[dense_offset[s] + b];
    for (const auto& e : states[s].bytes)
      if (b >= e.lo && b <= e.hi) return e.to;
    return -1;
  }
};

// Compiles ir (from its root rule) to an Automaton; refuses with deepinfer::Error
// (undefined rule, left recursion, size past limits).
// Work and memory are charged to `budget` when given (else to one made from limits).
Automaton build_automaton(const GrammarIR& ir, const CompileLimits& limits, CompileBudget* budget = nullptr);

}  // namespace deepinfer::grammar
