//===- Layout.h - Megatron-FSDP v2 packed-buffer layout math ----*- C++ -*-===//
//
// The one source of truth for where every parameter lives: the packing of a
// parameter group into one flat buffer (Megatron-FSDP v2 GlobalLayout.build),
// the range of that buffer each rank of a data-parallel mesh owns, the row
// range of each tensor a rank holds, and a full verification of a layout.
//
// Plain C++17, integer math only, never throws: fallible calls return
// fsdp::Result / fsdp::Status (see fsdp/Support/Result.h).
//
// Mesh conventions: a mesh is a list of axis sizes; a rank's coordinates are
// row-major over the mesh (axis 0 slowest), as in torch DeviceMesh. For the
// flat buffer the LAST mesh axis is the coarsest split and replicate axes do
// not split, so the shard axes must form a suffix of the placement list.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_LAYOUT_LAYOUT_H
#define FSDP_LAYOUT_LAYOUT_H

#include "fsdp/Support/Result.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp {
namespace layout {

using Shape = std::vector<int64_t>;

/// How one data-parallel mesh axis holds a buffer: a full copy per rank, or a
/// flat dim-0 shard (Megatron-FSDP's `Flat`, a kind of `Shard(0)`).
enum class Placement : uint8_t { Replicate, Shard };

//===----------------------------------------------------------------------===//
// Shapes
//===----------------------------------------------------------------------===//

/// Product of the dims (1 for rank 0). Assumes a shape that checkShape accepts
/// (no overflow check here).
int64_t numElements(const Shape &shape);

/// Product of shape[1:]: the number of elements in one dim-0 row. 1 for a 1-D
/// shape (and for rank 0).
int64_t rowSize(const Shape &shape);

/// A shape the layout accepts: rank >= 1, every dim >= 1, element count fits
/// in int64_t.
Status checkShape(const Shape &shape);

/// Element count of a shape, or an error when checkShape rejects it.
Result<int64_t> checkedNumElements(const Shape &shape);

//===----------------------------------------------------------------------===//
// Packing (docs/MegatronFSDPLayout.md)
//===----------------------------------------------------------------------===//

/// A packed group: element offset of every tensor (in group order) inside the
/// global flat buffer, the packing granularity and the padded buffer size.
struct PackedLayout {
  int64_t chunk = 0;
  int64_t size = 0;
  std::vector<int64_t> offsets;
};

/// Megatron-FSDP v2 `GlobalLayout.build(shapes, dp_size)` exactly:
/// chunk = lcm of all row sizes; tensors with numel >= chunk are "regular" and
/// placed in group order; each regular tensor whose size is not a multiple of
/// chunk is paired with the first later regular tensor whose remainder fits in
/// its hole (the "conjugate", placed so its remainder ends on the chunk
/// boundary); smaller "fragments", largest first (stable), fill the holes at
/// row-aligned offsets; the rest go to the tail, row-aligned; the size is
/// padded to a multiple of chunk * dpSize.
///
/// An empty shape list gives chunk 1, size 0. Errors: a rank-0 shape, a dim
/// < 1, dpSize < 1, or any quantity that would overflow int64_t.
Result<PackedLayout> packGroup(const std::vector<Shape> &shapes, int64_t dpSize);

//===----------------------------------------------------------------------===//
// Mesh
//===----------------------------------------------------------------------===//

/// Accepts a mesh when every size is >= 1, there is one placement per axis,
/// the shard axes form a suffix (`(Shard, Replicate)` is rejected) and the
/// rank count fits in int64_t. A mesh with no axes is one rank.
Status checkPlacements(const std::vector<int64_t> &meshSizes,
                       const std::vector<Placement> &placements);

/// Number of ranks: product of the axis sizes (1 for no axes).
int64_t meshSize(const std::vector<int64_t> &meshSizes);

/// Row-major flat rank of mesh coordinates, axis 0 slowest (torch DeviceMesh;
/// it is the MPI rank).
int64_t flatRank(const std::vector<int64_t> &coords, const std::vector<int64_t> &meshSizes);

/// Inverse of flatRank.
std::vector<int64_t> rankCoords(int64_t flatRank, const std::vector<int64_t> &meshSizes);

/// A half-open element (or row) range [begin, end).
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range &other) const;
  bool operator!=(const Range &other) const { return !(*this == other); }
};

/// The part of a buffer of `bufferSize` elements the rank at `coords` owns
/// (docs/MegatronFSDPLayout.md, rank ranges): walking the axes from the last
/// to the first, each shard axis splits the current range evenly and keeps
/// the coords-th part; replicate axes keep it whole. Callers validate the
/// mesh with checkPlacements; bufferSize should be a multiple of numShards
/// (verifyLayout checks it).
Range localRange(int64_t bufferSize, const std::vector<int64_t> &meshSizes,
                 const std::vector<int64_t> &coords, const std::vector<Placement> &placements);

/// localRange of every rank, indexed by flat rank.
std::vector<Range> rankRanges(int64_t bufferSize, const std::vector<int64_t> &meshSizes,
                              const std::vector<Placement> &placements);

/// Number of distinct buffer pieces: product of the shard axes' sizes.
int64_t numShards(const std::vector<int64_t> &meshSizes, const std::vector<Placement> &placements);

/// Which distinct buffer piece a rank holds, counted in buffer order: the
/// rank's range is [index * size/numShards, (index + 1) * size/numShards).
/// For HFSDP (Shard, Shard) on (outer M, inner N) rank (o, i) holds i*M + o.
int64_t shardIndex(int64_t flatRank, const std::vector<int64_t> &meshSizes,
                   const std::vector<Placement> &placements);

/// shardIndex of every flat rank, in one pass (no per-rank allocation): what
/// tools that handle every rank of a large mesh call.
std::vector<int64_t> shardIndices(const std::vector<int64_t> &meshSizes,
                                  const std::vector<Placement> &placements);

/// The coordinates of a rank that holds buffer piece `shardIndex`, with every
/// replicate axis at 0 (the inverse of shardIndex on those ranks).
std::vector<int64_t> shardCoords(int64_t shardIndex, const std::vector<int64_t> &meshSizes,
                                 const std::vector<Placement> &placements);

//===----------------------------------------------------------------------===//
// Expert meshes (docs/Experts.md)
//===----------------------------------------------------------------------===//

/// A mixture-of-experts layer's experts are fully_shard-ed on a mesh of
/// their own: the world's flat ranks viewed row-major as `viewSizes` (axis 0
/// slowest; the product is the world size), the coordinate on `expertAxis`
/// selecting which experts a rank holds (expert parallelism), the other
/// axes, in order, the experts' data-parallel mesh. World dp=8 viewed as
/// (edp=2, ep=4): rank r is at edp = r / 4, ep = r % 4 (expert-parallel
/// groups are runs of consecutive ranks, as Megatron-Core orders them).
struct ExpertMesh {
  std::vector<int64_t> viewSizes;
  int64_t expertAxis = 0;

  /// The experts' data-parallel mesh: the view without its expert axis.
  std::vector<int64_t> meshSizes() const;
  /// Expert-parallel groups: the expert axis's size.
  int64_t expertGroups() const { return viewSizes[expertAxis]; }
  /// The expert-parallel coordinate of a world rank.
  int64_t expertCoord(int64_t worldRank) const;
  /// A world rank's flat rank in meshSizes() (its expert coordinate dropped).
  int64_t meshRank(int64_t worldRank) const;
  /// The world rank at `meshRank` of the experts' mesh in expert group `expert`.
  int64_t worldRank(int64_t meshRank, int64_t expert) const;
};

/// Accepts a view whose sizes are >= 1 and multiply out to `worldSize`,
/// with the expert axis one of them.
Status checkExpertMesh(const ExpertMesh &mesh, int64_t worldSize);

/// Global expert number of local expert `local` on expert-parallel
/// coordinate `expert` with `perRank` experts a rank: local + expert * perRank
/// (Megatron-Core's numbering of its checkpoints).
inline int64_t globalExpert(int64_t local, int64_t expert, int64_t perRank) {
  return local + expert * perRank;
}

/// How an experts unit names its local experts' parameters.
enum class ExpertNaming : uint8_t {
  Grouped,      // <stem><i>: linear_fc1.weight0, linear_fc1.weight1, ...
  LocalExperts, // local_experts.<i>.<rest>
};

/// The local expert number a grouped parameter's name ends with, without
/// leading zeros (`weight3`: 3 at position 6); nullopt when it has none.
/// `weight03` has none: it would name expert 3 a second time.
struct ExpertNumber {
  size_t position = 0;
  int64_t local = 0;
};
std::optional<ExpertNumber> trailingExpertNumber(std::string_view name);

/// A parameter's FQN split around its local expert number, so the same
/// parameter of global expert g is named head + g + tail.
struct ExpertName {
  std::string head;
  int64_t local = 0;
  std::string tail;
  std::string withNumber(int64_t number) const { return head + std::to_string(number) + tail; }
};
/// Splits `fqn` of a parameter of experts unit `unitFQN` ("" for the root):
/// grouped, the number its last name ends with; local_experts, the number
/// of `<unitFQN>.local_experts.<i>.`. Nullopt when the FQN does not follow
/// the naming (the IR verifier reports those).
std::optional<ExpertName> splitExpertFQN(std::string_view fqn, std::string_view unitFQN,
                                         ExpertNaming naming);

//===----------------------------------------------------------------------===//
// Pieces (docs/MegatronFSDPLayout.md)
//===----------------------------------------------------------------------===//

/// A tensor's piece on one rank: rows [rowOffset, rowOffset + rows) of the
/// global tensor, stored from element `localOffset` of the rank's local
/// shard. rows == 0 means empty; an empty piece's rowOffset is
/// clamp(rank.begin - offset, 0, numel) / rowsize (the rows lower ranks own),
/// as Megatron-FSDP reports it, and its localOffset is 0.
struct Piece {
  int64_t rowOffset = 0;
  int64_t rows = 0;
  int64_t localOffset = 0;
  bool empty() const { return rows == 0; }
  bool operator==(const Piece &other) const {
    return rowOffset == other.rowOffset && rows == other.rows && localOffset == other.localOffset;
  }
};

/// The element range [lo, hi) of the buffer where a tensor at tensorOffset
/// with numel elements meets rankRange (empty: lo == hi, clamped into range).
Range overlapElements(int64_t tensorOffset, int64_t numel, Range rankRange);

/// The piece of the tensor at tensorOffset with `shape` inside rankRange.
/// Assumes a verified layout (pieces are whole rows); see verifyLayout.
Piece pieceOf(int64_t tensorOffset, const Shape &shape, Range rankRange);

//===----------------------------------------------------------------------===//
// Verification
//===----------------------------------------------------------------------===//

/// Full check of a layout against its shapes and mesh (what the MLIR verifier
/// reports): valid shapes and mesh, one offset per shape, chunk a positive
/// multiple of every row size, size a multiple of chunk * meshSize, every
/// offset a multiple of its row size and the tensor inside [0, size), no two
/// tensors overlapping, the distinct shard ranges (in shard-index order)
/// tiling [0, size) exactly, every piece whole rows, and each tensor's
/// non-empty pieces over the distinct shard ranges tiling its rows exactly.
/// The error names the tensor index (or shard) and what is wrong.
Status verifyLayout(const std::vector<Shape> &shapes, const PackedLayout &layout,
                    const std::vector<int64_t> &meshSizes,
                    const std::vector<Placement> &placements);

//===----------------------------------------------------------------------===//
// Canonical Shard(0) (what checkpointers that ignore the layout assume)
//===----------------------------------------------------------------------===//

/// torch.chunk rows of shard `index` out of `numShards` for a dim-0 size:
/// chunks of ceil(dim0 / numShards) rows, trailing shards short or empty
/// (an empty shard's range is [dim0, dim0)).
Range canonicalShardRows(int64_t dim0, int64_t numShards, int64_t index);

/// The rows a DTensor with these placements puts on the rank at `coords`
/// when it assumes canonical Shard(0) sharding (torch's
/// compute_local_shape_and_global_offset): shard axes split in mesh order,
/// axis 0 the coarsest, each split by canonicalShardRows of the rows left.
/// With one shard axis this is canonicalShardRows(dim0, numShards, index).
Range canonicalRowsForCoords(int64_t dim0, const std::vector<int64_t> &meshSizes,
                             const std::vector<int64_t> &coords,
                             const std::vector<Placement> &placements);

/// True when on some rank the real piece of the tensor differs from the
/// canonical DTensor Shard(0) rows (canonicalRowsForCoords): a checkpointer
/// that trusts the placements alone would save or load it wrong. Two empty
/// pieces count as equal.
bool differsFromCanonical(int64_t tensorOffset, const Shape &shape, int64_t bufferSize,
                          const std::vector<int64_t> &meshSizes,
                          const std::vector<Placement> &placements);

} // namespace layout
} // namespace fsdp

#endif // FSDP_LAYOUT_LAYOUT_H
