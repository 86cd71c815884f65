// Expert parallelism with a real dispatch and combine (issue 20; DeepEP's "normal" mode is the
// model read, no code taken). Each rank holds num_local_experts physical experts (model/parallel.h);
// a MoE layer on a rank's own rows x [T, H]:
//  1. route (router GEMM + moe_routing, the one-process ops), ids brought to the host (the counts
//     need them: DeepEP's normal mode also syncs the CPU here);
//  2. for each (token, slot) a physical replica of its logical expert (round robin over the
//     replicas within the step), hence a destination rank; per-destination counts exchanged first
//     (all_gather of every rank's [W][rows, entries]), then the payload by all_to_all_v: one row
//     per (token, rank) (a token whose experts share a rank travels there once), and per
//     (token, slot) an entry: its row's index on the receiver and the receiver's local expert;
//  3. each rank gathers one row per entry and runs moe_experts on them, one slot per row with
//     weight 1 (so its output rows are the experts' raw F32 outputs, bit for bit);
//  4. those rows go back by all_to_all_v (the entry counts reversed) and the token's owner combines
//     them in slot order with its routing weights (Backend::moe_combine: moe_experts' own combine),
//     then adds the shared experts on its rows: the one-process MoE's ops in its order, so the
//     bits are the one-process bits wherever the backend's GEMMs are batch-invariant
//     (DEEPINFER_BATCH_INVARIANT=1).
// Routing weights stay with the owner (only the combine needs them). Rows replicated on several
// ranks (every rank with --tp or --ep without --dp; a data-parallel group's ranks with --dp x --tp)
// are cut into chunks, one per rank holding them, dispatched as above, and all_gathered after.
//
// EPLB (model/eplb.h): the dispatch counts each logical expert's rows on the host from the ids it
// already has (no extra sync or device work); every `eplb_interval` steps (the same step on every
// rank) the counts are summed over the ranks, eplb_place gives each layer a new placement from
// them, and each rank takes its new physical experts from host views of every logical expert: on
// the CPU backend its slots become those views (weights are the mmapped tensors: nothing copied);
// on device backends each slot whose expert changes is overwritten in place by its new expert's
// host bytes (the slots' device memory, hence the backend's expert pointer tables, stay; slots that
// shared one upload are given their own memory first). Without host views (random weights made on
// the device) the placement stays fixed.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/layers/moe.h"
#include "model/parallel.h"
#include "model/weights.h"

namespace deepinfer {

class ExpertParallelMoe {
 public:
  // layers: the rank's layers (each MoE layer's experts: its physical experts, shard_weights);
  // all_experts: per layer, host views of every logical expert (EPLB's re-placement), or empty;
  // host_owners keep them alive (device backends, whose own weights are uploads).
  ExpertParallelMoe(const ModelConfig& config, const ParallelPlan& plan, Backend& backend,
                    const std::vector<LayerWeights>& layers, std::vector<std::vector<ExpertWeights>> all_experts,
                    std::vector<std::shared_ptr<const void>> host_owners = {});

  // out [T, H] = MoE layer `layer` (weights w: router, shared experts) of this rank's rows x
  // [T, H] (T may be 0). Every rank calls it for every MoE layer, in the same order.
  void forward(int layer, const MoeWeights& w, const Tensor& x, FfnWorkspace& ws, Tensor& out);
  // The same rows x [T, H] on every rank of `group` (all W ranks, or a data-parallel group's
  // tensor-parallel ranks under --dp x --tp): its rank g dispatches chunk g (over all W ranks,
  // as forward), out gathered over `group`. Every rank calls it, in the same order.
  void forward_replicated(int layer, const MoeWeights& w, const Tensor& x, FfnWorkspace& ws, Tensor& out,
                          Communicator& group);
  // Once per model forward on every rank: re-places the experts at the EPLB interval (deferred
  // while held).
  void end_step();
  // Holds the re-placement (a benchmark's timed window: Model::hold_expert_replacement); on
  // release a re-placement that fell due meanwhile runs (collective: every rank releases at the
  // same point between steps).
  void hold(bool on);
  int64_t num_deferred() const { return deferred_; }  // re-placements that waited for a release

  // What the dispatch moved since construction, this rank's sends (counts, not timed): rows to
  // other ranks (one per token and rank), their (token, slot) entries, and the F32 expert
  // outputs that came back from other ranks (one per entry).
  struct Traffic {
    int64_t rows_out = 0, entries_out = 0, outputs_back = 0, tokens = 0;
    // ParallelPlan::time_collectives: wall seconds in the dispatch's collectives (counts, rows,
    // entries, outputs back, the chunks' gather; the device synchronized before and after each
    // group, so a rank also waits for the slowest) and the bytes this rank sent to other ranks.
    double comm_s = 0;
    int64_t comm_bytes = 0;
  };
  const Traffic& traffic() const { return traffic_; }
  const std::vector<int>& placement(int layer) const { return placement_[static_cast<size_t>(layer)]; }
  int64_t num_rebalances() const { return rebalances_; }
  int64_t num_experts_copied() const { return experts_copied_; }
  // Every slot gets its own backend memory and re-placement copies the new experts into it, as on
  // device backends (the host test of that path; before the first step).
  void use_private_slots() {
    make_slots_private(true);
    copy_slots_ = true;
  }
  uint64_t workspace_epoch() const { return epoch_; }

 private:
  void ensure(int64_t tokens, int64_t send_rows, int64_t recv_rows);
  // time_collectives: synchronizes the device and returns now (start), or adds the time since
  // `start` to traffic_.comm_s (stop).
  double comm_clock();
  void comm_time(double start);
  void ensure_chunk(int64_t chunk_rows, int chunks);
  void set_placement(int layer, std::vector<int> physical_to_logical);
  void rebalance();
  // Device backends: slots of one layer that share device memory (redundant copies of one expert
  // uploaded once) get their own, so each slot can be overwritten alone (all: every slot).
  void make_slots_private(bool all = false);
  // Device backends: slot `dst`'s tensors overwritten by `src`'s host bytes (same shapes).
  void copy_expert(const ExpertWeights& src, ExpertWeights& dst, int layer);

  const ModelConfig& config_;
  ParallelPlan plan_;
  Backend& backend_;
  MoeRouting routing_;
  int W_ = 1, rank_ = 0, per_rank_ = 0;
  std::vector<std::vector<ExpertWeights>> all_experts_;  // [layer][logical], host views
  std::vector<std::shared_ptr<const void>> host_owners_;
  std::vector<DeviceBuffer> private_slots_;              // make_slots_private's memory
  int64_t experts_copied_ = 0;                           // device re-placement: slots overwritten
  bool copy_slots_ = false;                              // re-place by copying (device backends)
  bool held_ = false, due_ = false;                      // hold(): a re-placement waits for the release
  int64_t deferred_ = 0;
  std::vector<std::vector<ExpertWeights>> local_;        // [layer][local physical]
  std::vector<std::vector<int>> placement_;              // [layer][physical] -> logical
  std::vector<std::vector<std::vector<int>>> replicas_;  // [layer][logical] -> physical ids
  std::vector<int64_t> load_;                            // [layer * E + logical] rows since the last flush
  int64_t steps_ = 0, rebalances_ = 0;
  Traffic traffic_;
  uint64_t epoch_ = 0;

  // Host staging of one call.
  std::vector<int32_t> ids_, send_token_, send_row_, send_local_, pos_, counts_all_;
  std::vector<int64_t> recv_rows_, recv_pairs_;
  // Backend buffers, grown geometrically.
  std::vector<DeviceBuffer> buffers_, chunk_buffers_;
  int64_t cap_tokens_ = 0, cap_send_ = 0, cap_recv_ = 0, cap_chunk_ = 0;
  int chunks_ = 0;  // ranks of the gathered chunk buffer
  Tensor counts_, counts_all_t_, send_token_t_, send_row_t_, send_local_t_, pos_t_;
  Tensor send_x_, recv_x_, recv_row_, recv_local_, x_pairs_, ones_, y_recv_, y_back_, chunk_out_, gathered_;
};

}  // namespace deepinfer
