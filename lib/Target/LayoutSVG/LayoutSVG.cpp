//===- LayoutSVG.cpp - Draw lowered parameter groups as SVG ---------------===//
//
// One horizontal bar per lowered `fsdp.param_group`, drawn to scale (the bar
// is kBarWidth pixels for the group's padded size). Above the bar a band
// names the ranks holding each shard; below it, element offsets, callouts
// for spans too narrow to label, and a table of every span in buffer order.
// The picture is standalone: no scripts, no external fonts, only generic
// font families, and every name is XML-escaped (xmlText: well-formed for any
// bytes, invalid UTF-8 and noncharacters included). Diagnostics write names
// with printable().
//
//===----------------------------------------------------------------------===//
#include "fsdp/Target/LayoutSVG.h"
#include "fsdp/Dialect/FSDP/IR/FSDPDialect.h"
#include "fsdp/Dialect/FSDP/IR/FSDPOps.h"
#include "fsdp/Dialect/FSDP/IR/FSDPUtils.h"
#include "fsdp/Layout/Layout.h"
#include "fsdp/Support/Escape.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/Format.h"

#include <algorithm>
#include <cmath>
#include <string>

using namespace mlir;
using namespace fsdp;

namespace {

//===----------------------------------------------------------------------===//
// Geometry and style
//===----------------------------------------------------------------------===//

constexpr double kMarginX = 40;
constexpr double kBarWidth = 1200;
constexpr double kBandHeight = 18;
constexpr double kBarHeight = 44;
constexpr double kCalloutRowHeight = 14;
constexpr unsigned kMaxCalloutRows = 8;
constexpr double kTableRowHeight = 15;
/// Where the groups start, below the header and legend.
constexpr double kBodyTop = 76;
constexpr int64_t kMaxShardLabels = 32;
/// Width of one monospace character in em (DejaVu Sans Mono 0.602,
/// Liberation Mono 0.600, Menlo 0.602, Consolas 0.55).
constexpr double kMonoEm = 0.61;

constexpr double kBarFont = 12;
constexpr double kSmallFont = 10;
constexpr double kTableFont = 11;

/// A stable palette for members, indexed by the member's position in the
/// group (DFS order), so the same parameter gets the same colour in every
/// layer of a model. Light enough for black text; no greys (those mean holes
/// and padding).
constexpr const char *kPalette[] = {"#8dd3c7", "#fb8072", "#80b1d3", "#fdb462",
                                    "#b3de69", "#bebada", "#fccde5", "#ffed6f",
                                    "#bc80bd", "#ccebc5", "#e5c494", "#9ecae1"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr const char *kPaddingFill = "#8c8c8c";
constexpr const char *kBoundaryStroke = "#c0392b";

double monoWidth(size_t chars, double fontSize) {
  return static_cast<double>(chars) * fontSize * kMonoEm;
}

/// A coordinate with at most two decimals, trailing zeros dropped.
std::string num(double value) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format("%.2f", value);
  while (!text.empty() && text.back() == '0')
    text.pop_back();
  if (!text.empty() && text.back() == '.')
    text.pop_back();
  if (text == "-0")
    text = "0";
  return text;
}

/// 218136576 -> "218.1M".
std::string human(int64_t n) {
  const char *suffixes[] = {"", "K", "M", "G", "T", "P"};
  double value = static_cast<double>(n);
  unsigned index = 0;
  while (std::fabs(value) >= 1000 && index + 1 < std::size(suffixes)) {
    value /= 1000;
    ++index;
  }
  if (index == 0)
    return std::to_string(n);
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::format(value >= 100 ? "%.0f" : "%.1f", value) << suffixes[index];
  return text;
}

std::string unitName(StringRef unit) { return unit.empty() ? std::string("(root)") : unit.str(); }

//===----------------------------------------------------------------------===//
// What gets drawn
//===----------------------------------------------------------------------===//

struct Segment {
  enum Kind { Member, Hole, Padding } kind = Hole;
  int64_t begin = 0;
  int64_t end = 0;
  mutable MemberOp member; // Op accessors are not const.
  /// Member only: position among the group's members (DFS order, colour).
  unsigned dfsIndex = 0;
  /// Member only: 1-based position in buffer order (the table's `#`).
  unsigned number = 0;
  int64_t size() const { return end - begin; }
};

struct Group {
  ParamGroupOp op;
  int64_t chunk = 0;
  int64_t size = 0;
  int64_t shardSize = 0;
  int64_t numShards = 0;
  /// Flat ranks holding each shard (buffer order).
  SmallVector<SmallVector<int64_t>> shardRanks;
  /// Members, holes and tail padding, in buffer order.
  SmallVector<Segment> segments;
};

constexpr const char *kLowerHint = "run fsdp-opt --fsdp-lower-fully-shard first";

FailureOr<Group> collectGroup(ParamGroupOp op, int64_t numRanks) {
  Group group;
  group.op = op;
  std::optional<int64_t> chunk = op.getChunk();
  std::optional<int64_t> size = op.getSize();
  if (!chunk || !size)
    return op.emitError() << "fsdp.param_group @" << printable(op.getSymName())
                          << " is not packed (no chunk/size): " << kLowerHint;
  std::optional<int64_t> shardSize = op.getShardSize();
  std::optional<ArrayRef<int64_t>> ranks = op.getRanks();
  if (!shardSize || !ranks)
    return op.emitError() << "fsdp.param_group @" << printable(op.getSymName())
                          << " has no rank ranges (no shard_size/ranks): " << kLowerHint;
  group.chunk = *chunk;
  group.size = *size;
  group.shardSize = *shardSize;
  if (group.size < 0 || group.shardSize <= 0 || group.size % group.shardSize != 0 ||
      static_cast<int64_t>(ranks->size()) != numRanks)
    return op.emitError() << "fsdp.param_group @" << printable(op.getSymName())
                          << ": inconsistent size " << group.size << ", shard_size "
                          << group.shardSize << " and " << ranks->size() << " rank ranges for "
                          << numRanks << " ranks";
  group.numShards = group.size / group.shardSize;
  group.shardRanks.resize(group.numShards);
  for (auto [rank, begin] : llvm::enumerate(*ranks)) {
    if (begin < 0 || begin % group.shardSize != 0 || begin >= group.size)
      return op.emitError() << "fsdp.param_group @" << printable(op.getSymName()) << ": rank "
                            << rank << " range begins at " << begin
                            << ", not a shard boundary of [0, " << group.size << ")";
    group.shardRanks[begin / group.shardSize].push_back(rank);
  }

  SmallVector<Segment> members;
  for (auto [index, member] : llvm::enumerate(op.getBody().getOps<MemberOp>())) {
    std::optional<int64_t> offset = member.getOffset();
    if (!offset)
      return member.emitError() << "member '" << printable(member.getFQN()) << "' of @"
                                << printable(op.getSymName()) << " has no offset: " << kLowerHint;
    layout::Shape shape(member.getTensorType().getShape().begin(),
                        member.getTensorType().getShape().end());
    Segment segment;
    segment.kind = Segment::Member;
    segment.begin = *offset;
    segment.end = *offset + layout::numElements(shape);
    segment.member = member;
    segment.dfsIndex = index;
    members.push_back(segment);
  }
  llvm::stable_sort(members, [](const Segment &a, const Segment &b) { return a.begin < b.begin; });
  int64_t cursor = 0;
  unsigned number = 0;
  for (Segment &member : members) {
    if (member.begin > cursor)
      group.segments.push_back({Segment::Hole, cursor, member.begin});
    member.number = ++number;
    group.segments.push_back(member);
    cursor = std::max(cursor, member.end);
  }
  if (cursor < group.size)
    group.segments.push_back({Segment::Padding, cursor, group.size});
  return group;
}

//===----------------------------------------------------------------------===//
// Labels
//===----------------------------------------------------------------------===//

/// The member's FQN relative to its unit ("self_attn.q_proj.weight" in unit
/// "model.layers.0"), or the FQN when it lies outside the unit.
std::string relativeName(StringRef fqn, StringRef unit) {
  if (!unit.empty() && fqn.size() > unit.size() + 1 && fqn.starts_with(unit) &&
      fqn[unit.size()] == '.')
    return fqn.drop_front(unit.size() + 1).str();
  return fqn.str();
}

/// The last two dot-separated components ("q_proj.weight").
std::string lastTwo(StringRef fqn) {
  size_t last = fqn.rfind('.');
  if (last == StringRef::npos || last == 0)
    return fqn.str();
  size_t prev = fqn.rfind('.', last - 1);
  return prev == StringRef::npos ? fqn.str() : fqn.drop_front(prev + 1).str();
}

std::string joinedFQNs(MemberOp member, StringRef separator) {
  SmallVector<StringRef> names;
  for (Attribute fqn : member.getFqns())
    names.push_back(llvm::cast<StringAttr>(fqn).getValue());
  return llvm::join(names, separator);
}

std::string shapeText(MemberOp member) {
  std::string text;
  for (auto [index, dim] : llvm::enumerate(member.getTensorType().getShape()))
    text += (index ? "x" : "") + std::to_string(dim);
  return text;
}

/// In-bar label candidates for a member, longest first.
SmallVector<std::string> memberLabels(const Segment &segment, StringRef unit) {
  SmallVector<std::string> labels;
  auto add = [&](std::string label) {
    if (llvm::find(labels, label) == labels.end())
      labels.push_back(std::move(label));
  };
  MemberOp member = segment.member;
  bool tied = member.getFqns().size() > 1;
  StringRef fqn = member.getFQN();
  if (tied)
    add(joinedFQNs(member, " = "));
  add(fqn.str() + (tied ? " (tied)" : ""));
  add(relativeName(fqn, unit) + (tied ? " (tied)" : ""));
  add(relativeName(fqn, unit));
  add(lastTwo(fqn));
  return labels;
}

/// Band label candidates for the ranks holding `shard`, longest first.
SmallVector<std::string> rankLabels(int64_t shard, ArrayRef<int64_t> ranks, bool shardIsRank) {
  SmallVector<std::string> labels;
  if (ranks.empty()) {
    labels.push_back("shard " + std::to_string(shard) + ": no rank");
    labels.push_back("-");
    return labels;
  }
  SmallVector<std::string> numbers;
  for (int64_t rank : ranks)
    numbers.push_back(std::to_string(rank));
  std::string list = llvm::join(numbers, ", ");
  std::string compact = llvm::join(numbers, ",");
  std::string noun = ranks.size() == 1 ? "rank " : "ranks ";
  if (!shardIsRank)
    labels.push_back("shard " + std::to_string(shard) + ": " + noun + list);
  labels.push_back(noun + list);
  labels.push_back("r" + compact);
  if (ranks.size() > 3) {
    int64_t step = ranks[1] - ranks[0];
    bool progression = true;
    for (size_t i = 2; i < ranks.size(); ++i)
      progression &= ranks[i] - ranks[i - 1] == step;
    if (progression)
      labels.push_back("r" + numbers[0] + "," + numbers[1] + ".." + numbers.back());
    labels.push_back("r" + numbers[0] + "+" + std::to_string(ranks.size() - 1));
  }
  if (ranks.size() == 1)
    labels.push_back(numbers[0]);
  return labels;
}

/// Occupied horizontal intervals of one text row.
struct Row {
  SmallVector<std::pair<double, double>> used;
  bool fits(double lo, double hi) const {
    for (auto [a, b] : used)
      if (lo < b && a < hi)
        return false;
    return true;
  }
};

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

/// Where a group's shard band and bar sit, and which shards are labelled.
struct BarGeometry {
  double bandTop = 0;
  double barTop = 0;
  double barBottom = 0;
  /// The width of one shard.
  double shardPx = 0;
  /// Shard i is held by rank i alone.
  bool shardIsRank = true;
  /// Every step-th shard gets a rank label and a full boundary line.
  int64_t step = 1;
};

/// A named callout below the bar: the x of its leader and its text.
using Callout = std::pair<double, std::string>;

class SVGWriter {
public:
  SVGWriter(ModelOp model, MeshOp mesh, const LayoutSVGOptions &options)
      : model(model), mesh(mesh), options(options), body(bodyText) {}

  void writeGroup(const Group &group);
  void write(llvm::raw_ostream &os, size_t numGroups, size_t numShown);

private:
  // The steps of writeGroup, top to bottom.
  void writeHeading(const Group &group);
  BarGeometry layOutBar(const Group &group) const;
  void drawShardBand(const Group &group, const BarGeometry &geo);
  void drawSpans(const Group &group, const BarGeometry &geo);
  void drawShardBoundaries(const Group &group, const BarGeometry &geo);
  void drawRankLabels(const Group &group, const BarGeometry &geo);
  SmallVector<Callout> drawSpanLabels(const Group &group, const BarGeometry &geo);
  std::string layOutOffsetAxis(const Group &group, const BarGeometry &geo);
  void drawCallouts(SmallVector<Callout> callouts, const BarGeometry &geo);
  void drawSpanTable(const Group &group);

  double x(const Group &group, int64_t element) const {
    if (group.size == 0)
      return kMarginX;
    return kMarginX + kBarWidth * static_cast<double>(element) / static_cast<double>(group.size);
  }
  std::string fill(const Segment &segment) const {
    switch (segment.kind) {
    case Segment::Member:
      return kPalette[segment.dfsIndex % kPaletteSize];
    case Segment::Hole:
      return "url(#hole)";
    case Segment::Padding:
      return kPaddingFill;
    }
    return "none";
  }
  std::string tooltip(const Group &group, const Segment &segment) const;
  std::string piecesText(const Segment &segment) const;
  void text(double tx, double ty, StringRef cls, StringRef content, StringRef anchor = "start",
            StringRef extra = "");
  void expandWidth(double right) { width = std::max(width, right + kMarginX); }

  ModelOp model;
  MeshOp mesh;
  const LayoutSVGOptions &options;
  std::string bodyText;
  llvm::raw_string_ostream body;
  double y = 0;
  double width = 2 * kMarginX + kBarWidth;
};

void SVGWriter::text(double tx, double ty, StringRef cls, StringRef content, StringRef anchor,
                     StringRef extra) {
  if (content.empty())
    return;
  body << "<text x=\"" << num(tx) << "\" y=\"" << num(ty) << "\" class=\"" << cls << "\"";
  if (anchor != "start")
    body << " text-anchor=\"" << anchor << "\"";
  if (!extra.empty())
    body << " " << extra;
  body << ">" << xmlText(content) << "</text>\n";
}

std::string SVGWriter::piecesText(const Segment &segment) const {
  // The first and last pieces of a tensor spread over many shards (the
  // tooltip lists them all).
  constexpr size_t kHead = 3;
  SmallVector<MemberOp::Piece> pieces = segment.member.getPieceList();
  SmallVector<std::string> parts;
  for (auto [index, piece] : llvm::enumerate(pieces)) {
    if (pieces.size() > kHead + 2 && index >= kHead && index + 1 < pieces.size()) {
      if (index == kHead)
        parts.push_back("... (" + std::to_string(pieces.size()) + " pieces)");
      continue;
    }
    parts.push_back(std::to_string(piece.shard) + ":[" + std::to_string(piece.rowBegin) + "," +
                    std::to_string(piece.rowEnd) + ")@" + std::to_string(piece.localOffset));
  }
  return llvm::join(parts, " ");
}

std::string SVGWriter::tooltip(const Group &group, const Segment &segment) const {
  std::string tip;
  llvm::raw_string_ostream os(tip);
  auto range = [&]() {
    os << "elements [" << segment.begin << ", " << segment.end << "), " << segment.size();
  };
  switch (segment.kind) {
  case Segment::Hole:
    os << "hole (never read): ";
    range();
    break;
  case Segment::Padding:
    os << "tail padding (never read): ";
    range();
    break;
  case Segment::Member: {
    MemberOp member = segment.member;
    os << "#" << segment.number << " " << joinedFQNs(member, " = ");
    if (member.getFqns().size() > 1)
      os << " (tied)";
    os << " : " << member.getTensorType() << "\n";
    range();
    os << "\n";
    for (MemberOp::Piece piece : member.getPieceList()) {
      os << "shard " << piece.shard << " (";
      ArrayRef<int64_t> ranks;
      if (piece.shard >= 0 && piece.shard < group.numShards)
        ranks = group.shardRanks[piece.shard];
      os << (ranks.size() == 1 ? "rank " : "ranks ");
      llvm::interleave(ranks, os, ", ");
      os << "): rows [" << piece.rowBegin << ", " << piece.rowEnd << ") at local offset "
         << piece.localOffset << "\n";
    }
    if (!tip.empty() && tip.back() == '\n')
      tip.pop_back();
    break;
  }
  }
  return tip;
}

void SVGWriter::writeGroup(const Group &group) {
  writeHeading(group);
  BarGeometry geo = layOutBar(group);
  drawShardBand(group, geo);
  drawSpans(group, geo);
  drawShardBoundaries(group, geo);
  drawRankLabels(group, geo);
  SmallVector<Callout> callouts = drawSpanLabels(group, geo);
  // The offsets are placed before the callouts (which go below them) but
  // written after them.
  std::string axisText = layOutOffsetAxis(group, geo);
  drawCallouts(std::move(callouts), geo);
  body << axisText;
  drawSpanTable(group);
}

/// The group's title line (name, unit, dtype, chunk, size, shards) and the
/// line under it (placements, mesh, buffers).
void SVGWriter::writeHeading(const Group &group) {
  ParamGroupOp op = group.op;
  StringRef unit = op.getUnit();
  y += 16;
  {
    std::string title;
    llvm::raw_string_ostream os(title);
    os << "@" << op.getSymName() << "  \u00b7  unit " << unitName(unit) << "  \u00b7  "
       << getDTypeName(op.getDtype()) << (op.getFrozen() ? " (frozen)" : "") << "  \u00b7  chunk "
       << group.chunk << "  \u00b7  size " << group.size;
    if (group.size >= 10000)
      os << " (" << human(group.size) << ")";
    os << "  \u00b7  " << group.numShards << (group.numShards == 1 ? " shard of " : " shards of ")
       << group.shardSize;
    text(kMarginX, y, "title", title);
  }
  y += 16;
  {
    std::string subtitle;
    llvm::raw_string_ostream os(subtitle);
    os << "placements [";
    llvm::interleave(
        op.getPolicy().getPlacements(), os,
        [&](Placement placement) { os << stringifyPlacement(placement); }, ", ");
    os << "] over mesh ";
    for (auto [index, name] : llvm::enumerate(mesh.getAxisNames())) {
      if (index)
        os << " \u00d7 ";
      os << llvm::cast<StringAttr>(name).getValue() << "=" << mesh.getShape()[index];
    }
    if (std::optional<ArrayAttr> buffers = op.getBuffers()) {
      os << "  \u00b7  buffers ";
      llvm::interleave(
          buffers->getAsRange<BufferAttr>(), os,
          [&](BufferAttr buffer) {
            os << stringifyBufferRole(buffer.getRole()) << " " << getDTypeName(buffer.getDtype());
            if (buffer.getAliasesMainWeight())
              os << " (= main_weight)";
          },
          ", ");
    }
    text(kMarginX, y, "sub", subtitle);
  }
  y += 8;
}

/// Where the band and the bar go, and how many shards apart the rank labels
/// are: the fewest steps at which every label fits.
BarGeometry SVGWriter::layOutBar(const Group &group) const {
  BarGeometry geo;
  geo.bandTop = y;
  geo.barTop = geo.bandTop + kBandHeight + 2;
  geo.barBottom = geo.barTop + kBarHeight;
  geo.shardPx = group.numShards ? kBarWidth / group.numShards : kBarWidth;
  geo.shardIsRank = true;
  for (auto [shard, ranks] : llvm::enumerate(group.shardRanks))
    geo.shardIsRank &= ranks.size() == 1 && ranks[0] == static_cast<int64_t>(shard);
  geo.step = std::max<int64_t>(1, (group.numShards + kMaxShardLabels - 1) / kMaxShardLabels);
  // Widen the step until the shortest label of every labelled shard fits.
  for (; geo.step < group.numShards; ++geo.step) {
    bool allFit = true;
    for (int64_t shard = 0; shard < group.numShards && allFit; shard += geo.step)
      allFit = monoWidth(rankLabels(shard, group.shardRanks[shard], geo.shardIsRank).back().size(),
                         kSmallFont) +
                   4 <=
               geo.shardPx * std::min(geo.step, group.numShards - shard);
    if (allFit)
      break;
  }
  return geo;
}

/// Band: the ranks holding each shard.
void SVGWriter::drawShardBand(const Group &group, const BarGeometry &geo) {
  for (int64_t shard = 0; shard < group.numShards; ++shard) {
    double left = x(group, shard * group.shardSize);
    double right = x(group, (shard + 1) * group.shardSize);
    body << "<rect x=\"" << num(left) << "\" y=\"" << num(geo.bandTop) << "\" width=\""
         << num(right - left) << "\" height=\"" << num(kBandHeight) << "\" class=\""
         << ((shard / geo.step) % 2 ? "band1" : "band0") << "\"><title>shard " << shard
         << ": elements [" << shard * group.shardSize << ", " << (shard + 1) * group.shardSize
         << ") held by " << (group.shardRanks[shard].size() == 1 ? "rank " : "ranks ");
    llvm::interleave(group.shardRanks[shard], body, ", ");
    body << "</title></rect>\n";
  }
}

void SVGWriter::drawSpans(const Group &group, const BarGeometry &geo) {
  // The bar: holes and padding first, then members, widest first so narrow
  // ones stay visible on top.
  body << "<rect x=\"" << num(kMarginX) << "\" y=\"" << num(geo.barTop) << "\" width=\""
       << num(kBarWidth) << "\" height=\"" << num(kBarHeight) << "\" class=\"bar\"/>\n";
  SmallVector<const Segment *> order;
  for (const Segment &segment : group.segments)
    order.push_back(&segment);
  llvm::stable_sort(order, [](const Segment *a, const Segment *b) {
    bool aMember = a->kind == Segment::Member;
    bool bMember = b->kind == Segment::Member;
    if (aMember != bMember)
      return !aMember;
    return a->size() > b->size();
  });
  for (const Segment *segment : order) {
    double left = x(group, segment->begin);
    double w = std::max(1.0, x(group, segment->end) - left);
    body << "<rect x=\"" << num(left) << "\" y=\"" << num(geo.barTop) << "\" width=\"" << num(w)
         << "\" height=\"" << num(kBarHeight) << "\" fill=\"" << fill(*segment) << "\" class=\""
         << (segment->kind == Segment::Member ? "member" : "gap") << "\"><title>"
         << xmlText(tooltip(group, *segment)) << "</title></rect>\n";
    // Row boundaries inside a member, when rows are wide enough to see.
    if (segment->kind != Segment::Member)
      continue;
    layout::Shape shape(segment->member.getTensorType().getShape().begin(),
                        segment->member.getTensorType().getShape().end());
    int64_t rowSize = layout::rowSize(shape);
    int64_t rows = shape.empty() ? 1 : shape[0];
    double rowPx = x(group, rowSize) - x(group, 0);
    if (rows > 1 && rows <= 512 && rowPx >= 6) {
      body << "<path class=\"rows\" d=\"";
      for (int64_t row = 1; row < rows; ++row)
        body << "M" << num(x(group, segment->begin + row * rowSize)) << " " << num(geo.barTop + 1)
             << "V" << num(geo.barBottom - 1);
      body << "\"/>\n";
    }
  }
}

void SVGWriter::drawShardBoundaries(const Group &group, const BarGeometry &geo) {
  // Shard boundaries, under the labels (whose halo keeps them readable).
  // Between labelled shards (every step-th) the boundaries are thin and only
  // tick the bar's edges, so a dense mesh does not hide the spans.
  for (int64_t shard = 0; shard <= group.numShards; ++shard) {
    double bx = x(group, shard * group.shardSize);
    auto line = [&](double y1, double y2, StringRef cls) {
      body << "<line x1=\"" << num(bx) << "\" y1=\"" << num(y1) << "\" x2=\"" << num(bx)
           << "\" y2=\"" << num(y2) << "\" class=\"" << cls << "\"/>\n";
    };
    if (shard % geo.step == 0 || shard == group.numShards) {
      line(geo.bandTop, geo.barBottom + 6, "shard");
    } else {
      line(geo.bandTop, geo.barTop + 5, "shard thin");
      line(geo.barBottom - 5, geo.barBottom + 3, "shard thin");
    }
  }
}

void SVGWriter::drawRankLabels(const Group &group, const BarGeometry &geo) {
  // Band labels: the ranks holding every step-th shard.
  for (int64_t shard = 0; shard < group.numShards; shard += geo.step) {
    double left = x(group, shard * group.shardSize);
    double right = x(group, (shard + 1) * group.shardSize);
    double available = geo.shardPx * std::min(geo.step, group.numShards - shard) - 4;
    std::string halo =
        std::string("stroke=\"") + ((shard / geo.step) % 2 ? "#dde3ea" : "#eef1f5") + "\"";
    for (const std::string &label : rankLabels(shard, group.shardRanks[shard], geo.shardIsRank)) {
      if (monoWidth(label.size(), kSmallFont) > available)
        continue;
      if (geo.step == 1)
        text((left + right) / 2, geo.bandTop + 13, "rank", label, "middle", halo);
      else
        text(left + 2, geo.bandTop + 13, "rank", label, "start", halo);
      break;
    }
  }
}

SmallVector<Callout> SVGWriter::drawSpanLabels(const Group &group, const BarGeometry &geo) {
  ParamGroupOp op = group.op;
  StringRef unit = op.getUnit();
  // In-bar labels: the longest name that fits at the bar font, else at the
  // small font, else the table number `#n`. A span labelled only by its
  // number, or too narrow for any label, gets a named callout below.
  SmallVector<Callout> callouts;
  for (const Segment &segment : group.segments) {
    double left = x(group, segment.begin);
    double right = x(group, segment.end);
    double w = right - left;
    double mid = (left + right) / 2;
    std::string detail =
        "[" + std::to_string(segment.begin) + ", " + std::to_string(segment.end) + ")";
    std::string count = human(segment.size());
    SmallVector<std::string> labels;
    std::string calloutText;
    std::string number;
    if (segment.kind == Segment::Member) {
      labels = memberLabels(segment, unit);
      number = "#" + std::to_string(segment.number);
      calloutText = number + " " + relativeName(segment.member.getFQN(), unit);
      if (segment.member.getFqns().size() > 1)
        calloutText += " (tied)";
    } else {
      StringRef kind = segment.kind == Segment::Hole ? "hole" : "padding";
      labels.push_back(kind.str());
      calloutText = kind.str() + " " + human(segment.size());
    }
    auto fits = [&](const std::string &label, double fontSize) {
      return monoWidth(label.size(), fontSize) + 6 <= w;
    };
    const std::string *chosen = nullptr;
    double fontSize = kBarFont;
    for (double size : {kBarFont, kSmallFont}) {
      for (const std::string &label : labels)
        if (fits(label, size)) {
          chosen = &label;
          fontSize = size;
          break;
        }
      if (chosen)
        break;
    }
    if (!chosen && !number.empty()) {
      for (double size : {kBarFont, kSmallFont})
        if (fits(number, size)) {
          chosen = &number;
          fontSize = size;
          break;
        }
    }
    if (!chosen || chosen == &number)
      callouts.push_back({mid, calloutText});
    if (!chosen)
      continue;
    std::string halo;
    switch (segment.kind) {
    case Segment::Member:
      halo = fill(segment);
      break;
    case Segment::Hole:
      halo = "#e6e6e6";
      break;
    case Segment::Padding:
      halo = kPaddingFill;
      break;
    }
    bool light = segment.kind == Segment::Padding;
    std::string style = "stroke=\"" + halo + "\"";
    // A class, not a font-size attribute: CSS beats presentation attributes.
    std::string inbarClass = "inbar";
    if (fontSize != kBarFont)
      inbarClass += " small";
    if (light)
      inbarClass += " light";

    const std::string *second = nullptr;
    if (fits(detail, kSmallFont))
      second = &detail;
    else if (fits(count, kSmallFont))
      second = &count;
    double barMid = (geo.barTop + geo.barBottom) / 2;
    if (second) {
      text(mid, barMid - 2, inbarClass, *chosen, "middle", style);
      text(mid, barMid + 12, light ? "detail light" : "detail", *second, "middle",
           "stroke=\"" + halo + "\"");
    } else {
      text(mid, barMid + 4, inbarClass, *chosen, "middle", style);
    }
  }
  return callouts;
}

std::string SVGWriter::layOutOffsetAxis(const Group &group, const BarGeometry &geo) {
  // Element offsets below the bar: shard boundaries first, then span
  // boundaries where they do not collide. Returned, not written: writeGroup
  // writes them after the callouts so their white halo interrupts the
  // leaders that cross them.
  body.flush();
  size_t axisStart = bodyText.size();
  Row axis;
  double axisY = geo.barBottom + 17;
  auto placeOffset = [&](int64_t element, bool major) {
    std::string label = std::to_string(element);
    double lx = x(group, element);
    double half = monoWidth(label.size(), kSmallFont) / 2 + 3;
    double lo = std::max(lx - half, kMarginX - 30);
    double hi = lo + 2 * half;
    if (!axis.fits(lo, hi))
      return;
    axis.used.push_back({lo, hi});
    if (!major)
      body << "<line x1=\"" << num(lx) << "\" y1=\"" << num(geo.barBottom) << "\" x2=\"" << num(lx)
           << "\" y2=\"" << num(geo.barBottom + 5) << "\" class=\"tick\"/>\n";
    text((lo + hi) / 2, axisY, major ? "offset" : "offset minor", label, "middle");
  };
  placeOffset(0, true);
  placeOffset(group.size, true);
  for (int64_t shard = geo.step; shard < group.numShards; shard += geo.step)
    placeOffset(shard * group.shardSize, true);
  for (const Segment &segment : group.segments)
    if (segment.begin != 0)
      placeOffset(segment.begin, false);
  y = axisY + 4;
  body.flush();
  std::string axisText = bodyText.substr(axisStart);
  bodyText.resize(axisStart);
  return axisText;
}

void SVGWriter::drawCallouts(SmallVector<Callout> callouts, const BarGeometry &geo) {
  // Callouts for narrow spans, greedily in rows; a leader never crosses a
  // label placed in a row above its own. Callouts that find no row are left
  // out (the table lists every span).
  if (callouts.empty())
    return;
  // Spans within 2 px of each other share one callout.
  SmallVector<Callout> merged;
  for (auto &[cx, label] : callouts) {
    if (!merged.empty() && cx - merged.back().first <= 2) {
      merged.back().second += ", " + label;
      continue;
    }
    merged.push_back({cx, label});
  }
  callouts = std::move(merged);
  // Right to left, labels to the right of their leaders: a label never
  // covers the leader of a callout further left, so rows form a staircase.
  std::reverse(callouts.begin(), callouts.end());
  SmallVector<Row> rows(kMaxCalloutRows);
  double firstRowY = y + 12;
  unsigned usedRows = 0;
  for (auto &[cx, label] : callouts) {
    double w = monoWidth(label.size(), kSmallFont) + 4;
    bool leftward = cx + 3 + w > kMarginX + kBarWidth + kMarginX - 4;
    double lo = leftward ? cx - 3 - w : cx + 2;
    double hi = leftward ? cx - 2 : cx + 3 + w;
    for (unsigned row = 0; row < kMaxCalloutRows; ++row) {
      bool free = rows[row].fits(lo, hi);
      for (unsigned above = 0; above < row && free; ++above)
        free = rows[above].fits(cx - 0.5, cx + 0.5);
      if (!free)
        continue;
      rows[row].used.push_back({lo, hi});
      for (unsigned above = 0; above < row; ++above)
        rows[above].used.push_back({cx - 0.5, cx + 0.5});
      double ty = firstRowY + row * kCalloutRowHeight;
      body << "<line x1=\"" << num(cx) << "\" y1=\"" << num(geo.barBottom) << "\" x2=\"" << num(cx)
           << "\" y2=\"" << num(ty - 3) << "\" class=\"leader\"/>\n";
      text(leftward ? cx - 3 : cx + 3, ty, "callout", label, leftward ? "end" : "start");
      usedRows = std::max(usedRows, row + 1);
      break;
    }
  }
  y = firstRowY + (usedRows ? usedRows - 1 : 0) * kCalloutRowHeight + 4;
}

void SVGWriter::drawSpanTable(const Group &group) {
  // Table of spans in buffer order.
  struct Cell {
    std::string number, range, count, name, shape, pieces;
  };
  SmallVector<Cell> cells;
  cells.push_back(
      {"#", "elements", "count", "parameter", "shape", "pieces  shard:[rows)@local offset"});
  for (const Segment &segment : group.segments) {
    Cell cell;
    cell.range = "[" + std::to_string(segment.begin) + ", " + std::to_string(segment.end) + ")";
    cell.count = std::to_string(segment.size());
    if (segment.kind == Segment::Member) {
      cell.number = std::to_string(segment.number);
      cell.name = joinedFQNs(segment.member, " = ");
      if (segment.member.getFqns().size() > 1)
        cell.name += " (tied)";
      cell.shape = shapeText(segment.member);
      cell.pieces = piecesText(segment);
    } else {
      cell.name = segment.kind == Segment::Hole ? "(hole)" : "(tail padding)";
    }
    cells.push_back(std::move(cell));
  }
  size_t widths[6] = {0, 0, 0, 0, 0, 0};
  for (const Cell &cell : cells) {
    const std::string *fields[6] = {&cell.number, &cell.range, &cell.count,
                                    &cell.name,   &cell.shape, &cell.pieces};
    for (int i = 0; i < 6; ++i)
      widths[i] = std::max(widths[i], fields[i]->size());
  }
  double charW = monoWidth(1, kTableFont);
  double swatchX = kMarginX + widths[0] * charW + 8;
  double columns[6];
  columns[0] = kMarginX + widths[0] * charW; // right-aligned
  columns[1] = swatchX + 22;
  columns[2] = columns[1] + (widths[1] + 2) * charW + widths[2] * charW;
  columns[3] = columns[2] + 2 * charW;
  columns[4] = columns[3] + (widths[3] + 2) * charW;
  columns[5] = columns[4] + (widths[4] + 2) * charW;
  expandWidth(columns[5] + widths[5] * charW);
  y += 14;
  for (auto [index, cell] : llvm::enumerate(cells)) {
    double ty = y + index * kTableRowHeight;
    StringRef cls = index == 0 ? "th" : "td";
    if (index > 0) {
      const Segment &segment = group.segments[index - 1];
      body << "<rect x=\"" << num(swatchX) << "\" y=\"" << num(ty - 10)
           << "\" width=\"16\" height=\"12\" fill=\"" << fill(segment)
           << "\" class=\"swatch\"><title>" << xmlText(tooltip(group, segment))
           << "</title></rect>\n";
    }
    text(columns[0], ty, cls, cell.number, "end");
    text(columns[1], ty, cls, cell.range);
    text(columns[2], ty, cls, cell.count, "end");
    text(columns[3], ty, cls, cell.name);
    text(columns[4], ty, cls, cell.shape);
    text(columns[5], ty, cls, cell.pieces);
  }
  y += (cells.size() - 1) * kTableRowHeight + 22;
}

void SVGWriter::write(llvm::raw_ostream &os, size_t numGroups, size_t numShown) {
  double height = kBodyTop + y + 10;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
     << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width) << "\" height=\""
     << num(height) << "\" viewBox=\"0 0 " << num(width) << " " << num(height) << "\">\n"
     << "<title>fsdp.model @" << xmlText(model.getSymName())
     << ": packed parameter-group layout</title>\n"
     << "<desc>Generated by fsdp-translate --emit-layout-svg. One bar per "
        "fsdp.param_group, to scale; shard boundaries are the ranks' "
        "main-weight ranges (docs/LayoutJSON.md).</desc>\n"
     << "<style>\n"
     << "text{font-family:'DejaVu Sans Mono','Liberation Mono',Menlo,"
        "Consolas,monospace;fill:#1a1a1a}\n"
     << ".h1{font-family:'DejaVu Sans',Arial,Helvetica,sans-serif;"
        "font-size:16px;font-weight:bold}\n"
     << ".title{font-family:'DejaVu Sans',Arial,Helvetica,sans-serif;"
        "font-size:13px;font-weight:bold}\n"
     << ".sub,.note{font-family:'DejaVu Sans',Arial,Helvetica,sans-serif;"
        "font-size:11px;fill:#555}\n"
     << ".rank{font-size:" << num(kSmallFont)
     << "px;fill:#333;paint-order:stroke;"
        "stroke-width:3px}\n"
     << ".inbar,.detail{paint-order:stroke;stroke-width:3px;"
        "stroke-linejoin:round}\n"
     << ".inbar{font-size:" << num(kBarFont) << "px}\n"
     << ".detail,.small{font-size:" << num(kSmallFont) << "px}\n"
     << ".detail{fill:#333}\n"
     << ".light{fill:#fff}\n"
     << ".offset{font-size:" << num(kSmallFont)
     << "px;fill:#1a1a1a;"
        "paint-order:stroke;stroke:#fff;stroke-width:4px}\n"
     << ".minor{fill:#888}\n"
     << ".callout{font-size:" << num(kSmallFont) << "px;fill:#333}\n"
     << ".th{font-size:" << num(kTableFont) << "px;font-weight:bold;fill:#555}\n"
     << ".td{font-size:" << num(kTableFont) << "px}\n"
     << ".band0{fill:#eef1f5}.band1{fill:#dde3ea}\n"
     << ".bar{fill:#fff;stroke:#333;stroke-width:1}\n"
     << ".member{stroke:#333;stroke-width:0.5}\n"
     << ".gap{stroke:none}\n"
     << ".swatch{stroke:#333;stroke-width:0.5}\n"
     << ".rows{stroke:#fff;stroke-opacity:0.7;stroke-width:1;fill:none}\n"
     << ".shard{stroke:" << kBoundaryStroke << ";stroke-width:2}\n"
     << ".thin{stroke-width:1;stroke-opacity:0.6}\n"
     << ".tick{stroke:#888;stroke-width:1}\n"
     << ".leader{stroke:#888;stroke-width:1}\n"
     << "</style>\n"
     << "<defs><pattern id=\"hole\" width=\"6\" height=\"6\" "
        "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
        "<rect width=\"6\" height=\"6\" fill=\"#e6e6e6\"/>"
        "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#9a9a9a\" "
        "stroke-width=\"3\"/></pattern></defs>\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";

  // Header and legend.
  std::string heading;
  {
    llvm::raw_string_ostream hs(heading);
    hs << "fsdp.model @" << model.getSymName() << ": packed parameter-group layout";
  }
  os << "<text x=\"" << num(kMarginX) << "\" y=\"24\" class=\"h1\">" << xmlText(heading)
     << "</text>\n";
  std::string note;
  {
    llvm::raw_string_ostream ns(note);
    ns << "mesh ";
    for (auto [index, name] : llvm::enumerate(mesh.getAxisNames())) {
      if (index)
        ns << " \u00d7 ";
      ns << llvm::cast<StringAttr>(name).getValue() << "=" << mesh.getShape()[index];
    }
    ns << " (" << mesh.getNumRanks() << " ranks)  \u00b7  ";
    if (numShown == numGroups)
      ns << numGroups << (numGroups == 1 ? " group" : " groups");
    else
      ns << numShown << " of " << numGroups << " groups (unit "
         << unitName(options.unit == "(root)" ? "" : options.unit) << ")";
    ns << "  \u00b7  each bar is " << num(kBarWidth)
       << " px for its group's size; spans under 1 px are drawn 1 px wide";
  }
  os << "<text x=\"" << num(kMarginX) << "\" y=\"42\" class=\"note\">" << xmlText(note)
     << "</text>\n";
  double lx = kMarginX;
  double ly = 52;
  auto legendText = [&](double tx, StringRef label) {
    os << "<text x=\"" << num(tx) << "\" y=\"" << num(ly + 10) << "\" class=\"note\">"
       << xmlText(label) << "</text>\n";
  };
  for (size_t i = 0; i < 4; ++i)
    os << "<rect x=\"" << num(lx + i * 8) << "\" y=\"" << num(ly)
       << "\" width=\"8\" height=\"12\" fill=\"" << kPalette[i] << "\" class=\"swatch\"/>\n";
  legendText(lx + 38, "parameter (colour by DFS position; FQN when it fits)");
  lx += 38 + 330;
  os << "<rect x=\"" << num(lx) << "\" y=\"" << num(ly)
     << "\" width=\"24\" height=\"12\" fill=\"url(#hole)\" "
        "class=\"swatch\"/>\n";
  legendText(lx + 30, "hole (never read)");
  lx += 30 + 120;
  os << "<rect x=\"" << num(lx) << "\" y=\"" << num(ly) << "\" width=\"24\" height=\"12\" fill=\""
     << kPaddingFill << "\" class=\"swatch\"/>\n";
  legendText(lx + 30, "tail padding");
  lx += 30 + 90;
  os << "<line x1=\"" << num(lx + 4) << "\" y1=\"" << num(ly - 2) << "\" x2=\"" << num(lx + 4)
     << "\" y2=\"" << num(ly + 14) << "\" class=\"shard\"/>\n";
  legendText(lx + 12, "shard boundary; band above: ranks holding the shard");
  os << "<g transform=\"translate(0," << num(kBodyTop) << ")\">\n" << bodyText << "</g>\n";
  os << "</svg>\n";
}

} // namespace

LogicalResult fsdp::translateToLayoutSVG(Operation *op, llvm::raw_ostream &os,
                                         const LayoutSVGOptions &options) {
  // One clear line per error, naming its location, not a dump of the model.
  struct NoOpOnDiagnostic {
    MLIRContext *context;
    bool saved;
    explicit NoOpOnDiagnostic(MLIRContext *context)
        : context(context), saved(context->shouldPrintOpOnDiagnostic()) {
      context->printOpOnDiagnostic(false);
    }
    ~NoOpOnDiagnostic() { context->printOpOnDiagnostic(saved); }
  } noOpOnDiagnostic(op->getContext());
  ModelOp model = findModel(op);
  if (!model)
    return failure();
  MeshOp mesh = model.getMesh();
  if (!mesh)
    return model.emitError() << "fsdp.model @" << printable(model.getSymName())
                             << " has no fsdp.mesh";
  FailureOr<SmallVector<ParamGroupOp>> lowered = getLoweredGroups(model, "--emit-layout-svg");
  if (failed(lowered))
    return failure();
  ArrayRef<ParamGroupOp> groups = *lowered;

  std::string unit = options.unit == "(root)" ? "" : options.unit;
  bool filter = !options.unit.empty();
  SmallVector<Group> selected;
  for (ParamGroupOp group : groups) {
    // Every group must be lowered, shown or not: the picture is of a layout.
    FailureOr<Group> collected = collectGroup(group, mesh.getNumRanks());
    if (failed(collected))
      return failure();
    if (!filter || group.getUnit() == unit)
      selected.push_back(std::move(*collected));
  }
  if (filter && selected.empty()) {
    SmallVector<std::string> units;
    for (ParamGroupOp group : groups) {
      std::string name = unitName(group.getUnit());
      if (llvm::find(units, name) == units.end())
        units.push_back(name);
    }
    InFlightDiagnostic diag = model.emitError() << "no fsdp.param_group of unit '"
                                                << printable(options.unit) << "' (units: ";
    for (auto [index, name] : llvm::enumerate(units)) {
      if (index == 8) {
        diag << ", ... " << units.size() - 8 << " more";
        break;
      }
      diag << (index ? ", " : "") << printable(name);
    }
    return diag << ")";
  }

  SVGWriter writer(model, mesh, options);
  for (const Group &group : selected)
    writer.writeGroup(group);
  writer.write(os, groups.size(), selected.size());
  return success();
}

LogicalResult fsdp::translateToLayoutSVG(Operation *op, llvm::raw_ostream &os) {
  return translateToLayoutSVG(op, os, LayoutSVGOptions());
}

void fsdp::registerToLayoutSVGTranslation() {
  static llvm::cl::opt<std::string> unitFilter(
      "layout-svg-unit",
      llvm::cl::desc("With --emit-layout-svg: draw only the groups of this "
                     "fully_shard unit FQN (\"(root)\" for the root unit)"),
      llvm::cl::init(""));
  static TranslateFromMLIRRegistration registration(
      "emit-layout-svg", "draw the lowered parameter-group layouts as a standalone SVG",
      [](Operation *op, llvm::raw_ostream &os) {
        LayoutSVGOptions options;
        options.unit = unitFilter;
        return translateToLayoutSVG(op, os, options);
      },
      [](DialectRegistry &registry) { registry.insert<FSDPDialect>(); });
}
