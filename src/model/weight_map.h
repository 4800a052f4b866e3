// The map between Hugging Face tensor names and moetrain's internal (fused) parameters.
// One HF tensor is a "piece": a region of one internal tensor, found by selecting an expert
// (dim 0 of a [E, ...] tensor) and then a row range. Pieces of each layout:
//   per-expert (published Qwen3 checkpoints, what transformers 5.x writes):
//     mlp.experts.{e}.gate_proj.weight [I,H] -> experts_gate_up[e, 0:I]
//     mlp.experts.{e}.up_proj.weight   [I,H] -> experts_gate_up[e, I:2I]
//     mlp.experts.{e}.down_proj.weight [H,I] -> experts_down[e]
//   fused (transformers 5.x in-memory layout, some tools' files):
//     mlp.experts.gate_up_proj [E,2I,H] (gate rows first) and mlp.experts.down_proj [E,H,I];
//     files holding the transposed forms [E,H,2I] / [E,I,H] are detected by shape on load.
//   dense MLP: mlp.gate_proj.weight -> gate_up[0:I], mlp.up_proj.weight -> gate_up[I:2I].
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace moetrain {

enum class ExpertLayout : uint8_t { kPerExpert, kFused };

struct HfPiece {
  std::string hf_name;
  Shape hf_shape;              // shape in the HF file
  std::string internal_name;   // a ModelParams::for_each name
  int64_t expert = -1;         // >= 0: select this index of dim 0 first
  int64_t row_begin = 0;       // then rows [row_begin, row_end) of the next dim; -1 = all
  int64_t row_end = -1;
  bool transposed = false;     // file holds the last two dims swapped (fused, other tools)
};

// Every piece of a model in HF name order of layers (embed, layers, norm, lm_head).
std::vector<HfPiece> hf_weight_map(const ModelConfig& cfg, ExpertLayout layout);
// The pieces of one layer, with a layout chosen per layer (loaders detect it per layer).
std::vector<HfPiece> hf_layer_pieces(const ModelConfig& cfg, int64_t layer, ExpertLayout layout);

// The region of `internal` (the tensor named piece.internal_name) that `piece` covers (a view).
Tensor piece_region(const Tensor& internal, const HfPiece& piece);

}  // namespace moetrain
