// Rewriting pass before automaton construction: wide call-free loops (a JSON string with a
// pattern, format or length bounds, a regex class repeated) that sit inside a rule with calls
// are moved into rules of their own.
//
// Why: the mask cache shares work between states by the automaton reachable from a state
// (mask_cache.h, trie_walk.h). A loop over ~200 bytes inlined in `obj_rest` reaches the rest of
// the object, so each of its states walked the whole 128k-token trie once per grammar (~25 ms,
// 272k trie nodes). In a rule of its own its states reach only the loop: their level-1 entries
// and first-byte subtrees are keyed by that small call-free automaton and shared by every
// grammar of the vocabulary, and the tokens that leave the loop are decided at level 2.
// The language is unchanged: a subexpression E is replaced by a reference to a rule whose
// body is E, and E has no references, so no recursion (left or other) is introduced.
#pragma once
#include "grammar/ir.h"

namespace deepinfer::grammar {

// A loop is wide when its body's byte/char classes hold at least this many values in all.
constexpr int64_t kMinLiftedLoopValues = 16;

// Returns ir with every maximal call-free subexpression that contains a wide loop (a Repeat
// with max >= 2 or unbounded) and lies in a rule body with references lifted into a new rule
// named "<rule>/loop". Rules whose body has no references are left as they are.
// The copy and what it adds are charged to `budget` when given.
GrammarIR lift_call_free_loops(const GrammarIR& ir, CompileBudget* budget = nullptr);

}  // namespace deepinfer::grammar
