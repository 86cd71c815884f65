// IR -> per-rule Thompson NFA (byte and call edges) -> per-rule subset construction.
// Checks: every referenced rule is defined, no left recursion (a rule reaching itself
// without consuming a byte would make the matcher's stack grow forever), size limits.
#include "grammar/automaton.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace deepinfer::grammar {
namespace {

struct NfaNode {
  std::vector<ByteEdge> bytes;
  std::vector<CallEdge> calls;
  std::vector<int32_t> eps;
};

// Splits a code point range into UTF-8 byte-range sequences (surrogates excluded).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  const uint32_t limits[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (uint32_t lim : limits) {
    if (lo <= lim && hi > lim) {
      utf8_sequences(lo, lim, out);
      utf8_sequences(lim + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])});
  out.push_back(std::move(seq));
}

class NfaBuilder {
 public:
  NfaBuilder(const GrammarIR& ir, const CompileLimits& limits) : ir_(ir), limits_(limits) {}

  int32_t node() {
    if (static_cast<int64_t>(nodes_.size()) >= limits_.max_nfa_nodes)
      fail("grammar too large: more than ", limits_.max_nfa_nodes,
           " automaton nodes (large repetition bounds such as maxLength/maxItems or {n,m} multiply size)");
    nodes_.emplace_back();
    return static_cast<int32_t>(nodes_.size() - 1);
  }

  void build(int32_t e, int32_t from, int32_t to) {
    const Expr& x = ir_.expr(e);
    switch (x.kind) {
      case ExprKind::Empty:
        nodes_[from].eps.push_back(to);
        break;
      case ExprKind::Nothing:
        break;
      case ExprKind::Bytes:
        for (auto [lo, hi] : x.ranges)
          nodes_[from].bytes.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(std::min<uint32_t>(hi, 255)), to});
        break;
      case ExprKind::Chars: {
        std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
        for (auto [lo, hi] : x.ranges) utf8_sequences(lo, hi, seqs);
        for (const auto& s : seqs) {
          int32_t cur = from;
          for (size_t k = 0; k < s.size(); ++k) {
            int32_t nxt = k + 1 == s.size() ? to : node();
            nodes_[cur].bytes.push_back({s[k].first, s[k].second, nxt});
            cur = nxt;
          }
        }
        break;
      }
      case ExprKind::Seq: {
        int32_t cur = from;
        for (size_t k = 0; k < x.children.size(); ++k) {
          int32_t nxt = k + 1 == x.children.size() ? to : node();
          build(x.children[k], cur, nxt);
          cur = nxt;
        }
        break;
      }
      case ExprKind::Alt:
        for (int32_t c : x.children) build(c, from, to);
        break;
      case ExprKind::Repeat: {
        if (x.min > limits_.max_repeat || (x.max != GrammarIR::kUnbounded && x.max > limits_.max_repeat))
          fail("grammar: repetition bound ", std::max(x.min, x.max), " exceeds the limit ", limits_.max_repeat);
        int32_t cur = from;
        for (int32_t i = 0; i < x.min; ++i) {
          int32_t nxt = node();
          build(x.children[0], cur, nxt);
          cur = nxt;
        }
        if (x.max == GrammarIR::kUnbounded) {
          int32_t loop = node(), back = node();
          nodes_[cur].eps.push_back(loop);
          build(x.children[0], loop, back);
          nodes_[back].eps.push_back(loop);
          nodes_[loop].eps.push_back(to);
        } else {
          for (int32_t i = x.min; i < x.max; ++i) {
            nodes_[cur].eps.push_back(to);
            int32_t nxt = i + 1 == x.max ? to : node();
            build(x.children[0], cur, nxt);
            cur = nxt;
          }
          if (x.max == x.min) nodes_[cur].eps.push_back(to);
        }
        break;
      }
      case ExprKind::Ref:
        nodes_[from].calls.push_back({x.rule, to});
        break;
    }
  }

  std::vector<NfaNode> nodes_;

 private:
  const GrammarIR& ir_;
  const CompileLimits& limits_;
};

void eps_closure(const std::vector<NfaNode>& nodes, std::vector<int32_t>& set) {
  std::vector<int32_t> work = set;
  while (!work.empty()) {
    int32_t n = work.back();
    work.pop_back();
    for (int32_t t : nodes[n].eps) {
      if (std::find(set.begin(), set.end(), t) == set.end()) {
        set.push_back(t);
        work.push_back(t);
      }
    }
  }
  std::sort(set.begin(), set.end());
}

}  // namespace

Automaton build_automaton(const GrammarIR& ir, const CompileLimits& limits) {
  const auto& rules = ir.rules();
  DI_CHECK(ir.root() >= 0 && ir.root() < static_cast<int32_t>(rules.size()), "grammar: no root rule");
  Automaton a;
  a.root_rule = ir.root();
  a.rule_start.assign(rules.size(), -1);
  for (const auto& r : rules) a.rule_names.push_back(r.name);

  // Rules reachable from the root, in discovery order.
  std::vector<int32_t> order{ir.root()};
  std::vector<char> seen(rules.size(), 0);
  seen[ir.root()] = 1;
  NfaBuilder nfa(ir, limits);
  std::vector<std::pair<int32_t, int32_t>> rule_nfa(rules.size(), {-1, -1});
  for (size_t i = 0; i < order.size(); ++i) {
    int32_t r = order[i];
    DI_CHECK(rules[r].body >= 0, "grammar: rule '", rules[r].name, "' is referenced but not defined");
    int32_t s = nfa.node(), f = nfa.node();
    size_t first = nfa.nodes_.size();
    nfa.build(rules[r].body, s, f);
    rule_nfa[r] = {s, f};
    auto visit = [&](const std::vector<CallEdge>& calls) {
      for (const auto& c : calls)
        if (!seen[c.rule]) {
          seen[c.rule] = 1;
          order.push_back(c.rule);
        }
    };
    visit(nfa.nodes_[s].calls);
    for (size_t n = first; n < nfa.nodes_.size(); ++n) visit(nfa.nodes_[n].calls);
  }

  // Subset construction per rule.
  for (int32_t r : order) {
    const int32_t s = rule_nfa[r].first, f = rule_nfa[r].second;
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> pending;
    auto intern = [&](std::vector<int32_t> set) -> int32_t {
      eps_closure(nfa.nodes_, set);
      auto it = ids.find(set);
      if (it != ids.end()) return it->second;
      if (static_cast<int64_t>(a.states.size()) >= limits.max_dfa_states)
        fail("grammar too large: more than ", limits.max_dfa_states, " automaton states (in rule '", rules[r].name,
             "')");
      int32_t id = static_cast<int32_t>(a.states.size());
      a.states.emplace_back();
      a.states.back().rule = r;
      a.states.back().final = std::binary_search(set.begin(), set.end(), f);
      ids.emplace(set, id);
      pending.push_back(std::move(set));
      return id;
    };
    a.rule_start[r] = intern({s});
    while (!pending.empty()) {
      std::vector<int32_t> set = std::move(pending.back());
      pending.pop_back();
      int32_t id = ids[set];
      // Byte intervals on which the set of targets is constant: cut at every edge boundary.
      std::map<int32_t, std::vector<int32_t>> calls;
      std::vector<uint32_t> cuts{0, 256};
      for (int32_t n : set) {
        for (const auto& e : nfa.nodes_[n].bytes) {
          cuts.push_back(e.lo);
          cuts.push_back(e.hi + 1u);
        }
        for (const auto& c : nfa.nodes_[n].calls) calls[c.rule].push_back(c.to);
      }
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      std::vector<ByteEdge> edges;
      std::vector<int32_t> tgt;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        const uint32_t lo = cuts[k], hi = cuts[k + 1] - 1;
        tgt.clear();
        for (int32_t n : set)
          for (const auto& e : nfa.nodes_[n].bytes)
            if (e.lo <= lo && hi <= e.hi) tgt.push_back(e.to);
        if (tgt.empty()) continue;
        std::sort(tgt.begin(), tgt.end());
        tgt.erase(std::unique(tgt.begin(), tgt.end()), tgt.end());
        int32_t to = intern(tgt);
        if (!edges.empty() && edges.back().to == to && edges.back().hi + 1u == lo)
          edges.back().hi = static_cast<uint8_t>(hi);
        else
          edges.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), to});
      }
      std::vector<CallEdge> call_edges;
      for (auto& [rule, tos] : calls) {
        std::sort(tos.begin(), tos.end());
        tos.erase(std::unique(tos.begin(), tos.end()), tos.end());
        call_edges.push_back({rule, intern(tos)});
      }
      a.states[id].bytes = std::move(edges);
      a.states[id].calls = std::move(call_edges);
    }
  }

  // Nullable rules (can complete without consuming a byte), to a fixpoint.
  std::vector<char> nullable(rules.size(), 0);
  auto reach_without_bytes = [&](int32_t r, std::vector<int32_t>* called) {
    std::vector<int32_t> work{a.rule_start[r]}, seen_states{a.rule_start[r]};
    bool fin = false;
    while (!work.empty()) {
      int32_t st = work.back();
      work.pop_back();
      if (a.states[st].final) fin = true;
      for (const auto& c : a.states[st].calls) {
        if (called) called->push_back(c.rule);
        if (nullable[c.rule] && std::find(seen_states.begin(), seen_states.end(), c.to) == seen_states.end()) {
          seen_states.push_back(c.to);
          work.push_back(c.to);
        }
      }
    }
    return fin;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r : order)
      if (!nullable[r] && reach_without_bytes(r, nullptr)) nullable[r] = changed = true;
  }
  // Left recursion: a cycle in "r calls r' before consuming a byte".
  std::vector<std::vector<int32_t>> left_calls(rules.size());
  for (int32_t r : order) reach_without_bytes(r, &left_calls[r]);
  std::vector<int8_t> color(rules.size(), 0);
  std::vector<int32_t> path;
  auto dfs = [&](auto&& self, int32_t r) -> void {
    color[r] = 1;
    path.push_back(r);
    for (int32_t c : left_calls[r]) {
      if (color[c] == 1) {
        std::string cycle;
        auto it = std::find(path.begin(), path.end(), c);
        for (; it != path.end(); ++it) cycle += "'" + rules[*it].name + "' -> ";
        fail("grammar: left recursion is not supported: ", cycle, "'", rules[c].name, "'");
      }
      if (color[c] == 0) self(self, c);
    }
    path.pop_back();
    color[r] = 2;
  };
  for (int32_t r : order)
    if (color[r] == 0) dfs(dfs, r);

  // Prune states that cannot reach the end of their rule (dead ends would let the mask admit
  // tokens that can never complete), after finding which rules match any string at all.
  std::vector<char> productive(rules.size(), 0), live(a.states.size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < a.states.size(); ++s) {
      if (live[s]) continue;
      const auto& st = a.states[s];
      bool ok = st.final;
      for (const auto& e : st.bytes) ok = ok || live[e.to];
      for (const auto& c : st.calls) ok = ok || (productive[c.rule] && live[c.to]);
      if (ok) {
        live[s] = changed = true;
        if (static_cast<int32_t>(s) == a.rule_start[st.rule]) productive[st.rule] = 1;
      }
    }
  }
  DI_CHECK(productive[ir.root()], "grammar: the root rule '", rules[ir.root()].name, "' matches no string");
  for (auto& st : a.states) {
    std::erase_if(st.bytes, [&](const ByteEdge& e) { return !live[e.to]; });
    std::erase_if(st.calls, [&](const CallEdge& c) { return !productive[c.rule] || !live[c.to]; });
  }

  // Dense tables for states of call-free rules.
  std::vector<char> leaf(rules.size(), 1);
  for (const auto& st : a.states)
    if (!st.calls.empty()) leaf[st.rule] = 0;
  a.dense_offset.assign(a.states.size(), -1);
  constexpr size_t kMaxDenseStates = 16384;
  size_t num_dense = 0;
  for (size_t s = 0; s < a.states.size() && num_dense < kMaxDenseStates; ++s) {
    if (!leaf[a.states[s].rule]) continue;
    a.dense_offset[s] = static_cast<int32_t>(a.dense.size());
    a.dense.resize(a.dense.size() + 256, -1);
    for (const auto& e : a.states[s].bytes)
      for (uint32_t b = e.lo; b <= e.hi; ++b) a.dense[a.dense_offset[s] + b] = e.to;
    ++num_dense;
  }
  a.flags.resize(a.states.size());
  for (size_t s = 0; s < a.states.size(); ++s) {
    const auto& st = a.states[s];
    a.flags[s] = static_cast<uint8_t>((st.final ? Automaton::kFinal : 0) | (st.bytes.empty() ? 0 : Automaton::kHasBytes) |
                                      (st.calls.empty() ? 0 : Automaton::kHasCalls));
  }
  // Bytes to the nearest state with calls: a backward breadth-first search from them over
  // byte edges.
  a.call_distance.assign(a.states.size(), Automaton::kFarFromCalls);
  std::vector<int32_t> rev_begin(a.states.size() + 1, 0), rev;
  for (const auto& st : a.states)
    for (const auto& e : st.bytes) ++rev_begin[e.to + 1];
  for (size_t s = 0; s < a.states.size(); ++s) rev_begin[s + 1] += rev_begin[s];
  rev.resize(rev_begin.back());
  {
    std::vector<int32_t> fill(rev_begin.begin(), rev_begin.end() - 1);
    for (size_t s = 0; s < a.states.size(); ++s)
      for (const auto& e : a.states[s].bytes) rev[fill[e.to]++] = static_cast<int32_t>(s);
  }
  std::vector<int32_t> frontier;
  for (size_t s = 0; s < a.states.size(); ++s)
    if (!a.states[s].calls.empty()) {
      a.call_distance[s] = 0;
      frontier.push_back(static_cast<int32_t>(s));
    }
  for (size_t i = 0; i < frontier.size(); ++i) {
    const int32_t s = frontier[i];
    if (a.call_distance[s] + 1 >= Automaton::kFarFromCalls) break;
    for (int32_t k = rev_begin[s]; k < rev_begin[s + 1]; ++k)
      if (a.call_distance[rev[k]] == Automaton::kFarFromCalls) {
        a.call_distance[rev[k]] = static_cast<uint8_t>(a.call_distance[s] + 1);
        frontier.push_back(rev[k]);
      }
  }
  return a;
}

}  // namespace deepinfer::grammar
