//===- LayoutJSON.cpp - Emit fsdp-layout-v1 JSON ---------------------------===//
//
// docs/LayoutJSON.md: every group's buffers, each parameter's offset and its
// non-empty pieces on every rank that holds them, and every flat rank's
// main-weight range. Streams with llvm::json::OStream: the layout of a large
// mesh is written without building a DOM.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Target/LayoutJSON.h"
#include "fsdp/Dialect/FSDP/IR/FSDPUtils.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace fsdp;

/// A name as a JSON string. Names from MLIR may be any bytes, and
/// llvm::json asserts on invalid UTF-8: such bytes become U+FFFD, as a
/// release build of llvm::json writes them.
static std::string jsonString(StringRef name) {
  return llvm::json::isUTF8(name) ? name.str() : llvm::json::fixUTF8(name);
}

static void writeGroup(llvm::json::OStream &json, MeshOp mesh, ParamGroupOp group) {
  std::vector<int64_t> meshSizes = getLayoutMeshSizes(mesh);
  int64_t shardSize = *group.getShardSize();
  ArrayRef<int64_t> ranks = *group.getRanks();
  // Which ranks hold each shard (several under HSDP replication).
  int64_t numShards = shardSize ? *group.getSize() / shardSize : 0;
  std::vector<SmallVector<int64_t, 2>> ranksOfShard(numShards);
  for (auto [rank, begin] : llvm::enumerate(ranks))
    ranksOfShard[begin / shardSize].push_back(rank);

  // An experts group: its parameters' names on every expert coordinate.
  ModelOp model = group->getParentOfType<ModelOp>();
  NNModuleOp unit = findUnit(model, group.getUnit());
  ExpertsAttr experts = unit ? unit.getExpertsAttr() : ExpertsAttr();
  UnitMesh unitMesh = unit ? getUnitMesh(unit) : UnitMesh();
  if (!unitMesh.experts)
    experts = ExpertsAttr();
  layout::ExpertNaming naming = experts && experts.getNaming() == ExpertNaming::LocalExperts
                                    ? layout::ExpertNaming::LocalExperts
                                    : layout::ExpertNaming::Grouped;
  int64_t expertGroups = experts ? unitMesh.experts->expertGroups() : 1;
  int64_t perRank = experts ? experts.getCount() / expertGroups : 0;

  json.object([&] {
    json.attribute("unit", jsonString(group.getUnit()));
    if (experts)
      json.attributeObject("experts", [&] {
        json.attribute("mesh", jsonString(experts.getMesh().getValue()));
        json.attribute("count", experts.getCount());
        json.attribute("per_rank", perRank);
        json.attribute("naming", stringifyExpertNaming(experts.getNaming()));
        json.attributeArray("expert_coords", [&] {
          for (size_t rank = 0; rank < ranks.size(); ++rank)
            json.value(unitMesh.experts->expertCoord(static_cast<int64_t>(rank)));
        });
      });
    json.attribute("dtype", getDTypeName(group.getDtype()));
    json.attribute("requires_grad", group.getRequiresGrad());
    json.attribute("chunk", *group.getChunk());
    json.attribute("size", *group.getSize());
    json.attribute("shard_size", shardSize);
    ArrayAttr buffers = *group.getBuffers();
    json.attributeArray("buffers", [&] {
      for (Attribute attr : buffers) {
        auto buffer = cast<BufferAttr>(attr);
        json.object([&] {
          json.attribute("role", stringifyBufferRole(buffer.getRole()));
          json.attribute("dtype", getDTypeName(buffer.getDtype()));
          if (buffer.getAliasesMainWeight())
            json.attribute("aliases", "main_weight");
        });
      }
    });
    json.attributeArray("params", [&] {
      for (MemberOp member : group.getBody().getOps<MemberOp>()) {
        json.object([&] {
          json.attribute("fqn", jsonString(member.getFQN()));
          json.attributeArray("shape", [&] {
            for (int64_t dim : member.getTensorType().getShape())
              json.value(dim);
          });
          json.attribute("offset", *member.getOffset());
          if (experts)
            if (std::optional<layout::ExpertName> name =
                    layout::splitExpertFQN(member.getFQN(), group.getUnit(), naming))
            {
              // The name split around its number: head + <global number> + tail.
              json.attributeObject("expert", [&] {
                json.attribute("head", jsonString(name->head));
                json.attribute("local", name->local);
                json.attribute("tail", jsonString(name->tail));
              });
              json.attributeArray("global_fqns", [&] {
                for (int64_t e = 0; e < expertGroups; ++e)
                  json.value(jsonString(
                      name->withNumber(layout::globalExpert(name->local, e, perRank))));
              });
            }
          if (member.getFqns().size() > 1)
            json.attributeArray("tied_fqns", [&] {
              for (Attribute fqn : member.getFqns().getValue().drop_front())
                json.value(jsonString(cast<StringAttr>(fqn).getValue()));
            });
          struct RankChunk {
            int64_t rank;
            MemberOp::Piece piece;
          };
          SmallVector<RankChunk> chunks;
          for (MemberOp::Piece piece : member.getPieceList())
            for (int64_t rank : ranksOfShard[piece.shard])
              chunks.push_back({rank, piece});
          llvm::sort(chunks,
                     [](const RankChunk &a, const RankChunk &b) { return a.rank < b.rank; });
          json.attributeArray("chunks", [&] {
            for (const RankChunk &chunk : chunks)
              json.object([&] {
                json.attribute("rank", chunk.rank);
                json.attribute("row_offset", chunk.piece.rowBegin);
                json.attribute("rows", chunk.piece.rowEnd - chunk.piece.rowBegin);
                json.attribute("local_offset", chunk.piece.localOffset);
              });
          });
        });
      }
    });
    json.attributeArray("ranks", [&] {
      for (auto [rank, begin] : llvm::enumerate(ranks))
        json.object([&] {
          json.attribute("rank", static_cast<int64_t>(rank));
          json.attributeArray("coords", [&] {
            for (int64_t coord : layout::rankCoords(rank, meshSizes))
              json.value(coord);
          });
          json.attribute("begin", begin);
          json.attribute("end", begin + shardSize);
        });
    });
  });
}

LogicalResult fsdp::translateToLayoutJSON(Operation *op, raw_ostream &os) {
  ModelOp model = findModel(op);
  if (!model)
    return failure();
  FailureOr<SmallVector<ParamGroupOp>> groups = getLoweredGroups(model, "--emit-layout-json");
  if (failed(groups))
    return failure();
  MeshOp mesh = model.getMesh();
  llvm::json::OStream json(os, /*IndentSize=*/1);
  json.object([&] {
    json.attribute("format", "fsdp-layout-v1");
    json.attributeArray("mesh", [&] {
      for (auto [name, size] : llvm::zip(mesh.getAxisNames(), mesh.getShape()))
        json.object([&] {
          json.attribute("name", jsonString(cast<StringAttr>(name).getValue()));
          json.attribute("size", size);
        });
    });
    json.attributeArray("groups", [&] {
      for (ParamGroupOp group : *groups)
        writeGroup(json, mesh, group);
    });
  });
  os << "\n";
  return success();
}

void fsdp::registerToLayoutJSONTranslation() {
  static TranslateFromMLIRRegistration registration(
      "emit-layout-json", "emit the lowered packed layout as fsdp-layout-v1 JSON",
      translateToLayoutJSON, [](DialectRegistry &registry) { registry.insert<FSDPDialect>(); });
}
