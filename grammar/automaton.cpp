// IR -> per-rule Thompson NFA (byte and call edges) -> per-rule subset construction.
// Checks: every referenced rule is defined, no left recursion (a rule reaching itself
// without consuming a byte would make the matcher's stack grow forever), size limits.
#include "grammar/automaton.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "core/json.h"

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
  NfaBuilder(const GrammarIR& ir, const CompileLimits& limits, CompileBudget& budget)
      : ir_(ir), limits_(limits), budget_(budget) {}

  int32_t node() {
    if (static_cast<int64_t>(nodes_.size()) >= limits_.max_nfa_nodes)
      fail("grammar too large: more than ", limits_.max_nfa_nodes, " automaton nodes (CompileLimits::max_nfa_nodes) in rule '",
           text_snippet(rule_name_, 120),
           "': its size grows with the bytes of its literals and enum/const values, its alternatives, and "
           "repetition bounds (maxLength, maxItems, {n,m}) that copy what they repeat");
    budget_.charge(static_cast<int64_t>(sizeof(NfaNode)) + 48, "building the grammar's NFA");
    nodes_.emplace_back();
    return static_cast<int32_t>(nodes_.size() - 1);
  }
  void set_rule_name(const std::string& name) { rule_name_ = name; }

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
    budget_.charge(static_cast<int64_t>(sizeof(ByteEdge)) * static_cast<int64_t>(x.ranges.size()) + 8,
                   "building the grammar's NFA");
  }

  std::vector<NfaNode> nodes_;

 private:
  const GrammarIR& ir_;
  const CompileLimits& limits_;
  CompileBudget& budget_;
  std::string rule_name_;
};

// Epsilon closure of `set` (sorted on return), in time linear in what it reaches: membership
// by a stamp per NFA node.
class EpsClosure {
 public:
  explicit EpsClosure(const std::vector<NfaNode>& nodes) : nodes_(nodes), stamp_(nodes.size(), 0) {}
  void operator()(std::vector<int32_t>& set) {
    if (++epoch_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0);
      epoch_ = 1;
    }
    size_t kept = 0;
    for (int32_t n : set)
      if (stamp_[n] != epoch_) {
        stamp_[n] = epoch_;
        set[kept++] = n;
      }
    set.resize(kept);
    for (size_t i = 0; i < set.size(); ++i)
      for (int32_t t : nodes_[set[i]].eps)
        if (stamp_[t] != epoch_) {
          stamp_[t] = epoch_;
          set.push_back(t);
        }
    std::sort(set.begin(), set.end());
  }

 private:
  const std::vector<NfaNode>& nodes_;
  std::vector<uint32_t> stamp_;
  uint32_t epoch_ = 0;
};

}  // namespace

Automaton build_automaton(const GrammarIR& ir, const CompileLimits& limits, CompileBudget* budget_in) {
  CompileBudget local_budget(limits);
  CompileBudget& budget = budget_in ? *budget_in : local_budget;
  budget.check_time("building the grammar's automaton");
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
  NfaBuilder nfa(ir, limits, budget);
  std::vector<std::pair<int32_t, int32_t>> rule_nfa(rules.size(), {-1, -1});
  for (size_t i = 0; i < order.size(); ++i) {
    int32_t r = order[i];
    DI_CHECK(rules[r].body >= 0, "grammar: rule '", text_snippet(rules[r].name, 120), "' is referenced but not defined");
    nfa.set_rule_name(rules[r].name);
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
  EpsClosure eps_closure(nfa.nodes_);
  for (int32_t r : order) {
    const int32_t s = rule_nfa[r].first, f = rule_nfa[r].second;
    std::map<std::vector<int32_t>, int32_t> ids;
    std::vector<std::vector<int32_t>> pending;
    auto intern = [&](std::vector<int32_t> set) -> int32_t {
      eps_closure(set);
      budget.tick("building the grammar's automaton");
      auto it = ids.find(set);
      if (it != ids.end()) return it->second;
      if (static_cast<int64_t>(a.states.size()) >= limits.max_dfa_states)
        fail("grammar too large: more than ", limits.max_dfa_states,
             " automaton states in all (CompileLimits::max_dfa_states; reached in rule '", text_snippet(rules[r].name, 120),
             "', one of ", order.size(), " rules)");
      // The set is held twice (map key, pending) until the state is expanded; edges follow.
      budget.charge(static_cast<int64_t>(2 * set.size() * sizeof(int32_t) + sizeof(AutomatonState)) + 128,
                    "building the grammar's automaton");
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
      budget.charge(static_cast<int64_t>(edges.size() * sizeof(ByteEdge) + call_edges.size() * sizeof(CallEdge)),
                    "building the grammar's automaton");
      a.states[id].bytes = std::move(edges);
      a.states[id].calls = std::move(call_edges);
    }
  }

  // Nullable rules (can complete without consuming a byte): a worklist fixpoint in which a
  // rule is looked at again only when a rule it calls became nullable (FIFO, so a chain of
  // rules is linear; iterating over all rules until nothing changed was quadratic).
  std::vector<char> nullable(rules.size(), 0);
  std::vector<uint32_t> seen_stamp(a.states.size(), 0);
  uint32_t epoch = 0;
  auto reach_without_bytes = [&](int32_t r, std::vector<int32_t>* called) {
    ++epoch;
    std::vector<int32_t> work{a.rule_start[r]};
    seen_stamp[a.rule_start[r]] = epoch;
    bool fin = false;
    while (!work.empty()) {
      budget.tick("checking the grammar's rules");
      int32_t st = work.back();
      work.pop_back();
      if (a.states[st].final) fin = true;
      for (const auto& c : a.states[st].calls) {
        if (called) called->push_back(c.rule);
        if (nullable[c.rule] && seen_stamp[c.to] != epoch) {
          seen_stamp[c.to] = epoch;
          work.push_back(c.to);
        }
      }
    }
    return fin;
  };
  {
    std::vector<std::vector<int32_t>> callers(rules.size());
    for (const auto& st : a.states)
      for (const auto& c : st.calls) callers[c.rule].push_back(st.rule);
    std::vector<int32_t> queue(order.begin(), order.end());
    std::vector<char> queued(rules.size(), 0);
    for (int32_t r : order) queued[r] = 1;
    for (size_t head = 0; head < queue.size(); ++head) {
      const int32_t r = queue[head];
      queued[r] = 0;
      if (nullable[r] || !reach_without_bytes(r, nullptr)) continue;
      nullable[r] = 1;
      for (int32_t q : callers[r])
        if (!nullable[q] && !queued[q]) {
          queued[q] = 1;
          queue.push_back(q);
        }
    }
  }
  // Left recursion: a cycle in "r calls r' before consuming a byte" (depth-first search with
  // an explicit stack: a chain of rules may be as long as the grammar).
  std::vector<std::vector<int32_t>> left_calls(rules.size());
  for (int32_t r : order) reach_without_bytes(r, &left_calls[r]);
  std::vector<int8_t> color(rules.size(), 0);
  std::vector<std::pair<int32_t, size_t>> path;  // rule, next of its left calls to visit
  for (int32_t start : order) {
    if (color[start] != 0) continue;
    color[start] = 1;
    path.push_back({start, 0});
    while (!path.empty()) {
      budget.tick("checking the grammar for left recursion");
      const int32_t r = path.back().first;
      if (path.back().second == left_calls[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const int32_t c = left_calls[r][path.back().second++];
      if (color[c] == 1) {
        size_t from = 0;
        while (path[from].first != c) ++from;
        std::string cycle;
        const size_t len = path.size() - from;
        for (size_t i = from; i < path.size(); ++i) {
          if (len > 8 && i == from + 4) {
            cycle += "... (" + std::to_string(len - 8) + " more) -> ";
            i = path.size() - 4;
          }
          cycle += "'" + text_snippet(rules[path[i].first].name, 60) + "' -> ";
        }
        fail("grammar: left recursion is not supported: ", cycle, "'", text_snippet(rules[c].name, 60), "'");
      }
      if (color[c] == 0) {
        color[c] = 1;
        path.push_back({c, 0});
      }
    }
  }

  // Prune states that cannot reach the end of their rule (dead ends would let the mask admit
  // tokens that can never complete), after finding which rules match any string at all. A
  // worklist over reversed edges: a state is live when final, or a byte edge leads to a live
  // state, or a call edge to a productive rule continues in a live state; a rule is productive
  // when its start state is live.
  std::vector<char> productive(rules.size(), 0), live(a.states.size(), 0);
  {
    const size_t n = a.states.size();
    // Reversed edges in CSR form: each state's byte predecessors, its call predecessors with
    // the called rule, and each rule's call sites (caller state, continuation).
    std::vector<int32_t> byte_begin(n + 1, 0), call_begin(n + 1, 0), site_begin(rules.size() + 1, 0);
    for (const auto& st : a.states) {
      for (const auto& e : st.bytes) ++byte_begin[e.to + 1];
      for (const auto& c : st.calls) {
        ++call_begin[c.to + 1];
        ++site_begin[c.rule + 1];
      }
    }
    for (size_t i = 0; i < n; ++i) {
      byte_begin[i + 1] += byte_begin[i];
      call_begin[i + 1] += call_begin[i];
    }
    for (size_t i = 0; i < rules.size(); ++i) site_begin[i + 1] += site_begin[i];
    std::vector<int32_t> byte_pred(byte_begin[n]);
    std::vector<std::pair<int32_t, int32_t>> call_pred(call_begin[n]), sites(site_begin[rules.size()]);
    budget.charge(static_cast<int64_t>(byte_pred.size() * 4 + call_pred.size() * 8 + sites.size() * 8 + n * 12),
                  "pruning the grammar's automaton");
    {
      std::vector<int32_t> bf(byte_begin.begin(), byte_begin.end() - 1), cf(call_begin.begin(), call_begin.end() - 1),
          sf(site_begin.begin(), site_begin.end() - 1);
      for (size_t p2 = 0; p2 < n; ++p2) {
        const auto p = static_cast<int32_t>(p2);
        for (const auto& e : a.states[p].bytes) byte_pred[bf[e.to]++] = p;
        for (const auto& c : a.states[p].calls) {
          call_pred[cf[c.to]++] = {p, c.rule};
          sites[sf[c.rule]++] = {p, c.to};
        }
      }
    }
    std::vector<int32_t> work;
    auto make_live = [&](int32_t st) {
      if (live[st]) return;
      live[st] = 1;
      work.push_back(st);
    };
    for (size_t s2 = 0; s2 < n; ++s2)
      if (a.states[s2].final) make_live(static_cast<int32_t>(s2));
    while (!work.empty()) {
      budget.tick("pruning the grammar's automaton");
      const int32_t t = work.back();
      work.pop_back();
      const int32_t r = a.states[t].rule;
      if (t == a.rule_start[r] && !productive[r]) {
        productive[r] = 1;
        for (int32_t k = site_begin[r]; k < site_begin[r + 1]; ++k)
          if (live[sites[k].second]) make_live(sites[k].first);
      }
      for (int32_t k = byte_begin[t]; k < byte_begin[t + 1]; ++k) make_live(byte_pred[k]);
      for (int32_t k = call_begin[t]; k < call_begin[t + 1]; ++k)
        if (productive[call_pred[k].second]) make_live(call_pred[k].first);
    }
  }
  DI_CHECK(productive[ir.root()], "grammar: the root rule '", text_snippet(rules[ir.root()].name, 120), "' matches no string");
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
    budget.charge(256 * sizeof(int32_t), "building the grammar's dense tables");
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
