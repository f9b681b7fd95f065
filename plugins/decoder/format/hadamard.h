// The Hadamard fold of PrismML's Bonsai files (docs/DECODER.md, "Hadamard-folded files"): a
// folded weight stores W' = W·R⁻¹ with R = H·diag(s), so the forward pass rotates the activation
// (x ← H·(s ⊙ x)) before multiplying by W'. H is the normalized Sylvester–Walsh–Hadamard matrix
// applied to each contiguous block of the input; s is a ±1 vector per input width. The token
// embedding is stored rotated the other way (row ← s ⊙ (H·row)). The metadata that describes
// it (`prism.hadamard.*`) comes from reverse engineering, so every assumption about it is a
// named check here and a file that disagrees is refused with the key in the message.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "format/gguf.h"

namespace pulse::decoder {

// One rotation of an activation row of `width` values.
//   forward (folded weights):  x ← H·(s ⊙ P·x)
//   inverse (stored embedding): x ← s ⊙ (H·x)
// P (only with `grouped_heads`) reorders the Gated DeltaNet output from the tiled head order
// this decoder computes ([S][Hk][rep]: head m + Hk·r uses key head m) to the grouped order the
// fold was made in ([S][rep][Hk]: heads of one key head adjacent).
struct Rotation {
    int64_t width = 0, block = 0;
    const float* signs = nullptr;  // `width` values, each +1 or -1
    bool inverse = false;
    bool grouped_heads = false;
    int64_t state = 0, key_heads = 0, rep = 0;  // the permutation's shape when grouped_heads
};

struct HadamardFold {
    int64_t block = 0;
    std::map<int64_t, std::vector<float>> signs;  // input width -> its sign vector
    std::set<std::string> folded;                 // prism.hadamard.weight_names
    std::set<std::string> inverse;                // prism.hadamard.inverse_weight_names
    bool gdn_v_grouped = false;
};

// Reads and checks `prism.hadamard.*`. No key with that prefix: std::nullopt (an unfolded
// file). Any key present makes all of them required; a missing, mistyped or inconsistent one
// is a GgufError naming it.
std::optional<HadamardFold> read_hadamard(const GgufFile& f);

// In place: each contiguous `block` of x[0..n) multiplied by the normalized Walsh–Hadamard
// matrix (H[i][j] = (-1)^popcount(i & j) / sqrt(block)). H is its own inverse.
void hadamard_blocks(float* x, int64_t n, int64_t block);

// One row: out = the rotation of x (out and x must not overlap).
void rotate_row(const Rotation& r, const float* x, float* out);

// The writer's side (fixtures): the metadata of a fold, and the unfolded equivalent of a
// folded weight row or stored embedding row (w = s ⊙ (H·w'), then P⁻¹ for grouped heads).
struct FoldSpec {
    int64_t block = 0;
    std::vector<int64_t> widths;
    std::vector<std::vector<float>> signs;  // per width
    std::vector<std::string> folded, inverse;
    bool gdn_v_grouped = false;
};
void write_hadamard_metadata(GgufWriter& w, const FoldSpec& spec);
void unfold_row(const Rotation& r, const float* folded, float* out);

}  // namespace pulse::decoder
