// Pieces of a V4-family forward step shared by V4 (model.cpp here) and V4.1 (model/deepseek_v41/):
// the step's host addressing (token ids, block tables, a sequence's rows of a KV group), row
// helpers over paged caches, the RoPE tables (and their inverse), the MoE site and the grouped
// output projection. Every tensor op runs on the backend's device.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/kv_group_spec.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/step_arena.h"
#include "model/deepseek_v4/weights.h"
#include "model/model.h"
#include "model/step_batch.h"

namespace deepinfer::v4_family {

// I32 tensor -> host vector (one copy from the device).
std::vector<int32_t> host_i32(Backend& be, const Tensor& t);
DeviceBuffer upload_i32(Backend& be, const std::vector<int32_t>& v);
// A cache [blocks, block_size, dim] as the rows of one table [blocks * block_size, dim].
Tensor cache_rows(const Tensor& cache);
// rows [T, row_dim] -> their slots of `cache` (slot -1: none).
void store_rows(Backend& be, const Tensor& rows, const Tensor& cache, const Tensor& slot_mapping);
// Columns [c0, c0 + n) of rows [R, C] (a row-strided view).
Tensor columns(const Tensor& rows, int64_t c0, int64_t n);

// Host weights onto a device backend (the models' constructors; owners keeps the copies alive):
// tensors as they are; linears F32 -> BF16, FP8 with F32 block scales as they are when the CUDA
// GEMMs read them (128x128; or block_k a multiple of 16, V4.1's 32x32, whose scales the GEMMs fold
// into their BF16 weight tiles: exact for power-of-two E8M0 scales, e4m3 * 2^k has 4 significant
// bits), FP8 with other blocks dequantized to BF16; packed FP4 (U8/I8 + E8M0 bytes) as it is.
class DeviceUploader {
 public:
  DeviceUploader(Backend& be, std::vector<std::shared_ptr<void>>& owners, const char* model)
      : be_(be), owners_(owners), model_(model) {}
  void tensor(Tensor& t);
  void linear(Weight& w);
  void hc(V4HyperConnection& h);

 private:
  Backend& be_;
  std::vector<std::shared_ptr<void>>& owners_;
  const char* model_;
};

// The step's KV caches: one per group's layer, the group's row dtype (act for activation rows)
// [blocks, block_size, row_dim] on the backend's device; then check_positions.
void check_step(const Backend& be, const std::vector<KvGroupSpec>& groups, DType act,
                const StepBatch& batch, const KvCaches& kv, int64_t max_positions,
                const char* model);
// Query starts and sequence lengths consistent, positions (read where free: host memory) the
// sequences' last tokens, no sequence past max_positions.
void check_positions(const StepBatch& batch, int64_t max_positions, const char* model);

// Host copies of the step's addressing: token ids (checked against the vocabulary) and every
// group's block tables (device tensors are read back once per step).
struct StepHost {
  std::vector<int32_t> token_ids;
  struct Table {
    std::vector<int32_t> entries;
    int64_t width = 0;
  };
  std::vector<Table> tables;  // per KV group
  // One sequence's rows in group g, whose layers' caches are [num_blocks, block_size, dim]: row r
  // sits at slot table[seq][r / block_size] * block_size + r % block_size (kv/kv_groups.h).
  struct Rows {
    const int32_t* table;
    int64_t width, num_blocks, block_size;
    const std::string* group;
    const char* model;
    // Whether row r's block is still held (a window group frees blocks as the window moves).
    bool held(int64_t r) const {
      const int64_t i = r / block_size;
      return i < width && table[i] >= 0 && table[i] < num_blocks;
    }
    int32_t slot(int64_t r) const;
  };
  const char* model = "";  // model_type, for messages
  Rows rows(int g, int64_t seq, const Tensor& cache, const std::string& name) const {
    const Table& t = tables[static_cast<size_t>(g)];
    return Rows{
        t.entries.data() + seq * t.width, t.width, cache.size(0), cache.size(1), &name, model};
  }
  // Token ids (each in [0, vocab)) and the block tables of `batch`'s groups.
  static StepHost read(Backend& be, const StepBatch& batch, int64_t vocab, const char* model);
};

// cos/sin tables (rope_cos_sin_table) of the window-only and the compressed layers, and the same
// angles negated (rotation by -position: the inverse RoPE on the attention output).
struct RopeTables {
  DeviceBuffer main, compress, main_inv, compress_inv;  // F32 [rows, rope_dim]
  int64_t rows = 0;
  // Grows the tables to at least num_positions rows (doubling, capped by max_position_embeddings).
  void grow(Backend& be, const V4FamilyConfig& c, int64_t num_positions);
};

// The MoE site on normed input x [T, H]: router gemm, sqrt-softplus routing (bias: selection only,
// may be undefined; hash_rows: tid2eid rows I32 [T, k] instead, may be undefined), routed experts
// with the SwiGLU clamp, plus the shared expert (clamped when c.clamp_shared_expert). y [T, H].
// Temporaries of both from `arena`, given back on return.
void moe_site(Backend& be, StepArena& arena, DType act, const V4FamilyConfig& c, const Tensor& x, const Weight& gate,
              const Tensor& bias, const Tensor& hash_rows,
              const std::vector<ExpertWeights>& experts, const ExpertWeights& shared, Tensor& y);
// Grouped output projection: attn [T, heads * D] -> group g's heads through rows [g ol, (g+1) ol)
// of wo_a -> [T, G * ol] -> wo_b -> out [T, H].
void grouped_output(Backend& be, StepArena& arena, DType act, const V4FamilyConfig& c, const Tensor& attn,
                    const Weight& wo_a, const Weight& wo_b, Tensor& out);

}  // namespace deepinfer::v4_family
